"""Published measurements of real GPU runs beside the kit's predictions: the test set of its GPU-side
numbers (``data/published/``, copied unchanged from ``../shared/published/``; its README says how to read
a row).

``memory.jsonl`` rows are numbers (``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` per GPU)
or boundaries (a setting that fit, or ran out of memory). ``compare`` estimates a row the kit can express
(``published_rows.express``) and sets the prediction beside the measurement:
- max allocated <- ``Estimate.peak_tensor_bytes`` (the step's largest phase of live device tensors);
- max reserved <- ``Estimate.reserved_bytes`` where the estimate has one, else ``peak_per_gpu_bytes`` (the
  peak plus the CUDA context, NCCL's buffers and the allocator's slack), and the row says which;
- fits / OOM at a micro batch <- ``kit.fit.estimate_fit`` on the row's GPU (the verdict's one rule), with
  the largest micro batch the kit finds fitting beside it ("fits at BS=N (max)" is checked as: fits at N).
A reading that is neither (nvidia-smi's memory in use, what PyTorch had allocated when it ran out) is
shown beside the verdict, never compared: the allocator's cache fills a card whatever the run needs.
``throughput.jsonl`` rows (``kind == "step_time"``) are expressed the same way (FSDP1 taken as FSDP2:
the same bytes in the same calls) and timed by ``kit.accuracy.published_steps`` (``Comparison.timings``).

How a row maps to a Setup: ``kit.accuracy.published_rows``. A run whose script pads each batch to its
longest sample has only a maximum length: where it fit and the kit says OOM there, the check is open, with
the longest sequence the kit fits beside it (``Check.longest_fitting``).

Units: Megatron's ``report_memory`` prints "MB" of 1024 x 1024 bytes (MiB); nvidia-smi's MiB and PyTorch's
GiB are binary; "GB" with no tool named is taken as 1e9 bytes.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, replace
from typing import Any

from kit.accuracy import published_steps
from kit.accuracy.published_rows import PADDED_STEP, TABLES, express, kind, rows
from kit.accuracy.published_steps import Timing
from kit.estimate import trace
from kit.estimate.memory import estimate
from kit.fit import estimate_fit, shown_bytes
from kit.planning.boundary import largest_micro_batch, longest_sequence
from kit.schema import Setup
from kit.units import GIB, MIB

#: what a row compares: a number of bytes, a fit / OOM boundary, a step time
KINDS = ("memory", "fit", "step_time")
#: the memory quantities a number row measures
QUANTITIES = ("max_allocated", "max_reserved")
#: each quantity as a reader names it
QUANTITY_TEXT = {"max_allocated": "max allocated", "max_reserved": "max reserved"}
#: the largest micro batch ``largest_micro_batch`` tries
MAX_MICRO_BATCH = 4096

#: units of ``value`` (``_bytes`` reads Megatron's "MB")
UNITS = {"GiB": GIB, "MiB": MIB, "GB": 10**9}


def _bytes(row: dict[str, Any], value: float, unit: str) -> int:
    """``value`` in ``unit`` as bytes; Megatron's ``report_memory`` "MB" are MiB (it divides by 1024**2)."""
    if unit == "MB":
        return round(value * (MIB if "report_memory" in row["measured_what"] else 10**6))
    return round(value * UNITS[unit])


def _quantity(row: dict[str, Any]) -> str | None:
    what = row["measured_what"]
    if "max_memory_allocated" in what:
        return "max_allocated"
    if "reserved" in what:
        return "max_reserved"
    return None  # the tool is not stated: nothing to compare it with


def _secondary_reserved(row: dict[str, Any]) -> int | None:
    """The max reserved a row prints beside max allocated (``value_secondary``), in bytes."""
    found = re.search(r"max reserved\s+([\d.]+)\s*(MB|MiB|GiB|GB)", row.get("value_secondary") or "")
    return _bytes(row, float(found.group(1)), found.group(2)) if found else None


@dataclass(frozen=True)
class Value:
    """A measured number of bytes beside the prediction (``predicted_as``: the estimate's field)."""

    quantity: str
    measured_bytes: int
    predicted_bytes: int
    predicted_as: str

    @property
    def error(self) -> float:
        """predicted / measured - 1."""
        return self.predicted_bytes / self.measured_bytes - 1

    def to_dict(self) -> dict[str, Any]:
        keys = ("quantity", "measured_bytes", "predicted_bytes", "predicted_as", "error")
        return {k: getattr(self, k) for k in keys}


