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


def unknown_probes(chosen) -> list[str]:
    """The names among ``chosen`` that are no probe (``PROBES``, ``OPTIONAL_PROBES``), sorted."""
    return sorted(set(chosen) - {*PROBES, *OPTIONAL_PROBES})


def append_record(path: str | os.PathLike, record: dict) -> None:
    """Append one JSON line with a single O_APPEND write."""
    line = (json.dumps(record, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def load_records(path: str | os.PathLike) -> list[dict]:
    """Every record of a records.jsonl (none if it does not exist); a torn last line is skipped."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    with open(path) as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut short by a killed rank
    return records


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
