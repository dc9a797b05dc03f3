"""The review's checks of the ZeRO stage: what it partitions and costs, and the keys only stage 3 reads."""

from __future__ import annotations

from kit.estimate.memory import estimate
from kit.fit import estimate_fit
from kit.review.context import Context, Finding, noop
from kit.rules import SHARDED, Offload
from kit.settings import STAGE3_KEYS, ZEROPP_OFF
from kit.steptime.comm import comm_bytes
from kit.units import size

#: stage 2 "fits with room to spare" when its estimate is at most this share of the GPU's memory
ROOM = 0.8


def stage(x: Context) -> list[Finding]:
    """What the stage partitions, its bytes and communication; stage 3 where stage 2 fits with room."""
    s, e, n = x.setup, x.est, x.n
    key = x.setting("stage") or "zero_optimization.stage"
    mem = x.gpu.memory_bytes
    comm, how = comm_bytes(s)
    sharded = (
        " and ".join(SHARDED[x.stage]).replace("_", " ").replace("optimizer states and", "optimizer states,")
    )
    why = ""
    if x.stage == 3 and n > 1:
        # stage 2 has no NVMe swapper: compare with its CPU offload
        opt = Offload.CPU if s.zero.offload_optimizer is Offload.NVME else s.zero.offload_optimizer
        s2 = s.replace(zero={"stage": 2, "offload_param": "none", "offload_optimizer": opt, **ZEROPP_OFF})
        e2 = estimate(s2)
        if estimate_fit(e2, headroom=1 - ROOM).ok:
            comm2, how2 = comm_bytes(s2)
            ratio = comm / comm2
            message = (
                f"{key}: stage 3 on {s.model.name} ({s.model.params:,} params) where stage 2 fits with room "
                f"to spare: stage 2 needs {size(e2.per_gpu_bytes)} per GPU, {e2.per_gpu_bytes / mem:.0%} of "
                f"the {s.cluster.gpu}'s {size(mem)} (kit.estimate; stage 3: {size(e.per_gpu_bytes)}). "
                f"Stage 3 all-gathers the parameters in every forward and backward: {size(comm)} per GPU "
                f"per step ({how}) against stage 2's {size(comm2)} ({how2}): x{ratio:.2f} (x1.5 in the ZeRO "
                "paper, whose stage 2 reduce-scatters), in per-layer collectives on the critical path"
            )
            suggestion = (
                "use stage 2 (zero_optimization.stage 2, without the stage3_* keys and offload_param): "
                f"{size(e2.per_gpu_bytes)} per GPU, {size(comm2)} per GPU per step"
            )
            return [Finding(key, "warning", message, suggestion)]
        why = f"; stage 2 would need {size(e2.per_gpu_bytes)} ({e2.per_gpu_bytes / mem:.0%} of the GPU)"
    c = e.components
    message = (
        f"{key}: ZeRO stage {x.stage} partitions {sharded or 'nothing'} over {n} GPU(s): model states "
        f"{size(e.model_states_bytes)} per GPU (parameters {size(c['parameters'])}, gradients "
        f"{size(c['gradients'])}, optimizer states {size(c['optimizer_states'])}), "
        f"a peak of {size(e.per_gpu_bytes)} per GPU in the {e.peak_phase or 'step'} (activations "
        f"{size(c['activations'])}, buffers, the caching allocator and overhead), "
        f"{e.per_gpu_bytes / mem:.0%} of the {s.cluster.gpu}'s {size(mem)}{why}; communication "
        f"{size(comm)} per GPU per step ({how})"
    )
    verdict = estimate_fit(e)
    if verdict.ok:
        return [Finding(key, "info", message, "keep it")]
    where = {
        "gpu": "it does not fit the GPU",
        "cpu": "it does not fit the node's CPU RAM",
        "precision": f"the {s.cluster.gpu} has no {s.zero.precision} support",
    }[verdict.problem]
    return [
        Finding(
            key,
            "warning",
            f"{message}: {where}",
            f"see `zerokit plan` for what fits; activations are {size(c['activations'])} per GPU at micro "
            f"batch {s.batch.micro_batch} (a smaller micro batch or activation checkpointing cuts them)",
        )
    ]


def stage3_keys(x: Context) -> list[Finding]:
    """The stage-3-only keys of a stage 0-2 config: they do nothing."""
    if x.stage == 3:
        return []
    return [
        noop(
            f"zero_optimization.{name}",
            "only stage 3 reads it (DeepSpeedZeroOptimizer_Stage3, zero.Init); this config is stage "
            f"{x.stage}",
            "remove it, or use stage 3 if that was the intent",
        )
        for name in x.zero
        if name in STAGE3_KEYS
    ]
