"""The booking to make, from a ``kit.planning.plan.Plan``: the recommended setup for a goal (the cheapest
within a deadline, or the fastest within a budget), a short ranked list of alternatives with why each
differs from it, and which setups change the run's numerics.

qwZ (int8 weight all-gathers) and qgZ (int4 gradient reduce-scatters) change what the model computes,
and DeepSpeed implements both for CUDA only; fp16 needs a loss scaler and has 5 exponent bits where
bf16 keeps fp32's 8. The recommendation is the best setup that changes none of this beyond the
precision the user chose; a better one that does is shown as a flagged alternative, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from kit.fit import supports
from kit.gpus import gpu

#: what a plan can be asked for: the cheapest setup (within ``max_hours``), or the fastest (within a budget)
GOALS = ("cheapest", "fastest")
#: what each ZeRO++ quantization does to the numbers (``ZeroSettings.zeropp_label``'s words)
QUANTIZED = {"qwz": "qwZ all-gathers int8 weights", "qgz": "qgZ reduces int4 gradients"}
#: why fp16 is flagged, and what to use where the GPU has it
FP16 = "fp16: dynamic loss scaling, 5 exponent bits (bf16 keeps fp32's range where the GPU has it)"
#: alternatives listed beside the recommendation
ALTERNATIVES = 5


def numerics(row: pd.Series, precision: str) -> str:
    """Why ``row``'s setup computes other numbers than its plain bf16 / fp32 run ("" when it does not):
    qwZ, qgZ (CUDA only in DeepSpeed: said when the GPU is not NVIDIA's), fp16."""
    reasons = [what for key, what in QUANTIZED.items() if key in row.zeropp.split()]
    if reasons and gpu(row.gpu).vendor != "NVIDIA":
        reasons.append(f"DeepSpeed implements qwZ and qgZ for CUDA only, not on {row.gpu}")
    if precision == "fp16":
        reasons.append(
            FP16 + (f"; the {row.gpu} has bf16: plan --precision bf16" if supports(row.gpu, "bf16") else "")
        )
    return "; ".join(reasons)


def quantized(table: pd.DataFrame) -> pd.Series:
    """Whether each row quantizes weights or gradients (qwZ, qgZ): the numerics the plan itself changes."""
    return table.zeropp.str.contains("qwz|qgz")


def marked(table: pd.DataFrame) -> pd.Series:
    """Each row's label, "! " before those that quantize (qwZ, qgZ: ``NOTE``), two spaces before others."""
    return table.label.where(~quantized(table), "! " + table.label).where(
        quantized(table), "  " + table.label
    )


#: the footnote of a "!" label
NOTE = (
    "! qwZ / qgZ: int8 weights / int4 gradients change the numerics; DeepSpeed implements them for CUDA only"
)


def bookable(table: pd.DataFrame) -> pd.Series:
    """The rows a recommendation may be: DeepSpeed (PyTorch's engines have no ds_config), no qwZ / qgZ."""
    return (table.engine == "deepspeed") & ~quantized(table)


@dataclass
class Booking:
    """The answer to a plan: ``recommended`` (a Plan.table row, None when nothing fits the filters),
    ``alternatives`` (rows with ``why`` and ``numerics``, best first for the goal) and how it was asked."""

    goal: str
    max_hours: float | None
    budget: float | None
    recommended: pd.Series | None
    alternatives: pd.DataFrame
    fitting: int  # fitting setups within the filters
    fallback: str = ""  # why the recommendation is not bookable (only such setups fit), or ""


def _order(goal: str) -> list[str]:
    return ["cost_usd", "hours"] if goal == "cheapest" else ["hours", "cost_usd"]


def recommend(
    plan, goal: str = "cheapest", max_hours: float | None = None, budget: float | None = None
) -> Booking:
    """The best fitting setup for ``goal`` within ``max_hours`` and ``budget`` USD that DeepSpeed runs
    without quantizing (``bookable``; the best of any kind when none is), and up to ``ALTERNATIVES``
    others, ranked for the goal: the bookable Pareto front, each other GPU type's best, and the best
    PyTorch engine and the best quantized setup where they beat the recommendation; each confirmed
    (``Plan.settle``)."""
    if goal not in GOALS:
        raise ValueError(f"goal: choose one of {', '.join(GOALS)}, got {goal!r}")

    def booked(b: Booking) -> list[int]:
        return [] if b.recommended is None else [b.recommended.name, *b.alternatives.index]

    return plan.settle(lambda: _recommend(plan, goal, max_hours, budget), booked)


def _recommend(plan, goal: str, max_hours: float | None, budget: float | None) -> Booking:
    """``recommend`` on the rows as they stand (screened or confirmed)."""
    from kit.planning.plan import front

    fit = plan.fitting(max_hours, budget).sort_values(_order(goal))
    if fit.empty:
        return Booking(goal, max_hours, budget, None, fit.assign(why="", numerics=""), 0)
    ok = fit[bookable(fit)]
    pool = ok if len(ok) else fit
    best = pool.iloc[0]
    fallback = "" if len(ok) else "only PyTorch engines or qwZ / qgZ setups fit the limits"
    key = _order(goal)[0]
    others = [fit[quantized(fit)].head(1), fit[fit.engine != "deepspeed"].head(1)]
    others = [o for o in others if len(o) and o[key].iloc[0] < best[key]]  # only where they do better
    picked = pd.concat([front(pool), pool.drop_duplicates("gpu"), *others])
    picked = picked[~picked.index.duplicated()].drop(index=best.name, errors="ignore")
    picked = picked.drop_duplicates("label").sort_values(_order(goal))
    extra = pd.concat(others) if others else picked.head(0)
    top = picked.drop(index=extra.index).head(ALTERNATIVES - len(extra))
    top = pd.concat([top, extra]).sort_values(_order(goal))
    precision = plan.base.zero.precision
    top = top.assign(
        why=[why(row, best) for _, row in top.iterrows()],
        numerics=[numerics(row, precision) for _, row in top.iterrows()],
    )
    return Booking(goal, max_hours, budget, best, top, len(fit), fallback)


def why(row: pd.Series, best: pd.Series) -> str:
    """How ``row`` differs from ``best``: GPU type, GPU count, ZeRO variant, time, cost, numerics."""
    parts = []
    if row.gpu != best.gpu:
        parts.append(row.gpu)
    if row.gpus != best.gpus:
        ratio = row.gpus / best.gpus
        parts.append(f"{ratio:g}x the GPUs" if ratio > 1 else f"1/{1 / ratio:g} the GPUs")
    if variant(row) != variant(best):
        parts.append(variant(row))
    parts.append(_compare(row.hours / best.hours, "faster", "slower", "the time"))
    parts.append(_compare(row.cost_usd / best.cost_usd, "cheaper", "dearer", "the cost"))
    if any(key in row.zeropp.split() for key in QUANTIZED):
        parts.append("changes numerics (!)")
    if row.engine != "deepspeed":
        parts.append("PyTorch's engine: no ds_config")
    return ", ".join(p for p in parts if p)


def _compare(ratio: float, less: str, more: str, times: str) -> str:
    """``ratio`` of two times or costs in words: "40 % faster", "15 % dearer", "3.2x the time"."""
    if abs(ratio - 1) < 0.005:
        return ""
    if ratio < 1:
        return f"{(1 - ratio) * 100:.0f} % {less}"
    return f"{(ratio - 1) * 100:.0f} % {more}" if ratio < 1.995 else f"{ratio:.1f}x {times}"


def variant(row: pd.Series) -> str:
    """A row's ZeRO variant in words: "ZeRO-3 + hpZ8 + qwZ + qgZ", "FSDP grad-op", "ZeRO-2 + CPU
    optimizer"."""
    from kit.rules import Offload, baseline_name

    name = baseline_name(row.engine, int(row.stage))
    parts = [name.upper().replace("-GRAD-OP", " grad-op") if name else f"ZeRO-{int(row.stage)}"]
    if row.offload_optimizer != Offload.NONE:
        parts.append(f"{row.offload_optimizer.upper()} optimizer")
    if row.offload_param != Offload.NONE:
        parts.append(f"{row.offload_param.upper()} parameters")
    parts += [z.replace("hpz", "hpZ").replace("qwz", "qwZ").replace("qgz", "qgZ") for z in row.zeropp.split()]
    if row.checkpointing:
        parts.append("checkpointing")
    return " + ".join(parts)


def picks(plan, max_hours: float | None = None, budget: float | None = None) -> pd.DataFrame:
    """``Plan.best_per_gpu`` within the limits, one row (pick "cheapest and fastest") where a GPU type's
    cheapest setup is also its fastest."""
    table = plan.best_per_gpu(max_hours, budget)
    if table.empty:
        return table
    both = table.duplicated(["gpu", "label"], keep=False)
    return table.assign(pick=table.pick.where(~both, "cheapest and fastest")).drop_duplicates(
        ["gpu", "label"]
    )