@dataclass(frozen=True)
class Check:
    """One fit / OOM boundary: the run at ``micro_batch`` ``measured`` (fits / OOM; ``largest``: the largest
    micro batch that fit, "fits at BS=N (max)"), and the kit's verdict (``kit.fit.estimate_fit``:
    ``predicted_bytes`` per GPU against ``capacity_bytes``: its ``need`` where it fits (within the memory, the
    allocator's flushes counted), else the estimate's ``per_gpu_bytes``; ``problem`` its reason;
    ``peak_tensor_bytes`` the peak of live tensors in it). Where the run padded each batch to its longest
    sample and fit while the kit says OOM at the script's maximum length, ``longest_fitting`` is the longest
    sequence at which the kit fits the micro batch (``kit.planning.boundary.longest_sequence``): the check is
    open, agreeing if the run's longest batch was that short (its lengths are not published)."""

    micro_batch: int
    measured: str
    predicted: str
    predicted_bytes: int
    capacity_bytes: int
    problem: str
    peak_tensor_bytes: int
    largest: bool = False
    longest_fitting: int | None = None

    @property
    def verdict(self) -> str:
        """agrees, disagrees, or open (a padded run's check that hangs on its unpublished lengths)."""
        if self.measured == self.predicted:
            return "agrees"
        return "open" if self.longest_fitting else "disagrees"

    @property
    def agrees(self) -> bool | None:
        """True or False, None while open."""
        return None if self.verdict == "open" else self.verdict == "agrees"

    def verdict_text(self) -> str:
        """The verdict as the table prints it: agrees, DISAGREES, or the open check's bound."""
        if self.verdict == "open":
            return f"fits to {self.longest_fitting} tok"
        return "agrees" if self.agrees else "DISAGREES"

    def predicted_text(self, precision: str) -> str:
        """The kit's verdict with the bytes it weighed (or the precision the GPU lacks)."""
        if self.problem == "precision":
            return f"{self.predicted} (no {precision} on the GPU)"
        return f"{self.predicted} ({self.predicted_bytes / GIB:.2f} of {self.capacity_bytes / GIB:.2f} GiB)"

    def to_dict(self) -> dict[str, Any]:
        keys: tuple[str, ...] = ("micro_batch", "largest", "measured", "predicted", "verdict", "agrees")
        keys += ("predicted_bytes", "capacity_bytes", "problem", "peak_tensor_bytes", "longest_fitting")
        return {k: getattr(self, k) for k in keys}


@dataclass(frozen=True)
class Comparison:
    """One published row beside the kit's prediction, or the reason there is none."""

    row: dict[str, Any]
    kind: str
    setup: Setup | None = None
    reason: str | None = None
    notes: tuple[str, ...] = ()
    values: tuple[Value, ...] = ()
    checks: tuple[Check, ...] = ()
    #: a step-time row's measured step beside the kit's (``kit.accuracy.published_steps``)
    timings: tuple[Timing, ...] = ()
    #: a reading shown beside a fit / OOM verdict, not compared (nvidia-smi's, or allocated at the OOM)
    measured_bytes: int | None = None
    #: the largest micro batch the kit finds fitting (fit rows but a padded one's; 0: none)
    largest_micro_batch: int | None = None

    @property
    def id(self) -> str:
        return self.row["id"]

    @property
    def expressed(self) -> bool:
        return self.reason is None

    @property
    def verdict(self) -> str | None:
        """agrees (every fit / OOM boundary), disagrees (one does), open (one hangs on the run's unpublished
        lengths, none disagrees); None for a row without one."""
        verdicts = {c.verdict for c in self.checks}
        return next((v for v in ("disagrees", "open", "agrees") if v in verdicts), None)

    @property
    def agrees(self) -> bool | None:
        """Whether every fit / OOM boundary agrees (None for a row without one, or an open one)."""
        return None if self.verdict in (None, "open") else self.verdict == "agrees"

    def fit_text(self) -> str:
        """What the kit says of a fit row's micro batches, beside its setup: the largest that fits, or for
        a padded run (none searched) how long its batches were at most and each open check's bound."""
        if self.largest_micro_batch is not None:
            n = self.largest_micro_batch
            return f"the kit's largest mb {n}" if n else "the kit fits no micro batch"
        assert self.setup is not None
        bounds = [
            f"the kit fits mb {k.micro_batch} up to {k.longest_fitting} tokens"
            for k in self.checks
            if k.verdict == "open"
        ]
        return "; ".join([f"batches padded to at most {self.setup.batch.seq_len} tokens", *bounds])

    @property
    def label(self) -> str | None:
        """``megatron-gpt-18b: z3 fp16 mb1 ckpt on 4 x 16 V100-SXM2-32GB``."""
        s = self.setup
        if s is None:
            return None
        c = s.cluster
        return f"{s.model.name}: {s.label} on {c.nodes} x {c.gpus_per_node} {c.gpu}"

    def to_dict(self) -> dict[str, Any]:
        r = self.row
        return {
            "id": r["id"],
            "table": r["table"],
            "kind": self.kind,
            "model": r["model"],
            "framework": r["framework"],
            "label": self.label,
            "measured_what": r["measured_what"],
            "outcome": None if self.kind == "memory" else r.get("outcome"),
            "values": [v.to_dict() for v in self.values],
            "checks": [c.to_dict() for c in self.checks],
            "timings": [t.to_dict() for t in self.timings],
            "verdict": self.verdict,
            "agrees": self.agrees,
            "measured_bytes": self.measured_bytes,
            "largest_micro_batch": self.largest_micro_batch,
            "confidence": r["confidence"],
            "reason": self.reason,
            "notes": list(self.notes),
            "source": r["source"],
            "setup": self.setup.model_dump(mode="json") if self.setup else None,
        }


