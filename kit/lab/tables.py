"""The notebooks' small comparison tables, so that a cell only calls one: the ZeRO paper's model states
beside DeepSpeed's per stage (01), each ZeRO-3 collective and the step time of a setting beside its ZeRO++
variant (09), a batch schedule's steps side by side (04), the published runs beside the kit's predictions
and what it cannot express yet (11). Each is a DataFrame a test can read; 11's answer is one paragraph."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from kit.schema import Setup
from kit.units import GIB


def paper_vs_deepspeed(setup: Setup, stages: Sequence[int] = (1, 2, 3)) -> pd.DataFrame:
    """Per ZeRO stage of ``setup``: model states by the ZeRO paper's formula (``formula="zero-paper"``)
    beside DeepSpeed's (what it allocates) and the predicted peak per GPU with DeepSpeed, in GB (1e9 bytes,
    the paper's unit), one row per setting's label."""
    from kit.estimate import estimate

    rows = {}
    for stage in stages:
        s = setup.replace(zero={"stage": stage})
        faithful = estimate(s)
        rows[s.label] = {
            "paper model states GB": estimate(s, formula="zero-paper").model_states_bytes / 1e9,
            "deepspeed model states GB": faithful.model_states_bytes / 1e9,
            "deepspeed peak per GPU GB": faithful.per_gpu_bytes / 1e9,
        }
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("setting")


def collectives_table(setups: Sequence[Setup]) -> pd.DataFrame:
    """Each setting's collectives per optimizer step (``kit.estimate.comm.collectives``): scope (inside
    the node or across nodes), GiB per GPU and the formula."""
    from kit.estimate import comm

    rows = [
        {
            "setting": s.label,
            "collective": c.name,
            "scope": c.scope,
            "GiB": c.bytes / GIB,
            "formula": c.formula,
        }
        for s in setups
        for c in comm.collectives(s)
    ]
    return pd.DataFrame(rows)


def step_time_table(setups: Sequence[Setup]) -> pd.DataFrame:
    """Each setting's step time (``kit.estimate.perf.step_time``): the step, its compute, all its
    communication and the part of it the step waits for, in seconds."""
    from kit.estimate import perf

    rows = []
    for s in setups:
        t = perf.step_time(s)
        rows.append(
            {
                "setting": s.label,
                "step s": t.step_s,
                "compute s": t.compute.seconds,
                "comm s": t.comm.seconds,
                "exposed comm s": t.exposed_comm.seconds,
            }
        )
    return pd.DataFrame(rows).set_index("setting")


def schedules_side_by_side(results, labels: Sequence[str]) -> pd.DataFrame:
    """Rank 0's measured steps of the configurations ``labels`` of a sweep, one column group per value
    (global batch, grad accum, micro batch, loss) and one column per configuration under it."""
    steps = results.steps()
    steps = steps[steps["label"].isin(list(labels))]
    if steps.empty:
        raise ValueError(f"labels: none of {list(labels)} has an ok step in the sweep")
    return steps.pivot_table(
        index="step", columns="label", values=["train_batch", "grad_accum", "micro_batch", "loss"]
    )[["train_batch", "grad_accum", "micro_batch", "loss"]]


#: the measured quantities of ``kit.estimate.published`` as a reader names them
QUANTITY_TEXT = {"max_allocated": "max allocated", "max_reserved": "max reserved"}


def engine_name(setup: Setup) -> str:
    """What trained a run, as a legend names it: ``ZeRO-3``, ``ZeRO-3 + ZeRO++``, ``DDP``, ``FSDP2``."""
    from kit.rules import baseline_name

    z = setup.zero
    baseline = baseline_name(z.engine, z.stage)
    if baseline:
        return {"ddp": "DDP", "fsdp": "FSDP2"}.get(baseline, f"FSDP2 {baseline.removeprefix('fsdp-')}")
    return f"ZeRO-{z.stage}" + (" + ZeRO++" if z.zeropp else "")


def published_table(report) -> pd.DataFrame:
    """The published runs the kit compares (``kit.estimate.published.report``), one row per measured number
    (max allocated, max reserved: GiB per GPU and the error, predicted / measured - 1, as "+4.1 %") and per
    fit / OOM boundary (the run fit or ran out of memory at a micro batch; the kit's verdict with its bytes
    against the GPU's, and whether they agree); the row's confidence and the setup as the kit expresses it."""
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
        n = c.largest_micro_batch
        largest = f"the kit's largest mb {n}" if n else "the kit fits no micro batch"
        for k in c.checks:
            if k.problem == "precision":
                predicted = f"{k.predicted} (no {c.setup.zero.precision} on the GPU)"
            else:
                predicted = (
                    f"{k.predicted} ({k.predicted_bytes / GIB:.2f} of {k.capacity_bytes / GIB:.2f} GiB)"
                )
            rows.append(
                {
                    "id": c.id,
                    "check": f"fit at mb {k.micro_batch}" + (" (max)" if k.largest else ""),
                    "measured": k.measured,
                    "predicted": predicted,
                    "error": "agrees" if k.agrees else "DISAGREES",
                }
                | common
                | {"setup": f"{c.label}; {largest}"}
            )
    columns = ["id", "check", "measured", "predicted", "error", "confidence", "setup"]
    return pd.DataFrame(rows, columns=columns)


def unexpressed_table(report, by_reason: bool = False) -> pd.DataFrame:
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


def published_answer(report) -> str:
    """How far to trust the kit, in one paragraph built from ``report.summary()``: how close the tensor
    peak is to max allocated, how far max reserved is off, how many fit / OOM rows agree, how many rows
    the kit expresses, and how far a ZeRO-3 run's measured max reserved went past the verdict's peak per
    GPU."""
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
        parts.append(f"{fit['agree']} of {fit['rows']} fit / OOM rows agree{disagree}")
    counts = summary["tables"].get("memory")
    if counts:
        parts.append(f"{counts['expressed']} of {counts['rows']} published memory rows are expressed")
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
    return text[0].upper() + text[1:]


def _rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"
