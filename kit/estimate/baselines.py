"""Model states of PyTorch's own data-parallel engines, estimated like for like with ZeRO.

Read from torch 2.13 and checked byte for byte against live runs (``kit.ranks.baselines`` measures the
same tensors):
- **DDP** (``DistributedDataParallel``, ``gradient_as_bucket_view=False``, the default) keeps the fp32
  parameters, their fp32 ``.grad`` and the optimizer states whole on every rank, plus the reducer's
  gradient buckets: every gradient is copied into a flat bucket of at most ``bucket_cap_mb`` before it
  is all-reduced, so the buckets hold ``4 B x Psi`` more. bf16 runs under ``torch.autocast``: the
  states stay fp32.
- **FSDP2** (``fully_shard`` on each block and on the root) shards every parameter along its first
  dimension: a rank holds ``ceil(d0 / N)`` rows of each (the last ranks' shards are padded to it), in
  fp32 (``MixedPrecisionPolicy(param_dtype=bf16)`` casts only what it all-gathers). After backward the
  gradients are the reduce-scatter's padded fp32 output (as many bytes as the shards), and AdamW's
  states follow the unpadded shard of each rank, so rank 0 holds the most.

What it cannot see: FSDP2's gathers beyond the largest unit and the one prefetched after it (a unit's
size comes from the shape fields: a block is assumed to be (Psi - embeddings) / layers), DDP's and
FSDP's communication staging buffers, ``torch.autocast``'s cached bf16 weight copies, the caching
allocator's fragmentation, NCCL's buffers, DDP with ``gradient_as_bucket_view=True`` or another
``bucket_cap_mb``, FSDP2 with another mixed precision policy or CPU offload, and torch versions other
than the one the tensors were read from.
"""

from __future__ import annotations

import math
from functools import lru_cache

from kit.components import HELD, Component
from kit.estimate.result import NONE, Term
from kit.models import spec_shapes
from kit.rules import DDP_BUCKET_CAP_MB, FP32, baseline_name, element_bytes, optimizer_states, ring_share
from kit.schema import ModelSpec, Setup


def states(setup: Setup, rank: int) -> dict[str, dict[str, Term]]:
    """``{"device": {component: Term}, "host": {...}}`` for rank ``rank`` of a DDP or FSDP Setup."""
    z, psi = setup.zero, setup.model.params
    k = optimizer_states(z.optimizer, z.momentum)
    device: dict[str, Term] = dict.fromkeys(HELD, NONE)
    host: dict[str, Term] = dict.fromkeys(HELD, NONE)
    opt = f"{k} fp32 optimizer states" if k else "no optimizer state"
    if z.engine == "ddp":
        device[Component.PARAMETERS] = Term(
            FP32 * psi, f"4 B x Psi = 4 x {psi:,} (fp32 parameters on every rank)"
        )
        device[Component.GRADIENTS] = Term(FP32 * psi, "4 B x Psi (fp32 .grad, all-reduced at the boundary)")
        device[Component.OPTIMIZER_STATES] = Term(FP32 * k * psi, f"{4 * k} B x Psi ({opt})")
        device[Component.BUFFERS] = Term(
            FP32 * psi,
            f"4 B x Psi (reducer buckets of <= {DDP_BUCKET_CAP_MB} MiB: a flat copy of every gradient)",
        )
        return {"device": device, "host": host}
    padded, local, how = shard_elements(setup, rank)
    device[Component.PARAMETERS] = Term(FP32 * padded, f"4 B x {padded:,} (fp32 shards: {how})")
    device[Component.GRADIENTS] = Term(
        FP32 * padded, f"4 B x {padded:,} (fp32 reduce-scatter output, padded shards)"
    )
    device[Component.OPTIMIZER_STATES] = Term(
        FP32 * k * local, f"{4 * k} B x {local:,} ({opt} of rank {rank}'s unpadded shard)"
    )
    return {"device": device, "host": host}


def shard_elements(setup: Setup, rank: int) -> tuple[int, int, str]:
    """``(padded, local, formula)``: the elements of rank ``rank``'s FSDP shards, padded (what its
    parameter and gradient storages hold) and unpadded (what its optimizer states follow)."""
    return _shard_elements(setup.model, setup.zero_dp, rank)


