"""Shared launches: one real 2-rank sweep, one 2-node x 2-rank session and one commtest for every test
module that needs them.

A module that needs real 2-rank records declares them as ``TWO_RANK_SETUPS`` (a list of Setups, or a
function of a session folder returning one) and, for test-only faults, ``TWO_RANK_FAULTS`` (index in
that list -> ``"raise"``, ``"die"`` or ``"hang"``), and takes the ``two_rank_sweep`` fixture. The
session runs the union of what the *selected* tests' modules declare in one ``run_sweep`` (a "die"
forces one relaunch; "hang" configurations go last, where their timeout ends the launch), so a test
run alone launches only what its module needs. Configurations are keyed by ``config_id``: the same
Setup declared twice runs once.

``replay_launches`` stands in for ``kit.run.sweep``'s launch in tests whose subject is what happens
around a launch (a panel's Run button, ``zerokit run``'s resume, ``tune``'s ranking): every parent-side
step of ``run_sweep`` runs, and the launch appends the records this session's real launch measured for
the same configurations, at the steps asked for.

``local_nodes_run`` does for 2 simulated nodes x 2 ranks (``kit.run.local_nodes``) what ``two_rank_sweep``
does on one node: one launch over the ``LOCAL_NODE_SETUPS`` the selected tests' modules declare, and
``replay_local_nodes`` what ``replay_launches`` does (``zerokit run --hostfile H --local`` around it).
``commtest_two_nodes`` is one correct ``zerokit commtest --hostfile`` run on 2 simulated nodes x 2 ranks,
read by every test of a correct commtest (the collectives' checks, rank mapping, bandwidth, plot, the
per-node report); tests of a failure (a wrong, late or missing rank) launch their own.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kit.records import OPTIONAL_PROBES, PROBES, append_record, load_records
from kit.run.results import Results
from kit.run.sweep import config_id, on_ranks, run_sweep
from kit.schema import Setup

NPROCS = 2
#: the shared sweep's measured steps and warm-up: every module's step counts fit inside them
STEPS, WARMUP = 3, 1
#: the watchdog: longest time without progress before a configuration counts as hung (the hang test waits
#: it out once; a healthy configuration's longest gap between events is under 2 s)
TIMEOUT_S = 8.0
SWEEP = "two-rank"


class TwoRankSweep:
    """The shared sweep's records, and views of them restricted to some configurations."""

    def __init__(self, runs: Path, root: Path):
        self.runs = runs
        #: the folder the declaring modules' files live in (``TWO_RANK_SETUPS(root)``)
        self.root = root
        self.folder = runs / SWEEP
        self.records = load_records(self.folder / "records.jsonl")

    def of(self, setups: list[Setup], warmup: int = WARMUP, steps: int = STEPS) -> list[dict]:
        """The records of ``setups`` (on ``NPROCS`` ranks), the steps ``warmup .. warmup + steps - 1``."""
        if not (warmup >= WARMUP and warmup + steps <= WARMUP + STEPS):
            raise ValueError(f"steps: the shared sweep measured steps {WARMUP}..{WARMUP + STEPS - 1}")
        ids = {config_id(on_ranks(s, NPROCS)) for s in setups}
        return [
            r
            for r in self.records
            if r["config_id"] in ids and (r.get("step") is None or warmup <= r["step"] < warmup + steps)
        ]

    def results(self, setups: list[Setup], **steps) -> Results:
        return Results(self.of(setups, **steps), self.folder / "records.jsonl")

    def copy(self, setups: list[Setup], runs_dir: Path, sweep: str) -> Path:
        """``runs_dir/sweep`` holding only ``setups``' records (and the heartbeats and launch specs): a
        sweep folder a test may resume or change."""
        folder = runs_dir / sweep
        shutil.copytree(self.folder / "heartbeats", folder / "heartbeats")
        for spec in self.folder.glob("launch-*.json"):
            shutil.copy(spec, folder)
        for record in self.of(setups):
            append_record(str(folder / "records.jsonl"), {**record, "sweep": sweep})
        return folder


def _declared(module, base: Path) -> tuple[list[Setup], dict[int, str]]:
    setups = module.TWO_RANK_SETUPS
    setups = setups(base) if callable(setups) else setups
    return list(setups), dict(getattr(module, "TWO_RANK_FAULTS", {}))