def compare(row: dict[str, Any]) -> Comparison:
    """A row beside the kit's prediction (see the module docstring), or with the reason it has none."""
    what = kind(row)
    expressed = express(row)
    if expressed.setup is None:
        return Comparison(row, what, reason=expressed.reason)
    setup, notes = expressed.setup, list(expressed.notes)
    if what == "step_time":
        try:
            timed = published_steps.timing(row, setup, notes)
        except ValueError as error:
            return Comparison(row, what, reason=str(error))
        return Comparison(row, what, setup, notes=tuple(notes), timings=(timed,))
    if what == "memory":
        est = estimate(setup)
        readings: dict[str | None, int | None] = {_quantity(row): _bytes(row, row["value"], row["unit"])}
        readings.setdefault("max_reserved", _secondary_reserved(row))
        values = tuple(
            Value(quantity, nbytes, *_predicted(est, quantity))
            for quantity, nbytes in readings.items()
            if quantity in QUANTITIES and nbytes is not None
        )
        if not values:
            notes.append(f"not compared: the kit predicts no {row['measured_what']!r}")
        return Comparison(row, what, setup, notes=tuple(notes), values=values)
    if expressed.padded:  # each check, then its longest sequence: one micro batch at several lengths
        with trace.alone():
            return _bounded(_checked(row, what, setup, notes, search=False))
    with trace.searching():  # the row's micro batches, then the largest that fits: one search
        return _checked(row, what, setup, notes)


def _checked(
    row: dict[str, Any], what: str, setup: Setup, notes: list[str], search: bool = True
) -> Comparison:
    """A fit row's checks at its micro batches, and (``search``) the largest micro batch the kit says
    fits."""
    checks = []
    for micro_batch, fits, largest in _boundaries(row, notes):
        est = estimate(setup.replace(batch={"micro_batch": micro_batch}))
        assert est.peak_tensor_bytes is not None  # the deepspeed formula's estimate has a timeline
        verdict = estimate_fit(est)
        measured, predicted = ("fits" if ok else "OOM" for ok in (fits, verdict.ok))
        checks.append(
            Check(micro_batch, measured, predicted, shown_bytes(est, verdict),
                  verdict.capacity, verdict.problem, est.peak_tensor_bytes, largest)
        )  # fmt: skip
    reading = _bytes(row, row["value"], row["unit"]) if row.get("value") is not None else None
    largest_fitting = largest_micro_batch(setup, limit=MAX_MICRO_BATCH) if search else None
    return Comparison(row, what, setup, notes=tuple(notes), checks=tuple(checks), measured_bytes=reading,
                      largest_micro_batch=largest_fitting)  # fmt: skip


def _bounded(c: Comparison) -> Comparison:
    """A padded row's checks where the run fit and the kit says OOM at the script's maximum length, each
    with the longest sequence (a multiple of ``PADDED_STEP``) at which the kit fits its micro batch: each
    length a trace at that micro batch (``trace.alone``). The largest micro batch at the maximum length
    is not searched: the lengths the run saw were shorter."""
    assert c.setup is not None
    limit = c.setup.batch.seq_len
    checks = tuple(
        replace(k, longest_fitting=longest_sequence(
            c.setup.replace(batch={"micro_batch": k.micro_batch}), limit, PADDED_STEP))
        if k.measured == "fits" and k.predicted == "OOM" and k.problem != "precision" else k
        for k in c.checks
    )  # fmt: skip
    notes = [
        f"micro batch {k.micro_batch}: the kit fits it up to {k.longest_fitting} tokens, not at {limit}; "
        "the check agrees if the run's longest batch was that short"
        for k in checks
        if k.verdict == "open"
    ]
    return replace(c, checks=checks, notes=c.notes + tuple(notes))