@lru_cache(maxsize=512)
def _shard_elements(model: ModelSpec, n: int, rank: int) -> tuple[int, int, str]:
    shapes = spec_shapes(model)
    if shapes is None:  # a bare count: no shapes, shard the whole count
        padded = -(-model.params // n)
        local = max(0, min(padded, model.params - rank * padded))
        return padded, local, f"ceil(Psi / N) = {padded:,} (bare count: per-tensor padding approximated)"
    padded = sum(chunk for chunk, _ in _shards(shapes, n, rank))
    local = sum(local for _, local in _shards(shapes, n, rank))
    return padded, local, f"sum over tensors of ceil(d0 / N) x d1..., N = {n}"


def local_shards(setup: Setup, rank: int) -> tuple[int, ...]:
    """Elements of each tensor's unpadded shard on rank ``rank`` (what its optimizer steps)."""
    shapes = spec_shapes(setup.model)
    if shapes is None:
        return (_shard_elements(setup.model, setup.zero_dp, rank)[1],)
    return tuple(local for _, local in _shards(shapes, setup.zero_dp, rank))


@lru_cache(maxsize=512)
def _shards(shapes, n: int, rank: int) -> tuple[tuple[int, int], ...]:
    """Per tensor, (padded, local) elements of rank ``rank``'s shard along the first dimension."""
    out = []
    for shape in shapes:
        rows, rest = (shape[0], math.prod(shape[1:])) if shape else (1, 1)
        chunk = -(-rows // n)
        out.append((chunk * rest, max(0, min(chunk, rows - rank * chunk)) * rest))
    return tuple(out)


def transient(setup: Setup) -> dict[str, Term]:
    """What FSDP gathers during forward and backward (DDP holds no more than its resident states)."""
    z = setup.zero
    if z.engine != "fsdp":
        return {}
    p, psi = element_bytes(z.precision), setup.model.params
    unit, how = largest_unit(setup)
    if baseline_name(z.engine, z.stage) == "fsdp-grad-op":
        gathered = Term(
            p * psi + p * unit,
            f"{p} B x Psi (every unit stays gathered from forward to backward) + {p} B x {unit:,} "
            f"(the largest unit's gradient before reduce-scatter; {how})",
        )
    else:
        gathered = Term(
            3 * p * unit,
            f"{p} B x 2 x {unit:,} (the largest unit gathered, and the next one prefetched) + {p} B x "
            f"{unit:,} (its gradient before reduce-scatter; {how})",
        )
    return {"buffers": gathered}


def largest_unit(setup: Setup) -> tuple[int, str]:
    """Parameters of the largest unit ``fully_shard`` gathers at once: a block, or the root's own (the
    embeddings and head). From the shape fields; a model without them is one unit."""
    units = _units(setup)
    if units is None:
        return setup.model.params, "one unit: the whole model"
    block, embeddings = units
    return max(block, embeddings), f"unit = max(block ~ {block:,}, root's embeddings {embeddings:,})"


def unsharded_at_loss(setup: Setup, backward: bool = False) -> Term:
    """What FSDP2 holds gathered at the loss, in the all-gather dtype: the root's parameters (the root
    is not resharded after forward; its blocks are), or with ``fsdp-grad-op``
    (``reshard_after_forward=False``) every unit's. In the forward, beside them, the flat all-gather
    output of the last unit gathered, which ``FSDPParamGroup.wait_for_unshard`` keeps in
    ``comm_ctx.all_gather_state`` until the next forward unshard (a block); in the loss's ``backward``
    that is gone, and ``fsdp`` holds instead the last block, gathered again by the root's backward
    prefetch."""
    z = setup.zero
    if z.engine != "fsdp":
        return NONE
    p = element_bytes(z.precision)
    units = _units(setup)
    block, root = (setup.model.params, setup.model.params) if units is None else units
    grad_op = baseline_name(z.engine, z.stage) == "fsdp-grad-op"
    if grad_op:
        n = setup.zero_dp * shard_elements(setup, 0)[0]
        held = Term(p * n, f"{p} B x {n:,} (every unit unsharded: reshard_after_forward=False)")
    else:
        held = Term(
            p * root, f"{p} B x {root:,} (the root's embeddings, unsharded: the root is not resharded)"
        )
    if backward and grad_op:
        return held
    what = "the last block, prefetched for backward" if backward else "the last block's all-gather output"
    return held + Term(p * block, f"{p} B x {block:,} ({what})")


def _units(setup: Setup) -> tuple[int, int] | None:
    """(a block's parameters, the root's embeddings), from the shape fields; None without them."""
    m = setup.model
    if not (m.is_transformer and m.vocab):
        return None
    layers, hidden, vocab = m.dims.layers, m.dims.hidden, m.dims.vocab
    embeddings = vocab * hidden * (1 if m.tied_embeddings else 2)
    if m.family == "gpt2" and m.max_seq_len:
        embeddings += m.max_seq_len * hidden
    return max(0, m.params - embeddings) // layers, embeddings


def notes(setup: Setup) -> tuple[str, ...]:
    """What the baselines' estimate leaves out (none for a DeepSpeed Setup)."""
    z = setup.zero
    if z.engine == "ddp" and z.precision == "bf16":
        return (
            "ddp bf16 runs under torch.autocast: it also saves the bf16 copies of the weights each matmul "
            "casts and keeps norms in fp32, not in the activations formula (measured 1.38x it, toy GPT)",
        )
    return ()


def comm(setup: Setup) -> tuple[float, str, int]:
    """``(bytes, formula, M)``: bytes one rank sends per step in ring collectives over N ranks, M the
    model's bytes on the wire (DDP's fp32 gradients; FSDP's ``param_dtype``), k micro-steps. DDP
    all-reduces the gradients at the boundary (``no_sync`` before it); FSDP all-gathers in forward and
    again in backward and reduce-scatters every micro-step; ``fsdp-grad-op`` skips the backward all-gather."""
    z, n, k = setup.zero, setup.zero_dp, setup.batch.grad_accum
    name = baseline_name(z.engine, z.stage)
    ring = ring_share(n)
    if name == "ddp":
        m = FP32 * setup.model.params
        return 2 * ring * m, "2 (N-1)/N M (DDP fp32 gradient all-reduce at the boundary)", m
    m = element_bytes(z.precision) * setup.model.params
    gathers = 1 if name == "fsdp-grad-op" else 2
    what = "forward" if gathers == 1 else "forward + backward"
    formula = f"{gathers + 1} (N-1)/N M x k={k} ({name}: all-gather {what}, reduce-scatter, per micro-step)"
    return (gathers + 1) * k * ring * m, formula, m