def shared_root(tmp_path_factory) -> Path:
    """A folder every pytest-xdist worker of this run sees (the parent of the workers' base folders),
    or this run's base folder without xdist."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _once(tmp_path_factory, name: str, make: Callable[[Path], None]) -> Path:
    """``root/name`` after ``make(root/name)`` ran once in this test run: the first worker to ask runs it
    under a lock, the others wait and read its folder (a failed attempt is retried by the next one)."""
    from filelock import FileLock

    root = shared_root(tmp_path_factory)
    folder = root / name
    with FileLock(str(root / f"{name}.lock")):
        if not (folder / ".done").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            (folder / ".done").touch()
    return folder


#: published rows compared apart from the others (two T5s and BlenderBot: about 30 s of traces of the
#: report's 70 s) so that two workers share the report's work
TRACED_ROWS = ("A25", "A27", "A32")


@pytest.fixture(scope="session")
def published_report(tmp_path_factory):
    """``kit.accuracy.published.report()`` of every row, computed once in this test run (it traces the
    published DeBERTa, BlenderBot and T5 models) and read by every worker that asks: in two parts, which
    the workers take in opposite orders (the second worker computes one part while the first computes the
    other), joined in the rows' order."""
    import pickle

    from kit.accuracy import published

    everything = published.ids()
    parts = {"traced": list(TRACED_ROWS), "others": [i for i in everything if i not in TRACED_ROWS]}

    def part(name: str) -> Path:
        def make(folder: Path) -> None:
            (folder / "report.pickle").write_bytes(pickle.dumps(published.report("all", parts[name])))

        return _once(tmp_path_factory, f"published-report-{name}", make) / "report.pickle"

    names = list(parts)
    if os.environ.get("PYTEST_XDIST_WORKER", "gw0")[-1] in "13579":
        names.reverse()
    found = {c.id: c for name in names for c in pickle.loads(part(name).read_bytes()).comparisons}
    return published.Report(tuple(found[i] for i in everything))


@pytest.fixture(scope="session")
def two_rank_sweep(request, tmp_path_factory) -> TwoRankSweep:
    """One launch (two with a "die" fault) over the configurations of every selected module, shared by
    every worker."""
    root = shared_root(tmp_path_factory)

    def launch(runs: Path) -> None:
        first, last, faults = [], [], {}
        for module in _modules_using(request, "two_rank_sweep"):
            setups, module_faults = _declared(module, root)
            for i, setup in enumerate(setups):
                fault = module_faults.get(i)
                (last if fault == "hang" else first).append((setup, fault))
        union = first + last
        for i, (_, fault) in enumerate(union):
            if fault:
                faults[i] = fault
        # every probe, DeepSpeed's comms logger too: tests/test_runner.py checks comm_bytes against it
        run_sweep(
            [s for s, _ in union], sweep=SWEEP, runs_dir=runs, nprocs=NPROCS, steps=STEPS, warmup=WARMUP,
            timeout_s=TIMEOUT_S, progress=False, faults=faults, probes=[(*PROBES, *OPTIONAL_PROBES)],
        )  # fmt: skip

    return TwoRankSweep(_once(tmp_path_factory, "shared-runs", launch), root)


@pytest.fixture
def replay_launches(monkeypatch, two_rank_sweep) -> list[list[str]]:
    """``kit.run.sweep``'s launch replaced by the shared sweep's records; returns, per launch, the
    labels it was asked to run."""
    launched: list[list[str]] = []

    def launch(base, pending, folder, bar, *, nprocs, on_event, **_) -> list:
        assert nprocs == NPROCS and base["seed"] == 0 and base["instrument"], "not what the shared sweep ran"
        launched.append([c.label for c in pending])
        run_id = time.strftime("%Y%m%dT%H%M%S") + f".{time.time_ns() % 1_000_000_000:09d}"
        for config in pending:
            records = two_rank_sweep.of([config.setup], warmup=base["warmup"], steps=base["steps"])
            assert records, f"{config.label}: not in the shared sweep; add it to TWO_RANK_SETUPS"
            _emit(on_event, {"event": "start", "config_id": config.config_id, "label": config.label})
            for record in records:
                append_record(base["records"], {**record, "sweep": base["sweep"], "run_id": run_id})
            _emit(on_event, {"event": "done", "config_id": config.config_id, "label": config.label})
            bar.update(1)
        return []

    monkeypatch.setattr("kit.run.sweep._launch", launch)
    return launched


def _emit(on_event: Callable[[dict], None] | None, event: dict) -> None:
    if on_event is not None:
        on_event(event)


# --- simulated nodes: one 2 x 2 local-node launch ---------------------------------------------------------

#: the local-node session's measured steps and warm-up (each module's steps fit inside them)
NODE_STEPS, NODE_WARMUP = 2, 1


class LocalNodesRun:
    """The records of the shared 2-node x 2-rank launch (``kit.run.local_nodes``), by configuration."""

    def __init__(self, rows: list[dict]):
        self.rows = rows

    def of(self, setups: list[Setup], steps: tuple[int, ...] | None = None) -> list[dict]:
        """The records of ``setups`` at ``steps`` (default: every measured step)."""
        measured = tuple(range(NODE_WARMUP, NODE_WARMUP + NODE_STEPS))
        if steps is not None and not set(steps) <= set(measured):
            raise ValueError(f"steps: the local-node session measured steps {measured}")
        ids = {config_id(s) for s in setups}
        return [r for r in self.rows if r["config_id"] in ids and r["step"] in (steps or measured)]


