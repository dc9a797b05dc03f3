"""The activation-shaped terms of one micro-step, at the moments ``kit.estimate.peak`` compares: what the
blocks and the head save (the family's formula, a trainable subset's op-by-op account, a trace), the loss's
logits or a fused loss's working set (``kit.loss``: the chunked loss's chunk, Cut Cross-Entropy's blocks),
the last block's backward working set, a trainable
subset's late first gradient hook, and on CPU ranks the RNG states checkpointing stashes and oneDNN's bf16
matmul scratch (``kit.estimate.cpu_matmul``).

What it cannot see: see ``kit.estimate.peak``.
"""

from __future__ import annotations

from typing import NamedTuple

from kit import checkpointing
from kit import trainable as subset
from kit.estimate import partition
from kit.estimate.activations import (
    FORMULA_FAMILIES,
    SWIGLU_FAMILIES,
    _head_activations,
    _subset_saved,
    also_saved,
    eager_scores,
    final_norm,
    formula,
    fused_head,
    kept_by_policy,
)
from kit.estimate.cpu_matmul import CpuMatmul, bf16_mm_scratch
from kit.estimate.result import NONE, Term
from kit.loss import CCE_BLOCK_V, chunk_tokens
from kit.rules import FP32, element_bytes
from kit.schema import Setup

#: int64 token ids of the micro batch
TOKEN_ID_BYTES = 8


#: bytes of torch's CPU generator state (``torch.get_rng_state()``, a uint8 tensor: mt19937's)
CPU_RNG_STATE_BYTES = 5056


def rng_states(setup: Setup) -> Term:
    """On CPU ranks, the RNG states each checkpointed block's call stashes for its recomputation: DeepSpeed's
    checkpoint keeps the CPU state and the accelerator's, the CPU's again (``fwd_cpu_rng_state``,
    ``fwd_cuda_rng_state``) on its autograd node, alive with the loss's graph (forward, backward and
    ``engine.step()``); ``torch.utils.checkpoint`` (the op policy's, non-reentrant) the CPU's in its frame,
    freed with the saved tensors at the end of backward. On a GPU they are host tensors."""
    z, layers = setup.zero, setup.model.layers or 0
    if not z.activation_checkpointing or not layers:
        return NONE
    count = 2 if z.checkpoint_policy == "full" else 1
    blocks = layers // z.checkpoint_every
    n = count * blocks * CPU_RNG_STATE_BYTES
    return Term(n, f"{count} x {CPU_RNG_STATE_BYTES:,} B x {blocks} checkpointed blocks (CPU RNG states)")


def input_leaf(setup: Setup) -> Term:
    """Frozen embeddings under checkpointing: ``enable_input_require_grads`` makes their output a leaf that
    needs a gradient, so backward leaves its ``.grad``; the loss's graph (``AccumulateGrad``) holds both
    until the loss is freed, after ``engine.step()``."""
    listing = partition.listing(setup)
    if not listing or listing.inputs_need_grad or not setup.zero.activation_checkpointing:
        return NONE  # (the kit's GPT with frozen input embeddings: its position embeddings still train)
    b, m, p = setup.batch, setup.model, element_bytes(setup.zero.precision)
    assert m.hidden is not None  # a subset's model: a formula family's or an HF config naming its hidden size
    n = 2 * p * b.micro_batch * setup.rank_seq_len * m.hidden
    return Term(n, f"2 x {p} B x b s h (the embeddings' output, made to need a gradient, and its .grad)")


