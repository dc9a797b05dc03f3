"""Heartbeats of every rank of a job, and the live view they give: online, stale, offline, finished, failed.

Writing. Each rank, of a kit sweep or of any user's own training loop, calls one line per step::

    kit.monitor.heartbeat(engine, "runs/my-job", step=step, loss=loss)   # engine may be None

which appends one JSON line to ``FOLDER/heartbeats/<node>-rank<R>.jsonl``: one file per rank, so ranks on
different nodes never write the same file (a folder on a filesystem shared by the nodes gives one view of
the whole job), one ``O_APPEND`` write per line (``kit.records.append_line``), so a killed rank loses
nothing it wrote. A line holds ``time`` (Unix seconds), ``node`` (the hostname), ``rank``, ``local_rank``,
``world_size`` (from the engine, else the launcher's ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``), ``pid``,
``status`` (``running``, ``finished``, ``failed``), ``step``, ``samples_per_s``, ``loss``, the memory
``gpu_allocated_bytes``, ``gpu_reserved_bytes``, ``gpu_peak_allocated_bytes`` (torch.cuda, when this
process uses CUDA; else null), ``gpu_util_percent`` (NVML through ``torch.cuda.utilization``, when
nvidia-ml-py is installed), ``rss_bytes`` and ``rss_peak_bytes`` (the process's resident set and its
high-water mark, /proc/self/status), ``error`` (of a ``failed`` line) and whatever keys the caller adds
(the kit's worker adds ``sweep``, ``run_id``, ``config_id`` and ``label``). Writing never raises into a
training loop: an I/O error warns once and the loop goes on. ``every_s`` rate-limits ``running`` lines.

Reading. ``read(folder)`` gives a ``Snapshot``: per rank its state (``finished`` or ``failed`` as its last
line says; otherwise ``online`` if its last line is at most ``stale_s`` old, ``stale`` up to ``offline_s``,
``offline`` after), step, samples/s, loss, memory now and its peak, age; averages per node and over the
job; every line, for plots (``kit.lab.plots.heartbeats``). ``zerokit monitor FOLDER`` prints it.

Steps. A line keeps the loop's own count (``step``: from 0, warm-up steps included, as the kit's records
do). Every view a reader sees numbers them one way (``measured_step``, ``step_label``): the measured
steps from 1, and a warm-up step as "warm-up k of W", never counted as a measured step. The reader
knows a kit sweep's warm-up from the launch spec beside its heartbeats (``launch-<run_id>.json``,
``launch_steps``). A rank's row (``zerokit monitor --json``) keeps ``step`` as the loop wrote it and adds
``measured_step`` (None during the warm-up, when ``warmup_step`` says which), ``sweep_warmup``,
``sweep_steps`` and ``progress`` (the words: "warm-up 1 of 2", "step 3 of 10"); a node's and the job's
averages keep ``step_min``/``step_max`` over the written steps and add ``measured_step_min``,
``measured_step_max`` and ``warming_up`` (``steps_range`` reads those); the history's lines keep the
``step`` written and add their ``measured_step``. Any other loop's measured step is its step as written.

What it cannot see: a heartbeat tells a slow rank from a dead one only by its age (a step longer than
``stale_s`` reads as stale); ages compare the reader's clock with the nodes' clocks, which must agree to
well under ``stale_s`` (NTP does); memory between two heartbeats shows only through the high-water marks
(``gpu_peak_allocated_bytes``, ``rss_peak_bytes``; the kit's worker resets them per configuration); a rank
that never wrote a line is not listed (``job["world_size"]`` beside ``job["ranks"]`` shows it missing).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kit.records import append_line, load_lines
from kit.units import first_line

#: a rank whose last heartbeat is older than this (seconds) is stale ...
STALE_S = 5.0
#: ... and older than this, offline
OFFLINE_S = 30.0
#: what a heartbeat line says of its rank
STATUSES = ("running", "finished", "failed")
#: what the reader makes of a rank: the last line's ``finished``/``failed``, or a ``running`` line's age
STATES = ("online", "stale", "offline", "finished", "failed")
#: the sub-folder of FOLDER that holds one file per rank
SUBFOLDER = "heartbeats"
#: a kit sweep's launch spec in its folder (``kit.run.sweep``), which holds its warm-up and measured steps
LAUNCH_SPEC = "launch-{run_id}.json"


@dataclass
class _Writer:
    """What one process remembers per heartbeat file: when it last wrote (``every_s``), the engine's
    sample count then (samples/s from an engine), and whether it already warned."""

    written_at: float = 0.0
    samples: int | None = None
    samples_at: float = 0.0
    engine: int | None = None
    warned: bool = False
    no_util: bool = False


_WRITERS: dict[str, _Writer] = {}


def heartbeat(
    engine=None,
    folder: str | os.PathLike = ".",
    *,
    step: int | None = None,
    samples_per_s: float | None = None,
    loss: float | None = None,
    status: str = "running",
    every_s: float | None = None,
    node: str | None = None,
    **extra,
) -> bool:
    """Append one heartbeat of this rank to ``folder/heartbeats/<node>-rank<R>.jsonl``; True if written.

    ``engine`` (a DeepSpeed engine, or None) gives rank, local rank and world size (else the launcher's
    environment), the step (``engine.global_steps``) and samples/s (``engine.global_samples`` since the
    previous heartbeat) when they are not passed. ``loss`` may be a one-element tensor. ``every_s``: skip
    a ``running`` heartbeat within that many seconds of the last one written (``finished`` and ``failed``
    are always written). ``node`` names the node (default: the hostname). Extra keyword arguments are
    written as they are (JSON; anything else as its ``str``).
    """
    if status not in STATUSES:
        raise ValueError(f"status: one of {', '.join(STATUSES)}, got {status!r}")
    if every_s is not None and not every_s >= 0:
        raise ValueError(f"every_s: seconds >= 0, got {every_s!r}")
    now = time.time()
    rank, local_rank, world = _ranks(engine)
    node = node or socket.gethostname()
    path = heartbeat_path(folder, node, rank)
    writer = _WRITERS.setdefault(str(path), _Writer())
    if status == "running" and every_s and now - writer.written_at < every_s:
        return False
    if engine is not None:
        step = getattr(engine, "global_steps", None) if step is None else step
        samples = getattr(engine, "global_samples", None)
        before = writer.samples if writer.engine == id(engine) else None  # a new engine counts from 0
        if (
            samples_per_s is None
            and samples is not None
            and before is not None
            and samples > before
            and now > writer.samples_at
        ):
            samples_per_s = (samples - before) / (now - writer.samples_at)
        writer.samples, writer.samples_at, writer.engine = samples, now, id(engine)
    line = {
        "time": now,
        "node": node,
        "rank": rank,
        "local_rank": local_rank,
        "world_size": world,
        "pid": os.getpid(),
        "status": status,
        "step": step,
        "samples_per_s": samples_per_s,
        "loss": _number(loss),
        **memory(writer),
        **extra,
    }
    try:
        if not writer.written_at:
            path.parent.mkdir(parents=True, exist_ok=True)
        append_line(path, line)
    except OSError as error:
        if not writer.warned:
            writer.warned = True
            warnings.warn(f"kit.monitor: cannot write heartbeats to {path}: {error}", stacklevel=2)
        return False
    writer.written_at = now
    return True


@contextlib.contextmanager
def running(engine=None, folder: str | os.PathLike = ".", **fixed) -> Iterator:
    """``with running(engine, folder) as beat:`` then ``beat(step=s, loss=l)`` per step: heartbeats with
    the same ``fixed`` keyword arguments (``every_s``, ``node``, extra keys), a ``finished`` one when the
    block ends and a ``failed`` one (with the error) when it raises."""

    def beat(**values) -> bool:
        return heartbeat(engine, folder, **{**fixed, **values})

    try:
        yield beat
    except BaseException as error:
        heartbeat(engine, folder, **{**fixed, "status": "failed", "error": first_line(error, typed=True)})
        raise
    heartbeat(engine, folder, **{**fixed, "status": "finished"})


def heartbeat_path(folder: str | os.PathLike, node: str, rank: int) -> Path:
    """``folder/heartbeats/<node>-rank<R>.jsonl`` (the node's name reduced to letters, digits, ``._-``)."""
    return Path(folder) / SUBFOLDER / f"{re.sub(r'[^A-Za-z0-9._-]', '_', node)}-rank{rank}.jsonl"


def memory(writer: _Writer | None = None) -> dict[str, int | float | None]:
    """This process's memory now: torch.cuda's allocated, reserved and peak bytes and NVML's utilisation
    when the process uses CUDA (torch imported and CUDA initialised; nothing is imported here), else
    None; its resident set and high-water mark always."""
    gpu: dict[str, int | float | None] = dict.fromkeys(
        ("gpu_allocated_bytes", "gpu_reserved_bytes", "gpu_peak_allocated_bytes", "gpu_util_percent")
    )
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        gpu["gpu_allocated_bytes"] = torch.cuda.memory_allocated()
        gpu["gpu_reserved_bytes"] = torch.cuda.memory_reserved()
        gpu["gpu_peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        if writer is None or not writer.no_util:
            try:
                gpu["gpu_util_percent"] = torch.cuda.utilization()
            except Exception:  # no nvidia-ml-py, no NVML: no utilisation (asked once per file)
                if writer is not None:
                    writer.no_util = True
    return {**gpu, "rss_bytes": rss_bytes(), "rss_peak_bytes": rss_bytes(peak=True)}


def rss_bytes(peak: bool = False) -> int | None:
    """This process's resident set (VmRSS), or its high-water mark (VmHWM) with ``peak``, from
    /proc/self/status; None off Linux."""
    key = "VmHWM" if peak else "VmRSS"
    try:
        with open("/proc/self/status") as f:
            match = re.search(rf"^{key}:\s+(\d+) kB", f.read(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) * 1024 if match else None


def _ranks(engine) -> tuple[int, int, int]:
    """(rank, local rank, world size) of this process: the engine's, else the launcher's environment."""
    env = os.environ
    rank = getattr(engine, "global_rank", None)
    local = getattr(engine, "local_rank", None)
    world = getattr(engine, "world_size", None)
    rank = int(env.get("RANK", 0)) if rank is None else rank
    local = int(env.get("LOCAL_RANK", 0)) if local is None or local < 0 else local
    world = int(env.get("WORLD_SIZE", 1)) if world is None else world
    return int(rank), int(local), int(world)


def _number(value) -> float | None:
    """A loss as a float (a one-element tensor too); None for None or what is not a number."""
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        return None


# ------------------------------------------------------------------------------------------------- steps


def measured_step(step: int | None, warmup: int) -> int | None:
    """The loop's step ``step`` (counted from 0 with the ``warmup`` warm-up steps first, as records and
    heartbeats count) as every view numbers it: the measured steps from 1; None for a warm-up step."""
    if step is None or step < warmup:
        return None
    return step - warmup + 1


def step_label(step: int | None, warmup: int | None = 0, steps: int | None = None) -> str | None:
    """The loop's step ``step`` (from 0, warm-up first) in words: ``warm-up 1 of 2``, ``step 3 of 10``
    (``steps``: the measured steps, when known), ``step 3``; ``warmup`` None: a loop whose warm-up is not
    known, its step as it counts it; None for no step."""
    if step is None:
        return None
    if warmup is None:
        return f"step {step}"
    if step < warmup:
        return f"warm-up {step + 1} of {warmup}"
    number = step - warmup + 1
    return f"step {number} of {steps}" if steps else f"step {number}"


def steps_range(group: dict) -> str | None:
    """The steps of a node's or the job's ranks (``Snapshot.nodes``, ``Snapshot.job``) in words: ``step
    2``, ``steps 1-3``, with how many ranks are still in their warm-up (``warm-up`` alone when all are);
    None when no rank reported a step."""
    low, high = group.get("measured_step_min"), group.get("measured_step_max")
    warming = group.get("warming_up") or 0
    if low is None:
        return "warm-up" if warming else None
    text = f"step {low}" if low == high else f"steps {low}-{high}"
    return text + (f" ({warming} rank{'s' if warming > 1 else ''} in warm-up)" if warming else "")


def launch_steps(folder: str | os.PathLike, run_id: str) -> tuple[int, int] | None:
    """(warm-up steps, measured steps) of the kit sweep launch ``run_id``, from its spec in ``folder``
    (``launch-<run_id>.json``); None without a readable one (any loop but a kit sweep)."""
    if not isinstance(run_id, str) or not re.fullmatch(r"[A-Za-z0-9._-]+", run_id):
        return None
    try:
        spec = json.loads((Path(folder) / LAUNCH_SPEC.format(run_id=run_id)).read_text())
        warmup, steps = spec["warmup"], spec["steps"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not (isinstance(warmup, int) and isinstance(steps, int)):
        return None
    return warmup, steps


# ----------------------------------------------------------------------------------------------- reading


@dataclass
class Snapshot:
    """What the heartbeats of ``folder`` said at ``time``: ``ranks`` (one dict per rank, by node and rank),
    ``nodes`` (averages per node), ``job`` (averages over every rank) and ``history`` (every line, oldest
    first, each with its ``memory_bytes``). ``to_dict()`` is ``zerokit monitor --json``'s object;
    ``frame()`` and ``history_frame()`` are pandas DataFrames."""

    folder: str
    time: float
    stale_s: float
    offline_s: float
    ranks: list[dict] = field(default_factory=list)
    nodes: list[dict] = field(default_factory=list)
    job: dict = field(default_factory=dict)
    history: list[dict] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict:
        keys = ("folder", "time", "stale_s", "offline_s", "job", "nodes", "ranks")
        return {k: getattr(self, k) for k in keys}

    def rank(self, rank: int, node: str | None = None) -> dict:
        """The row of ``rank`` (on ``node``, when ranks of several jobs share the folder)."""
        for row in self.ranks:
            if row["rank"] == rank and node in (None, row["node"]):
                return row
        raise KeyError(f"rank: no heartbeats of rank {rank} in {self.folder}")

    def frame(self):
        import pandas as pd

        return pd.DataFrame(self.ranks)

    def history_frame(self):
        """Every heartbeat with ``seconds`` since the first one of the folder."""
        import pandas as pd

        table = pd.DataFrame(self.history)
        if len(table):
            table["seconds"] = table["time"] - table["time"].min()
        return table


def read(
    folder: str | os.PathLike,
    now: float | None = None,
    stale_s: float = STALE_S,
    offline_s: float = OFFLINE_S,
) -> Snapshot:
    """The ``Snapshot`` of the heartbeats in ``folder`` (a sweep folder, or any folder ranks wrote to
    with ``heartbeat``; its ``heartbeats/`` sub-folder, or the files themselves), judged at ``now``
    (default: this clock). ValueError, naming the folder, when it holds no heartbeats."""
    if not stale_s > 0:
        raise ValueError(f"stale_s: seconds > 0, got {stale_s!r}")
    if not offline_s > stale_s:
        raise ValueError(f"offline_s: seconds > stale_s ({stale_s:g}), got {offline_s!r}")
    now = time.time() if now is None else now
    files = heartbeat_files(folder)
    if not files:
        raise ValueError(
            f"folder: {folder} holds no heartbeats ({SUBFOLDER}/<node>-rank<R>.jsonl); give a sweep folder "
            "or the folder a job passes to kit.monitor.heartbeat"
        )
    lines: dict[tuple[str, int], list[dict]] = {}
    launches: dict[tuple[Path, str], tuple[int, int] | None] = {}
    for path in files:
        # a kit sweep's folder holds heartbeats/ and the launch specs beside it
        sweep = path.parent.parent if path.parent.name == SUBFOLDER else path.parent
        for line in load_lines(path):
            if isinstance(line, dict) and isinstance(line.get("time"), int | float) and "rank" in line:
                line["memory_bytes"] = _memory_now(line)
                _number_steps(line, sweep, launches)
                lines.setdefault((str(line.get("node")), line["rank"]), []).append(line)
    if not lines:
        raise ValueError(f"folder: {folder} holds heartbeat files but no complete heartbeat yet")
    ranks = [_rank_row(rows, now, stale_s, offline_s) for _, rows in sorted(lines.items())]
    nodes = [
        {"node": node, **_averages([r for r in ranks if r["node"] == node])}
        for node in sorted({r["node"] for r in ranks})
    ]
    job = {"nodes": len(nodes), **_averages(ranks)}
    job["world_size"] = max((r["world_size"] or 0 for r in ranks), default=0)
    history = sorted((line for rows in lines.values() for line in rows), key=lambda line: line["time"])
    return Snapshot(str(folder), now, stale_s, offline_s, ranks, nodes, job, history)


def heartbeat_files(folder: str | os.PathLike) -> list[Path]:
    """The heartbeat files of ``folder``: ``heartbeats/*-rank*.jsonl`` in it, else ``*-rank*.jsonl``."""
    folder = Path(folder)
    return sorted((folder / SUBFOLDER).glob("*-rank*.jsonl")) or sorted(folder.glob("*-rank*.jsonl"))


def state(line: dict, now: float, stale_s: float = STALE_S, offline_s: float = OFFLINE_S) -> str:
    """A rank's state from its last heartbeat: its ``finished``/``failed``, else by the line's age."""
    if line.get("status") in ("finished", "failed"):
        return line["status"]
    age = now - line["time"]
    return "online" if age <= stale_s else "stale" if age <= offline_s else "offline"


def _number_steps(line: dict, sweep: Path, launches: dict) -> None:
    """Number ``line``'s step as the views do, beside the ``step`` it wrote: for a kit sweep's line (its
    launch spec in ``sweep``) ``measured_step`` from 1 (None in the warm-up, ``warmup_step`` the warm-up
    step from 1), the warm-up and measured steps of its launch (``sweep_warmup``, ``sweep_steps``);
    ``progress`` in words (``step_label``). Another loop's ``measured_step`` is its step as written."""
    step = line.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        step = None
    run_id = line.get("run_id")
    known = None
    if isinstance(run_id, str):
        if (sweep, run_id) not in launches:
            launches[sweep, run_id] = launch_steps(sweep, run_id)
        known = launches[sweep, run_id]
    if known is None:
        line.update(
            measured_step=line.get("step"),
            sweep_warmup=None,
            sweep_steps=None,
            warmup_step=None,
            progress=step_label(step, None),
        )
        return
    warmup, steps = known
    line.update(
        measured_step=measured_step(step, warmup),
        sweep_warmup=warmup,
        sweep_steps=steps,
        warmup_step=step + 1 if step is not None and step < warmup else None,
        progress=step_label(step, warmup, steps),
    )


def _memory_now(line: dict) -> int | None:
    """GPU bytes allocated when the rank used a GPU, else its resident set."""
    gpu = line.get("gpu_allocated_bytes")
    return gpu if gpu is not None else line.get("rss_bytes")


def _rank_row(rows: list[dict], now: float, stale_s: float, offline_s: float) -> dict:
    last = rows[-1]
    gpu = last.get("gpu_allocated_bytes") is not None
    peaks = [
        v
        for line in rows
        for v in (line["memory_bytes"], line.get("gpu_peak_allocated_bytes" if gpu else "rss_peak_bytes"))
        if isinstance(v, int | float)
    ]
    speeds = [line["samples_per_s"] for line in rows if isinstance(line.get("samples_per_s"), int | float)]
    return {
        "node": last.get("node"),
        "rank": last["rank"],
        "local_rank": last.get("local_rank"),
        "world_size": last.get("world_size"),
        "pid": last.get("pid"),
        "state": state(last, now, stale_s, offline_s),
        "status": last.get("status"),
        "age_s": now - last["time"],
        "last_seen": last["time"],
        "step": _latest(rows, "step"),
        "measured_step": _latest(rows, "measured_step"),
        "warmup_step": last.get("warmup_step"),
        "sweep_warmup": _latest(rows, "sweep_warmup"),
        "sweep_steps": _latest(rows, "sweep_steps"),
        "progress": _latest(rows, "progress"),
        "samples_per_s": _latest(rows, "samples_per_s"),
        "samples_per_s_mean": sum(speeds) / len(speeds) if speeds else None,
        "loss": _latest(rows, "loss"),
        "memory": "gpu" if gpu else "rss",
        "memory_bytes": last["memory_bytes"],
        "peak_bytes": max(peaks, default=None),
        "rss_bytes": last.get("rss_bytes"),
        "gpu_reserved_bytes": last.get("gpu_reserved_bytes"),
        "gpu_util_percent": last.get("gpu_util_percent"),
        "label": last.get("label"),
        "error": last.get("error"),
        "heartbeats": len(rows),
    }


def _latest(rows: list[dict], key: str):
    """The last line's ``key``; for a ``finished``/``failed`` line, which need not repeat the step, the
    last value that is not null."""
    if rows[-1].get("status") not in ("finished", "failed"):
        return rows[-1].get(key)
    return next((line[key] for line in reversed(rows) if line.get(key) is not None), None)


def _averages(ranks: list[dict]) -> dict:
    """Counts of each state, the mean of the ranks' samples/s, memory and utilisation, the highest peak,
    the lowest and highest step as written and as measured, and how many ranks are in their warm-up."""

    def mean(key: str) -> float | None:
        values = [r[key] for r in ranks if isinstance(r[key], int | float)]
        return sum(values) / len(values) if values else None

    steps = [r["step"] for r in ranks if isinstance(r["step"], int)]
    measured = [r["measured_step"] for r in ranks if isinstance(r["measured_step"], int)]
    return {
        "ranks": len(ranks),
        "states": {s: sum(r["state"] == s for r in ranks) for s in STATES},
        "samples_per_s_mean": mean("samples_per_s"),
        "memory_bytes_mean": mean("memory_bytes"),
        "peak_bytes_max": max((r["peak_bytes"] for r in ranks if r["peak_bytes"] is not None), default=None),
        "gpu_util_percent_mean": mean("gpu_util_percent"),
        "step_min": min(steps, default=None),
        "step_max": max(steps, default=None),
        "measured_step_min": min(measured, default=None),
        "measured_step_max": max(measured, default=None),
        "warming_up": sum(r["warmup_step"] is not None for r in ranks),
    }