@pytest.fixture(scope="session")
def local_nodes_run(request, tmp_path_factory) -> LocalNodesRun:
    """One launch on 2 simulated nodes over the ``LOCAL_NODE_SETUPS`` of every selected module (all of
    one cluster shape), keyed by ``config_id``, shared by every worker."""
    from kit.run.local_nodes import run_setups_on_local_nodes

    def launch(folder: Path) -> None:
        union: dict[str, Setup] = {}
        for module in _modules_using(request, "local_nodes_run"):
            for setup in module.LOCAL_NODE_SETUPS:
                union.setdefault(config_id(setup), setup)
        rows = run_setups_on_local_nodes(
            list(union.values()), folder, steps=NODE_STEPS, warmup=NODE_WARMUP, timeout_s=120
        )
        (folder / "rows.json").write_text(json.dumps(rows))

    folder = _once(tmp_path_factory, "local-nodes", launch)
    return LocalNodesRun(json.loads((folder / "rows.json").read_text()))


@pytest.fixture
def replay_local_nodes(monkeypatch, local_nodes_run) -> list[tuple]:
    """``kit.run.sweep``'s launch on nodes replaced by the shared local-node launch's records (as
    ``replay_launches`` does on one node); returns, per launch, its ``Nodes`` and the labels asked for."""
    launched: list[tuple] = []

    def launch(base, pending, folder, bar, *, nprocs, nodes, on_event, **_) -> list:
        assert nodes is not None and (nodes.count, nprocs) == (2, 2), "not what the local-node session ran"
        launched.append((nodes, [c.label for c in pending]))
        steps = tuple(range(base["warmup"], base["warmup"] + base["steps"]))
        for config in pending:
            records = local_nodes_run.of([config.setup], steps=steps)
            assert records, f"{config.label}: not in the local-node session; add it to LOCAL_NODE_SETUPS"
            _emit(on_event, {"event": "start", "config_id": config.config_id, "label": config.label})
            for record in records:
                append_record(base["records"], {**record, "sweep": base["sweep"]})
            _emit(on_event, {"event": "done", "config_id": config.config_id, "label": config.label})
            bar.update(1)
        return []

    monkeypatch.setattr("kit.run.sweep._launch", launch)
    return launched


# --- commtest: one correct launch on 2 simulated nodes x 2 ranks, through the CLI ------------------------

#: message sizes of the shared commtest (small enough for CPU ranks; two, so each line has two points)
COMMTEST_SIZES = (8192, 1 << 20)


@pytest.fixture(scope="session")
def commtest_two_nodes(tmp_path_factory) -> dict:
    """``zerokit commtest --hostfile H --plot P --json`` on two simulated nodes (``localhost`` and
    ``127.0.0.1``, 2 slots each: world size 4), shared by every worker: its exit status, JSON, output tails
    and the plot's path."""
    import subprocess
    import sys

    from kit.scaleout.hostfile import make_hosts, write_hostfile

    def launch(folder: Path) -> None:
        hostfile = write_hostfile(make_hosts(["localhost", "127.0.0.1"], 2), folder / "hostfile")
        argv = [sys.executable, "-m", "kit", "commtest", "--hostfile", str(hostfile), "--iters", "2"]
        argv += ["--sizes", *map(str, COMMTEST_SIZES), "--plot", str(folder / "bw.png"), "--json"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        out = json.loads(done.stdout) if done.stdout.startswith("{") else None
        why = f"{done.stdout[-1500:]}\n{done.stderr[-1500:]}"  # what an assertion on the exit status shows
        (folder / "done.json").write_text(
            json.dumps({"returncode": done.returncode, "json": out, "output": why})
        )

    folder = _once(tmp_path_factory, "commtest", launch)
    return {**json.loads((folder / "done.json").read_text()), "plot": folder / "bw.png"}


#: the shared launches: a test taking one is a ``distributed`` test, whatever its module says
LAUNCHING = {"two_rank_sweep", "local_nodes_run", "commtest_two_nodes"}


def pytest_itemcollected(item) -> None:
    """Tests of the shared launches, and of the launching fixtures their module names in ``LAUNCHES``
    (its own module-scoped sweeps), are marked ``distributed``: ``make test`` runs the others in two
    processes first, then these one at a time (under pytest-xdist a shared launch still runs once for
    all workers: ``_once``)."""
    launching = LAUNCHING | set(getattr(getattr(item, "module", None), "LAUNCHES", ()))
    if launching & set(getattr(item, "fixturenames", ())):  # a notebook (nbmake) takes none
        item.add_marker(pytest.mark.distributed)


def _modules_using(request, fixture: str) -> list:
    """The modules of the selected tests that take ``fixture``, in collection order."""
    modules = []
    for item in request.session.items:
        if fixture in getattr(item, "fixturenames", ()) and item.module not in modules:
            modules.append(item.module)
    return modules
