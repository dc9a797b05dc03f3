"""The moments of a step's peak at its gradient reductions (``kit.estimate.peak``'s backward phase).

Stage 2 reduces its ipg bucket when a gradient hook finds it full and in its epilogue (``_flushes``);
stage 3 reduce-scatters its bucket (``_scatters``). Both walk the model's tensors in the hooks' order (the
reverse of the forward), once per model and bucket size (cached), and give the largest such moment.

What it cannot see: a stage-2 flush counts the end of backward's states, not the saved activations still
live at it; stage 3's hooks are walked per tensor in the model's order, not per module in the trace's.
"""

from __future__ import annotations

import itertools
from functools import lru_cache

from kit import sequence_parallel as ulysses
from kit.components import Component
from kit.estimate import partition
from kit.estimate.result import NONE, Term
from kit.rules import element_bytes
from kit.schema import Setup


def flushes(setup: Setup, rank: int, end: dict[str, Term], held: Term) -> dict[str, dict[str, Term]]:
    """Stage 2's reductions (``average_tensor``), and stage 1's (the same bucket at the boundary: after
    backward in the model's order, or in its hooks with ``overlap_comm``; walked here as stage 2's, which
    the runs measured, one epilogue reduction each, cannot tell apart): ``allreduce_bucket`` flattens the
    bucket's slices into one copy (``use_multi_rank_bucket_allreduce``: every destination rank's slices
    together, 16-bit x the elements in the bucket), upcast to fp32 under sequence parallelism, and
    all-reduces it; consecutive slices of one destination are merged first,
    so a bucket that is one rank's alone is a single slice, reduced in place (no copy). A gradient hook
    that finds the bucket full reduces it (``reduce_independent_p_g_buckets_and_remove_grads``) while its
    own tensor's gradient is live, the epilogue (``independent_gradient_partition_epilogue``) what is
    left; the hooks run in the reverse of the model's order. A tensor larger than the bucket is never
    copied into it (``extra_large_param_to_reduce``): its own gradient waits, beside the next hook's, until
    that hook reduces it. This rank's partition gradient buffer
    (``copy_grads_in_partition``) is allocated after the first reduction of a tensor in its partition:
    before it, only what is ``held`` across micro-steps."""
    z = setup.zero
    if z.engine != "deepspeed" or z.stage not in (1, 2) or not z.contiguous_gradients:
        return {}
    p, part = element_bytes(z.precision), partition.partition_numel(setup)
    c = ulysses.reduction_bytes(z, p)

    def copy(content: int, owners: int) -> Term:
        own = (
            Term(p * content, f"{p} B x {content:,} (a tensor larger than the bucket: its own gradient)")
            if content > z.reduce_bucket_size
            else NONE
        )
        up = Term(c * content, f"{c} B x {content:,} (its fp32 copy for the reduction)")
        if owners == 1:
            return own + (
                up
                if c != p
                else Term(0, f"none: the bucket's {content:,} elements are one rank's, reduced in place")
            )
        flat = Term(p * content, f"{p} B x {content:,} (the bucket's flat copy)")
        return own + (flat + up if c != p else flat)

    out: dict[str, dict[str, Term]] = {}
    before, after, last = _flush_sizes(
        partition.trainable(setup), partition.computed_with(setup), part, rank, z.reduce_bucket_size
    )
    # the largest flush: before this rank's partition buffer exists (what is held across micro-steps
    # beside it) or after (the end's gradients)
    options = [(f, held) for f in (before,) if f] + [(f, end[Component.GRADIENTS]) for f in (after,) if f]
    if options:
        (t, content, owners), grads = max(
            options, key=lambda o: p * _flush_elements(o[0], z.reduce_bucket_size) + o[1].bytes
        )
        flat = Term(p * t, f"{p} B x {t:,} (a hook's gradient and its module's others)") + copy(
            content, owners
        )
        out["at a bucket flush"] = {**end, Component.GRADIENTS: grads, "temporaries": flat}
    content, owners, allocated = last
    last = {"temporaries": copy(content, owners)} | ({} if allocated else {"gradients": held})
    out["at the epilogue's reduction"] = {**end, **last}
    return out


