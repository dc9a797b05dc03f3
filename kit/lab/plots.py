"""Figures of a sweep's Results (matplotlib; each function returns a Figure, no global pyplot state).

``throughput``: samples/s per configuration. ``memory``: model states and activations per GPU per
configuration, stacked by component, the estimate beside the measurement. ``estimated_memory``:
estimates alone (no run), stacked by component against each GPU's capacity. ``comm_volume``: bytes one
rank puts on the wire per step, by collective. ``loss_curves``: loss per step of every configuration,
on one axis (ZeRO stages should overlap: sharding does not change the math).
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from kit.components import MEASURED
from kit.run.results import Results
from kit.units import GIB, MB

#: one colour per memory component, in every figure of the kit
COLORS = {
    "parameters": "#4C72B0",
    "gradients": "#DD8452",
    "optimizer_states": "#55A868",
    "buffers": "#8172B3",
    "activations": "#C44E52",
    "overhead": "#8C8C8C",
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
        series = {part: [v / MB for v in table[f"{side}_{part}"]] for part in MEASURED}
        _stack(
            ax, [p + offset for p in positions], series, colors=COLORS, width=width, hatch=hatch,
            edgecolor="white", labelled=side == "measured",
        )  # fmt: skip
    ax.set_xticks(list(positions), table["label"])
    ax.set_ylabel("MB per GPU (rank 0)")
    ax.set_title("Memory per configuration: estimate (hatched, left) vs measured (right)")
    ax.legend(fontsize="small")
    _rotate(ax)
    return fig


def comm_volume(results: Results) -> Figure:
    """Bytes one rank sends per step, stacked by collective (all-reduce, reduce-scatter, all-gather...).

    From DeepSpeed's comms logger, scaled to wire bytes (``kit.rules.wire_factor``).
    """
    from kit.rules import wire_factor

    steps = results.steps()
    last = steps.groupby("config_id", sort=False).tail(1)
    ops = sorted(c.removeprefix("comm_bytes_") for c in last.columns if c.startswith("comm_bytes_"))
    fig = Figure(figsize=(max(5, 0.9 * len(last) + 2), 3.5), layout="constrained")
    ax = fig.subplots()
    series = {
        op.replace("_", "-"): [
            0.0 if v != v else v * wire_factor(op, n) / MB  # NaN: op did not run
            for v, n in zip(last[f"comm_bytes_{op}"], last["world_size"], strict=True)
        ]
        for op in ops
    }
    _stack(ax, list(last["label"]), series)
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


def estimated_memory(estimates, title: str = "") -> Figure:
    """Stacked bars of bytes per GPU by component, one per ``kit.estimate.Estimate``, against each
    GPU's capacity (a dashed line per GPU type)."""
    from kit.gpus import gpu

    fig = Figure(figsize=(max(4.0, 1.3 * len(estimates) + 2), 3.6), layout="constrained")
    ax = fig.subplots()
    series = {c: [e.components[c] / GIB for e in estimates] for c in COLORS}
    _stack(ax, [e.setup.label for e in estimates], series, colors=COLORS)
    for name in sorted({e.setup.cluster.gpu for e in estimates}):
        capacity = gpu(name).memory_gib
        ax.axhline(capacity, color="black", linestyle="--", linewidth=1)
        ax.text(
            0.99,
            capacity,
            f"{name}: {capacity:g} GiB",
            transform=ax.get_yaxis_transform(),
            ha="right",
            va="bottom",
        )
    ax.set_ylabel("GiB per GPU")
    ax.set_title(title or "estimated memory per GPU")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    _rotate(ax)
    return fig


def _stack(ax, x, series: dict[str, list[float]], colors=None, labelled: bool = True, **bar) -> None:
    """One stacked bar per x: a segment per series, in order, labelled by the series name."""
    bottom = [0.0] * len(x)
    for name, values in series.items():
        color = colors[name] if colors else None
        label = name.replace("_", " ") if labelled else None
        ax.bar(x, values, bottom=bottom, color=color, label=label, **bar)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]


def _ok(results: Results):
    table = results.summary()
    return table[table["status"] == "ok"].reset_index(drop=True)


def _rotate(ax) -> None:
    for label in ax.get_xticklabels():
        label.set_rotation(30)
        label.set_horizontalalignment("right")


def pareto(plan, max_points: int = 4000) -> Figure:
    """Wall-clock time vs cost of every fitting setup of a ``kit.estimate.plan.Plan``, one colour per GPU
    type, log-log, with the Pareto front (nothing both faster and cheaper) drawn as a line."""
    fit = plan.fitting()
    shown = fit if len(fit) <= max_points else fit.sample(max_points, random_state=0)
    fig = Figure(figsize=(8, 4.8), layout="constrained")
    ax = fig.subplots()
    for name, group in shown.groupby("gpu", sort=True):
        ax.scatter(group.hours, group.cost_usd, s=10, alpha=0.45, label=name)
    front = plan.pareto()
    ax.plot(front.hours, front.cost_usd, color="black", marker="o", ms=4, lw=1.2, label="Pareto front")
    for _, row in front.iloc[[0, -1]].iterrows() if len(front) else ():  # name the fastest and cheapest
        ax.annotate(f"{row.gpus} x {row.gpu}\nz{row.stage}", (row.hours, row.cost_usd), fontsize=8,
                    xytext=(6, 6), textcoords="offset points")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"wall-clock hours for {plan.tokens:.3g} tokens")
    ax.set_ylabel("cost, USD")
    ax.set_title(f"{plan.base.model.name}: {len(fit):,} fitting setups of {len(plan.table):,}")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize="small", ncols=2, loc="upper right")
    return fig
