"""The review's checks of ZeRO's buffers: the gradient bucket, overlap_comm, contiguous gradients, the
all-gather bucket, and stage 3's prefetch bucket, live-parameter cap and persistence threshold."""

from __future__ import annotations

from kit.estimate import partition
from kit.review.context import Context, Finding, noop
from kit.rules import BIG_BUFFER_BYTES, DS_REDUCE_BUCKET, STAGE3_GATHER_FORMULA, Offload, stage3_gathered
from kit.units import size

#: a stage-3 prefetch bucket this many times the largest layer gathers more than it needs
PREFETCH_LAYERS = 4


def reduce_bucket(x: Context) -> list[Finding]:
    """The gradient bucket: its buffer per GPU, and a smaller size where it is big."""
    key = x.setting("reduce_bucket_size")
    if x.stage == 0:
        why = "stage 0 all-reduces gradients in the engine, in buckets of its own (MEMORY_OPT_ALLREDUCE_SIZE)"
        return [noop(key, why)] if key else []
    rbs, p, count = x.z.reduce_bucket_size, x.p, x.bucket_count()
    cost = x.delta(contiguous_gradients=False)
    key = key or "zero_optimization.reduce_bucket_size"
    if not cost:
        return [
            Finding(
                key,
                "info",
                f"{key} {rbs:,}: gradients are reduced {rbs:,} elements at a time; no buffer of its own "
                "(contiguous_gradients is off)",
                "keep it",
            )
        ]
    where = (
        "the contiguous gradient buffer (ipg bucket) allocated every step"
        + (", doubled by overlap_comm" if count == 2 else "")
        if x.stage < 3
        else "the ipg bucket stage 3 allocates up front for contiguous_gradients"
    )
    said = f"{key} {rbs:,}" + (" (not set: DeepSpeed's default)" if key not in x.present() else "")
    formula = f"{count} x {p} B x {rbs:,} = {size(cost)} per GPU ({where}; kit.estimate 'buffers')"
    better, how = x.smaller("reduce_bucket_size")
    if cost >= BIG_BUFFER_BYTES and better < rbs:
        saved = x.delta(reduce_bucket_size=better)
        default = (
            f", DeepSpeed's default {DS_REDUCE_BUCKET:,}"
            if rbs == DS_REDUCE_BUCKET and "(not" not in said
            else ""
        )
        return [
            Finding(
                key,
                "warning",
                f"{said}: {formula}{default}",
                f"set it to {better:,} ({how}): {count} x {p} B x {better:,} = {size(cost - saved)}, saving "
                f"{size(saved)} per GPU; gradients then go in more, smaller reductions",
            )
        ]
    return [Finding(key, "info", f"{said}: {formula}", "keep it")]


def overlap(x: Context) -> list[Finding]:
    """overlap_comm: the second gradient buffer it adds at stages 1-2."""
    key = x.setting("overlap_comm")
    if not key:
        return []
    if x.stage == 0:
        return [noop(key, "stage 0 has no ZeRO optimizer; the engine all-reduces after backward")]
    if x.stage == 3:
        return [
            Finding(
                key,
                "info",
                f"{key} {x.z.overlap}: stage 3 runs its reduce-scatters and prefetch all-gathers on a side "
                "stream"
                + ("" if x.z.overlap else " only when on (DeepSpeed's default at stage 3)")
                + "; no extra buffer (one ipg bucket)",
                "keep it on" if x.z.overlap else "turn it on: communication then hides behind compute",
            )
        ]
    rbs, p = x.z.reduce_bucket_size, x.p
    if not x.z.overlap:
        extra = -x.delta(overlap_comm=True)
        # stage 1's hooks reduce only with overlap_comm (stage 2's always): .grad holds every gradient
        held = (
            f" (stage 1 meanwhile holds every gradient in .grad, {p} B x {x.trainable:,} = "
            f"{size(p * x.trainable)} per GPU by the end of backward)"
            if x.stage == 1
            else ""
        )
        return [
            Finding(
                key,
                "info",
                f"{key} false: gradients are reduced after backward, not during it{held}; turning it on adds "
                f"a second buffer of reduce_bucket_size: 1 x {p} B x {rbs:,} = {size(extra)} per GPU",
                "turn it on if the bucket is small (hidden^2) and the step is communication-bound"
                + (", or if the gradients held in .grad are what does not fit" if held else ""),
            )
        ]
    extra = x.delta(overlap_comm=False)
    message = (
        f"{key} true: reduces gradients while backward runs, with a second buffer of reduce_bucket_size "
        f"(double buffering, stage_1_and_2.py setup_buckets): + 1 x {p} B x {rbs:,} = {size(extra)} per GPU"
    )
    if extra >= BIG_BUFFER_BYTES:
        better = x.smaller("reduce_bucket_size")[0]
        if better < rbs:
            return [
                Finding(
                    key,
                    "warning",
                    f"{message}: it doubles the gradient buffers",
                    f"keep it on and shrink reduce_bucket_size to {better:,}: both buffers then cost 2 x {p} "
                    f"B x {better:,} = {size(2 * p * better)}",
                )
            ]
    return [Finding(key, "info", message, "keep it")]


