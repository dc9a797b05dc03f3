"""The language-model loss as people configure it, written once for the estimate, the ranks and the CLI.

- ``plain``: Hugging Face's: the head's 16-bit logits, their fp32 upcast and ``cross_entropy``, whose
  log-softmax output (fp32, b s v) is saved for backward.
- ``chunked``: a fused linear cross-entropy that never builds the whole logits (Liger-Kernel's
  ``LigerFusedLinearCrossEntropyFunction``): the tokens go through the head in chunks of ``chunk_tokens``
  (Liger's rule: about as many logits per chunk as the input has elements), each chunk's loss and
  gradients are computed at once in the forward, and the input's gradient (16-bit, b s h) and the head
  weight's (16-bit, v h, when it trains) are what backward keeps.

Liger's kernels are Triton (CUDA): on CPU ranks the kit runs the same algorithm in plain PyTorch
(``kit.workloads.chunked_loss``), whose chunk also holds the fp32 softmax Triton keeps in registers; the
estimate says which it models. What it cannot see: Cut Cross-Entropy's blockwise kernel (no chunk of
logits at all, the input kept instead of its gradient), label smoothing and z-loss terms.
"""

from __future__ import annotations

from typing import Literal, get_args

Loss = Literal["plain", "chunked"]
LOSSES: tuple[str, ...] = get_args(Loss)
#: what a panel offers: (label, ``ZeroSettings.loss``)
CHOICES: tuple[tuple[str, str], ...] = (("plain", "plain"), ("chunked (Liger)", "chunked"))


def choices(zero, model=None) -> list[tuple[str, str]]:
    """``CHOICES``, those ``model`` (a ``ModelSpec``) takes when given."""
    return [
        (label, v)
        for label, v in CHOICES
        if model is None or not problem(zero.model_copy(update={"loss": v}), model)
    ]


def chunk_tokens(tokens: int, vocab: int, hidden: int) -> int:
    """Tokens per chunk of Liger's fused linear cross-entropy (``fused_linear_cross_entropy.py``):
    ``next_power_of_2(ceil(tokens / ceil(vocab / hidden)))``, at most ``tokens``."""
    factor = -(-vocab // hidden)
    chunk = -(-tokens // factor)
    return min(tokens, 1 << (chunk - 1).bit_length())


def label(loss: str) -> str:
    """The label part: ``flce`` for the chunked loss, ``""`` for the plain one."""
    return "flce" if loss == "chunked" else ""


def problem(zero, model) -> str | None:
    """Why ``model`` (a ``ModelSpec``) cannot train with ``zero``'s loss in the kit, or None."""
    from kit.families import SWIGLU

    if zero.loss == "plain":
        return None
    if model.family not in SWIGLU or model.source or not model.vocab:
        return (
            f"loss: the chunked loss is modelled for {', '.join(SWIGLU)} language models; {model.name} "
            f"({model.family or 'no family'}) is not one"
        )
    return None


def in_your_script(zero) -> str | None:
    """What the training script must do for ``zero``'s loss (no ds_config key says it), or None."""
    if zero.loss == "plain":
        return None
    gather = (
        "; at ZeRO-3 the head's weight is partitioned outside its module: register it on the model "
        "(deepspeed.zero.register_external_parameter) or gather it around the call"
        if zero.stage == 3
        else ""
    )
    return (
        "chunked loss: HF Trainer --use_liger_kernel (liger_kernel.transformers.apply_liger_kernel_to_llama("
        "fused_linear_cross_entropy=True)), or LigerFusedLinearCrossEntropyLoss()(lm_head.weight, hidden, "
        f"labels) in your loop{gather}"
    )
