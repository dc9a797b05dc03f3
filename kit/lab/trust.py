"""How far to trust the kit (notebook 11): published measurements of real GPU runs beside its predictions
(``kit.accuracy.published.report``), as tables a reader reads, two figures and one closing paragraph.

``table`` (each measured number and fit / OOM boundary beside the prediction), ``unexpressed`` (the runs
the kit cannot describe yet, and why), ``figure`` (predicted against measured, log-log), ``fits_figure``
(each boundary's predicted peak as a share of its GPU), ``steps_figure`` (each step time's error, by
GPU), ``answer`` (the paragraph from
``Report.summary()``). What it cannot show: the rows' own uncertainty beyond their confidence.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from kit.accuracy.published import QUANTITY_TEXT
from kit.accuracy.traces import QUANTITIES
from kit.lab.plots import dodge, empty
from kit.schema import Setup
from kit.units import GIB


def engine_name(setup: Setup) -> str:
    """What trained a run, as a legend names it: ``ZeRO-3``, ``ZeRO-3 + ZeRO++``, ``DDP``, ``FSDP2``."""
    from kit.rules import baseline_name

    z = setup.zero
    baseline = baseline_name(z.engine, z.stage)
    if baseline:
        return {"ddp": "DDP", "fsdp": "FSDP2"}.get(baseline, f"FSDP2 {baseline.removeprefix('fsdp-')}")
    return f"ZeRO-{z.stage}" + (" + ZeRO++" if z.zeropp else "")


def table(report) -> pd.DataFrame:
    """The published runs the kit compares (``kit.accuracy.published.report``), one row per measured number
    (max allocated, max reserved: GiB per GPU and the error, predicted / measured - 1, as "+4.1 %"; step
    time: seconds per optimizer step, converted from the row's metric) and per fit / OOM boundary (the run
    fit or ran out of memory at a micro batch; the kit's verdict with its bytes against the GPU's, and
    whether they agree); the row's confidence and the setup as the kit expresses it."""
    rows = []
    for c in report.comparisons:
        if not c.expressed:
            continue
        common = {"confidence": c.row["confidence"], "setup": c.label}
        for v in c.values:
            rows.append(
                {
                    "id": c.id,
                    "check": QUANTITY_TEXT[v.quantity],
                    "measured": f"{v.measured_bytes / GIB:.2f} GiB",
                    "predicted": f"{v.predicted_bytes / GIB:.2f} GiB",
                    "error": f"{100 * v.error:+.1f} %",
                }
                | common
            )
        for k in c.checks:
            rows.append(
                {
                    "id": c.id,
                    "check": f"fit at mb {k.micro_batch}" + (" (max)" if k.largest else ""),
                    "measured": k.measured,
                    "predicted": k.predicted_text(c.setup.zero.precision),
                    "error": k.verdict_text(),
                }
                | common
                | {"setup": f"{c.label}; {c.fit_text()}"}
            )
        for t in c.timings:
            rows.append(
                {
                    "id": c.id,
                    "check": "step time",
                    "measured": f"{t.measured_s:.4g} s",
                    "predicted": f"{t.predicted_s:.4g} s",
                    "error": f"{100 * t.error:+.1f} %",
                }
                | common
            )
    columns = ["id", "check", "measured", "predicted", "error", "confidence", "setup"]
    return pd.DataFrame(rows, columns=columns)


def unexpressed(report, by_reason: bool = False) -> pd.DataFrame:
    """The published rows the kit cannot express yet (``Comparison.reason``): id, table, model and the
    reason, grouped by reason, the most frequent first (then by reason, then by id); ``by_reason``: one row
    per reason with its count and ids instead."""
    refused = [c for c in report.comparisons if not c.expressed]
    counts: dict[str, int] = {}
    for c in refused:
        counts[c.reason] = counts.get(c.reason, 0) + 1
    refused.sort(key=lambda c: (-counts[c.reason], c.reason, c.id))
    if by_reason:
        ids: dict[str, list[str]] = {}
        for c in refused:
            ids.setdefault(c.reason, []).append(c.id)
        rows = [{"reason": r, "rows": len(found), "ids": ", ".join(found)} for r, found in ids.items()]
        return pd.DataFrame(rows, columns=["reason", "rows", "ids"])
    rows = [
        {"id": c.id, "table": c.row["table"], "model": c.row["model"], "reason": c.reason} for c in refused
    ]
    return pd.DataFrame(rows, columns=["id", "table", "model", "reason"])


