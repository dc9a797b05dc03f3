"""The language-model loss as people configure it, written once for the estimate, the ranks and the CLI.

- ``plain``: Hugging Face's: the head's 16-bit logits, their fp32 upcast and ``cross_entropy``, whose
  log-softmax output (fp32, b s v) is saved for backward.
- ``chunked``: a fused linear cross-entropy that never builds the whole logits (Liger-Kernel's
  ``LigerFusedLinearCrossEntropyFunction``): the tokens go through the head in chunks of ``chunk_tokens``
  (Liger's rule: about as many logits per chunk as the input has elements), each chunk's loss and
  gradients are computed at once in the forward, and the input's gradient (16-bit, b s h) and the head
  weight's (16-bit, v h, when it trains) are what backward keeps.
- ``cce``: Cut Cross-Entropy (Apple's ``ml-cross-entropy``, ``linear_cross_entropy``): no logits in memory
  at all. Its forward computes each token's log-sum-exp over blocks of the vocabulary in the kernel's
  on-chip tiles and keeps the input (16-bit, b s h), the targets and the LSE (fp32 per token); its
  backward recomputes the logits block by block (skipping blocks whose softmax is negligible: a speed
  matter) and writes the input's and the weight's gradients (``KEEPS``).

Liger's and CCE's kernels are Triton (CUDA): on CPU ranks the kit runs the same algorithms in plain
PyTorch (``kit.workloads.chunked_loss``), whose chunk or vocabulary block is a tensor where Triton keeps it
in registers; the estimate says which it models. What it cannot see: label smoothing, z-loss terms and a
softcap on the logits.
"""

from __future__ import annotations

from typing import Literal, get_args

from kit.families import SWIGLU

Loss = Literal["plain", "chunked", "cce"]
LOSSES: tuple[str, ...] = get_args(Loss)
#: what a panel offers: (label, ``ZeroSettings.loss``)
CHOICES: tuple[tuple[str, str], ...] = (
    ("plain", "plain"),
    ("chunked (Liger)", "chunked"),
    ("CCE (Cut Cross-Entropy)", "cce"),
)
#: what each loss keeps from its forward for its backward, besides the final norm's own saved tensors
KEEPS = {
    "plain": "logits",  # the fp32 log-softmax (and the head's input when the head trains)
    "chunked": "gradients",  # the input's and the head weight's, computed in the forward
    "cce": "input",  # the head's input, the targets and the fp32 LSE; backward recomputes the logits
}
#: the vocabulary block of CCE's Triton kernels (``tl_autotune.py``, without ``CCE_AUTOTUNE``: the forward's
#: tiles are 256 tokens x 128 vocabulary entries, the backward's 128 x 128): the CPU ranks' blocks
CCE_BLOCK_V = 128


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


#: how text names each fused loss
NAMES = {"chunked": "chunked loss", "cce": "Cut Cross-Entropy loss"}


def label(loss: str) -> str:
    """The label part: ``flce`` for the chunked loss, ``cce`` for Cut Cross-Entropy, ``""`` for the plain
    one."""
    return {"chunked": "flce", "cce": "cce"}.get(loss, "")


#: the families a fused loss is modelled for: Hugging Face's Llama-style decoders and GPT-2 (the kit's toy and
#: Hugging Face's gpt2 presets, built alike: ``kit.workloads.toymodels.GPT``)
FAMILIES = (*SWIGLU, "gpt2")


def problem(zero, model) -> str | None:
    """Why ``model`` (a ``ModelSpec``) cannot train with ``zero``'s loss in the kit, or None."""
    if zero.loss == "plain":
        return None
    if model.family not in FAMILIES or model.source or not model.vocab:
        return (
            f"loss: the {NAMES[zero.loss]} is modelled for {', '.join(FAMILIES)} language models; "
            f"{model.name} ({model.family or 'no family'}) is not one"
        )
    return None


def in_your_script(zero, model=None) -> str | None:
    """What the training script must do for ``zero``'s loss (no ds_config key says it), or None; for a
    ``model`` (a ``ModelSpec``) outside ``SWIGLU`` only the direct call (Liger's and CCE's patches cover
    Hugging Face's Llama-style decoders, not GPT-2)."""
    if zero.loss == "plain":
        return None
    gather = (
        "; at ZeRO-3 the head's weight is partitioned outside its module: register it on the model "
        "(deepspeed.zero.register_external_parameter) or gather it around the call"
        if zero.stage == 3
        else ""
    )
    patched = model is None or model.family in SWIGLU
    if zero.loss == "cce":
        patch = (
            "cut_cross_entropy.transformers.cce_patch(model) (its patch_llama, patch_mistral, "
            "patch_qwen2), or "
            if patched
            else ""
        )
        return (
            f"Cut Cross-Entropy loss: {patch}from cut_cross_entropy import linear_cross_entropy; "
            f"linear_cross_entropy(hidden, lm_head.weight, labels, shift=1) in your loop{gather}"
        )
    patch = (
        "HF Trainer --use_liger_kernel (liger_kernel.transformers.apply_liger_kernel_to_llama("
        "fused_linear_cross_entropy=True)), or "
        if patched
        else ""
    )
    return (
        f"chunked loss: {patch}LigerFusedLinearCrossEntropyLoss()(lm_head.weight, hidden, labels) in your "
        f"loop{gather}"
    )
