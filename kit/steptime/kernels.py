"""One micro-step's forward and backward on a GPU, from the model's shapes: what the device computes and
moves, and what the host launches (``work``), and their seconds on a GPU type (``block_seconds``).

Device, per transformer block and for the head (embedding, final norm, LM head and loss):
- each matmul (the block's linears; eager attention's two batched matmuls; the LM head) in its forward,
  its input gradient and its weight gradient, on a roofline: its FLOPs at the GPU's peak x ``efficiency``
  (cuBLAS on a large GEMM) stretched by wave quantization (output tiles of ``TILE`` x ``TILE`` spread over
  the GPU's SMs: a last, partly filled wave costs a whole one), or its operands' and result's bytes at the
  memory bandwidth, whichever is longer;
- attention by its implementation (``attention``): SDPA's flash kernels compute only the causal half of
  the scores, the backward recomputing them (2.5 x the forward's FLOPs, FlashAttention-2's five matmuls
  against two), at ``FLASH_EFFICIENCY`` of peak; eager attention multiplies the full s x s scores and
  moves them through memory ``EAGER_PASSES`` times (scale, mask, softmax, their backward);
- elementwise ops (norms, residual adds, the activation, rotary) move their tensors through memory
  (``ELEMENTWISE``, element passes per token), the loss its logits (``LOSS_BYTES_PER_LOGIT``: the plain
  loss's fp32 ones, a fused loss's chunks or none); Cut Cross-Entropy computes the head's logits again in
  its backward (a fourth head matmul);
- activation checkpointing runs each block's forward again in backward.
Host: eager PyTorch launches every op from the CPU (``OPS_PER_BLOCK``, counted by dispatching Hugging
Face's blocks, x ``HOST_US_PER_OP``) and ZeRO's hooks do Python bookkeeping per parameter tensor
(``HOOK_EVENTS`` x ``HOOK_US``, at stage 3 ``STAGE3_HOOK_US``); an optimizer step launches its ops
per tensor (``STEP_OPS_PER_TENSOR``, ``step_host``). The GPU runs ahead of the host's queue, so a block
takes the longer of its host and device times. A model without a transformer's shapes is one matmul
of all its FLOPs.

What it cannot see: kernel fusion by torch.compile or hand-written fused kernels (fewer passes and
launches), cuBLAS heuristics per shape, clocks under a power limit, flash attention on GPUs it does not
support (Volta: eager or memory-efficient SDPA), mixture-of-experts routing, and host threads other than
the training loop (data loading).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Any

from kit import models
from kit.estimate import partition
from kit.estimate.activations import SWIGLU_FAMILIES, projection_flops, recomputed, recomputed_share
from kit.loss import NAMES
from kit.rules import Offload, element_bytes
from kit.schema import ModelSpec, Setup

#: output tile of a tensor-core GEMM (cuBLAS's common 128 x 128 CTA tile): the unit of wave quantization
TILE = 128
#: achieved / peak FLOP/s of FlashAttention-2's kernels (Dao 2023: 50-73 % of an A100's peak forward,
#: 35-63 % backward; causal masks sit at the low end)
FLASH_EFFICIENCY = 0.45
#: memory passes over eager attention's a x s x s scores per micro-step: forward writes the product,
#: scales, masks and softmaxes it (read + write each: 7), backward reads and writes it through softmax's,
#: the mask's and the scale's gradients (9)
EAGER_PASSES = {"forward": 7, "backward": 9}
#: forward element passes per token of a block's elementwise ops (reads + writes, in units of h, kv or f
#: elements); backward moves twice as many. GPT-2: two LayerNorms (4h), two residual adds (6h), GELU
#: (2f). Llama-style: two RMSNorms computed in fp32 (8h), two residual adds (6h), rotary on q and k
#: (6h + 6kv), SiLU and the gate product (5f)
ELEMENTWISE = {
    "gpt2": {"h": 10, "kv": 0, "f": 2},
    "swiglu": {"h": 20, "kv": 6, "f": 5},
}
#: bytes moved per logit by each loss (``kit.loss``). The plain one: the 16-bit logits upcast to fp32
#: (2 + 4), log-softmax (4 + 4 + 4), its gradient (4 + 4) and the downcast (4 + 2), plus the head's gradient
#: read (2). The chunked loss: a chunk's 16-bit logits written by their matmul, read and overwritten by their
#: gradient in Liger's cross-entropy kernel (2 + 2 + 2). Cut Cross-Entropy: none (its tiles stay on chip)
LOSS_BYTES_PER_LOGIT = {"plain": 38, "chunked": 6, "cce": 0}
#: bytes per element a 4-bit NF4 weight's dequantization reads: its packed codes (half a byte), the
#: double-quantized absmax (a byte per 64 elements) ignored
NF4_READ = 0.5
#: aten ops one block dispatches, forward and backward, counted with a TorchDispatchMode on Hugging
#: Face's GPT2Block and LlamaDecoderLayer (transformers 5, tests/test_kernels.py recounts them), and the
#: ops outside the blocks (embedding, final norm, head, loss)
OPS_PER_BLOCK = {"gpt2": (75, 98), "swiglu": (77, 142)}
OPS_OUTSIDE = {"gpt2": (25, 23), "swiglu": (31, 34)}
#: host microseconds per dispatched op on a GPU: an eager op issued from Python costs 5.6 us on this
#: machine's CPU (a 4-element add, dispatch and Python, measured), and ``cudaLaunchKernel`` adds its own
#: host-side cost, a few microseconds (about 4; views launch nothing but are counted alike). Checked, not
#: fitted: on one H200 (data/reference) the kit's runs at stages 0-2 came out 10-26 % slower than this
#: predicts, the published throughput rows a median 21 % (``zerokit published``)
HOST_US_PER_OP = 10.0
#: host microseconds of ZeRO's Python bookkeeping per parameter tensor and hook event: measured here by
#: ``zerokit calibrate --measure`` (DeepSpeed 0.19.8, 2 gloo ranks, gloo's call latency already taken out):
#: 299 us per tensor per micro-step at stage 2 (2 events) and 622 us at stage 3 (5 events), of which the
#: ranks kept a core busy 61 % and 66 % of the time: 91 and 82 us of CPU work per event
HOOK_US = 85.0
#: the same at stage 3 on a GPU host, where each event also launches NCCL's gathers and DeepSpeed's stream
#: and event bookkeeping (``partitioned_param_coordinator.py``), which gloo's CPU ranks do not: measured on
#: the kit's own stage-3 runs on one H200 (data/reference: the step beyond the model without these hooks,
#: over tensors x 5 events: 204 us for GPT-2 XL, 253 us for Qwen2.5-0.5B), their mean; a host's CPU moves it
STAGE3_HOOK_US = 230.0
#: hook events per parameter tensor per micro-step: stage 1 a gradient hook (accumulate in place), stage 2
#: the hook and the copy into the contiguous bucket, whose partitions it copies out once reduced;
#: stage 3 a fetch and a release in forward and in backward and a gradient hook; FSDP a copy-in and a
#: copy-out per unit's parameter; DDP's and DeepSpeed stage 0's hooks run in C++ or not per tensor
HOOK_EVENTS: dict[str, int | dict[int, int]] = {"deepspeed": {0: 0, 1: 1, 2: 2, 3: 5}, "fsdp": 2, "ddp": 0}
#: ops an optimizer step dispatches per parameter tensor, with optimizer offload its gradients' copies to
#: the host in backward too, by (stage, offloaded): counted with a TorchDispatchMode over whole steps of
#: DeepSpeed 0.19.8 engines (torch AdamW, foreach as on CUDA; ``tests/test_kernels.py`` recounts them).
#: Stage 0 (``FP16_UnfusedOptimizer``: a client or ``torch_adam`` optimizer) checks every gradient for
#: inf / nan with two ``.item()`` syncs, unscales, clips and copies it; stages 1-2 norm and check every
#: gradient of the partition; stage 3 steps flat sub groups; offload copies each gradient out. PyTorch's
#: DDP and FSDP step foreach: about one op per tensor
STEP_OPS_PER_TENSOR: dict[str, int | dict[tuple[int, bool], int]] = {
    "deepspeed": {(0, False): 35, (1, False): 22, (2, False): 22, (3, False): 10, (1, True): 24,
                  (2, True): 24, (3, True): 19},
    "fsdp": 2,
    "ddp": 2,
}  # fmt: skip


def attention(model: ModelSpec) -> str:
    """The attention implementation the kit takes for a model: ``eager`` for GPT-2-style models (the
    activations' formula keeps their s x s scores, as Megatron's and older Hugging Face GPT-2 do), else
    ``sdpa`` (PyTorch's flash / memory-efficient kernels, Hugging Face's default)."""
    return "eager" if (model.family or "gpt2") in ("gpt2", "gpt_neox", "dit") else "sdpa"


def _style(model: ModelSpec) -> str:
    """``swiglu`` (RMSNorm, rotary, gated MLP: Llama, Mistral, Qwen2) or ``gpt2`` (LayerNorm, GELU MLP)."""
    return "swiglu" if model.family in SWIGLU_FAMILIES else "gpt2"


@dataclass(frozen=True)
class Work:
    """What one micro-step asks of one GPU, whatever its type: per block (``layers`` of them) and for the
    rest of the model, the matmuls' FLOPs, bytes and output tiles (``*_gemm_*``, one entry per matmul,
    ``GEMMS`` of them, zero-padded), flash attention's FLOPs, the bytes of memory-bound ops, and the host's
    seconds. ``formula`` says how each was counted."""

    layers: int
    block_gemm_flops: tuple[float, ...]
    block_gemm_bytes: tuple[float, ...]
    block_gemm_tiles: tuple[float, ...]
    block_flash_flops: float
    block_memory_bytes: float
    block_host_s: float
    rest_gemm_flops: tuple[float, ...]
    rest_gemm_bytes: tuple[float, ...]
    rest_gemm_tiles: tuple[float, ...]
    rest_memory_bytes: float
    rest_host_s: float
    formula: str

    @staticmethod
    def arrays(works: list[Work]) -> Work:
        """One Work whose numbers are numpy arrays with a setup axis first (``perf.Load.arrays``)."""
        import numpy as np

        out: dict[str, Any] = {}  # arrays where the fields say float: the vectorised twin of a Work
        for f in fields(Work):
            values = [getattr(w, f.name) for w in works]
            out[f.name] = "" if f.name == "formula" else np.array(values, dtype=float)[:, None]
        return Work(**out)

    @property
    def flops(self) -> float:
        """FLOPs of the micro-step (matmuls and flash attention)."""
        return self.layers * (sum(self.block_gemm_flops) + self.block_flash_flops) + sum(self.rest_gemm_flops)


#: matmul entries per block (4 linears + 2 eager attention matmuls, each forward, input and weight
#: gradient, and a recomputed forward) and outside the blocks (the head: 3 passes, Cut Cross-Entropy's
#: recomputed logits a fourth)
GEMMS = 24
REST_GEMMS = 4


def _gemm(m: int, n: int, k: int, p: int, batch: int = 1) -> tuple[float, float, float]:
    """(FLOPs, bytes, output tiles) of ``batch`` products of (m x k) by (k x n) in ``p``-byte elements."""
    tiles = batch * -(-m // TILE) * -(-n // TILE)
    return 2.0 * m * n * k * batch, float(p * batch * (m * k + k * n + m * n)), float(tiles)


def _train(
    m: int, n: int, k: int, p: int, batch: int = 1, again: float = 0.0, grad: float = 1.0
) -> list[tuple[float, ...]]:
    """A linear's forward (m x k by k x n), input gradient and weight gradient (the share ``grad`` of it
    whose weights train), and the share ``again`` of its forward that checkpointing recomputes."""
    forward = _gemm(m, n, k, p, batch)
    weight = tuple(grad * x for x in _gemm(k, n, m, p, batch))
    out: list[tuple[float, ...]] = [forward, _gemm(m, k, n, p, batch), weight]
    return out + ([tuple(again * x for x in forward)] if again else [])


def _pad(entries: list[tuple[float, ...]], size: int) -> tuple[tuple[float, ...], ...]:
    entries = entries + [(0.0, 0.0, 0.0)] * (size - len(entries))
    return tuple(tuple(e[i] for e in entries) for i in range(3))


def work(setup: Setup) -> Work:
    """``Work`` of one micro-step of ``setup`` (see the module's docstring)."""
    m, b, z = setup.model, setup.batch, setup.zero
    return _work(
        m, b.micro_batch, b.seq_len, z.precision, _again(setup), z.engine, z.stage, _grads(setup),
        z.sequence_parallel_size, z.loss, z.qlora, _dropped(setup),
    )  # fmt: skip


def _dropped(setup: Setup) -> float:
    """Elements per token and block that LoRA's dropout drops (each adapted projection's input width, peft's
    dropout before its A); 0 without it."""
    z = setup.zero
    listing = partition.listing(setup) if z.lora_dropout else None
    if listing is None or not listing.blocks:
        return 0.0
    h, f = setup.model.dims.hidden, setup.model.dims.ffn
    width = {"q": h, "k": h, "v": h, "o": h, "gate": h, "up": h, "down": f}
    return sum(width.get(n, 0) for block in listing.blocks for n in block.adapted) / len(listing.blocks)


#: the four linears a block's work groups, by the parts of ``kit.workloads.adapters.Block``
GROUPS = (("q", "k", "v"), ("o",), ("gate", "up"), ("down",))


def _grads(setup: Setup) -> tuple[float, ...]:
    """Shares of the four linears' weight gradients computed (FLOP-weighted over the blocks: a frozen
    weight has none) and of the head's (1 or 0): all 1 without a trainable subset. LoRA's adapter
    matmuls (r / h of each adapted linear's) are left out."""
    listing = partition.listing(setup)
    if listing is None:
        return (1.0,) * 5
    if not any(block.trains or block.adapted for block in listing.blocks):  # traced: parts not named
        return (listing.trainable / listing.total,) * 4 + (1.0 if "lm_head" in listing.head else 0.0,)
    flops = projection_flops(setup.model)
    shares = []
    for names in GROUPS:
        total = sum(flops[n] for n in names) * len(listing.blocks)
        trained = sum(flops[n] for block in listing.blocks for n in names if n in block.trains)
        shares.append(trained / total if total else 0.0)
    return (*shares, 1.0 if "lm_head" in listing.head else 0.0)


def _again(setup: Setup) -> tuple[float, ...]:
    """Shares recomputed (``activations.recomputed_share``) of the four linears this model groups (q k v, o,
    the MLP's input projections, its output one), of the attention kernel and of the rest."""
    r = recomputed(setup)
    if not r.any:
        return (0.0,) * 6
    return (*(recomputed_share(setup, names) for names in GROUPS), r.attention, r.rest)


@lru_cache(maxsize=4096)
def _work(
    m: ModelSpec,
    micro: int,
    seq: int,
    precision: str,
    again: tuple[float, ...],
    engine: str,
    stage: int,
    grads: tuple[float, ...] = (1.0,) * 5,
    sp: int = 1,
    loss: str = "plain",
    qlora: bool = False,
    dropped: float = 0.0,
) -> Work:
    """``sp`` > 1: Ulysses (``kit.sequence_parallel``): a rank runs every layer but attention on its
    ``seq / sp`` tokens, attention on the whole sequence with ``heads / sp`` heads. ``loss``: the head's
    loss (``kit.loss``). ``qlora``: each block linear's 4-bit weight dequantized to 16 bits before each
    of its matmuls (bitsandbytes' ``MatMul4Bit``: forward, input gradient, recomputed forward), reading
    ``NF4_READ`` and writing ``p`` bytes per element, one more kernel each. ``dropped``: LoRA dropout's
    elements per token and block (read, written and a bool mask, forward; read and written, backward)."""
    p = element_bytes(precision)
    tokens = micro * seq // sp
    events = HOOK_EVENTS[engine]
    events = events[stage] if isinstance(events, dict) else events
    per_event = STAGE3_HOOK_US if (engine, stage) == ("deepspeed", 3) else HOOK_US
    hooks = _tensors(m) * events * per_event * 1e-6
    if not m.is_transformer:
        rest = again[-1]
        f = 6.0 * m.params * tokens * (1 + rest / 3)
        zeros = (0.0,) * GEMMS
        flops, nbytes, tiles = _pad([(f, 0.0, 0.0)], REST_GEMMS)
        again_text = f" x (1 + {rest:.2g}/3) (recomputed forward)" if rest else ""
        return Work(
            0, zeros, zeros, zeros, 0.0, 0.0, 0.0, flops, nbytes, tiles, 0.0, hooks,
            f"6 P x {tokens:,} tokens{again_text}, one matmul",
        )  # fmt: skip
    dims = m.dims
    h, a, layers = dims.hidden, dims.heads, dims.layers
    kv = dims.kv_heads * (h // a)
    style = _style(m)
    gated = style == "swiglu"
    f = dims.ffn
    eager = attention(m) == "eager"
    block = []
    linears = ((h + 2 * kv, h), (h, h), ((2 if gated else 1) * f, h), (h, f))
    for (n_out, k_in), share, grad in zip(linears, again, grads, strict=False):
        block += _train(tokens, n_out, k_in, p, again=share, grad=grad)
    forward = 1 + again[4]  # forward passes of the block's attention
    elementwise = 1 + again[5]  # of its norms, activations and rotary
    d = h // a
    flash = 0.0
    memory = 0.0
    if eager:  # scores q k^T (s x d by d x s) and scores x v (s x s by s x d), per sequence and head
        mine = a // sp  # under Ulysses a rank's share of the heads, over the whole sequence
        block += _train(seq, seq, d, p, batch=micro * mine, again=again[4])
        block += _train(seq, d, seq, p, batch=micro * mine, again=again[4])
        score_passes = EAGER_PASSES["forward"] * forward + EAGER_PASSES["backward"]
        memory += score_passes * p * micro * mine * seq * seq
        split = f" ({sp} ranks: a/{sp} heads each)" if sp > 1 else ""
        how_attention = f"eager scores: 4 matmuls x 3 passes, {score_passes:g} passes over a s^2 b{split}"
    else:
        flash = 0.5 * 4.0 * micro * seq * seq * h / sp * (forward + 2.5)
        heads = f"h/{sp}" if sp > 1 else "h"
        how_attention = f"flash: causal half of 4 b s^2 {heads} x ({forward:g} forward + 2.5 backward)"
    passes = ELEMENTWISE[style]
    per_token = passes["h"] * h + passes["kv"] * kv + passes["f"] * f
    memory += per_token * tokens * p * (elementwise + 2)
    ops_forward, ops_backward = OPS_PER_BLOCK[style]
    extra_ops, extra = 0.0, ""
    if qlora:  # every block linear's weight dequantized before each of its matmuls
        uses = [2 + share for share in again[:4]]
        weights = [n_out * k_in for n_out, k_in in linears]
        memory += sum((NF4_READ + p) * n * u for n, u in zip(weights, uses, strict=True))
        extra_ops += len(GROUPS) * sum(uses) / len(uses)
        extra += ", 4-bit weights dequantized before each matmul"
    if dropped:  # LoRA's dropout: forward reads, writes and masks; backward reads and writes
        memory += dropped * tokens * ((2 * p + 1) * elementwise + 2 * p)
        extra += f", LoRA dropout over {dropped:g} elements per token"
    ops = ops_forward * elementwise + ops_backward + extra_ops
    block_host = ops * HOST_US_PER_OP * 1e-6 + hooks / layers
    recompute = 1.0 if loss == "cce" else 0.0  # CCE's backward computes the logits again
    head = _train(tokens, m.vocab or 1, h, p, again=recompute, grad=grads[4]) if m.vocab else []
    rest_ops = sum(OPS_OUTSIDE[style])
    flops, nbytes, tiles = _pad(block, GEMMS)
    rest_flops, rest_bytes, rest_tiles = _pad(head, REST_GEMMS)
    formula = (
        f"{layers} blocks x max(device: 4 linears x {2 + sum(grads[:4]) / 4 + sum(again[:4]) / 4:.3g} "
        "matmuls on a roofline at "
        f"s b = {tokens:,}, {how_attention}, {sum(passes.values())} elementwise passes{extra}; host: "
        f"{ops:.3g} ops x {HOST_US_PER_OP:g} us"
        + (f" + hooks {events} x {per_event:g} us per tensor" if events else "")
        + f") + head and {NAMES.get(loss, 'loss')} ({LOSS_BYTES_PER_LOGIT[loss]} B per logit"
        + (", the logits computed again in backward)" if recompute else ")")
    )
    return Work(
        layers, flops, nbytes, tiles, flash, float(memory), block_host, rest_flops, rest_bytes, rest_tiles,
        float(LOSS_BYTES_PER_LOGIT[loss] * tokens * dims.vocab), rest_ops * HOST_US_PER_OP * 1e-6,
        formula,
    )  # fmt: skip


def step_host(setup: Setup) -> tuple[float, str]:
    """Host seconds of one optimizer step's per-tensor ops (``STEP_OPS_PER_TENSOR``) and its formula."""
    z = setup.zero
    ops = STEP_OPS_PER_TENSOR[z.engine]
    if isinstance(ops, dict):
        ops = ops[(z.stage, z.offload_optimizer is not Offload.NONE)]
    listing = partition.listing(setup)  # a trainable subset steps its trainable tensors only
    tensors = sum(t for _, t in listing.tensors) if listing else _tensors(setup.model)
    seconds = tensors * ops * HOST_US_PER_OP * 1e-6
    return seconds, f"host: {tensors:,} tensors x {ops} ops x {HOST_US_PER_OP:g} us"


def _tensors(m: ModelSpec) -> int:
    """Parameter tensors of a model (the count ZeRO's hooks run over): ``models.spec_tensors``'s, or for
    a bare parameter count, per block a linear's weight and bias (2 per layer, 2 without layers)."""
    numels = models.spec_tensors(m)
    return len(numels) if numels is not None else 2 * (m.layers or 1)


def block_seconds(work: Work, peak_tflops, memory_gbps, sms, efficiency: float):
    """Seconds of one micro-step on a GPU (peak TFLOP/s at the precision, memory GB/s, SMs): each block
    the longer of its host and device times, then the rest of the model the same; floats, or arrays of
    (setup, GPU type) for ``Work.arrays`` on arrays of GPU figures."""
    import numpy as np

    peak = np.asarray(peak_tflops, dtype=float)[..., None] * 1e12
    bandwidth = np.asarray(memory_gbps, dtype=float) * 1e9
    slots = np.asarray(sms, dtype=float)[..., None]

    def matmuls(flops, nbytes, tiles):
        flops, nbytes, tiles = (np.asarray(x, dtype=float) for x in (flops, nbytes, tiles))
        counted = (tiles > 0) & (slots > 0)  # a machine of unknown SMs (a CPU) has no waves
        waves = np.ceil(tiles / np.where(slots > 0, slots, 1))
        filled = np.where(counted, tiles / np.maximum(waves * slots, 1), 1.0)
        compute = flops / (peak * efficiency * filled)
        return np.maximum(compute, nbytes / bandwidth[..., None]).sum(-1)

    flash = np.asarray(work.block_flash_flops) / (peak[..., 0] * FLASH_EFFICIENCY)
    block = matmuls(work.block_gemm_flops, work.block_gemm_bytes, work.block_gemm_tiles)
    block = block + flash + np.asarray(work.block_memory_bytes) / bandwidth
    rest = matmuls(work.rest_gemm_flops, work.rest_gemm_bytes, work.rest_gemm_tiles)
    rest = rest + np.asarray(work.rest_memory_bytes) / bandwidth
    total = work.layers * np.maximum(block, work.block_host_s) + np.maximum(rest, work.rest_host_s)
    return float(total) if np.ndim(total) == 0 else total