def reference_table(configs) -> pd.DataFrame:
    """The kit's own runs on a GPU (``kit.accuracy.reference.configurations``), one row per configuration
    (its model and label): max allocated, max reserved (GiB) and the median step (s), each "measured /
    predicted" and its error ("not compared" where no step time is predicted: ``Configuration.unpredicted``
    says why). The GPU is the notebook's text (one per sweep), not a column: the table stays narrow."""
    rows = []
    for c in configs:
        row = {"run": f"{c.setup.model.name} {c.label}"}
        for quantity, name in (("max_allocated", "max allocated"), ("max_reserved", "max reserved")):
            measured, predicted = c.measured[quantity] / GIB, c.predicted[quantity] / GIB
            row[f"{name}, GiB"] = f"{measured:.2f} / {predicted:.2f} ({100 * c.error(quantity):+.1f} %)"
        step = c.error("step_time")
        row["step, s"] = (
            f"{c.measured['step_time']:.3f} / {c.predicted['step_time']:.3f} ({100 * step:+.1f} %)"
            if step is not None
            else f"{c.measured['step_time']:.3f} (not compared)"
        )
        rows.append(row)
    return pd.DataFrame(rows)


def reference_heading(configs) -> str:
    """What ``reference_table`` shows ran on: "9 runs on NVIDIA H200 (torch ..., DeepSpeed ...)"."""
    if not configs:
        return "No runs on a GPU yet: make gpu-reference GPUS=N on a machine with GPUs writes them."
    devices = sorted({f"{c.device} ({c.versions})" for c in configs})
    return f"{len(configs)} runs on {', '.join(devices)}; each cell measured / predicted (error):"


def traces_table(runs) -> pd.DataFrame:
    """The allocator traces (``kit.accuracy.traces.runs``), one row per run: its ranks, then max allocated
    and max reserved (GiB), each "measured / the allocator's replay of the recorded allocations / the kit's
    estimate" and the estimate's error."""
    rows = [
        {"run": r.name, "ranks": r.ranks, **{f"{q.replace('_', ' ')}, GiB": r.cell(q) for q in QUANTITIES}}
        for r in runs
    ]
    return pd.DataFrame(rows)


def answer(report, own=()) -> str:
    """How far to trust the kit, in one paragraph built from ``report.summary()``: how close the tensor
    peak is to max allocated, how far max reserved is off, how many fit / OOM rows agree, how many rows
    the kit expresses, and how far a ZeRO-3 run's measured max reserved went past the verdict's peak per
    GPU; with ``own`` (``kit.accuracy.reference.configurations()``), how the kit did on its own GPU runs."""
    from kit.estimate import estimate
    from kit.fit import estimate_fit

    summary = report.summary()
    parts = []
    allocated = summary["quantities"].get("max_allocated")
    if allocated:
        parts.append(
            f"the tensor peak is within {100 * abs(allocated['worst_error']):.1f} % of max allocated on "
            f"{_rows(allocated['rows'])} (median {100 * allocated['median_abs_error']:.1f} %)"
        )
    reserved = summary["quantities"].get("max_reserved")
    if reserved:
        side = "under" if reserved["worst_error"] < 0 else "over"
        parts.append(
            f"max reserved is {side}-predicted by {100 * reserved['median_abs_error']:.1f} % (median; worst "
            f"{100 * reserved['worst_error']:+.1f} %, {reserved['worst_id']})"
        )
    fit = summary["fit"]
    if fit["rows"]:
        disagree = f" (not {', '.join(fit['disagree'])})" if fit["disagree"] else ""
        held = (
            f", {len(fit['open'])} hang on lengths their runs did not publish ({', '.join(fit['open'])})"
            if fit["open"]
            else ""
        )
        parts.append(f"{fit['agree']} of {fit['rows']} fit / OOM rows agree{disagree}{held}")
    counts = summary["tables"].get("memory")
    if counts:
        parts.append(f"{counts['expressed']} of {counts['rows']} published memory rows are expressed")
    step = summary.get("step_time")
    if step:
        sets = step["stage_sets"]
        right = sum(g["agrees"] for g in sets)
        parts.append(
            f"step times are off by a median {100 * step['median_abs_error']:.0f} % on {_rows(step['rows'])} "
            f"({step['within_25']} within 25 %, {step['within_2x']} within 2x; worst "
            f"{100 * step['worst_error']:+.0f} %, {step['worst_id']}), the stages ranked right on {right} of "
            f"{len(sets)} sets"
        )
    if not parts:
        return "No published row of this selection is compared."
    text = "; ".join(parts) + "."
    zero3 = [c for c in report.comparisons if c.values and engine_name(c.setup).startswith("ZeRO-3")]
    over = []  # (measured over the verdict's number, id) of each ZeRO-3 row
    for c in zero3:
        need = estimate_fit(estimate(c.setup)).need
        over.append((max(v.measured_bytes for v in c.values) / need, c.id))
    if over:
        ratio, worst = max(over)
        if ratio > 1:
            text += (
                f" At ZeRO-3 the published max reserved was up to {ratio:.2f}x the verdict's peak per GPU "
                f"({worst}): more than the replayed allocator explains, so a ZeRO-3 booking near the GPU's "
                "memory is a guess (the allocator frees its cache before it fails: what a run needs lies "
                "between max allocated and max reserved)."
            )
        else:
            text += " On the ZeRO-3 rows the verdict's peak per GPU covered every measured number."
    if own:
        from kit.accuracy.reference import summary as own_summary

        q = own_summary(list(own))
        a, r = q["max_allocated"], q["max_reserved"]
        text += (
            f" On the kit's own runs on {own[0].device} ({len(own)} configurations) the tensor peak is a "
            f"median {100 * a['median_abs_error']:.1f} % from max allocated and the replayed reserve "
            f"{100 * r['median_abs_error']:.1f} % from max reserved"
        )
        step = q.get("step_time")
        if step:
            median, worst = 100 * step["median_abs_error"], 100 * step["worst_error"]
            text += f"; the step time {median:.0f} % (worst {worst:+.0f} %, {step['worst']})"
        text += "."
    return text[0].upper() + text[1:]


