"""Figures of a sweep's Results (matplotlib; each function returns a Figure, no global pyplot state).

``throughput``: samples/s per configuration. ``memory``: model states and activations per GPU per
configuration, stacked by component, the estimate beside the measurement. ``comm_volume``: bytes one
rank puts on the wire per step, by collective. ``loss_curves``: loss per step of every configuration,
on one axis (ZeRO stages should overlap: sharding does not change the math).
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from kit.results import COMPONENTS, Results

MB = 1e6
#: one colour per component, shared by the memory plot's two bars
COLORS = {
    "parameters": "#4C72B0",
    "gradients": "#DD8452",
    "optimizer_states": "#55A868",
    "buffers": "#8172B3",
    "activations": "#C44E52",
}


def throughput(results: Results) -> Figure:
    """Median samples/s of each configuration (global batch / step time, over the measured steps)."""
    table = _ok(results)
    fig = Figure(figsize=(max(5, 0.9 * len(table) + 2), 3.5), layout="constrained")
    ax = fig.subplots()
    ax.bar(table["label"], table["samples_per_s"], color="#4C72B0")
    ax.set_ylabel("samples / s")
    ax.set_title("Throughput per configuration")
    _rotate(ax)
    return fig


def memory(results: Results) -> Figure:
    """Per configuration two stacked bars, estimate (hatched) and measured on rank 0, MB per GPU."""
    table = _ok(results)
    fig = Figure(figsize=(max(6, 1.3 * len(table) + 2), 4), layout="constrained")
    ax = fig.subplots()
    positions = range(len(table))
    width = 0.38
    for side, offset, hatch in (("estimate", -width / 2, "//"), ("measured", width / 2, None)):
        bottom = [0.0] * len(table)
        for part in COMPONENTS:
            values = [v / MB for v in table[f"{side}_{part}"]]
            ax.bar(
                [p + offset for p in positions],
                values,
                width,
                bottom=bottom,
                color=COLORS[part],
                hatch=hatch,
                edgecolor="white",
                label=part.replace("_", " ") if side == "measured" else None,
            )
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_xticks(list(positions), table["label"])
    ax.set_ylabel("MB per GPU (rank 0)")
    ax.set_title("Memory per configuration: estimate (hatched, left) vs measured (right)")
    ax.legend(fontsize="small")
    _rotate(ax)
    return fig


def comm_volume(results: Results) -> Figure:
    """Bytes one rank sends per step, stacked by collective (all-reduce, reduce-scatter, all-gather...).

    From DeepSpeed's comms logger, scaled to wire bytes (``kit.measure.WIRE_FACTORS``).
    """
    from kit.measure import WIRE_FACTORS

    steps = results.steps()
    last = steps.groupby("config_id", sort=False).tail(1)
    ops = sorted(c.removeprefix("comm_bytes_") for c in last.columns if c.startswith("comm_bytes_"))
    fig = Figure(figsize=(max(5, 0.9 * len(last) + 2), 3.5), layout="constrained")
    ax = fig.subplots()
    bottom = [0.0] * len(last)
    for op in ops:
        factor = WIRE_FACTORS.get(op, lambda _: 1.0)
        values = [
            0.0 if v != v else v * factor(n) / MB  # NaN: the op did not run in that configuration
            for v, n in zip(last[f"comm_bytes_{op}"], last["world_size"], strict=True)
        ]
        ax.bar(last["label"], values, bottom=bottom, label=op.replace("_", "-"))
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_ylabel("MB sent per rank per step")
    ax.set_title("Communication volume per configuration")
    ax.legend(fontsize="small")
    _rotate(ax)
    return fig


def loss_curves(results: Results) -> Figure:
    """Rank 0's loss per step, one line per configuration."""
    steps = results.steps()
    fig = Figure(figsize=(6, 3.5), layout="constrained")
    ax = fig.subplots()
    for (_, label), group in steps.groupby(["order", "label"], sort=True):
        ax.plot(group["step"], group["loss"], marker="o", label=label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("loss (rank 0)")
    ax.set_title("Loss per step")
    ax.legend(fontsize="small")
    return fig


def _ok(results: Results):
    table = results.summary()
    return table[table["status"] == "ok"].reset_index(drop=True)


def _rotate(ax) -> None:
    for label in ax.get_xticklabels():
        label.set_rotation(30)
        label.set_horizontalalignment("right")
