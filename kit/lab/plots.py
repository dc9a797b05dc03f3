"""Figures of a sweep's Results (matplotlib; each function returns a Figure, no global pyplot state).

``throughput``: samples/s per configuration. ``memory``: model states and activations per GPU (per CPU
rank where the ranks ran on CPU) per configuration, stacked by component, the estimate beside the
measurement. ``estimated_memory``: estimates alone (no run), stacked by component against each GPU's
capacity. ``comm_volume``: bytes one rank puts on the wire per step, by collective. ``loss_curves``:
loss per step of every configuration, on one axis (ZeRO stages should overlap: sharding does not change
the math). ``heartbeats``: memory and samples/s of every rank over time, from a ``kit.monitor.Snapshot``.
``predicted_vs_measured``: step times predicted beside measured, with the y = x line. ``published`` and
``published_fits``: the kit beside published measurements of real GPU runs
(``kit.accuracy.published.report``), max allocated and max reserved predicted against measured, and each
fit / OOM boundary against the GPU's memory.

Memory is drawn in MiB (2**20) or GiB, as the estimates show it; bytes sent in MB (1e6), as network
traffic is counted.
"""

from __future__ import annotations

import textwrap

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from kit.components import MEASURED, MODEL_STATES, Component
from kit.lab.notebook import measured_steps
from kit.run.results import Results
from kit.units import GIB, MB, MIB, count_text

#: what a figure of a sweep or a job says where no step has been measured (a run stopped in its warm-up)
NOTHING_MEASURED = "nothing measured yet"


#: one colour per memory component, in every figure of the kit
COLORS: dict[str, str] = {
    Component.PARAMETERS: "#4C72B0",
    Component.GRADIENTS: "#DD8452",
    Component.OPTIMIZER_STATES: "#55A868",
    Component.BUFFERS: "#8172B3",
    Component.ACTIVATIONS: "#C44E52",
    Component.OVERHEAD: "#8C8C8C",
}
#: the caching allocator's replayed share above a peak's tensors (``Reserved.cached``)
ALLOCATOR = "caching allocator"


def throughput(results: Results) -> Figure:
    """Median samples/s of each configuration (global batch / step time, over the measured steps)."""
    table = _ok(results)
    if table.empty:
        return nothing("Throughput per configuration", "no configuration finished")
    fig = Figure(figsize=(max(5, 0.9 * len(table) + 2), 3.5), layout="constrained")
    ax = fig.subplots()
    bars = ax.bar(table["label"], table["samples_per_s"], color="#4C72B0")
    ax.bar_label(bars, fmt="{:,.1f}", fontsize=8, padding=2)
    ax.set_ylabel("samples / s")
    ax.set_title("Throughput per configuration")
    headroom(ax, table["samples_per_s"])
    _rotate(ax)
    return fig


def memory(results: Results) -> Figure:
    """Per configuration two stacked bars, estimate (hatched) and measured on rank 0, MiB per GPU (per
    CPU rank where the records say the ranks ran on CPU: ``Results.rank_word``)."""
    table = _ok(results)
    if table.empty:
        return nothing("Memory per configuration", "no configuration finished")
    fig = Figure(figsize=(max(6, 0.8 * len(table) + 2.5), 4), layout="constrained")
    ax = fig.subplots()
    positions = range(len(table))
    width = 0.38
    for side, offset, hatch in (("estimate", -width / 2, "//"), ("measured", width / 2, None)):
        series: dict[str, list[float]] = {
            part: [v / MIB for v in table[f"{side}_{part}"]] for part in MEASURED
        }
        _stack(
            ax, [p + offset for p in positions], series, colors=COLORS, width=width, hatch=hatch,
            edgecolor="white", labelled=side == "measured",
        )  # fmt: skip
    ax.set_xticks(list(positions), table["label"])
    ax.set_ylabel(f"MiB per {results.rank_word()} (rank 0)")
    ax.set_title("Memory per configuration\nestimate (hatched, left), measured (right)")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    sides = ("estimate", "measured")
    tops = [
        sum(table[f"{side}_{part}"].iloc[i] for part in MEASURED) / MIB for side in sides for i in positions
    ]
    headroom(ax, tops)
    _rotate(ax)
    return fig


