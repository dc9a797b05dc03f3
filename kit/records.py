"""The contract between launched ranks and the parent: ``records.jsonl`` lines and event lines.

Ranks append one JSON record per line (schema in docs/contracts.md, "Records"), each with a single
``O_APPEND`` write, so ranks never interleave and a crash loses nothing already written. Rank 0 also
prints one ``ZEROKIT {...}`` event line per configuration start, step and end on stdout; the parent
(``kit.run.sweep``) reads them for its progress bar and watchdog.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

#: stdout prefix of the worker's event lines
EVENT = "ZEROKIT "
#: output line tags of the commtest worker: one RANK line per rank, one BW line per (collective, size)
#: from rank 0
RANK_TAG = "ZEROKIT_COMMTEST_RANK"
BW_TAG = "ZEROKIT_COMMTEST_BW"
#: what an instrumented step measures, each a switch of a launch spec (``probes``; the bench times each
#: alone): a heartbeat per step (``kit.monitor``), the bytes of every collective by scope
#: (``kit.ranks.comm_scopes``), the saved-tensor hooks (activations), the model-state walk
#: (``kit.ranks.state_walk``), and each record's peak memory and estimates
PROBES = ("heartbeat", "comm", "activations", "state_walk", "records")
#: probes a launch takes only when asked: DeepSpeed's comms logger (it synchronizes the device after
#: every collective), recorded as ``comm_logger_bytes`` beside the ``comm`` probe's ``comm_bytes``
OPTIONAL_PROBES = ("comm_logger",)


#: a configuration's outcome on a rank (the worst of its records is the configuration's: ``kit.run.results``)
Status = Literal["ok", "oom", "error", "timeout", "cancelled"]


class Record(BaseModel):
    """One line of records.jsonl: what a rank appends per configuration and step, or the parent for a
    configuration its ranks could not report on (then without where a rank ran). docs/contracts.md,
    "Records", says what each field measures; a line that does not validate is one error naming the file,
    the line and the field (``load_records``), and a rank never writes one (``append_record``)."""

    model_config = ConfigDict(extra="forbid")

    sweep: str
    run_id: str
    config_id: str
    label: str
    setup: dict[str, Any]
    rank: int | None
    step: int | None
    time: float
    status: Status
    error: str | None
    world_size: int | None = None
    node: str | None = None
    node_rank: int | None = None
    local_rank: int | None = None
    device: str | None = None
    torch: str | None = None
    deepspeed: str | None = None
    start_s: float | None = None
    # a measured step (status ok): its batch, time and throughput
    train_batch: int | None = None
    micro_batch: int | None = None
    grad_accum: int | None = None
    tokens: int | None = None
    padded_tokens: int | None = None
    lr: float | None = None
    step_time_s: float | None = None
    step_cpu_s: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    tflops: float | None = None
    loss: float | None = None
    # when instrumented: memory measured beside the estimate (bytes), and what went over the wire
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    peak_rss_bytes: int | None = None
    measured: dict[str, Any] | None = None
    estimate: dict[str, Any] | None = None
    measured_host: dict[str, int] | None = None
    estimate_host: dict[str, int] | None = None
    measured_nvme: dict[str, int] | None = None
    estimate_nvme: dict[str, int] | None = None
    estimate_peak_bytes: int | None = None
    cpu_matmul: dict[str, Any] | None = None
    comm_bytes: dict[str, int] | None = None
    comm_logger_bytes: dict[str, int] | None = None
    comm_wire_bytes: float | None = None
    estimate_comm_wire_bytes: float | None = None
    comm_scope_bytes: dict[str, dict[str, int]] | None = None
    comm_scope_wire_bytes: dict[str, int] | None = None


def unknown_probes(chosen) -> list[str]:
    """The names among ``chosen`` that are no probe (``PROBES``, ``OPTIONAL_PROBES``), sorted."""
    return sorted(set(chosen) - {*PROBES, *OPTIONAL_PROBES})


def append_line(path: str | os.PathLike, obj: dict) -> None:
    """Append one JSON line with a single O_APPEND write (records and heartbeats alike)."""
    line = (json.dumps(obj, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def load_lines(path: str | os.PathLike) -> list[dict]:
    """Every JSON line of a file (none if it does not exist); a torn last line is skipped."""
    return [obj for _, obj in _numbered(path)]


def append_record(path: str | os.PathLike, record: dict) -> None:
    """Append one record to a records.jsonl; a record that is no ``Record`` is a ValueError naming the
    field, and nothing is written."""
    problem = _problem(record)
    if problem:
        raise ValueError(f"record: {problem}")
    append_line(path, record)


def load_records(path: str | os.PathLike) -> list[dict]:
    """Every record of a records.jsonl (none if it does not exist); a torn last line is skipped, a line
    that is no ``Record`` is a ValueError naming the file, the line and the field."""
    records = []
    for number, record in _numbered(path):
        problem = _problem(record)
        if problem:
            raise ValueError(f"{path}: line {number}: {problem}")
        records.append(record)
    return records


def _numbered(path: str | os.PathLike) -> list[tuple[int, dict]]:
    path = Path(path)
    if not path.exists():
        return []
    out = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            try:
                out.append((number, json.loads(line)))
            except json.JSONDecodeError:
                continue  # a line cut short by a killed rank
    return out


def _problem(record: Any) -> str | None:
    """Why ``record`` is no ``Record`` (its first wrong field), or None."""
    try:
        Record.model_validate(record)
    except ValidationError as error:
        first = error.errors()[0]
        return f"{'.'.join(str(p) for p in first['loc']) or 'record'}: {first['msg']}"
    return None


def emit(event: dict) -> None:
    """Print one event line (rank 0) with a single write: the ranks share one pipe and run with
    ``PYTHONUNBUFFERED``, under which ``print`` writes the text and its newline apart, so another rank's
    output could land between them."""
    sys.stdout.write(EVENT + json.dumps(event, default=str) + "\n")
    sys.stdout.flush()


def parse_event(line: str) -> dict | None:
    """The event of an output line, or None for any other line. The event may stand after another
    rank's unfinished output on the same line, and be followed by more of it."""
    start = line.find(EVENT)
    if start < 0:
        return None
    try:
        event, _ = _DECODER.raw_decode(line, start + len(EVENT))
    except json.JSONDecodeError:
        return None  # the marker inside some other text
    return event if isinstance(event, dict) and "event" in event else None


_DECODER = json.JSONDecoder()
