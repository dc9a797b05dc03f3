"""What makes one setup fit its GPU: the smallest changes (``make_it_fit``), each estimated and timed.

One knob at a time (checkpointing, a smaller micro batch with the global batch kept, offload, a higher
stage, sequence parallelism, more nodes), then pairs of them when none alone fits; each verdict is
``kit.fit.estimate_fit``'s with the plan's headroom (``kit.planning.plan.DEFAULT_HEADROOM``).
"""

from __future__ import annotations

import itertools

import pandas as pd

from kit import batch as batch_math
from kit.fit import estimate_fit
from kit.planning.plan import DEFAULT_HEADROOM
from kit.rules import Offload
from kit.schema import Setup
from kit.steptime import perf
from kit.units import GIB


def make_it_fit(
    setup: Setup,
    *,
    headroom: float = DEFAULT_HEADROOM,
    max_nodes: int = 64,
    assumptions: perf.Assumptions | None = None,
    fabric: str | None = None,
) -> pd.DataFrame:
    """The smallest changes that make ``setup`` fit its GPU with ``headroom``, each with its new memory
    and predicted step time, fastest first: checkpointing, a smaller micro batch with more gradient
    accumulation (the global batch kept), offload, a higher stage, more nodes. When no single change
    fits, pairs of them. Empty when ``setup`` already fits.
    """
    from kit.estimate import estimate

    if estimate_fit(estimate(setup), headroom=headroom).ok:
        return pd.DataFrame()
    singles = _single_changes(setup, max_nodes)
    rows = [r for r in (_tried(setup, [c], headroom, assumptions, fabric) for c in singles) if r]
    if not any(r["fits"] for r in rows):
        pairs = itertools.combinations(singles, 2)
        rows += [r for r in (_tried(setup, list(p), headroom, assumptions, fabric) for p in pairs) if r]
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    table = table[table.fits].drop_duplicates("label")
    return table.sort_values(["changes", "step_s"]).reset_index(drop=True)


def _single_changes(setup: Setup, max_nodes: int) -> list[tuple[str, dict]]:
    """(what, Setup.replace changes) for each one-knob change that could lower memory per GPU."""
    z, b, c = setup.zero, setup.batch, setup.cluster
    out: list[tuple[str, dict]] = []
    if not z.activation_checkpointing:
        out.append(("activation checkpointing on", {"zero": {"activation_checkpointing": True}}))
    for d in batch_math.decompositions(b.train_batch, setup.dp):
        if d.micro_batch < b.micro_batch:
            out.append(
                (
                    f"micro batch {d.micro_batch} x grad accum {d.grad_accum} (global {b.train_batch} kept)",
                    {"batch": {"micro_batch": d.micro_batch, "grad_accum": d.grad_accum}},
                )
            )
    if z.stage > 0 and z.offload_optimizer is Offload.NONE:
        out.append(("offload the optimizer to CPU", {"zero": {"offload_optimizer": Offload.CPU}}))
    if z.stage == 3 and z.offload_param is Offload.NONE:
        out.append(("offload the parameters to CPU", {"zero": {"offload_param": Offload.CPU}}))
    for stage in range(z.stage + 1, 4):
        out.append((f"ZeRO stage {stage}", {"zero": {"stage": stage}}))
    sp = z.sequence_parallel_size
    for more in (2 * sp, 4 * sp):  # sequence parallelism: fewer tokens per GPU, the global batch kept
        groups = c.world_size // more if c.world_size % more == 0 else 0
        if groups and b.train_batch % (b.micro_batch * groups) == 0:
            change = {
                "zero": {"sequence_parallel_size": more},
                "batch": {"grad_accum": b.train_batch // (b.micro_batch * groups)},
            }
            out.append((f"sequence parallelism over {more} GPUs (global {b.train_batch} kept)", change))
    for nodes in range(c.nodes + 1, max_nodes + 1):
        dp = nodes * c.gpus_per_node // sp
        if b.train_batch % (b.micro_batch * dp) == 0:  # keep the global batch
            change = {
                "cluster": {"nodes": nodes},
                "batch": {"grad_accum": b.train_batch // (b.micro_batch * dp)},
            }
            out.append((f"{nodes} nodes ({dp} GPUs, global batch {b.train_batch} kept)", change))
            break
    return out


def _tried(setup, changes, headroom, assumptions, fabric) -> dict | None:
    """The row for ``setup`` with ``changes`` applied (None when they conflict, e.g. offload at stage 0)."""
    from kit.estimate import estimate

    merged: dict[str, dict] = {}
    for _, change in changes:
        for section, values in change.items():
            merged[section] = {**merged.get(section, {}), **values}
    try:
        candidate = setup.replace(**merged)
        t = perf.step_time(candidate, perf.hardware(candidate, fabric), assumptions)
    except ValueError:
        return None
    verdict = estimate_fit(estimate(candidate), headroom=headroom)
    return {
        "change": " + ".join(what for what, _ in changes),
        "changes": len(changes),
        "per_gpu_gib": verdict.need / GIB,  # only the rows that fit are kept
        "fits": verdict.ok,
        "flushes": verdict.flushes,
        "step_s": t.step_s,
        "tokens_per_s": t.tokens_per_s,
        "label": candidate.label + f" {candidate.cluster.nodes}x{candidate.cluster.gpus_per_node}",
    }