def comm_volume(results: Results) -> Figure:
    """Bytes one rank sends per step, stacked by collective (all-reduce, reduce-scatter, all-gather...),
    with the prediction (``kit.steptime.comm.comm_bytes``) as a black tick on each bar.

    From the records' ``comm_bytes`` (DeepSpeed's collectives in its comms logger's convention, a PyTorch
    baseline's own hooks), scaled to wire bytes
    (``kit.rules.wire_factor``).
    """
    from kit.rules import wire_factor

    steps = results.steps()
    if steps.empty:
        return nothing("Communication volume per configuration")
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
    if "estimate_comm_wire_bytes" in last:
        ax.scatter(range(len(last)), last["estimate_comm_wire_bytes"] / MB, marker="_", s=900, color="black",
                   linewidths=2, zorder=3, label="estimate")  # fmt: skip
    ax.set_ylabel("MB sent per rank per step")
    ax.set_title("Communication volume per configuration")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0), markerscale=0.3)
    headroom(ax, [sum(values) for values in zip(*series.values(), strict=True)] if series else [])
    _rotate(ax)
    return fig


def loss_curves(results: Results) -> Figure:
    """Rank 0's loss per measured step (from 1, after the warm-up, as the notebooks' tables number them:
    ``kit.lab.notebook.measured_steps``), one line per configuration."""
    steps = measured_steps(results, rank=0)
    if steps.empty:
        return nothing("Loss per step (measured steps, after warm-up)")
    fig = Figure(figsize=(6, 3.5), layout="constrained")
    ax = fig.subplots()
    markers = "osD^vP*X"
    for i, ((_, label), group) in enumerate(steps.groupby(["order", "label"], sort=True)):
        # ZeRO stages give the same loss, so the lines lie on one another: markers and dashes tell them apart
        ax.plot(group["step"], group["loss"], marker=markers[i % len(markers)], markersize=5,
                linestyle=("-", "--", ":", "-.")[i % 4], label=label, alpha=0.85)  # fmt: skip
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("measured step")
    ax.set_ylabel("loss (rank 0)")
    ax.set_title("Loss per step (measured steps, after warm-up)")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def estimated_memory(estimates, title: str = "") -> Figure:
    """Stacked bars of bytes per GPU by component, one per ``kit.estimate.Estimate``, against each
    GPU's capacity (a dashed line per GPU type). The bar is every component at once; the verdict's number
    on the estimate's GPU, the predicted peak per GPU (``kit.fit.shown_bytes``: where it fits past the GPU's
    memory, what the allocator holds there flushing its cache), is the black tick across it, labelled."""
    from kit.fit import estimate_fit, shown_bytes
    from kit.gpus import gpu

    fig = Figure(figsize=(max(4.8, 1.0 * len(estimates) + 3.5), 3.8), layout="constrained")
    ax = fig.subplots()
    series: dict[str, list[float]] = {c: [e.components[c] / GIB for e in estimates] for c in COLORS}
    labels = [e.setup.label for e in estimates]
    _stack(ax, labels, series, colors=COLORS, width=0.6)
    verdicts = [estimate_fit(e) for e in estimates]
    peaks = [shown_bytes(e, v) / GIB for e, v in zip(estimates, verdicts, strict=True)]
    sums = [e.components_bytes / GIB for e in estimates]
    capacities = {name: gpu(name).memory_gib for name in sorted({e.setup.cluster.gpu for e in estimates})}
    verdict = "the step's peak per GPU\n(the verdict; the bars:\nevery component at once)"
    ax.hlines(peaks, [x - 0.4 for x in range(len(peaks))], [x + 0.4 for x in range(len(peaks))],
              colors="black", linewidth=2.5, label=verdict, zorder=3)  # fmt: skip
    for x, (peak, v) in enumerate(zip(peaks, verdicts, strict=True)):
        over = v.problem == "gpu"
        # on a white ground: readable where a GPU's line runs through it
        ax.annotate(f"peak {peak:,.2f} GiB", (x, max(peak, sums[x])), xytext=(0, 3),
                    textcoords="offset points", ha="center", va="bottom", fontsize=9, fontweight="bold",
                    color="#b00" if over else "black",
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5})  # fmt: skip
    for name, capacity in capacities.items():
        # the capacity is named in the legend, not on the plot, where a bar over it would hide the text
        ax.axhline(
            capacity, color="black", linestyle="--", linewidth=1.2, label=f"{name}: {capacity:,.2f} GiB"
        )
    ax.set_ylabel("GiB per GPU")
    ax.set_title(title or "estimated memory per GPU")
    headroom(ax, peaks + sums + list(capacities.values()), 1.18)
    ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
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


