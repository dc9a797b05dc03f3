"""Activations saved for backward, per architecture family (Korthikanti et al. 2022, Table 2).

Each family's formula is derived from what its implementation saves and checked against what
``torch.autograd.graph.saved_tensors_hooks`` sees (tests/test_activations.py, tests/test_runner.py).

What it cannot see: the live peak beyond what is saved (the forward's and backward's temporaries, the
gradient of the largest activation while backward runs; ``kit.estimate.trace`` measures that peak),
dropout masks and a GELU variant other than the one each formula assumes, attention kernels other than
the one named in its formula (eager's s^2 scores vs SDPA / flash), tensors a custom model keeps on its
own (caches, hooks), activation offload other than DeepSpeed's ``cpu_checkpointing``
(``moved_checkpoints``), and padding a data loader adds beyond ``seq_len``.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from kit import checkpointing
from kit import sequence_parallel as ulysses
from kit import trainable as subset
from kit.estimate.result import NONE, Term
from kit.families import FORMULA, SWIGLU
from kit.loss import KEEPS, NAMES
from kit.models import DIT_DEFAULTS, decoder_biases
from kit.rules import FP32, element_bytes
from kit.schema import Setup

#: families with a formula below (each checked against what autograd saves); others are traced
FORMULA_FAMILIES = FORMULA
#: decoder families whose MLP is SwiGLU (gate and up projections, their product into down)
SWIGLU_FAMILIES = SWIGLU


def activations(setup: Setup) -> Term:
    """Bytes of activations saved for backward on one GPU at the micro batch: the family's formula
    (``formula``), else a trace of the model (``kit.estimate.trace``; a model it cannot trace is a
    ValueError naming the model and the op, never 0 bytes), else not estimated (a bare count)."""
    m = setup.model
    if m.family in FORMULA_FAMILIES and m.is_transformer and not m.source:
        return formula(setup)
    if m.arch or m.source:
        from kit.estimate import trace

        z = setup.zero
        for field, value, plain in (
            ("checkpoint_every", z.checkpoint_every, 1),
            ("checkpoint_policy", z.checkpoint_policy, "full"),
            ("cpu_checkpointing", z.cpu_checkpointing, False),
        ):
            if value != plain:
                raise ValueError(
                    f"zero.{field}: {value!r} is modelled for the families {', '.join(FORMULA_FAMILIES)}; "
                    f"{m.name} is traced, which checkpoints every block in full"
                )

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
    m, b, s = setup.model, setup.batch.micro_batch, setup.rank_seq_len
    scale = element_bytes(setup.zero.precision) // 2  # the formulas count 16-bit bytes
    layers, h, a, kv_heads, ffn, _ = m.dims
    # under sequence parallelism s is a rank's part and SDPA keeps the exchanged k and v: kv heads repeated
    # up to sp, over the whole sequence (kit.sequence_parallel)
    kv = ulysses.exchanged_kv_heads(kv_heads, setup.zero.sequence_parallel_size) * (h // a)
    sbh, sbf, sp = s * b * h, s * b * ffn, setup.zero.sequence_parallel_size
    as2b, mask = eager_scores(setup)
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
        if setup.zero.sequence_parallel_size > 1:  # o_proj's input is the exchange's output, not SDPA's
            per_layer += 2 * scale * sbh
            how += f" + {2 * scale}sbh (o_proj's input, exchanged back)"
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
        if family == "gpt2":  # the kit's GPT: masked_fill saves each layer's causal mask (bool s x s)
            per_layer += mask
            how = "16sbh + 2as^2b + 4sbf + s^2 (eager attention and its bool causal mask, no dropout)"
            if sp > 1:
                how += f"; under Ulysses s^2 of the whole sequence, a / {sp} heads"
    z = setup.zero
    if subset.is_subset(z):
        return _off_the_gpu(setup, _subset_formula(setup))
    if not z.activation_checkpointing:
        body = Term(layers * per_layer, f"{layers} layers x ({how}), s={s} b={b} h={h} a={a} f={ffn}")
        return body + _head_activations(setup, scale)
    checkpointed = layers // z.checkpoint_every
    kept = kept_by_policy(setup)
    held = 2 * sbh * scale + kept.bytes
    rest = layers - checkpointed
    body = Term(
        checkpointed * held + rest * per_layer + per_layer - also_saved(setup),
        f"checkpointing {checkpointing.describe(z.checkpoint_every, z.checkpoint_policy)}: "
        f"{checkpointed} blocks x (2sbh input"
        + (f" + {kept.formula}" if kept.bytes else "")
        + ")"
        + (f" + {rest} blocks x ({how})" if rest else "")
        + f" + one block recomputed in backward ({how}"
        + (" less the kept tensors it saves too" if kept.bytes else "")
        + ")",
    )
    return _off_the_gpu(setup, body + _head_activations(setup, scale))


def eager_scores(setup: Setup) -> tuple[int, int]:
    """A layer's eager attention on a rank: its scores' elements, ``a s^2 b`` (under Ulysses ``a / sp`` heads
    over the whole sequence, ``kit.sequence_parallel``), and its bool causal mask's bytes (the whole
    sequence squared)."""
    sp = setup.zero.sequence_parallel_size
    whole = setup.rank_seq_len * sp
    return setup.model.dims.heads // sp * whole * whole * setup.batch.micro_batch, whole * whole


def _checkpoint_inputs(setup: Setup) -> tuple[int, int]:
    """(checkpointed blocks, bytes of one block's input: p B x b s h) of a formula family's setup."""
    z, m = setup.zero, setup.model
    blocks = (m.layers or 0) // z.checkpoint_every if z.activation_checkpointing else 0
    return blocks, element_bytes(z.precision) * setup.batch.micro_batch * setup.rank_seq_len * (m.hidden or 0)


def moved_checkpoints(setup: Setup) -> Term:
    """The checkpointed blocks' inputs DeepSpeed's ``cpu_checkpointing`` takes off the GPU: all but those
    ``kit.checkpointing.resident`` leaves there at the backward's peak (the offload engine's newest two, or
    with ``partition_activations`` the one a recomputation restores). On CPU ranks the copy to the CPU is
    the input itself: they stay in rank memory (``kit.estimate.memory.peak_timeline``'s gloo path)."""
    blocks, one = _checkpoint_inputs(setup)
    moved = blocks - checkpointing.resident(setup.zero, blocks)
    if not moved:
        return NONE
    kept = blocks - moved
    return Term(moved * one, f"{moved} block inputs in CPU RAM, {kept} on the GPU (cpu_checkpointing)")


def host_checkpoints(setup: Setup) -> Term:
    """The checkpointed blocks' inputs one rank keeps in CPU RAM (``kit.checkpointing.on_the_host``): the
    offload engine's pinned copies of all but the newest, or with ``partition_activations`` every
    partition (at model-parallel size 1 a whole input, copied by a blocking ``.cpu()``)."""
    blocks, one = _checkpoint_inputs(setup)
    n = checkpointing.on_the_host(setup.zero, blocks)
    p = element_bytes(setup.zero.precision)
    return Term(n * one, f"{n} checkpointed block inputs {p} B x b s h (cpu_checkpointing)") if n else NONE


def _off_the_gpu(setup: Setup, term: Term) -> Term:
    """``term`` (the activations with every checkpoint on the GPU) less ``moved_checkpoints``."""
    moved = moved_checkpoints(setup)
    return Term(term.bytes - moved.bytes, f"{term.formula} - {moved.formula}") if moved.bytes else term


class Recomputed(NamedTuple):
    """Shares of one micro-step's forward work that checkpointing runs again in backward, per part of a
    block: its projections (``q``, ``k``, ``v``, ``o``, ``gate``, ``up``, ``down``; a GPT-2 style block's
    fused ``qkv`` is ``q``, its MLP ``up`` and ``down``), its attention kernel and everything else
    (norms, activations, rotary: ``rest``). A share is the fraction of blocks checkpointed, or 0 for what
    the selective policy keeps."""

    linears: dict[str, float]
    attention: float
    rest: float

    @property
    def any(self) -> bool:
        return self.rest > 0


def recomputed(setup: Setup) -> Recomputed:
    """What checkpointing recomputes (``Recomputed``), from ``kit.checkpointing``'s rules."""
    m, z = setup.model, setup.zero
    names = ("q", "k", "v", "o", "gate", "up", "down")
    if not z.activation_checkpointing or not m.layers:
        return Recomputed(dict.fromkeys(names, 0.0), 0.0, 0.0)
    share = (m.layers // z.checkpoint_every) / m.layers
    selective = z.checkpoint_policy == "selective-op"
    kept = {name for name, part, _ in _kept_matmuls(setup) if part == "base"} if selective else set()
    linears = {name: 0.0 if name in kept else share for name in names}
    attention = 0.0 if selective and m.family in SWIGLU_FAMILIES else share
    return Recomputed(linears, attention, share)


def projection_flops(m) -> dict[str, int]:
    """Each projection of a block by its forward FLOPs per token over 2 h (its output width, the MLP's
    down-projection its input width); a block without a gate has none (``gate`` 0)."""
    h = m.hidden or 1
    kv = (m.kv_heads or m.heads or 1) * (h // (m.heads or 1))
    f = m.ffn or 4 * h
    gate = f if m.family in SWIGLU_FAMILIES else 0
    return {"q": h, "k": kv, "v": kv, "o": h, "gate": gate, "up": f, "down": f}


def recomputed_share(setup: Setup, names: tuple[str, ...] | None = None) -> float:
    """The FLOP-weighted share of a block's projections (or of ``names`` among them) that checkpointing
    recomputes."""
    share, flops = recomputed(setup).linears, projection_flops(setup.model)
    names = names or tuple(flops)
    total = sum(flops[name] for name in names)
    return sum(flops[name] * share[name] for name in names) / total if total else 0.0


#: a Llama block's projections whose outputs its autograd saves (SDPA's v input, SiLU's gate input, the
#: SwiGLU product's up input); q and k are saved rotated, o and down not at all
SAVED_PROJECTIONS = ("v", "gate", "up")


def also_saved(setup: Setup) -> int:
    """Bytes of what the op policy keeps that the block's autograd saves as well (the kept ``v``,
    ``gate`` or ``up`` where no adapter adds to it, a LoRA adapter's kept A output, which its B saves, and
    SDPA's output and logsumexp): its recomputation saves all but these. Measured exactly on CPU ranks (the
    recomputation's saved storages, ``kit.ranks.engine.Checkpointing``); a backward peak measured in one
    process was one ``2sbh`` tensor lower still (1.9 % of a toy's)."""
    kept = kept_by_policy(setup)
    if not kept.bytes:
        return 0
    b, s, p = setup.batch.micro_batch, setup.rank_seq_len, element_bytes(setup.zero.precision)
    adapted = _adapted(setup)
    not_saved = [
        width
        for name, part, width in _kept_matmuls(setup)
        if not (part == "A" or (part == "base" and name in SAVED_PROJECTIONS and name not in adapted))
    ]
    return kept.bytes - sum(p * s * b * width for width in not_saved)


def _adapted(setup: Setup) -> frozenset[str]:
    """The projections of a block that carry LoRA adapters (the same in every block: peft's targets)."""
    from kit.estimate import partition

    listing = partition.listing(setup) if subset.is_subset(setup.zero) else None
    return listing.blocks[0].adapted if listing and listing.blocks else frozenset()


def _kept_matmuls(setup: Setup) -> list[tuple[str, str, int]]:
    """The matmuls whose outputs the op policy keeps in a Llama-style block: (projection, ``base``, ``A``
    or ``B``, output width). The policy counts the block's ``aten.mm`` calls in forward order and keeps
    every second from the first: each bias-free projection's, and with LoRA its adapter's A and B (peft
    runs them after the base layer: A's output is r wide), so an adapted projection shifts none of the
    others. [] for the other families (every linear has a bias, so none is an ``aten.mm``)."""
    m = setup.model
    if m.family not in SWIGLU_FAMILIES or not m.hidden:
        return []
    h, a = m.hidden, m.heads or 1
    kv, ffn = (m.kv_heads or a) * (h // a), m.ffn or 4 * h
    qkv_bias, o_bias, mlp_bias = decoder_biases(json.loads(m.arch) if m.arch else {"model_type": m.family})
    linears = (  # a Llama block's projections in forward order: (name, output width, bias)
        ("q", h, qkv_bias), ("k", kv, qkv_bias), ("v", kv, qkv_bias), ("o", h, o_bias),
        ("gate", ffn, mlp_bias), ("up", ffn, mlp_bias), ("down", h, mlp_bias),
    )  # fmt: skip
    adapted, r = _adapted(setup), setup.zero.lora_rank
    matmuls = []
    for name, width, bias in linears:
        matmuls += [] if bias else [(name, "base", width)]
        matmuls += [(name, "A", r), (name, "B", width)] if name in adapted else []
    return [mm for i, mm in enumerate(matmuls, 1) if checkpointing.keeps_matmul(i)]


def kept_by_policy(setup: Setup) -> Term:
    """Bytes a checkpointed block keeps besides its input (``kit.checkpointing``): 0 under ``full``; under
    ``selective-op`` the outputs of its kept bias-free matmuls and of SDPA (output and fp32 logsumexp).
    Measured exactly at the end of the forward on Hugging Face's Llama and Qwen2
    (tests/test_checkpointing.py)."""
    m, z = setup.model, setup.zero
    if z.checkpoint_policy != "selective-op" or m.family not in SWIGLU_FAMILIES:
        # the kit's GPT-2 and DiT, HF's GPT-2 and GPT-NeoX: every linear has a bias (aten.addmm) and the
        # attention is eager, so the op policy keeps nothing a full recomputation would not rebuild
        return Term(0, "")
    b, s, p = setup.batch.micro_batch, setup.rank_seq_len, element_bytes(z.precision)
    kept = _kept_matmuls(setup)
    matmuls = sum(p * s * b * width for _, _, width in kept)
    attention = p * s * b * (m.hidden or 0) + FP32 * (m.heads or 1) * b * s
    names = "+".join(name if part == "base" else f"{name}'s lora_{part}" for name, part, _ in kept)
    return Term(matmuls + attention, f"{names} outputs + SDPA output and fp32 logsumexp")


def _head_activations(setup: Setup, scale: int) -> Term:
    """What the model saves outside its blocks (16-bit byte counts times ``scale``)."""
    m, b, s = setup.model, setup.batch.micro_batch, setup.rank_seq_len
    sbh = s * b * m.dims.hidden
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
        if setup.zero.loss != "plain":
            return fused_head(setup, norm - 2 * scale * sbh, True)
        return Term(
            norm + logits, f"head: final RMSNorm {norm // sbh}sbh, fp32 log-softmax 4sbv, v={m.vocab:,}"
        )
    if setup.zero.loss != "plain":  # the final LayerNorm's input, and what the fused loss keeps
        return fused_head(setup, 2 * scale * sbh, True)
    # final norm input and lm_head input 2 x 2sbh
    return Term(
        4 * sbh * scale + logits,
        f"head: norm + lm_head inputs 4sbh, fp32 log-softmax 4sbv, v={m.vocab:,}",
    )


#: bytes per element of a LoRA dropout's mask: ``torch.native_dropout``'s bool, what ``F.dropout`` runs on
#: a GPU and the ranks run everywhere (``kit.workloads.adapters``)
DROPOUT_MASK = 1


class Saved(NamedTuple):
    """What a trainable subset's step saves (``_subset_saved``): bytes per block as it trains without
    checkpointing, the most one checkpointed block saves when it is recomputed, the head's, what the
    last block's input norm keeps for its backward (its fp32 input, its normalised input), and whether
    the head saves the decoder's output (``lm_head``'s input: when it trains, or under stage 3's
    ``zero.Init``); how many blocks' attention needs no gradient (SDPA saves nothing there, so only
    transformers' KV cache holds their k and v: ``kit.estimate.micro_step.kv_cache``)."""

    blocks: tuple[int, ...]
    recomputed: int
    head: int
    last_norm: int
    output_saved: bool
    unattended: int = 0


def _subset_saved(setup: Setup) -> Saved:
    """Hugging Face's Llama-style block op by op, saving only what a gradient needs: an op's input is saved
    for the gradient of a weight that trains (a projection's input, an RMSNorm's normalised input) or for
    the gradient of an input that needs one (the norms' fp32 inputs, SDPA's q, k, v, output and
    logsumexp, SiLU's input, the SwiGLU product's two factors). Which tensors train and which projections
    carry LoRA adapters (their A output, b s r, is saved for B's gradient) come from the model listed with
    its subset (``kit.workloads.adapters``). With LoRA dropout each adapter's A saves its own dropped copy of
    the layer's input instead of the input, and the dropout its bool mask where the input needs a gradient
    (``DROPOUT_MASK``); the input itself only where another op saves it. A recomputed block, whose input
    needs a gradient, holds every mask (the same ones: the checkpoint restores the RNG state). The residual
    stream needs a gradient from the first trainable part on; with frozen embeddings and checkpointing,
    from the first block (the script calls ``enable_input_require_grads``, as Hugging Face does). At stage
    3 under ``zero.Init`` every linear layer whose input needs a gradient saves that input, frozen or not:
    ``zero.Init`` replaces ``torch.nn.functional.linear`` with DeepSpeed's ``zero3_linear_wrap`` for the
    rest of the process (``mem_efficient_linear``), whose ``LinearFunctionForZeroStage3`` saves input,
    weight and bias whatever needs a gradient (an autograd Function none of whose inputs needs one saves
    nothing). With every parameter training this is the family's formula above, term for term."""
    from kit.estimate import partition
    from kit.workloads import adapters

    m, z = setup.model, setup.zero
    listing = partition.listing(setup)
    if m.family == "gpt2":
        return _gpt2_subset_saved(setup, listing)
    b, s, p = setup.batch.micro_batch, setup.rank_seq_len, element_bytes(z.precision)
    _, h, a, kv_heads, _, _ = m.dims
    sp = z.sequence_parallel_size  # SDPA keeps the exchanged k and v (kit.sequence_parallel)
    kv, f, r = ulysses.exchanged_kv_heads(kv_heads, sp) * (h // a), m.ffn, z.lora_rank
    assert f is not None  # a subset's model has a Llama-style arch (kit.trainable), which gives its ffn
    sbh, sbf = s * b * h, s * b * f
    # an RMSNorm: its fp32 input (the 16-bit one upcast; in fp32 the input itself), the normalised input
    norm_input, normalised = FP32 * sbh, p * sbh

    every_linear = z.engine == "deepspeed" and z.stage == 3 and z.zero_init
    # QLoRA: a block's base layers are 4-bit, run by bitsandbytes' MatMul4Bit, which saves the packed weight
    # only (the F.linear inside its forward runs without autograd); the head and the adapters stay nn.Linear
    block_linear = every_linear and not z.qlora
    dropout = z.lora_dropout > 0
    attends: list[bool] = []  # per block called: whether its attention needs a gradient

    def block(parts: adapters.Block, grad: bool) -> tuple[int, bool]:
        def needs(name: str) -> bool:
            return name in parts.trains or name in parts.adapted

        def inputs(width: int, grad_in: bool, *names: str, held: bool = False) -> int:
            """What the linear layers ``names`` save of their common input (``width`` wide; ``grad_in``:
            whether it needs a gradient; ``held``: another op saves it already): the input itself for a
            base weight that trains, under ``zero.Init`` (when it needs a gradient: an autograd Function
            saves nothing otherwise) and for the adapters' A without dropout; with dropout each adapter's
            A saves its own dropped copy, and the dropout its bool mask when the input needs a gradient."""
            adapted = sum(name in parts.adapted for name in names)
            own = any(name in parts.trains for name in names) or (block_linear and grad_in)
            own = (own or (adapted > 0 and not dropout)) and not held
            return s * b * width * (p * own + adapted * dropout * (p + DROPOUT_MASK * grad_in))

        saved = r * p * s * b * len(parts.adapted)  # each adapter's A output
        saved += norm_input * grad + normalised * ("norm1" in parts.trains)
        normed = grad or "norm1" in parts.trains
        saved += inputs(h, normed, *"qkv")  # the q, k, v projections' input
        attention = normed or any(map(needs, "qkv"))
        attends.append(attention)
        if attention:  # rotated q, k, v, the output and the fp32 logsumexp
            saved += p * (2 * sbh + 2 * s * b * kv) + FP32 * a * b * s
        # o_proj's input: SDPA's output, saved by SDPA when it needs a gradient (not when exchanged back)
        saved += inputs(h, attention, "o", held=attention and sp == 1)
        grad = grad or attention or needs("o")
        saved += norm_input * grad + normalised * ("norm2" in parts.trains)
        normed = grad or "norm2" in parts.trains
        saved += inputs(h, normed, "gate", "up")
        gate, up = normed or needs("gate"), normed or needs("up")
        saved += p * sbf * (gate + up + gate)  # SiLU's input; the product's factors (silu(gate), up)
        saved += inputs(f, gate or up, "down")
        return saved, grad or gate or up or needs("down")

    grad = listing.inputs_need_grad or z.activation_checkpointing
    blocks, last_norm = [], 0
    for parts in listing.blocks:
        last_norm = norm_input * grad + normalised * ("norm1" in parts.trains)
        saved, grad = block(parts, grad)
        blocks.append(saved)
    unattended = attends.count(False)
    every = z.checkpoint_every
    recomputed = max(
        (
            block(parts, True)[0]
            for i, parts in enumerate(listing.blocks)
            if checkpointing.is_checkpointed(i, every)
        ),
        default=0,
    ) - also_saved(setup)  # what the op policy keeps a recomputed block does not save again
    head = norm_input * grad + normalised * ("norm" in listing.head)
    output_saved = "lm_head" in listing.head or every_linear
    if z.loss != "plain":
        head = fused_head(setup, head, "lm_head" in listing.head).bytes
    else:
        head += p * sbh * output_saved + FP32 * s * b * (m.vocab or 0)
    return Saved(tuple(blocks), recomputed, head, last_norm, output_saved, unattended)


def _gpt2_subset_saved(setup: Setup, listing) -> Saved:
    """``_subset_saved`` for the kit's GPT (GPT-2's block, eager attention, no dropout) with frozen groups or
    LoRA (its ``Conv1D``s are ``torch.addmm``, which saves its input only for its weight's gradient;
    ``zero.Init`` wraps ``F.linear``: the head's and the adapters'): each LayerNorm saves its input where it
    or its weights need a gradient; c_attn, c_proj, c_fc and the MLP's c_proj their input where their weight
    trains or an adapter's A takes it (with LoRA dropout, A's own dropped copy and, where the input needs a
    gradient, the bool mask), each adapter its A's output (b s r, for B); the attention (q, k and v copies,
    the softmax, the causal mask) and the GELU's input where their input needs a gradient (an adapted
    c_attn's or c_fc's output does). The residual stream needs one from the first block when the position
    embeddings train (the input embeddings frozen, ``freeze_embeddings``, leave them training) or under
    checkpointing. With every parameter training this is the family's formula, term for term."""
    z, m = setup.zero, setup.model
    b, s, p = setup.batch.micro_batch, setup.rank_seq_len, element_bytes(z.precision)
    _, h, a, _, f, _ = m.dims
    sbh, sbf = p * s * b * h, p * s * b * f
    scores, mask = eager_scores(setup)
    attention = 3 * sbh + p * scores + mask
    dropout = z.lora_dropout > 0

    def block(parts, grad: bool) -> tuple[int, bool]:
        trains, adapted = parts.trains, parts.adapted

        def projection(width: int, grad_in: bool, name: str) -> int:
            """What the ``Conv1D`` ``name`` and its adapter save: its input (``width`` wide, needing a
            gradient if ``grad_in``), the adapter's dropped copy and mask, and its A's output."""
            lora = name in adapted
            own = name in trains or (lora and not dropout)
            dropped = lora * dropout * (p + DROPOUT_MASK * grad_in)
            return s * b * (width * (p * own + dropped) + lora * z.lora_rank * p)

        def grads(name: str) -> bool:  # the projection's output needs a gradient for its own weights
            return name in trains or name in adapted

        norm1 = grad or "norm1" in trains
        attended = norm1 or grads("q")  # c_attn's output needs a gradient
        saved = sbh * norm1 + projection(h, norm1, "q") + attention * attended + projection(h, attended, "o")
        mid = grad or attended or grads("o")
        norm2 = mid or "norm2" in trains
        up = norm2 or grads("up")  # c_fc's output needs a gradient
        saved += sbh * norm2 + projection(h, norm2, "up") + sbf * up + projection(f, up, "down")
        return saved, mid or up or grads("down")

    grad = listing.inputs_need_grad or z.activation_checkpointing
    blocks, last_norm = [], 0
    for parts in listing.blocks:
        last_norm = sbh * (grad or "norm1" in parts.trains)
        saved, grad = block(parts, grad)
        blocks.append(saved)
    recomputed = max(
        (block(parts, True)[0] for i, parts in enumerate(listing.blocks)
         if checkpointing.is_checkpointed(i, z.checkpoint_every)),
        default=0,
    )  # fmt: skip
    normed = grad or "norm" in listing.head  # the final norm's output needs a gradient
    norm = sbh * normed
    every_linear = z.engine == "deepspeed" and z.stage == 3 and z.zero_init
    output_saved = "lm_head" in listing.head or (every_linear and normed)
    if z.loss != "plain":
        return Saved(tuple(blocks), recomputed, fused_head(setup, norm, "lm_head" in listing.head).bytes,
                     last_norm, output_saved)  # fmt: skip
    head = norm + p * s * b * h * output_saved + FP32 * s * b * (m.vocab or 0)
    return Saved(tuple(blocks), recomputed, head, last_norm, output_saved)


def fused_head(setup: Setup, norm: int, trains: bool) -> Term:
    """The head under a fused loss (``kit.loss``): what the final norm keeps besides its output (``norm``
    bytes: an RMSNorm's fp32 input and normalised input, a LayerNorm's input) and what the loss keeps for
    backward instead of the fp32 log-softmax (``kit.loss.KEEPS``). The chunked loss computes the head's
    gradients in its forward and keeps them: the input's (16-bit, b s h) and, when the head trains, its
    weight's (16-bit, v h). Cut Cross-Entropy keeps its input, the norm's output (16-bit, b s h,
    ``linear_cross_entropy(..., shift=1)``: no shifted copy), each token's fp32 log-sum-exp and target
    (int64; CCE's own: the valid tokens' int64 indices; with labels shifted before a sequence-parallel
    split, the batch's ``shift_labels`` themselves; the kit's GPT's labels, the next tokens already)."""
    m, b, p = setup.model, setup.batch, element_bytes(setup.zero.precision)
    h, v = m.dims.hidden, m.dims.vocab  # a language model's: a fused loss needs its vocab (kit.loss)
    sbh = b.micro_batch * setup.rank_seq_len * h
    final = f"final {final_norm(m)} {norm / sbh:g}sbh"
    if KEEPS[setup.zero.loss] == "input":
        tokens = b.micro_batch * setup.rank_seq_len
        own = setup.zero.sequence_parallel_size == 1 and m.family in SWIGLU_FAMILIES
        targets = 8 * tokens if own else 0
        return Term(
            norm + p * sbh + FP32 * tokens + targets,
            f"head: {final} + its output {p} B x b s h, Cut Cross-Entropy's fp32 LSE 4 B x b s"
            + (" and int64 targets 8 B x b s" if targets else ""),
        )
    grad_input, grad_weight = p * sbh, p * v * h * trains
    return Term(
        norm + grad_input + grad_weight,
        f"head: {final}, chunked loss's saved gradients {p} B x b s h"
        + (f" + {p} B x v h (v={m.vocab:,})" if trains else ""),
    )


def final_norm(model) -> str:
    """The final norm's kind in ``model``'s family: Hugging Face's Llama-style RMSNorm, else LayerNorm."""
    return "RMSNorm" if model.family in SWIGLU_FAMILIES else "LayerNorm"


def _subset_formula(setup: Setup) -> Term:
    """``formula`` for a trainable subset (``_subset_saved``)."""
    z = setup.zero
    saved = _subset_saved(setup)
    what = f"{subset.describe(z)}: each op saves only what a gradient needs"
    loss = "the fp32 log-softmax" if z.loss == "plain" else f"the {NAMES[z.loss]}"
    head = Term(saved.head, f"head: what the final norm and {loss} save")
    if not z.activation_checkpointing:
        return Term(sum(saved.blocks), f"{len(saved.blocks)} blocks ({what})") + head
    b, s, p = setup.batch.micro_batch, setup.rank_seq_len, element_bytes(z.precision)
    marked = [checkpointing.is_checkpointed(i, z.checkpoint_every) for i in range(len(saved.blocks))]
    policy = kept_by_policy(setup)
    kept = sum(marked) * (p * s * b * setup.model.dims.hidden + policy.bytes)
    rest = sum(n for n, ckpt in zip(saved.blocks, marked, strict=True) if not ckpt)
    held = f" + {policy.formula}" if policy.bytes else ""
    less = ", less the kept tensors it saves too" if policy.bytes else ""
    return (
        Term(
            kept + rest + saved.recomputed,
            f"checkpointing {checkpointing.describe(z.checkpoint_every, z.checkpoint_policy)}: "
            f"{sum(marked)} blocks x (2sbh input{held}) + the other blocks + one block recomputed in "
            f"backward ({what}{less})",
        )
        + head
    )