def _rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


#: each engine's marker in ``figure`` (``kit.lab.tables.engine_name``)
ENGINE_MARKERS = {
    "ZeRO-0": "s", "ZeRO-1": "^", "ZeRO-2": "D", "ZeRO-3": "o", "ZeRO-3 + ZeRO++": "p", "DDP": "P",
    "FSDP2": "X", "FSDP2 grad-op": "v",
}  # fmt: skip
#: each measured quantity's colour in ``figure``
QUANTITY_COLORS = {"max_allocated": "#4C72B0", "max_reserved": "#DD8452"}
#: a fit / OOM verdict's colour beside its row (``Check.verdict``)
VERDICT_COLORS = {"agrees": "black", "disagrees": "#C62828", "open": "#8D6E00"}


def figure(report, band: float = 0.10) -> Figure:
    """Predicted against measured GiB per GPU of every number a published run measured and the kit
    predicts (``kit.accuracy.published.report``: max allocated beside the peak of live tensors, max reserved
    beside the reserved bytes), log-log, with the y = x line and the +-``band`` region shaded. A point's
    colour is its quantity, its shape the engine (ZeRO stage, DDP, FSDP2), filled for a row of high
    confidence and hollow for medium or low; each is named by its row id, quantity and error
    (predicted / measured - 1), the names set apart by ``kit.lab.plots.dodge``; the title counts the rows
    drawn."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    points = [(c, v) for c in report.comparisons for v in c.values]
    rows = len({c.id for c, _ in points})
    fig = Figure(figsize=(9, 5.2), layout="constrained")
    ax = fig.subplots()
    ax.set_title(
        f"Predicted vs measured per GPU: {len(points)} numbers from {rows} of {len(report.comparisons)} "
        "published rows",
        loc="left",
    )
    if not points:
        empty(ax, "no row of this report has a number the kit predicts")
        return fig
    xy = np.array([[v.measured_bytes / GIB, v.predicted_bytes / GIB] for _, v in points])
    texts = [f"{c.id} {QUANTITY_TEXT[v.quantity]} ({100 * v.error:+.1f} %)" for c, v in points]
    engines = [engine_name(c.setup) for c, _ in points]
    predicted_as = {q: " / ".join(sorted({v.predicted_as for _, v in points if v.quantity == q}))
                    for q in QUANTITY_COLORS if any(v.quantity == q for _, v in points)}  # fmt: skip

    def mark(label, marker="o", color="0.35", face=None):
        return Line2D([], [], ls="none", marker=marker, ms=7, mew=1.5, mec=color,
                      mfc=color if face is None else face, label=label)  # fmt: skip

    handles = [
        Line2D([], [], color="black", lw=1, label="predicted = measured"),
        Patch(color="0.9", label=f"within {100 * band:.0f} %"),
        *(mark(f"{QUANTITY_TEXT[q]} vs {by}", color=QUANTITY_COLORS[q]) for q, by in predicted_as.items()),
        *(mark(e, ENGINE_MARKERS.get(e, "*")) for e in sorted(set(engines), key=list(ENGINE_MARKERS).index)),
        mark("high confidence (filled)"),
        mark("medium / low confidence", face="white"),
    ]
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    low, high = xy.min() / 1.6, xy.max() * 1.6
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))  # 1-2-5 ticks: the points span a decade
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.4g}"))
        axis.set_minor_formatter(NullFormatter())
    ax.grid(True, which="major", alpha=0.3)
    ax.set_xlabel("measured GiB per GPU (torch.cuda.max_memory_allocated / _reserved)")
    ax.set_ylabel("predicted GiB per GPU (the kit)")
    # room right of the points for their names: a name ``width`` points long right of a point fits when the
    # log axis spans log(x / low) / (1 - width / the axes' width) or more (twice: the ticks move the axes)
    widths = [6 + 0.6 * 8 * len(t) + 4 for t in texts]  # a little wider than ``dodge``'s estimate
    for _ in range(2):
        fig.draw_without_rendering()
        side = ax.bbox.width * 72 / fig.dpi
        needs = [np.log(x / low) / (1 - w / side) for (x, _), w in zip(xy, widths, strict=True)]
        span = max(np.log(xy.max() * 1.6 / low), *needs)
        high = low * float(np.exp(span))
        ax.set_xlim(low, high)
        ax.set_ylim(low, high)
    ends = [low, high]
    ax.fill_between(ends, [v * (1 - band) for v in ends], [v * (1 + band) for v in ends], color="0.9",
                    lw=0, zorder=1)  # fmt: skip
    ax.plot(ends, ends, color="black", lw=1, zorder=1.5)
    for (c, v), (x, y), engine in zip(points, xy, engines, strict=True):
        color = QUANTITY_COLORS[v.quantity]
        filled = c.row["confidence"] == "high"
        ax.scatter([x], [y], s=56, marker=ENGINE_MARKERS.get(engine, "*"), edgecolors=color, linewidths=1.5,
                   facecolors=color if filled else "white", zorder=3, gid=f"{c.id} {v.quantity}")  # fmt: skip
    for (x, y), text, dy in zip(xy, texts, dodge(fig, ax, xy, texts), strict=True):
        box = {"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8}
        ax.annotate(
            text, (x, y), fontsize=8, xytext=(6, dy), textcoords="offset points", zorder=2.5, bbox=box
        )
    return fig


def fits_figure(report) -> Figure:
    """The fit / OOM boundaries of published runs beside the kit's verdict (``kit.fit.estimate_fit``): per
    boundary the predicted peak per GPU as a share of the GPU's memory (the verdict's capacity), marked by
    whether the run fit (a green dot) or ran out of memory (a red cross), with a line at 100 %: a dot left
    of it and a cross right of it agree. Beside each row, whether the verdict agrees; a padded run's open
    check (``Check.verdict``) is drawn at the script's maximum length, its bound beside it in amber."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    checks = [(c, k) for c in report.comparisons for k in c.checks]
    rows = len({c.id for c, _ in checks})
    agree = sum(k.verdict == "agrees" for _, k in checks)
    held = sum(k.verdict == "open" for _, k in checks)
    fig = Figure(figsize=(8.6, 1.8 + 0.5 * max(len(checks), 2)), layout="constrained")
    ax = fig.subplots()
    ax.set_title(
        f"Fit or OOM on {rows} of {len(report.comparisons)} published rows: {agree} of {len(checks)} "
        "verdicts agree" + (f", {held} open" if held else "")
    )
    if not checks:
        empty(ax, "no row of this report has a fit / OOM boundary")
        return fig
    shares = [100 * k.predicted_bytes / k.capacity_bytes for _, k in checks]
    right = max(125.0, max(shares) * 1.12)
    ax.axvspan(0, 100, color="#e6f2e6", lw=0, zorder=0)
    ax.axvspan(100, right, color="#f6e3e3", lw=0, zorder=0)
    ax.axvline(100, color="black", ls="--", lw=1.2, zorder=1)
    labels = []
    for y, ((c, k), share) in enumerate(zip(checks, shares, strict=True)):
        fit = k.measured == "fits"
        ax.scatter([share], [y], s=70, marker="o" if fit else "X", color="#2E7D32" if fit else "#C62828",
                   edgecolors="white", linewidths=0.8, zorder=3, gid=f"{c.id} mb{k.micro_batch}")  # fmt: skip
        setup = c.setup.replace(batch={"micro_batch": k.micro_batch})
        cluster = setup.cluster
        labels.append(
            f"{c.id} {setup.model.name} ({c.row['confidence']})\n{setup.label}, "
            f"{cluster.world_size} x {cluster.gpu}"
        )
        if k.verdict == "open":
            verdict = f"open: fits up to {k.longest_fitting} of {setup.batch.seq_len} tokens"
        elif k.problem == "precision":
            verdict = f"{k.verdict_text()}: no {setup.zero.precision} on the GPU"
        else:
            need, capacity = k.predicted_bytes / GIB, k.capacity_bytes / GIB
            verdict = f"{k.verdict_text()}: {need:,.2f} of {capacity:,.2f} GiB"
        ax.annotate(verdict, (1.0, y), xycoords=("axes fraction", "data"), xytext=(6, 0),
                    textcoords="offset points", va="center", fontsize=8, color=VERDICT_COLORS[k.verdict],
                    fontweight="bold" if k.verdict == "disagrees" else "normal")  # fmt: skip
    ax.set_yticks(range(len(checks)), labels, fontsize=8)
    ax.set_ylim(len(checks) - 0.5, -0.5)  # the first row on top
    ax.set_xlim(0, right)
    ax.xaxis.set_major_locator(MaxNLocator(6, steps=[1, 2, 2.5, 5, 10]))  # labels apart at any range
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f} %"))
    ax.set_xlabel("the kit's predicted peak per GPU, % of the GPU's memory (the fit rule's capacity)")
    handles = [
        Line2D([], [], ls="none", marker="o", ms=8, color="#2E7D32", mec="white", label="the run fit"),
        Line2D(
            [],
            [],
            ls="none",
            marker="X",
            ms=8,
            color="#C62828",
            mec="white",
            label="the run ran out of memory",
        ),
        Patch(color="#e6f2e6", label="the kit says: fits"),
        Patch(color="#f6e3e3", label="the kit says: OOM"),
        Line2D([], [], color="black", ls="--", lw=1.2, label="100 %: the GPU's memory"),
    ]
    fig.legend(handles=handles, fontsize=8, loc="outside lower center", ncols=3, frameon=False)
    return fig


