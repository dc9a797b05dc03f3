"""Tune by measuring: search ZeRO stage x offload x micro batch by real runs, in one launch.

``tune(setup)`` builds the candidates, prunes by ``kit.estimate`` what cannot fit the memory budget per
GPU (per rank on CPU ranks; those are reported with their estimate and never run), runs the rest with
``run_sweep`` (one launch, resumable: re-running the same ``sweep`` measures only what is missing) and
ranks them by measured throughput, the median samples/s over the measured steps of rank 0. With a calibration
(``kit.steptime.calibration``) every candidate also gets its predicted step time: the measured ones
beside their measured median (``error`` = predicted / measured - 1), the unmeasured ones (pruned or
failed) ranked after them by predicted samples/s; without one ``predicted_s`` is empty ("uncalibrated").

What a candidate is:

- ``offload="none"`` keeps everything on the GPU; ``offload="cpu"`` offloads whatever the stage can:
  the optimizer at stages 1-2, the optimizer **and** the parameters at stage 3 (ZeRO-Infinity's CPU
  variant, the most memory a stage can give back: ``kit.grid.variants``' level ``most``); stage 0
  cannot offload and gets no "cpu" candidate.
- the batch: ``keep="train_batch"`` (the default, as DeepSpeed's autotuner does with a list of micro
  batches) fixes the global batch at ``max(micro_batches) x grad_accum x ranks`` (grad_accum the
  setup's) and gives each micro batch the gradient accumulation that keeps it, so every candidate
  takes the same optimizer step; ``keep="grad_accum"`` keeps the setup's gradient accumulation and
  lets the global batch grow with the micro batch.
- the candidates run on one node of ``nprocs`` ranks (as ``run_sweep`` runs them) and are estimated as
  such, for the accelerator the ranks run on (``kit.run.launcher.ranks_accelerator()``): on GPUs the
  predicted peak per GPU, the caching allocator (replayed within the budget: ``kit.fit.within``), CUDA
  context and NCCL buffers included; on CPU ranks the
  estimate as it applies there (``Estimate.on_accelerator("cpu")``: the same tensors, none of a GPU's
  overheads), so a CPU budget is the bytes of tensors a rank may hold. The budget defaults to the
  setup's GPU memory (on CPU ranks give the budget you want to hold).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from kit import checkpointing, grid, trainable
from kit.fit import within
from kit.rules import Offload
from kit.run import launcher
from kit.run.calibrate import error
from kit.run.results import Results
from kit.run.sweep import config_id, on_ranks, run_sweep
from kit.schema import Setup
from kit.steptime.calibration import Calibration
from kit.units import GIB

OFFLOADS = (Offload.NONE, Offload.CPU)
KEEPS = ("train_batch", "grad_accum")
COLUMNS = [
    "label", "stage", "offload", "micro_batch", "grad_accum", "train_batch", "estimated_gib",
    "samples_per_s", "status", "rank", "predicted_s", "measured_s", "measured_min_s", "measured_max_s",
    "error",
]  # fmt: skip


@dataclass(frozen=True)
class Candidate:
    """One point of the search: its Setup (on the run's ranks), offload choice and estimated bytes (per
    GPU, or per rank on CPU ranks: ``candidates``' ``accelerator``)."""

    setup: Setup
    offload: str
    estimated_bytes: int
    #: its ``Estimate`` on the run's ranks (``kit.fit.within`` weighs it against the budget)
    estimate: Any = field(compare=False, repr=False)

    @property
    def label(self) -> str:
        return self.setup.label

    def fits(self, budget_bytes: int) -> bool:
        """Within ``budget_bytes`` by the fit rule (``kit.fit.within``: past its bytes, the allocator's
        replay within the budget)."""
        return within(self.estimate, budget_bytes).ok


@dataclass
class Tuned:
    """What ``tune`` found: ``best`` (the Setup that measured fastest, None if none ran), ``table`` (every
    candidate, pruned ones included, by rank), ``pruned`` ((label, estimated bytes, reason)), the records
    path, the sweep's ``results`` and the ``accelerator`` the ranks ran on (``"cuda"`` or ``"cpu"``: the
    budget and the estimates are per GPU, or per rank on CPU ranks)."""

    best: Setup | None
    table: pd.DataFrame
    pruned: list[tuple[str, int, str]]
    records: Path
    budget_bytes: int
    results: Results = field(repr=False)
    calibration: str = "uncalibrated"
    accelerator: str = "cuda"

    @property
    def device(self) -> str:
        """What the budget and the estimates are per: ``"GPU"``, or ``"rank"`` on CPU ranks."""
        return "rank" if self.accelerator == "cpu" else "GPU"

    def write_ds_config(self, path: str | Path, **options: Any) -> Path:
        """Write the best configuration's ds_config.json (``kit.ds_config.write_ds_config``)."""
        from kit.ds_config import write_ds_config

        if self.best is None:
            raise ValueError("best: no candidate ran successfully; see the table's status column")
        return write_ds_config(self.best, path, **options)

    def to_dict(self) -> dict:
        """The JSON of ``zerokit tune --json``."""
        best = None
        if self.best is not None:
            row = self.table[self.table["rank"] == 1].iloc[0]
            best = {"label": self.best.label, "samples_per_s": float(row["samples_per_s"])}
            best["setup"] = self.best.model_dump(mode="json")
        rows = self.table.astype(object).where(self.table.notna(), None).to_dict(orient="records")
        return {
            "records": str(self.records),
            "budget_bytes": self.budget_bytes,
            "calibration": self.calibration,
            "best": best,
            "candidates": rows,
            "pruned": [{"label": lab, "estimated_bytes": b, "reason": r} for lab, b, r in self.pruned],
        }


def candidates(
    setup: Setup,
    *,
    stages: tuple[int, ...] | list[int] = (0, 1, 2, 3),
    offloads: tuple[str, ...] | list[str] = OFFLOADS,
    micro_batches: tuple[int, ...] | list[int] = (1, 2, 4, 8),
    nprocs: int = 2,
    keep: str = "train_batch",
    nodes: int = 1,
    accelerator: str | None = None,
) -> list[Candidate]:
    """Every valid stage x offload x micro batch of ``setup`` on ``nodes`` nodes of ``nprocs`` ranks,
    estimated for ranks on ``accelerator`` (``"cuda"`` or ``"cpu"``; None: where the ranks will run,
    ``kit.run.launcher.ranks_accelerator()``): a candidate's bytes are its ``per_gpu_bytes`` of
    ``estimate(setup).on_accelerator(accelerator)``, on CPU ranks without a GPU's CUDA context, NCCL
    buffers and caching allocator.

    ValueError (one line naming the argument and the valid range) for an empty or invalid list.
    """
    from kit.estimate import estimate
    from kit.estimate.result import ACCELERATORS

    stages = _choices("stages", stages, (0, 1, 2, 3))
    offloads = _choices("offloads", offloads, OFFLOADS)
    if keep not in KEEPS:
        raise ValueError(f"keep: choose one of {', '.join(KEEPS)}, got {keep!r}")
    accelerator = accelerator or _ranks_accelerator()
    if accelerator not in ACCELERATORS:
        raise ValueError(f"accelerator: choose one of {', '.join(ACCELERATORS)}, got {accelerator!r}")
    if not isinstance(nprocs, int) or isinstance(nprocs, bool) or nprocs < 1:
        raise ValueError(f"nprocs: must be a whole number >= 1, got {nprocs!r}")
    micros = list(dict.fromkeys(micro_batches))
    if not micros or any(not isinstance(m, int) or isinstance(m, bool) or m < 1 for m in micros):
        raise ValueError(f"micro_batches: whole numbers >= 1, at least one, got {list(micro_batches)!r}")
    base = on_ranks(setup, nprocs, nodes)
    per_gpu = max(micros) * base.batch.grad_accum  # samples per rank per optimizer step (train_batch)
    if keep == "train_batch" and (odd := [m for m in micros if per_gpu % m]):
        raise ValueError(
            f"micro_batches: with keep='train_batch' each must divide max(micro_batches) x grad_accum = "
            f"{per_gpu}, got {odd}"
        )
    levels = ["none" if offload == Offload.NONE else "most" for offload in offloads]
    found = grid.variants(stages, offload=levels, precision=base.zero.precision)  # stage 0: no "cpu"
    out = []
    for variant, micro in itertools.product(found.accepted, micros):
        accum = per_gpu // micro if keep == "train_batch" else base.batch.grad_accum
        candidate = base.replace(zero=variant.zero, batch={"micro_batch": micro, "grad_accum": accum})
        offload = Offload.NONE if variant.offload_optimizer == Offload.NONE else Offload.CPU
        predicted = estimate(candidate).on_accelerator(accelerator)
        out.append(Candidate(candidate, offload, predicted.per_gpu_bytes, predicted))
    return out


def tune(
    setup: Setup,
    *,
    stages: tuple[int, ...] | list[int] = (0, 1, 2, 3),
    offloads: tuple[str, ...] | list[str] = OFFLOADS,
    micro_batches: tuple[int, ...] | list[int] = (1, 2, 4, 8),
    budget_bytes: int | None = None,
    keep: str = "train_batch",
    steps: int = 5,
    sweep: str = "tune",
    runs_dir: str | Path = "runs",
    nprocs: int = 2,
    progress: bool = True,
    calibration: Calibration | None = None,
    nodes=None,
    **options: Any,
) -> Tuned:
    """Measure every candidate that the estimate says fits ``budget_bytes`` per GPU (per rank on CPU
    ranks, by the estimate as it applies there: ``candidates``), in one launch, and rank them by median
    samples/s, on this machine or on ``nodes`` (``kit.run.local_nodes.Nodes``).
    ``options`` go to ``run_sweep`` (``warmup``, ``timeout_s``,
    ``launcher_name``, ``instrument``...). ValueError before anything launches when an argument is
    invalid or nothing fits the budget."""
    from kit.gpus import gpu

    if budget_bytes is None:
        budget_bytes = gpu(setup.cluster.gpu).memory_bytes
    if not isinstance(budget_bytes, int) or isinstance(budget_bytes, bool) or budget_bytes < 1:
        raise ValueError(f"budget_bytes: must be a whole number of bytes >= 1, got {budget_bytes!r}")
    accelerator = _ranks_accelerator()
    per = "rank" if accelerator == "cpu" else "GPU"
    found = candidates(
        setup, stages=stages, offloads=offloads, micro_batches=micro_batches, nprocs=nprocs, keep=keep,
        nodes=nodes.count if nodes else 1, accelerator=accelerator,
    )  # fmt: skip
    if not found:
        raise ValueError("stages: no valid candidate (offload needs stage >= 1); add a stage or offload none")
    kept = [c for c in found if c.fits(budget_bytes)]
    pruned = [
        (
            c.label,
            c.estimated_bytes,
            f"estimate {c.estimated_bytes / GIB:.3f} GiB > budget {budget_bytes / GIB:.3f} GiB",
        )
        for c in found
        if c not in kept
    ]
    # a checkpointing the engine cannot run (the op policy at DeepSpeed's stage 3), QLoRA: estimated, not run
    unrunnable = {
        id(c): checkpointing.engine_problem(c.setup.zero) or trainable.run_problem(c.setup.zero) for c in kept
    }
    pruned += [(c.label, c.estimated_bytes, problem) for c in kept if (problem := unrunnable[id(c)])]
    kept = [c for c in kept if not unrunnable[id(c)]]
    if not kept and any(unrunnable.values()):
        raise ValueError(next(problem for problem in unrunnable.values() if problem))
    if not kept:
        smallest = min(found, key=lambda c: c.estimated_bytes)
        raise ValueError(
            f"budget: no candidate fits {budget_bytes / GIB:.3f} GiB per {per}; the smallest estimate is "
            f"{smallest.estimated_bytes / GIB:.3f} GiB ({smallest.label})"
        )
    results = run_sweep(
        [c.setup for c in kept], sweep=sweep, runs_dir=runs_dir, nprocs=nprocs, steps=steps,
        progress=progress, nodes=nodes, **options,
    )  # fmt: skip
    table = _table(found, kept, results, calibration)
    best = None
    if (table["rank"] == 1).any():
        label = table.loc[table["rank"] == 1, "label"].iloc[0]
        best = next(c.setup for c in kept if c.label == label)
    label = calibration.label_for(*(c.setup for c in found)) if calibration else "uncalibrated"
    assert results.path is not None  # run_sweep loads its records file
    return Tuned(best, table, pruned, results.path, budget_bytes, results, label, accelerator)


def _table(
    found: list[Candidate], kept: list[Candidate], results: Results, calibration: Calibration | None = None
) -> pd.DataFrame:
    """One row per candidate: measured ones ranked by median samples/s (1 = fastest), then the failed,
    then the pruned; with a ``calibration`` the unmeasured ones by predicted samples/s within each."""
    from kit.steptime import calibrated

    summary = results.summary().set_index("config_id")
    ran = {id(c) for c in kept}
    rows = []
    for c in found:
        s = c.setup
        row: dict[str, str | float] = {
            "label": c.label,
            "stage": s.zero.stage,
            "offload": c.offload,
            "micro_batch": s.batch.micro_batch,
        }
        row.update(grad_accum=s.batch.grad_accum, train_batch=s.batch.train_batch)
        row["estimated_gib"] = round(c.estimated_bytes / GIB, 4)
        row["samples_per_s"], row["status"] = float("nan"), "pruned"
        row["measured_s"] = row["measured_min_s"] = row["measured_max_s"] = row["error"] = float("nan")
        predicted = calibrated.step_time(s, calibration=calibration).step_s if calibration else float("nan")
        row["predicted_s"] = predicted
        if id(c) in ran:
            cid = config_id(s)
            row["status"] = summary.loc[cid, "status"] if cid in summary.index else "missing"
            if row["status"] == "ok":
                row["samples_per_s"] = float(summary.loc[cid, "samples_per_s"])
                row["measured_s"] = measured = float(summary.loc[cid, "step_time_s"])
                row["measured_min_s"] = float(summary.loc[cid, "step_time_min_s"])
                row["measured_max_s"] = float(summary.loc[cid, "step_time_max_s"])
                row["error"] = error(predicted, measured)
        rows.append(row)
    table = pd.DataFrame(rows)
    ok = table["status"] == "ok"
    table["rank"] = pd.Series(pd.NA, index=table.index, dtype="Int64")
    table.loc[ok, "rank"] = table.loc[ok, "samples_per_s"].rank(ascending=False, method="first").astype(int)
    order = table["rank"].fillna(len(table) + 1).astype(int) + (table["status"] == "pruned").astype(int)
    predicted = (table["train_batch"] / table["predicted_s"]).fillna(0)  # NaN without a calibration
    table = table.assign(_order=order, _speed=-predicted).sort_values(["_order", "_speed"], kind="stable")
    return table.reset_index(drop=True)[COLUMNS]


def _ranks_accelerator() -> str:
    """``"cpu"`` where the ranks will run on CPU (``kit.run.launcher.ranks_accelerator()``), else ``"cuda"``:
    the estimate's two cases (another accelerator DeepSpeed names is estimated as a GPU)."""
    return "cpu" if launcher.ranks_accelerator() == "cpu" else "cuda"


def _choices(name: str, values, allowed: tuple) -> list:
    values = list(dict.fromkeys(values))
    wrong = [v for v in values if v not in allowed or isinstance(v, bool)]
    if not values or wrong:
        valid = ", ".join(map(str, allowed))
        raise ValueError(f"{name}: choose from {valid} (at least one), got {values!r}")
    return values