def headroom(ax, tops, factor: float = 1.12) -> None:
    """Room above the highest bar (its label, the legend): bars never touch the top edge."""
    top = max([float(t) for t in tops if t == t] or [0.0])
    if top > 0:
        ax.set_ylim(0, top * factor)


def _ok(results: Results):
    table = results.summary()
    return table[table["status"] == "ok"].reset_index(drop=True)


def empty(ax, text: str) -> None:
    """An axes with nothing to draw says so, without ticks."""
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center")
    ax.set_xticks([])
    ax.set_yticks([])


def nothing(title: str, why: str = "") -> Figure:
    """A small figure that says ``NOTHING_MEASURED`` (and ``why``) under ``title``, with no axes' ticks."""
    fig = Figure(figsize=(5, 1.6), layout="constrained")
    ax = fig.subplots()
    empty(ax, NOTHING_MEASURED + (f" ({why})" if why else ""))
    ax.set_title(title)
    return fig


def _rotate(ax) -> None:
    """Long tick labels slanted; under four bars, wrapped on lines instead (a slanted label of a lone bar
    runs past the figure's left edge)."""
    labels = ax.get_xticklabels()
    if len(labels) < 4:
        ax.set_xticks(ax.get_xticks(), [textwrap.fill(t.get_text(), 12) for t in labels])
        return
    for label in labels:
        label.set_rotation(30)
        label.set_horizontalalignment("right")


def pareto(
    plan, max_points: int = 4000, max_hours: float | None = None, budget: float | None = None, booked=None
) -> Figure:
    """Wall-clock time vs cost of every fitting setup of a ``kit.planning.plan.Plan`` within ``max_hours``
    and ``budget`` (USD), one colour per GPU type, log-log, with the Pareto front (nothing both faster and
    cheaper) drawn as a line; the front's fastest and cheapest named, and ``booked``'s recommendation
    (``kit.planning.booking.Booking``) when given. The legend sits outside the axes, each name in a box
    pointing at its marker from the side, so neither covers a point."""
    front = plan.pareto(max_hours, budget)  # confirmed first (``Plan.settle``): a refused row is not drawn
    fit = plan.fitting(max_hours, budget)
    shown = fit if len(fit) <= max_points else fit.sample(max_points, random_state=0)
    fig = Figure(figsize=(9, 4.8), layout="constrained")
    ax = fig.subplots()
    for name, group in shown.groupby("gpu", sort=True):
        ax.scatter(group.hours, group.cost_usd, s=10, alpha=0.45, label=name)
    ax.plot(front.hours, front.cost_usd, color="black", marker="o", ms=4, lw=1.2, label="Pareto front")
    names: dict = {}  # row -> what it is: nothing lies below the front, so the names go in a band there
    if len(front):
        names.setdefault(front.index[0], []).append("fastest")
        names.setdefault(front.index[-1], []).append("cheapest")
    if booked is not None and booked.recommended is not None:
        names.setdefault(booked.recommended.name, []).append("book")
    box = {"boxstyle": "round,pad=0.25", "fc": "white", "ec": "0.6"}
    for k, (i, what) in enumerate(sorted(names.items(), key=lambda item: plan.table.hours[item[0]])):
        row = plan.table.loc[i]  # names left to right as their points, so that no two arrows cross
        ax.annotate(
            f"{', '.join(what)}: {row.gpus} x {row.gpu}\n{row.hours:,.0f} h, ${row.cost_usd:,.0f}",
            (row.hours, row.cost_usd), xytext=((k + 0.5) / len(names), 0.03), textcoords="axes fraction",
            ha="center", va="bottom", fontsize=8, bbox=box,
            arrowprops={"arrowstyle": "->", "color": "0.3", "shrinkA": 0, "shrinkB": 4},
        )  # fmt: skip
    if fit.empty:
        empty(ax, "no setup fits within the limits")
    else:
        ax.set_xscale("log")
        ax.set_yscale("log")
        floor, top = front.cost_usd.min(), fit.cost_usd.max() * 1.15
        ax.set_ylim(floor / (top / floor) ** (0.25 / 0.75) / 1.1, top)  # the lowest quarter for the names
        ax.set_xlim(fit.hours.min() / 1.25, fit.hours.max() * 1.25)
        for axis, (low, high) in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
            subs = (1.0, 2.0, 5.0) if high / low < 300 else (1.0,)  # 1-2-5 ticks within two decades or so
            axis.set_major_locator(LogLocator(subs=subs))
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
            axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(f"wall-clock hours for {count_text(plan.tokens)} tokens")
    ax.set_ylabel("cost, USD")
    limits = [f"{max_hours:,g} h" if max_hours else "", f"${budget:,.0f}" if budget else ""]
    within = " and ".join(x for x in limits if x)
    ax.set_title(
        f"{plan.base.model.name}: {len(fit):,} of {len(plan.table):,} setups pass the memory screen"
        + (f" within {within}" if within else "")
    )
    ax.grid(True, which="major", alpha=0.3)
    if len(fit):
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    return fig