def _predicted(est, quantity: str) -> tuple[int, str]:
    """``(bytes, the estimate's field)`` predicting ``quantity`` (one of ``QUANTITIES``): max allocated is
    the peak of live tensors; max reserved is ``reserved_bytes`` where the Estimate has it, else the peak
    per GPU (its CUDA context and NCCL buffers are not reserved by the allocator: it over-predicts)."""
    if quantity == "max_allocated":
        return est.peak_tensor_bytes, "peak_tensor_bytes"
    reserved = getattr(est, "reserved_bytes", None)
    if reserved is not None:
        return reserved, "reserved_bytes"
    return est.peak_per_gpu_bytes, "peak_per_gpu_bytes"


def _boundaries(row: dict[str, Any], notes: list[str]) -> list[tuple[int, bool, bool]]:
    """``(micro batch, fits, the largest that fit)`` of each clause of a row's ``outcome`` ("fits", "OOM",
    "fits at BS=8 (max)", "fits (BS=20); OOM (BS=30)"); a clause about another setup ("DDP OOM at BS=1") is
    left out, and noted."""
    out = []
    for clause in row["outcome"].split(";"):
        found = re.match(r"\s*(fits|OOM)\b(?:.*?BS=(\d+))?", clause)
        if found is None:
            notes.append(f"not checked: {clause.strip()!r} (another setup)")
            continue
        micro_batch = int(found.group(2)) if found.group(2) else row["micro_batch_per_gpu"]
        out.append((micro_batch, found.group(1) == "fits", "(max)" in clause))
    return out


@dataclass(frozen=True)
class Report:
    """Comparisons of a selection of rows and their summary."""

    comparisons: tuple[Comparison, ...]

    def summary(self) -> dict[str, Any]:
        """Per table the rows and those expressed; the step times' summary (``published_steps.summary``);
        per quantity the median |error| and the worst error; how many fit / OOM rows agree, which disagree
        and which are open (``Check.verdict``)."""
        tables = {}
        for table in TABLES:
            mine = [c for c in self.comparisons if c.row["table"] == table]
            if mine:
                tables[table] = {"rows": len(mine), "expressed": sum(c.expressed for c in mine)}
        quantities = {}
        for quantity in QUANTITIES:
            found = [(c.id, v) for c in self.comparisons for v in c.values if v.quantity == quantity]
            if not found:
                continue
            worst_id, worst = max(found, key=lambda item: abs(item[1].error))
            quantities[quantity] = {
                "rows": len(found),
                "median_abs_error": statistics.median(abs(v.error) for _, v in found),
                "worst_error": worst.error,
                "worst_id": worst_id,
                "predicted_as": sorted({v.predicted_as for _, v in found}),
            }
        checked = [c for c in self.comparisons if c.checks]
        return {
            "tables": tables,
            "quantities": quantities,
            "step_time": published_steps.summary(self.comparisons),
            "fit": {
                "rows": len(checked),
                "agree": sum(c.verdict == "agrees" for c in checked),
                "disagree": [c.id for c in checked if c.verdict == "disagrees"],
                "open": [c.id for c in checked if c.verdict == "open"],
            },
        }

    def to_dict(self) -> dict[str, Any]:
        return {"rows": [c.to_dict() for c in self.comparisons], "summary": self.summary()}


def ids(table: str = "all") -> list[str]:
    """The ids of a table's rows (``A01``...), in file order."""
    return [row["id"] for row in rows(table)]


def report(table: str = "all", only: list[str] | tuple[str, ...] = ()) -> Report:
    """Every row of ``table`` (``memory``, ``throughput``, ``all``), or only the ids in ``only``, compared."""
    if table != "all" and table not in TABLES:
        raise ValueError(f"table: choose one of {', '.join(TABLES)} or all, got {table!r}")
    chosen = rows(table)
    unknown = sorted(set(only) - {row["id"] for row in chosen})
    if unknown:
        raise ValueError(f"id: no row {', '.join(unknown)} in {table}")
    return Report(tuple(compare(row) for row in chosen if not only or row["id"] in only))