@lru_cache(maxsize=256)
def _flush_sizes(numels: tuple[int, ...], siblings: tuple[int, ...], part: int, rank: int, bucket_size: int):
    """``_flushes``' walk of the hooks over the trainable tensors ``numels`` (the flat buffer's), in
    elements: the largest flush before this rank's partition buffer is allocated and the largest after it,
    each ``(hook's tensor and the gradients computed with it, bucket's content, its owners)`` or None; and
    the epilogue's ``(content, owners, allocated)``. ``siblings``: ``partition.computed_with``."""
    ends = itertools.accumulate(numels)  # each tensor's end in the flat buffer
    largest: list = [None, None]  # before, after
    owners: list[int] = []
    content, ours, allocated = 0, False, False
    walk = zip(reversed(numels), reversed(siblings), reversed(list(ends)), strict=True)
    for t, with_it, stop in walk:
        if content + t > bucket_size:
            flush = (t + with_it, content, len(owners))
            # the flush that reduces the first of this rank's tensors allocates its partition buffer
            # (``copy_grads_in_partition``, after the reduction: its flat copy freed, the rest still live)
            moments = [(allocated, flush)] + (
                [(True, (t + with_it, content, 1))] if ours and not allocated else []
            )
            for after, moment in moments:
                best = largest[after]
                if best is None or _flush_elements(moment, bucket_size) > _flush_elements(best, bucket_size):
                    largest[after] = moment
            allocated, content, owners, ours = allocated or ours, 0, [], False
        content += t
        for owner in range((stop - t) // part, (stop - 1) // part + 1):  # the tensor's slices, merged
            if not owners or owners[-1] != owner:
                owners.append(owner)
        ours = ours or (stop - t < (rank + 1) * part and stop > rank * part)
    return largest[0], largest[1], (content, len(owners), allocated)


def _flush_elements(flush: tuple[int, int, int], bucket_size: int) -> int:
    """A flush's live elements: the hook's tensor, the bucket's flat copy (none for one rank's slices), and
    a tensor larger than the bucket its own gradient."""
    t, content, owners = flush
    return t + (content if owners > 1 else 0) + (content if content > bucket_size else 0)


def scatters(
    setup: Setup,
    block: dict[str, Term],
    bucketed: Term,
    end: dict[str, Term],
    gathered: Term,
    backend: str,
) -> dict[str, dict[str, Term]]:
    """Stage 3's gradient reductions (``stage3.py``): a gradient hook whose tensor would overflow the
    ipg bucket (``reduce_bucket_size`` elements) first reduces what it holds
    (``reduce_independent_p_g_buckets_and_remove_grads``), the epilogue what is left. Each goes through
    ``reduce_scatter_coalesced``, which concatenates every tensor's partitions padded to the ranks into
    one flat buffer (16-bit x the sum of ceil(t / N) x N; none for a lone tensor N divides), and gloo's
    reduce-scatter clones its input (NCCL none). At a hook the block's backward is live and, of the
    released tensors, those not yet through their backward (at or before it in the forward) can still
    be gathered; the epilogue runs after every module's backward (all released, activations freed)."""
    z = setup.zero
    if z.engine != "deepspeed" or z.stage != 3:
        return {}
    p, copies = element_bytes(z.precision), 2 if backend == "gloo" else 1
    c = ulysses.reduction_bytes(z, p)  # the bucket's, so its flat copies'
    how = "flat copy" + (" and gloo's clone of it" if copies == 2 else "")

    def flat(n: int) -> Term:
        return Term(copies * c * n, f"{copies} x {c} B x {n:,} (reduce_scatter_coalesced's {how})")

    out: dict[str, dict[str, Term]] = {}
    listing = partition.listing(setup)
    flags = tuple(t for _, t in listing.tensors) if listing else None
    sizes = (
        partition.numels(setup),
        flags,
        setup.zero_dp,
        z.reduce_bucket_size,
        z.param_persistence_threshold,
    )
    last = _scatter_sizes(*sizes)[-1]
    largest = _largest_scatter(*sizes, gathered.bytes // p, copies)
    if largest:  # the largest hook's reduction: what is still gathered, its flat copy, a waiting gradient
        before, padded, waiting = largest
        still = min(gathered.bytes, p * before)
        own = Term(p * waiting, f"{p} B x {waiting:,} (a tensor larger than the bucket: its own gradient)")
        out["at a gradient reduce-scatter"] = {
            **block,
            Component.BUFFERS: bucketed
            + Term(still, f"{p} B x {still // p:,} gathered (not yet through backward)"),
            "temporaries": block["temporaries"] + flat(padded) + (own if waiting else NONE),
        }
    out["at the epilogue's reduce-scatter"] = {**end, "temporaries": flat(last[1])}
    return out


@lru_cache(maxsize=1024)
def _largest_scatter(
    numels: tuple[int, ...],
    trains: tuple[bool, ...] | None,
    dp: int,
    bucket_size: int,
    threshold: int,
    gathered: int,
    copies: int,
) -> tuple[int, int, int] | None:
    """The hook's reduction (``_scatter_sizes``, but the epilogue) with the most elements live: those
    still gathered (at most ``gathered``), its flat copy, ``copies`` times, and a waiting gradient; None
    without one."""
    flushes = _scatter_sizes(numels, trains, dp, bucket_size, threshold)[:-1]
    return max(flushes, key=lambda f: min(gathered, f[0]) + copies * f[1] + f[2], default=None)


@lru_cache(maxsize=256)
def _scatter_sizes(
    numels: tuple[int, ...], trains: tuple[bool, ...] | None, dp: int, bucket_size: int, threshold: int
) -> tuple[tuple[int, int, int], ...]:
    """Stage 3's gradient reductions in backward order (``_scatters``) over the tensors ``numels`` (those
    whose ``trains`` flag is False have no gradient; None: all train): per reduction, the padded elements
    of the released tensors at or before the hook's tensor in the forward (those that can still be
    gathered), the elements of its flat copy (none for a lone tensor dp divides) and those of a gradient
    waiting in the bucket (``__add_grad_to_ipg_bucket`` copies none larger than it: it stays its own
    tensor until this hook reduces it, beside the hook's); the epilogue last."""
    released = [partition.padded(t, dp) if t > threshold else 0 for t in numels]
    before = list(itertools.accumulate(released))  # before[i]: released elements up to tensor i
    out, count, total, padded = [], 0, 0, 0
    for i in reversed(range(len(numels))):
        if trains is not None and not trains[i]:
            continue
        if count and total + numels[i] > bucket_size:
            waiting = total if count == 1 and total > bucket_size else 0
            out.append((before[i], 0 if count == 1 and total % dp == 0 else padded, waiting))
            count, total, padded = 0, 0, 0
        count, total, padded = count + 1, total + numels[i], padded + partition.padded(numels[i], dp)
    out.append((0, 0 if count == 1 and total % dp == 0 else padded, 0))
    return tuple(out)