def contiguous(x: Context) -> list[Finding]:
    """contiguous_gradients: the reduce bucket it allocates, or the fragmentation without it."""
    key = x.setting("contiguous_gradients")
    if not key:
        return []
    if x.stage == 0:
        return [noop(key, "stage 0 has no ZeRO gradient buckets")]
    cost = x.delta(contiguous_gradients=False)
    on = x.z.contiguous_gradients
    if on:
        message = (
            f"{key} true: copies each gradient into the reduce bucket as it is produced (less "
            f"fragmentation): {x.bucket_count()} x {x.p} B x reduce_bucket_size {x.z.reduce_bucket_size:,} = "
            f"{size(cost)} per GPU"
        )
        return [Finding(key, "info", message, "keep it; size it with reduce_bucket_size")]
    forced = x.stage < 3 and x.z.offload_optimizer is Offload.CPU
    message = f"{key} false: no contiguous gradient buffer" + (
        "; DeepSpeed turns it on anyway with offload_optimizer (stage_1_and_2.py: contiguous_gradients or "
        "cpu_offload)"
        if forced
        else ", at the price of fragmentation in backward"
    )
    return [Finding(key, "info", message, "remove it" if forced else "keep it")]


def allgather(x: Context) -> list[Finding]:
    """allgather_bucket_size: allocates nothing (stage 3 reads the prefetch bucket instead)."""
    key = x.setting("allgather_bucket_size")
    if not key:
        return []
    if x.stage == 3:
        return [noop(key, "stage 3 gathers parameters by prefetch_bucket_size, not allgather_bucket_size")]
    value = x.z.allgather_bucket_size
    return [
        Finding(
            key,
            "info",
            f"{key} {value:,}: allocates nothing; after the step DeepSpeed all-gathers the updated "
            "partitions into the flat parameter buffer with all_gather_into_tensor when the backend has it "
            "(NCCL does), and only otherwise in shards of about this many elements (runtime/utils.py "
            "all_gather_dp_groups)"
            + (
                "; stage 0 partitions nothing (only the BF16 optimizer's fallback reads it)"
                if x.stage == 0
                else ""
            ),
            "keep it (a multiple of 2)",
        )
    ]


def prefetch(x: Context) -> list[Finding]:
    """Stage 3's prefetch bucket: what it gathers at once, and a smaller size when it spans many layers."""
    key = x.setting("prefetch_bucket_size")
    if x.stage != 3:
        return []
    value, largest, p = x.z.prefetch_bucket_size, x.setup.model.largest_layer_params, x.p
    psi, live = x.setup.model.params, x.z.max_live_parameters
    fetch = stage3_gathered(psi, largest, partition.prefetch_call(x.setup), live)
    shown = key or "zero_optimization.stage3_prefetch_bucket_size"
    said = f"{shown} {value:,}" + ("" if key else " (not set: DeepSpeed's default)")
    formula = (
        f"up to {STAGE3_GATHER_FORMULA} = {fetch:,} parameters "
        f"gathered at once: {p} B x {fetch:,} = {size(p * fetch)} per GPU (kit.estimate 'buffers')"
    )
    better, how = x.smaller("prefetch_bucket_size")
    if value >= PREFETCH_LAYERS * largest and better < value:
        cost = x.delta(prefetch_bucket_size=better)
        if cost > 0:
            return [
                Finding(
                    shown,
                    "warning",
                    f"{said} is {value / largest:.0f}x the largest layer ({largest:,} params): {formula}",
                    f"set it to {better:,} ({how}), saving {size(cost)} per GPU",
                )
            ]
    return [Finding(shown, "info", f"{said}: {formula}", "keep it")] if key else []


def max_live(x: Context) -> list[Finding]:
    """Stage 3's max_live_parameters and max_reuse_distance."""
    found = []
    key = x.setting("max_live_parameters")
    if x.stage == 3 and key:
        cost = x.delta(max_live_parameters=0)
        found.append(
            Finding(
                key,
                "info",
                f"{key} {x.z.max_live_parameters:,}: caps the parameters gathered at once (at least the "
                f"largest layer): {size(cost)} per GPU more than the smallest cap (kit.estimate 'buffers')",
                "keep it; lower it only if the gathered parameters do not fit",
            )
        )
    key = x.setting("max_reuse_distance")
    if x.stage == 3 and key:
        found.append(
            Finding(
                key,
                "info",
                f"{key} {x.z.max_reuse_distance:,}: a gathered parameter reused within this many elements is "
                "kept instead of released and gathered again (fewer all-gathers; bounded by "
                "max_live_parameters)",
                "keep it",
            )
        )
    return found


def persistence(x: Context) -> list[Finding]:
    """Stage 3's persistence threshold: the small tensors kept whole on every GPU."""
    key = x.setting("param_persistence_threshold")
    if x.stage != 3 or not key:
        return []
    cost = x.delta(param_persistence_threshold=0)
    return [
        Finding(
            key,
            "info",
            f"{key} {x.z.param_persistence_threshold:,}: tensors of at most this many elements stay whole on "
            f"every GPU (no all-gather for them): + {size(cost)} per GPU over partitioning them all "
            "(kit.estimate 'parameters')",
            "keep it",
        )
    ]
