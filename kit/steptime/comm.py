"""What ZeRO sends per optimizer step: bytes one GPU puts on the wire (``comm_bytes``), stage 3's
collectives split by scope inside and across nodes, ZeRO++ included (``collectives``, ``comm_by_scope``),
and the collective calls behind them (``collective_calls``), each with its formula. ``kit.steptime.perf``
turns them into seconds.

What it cannot see: collectives DeepSpeed issues outside these code paths (loss scaling's overflow check,
a user's own all-reduce), parameters ``max_reuse_distance`` keeps gathered between forward and backward,
the padding of each gathered tensor to a multiple of N elements (at most N-1 per tensor), qwZ's and qgZ's
quantization scales, and how a library splits a collective into chunks on the wire.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kit import sequence_parallel as ulysses
from kit import trainable as subset
from kit.estimate import baselines, partition
from kit.rules import (
    DDP_BUCKET_CAP_MB,
    QUANTIZED_GRADIENT_BYTES,
    QUANTIZED_WEIGHT_BYTES,
    ZERO3_COLLECTIVES,
    element_bytes,
    hpz_from_secondary,
    ring_share,
)
from kit.schema import Setup

#: the ending of a collective's name that each GPU sends over its own NIC, not in a ring: qgZ's second
#: hop, an all-to-all between the same local rank of every node (``kit.steptime.perf`` times it so)
RAIL = "(qgZ hop 2)"
#: the ending of the forward all-gather of a subset's frozen tensors from hpZ's secondary partition
FROZEN = "(frozen, hpZ secondary)"
#: a tied embedding's second gather in each pass (``tied_regathered``)
TIED = "tied embedding re-gather"


def comm_bytes(setup: Setup, parts: list[Collective] | None = None) -> tuple[int, str]:
    """Bytes one GPU sends per optimizer step, as DeepSpeed's ZeRO moves them (ring collectives).

    M = 16-bit (or fp32) model bytes, N = data-parallel ranks, k = micro-steps per step. Stage 0
    all-reduces gradients at the boundary (2 (N-1)/N M); stages 1-2 all-reduce the gradient buckets
    (DeepSpeed's multi-rank bucket all-reduce: measured 1.5x stage 0 with the all-gather) and all-gather
    the updated parameters ((N-1)/N M); stage 2 reduces every micro-step, stage 1 at the boundary; stage 3
    all-gathers parameters in forward and backward and reduce-scatters gradients every micro-step
    (3 (N-1)/N M k, the ZeRO paper's 1.5x); with ZeRO++ the sum of ``collectives`` (intra- and inter-node;
    ``parts`` when they are at hand). With a trainable subset (``kit.trainable``) stages 0-2 reduce and
    gather its trainable bytes only (the flat buffer holds nothing else).
    """
    n, z = setup.zero_dp, setup.zero
    if n == 1:
        return 0, "one rank: no communication"
    if z.engine != "deepspeed":
        volume, formula, m = baselines.comm(setup)
        return round(volume), f"{formula}, M = {m:,} B, N = {n}"
    p = element_bytes(z.precision)
    m = p * partition.trainable_params(setup)  # a trainable subset's own
    r = ulysses.reduction_bytes(z, p) / p  # gradients reduced in fp32 under sequence parallelism
    grads = "M" if r == 1 else f"{r:g} M"
    k = setup.batch.grad_accum
    ring = ring_share(n)
    if z.stage == 3:
        parts = collectives(setup) if parts is None else parts
        volume = sum(c.bytes for c in parts)
        formula = " + ".join(f"{c.formula} [{c.scope}]" for c in parts)
        return round(volume), f"{formula}, M = {m:,} B, N = {n}"
    if z.stage == 0:
        volume, formula = 2 * r * ring * m, f"2 (N-1)/N {grads} (gradient all-reduce)"
    elif z.stage == 1:
        volume = (2 * r + 1) * ring * m
        formula = f"2 (N-1)/N {grads} (gradient all-reduce) + (N-1)/N M (parameter all-gather)"
    else:
        volume = (2 * r * k + 1) * ring * m
        formula = (
            f"2 (N-1)/N {grads} x k={k} (gradient all-reduce per micro-step) + (N-1)/N M (parameter "
            "all-gather)"
        )
    exchange = all_to_all(setup)
    if exchange:
        volume += exchange.bytes
        formula += f" + {exchange.formula}"
    return round(volume), f"{formula}, M = {m:,} B, N = {n}"


def _backward_widths(setup: Setup, h: int, kv: int) -> int:
    """The widths of the gradients Ulysses exchanges in backward, summed over the layers: q (h), k and v
    (kv each) when they need a gradient, and the attention output's when any of them does. With a
    trainable subset (``kit.trainable``) a tensor needs none before the first weight that trains: a block
    whose input needs no gradient exchanges only those of its projections that train or carry LoRA
    adapters (checkpointing with frozen embeddings makes the input need one, ``enable_input_require_grads``
    as the ranks do)."""
    listing = partition.listing(setup)
    if listing is None:
        return setup.model.dims.layers * (2 * h + 2 * kv)
    flows = listing.inputs_need_grad or setup.zero.activation_checkpointing
    total = 0
    for block in listing.blocks:
        own = block.trains | block.adapted
        needs = {x: flows or "norm1" in own or x in own for x in ("q", "k", "v")}
        total += h * needs["q"] + kv * (needs["k"] + needs["v"]) + (h if any(needs.values()) else 0)
        flows = flows or bool(own)
    return total


def all_to_all(setup: Setup) -> Collective | None:
    """Ulysses' exchanges per optimizer step (``kit.sequence_parallel``), None without sequence parallelism:
    each attention layer all-to-alls q, k, v and its output in forward (again when its block is
    recomputed under checkpointing) and their gradients in backward,
    among the ``sp`` ranks of its group (consecutive ranks: inside a node when ``sp`` divides its GPUs);
    a rank sends (sp-1)/sp of each of its tensors: b x s/sp tokens x (2 h + 2 kv) 16-bit elements per layer
    and pass (in backward those that need a gradient, ``_backward_widths``), kv the exchanged kv heads'
    width (repeated up to sp); each forward also all-gathers the
    int64 position ids (``UlyssesSPAttentionHF.forward``)."""
    z, m, b = setup.zero, setup.model, setup.batch
    sp = z.sequence_parallel_size
    if sp == 1:
        return None
    layers, h, a, kv_heads, _, _ = m.dims
    kv = ulysses.exchanged_kv_heads(kv_heads, sp) * (h // a)
    p, k, tokens = element_bytes(z.precision), b.grad_accum, b.micro_batch * setup.rank_seq_len
    # a checkpointed block's forward runs again in backward, its exchanges with it
    again = layers // z.checkpoint_every if z.activation_checkpointing else 0
    forward, backward = (layers + again) * (2 * h + 2 * kv), _backward_widths(setup, h, kv)
    exchanged = (sp - 1) / sp * p * tokens * (forward + backward)
    # and each forward of an attention layer all-gathers the int64 position ids: a ring sends sp - 1 parts
    positions = (sp - 1) * (layers + again) * 8 * tokens
    sent = k * (exchanged + positions)
    scope = "intra" if setup.cluster.gpus_per_node % sp == 0 else "inter"
    passes = f"(L + {again} recomputed)" if again else "L"
    how = (
        f"Ulysses (sp-1)/sp x {p} B x b s/sp x ({passes} x (2h + 2kv) forward + {backward:,} backward) "
        f"x k={k} + the position ids' (sp-1) x 8 B per token and forward, sp={sp}, kv={kv}"
    )
    return Collective("Ulysses all-to-all", scope, round(sent), how)


@dataclass(frozen=True)
class Collective:
    """One collective of a step: bytes one GPU sends per optimizer step, inside its node (``intra``) or
    across nodes (``inter``), and how they were counted."""

    name: str
    scope: str
    bytes: int
    formula: str


def collectives(setup: Setup) -> list[Collective]:
    """Stage 3's collectives per optimizer step, ZeRO++ included, split by scope (``ZERO3_COLLECTIVES``).

    M = 16-bit model bytes, N = dp, g = GPUs per node, h = hpz_partition_size, k = micro-steps. A group
    spanning nodes counts as ``inter`` (its ring crosses the NICs). Tensors of at most
    ``stage3_param_persistence_threshold`` elements (M_p of the M bytes, M_g the rest) stay whole on every
    rank: not gathered for a micro-step but once after each optimizer step, updated (``_post_step``).
    Forward all-gathers (N-1)/N M_g over every rank, backward the same again; with hpZ backward gathers
    (h-1)/h M_g inside the node from the secondary partition, which the first release in forward copied
    (``kit.rules.hpz_from_secondary``: no collective), and so does forward for a trainable subset's frozen
    tensors (M_f), whose secondary partition never expires. A tied embedding released between its two
    uses (``tied_regathered``, E bytes) is gathered again by the second module of each pass: 2 E, over
    every rank, or with hpZ from the secondary partition inside the node. qwZ sends the gathers as int8
    (``QUANTIZED_WEIGHT_BYTES`` per element); gradients reduce-scatter (N-1)/N M, or with qgZ int4
    (``QUANTIZED_GRADIENT_BYTES``) in DeepSpeed's two hops (``all_to_all_quant_reduce``): (g-1)/g of the
    int4 gradient to the node's GPUs, then the node-reduced 1/g of it, (nodes-1)/nodes to the same GPU of
    the other nodes (on one node DeepSpeed reduce-scatters as without qgZ, ``stage3.py`` ``num_nodes >
    1``). The quantization scales and each gathered tensor's padding to a multiple of N elements are left
    out. Other stages and engines: one entry, ``comm_bytes``'s total, in the scope of the data-parallel
    group. A trainable subset (``kit.trainable``) reduce-scatters its trainable bytes M_t only and gathers
    every tensor, frozen or not.
    """
    n, z, c = setup.zero_dp, setup.zero, setup.cluster
    across = "inter" if c.nodes > 1 else "intra"
    if z.stage != 3 or z.engine != "deepspeed":
        sent, how = comm_bytes(setup)
        return [Collective("all", across, sent, how)] if n > 1 else []
    p = element_bytes(z.precision)
    m, k, g, h = (
        p * sum(partition.numels(setup)),
        setup.batch.grad_accum,
        c.gpus_per_node,
        z.hpz_partition_size,
    )
    # gradients: a trainable subset's only; fp32 under sequence parallelism
    trained = ulysses.reduction_bytes(z, p) * partition.trainable_params(setup)
    mt = "M_t" if p * partition.trainable_params(setup) != m else "M"
    widen = ulysses.reduction_bytes(z, p) // p  # 2 for 16-bit gradients reduced in fp32
    mt = f"{widen} {mt}" if widen > 1 else mt
    if n == 1:
        return []
    w = QUANTIZED_WEIGHT_BYTES / p if z.quantized_weights else 1.0
    wname = f"{w:g} x " if z.quantized_weights else ""
    forward, backward, reduce = ZERO3_COLLECTIVES
    ring = ring_share(n)
    mp = p * sum(partition.persistent(setup))
    mp = mp if partition.is_exact(setup) else 0
    mg = m - mp
    mf = p * frozen_released(setup) if h > 1 else 0
    e = p * tied_regathered(setup)

    def gather(name: str, size: int, first: bool, trains: bool, what: str) -> Collective:
        """A gather of ``size`` bytes per micro-step: with hpZ from the secondary partition inside the
        node where DeepSpeed takes it from there (``hpz_from_secondary``), else over every rank."""
        if h > 1 and hpz_from_secondary(trains, first):
            return Collective(
                name, "intra", round(k * (h - 1) / h * w * size), f"hpZ {wname}(h-1)/h {what}, h={h}"
            )
        return Collective(name, across, round(k * ring * w * size), f"{wname}(N-1)/N {what}")

    mine = f"(M_g - M_f) x k={k}, M_f = {mf:,} B" if mf else f"M_g x k={k}"
    out = [gather(forward, mg - mf, True, True, mine)]
    if mf:
        out.append(gather(f"{forward} {FROZEN}", mf, True, False, f"M_f x k={k}"))
    out.append(gather(backward, mg, False, True, f"M_g x k={k}"))
    if e:
        out.append(gather(TIED, 2 * e, False, True, f"2 E x k={k}, E = {e:,} B"))
    if mp:
        out.append(
            Collective("persistent all-gather", across, round(ring * mp), f"(N-1)/N M_p, M_p = {mp:,} B")
        )
    if z.quantized_gradients and c.nodes > 1:  # stage3.py: one node reduce-scatters as without qgZ
        q = QUANTIZED_GRADIENT_BYTES / p
        out.append(
            Collective(
                reduce + " (qgZ hop 1)",
                "intra",
                round(k * (g - 1) / g * q * trained),
                f"qgZ {q:g} x (g-1)/g {mt} x k={k}, g={g}",
            )
        )
        hop2 = (c.nodes - 1) / c.nodes * q * trained / g
        out.append(
            Collective(
                f"{reduce} {RAIL}",
                "inter",
                round(k * hop2),
                f"qgZ {q:g} x (nodes-1)/nodes {mt} / g x k={k}",
            )
        )
    else:
        out.append(Collective(reduce, across, round(k * ring * trained), f"(N-1)/N {mt} x k={k}"))
    exchange = all_to_all(setup)
    if exchange:
        out.append(exchange)
    return out


def tied_regathered(setup: Setup) -> int:
    """Elements of the tied embedding (input embedding and LM head, one tensor of vocab x hidden) that
    stage 3 gathers a second time in each pass; 0 when it does not.

    DeepSpeed gathers a parameter for each module that uses it and releases it after (``release_sub_module``)
    unless it is kept whole (at most ``param_persistence_threshold`` elements), its next use lies within
    ``max_reuse_distance`` elements of the trace (``__params_to_release`` walks the modules that follow),
    or the prefetcher already passed that use (``prefetch_bucket_size`` elements of released tensors
    ahead, at most ``max_live_parameters``). The embedding is used first in forward and the head last
    (the reverse in backward), every other tensor between them: when neither window reaches across them,
    the head gathers the weight again in forward and the embedding again in backward."""
    m, z = setup.model, setup.zero
    if z.stage != 3 or not (m.tied_embeddings and m.vocab and m.hidden):
        return 0
    e = m.vocab * m.hidden
    if e <= z.param_persistence_threshold:
        return 0
    between = sum(partition.numels(setup)) - e
    prefetched = min(z.prefetch_bucket_size, z.max_live_parameters)
    if between < z.max_reuse_distance or sum(partition.released(setup)) - e < prefetched:
        return 0
    return e


def frozen_released(setup: Setup) -> int:
    """Elements of the frozen tensors of a trainable subset that stage 3 releases (more than
    ``param_persistence_threshold``): with hpZ their secondary partition outlives the optimizer step
    (``invalidate_secondary_tensor`` walks the optimizer's groups, the trainable tensors only), so every
    gather of them, forward's too, stays inside the node (``kit.rules.hpz_from_secondary``)."""
    if not subset.is_subset(setup.zero):
        return 0
    threshold = setup.zero.param_persistence_threshold
    return sum(t for t, trains in partition.listing(setup).tensors if not trains and t > threshold)


def comm_by_scope(setup: Setup, parts: list[Collective] | None = None) -> dict[str, int]:
    """Bytes one GPU sends per optimizer step inside its node and across nodes (``collectives``, or
    ``parts`` when they are at hand)."""
    out = {"intra": 0, "inter": 0}
    for c in collectives(setup) if parts is None else parts:
        out[c.scope] += c.bytes
    return out


#: the collective each of ``collectives``' entries is timed as (stages 0-2 and the baselines: all-reduce)
TIMED_AS = {"forward all-gather": "all_gather", "backward all-gather": "all_gather"}
TIMED_AS |= {"persistent all-gather": "all_gather", "gradient reduce-scatter": "reduce_scatter"}
TIMED_AS |= {f"forward all-gather {FROZEN}": "all_gather", TIED: "all_gather"}


def collective_calls(setup: Setup) -> list[tuple[str, int, str]]:
    """Collective calls one rank issues per optimizer step: ``(op, calls, formula)``, the code paths
    ``comm_bytes`` counts the bytes of, each call paying a latency whatever its size.

    P = parameters, k = micro-steps, T = tensors above ``param_persistence_threshold``. Stage 0 all-reduces
    the gradients in buckets of ``reduce_bucket_size`` elements at the boundary; stages 1-2 reduce them in
    such buckets (stage 2 every micro-step, stage 1 at the boundary) and all-gather the updated partitions
    in buckets of ``allgather_bucket_size``; stage 3 gathers each parameter tensor it does not persist in
    forward and again in backward (DeepSpeed fetches per parameter, ahead by ``prefetch_bucket_size``) and
    reduce-scatters the gradients in buckets every micro-step, and gathers the persistent ones once after
    the step (and a tied embedding released between its uses a second time in each pass,
    ``tied_regathered``); every stage also all-reduces the gradient norm for clipping (1 call). DDP
    all-reduces buckets of 25 MB at the boundary; FSDP gathers each block (and the root) in forward and
    backward and reduce-scatters it every micro-step.
    """
    n, z, k = setup.zero_dp, setup.zero, setup.batch.grad_accum
    if n == 1:
        return []
    params = partition.trainable_params(setup)  # what gradients and updates move (a subset's own)
    tensors = partition.numels(setup)
    if z.engine == "ddp":
        buckets = math.ceil(4 * params / (DDP_BUCKET_CAP_MB * 2**20))
        return [("all_reduce", buckets, f"ceil(4 B x P / {DDP_BUCKET_CAP_MB} MB) buckets")]
    if z.engine != "deepspeed":
        units = (setup.model.layers or 0) + 1
        gathers = (2 if z.stage == 3 else 1) * k * units
        return [
            (
                "all_gather",
                gathers,
                f"{'2' if z.stage == 3 else '1'} x k={k} x {units} units (blocks + root)",
            ),
            ("reduce_scatter", k * units, f"k={k} x {units} units"),
        ]
    reduce = math.ceil(params / z.reduce_bucket_size)
    gather = math.ceil(params / z.allgather_bucket_size)
    norm = ("all_reduce", 1, "gradient norm")
    if z.stage == 0:
        return [("all_reduce", reduce, f"ceil(P / reduce_bucket_size {z.reduce_bucket_size:,})"), norm]
    if z.stage in (1, 2):
        times = k if z.stage == 2 else 1
        return [
            (
                "all_reduce",
                times * reduce,
                f"{times} x ceil(P / reduce_bucket_size {z.reduce_bucket_size:,})",
            ),
            ("all_gather", gather, f"ceil(P / allgather_bucket_size {z.allgather_bucket_size:,})"),
            norm,
        ]
    persistent = len(partition.persistent(setup))
    big = len(tensors) - persistent
    out = [
        ("all_gather", 2 * k * big, f"2 x k={k} x T={big} tensors gathered"),
        ("reduce_scatter", k * reduce, f"k={k} x ceil(P / reduce_bucket_size {z.reduce_bucket_size:,})"),
    ]
    if tied_regathered(setup):
        out.append(("all_gather", 2 * k, f"2 x k={k}: the tied embedding gathered again in each pass"))
    if persistent:
        out.append(("all_gather", 1, f"the {persistent} persistent tensors after the step"))
    return [*out, norm]