#: each GPU family's colour in ``steps_figure``
GPU_COLORS = {"V100": "#8172B3", "A100": "#4C72B0", "H100": "#DD8452", "H200": "#C44E52"}


def steps_figure(report, band: float = 0.25) -> Figure:
    """Each published step time beside the kit's: one bar per row, predicted / measured - 1, coloured by
    the GPU, with the +-``band`` region shaded and dashed lines where the prediction is half or twice the
    measurement; each row named by id, model, engine and GPUs, its error at the bar's end."""
    from matplotlib.patches import Patch

    timed = [(c, t) for c in report.comparisons for t in c.timings]
    fig = Figure(figsize=(9, 1.6 + 0.32 * max(len(timed), 2)), layout="constrained")
    ax = fig.subplots()
    ax.set_title(f"Step time: {len(timed)} of the {len(report.comparisons)} published rows")
    if not timed:
        empty(ax, "no row of this report has a step time the kit predicts")
        return fig
    errors = [100 * t.error for _, t in timed]
    left, right = min(-60.0, min(errors) - 20), max(100 * band + 15, max(errors) + 25)
    ax.axvspan(-100 * band, 100 * band, color="0.9", lw=0, zorder=0)
    for x in (-50, 100):  # half and twice the measured time
        if left < x < right:
            ax.axvline(x, color="0.4", ls="--", lw=1, zorder=1)
    ax.axvline(0, color="black", lw=1, zorder=1)
    labels = []
    for y, ((c, _), error) in enumerate(zip(timed, errors, strict=True)):
        color = next((v for g, v in GPU_COLORS.items() if g in c.setup.cluster.gpu), "0.5")
        ax.barh([y], [error], color=color, height=0.6, zorder=2, gid=c.id)
        side = 1 if error >= 0 else -1
        ax.annotate(f"{error:+.0f} %", (error, y), xytext=(4 * side, 0), textcoords="offset points",
                    ha="left" if side > 0 else "right", va="center", fontsize=8)  # fmt: skip
        cluster = c.setup.cluster
        labels.append(
            f"{c.id} {c.setup.model.name}, {engine_name(c.setup)}, {cluster.world_size} x {cluster.gpu}"
        )
    ax.set_yticks(range(len(timed)), labels, fontsize=8)
    ax.set_ylim(len(timed) - 0.5, -0.5)
    ax.set_xlim(left, right)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:+,.0f} %"))
    ax.set_xlabel("predicted / measured step time - 1 (left: the kit is too fast)")
    families = [g for g in GPU_COLORS if any(g in c.setup.cluster.gpu for c, _ in timed)]
    handles = [Patch(color=GPU_COLORS[g], label=g) for g in families]
    handles += [Patch(color="0.9", label=f"within {100 * band:.0f} %")]
    fig.legend(handles=handles, fontsize=8, loc="outside lower center", ncols=len(handles), frameon=False)
    return fig
