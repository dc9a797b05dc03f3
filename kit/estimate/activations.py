"""Activations saved for backward, per architecture family (Korthikanti et al. 2022, Table 2).

Each family's formula is derived from what its implementation saves and checked against what
``torch.autograd.graph.saved_tensors_hooks`` sees (tests/test_activations.py, tests/test_runner.py).

What it cannot see: the live peak beyond what is saved (the forward's and backward's temporaries, the
gradient of the largest activation while backward runs; ``kit.estimate.trace`` measures that peak),
dropout masks and a GELU variant other than the one each formula assumes, attention kernels other than
the one named in its formula (eager's s^2 scores vs SDPA / flash), tensors a custom model keeps on its
own (caches, hooks), activation offload or partitioning, and padding a data loader adds beyond
``seq_len``.
"""

from __future__ import annotations

from kit.estimate.result import Term
from kit.models import DIT_DEFAULTS
from kit.rules import element_bytes
from kit.schema import Setup

#: families with a formula below (each checked against what autograd saves); others are traced
FORMULA_FAMILIES = ("gpt2", "llama", "mistral", "qwen2", "gpt_neox", "dit")
#: decoder families whose MLP is SwiGLU (gate and up projections, their product into down)
SWIGLU_FAMILIES = ("llama", "mistral", "qwen2")


def activations(setup: Setup) -> Term:
    """Bytes of activations saved for backward on one GPU at the micro batch: the family's formula
    (``formula``), else a trace of the model (``kit.estimate.trace``; a model it cannot trace is a
    ValueError naming the model and the op, never 0 bytes), else not estimated (a bare count)."""
    m = setup.model
    if m.family in FORMULA_FAMILIES and m.is_transformer and not m.source:
        return formula(setup)
    if m.arch or m.source:
        from kit.estimate import trace

        try:
            return trace.activations(setup)
        except ValueError as error:
            if not str(error).startswith("trace:"):
                raise  # the user's code failed (kit.model_files says where): refuse, as a run would
            # never activations of 0 (every micro batch would "fit"): no estimate at all, one line saying why
            reason = str(error).removeprefix("trace: ")
            raise ValueError(f"activations: {reason}; zero-kit cannot estimate its memory") from None
    return Term(0, "unknown architecture (bare parameter count): activations not estimated")


def formula(setup: Setup) -> Term:
    """Activations by the family's formula (Korthikanti et al. 2022, derived per family).

    Checked against what ``torch.autograd.graph.saved_tensors_hooks`` sees: the toy GPT-2 and DiT in
    real runs (``tests/test_runner.py``), Hugging Face's Llama / Qwen2 / GPT-2 in one process
    (``tests/test_activations.py``). Left out are tensors of O(s^2 + bs + bh) bytes (causal mask,
    norm statistics, token ids, rotary tables, adaLN vectors): up to 1.4 % on tiny models, less at
    real sizes. GPT-2-style models are assumed to train without dropout.
    """
    m, b, s = setup.model, setup.batch.micro_batch, setup.batch.seq_len
    scale = element_bytes(setup.zero.precision) // 2  # the formulas count 16-bit bytes
    h, a, layers = m.hidden, m.heads, m.layers
    kv = (m.kv_heads or a) * (h // a)
    ffn = m.ffn or 4 * h
    sbh, sbf, as2b = s * b * h, s * b * ffn, a * s * s * b
    family = m.family or "gpt2"
    if family in SWIGLU_FAMILIES:
        # Hugging Face's decoder, SDPA attention (flash / memory-efficient: no s^2 term), fitted to
        # what autograd saves (tests/test_activations.py). 16-bit: each RMSNorm keeps its fp32 input
        # 4sbh, the normalised 2sbh and the weighted output 2sbh; rotated q 2sbh, k and v 2 x 2sb(kv),
        # SDPA output and o_proj input 4sbh, fp32 logsumexp 4abs; SwiGLU: gate, up, silu and product
        # 4 x 2sbf. In fp32 the upcast is free but every tensor is twice as wide.
        if scale == 1:
            per_layer = 20 * sbh + 4 * s * b * kv + 4 * a * b * s + 8 * sbf
            how = "RMSNorm + SwiGLU + SDPA: 20sbh + 4sb(kv) + 4abs + 8sbf"
        else:
            per_layer = 32 * sbh + 8 * s * b * kv + 4 * a * b * s + 16 * sbf
            how = "fp32 RMSNorm + SwiGLU + SDPA: 32sbh + 8sb(kv) + 4abs + 16sbf"
    elif family == "dit":
        # adaLN-Zero: as GPT-2 plus both norms' outputs (modulate), the modulated inputs and the two
        # gated branch outputs: 24sbh + 2as^2b + 4sbf.
        per_layer = (24 * sbh + 2 * as2b + 4 * sbf) * scale
        how = "adaLN-Zero block: 24sbh + 2as^2b + 4sbf (eager attention)"
    else:
        # gpt2 / gpt_neox, eager attention, no dropout: LayerNorm inputs 4sbh, QKV input 2sbh,
        # q,k,v 6sbh, softmax output 2as^2b, projection input 2sbh, MLP input 2sbh, GELU input and
        # output 2 x 2sbf (Korthikanti's 34sbh + 5as^2b keeps dropout masks and outputs as well).
        per_layer = (16 * sbh + 2 * as2b + 4 * sbf) * scale
        how = "16sbh + 2as^2b + 4sbf (eager attention, no dropout)"
    if setup.zero.activation_checkpointing:
        body = Term(
            layers * 2 * sbh * scale + per_layer,
            f"checkpointing: {layers} layers x 2sbh (layer inputs) + one layer recomputed ({how})",
        )
    else:
        body = Term(layers * per_layer, f"{layers} layers x ({how}), s={s} b={b} h={h} a={a} f={ffn}")
    return body + _head_activations(setup, scale)


def _head_activations(setup: Setup, scale: int) -> Term:
    """What the model saves outside its blocks (16-bit byte counts times ``scale``)."""
    m, b, s = setup.model, setup.batch.micro_batch, setup.batch.seq_len
    sbh = s * b * m.hidden
    if m.family == "dit":
        pixels = b * s * DIT_DEFAULTS["patch_size"] ** 2  # latent pixels per channel in the micro batch
        channels = DIT_DEFAULTS["in_channels"]
        out_channels = channels * (2 if DIT_DEFAULTS["learn_sigma"] else 1)
        mse = 2 * 4 * pixels * out_channels  # fp32 output and target of the MSE loss
        return Term(
            (6 * sbh + 2 * pixels * channels) * scale + mse,
            "final layer 6sbh + patch-embed input + fp32 MSE output and target",
        )
    if not m.vocab:
        return Term(0, "no head")
    logits = 4 * s * b * m.vocab  # the fp32 log-softmax output of the loss (16-bit logits are not saved)
    if m.family in ("llama", "mistral", "qwen2"):
        norm = 8 * sbh if scale == 1 else 12 * sbh  # final RMSNorm (fitted, as its per-layer twins)
        return Term(
            norm + logits, f"head: final RMSNorm {norm // sbh}sbh, fp32 log-softmax 4sbv, v={m.vocab:,}"
        )
    # final norm input and lm_head input 2 x 2sbh
    return Term(
        4 * sbh * scale + logits,
        f"head: norm + lm_head inputs 4sbh, fp32 log-softmax 4sbv, v={m.vocab:,}",
    )