def batch_schedule(results: Results) -> Figure:
    """Per step of each configuration (rank 0): the global batch; model states (solid) and activations
    (dashed) measured, with the estimate for that step's batch (dotted); samples/s. A batch schedule moves
    the first and the last; model states stay put, activations follow the micro batch. Steps are the
    measured ones from 1 (``kit.lab.notebook.measured_steps``)."""
    steps = measured_steps(results, rank=0)
    fig = Figure(figsize=(11, 3.6), layout="constrained")
    batch_ax, memory_ax, speed_ax = fig.subplots(1, 3, sharex=True)
    groups = list(steps.groupby(["order", "label"], sort=True))
    for i, ((_, label), group) in enumerate(groups):
        style = {"marker": "os^v"[i % 4], "ms": 9 - 2 * (i % 4), "ls": "-" if i % 2 == 0 else "--"}
        line = batch_ax.step(group["step"], group["train_batch"], where="post", label=label, **style)[0]
        color = line.get_color()
        held = sum(group[f"measured_{part}"] for part in MODEL_STATES)
        predicted = sum(group[f"estimate_{part}"] for part in MODEL_STATES)
        memory_ax.plot(
            group["step"], held / MIB, color=color, marker=style["marker"], label=f"{label}: model states"
        )
        memory_ax.plot(group["step"], predicted / MIB, color="black", ls=":", lw=1)
        memory_ax.plot(
            group["step"], group["measured_activations"] / MIB, color=color, ls="--", marker=style["marker"],
            alpha=0.7, label=f"{label}: activations",
        )  # fmt: skip
        speed_ax.plot(group["step"], group["samples_per_s"], color=color, **style)
    seq = int(steps["tokens"].iloc[0] // steps["train_batch"].iloc[0]) if len(steps) else 0
    batch_ax.set_title("Global batch per step")
    batch_ax.set_ylabel("samples per optimizer step")
    batch_ax.legend(fontsize="small")
    memory_ax.set_title(f"Memory per {results.rank_word()}, rank 0 (estimate dotted)")
    memory_ax.set_ylabel("MiB")
    memory_ax.set_ylim(bottom=0)
    memory_ax.legend(fontsize="x-small")
    speed_ax.set_title("Throughput per step")
    speed_ax.set_ylabel(f"samples / s (tokens / s = x {seq})")
    for ax in (batch_ax, memory_ax, speed_ax):
        ax.set_xlabel("measured step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return fig


def predicted_vs_measured(table, title: str = "", band: float = 0.25) -> Figure:
    """Predicted against measured step time per configuration (rows of ``kit.run.calibrate.calibrate`` or
    of ``Tuned.table`` with ``label``, ``measured_s``, ``predicted_s``), log-log, with the y = x line and
    the +-``band`` region shaded; each point named with its label and error (predicted / measured - 1),
    with a bar from its fastest to its slowest measured step where the table has them (``measured_min_s``,
    ``measured_max_s``). Rows without both times (pruned, failed) are left out."""
    rows = table.dropna(subset=["measured_s", "predicted_s"])
    fig = Figure(figsize=(7, 4.8), layout="constrained")
    ax = fig.subplots()
    if rows.empty:
        empty(ax, "no configuration has both a measured and a predicted time")
        return fig
    times = rows.filter(["measured_s", "measured_min_s", "measured_max_s", "predicted_s"])
    low, high = times.min().min() / 1.4, times.max().max() * 1.4
    errors = rows.predicted_s / rows.measured_s - 1
    ms = (low * 1e3, high * 1e3)
    ax.fill_between(ms, [v * (1 - band) for v in ms], [v * (1 + band) for v in ms], color="0.92",
                    label=f"within {band:.0%}")  # fmt: skip
    ax.plot(ms, ms, color="black", lw=1, label="predicted = measured")
    if {"measured_min_s", "measured_max_s"} <= set(rows.columns):  # the run's fastest to slowest step
        spread = [
            (rows.measured_s - rows.measured_min_s) * 1e3,
            (rows.measured_max_s - rows.measured_s) * 1e3,
        ]
        ax.errorbar(rows.measured_s * 1e3, rows.predicted_s * 1e3, xerr=spread, fmt="none", ecolor="#4C72B0",
                    alpha=0.6, lw=1.2, capsize=3, zorder=3,
                    label="measured: fastest to slowest step")  # fmt: skip
    ax.scatter(rows.measured_s * 1e3, rows.predicted_s * 1e3, s=28, color="#4C72B0", zorder=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(ms)
    ax.set_ylim(ms)
    subs = (1.0, 2.0, 5.0) if high / low < 300 else (1.0,)  # 1-2-5 ticks within two decades or so
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(subs=subs))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.4g}"))
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("measured step time, ms (median)")
    ax.set_ylabel("predicted step time, ms")
    median = float(errors.abs().median())
    ax.set_title(title or f"{len(rows)} configurations, median |error| {median:.0%}")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize="small", loc="upper left")
    texts = [f"{row.label} ({error:+.0%})" for row, error in zip(rows.itertuples(), errors, strict=True)]
    xy = np.c_[rows.measured_s * 1e3, rows.predicted_s * 1e3]
    for (x, y), text, dy in zip(xy, texts, dodge(fig, ax, xy, texts), strict=True):
        box = {"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8}
        ax.annotate(
            text, (x, y), fontsize=8, xytext=(6, dy), textcoords="offset points", zorder=2.5, bbox=box
        )
    return fig


#: a label's offsets from its point (points, above then below, nearest first): ``dodge``'s choices
TRIES = (4, -12, 16, -24, 28, -36, 40, -48)


def dodge(fig: Figure, ax, xy, texts: list[str], size: float = 8) -> list[float]:
    """Vertical offsets (points) of labels set right of the points ``xy`` (data) so that no two overlap:
    from the lowest point up, each label takes the nearest offset above or below its point that covers no
    other label and no point."""
    fig.draw_without_rendering()  # the layout: the axes' final size
    at = ax.transData.transform(xy) * 72 / fig.dpi
    tall, offsets = size * 1.25, [0.0] * len(texts)
    placed = [(x - 4, x + 4, y - tall / 2) for x, y in at]  # the points themselves stay visible
    for i in np.argsort(at[:, 1], kind="stable"):
        left, right = at[i, 0] + 6, at[i, 0] + 6 + 0.55 * size * len(texts[i])
        free = (
            dy for dy in TRIES
            if not any(left < r and x < right and abs(at[i, 1] + dy - y) < tall for x, r, y in placed)
        )  # fmt: skip
        offsets[i] = next(free, TRIES[0])
        placed.append((left, right, at[i, 1] + offsets[i]))
    return offsets


def heartbeats(snapshot) -> Figure:
    """Memory (GPU allocated, or RSS on CPU) and samples/s of every rank over time, from the heartbeats
    of a ``kit.monitor.Snapshot``: one line per rank, seconds since the folder's first heartbeat."""
    history = snapshot.history_frame()
    fig = Figure(figsize=(11, 3.6), layout="constrained")
    memory_ax, speed_ax = fig.subplots(1, 2, sharex=True)
    if len(history):
        for (node, rank), group in history.groupby(["node", "rank"], sort=True):
            label = f"{node} rank {rank}"
            memory_ax.plot(
                group["seconds"], group["memory_bytes"].astype(float) / MIB, marker=".", label=label
            )
            speed = group.dropna(subset=["samples_per_s"])
            speed_ax.plot(speed["seconds"], speed["samples_per_s"].astype(float), marker=".", label=label)
    for ax, column in ((memory_ax, "memory_bytes"), (speed_ax, "samples_per_s")):
        if column not in history or history[column].isna().all():  # no 0..1 axis of fractional ticks
            ax.text(0.5, 0.5, NOTHING_MEASURED, transform=ax.transAxes, ha="center", color="#666")
            ax.set_yticks([])  # the x axis is shared: its ticks stay for the other side
    kinds = {row["memory"] for row in snapshot.ranks}
    memory_ax.set_title("Memory per rank" + (" (RSS: CPU ranks)" if kinds == {"rss"} else ""))
    memory_ax.set_ylabel("MiB")
    memory_ax.set_ylim(bottom=0)
    speed_ax.set_title("Throughput per rank")
    speed_ax.set_ylabel("samples / s")
    speed_ax.set_ylim(bottom=0)
    for ax in (memory_ax, speed_ax):
        ax.set_xlabel("seconds since the first heartbeat")
    memory_ax.legend(fontsize="x-small")
    return fig


def peak_timeline(
    timeline, measured: dict[str, int] | None = None, title: str = "", overhead: int = 0,
    capacity: tuple[str, int] | None = None, where: str = "on the GPU", allocator: int = 0,
) -> Figure:  # fmt: skip
    """The predicted peak of each phase of a step (``kit.estimate.peak.Timeline``, e.g. an
    ``Estimate.timeline``), stacked by category, with the measured peak of each phase beside it
    (``measured``: a record's ``measured.phases``, {phase: bytes}); the peak phase's label in bold.
    ``overhead`` (an estimate's ``peak_overhead``: CUDA context, NCCL buffers) tops each predicted bar and
    ``allocator`` (the caching allocator's replayed share, ``Reserved.cached``) the peak phase's, so that
    bar is the verdict's number (``Estimate.per_gpu_bytes``), and ``capacity`` (a GPU's name and memory in
    bytes) is drawn as a line: what the verdict compares, drawn.
    ``where`` the tensors live, for the axis (``"in a CPU rank"`` for a CPU rank's timeline)."""
    from kit.estimate.peak import CATEGORIES

    colors = {**COLORS, "temporaries": "#CCB974", ALLOCATOR: "#D9D9D9"}
    peak = timeline.peak_phase
    totals = {p: b + overhead + (allocator if p == peak else 0) for p, b in timeline.totals.items()}
    room = capacity[1] if capacity else 0
    unit, name = (GIB, "GiB") if max([*totals.values(), room]) >= GIB else (MIB, "MiB")
    phases = list(timeline.phases)
    width = 0.38 if measured else 0.6
    shift = width / 2 if measured else 0.0
    x = [i - shift for i in range(len(phases))]
    fig = Figure(figsize=(7.5, 4), layout="constrained")
    ax = fig.subplots()
    series = {c: [timeline.phases[p][c].bytes / unit for p in phases] for c in CATEGORIES}
    if allocator:
        series[ALLOCATOR] = [allocator / unit if p == peak else 0.0 for p in phases]
    if overhead:
        series[Component.OVERHEAD] = [overhead / unit] * len(phases)
    _stack(ax, x, series, colors=colors, width=width)
    tops = [totals[p] / unit for p in phases]
    for xi, top in zip(x, tops, strict=True):
        ax.annotate(
            f"{top:,.2f}",
            (xi, top),
            xytext=(0, 3),
            textcoords="offset points",
            ha="center",
            fontsize=8,
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5},  # readable over the verdict's line
        )
    if measured:
        got = [measured[p] / unit for p in phases]
        bars = ax.bar([i + shift for i in range(len(phases))], got, width=width, color="white",
                      edgecolor="black", hatch="//", label="measured")  # fmt: skip
        ax.bar_label(bars, fmt="{:,.2f}", fontsize=8, padding=2)
        tops += got
    if capacity:
        label = f"{capacity[0]}: {room / unit:,.2f} {name}"
        ax.axhline(room / unit, color="black", linestyle="--", linewidth=1.2, label=label)
        tops.append(room / unit)
    ax.set_xticks(range(len(phases)), phases)
    for tick in ax.get_xticklabels():
        if tick.get_text() == timeline.peak_phase:
            tick.set_fontweight("bold")
    ax.set_ylabel(f"{name} on the GPU" if overhead else f"{name} live {where}")
    what = "per GPU" if overhead else "of tensors"
    ax.set_title(title or f"peak per phase of a step: {peak}, {totals[peak] / unit:,.2f} {name} {what}")
    headroom(ax, tops, 1.15)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return fig
