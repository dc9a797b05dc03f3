"""The answers notebooks end with, computed from the kit for the reader's own setting (markdown text).

Each function takes the Setup the notebook was run for and says which setting to choose and what it
costs, from the same estimates and step-time model the notebook's tables show (``kit.estimate``,
``kit.steptime.calibrated``: the datasheet's step time unless a calibration is given). What they cannot
see: what the tables cannot (the step time's own limits: ``kit.steptime.perf``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kit.schema import Setup
from kit.units import GIB

if TYPE_CHECKING:
    from kit.estimate.result import Estimate

#: the offload choices ``offload`` weighs, from the fastest to the leanest on the GPU
OFFLOADS: tuple[tuple[str, dict], ...] = (
    ("ZeRO-2", {"stage": 2}),
    ("ZeRO-3", {"stage": 3}),
    ("ZeRO-2 + CPU optimizer offload", {"stage": 2, "offload_optimizer": "cpu"}),
    (
        "ZeRO-3 + CPU optimizer and parameter offload",
        {"stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"},
    ),
)


def _change(seconds: float, base: float) -> str:
    """``seconds`` against ``base`` as a readable change: ``+167 %``, ``-3 %``, ``the same``."""
    change = seconds / base - 1
    return "the same" if abs(change) < 0.005 else f"{change:+.0%}".replace("%", " %")


def _timed(setup: Setup) -> tuple[Estimate, float | None]:
    """The estimate of ``setup`` and its step time in seconds (None where the GPU cannot run it)."""
    from kit.estimate import estimate
    from kit.steptime import calibrated

    try:
        seconds = calibrated.step_time(setup).step_s
    except ValueError:
        seconds = None
    return estimate(setup), seconds


def offload(setup: Setup) -> str:
    """Which of ``OFFLOADS`` to choose for ``setup``'s model, cluster and batch: the fastest one that fits
    the GPU, and what offload would cost beside it (or, when nothing fits, what would be needed)."""
    from kit.fit import estimate_fit, shown_bytes

    c = setup.cluster
    where = (
        f"{setup.model.name} on {c.nodes} x {c.gpus_per_node} {c.gpu}, micro batch {setup.batch.micro_batch}"
    )
    rows = []
    for name, zero in OFFLOADS:
        e, seconds = _timed(
            setup.replace(zero={"offload_optimizer": "none", "offload_param": "none", **zero})
        )
        rows.append((name, e, seconds, estimate_fit(e)))
    fitting = [(n, e, t, fit) for n, e, t, fit in rows if fit.ok and t is not None]
    if not fitting:
        name, e, _, verdict = min(rows, key=lambda r: r[1].per_gpu_bytes)
        short = {"gpu": f"{verdict.capacity / GIB:.1f} GiB usable", "cpu": "short of CPU RAM per node"}
        why = short.get(verdict.problem, f"no {setup.zero.precision} on the {c.gpu}")
        return (
            f"**The answer for {where}**: none of these fits; the leanest, {name}, needs "
            f"{shown_bytes(e, verdict) / GIB:.1f} GiB per GPU ({why}). Turn on activation checkpointing, "
            "lower the micro batch or add GPUs (notebook 04), or offload to NVMe (section 4)."
        )
    name, e, seconds, best = min(fitting, key=lambda r: r[2])
    lines = [
        f"**The answer for {where}**: **{name}**, the fastest setting that fits: "
        f"{best.need / GIB:.1f} GiB per GPU, {seconds:.2f} s per step (datasheet step time)."
    ]
    for other, o, t, verdict in rows:
        if other == name or t is None:
            continue
        fits = "fits" if verdict.ok else "does not fit"
        lines.append(
            f"- {other}: {shown_bytes(o, verdict) / GIB:.1f} GiB per GPU ({fits}), {t:.2f} s per step "
            f"({_change(t, seconds)}), {o.cpu_bytes_per_node / GIB:.0f} GiB of CPU RAM per node."
        )
    lines.append(
        "Offload only what makes a setting fit: each step then moves the offloaded states over PCIe and runs "
        "the optimizer on the CPU."
    )
    return "\n".join(lines)


def zeropp(setup: Setup) -> str:
    """Whether ZeRO++ pays for ``setup``'s model and cluster (stage 3 across nodes): the cross-node bytes,
    the memory and the step time of ZeRO-3, hpZ and all three, from ``kit.grid.zeropp_variants``."""
    from kit import grid
    from kit.fit import estimate_fit, shown_bytes
    from kit.steptime.comm import comm_by_scope

    c = setup.cluster
    where = f"{setup.model.name} on {c.nodes} x {c.gpus_per_node} {c.gpu}"
    if c.nodes == 1:
        return f"**The answer for {where}**: one node, nothing crosses a network: ZeRO++ has nothing to cut."
    off = {"stage": 3, "hpz_partition_size": 1, "quantized_weights": False, "quantized_gradients": False}
    rows = []
    for name, change in grid.zeropp_variants(c.gpus_per_node).items():
        s = setup.replace(zero=off | change)
        e, seconds = _timed(s)
        rows.append((name, e, seconds, comm_by_scope(s)["inter"], estimate_fit(e)))
    base = rows[0]
    fitting = [(n, e, t, i, v.ok) for n, e, t, i, v in rows if v.ok and t is not None]
    lines = []
    for name, e, seconds, inter, verdict in rows:
        time = (
            f"{seconds:.2f} s per step ({seconds / base[2] - 1:+.0%})"
            if seconds and base[2]
            else "no step time"
        )
        held = shown_bytes(e, verdict) / GIB
        lines.append(
            f"- {name}: {inter / GIB:.2f} GiB per GPU per step across nodes, {held:.1f} GiB per GPU "
            f"({'fits' if verdict.ok else 'does not fit'}), {time}."
        )
    if not fitting:
        head = f"**The answer for {where}**: none of these fits the {c.gpu}; see notebook 04 or 08 first."
    else:
        name, e, seconds, inter, _ = min(fitting, key=lambda r: r[2])
        head = (
            f"**The answer for {where}**: **{name}**, the fastest that fits "
            f"({inter / GIB:.2f} GiB per GPU per step across nodes instead of {base[3] / GIB:.2f})."
        )
    tail = (
        "qwZ and qgZ need DeepSpeed's CUDA quantization kernels: they run on your GPUs, not on CPU ranks; "
        "hpZ runs anywhere and costs the secondary partition's memory."
    )
    return "\n".join([head, *lines, tail])