def kv_cache(setup: Setup) -> Term:
    """With the plain loss, what transformers' KV cache holds beyond what autograd saves. A Hugging Face
    decoder keeps one in training too (``use_cache``, its config's default; off under gradient
    checkpointing, as the ranks' checkpointing and transformers' own turn it off): each layer's k and v of
    the rank's tokens, alive until the model's output is dropped after its loss (a fused loss drops the
    decoder's output first). They are the tensors SDPA saves (no byte more) but under Ulysses, where SDPA
    saves the exchanged ones, and in a block whose attention needs no gradient (a trainable subset's before
    its first trainable part: LoRA on the MLP alone, measured +3.5 % at the loss without them)."""
    z, m = setup.zero, setup.model
    if z.activation_checkpointing or z.loss != "plain" or m.family not in SWIGLU_FAMILIES or m.source:
        return NONE
    if z.sequence_parallel_size > 1:
        layers, what = m.dims.layers, "L"
    elif subset.is_subset(z):
        layers = _subset_saved(setup).unattended
        what = f"{layers} blocks whose attention needs no gradient"
    else:
        return NONE
    _, h, a, kv_heads, _, _ = m.dims
    b, p = setup.batch.micro_batch, element_bytes(z.precision)
    n = layers * 2 * p * b * setup.rank_seq_len * kv_heads * (h // a)
    tokens = "b s/sp" if z.sequence_parallel_size > 1 else "b s"
    return Term(n, f"{what} x 2 x {p} B x {tokens} x kv (transformers' KV cache, use_cache)") if n else NONE


class Shape:
    """The activation-shaped terms of one micro-step."""

    def __init__(self, setup: Setup, act: Term, cpu: CpuMatmul | None) -> None:
        m, b = setup.model, setup.batch
        p = element_bytes(setup.zero.precision)
        lm = (
            m.family in FORMULA_FAMILIES
            and m.is_transformer
            and not m.source
            and m.vocab
            and m.family != "dit"
        )
        tokens = b.micro_batch * setup.rank_seq_len
        logits = tokens * (m.vocab or 0) if lm else 0
        upcast = FP32 * logits if p != FP32 else 0
        self.loss = (
            Term(
                p * logits + upcast,
                f"logits {p} B x b s v" + (" + their fp32 upcast 4 B x b s v" if upcast else ""),
            )
            if logits
            else NONE
        )
        self.loss_grads = (
            Term(
                2 * FP32 * logits, "nll_loss and log_softmax backward: 2 x 4 B x b s v (fp32 logit gradients)"
            )
            if logits
            else NONE
        )
        if logits and setup.zero.loss != "plain":
            self.loss, self.loss_grads = FUSED[setup.zero.loss](setup, cpu)
        self.batch = Term(TOKEN_ID_BYTES * tokens, "token ids 8 B x b s") if m.vocab else NONE
        formulaic = m.family in FORMULA_FAMILIES and m.is_transformer and not m.source
        self.late, self.first, self.attention = None, NONE, None
        if formulaic and subset.is_subset(setup.zero):
            saved = _subset_saved(setup)
            head = Term(saved.head, "")
            held = m.family in SWIGLU_FAMILIES and not saved.output_saved  # the kit's GPT holds nothing
            if logits and setup.zero.loss == "plain" and held:
                # Hugging Face's ``*ForCausalLM.forward`` keeps ``hidden_states`` (and ``outputs``) while its
                # ``loss_function`` runs: the decoder's output lives to the loss although no one saves it
                self.loss += Term(
                    p * tokens * m.dims.hidden,
                    f"the decoder's output {p} B x b s h (the model's forward holds it; the frozen head "
                    "saves none)",
                )
            recomputed = saved.recomputed if setup.zero.activation_checkpointing else 0
            self.late = _late_hook(setup, act, saved, p)
            self.first = Term(saved.blocks[0], "the first block's saved activations")
        elif formulaic:
            scale = p // 2
            head = _head_activations(setup, scale)
            full = formula(
                setup.model_copy(
                    update={"zero": setup.zero.model_copy(update=setup.zero.checkpointing(False))}
                )
            )
            per_layer = (full.bytes - head.bytes) // m.dims.layers
            recomputed = per_layer - also_saved(setup) if setup.zero.activation_checkpointing else 0
            self.first = Term(per_layer, "one block's saved activations")
        self.block_forward = NONE
        if formulaic:
            self.forward = Term(
                act.bytes - recomputed,
                act.formula + (" - one layer recomputed in backward only" if recomputed else ""),
            )
            if setup.zero.activation_checkpointing and (m.family in SWIGLU_FAMILIES or m.family == "gpt2"):
                self.block_forward = _block_forward(setup, cpu)
                self.checkpoints = Term(
                    self.forward.bytes - head.bytes, f"{self.forward.formula} - the head's (not yet saved)"
                )
            freed = _freed_by_recompute(setup, m.dims.layers - 1)
            self.blocks = Term(
                act.bytes - head.bytes - freed,
                f"{act.formula} - the head's {head.bytes:,} B (freed)"
                + (f" - the last block's kept outputs its recomputation frees, {freed:,} B" if freed else ""),
            )
            s, h, f = setup.rank_seq_len, m.dims.hidden, m.dims.ffn
            mb = b.micro_batch
            gated = 2 if m.family in SWIGLU_FAMILIES else 0  # the product's backward: gate and up b s f
            trains = partition.listing(setup)
            last = trains.blocks[-1] if trains else None
            down = "down" in last.trains if last else True
            # the kit's GPT with an adapter on its down projection: the base's input gradient and the
            # adapter's, before autograd sums them (measured 3.6 % above the estimate without the second)
            twice = not gated and last is not None and "down" in last.adapted
            self.block_backward = Term(
                p * ((1 + gated + twice) * s * mb * f + f * h * down + s * mb * h),
                f"{p} B x ({1 + gated + twice if gated or twice else ''}b s f + "
                f"{'f h + ' if down else ''}b s h): the MLP down-projection's input "
                f"{'and weight gradients ' if down else 'gradient '}and the incoming one"
                + (", and the SwiGLU product's two input gradients" if gated else "")
                + (", and its adapter's input gradient" if twice else ""),
            ) + (_weight_grad_scratch(setup, cpu) if down else NONE)
            if not gated:  # then the GELU's backward: its incoming and input gradients, and the residual's;
                # its output freed by then where the down projection or its adapter's A saved it (measured:
                # 4.7 % below a stage-0 fp32 backward under the op policy while it was counted)
                kept = down or (twice and not setup.zero.lora_dropout)
                activation = Term(
                    p * ((2 - kept) * s * mb * f + s * mb * h),
                    f"{p} B x ({'' if kept else '2 '}b s f + b s h): the MLP activation's input and incoming "
                    "gradients" + (" less its output, freed" if kept else "") + " and the residual's",
                )
                self.block_backward = max(self.block_backward, activation, key=lambda t: t.bytes)
                if m.family == "gpt2" and not trains:
                    self.attention = _attention_backward(setup, self.blocks, p)
            dequantized = _dequantized(setup, f * h, cpu)
            if dequantized.bytes:  # QLoRA: the down projection's backward, its weight dequantized
                deq = dequantized + Term(
                    p * ((1 + twice) * s * mb * f + s * mb * h),
                    f"{p} B x ({'2 ' if twice else ''}b s f + b s h): the down projection's input gradient"
                    + (" and its adapter's" if twice else "")
                    + " and the incoming one",
                )
                self.block_backward = max(self.block_backward, deq, key=lambda t: t.bytes)
            vh = m.vocab * h if m.vocab else 0
            z = setup.zero
            embedding = trains.embeddings if trains else True  # a frozen tied embedding gets no gradient
            lm_head = "lm_head" in trains.head if trains else True
            if m.tied_embeddings and vh and embedding:
                self.tied = Term(p * vh, f"{p} B x v h (the tied embedding's gradient from the head)")
            elif vh and z.engine == "deepspeed" and z.stage == 1 and lm_head:
                self.tied = Term(p * vh, f"{p} B x v h (the head's gradient, in .grad to the boundary)")
            else:
                self.tied = NONE
        else:
            some = partition.listing(setup) is not None
            largest = partition.largest_tensor(setup) if some else setup.model.largest_layer_params
            self.forward = self.blocks = act
            what = "largest trainable tensor" if some else "largest layer"
            self.block_backward = Term(p * largest, f"{p} B x {what} (its gradient)")
            self.tied = NONE


def _chunk(setup: Setup, cpu: CpuMatmul | None) -> tuple[Term, Term]:
    """The chunked loss's working set in its forward (``kit.loss``): the decoder's output (16-bit b s h, held
    while the loss runs), a Hugging Face decoder's shifted copy the loss is given (b (s-1) h; the kit's GPT's
    labels are the next tokens already) and one chunk at a time: its
    logits (16-bit, ``chunk_tokens`` x v) on a GPU (Liger's Triton kernel turns them into their gradient in
    registers); on CPU ranks (``cpu``: the plain-PyTorch version, ``kit.workloads.chunked_loss``) the
    largest of its steps, each holding the chunk's 16-bit logits or logit gradient (c x v) and what the step
    adds, a matmul's oneDNN bf16 scratch (``kit.estimate.cpu_matmul``) living only while the matmul runs:

    - the logits' matmul ``x @ weight.t()`` (B a transposed view): its scratch;
    - their fp32 upcast, and the gradient's 16-bit downcast from it: the fp32 softmax (4 B x c x v);
    - the input's gradient ``grad @ weight``: its output (c x h, copied into the saved gradient) and scratch;
    - the weight's, when the head trains: ``addmm_`` of the gradient's transpose by the input into the saved
      gradient, scratch only.

    Measured on the shrunk Llama (c = 16 of 62 tokens, v = 256, h = 64; AMX, one thread): the logits'
    matmul 8,192 + 7,168 B, the upcast 8,192 + 16,384 B, the input's gradient 8,192 + 2,048 + 37,888 B
    (the largest), the weight's 8,192 + 25,728 B. Its backward hands back the gradients it saved: nothing
    new."""
    m, b, p = setup.model, setup.batch, element_bytes(setup.zero.precision)
    v, h, s = m.dims.vocab, m.dims.hidden, setup.rank_seq_len
    if m.family not in SWIGLU_FAMILIES:  # the kit's GPT: its labels are the next tokens already, no copy
        tokens = b.micro_batch * s
        held = p * tokens * h
        what = f"the decoder's output {p} B x b s h (labels the next tokens already: no copy)"
    elif setup.zero.sequence_parallel_size == 1:  # a Hugging Face decoder: its output, their shifted copy
        tokens = b.micro_batch * (s - 1)
        held = p * (b.micro_batch * s + tokens) * h
        what = f"the decoder's output and its shifted copy {p} B x b (2s-1) h"
    else:  # labels shifted before the split (kit.workloads.ulysses): every token's hidden state, no copy
        tokens = b.micro_batch * s
        held = p * tokens * h
        what = f"the decoder's output {p} B x b s/sp h (labels shifted before the split: no copy)"
    chunk = chunk_tokens(tokens, v, h)
    logits = p * chunk * v
    if cpu is None:
        work, how = logits, "a chunk's logits (Liger's Triton kernel)"
    else:

        def scratch(rows: int, inner: int, cols: int, transposed_a: bool, transposed_b: bool = False) -> int:
            if p != 2:
                return 0
            return bf16_mm_scratch(rows, inner, cols, transposed_a, cpu, transposed_b=transposed_b)

        listing = partition.listing(setup)
        head_trains = listing is None or "lm_head" in listing.head
        work = max(
            logits + scratch(chunk, h, v, False, True),  # the logits: x @ W^T, W^T a transposed view
            logits + FP32 * chunk * v,  # their fp32 upcast (the softmax), later the gradient's downcast
            logits + p * chunk * h + scratch(chunk, v, h, False),  # the input's gradient: its output, x W
            logits + scratch(v, chunk, h, True) * head_trains,  # the weight's: addmm_ of its transpose
        )
        how = "a chunk's logits and the largest of its steps (CPU ranks' plain PyTorch, oneDNN scratch)"
    return Term(held + work, f"chunked loss: {what} + {how}, {chunk:,} of {tokens:,} tokens per chunk"), NONE


def cce_working_sets(setup: Setup, cpu: CpuMatmul | None) -> tuple[Term, Term]:
    """Cut Cross-Entropy's working sets (``kit.loss``), in its forward and in its backward, besides what it
    saves (the decoder's output, the LSE, the targets: ``kit.estimate.activations.fused_head``). Over the
    rank's b s tokens (each sequence's last one has no target: its logits are computed and left out),
    the vocabulary in blocks of ``kit.loss.CCE_BLOCK_V``.

    On a GPU (``ml-cross-entropy``'s Triton kernels, their default tiles: 256 tokens x 128 vocabulary
    entries forward, 128 x 128 backward, in registers and shared memory, none in GPU memory): forward, the
    negated target logits that become each token's loss (fp32 b s) and the average logit per vocabulary
    entry it keeps for backward's ordering of the blocks (fp32 v; the gradient filter's); backward, the
    input's gradient (16-bit b s h, ``zeros_like(e)``), the weight's (16-bit v h) when the head trains, the
    average logits and the vocabulary ordering (int32 v). Its lock arrays (a word per 128 tokens or
    vocabulary entries by 64 hidden) are not counted.

    On CPU ranks (``cpu``: the plain-PyTorch version, ``kit.workloads.chunked_loss``), every token at once
    by one vocabulary block, its b s x block logits a tensor: forward, the picked target logits (fp32 b s)
    and the largest of the block's steps: its 16-bit logits with the matmul's oneDNN bf16 scratch
    (``kit.estimate.cpu_matmul``; B a transposed view), or with their fp32 upcast (the softmax, in place);
    backward, the two gradients, accumulated block by block, each token's gradient scale (fp32 b s) and the
    largest of the block's steps: the logits' matmul, their upcast, the gradient's 16-bit downcast, the
    input gradient's ``addmm_`` (the gradient by the block) and the weight's (its transpose by the input,
    into the block's rows) with their scratch. In fp32 the upcast and the downcast are the tensor itself.
    Not counted: the indices of a block's targets (at most 2 x 8 B x b s, as many as fall in the block).
    Measured alone (64 tokens, h = 64, v = 256, bf16, AMX, 2 threads): forward 49,408 B as modelled,
    backward 100,368 B against 100,352 (the scalars' 16 B); fp32 within 1 KiB (those indices)."""
    m, b, p = setup.model, setup.batch, element_bytes(setup.zero.precision)
    v, h = m.dims.vocab, m.dims.hidden
    tokens = b.micro_batch * setup.rank_seq_len
    listing = partition.listing(setup)
    trains = listing is None or "lm_head" in listing.head
    grads = p * tokens * h + p * v * h * trains
    grads_what = f"the input's gradient {p} B x b s h" + (f" and the weight's {p} B x v h" if trains else "")
    if cpu is None:
        average = FP32 * v
        return (
            Term(
                FP32 * tokens + average,
                "Cut Cross-Entropy (Triton): the target logits 4 B x b s and the average logits 4 B x v",
            ),
            Term(
                grads + average + 4 * v,
                f"Cut Cross-Entropy (Triton) backward: {grads_what}, the average logits 4 B x v and the "
                "vocabulary ordering int32 v",
            ),
        )
    block = min(CCE_BLOCK_V, v)
    logits = p * tokens * block
    upcast = FP32 * tokens * block if p != FP32 else 0

    def scratch(rows: int, inner: int, cols: int, transposed_a: bool, transposed_b: bool = False) -> int:
        if p != 2:
            return 0
        return bf16_mm_scratch(rows, inner, cols, transposed_a, cpu, transposed_b=transposed_b)

    product = logits + scratch(tokens, h, block, False, True)  # x @ W_block^T, W_block^T a transposed view
    # the target logits picked so far (fp32 b s); the block's softmax: its 16-bit logits and their upcast, or
    # (in fp32, where the upcast is the tensor itself) its logits and their row max and sum (fp32 b s each)
    forward = FP32 * tokens + max(product, logits + upcast, FP32 * tokens * block + 2 * FP32 * tokens)
    scale = FP32 * tokens  # each token's gradient scale, through the loop
    backward = (
        grads
        + scale
        + max(
            product,
            logits + upcast,  # the upcast, later the gradient's downcast from it
            logits + scratch(tokens, block, h, False),  # the input's gradient: addmm_ of it by the block
            logits + scratch(block, tokens, h, True) * trains,  # the weight's: addmm_ of its transpose by x
        )
    )
    how = f"{block} of {v:,} vocabulary entries per block over {tokens:,} tokens (CPU ranks' plain PyTorch)"
    return (
        Term(forward, f"Cut Cross-Entropy: the target logits 4 B x b s + a block's logits and upcast, {how}"),
        Term(backward, f"Cut Cross-Entropy backward: {grads_what} + a block's steps, {how}"),
    )


def _fused(working_sets):
    """A fused loss's working sets (``working_sets(setup, cpu)``: forward, backward), its backward's or, if
    larger, the final norm's right after it: the loss's saved tensors freed (``fused_head``), the input's
    gradient the norm's incoming one (the weight's handed to the gradients), and the norm's own: a Hugging
    Face RMSNorm's ``RMSNORM_BACKWARD_FP32`` fp32 b s h at once, a LayerNorm's input gradient (one fused
    kernel, ``native_layer_norm_backward``). With the head frozen the RMSNorm's is the larger (measured: the
    shrunk Llama under LoRA at stage 3, tests/test_peak.py: Cut Cross-Entropy's backward +1.05 %, the
    chunked loss's +2.6 % without it)."""

    def sets(setup: Setup, cpu: CpuMatmul | None) -> tuple[Term, Term]:
        forward, backward = working_sets(setup, cpu)
        m, listing = setup.model, partition.listing(setup)
        saved = fused_head(setup, 0, listing is None or "lm_head" in listing.head).bytes
        norm = _norm_backward(setup, f"the final {final_norm(m)}'s backward after the loss's")
        norm = Term(norm.bytes - saved, f"{norm.formula}, less what the loss saved")
        return forward, max(backward, norm, key=lambda t: t.bytes)

    return sets


#: each fused loss's working sets, forward and backward (``kit.loss``)
FUSED = {"chunked": _fused(_chunk), "cce": _fused(cce_working_sets)}


#: an RMSNorm's backward in Hugging Face's fp32 upcast: five fp32 b s h temporaries at once (the upcast
#: gradient, its products with the rsqrt and with the input, the mean's and the square's gradients), measured
#: in the last block's input norm on CPU ranks
RMSNORM_BACKWARD_FP32 = 5


def _norm_backward(setup: Setup, what: str) -> Term:
    """A norm's backward working set in ``setup``'s family (``what`` it is): a Hugging Face RMSNorm's
    ``RMSNORM_BACKWARD_FP32`` fp32 b s h at once, a LayerNorm's input gradient (one fused kernel,
    ``native_layer_norm_backward``), and the incoming gradient."""
    p = element_bytes(setup.zero.precision)
    sbh = setup.batch.micro_batch * setup.rank_seq_len * setup.model.dims.hidden
    if setup.model.family in SWIGLU_FAMILIES:
        own, how = RMSNORM_BACKWARD_FP32 * FP32 * sbh, f"{RMSNORM_BACKWARD_FP32} x 4 B x b s h"
    else:
        own, how = p * sbh, f"its input's gradient {p} B x b s h"
    return Term(own + p * sbh, f"{what}: {how} and its incoming gradient {p} B x b s h")


class Late(NamedTuple):
    """The moments after a late first gradient hook (``_late_hook``): ``where`` it comes, what is live
    there and its working set, and what is live in the block below's backward."""

    where: str
    at_hook: Term
    hook_work: Term
    below: Term


def _late_hook(setup: Setup, act: Term, saved, p: int) -> Late | None:
    """A trainable subset whose head and last block's down projection train nothing has its first gradient
    hook, where stages 1-2 allocate their bucket, inside the last block. With LoRA on attention alone it
    comes in the attention, the block's MLP and attention saved tensors freed by then, and the moment that
    follows with the bucket is the backward of the last block's input norm (the activations less the
    head's and the last block's, what that norm keeps, and the norm's working set, ``_norm_backward``).
    With an adapter on a GPT-2 block's c_fc (and none on its c_proj) it comes in the MLP, at the adapter's
    B, after the GELU's backward: its input is freed, its input gradient and LoRA's scaled copy of it are
    live beside the residual's gradient (measured: c_fc alone, +4.4 % before, with the bucket counted from
    the down projection on). Then the backward of the block below (the activations less the head's and the
    last block's; a checkpointed last block leaves its recomputation to the block below). None when the
    bucket comes with the head's or the MLP's gradients, as without a subset."""
    z, listing = setup.zero, partition.listing(setup)
    if z.engine != "deepspeed" or z.stage not in (1, 2) or listing.head or not listing.blocks:
        return None
    mlp = (listing.blocks[-1].trains | listing.blocks[-1].adapted) & {"gate", "up", "down", "norm2"}
    m, b = setup.model, setup.batch
    gelu = m.family not in SWIGLU_FAMILIES and mlp == {"up"} and "up" in listing.blocks[-1].adapted
    if mlp and not gelu:
        return None
    sbh = b.micro_batch * setup.rank_seq_len * m.dims.hidden
    last = len(listing.blocks) - 1
    ckpt = z.activation_checkpointing and checkpointing.is_checkpointed(last, z.checkpoint_every)
    kept = kept_by_policy(setup).bytes if ckpt else 0  # the op policy's outputs, freed with the block
    blocks = act.bytes - saved.head
    done = "the head's and the last block's"
    below = Term(
        blocks - (p * sbh + kept if ckpt else saved.blocks[-1]) - _freed_by_recompute(setup, last - 1),
        f"{act.formula} - {done}",
    )
    if gelu:
        sbf = sbh // m.dims.hidden * m.dims.ffn
        return Late(
            "in the last block's MLP",
            Term(blocks - p * sbf, f"{act.formula} - the head's and the last block's GELU input"),
            Term(
                p * (2 * sbf + sbh),
                f"{p} B x (2 b s f + b s h): c_fc's incoming gradient and LoRA's scaled copy of it, and the "
                "residual's",
            ),
            below,
        )
    return Late(
        "at the last block's input norm",
        Term(
            blocks - (saved.recomputed + kept if ckpt else saved.blocks[-1]) + saved.last_norm,
            f"{act.formula} - {done} but its input norm's",
        ),
        _norm_backward(setup, "its input norm's backward"),
        below,
    )


def _attention_backward(setup: Setup, blocks: Term, p: int) -> tuple[Term, Term]:
    """The kit's GPT's last block at its softmax's backward (eager attention), every parameter training:
    what is live there (the activations less that block's MLP tensors, its second norm's input and the
    output projection's; under Ulysses also the exchanged v, freed by the second bmm's backward), and the
    working set: the softmax's incoming and input gradients (``eager_scores`` each) beside the residual's
    gradient and v's. Where the scores outweigh the MLP (long sequences; Ulysses keeps a rank's scores
    those of the whole sequence) the block's backward peaks here (measured, 2 ranks, 256 tokens, sp 2:
    3.1 % and 5.9 % checkpointed above the estimate before it was modelled)."""
    m = setup.model
    tokens = setup.batch.micro_batch * setup.rank_seq_len
    h, f = m.dims.hidden, m.dims.ffn
    exchanged_v = setup.zero.sequence_parallel_size > 1
    freed = p * tokens * ((3 + exchanged_v) * h + 2 * f)
    at = Term(
        blocks.bytes - freed,
        f"{blocks.formula} - the last block's MLP tensors and projection inputs"
        + (" and exchanged v" if exchanged_v else ""),
    )
    scores, _ = eager_scores(setup)
    work = Term(
        p * (2 * scores + 2 * tokens * h),
        f"{p} B x (2 a s^2 b + 2 b s h): the softmax's incoming and input gradients, the residual's and v's",
    )
    return at, work


def _freed_by_recompute(setup: Setup, block: int) -> int:
    """What block ``block``'s op-policy cache (``kit.checkpointing``) holds that its recomputation frees at
    the start of its backward: the kept outputs no autograd op saves (0 under full checkpointing, or where
    the block is not checkpointed)."""
    z = setup.zero
    if block < 0 or not (
        z.activation_checkpointing and checkpointing.is_checkpointed(block, z.checkpoint_every)
    ):
        return 0
    return kept_by_policy(setup).bytes - also_saved(setup)


def _dequantized(setup: Setup, n: int, cpu: CpuMatmul | None) -> Term:
    """With QLoRA, what bitsandbytes' ``MatMul4Bit`` backward holds while it computes the down projection's
    input gradient (modelled from its algorithm; measured on CPU through ``kit.workloads.nf4``): the
    ``n``-element weight dequantized to the compute dtype and the fp32 absmax per 64-block it is scaled by;
    on CPU ranks also the equivalent's scratch, ``DEQUANTIZE_SCRATCH`` B x ``DEQUANTIZE_CHUNK`` elements
    (its last chunk's, freed before the matmul). The SwiGLU product's backward comes after it, the weight
    freed."""
    if not setup.zero.qlora:
        return NONE
    p, blocks = element_bytes(setup.zero.precision), -(-n // subset.NF4_BLOCK)
    weight = Term(
        p * n + FP32 * blocks,
        f"{p} B x f h (the 4-bit down projection dequantized) + {FP32} B x f h / {subset.NF4_BLOCK} (its "
        "absmax)",
    )
    if cpu is None:
        return weight
    chunk = min(n, subset.DEQUANTIZE_CHUNK)
    return weight + Term(
        subset.DEQUANTIZE_SCRATCH * chunk,
        f"{subset.DEQUANTIZE_SCRATCH} B x {chunk:,} (kit.workloads.nf4's chunk: codes, indices, values)",
    )


def _block_forward(setup: Setup, cpu: CpuMatmul | None) -> Term:
    """A checkpointed block's forward working set (run without autograd, so every intermediate is freed
    once its consumer returns), besides its input, at the largest of its moments: GPT-2's (the kit's GPT,
    eager attention: at its second bmm, or in the MLP the attention residual, the norm's output held by the
    MLP's call, then the up-projection's output and its GELU, or the GELU's output and the
    down-projection's), or a Llama-style block's MLP (the norm's output, the SiLU of the gate, the
    up-projection's output and their product; SDPA's attention holds less). Measured op by op on the kit's
    GPT (tests/test_peak.py). On CPU ranks in bf16 each
    projection's ``mm`` also allocates oneDNN's scratch (``kit.estimate.cpu_matmul``: the kit's GPT's
    ``Conv1D`` multiplies x by its weight, ``nn.Linear`` x by its weight's transpose)."""
    m, p = setup.model, element_bytes(setup.zero.precision)
    tokens, h, f = setup.batch.micro_batch * setup.rank_seq_len, m.dims.hidden, m.dims.ffn
    sbh, sbf = p * tokens * h, p * tokens * f
    llama = m.family in SWIGLU_FAMILIES

    def scratch(inner: int, cols: int) -> int:
        if cpu is None or p != 2:
            return 0
        return bf16_mm_scratch(tokens, inner, cols, False, cpu, transposed_b=llama)

    if llama:  # at the product, then at down_proj (the product, its output and the mm's scratch)
        work = max(2 * sbh + 3 * sbf, 3 * sbh + sbf + scratch(f, h), 2 * sbh + 2 * sbf + scratch(h, f))
        what = "the norm's output, SiLU(gate), up and their product: 2 x b s h + 3 x b s f"
    else:  # at the GELU, then at the down-projection (c_fc's output freed once the GELU returns); before
        # them at attention's second bmm: the norm's output, c_attn's (3 b s h), the masked scores and their
        # softmax (a s^2 b each), v's and the product's b s h, and the causal mask (bool s^2)
        scores, mask = eager_scores(setup)
        attention = 6 * sbh + 2 * p * scores + mask
        mlp = max(2 * sbh + 2 * sbf, 3 * sbh + sbf + scratch(f, h), 2 * sbh + sbf + scratch(h, f))
        work = max(attention, mlp)
        what = (
            "attention's (6 x b s h + 2 x a s^2 b + the bool mask) or the MLP's (the attention residual, the "
            "norm's output, c_fc's output and its GELU: 2 x b s h + 2 x b s f)"
        )
    cpu_note = " (and oneDNN's bf16 mm scratch)" if cpu is not None and p == 2 else ""
    return Term(work, f"a checkpointed block's forward, no autograd: {what}, {p} B each{cpu_note}")


def _weight_grad_scratch(setup: Setup, cpu: CpuMatmul | None) -> Term:
    """On CPU in bf16, the scratch oneDNN allocates inside the down-projection's weight-gradient mm
    (``kit.estimate.cpu_matmul``): GPT-2's ``Conv1D`` computes x^T (f x b s) by the gradient (b s x h);
    ``nn.Linear`` (``mm_mat2_backward`` on the transposed weight) the gradient^T (h x b s) by x (b s x f)."""
    m, b = setup.model, setup.batch
    if cpu is None or setup.zero.precision != "bf16":
        return NONE
    tokens, f, h = b.micro_batch * setup.rank_seq_len, m.dims.ffn, m.dims.hidden
    rows, cols, how = (
        (f, h, "x^T (f x b s) by b s x h") if m.family == "gpt2" else (h, f, "g^T (h x b s) by b s x f")
    )
    n = bf16_mm_scratch(rows, tokens, cols, True, cpu)
    if not n:
        return NONE
    source = f"{cpu.isa}, {cpu.threads} thread(s)"
    if not cpu.modelled:
        source += ", measured: a lone mm of that shape"
    return Term(n, f"oneDNN's scratch in the weight gradient's bf16 mm, {how} ({source})")
