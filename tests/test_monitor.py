"""Heartbeats and the live view of every rank (``kit.monitor``, ``zerokit monitor``, the monitor panel).

Unit tests write synthetic heartbeat files and judge them with fake clocks; one real test runs two CPU
ranks of a training loop (``tests/fixtures/heartbeat_loop.py``), kills one with SIGKILL and watches
``zerokit monitor`` call it stale, then offline, while the other keeps reporting, then finished.
A real sweep's heartbeats are checked in ``tests/test_runner.py`` (``test_cli_run_json_then_resume``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import psutil
import pytest

from kit import monitor
from kit.cli import main
from kit.cli import monitor as monitor_cli
from kit.records import append_line

REPO = Path(__file__).resolve().parent.parent
LOOP = REPO / "tests" / "fixtures" / "heartbeat_loop.py"
JSON_KEYS = {"folder", "time", "stale_s", "offline_s", "job", "nodes", "ranks"}


class Clock:
    """A clock the test moves (``kit.monitor.time`` replaced, the real module untouched)."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def time(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(monitor, "time", types.SimpleNamespace(time=fake.time))
    return fake


def beat(folder: Path, node: str, rank: int, t: float, **fields) -> None:
    """One synthetic heartbeat line, as ``kit.monitor.heartbeat`` writes it."""
    line = {
        "time": t, "node": node, "rank": rank, "local_rank": rank % 2, "world_size": 4, "pid": 1,
        "status": "running", "step": None, "samples_per_s": None, "loss": None, "gpu_allocated_bytes": None,
        "gpu_reserved_bytes": None, "gpu_peak_allocated_bytes": None, "gpu_util_percent": None,
        "rss_bytes": None, "rss_peak_bytes": None,
    }  # fmt: skip
    path = monitor.heartbeat_path(folder, node, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    append_line(path, {**line, **fields})


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ------------------------------------------------------------------------------------------------ writing


def test_a_heartbeat_is_one_line_in_its_ranks_file(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert monitor.heartbeat(None, tmp_path, step=5, samples_per_s=2.5, loss=0.5, node="node a", label="x")
    (line,) = lines(tmp_path / "heartbeats" / "node_a-rank3.jsonl")
    assert line["node"] == "node a" and (line["rank"], line["local_rank"], line["world_size"]) == (3, 1, 4)
    assert (line["step"], line["samples_per_s"], line["loss"], line["label"]) == (5, 2.5, 0.5, "x")
    assert line["status"] == "running" and line["pid"] == os.getpid()
    assert line["gpu_allocated_bytes"] is None and line["gpu_util_percent"] is None  # no CUDA here
    # the resident set, against psutil's reading of the same process (a few pages may move between them)
    assert abs(line["rss_bytes"] - psutil.Process().memory_info().rss) < 8 * 2**20
    assert line["rss_peak_bytes"] >= line["rss_bytes"] > 0
    assert abs(line["time"] - time.time()) < 5


def test_on_a_gpu_the_memory_comes_from_torch_cuda_and_nvml(tmp_path, monkeypatch):
    """The CUDA branch with a stand-in for torch (this machine has no GPU): allocated, reserved and peak
    bytes from torch.cuda, utilisation from NVML through ``torch.cuda.utilization``, asked once per file
    when NVML is missing."""
    asked = []

    def utilization():
        asked.append(1)
        raise ModuleNotFoundError("nvidia-ml-py does not seem to be installed")

    cuda = types.SimpleNamespace(
        is_available=lambda: True, is_initialized=lambda: True, memory_allocated=lambda: 3 * 2**30,
        memory_reserved=lambda: 4 * 2**30, max_memory_allocated=lambda: 5 * 2**30, utilization=utilization,
    )  # fmt: skip
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    monitor.heartbeat(None, tmp_path, step=1, node="g")
    monitor.heartbeat(None, tmp_path, step=2, node="g")
    first, second = lines(monitor.heartbeat_path(tmp_path, "g", 0))
    gpu = ("gpu_allocated_bytes", "gpu_reserved_bytes", "gpu_peak_allocated_bytes", "gpu_util_percent")
    assert [first[k] for k in gpu] == [3 * 2**30, 4 * 2**30, 5 * 2**30, None] and len(asked) == 1
    cuda.utilization = lambda: 87
    monitor.heartbeat(None, tmp_path / "other", step=1, node="g")
    assert lines(monitor.heartbeat_path(tmp_path / "other", "g", 0))[0]["gpu_util_percent"] == 87
    row = monitor.read(tmp_path).rank(0)
    assert (row["memory"], row["memory_bytes"], row["peak_bytes"]) == ("gpu", 3 * 2**30, 5 * 2**30)
    assert row["rss_bytes"] == second["rss_bytes"] > 0


def test_the_engine_gives_rank_step_and_samples_per_s(tmp_path, clock):
    engine = types.SimpleNamespace(
        global_rank=1, local_rank=1, world_size=2, global_steps=10, global_samples=80
    )
    path = monitor.heartbeat_path(tmp_path, "n", 1)
    monitor.heartbeat(engine, tmp_path, node="n")  # no earlier count: no samples/s yet
    clock.now += 2.0
    engine.global_steps, engine.global_samples = 12, 96
    monitor.heartbeat(engine, tmp_path, node="n")
    clock.now += 1.0
    fresh = types.SimpleNamespace(global_rank=1, local_rank=1, world_size=2, global_steps=1, global_samples=8)
    monitor.heartbeat(fresh, tmp_path, node="n")  # another engine counts from 0: no samples/s
    first, second, third = lines(path)
    assert (first["rank"], first["world_size"], first["step"], first["samples_per_s"]) == (1, 2, 10, None)
    assert (second["step"], second["samples_per_s"]) == (12, (96 - 80) / 2.0)
    assert (third["step"], third["samples_per_s"]) == (1, None)


def test_every_s_rate_limits_running_beats_but_never_the_last(tmp_path, clock):
    written = []
    for dt, status in ((0.0, "running"), (0.5, "running"), (0.7, "running"), (0.1, "finished")):
        clock.now += dt
        written.append(monitor.heartbeat(None, tmp_path, step=1, status=status, every_s=1.0, node="n"))
    assert written == [True, False, True, True]
    assert [line["status"] for line in lines(monitor.heartbeat_path(tmp_path, "n", 0))] == [
        "running", "running", "finished"
    ]  # fmt: skip


def test_an_io_error_warns_once_and_never_raises(tmp_path):
    (tmp_path / "heartbeats").write_text("a file where the folder should be")
    with pytest.warns(UserWarning, match="cannot write heartbeats") as warned:
        assert monitor.heartbeat(None, tmp_path, step=1, node="n") is False
        assert monitor.heartbeat(None, tmp_path, step=2, node="n") is False
    assert len(warned) == 1


def test_bad_arguments_are_one_line():
    with pytest.raises(ValueError, match="^status: one of running, finished, failed, got 'done'$"):
        monitor.heartbeat(None, ".", status="done")
    with pytest.raises(ValueError, match="^every_s: seconds >= 0, got -1$"):
        monitor.heartbeat(None, ".", every_s=-1)


def test_running_ends_with_finished_or_failed(tmp_path):
    with monitor.running(None, tmp_path, node="ok") as report:
        report(step=0, loss=1.0)
        report(step=1, loss=0.5)
    with pytest.raises(RuntimeError), monitor.running(None, tmp_path, node="bad") as report:
        report(step=0)
        raise RuntimeError("boom\nsecond line")
    snap = monitor.read(tmp_path)
    ok, bad = snap.rank(0, "ok"), snap.rank(0, "bad")
    assert (ok["state"], ok["step"], ok["loss"], ok["heartbeats"]) == ("finished", 1, 0.5, 3)
    assert (bad["state"], bad["step"], bad["error"]) == ("failed", 0, "RuntimeError: boom")


# ------------------------------------------------------------------------------------------------ reading


def test_states_follow_the_last_heartbeat_and_its_age(tmp_path):
    for rank, (t, status) in enumerate([(99.0, "running"), (94.0, "running"), (60.0, "running")]):
        beat(tmp_path, "a", rank, t, status=status, step=rank)
    beat(tmp_path, "b", 3, 10.0, step=7)
    beat(tmp_path, "b", 3, 11.0, status="finished")
    beat(tmp_path, "b", 4, 50.0, status="failed", error="RuntimeError: x")
    snap = monitor.read(tmp_path, now=100.0)
    assert [(r["node"], r["rank"], r["state"]) for r in snap.ranks] == [
        ("a", 0, "online"), ("a", 1, "stale"), ("a", 2, "offline"), ("b", 3, "finished"), ("b", 4, "failed"),
    ]  # fmt: skip
    assert [r["age_s"] for r in snap.ranks] == [1.0, 6.0, 40.0, 89.0, 50.0]
    assert snap.rank(3)["step"] == 7  # the finished line did not repeat it
    assert snap.job["states"] == {"online": 1, "stale": 1, "offline": 1, "finished": 1, "failed": 1}
    # the thresholds: at the boundary a rank is still the younger state
    later = monitor.read(tmp_path, now=104.0, stale_s=5.0, offline_s=10.0)
    assert [r["state"] for r in later.ranks[:3]] == ["online", "stale", "offline"]
    assert monitor.read(tmp_path, now=101.0, stale_s=1.0, offline_s=2.0).rank(0)["state"] == "stale"


def test_averages_per_node_and_job_and_peaks(tmp_path):
    mib = 2**20
    beat(tmp_path, "a", 0, 1.0, step=1, samples_per_s=10.0, rss_bytes=100 * mib, rss_peak_bytes=150 * mib)
    beat(tmp_path, "a", 0, 2.0, step=2, samples_per_s=20.0, rss_bytes=120 * mib, rss_peak_bytes=130 * mib)
    beat(tmp_path, "a", 1, 2.0, step=3, samples_per_s=30.0, rss_bytes=200 * mib, rss_peak_bytes=210 * mib)
    gpu = {"gpu_allocated_bytes": 1000 * mib, "gpu_peak_allocated_bytes": 1500 * mib, "gpu_util_percent": 90}
    beat(tmp_path, "b", 2, 2.0, step=2, samples_per_s=40.0, rss_bytes=300 * mib, **gpu)
    snap = monitor.read(tmp_path, now=3.0)
    a0, a1, b2 = snap.ranks
    assert (a0["memory"], a0["memory_bytes"], a0["peak_bytes"]) == ("rss", 120 * mib, 150 * mib)
    assert (a0["samples_per_s"], a0["samples_per_s_mean"], a0["heartbeats"]) == (20.0, 15.0, 2)
    assert (b2["memory"], b2["memory_bytes"], b2["peak_bytes"]) == ("gpu", 1000 * mib, 1500 * mib)
    assert b2["rss_bytes"] == 300 * mib and b2["gpu_util_percent"] == 90
    node_a, node_b = snap.nodes
    assert node_a == {
        "node": "a", "ranks": 2,
        "states": {"online": 2, "stale": 0, "offline": 0, "finished": 0, "failed": 0},
        "samples_per_s_mean": 25.0, "memory_bytes_mean": 160 * mib, "peak_bytes_max": 210 * mib,
        "gpu_util_percent_mean": None, "step_min": 2, "step_max": 3,
        "measured_step_min": 2, "measured_step_max": 3, "warming_up": 0,
    }  # fmt: skip
    assert node_b["samples_per_s_mean"] == 40.0 and node_b["gpu_util_percent_mean"] == 90
    job = snap.job
    assert (job["nodes"], job["ranks"], job["world_size"]) == (2, 3, 4)
    assert job["samples_per_s_mean"] == pytest.approx((20 + 30 + 40) / 3)
    assert job["memory_bytes_mean"] == pytest.approx((120 + 200 + 1000) * mib / 3)
    assert (job["peak_bytes_max"], job["step_min"], job["step_max"]) == (1500 * mib, 2, 3)
    history = snap.history_frame()
    assert len(history) == 4 and history["seconds"].tolist() == [0.0, 1.0, 1.0, 1.0]
    assert snap.frame()["state"].tolist() == ["online"] * 3


def test_steps_count_from_1_after_the_warm_up_in_every_view():
    """The one numbering of steps: a loop's step (from 0, warm-up first, as records and heartbeats keep
    it) is the measured step from 1, and a warm-up step is named as one, never counted as measured."""
    from kit.run.sweep import _postfix

    assert [monitor.measured_step(s, 2) for s in (None, 0, 1, 2, 3)] == [None, None, None, 1, 2]
    assert monitor.measured_step(0, 0) == 1  # no warm-up: the first step is step 1
    labels = [monitor.step_label(s, 2, 3) for s in range(5)]
    assert labels == ["warm-up 1 of 2", "warm-up 2 of 2", "step 1 of 3", "step 2 of 3", "step 3 of 3"]
    assert (monitor.step_label(4, 1), monitor.step_label(4, None), monitor.step_label(None)) == (
        "step 4", "step 4", None,
    )  # fmt: skip
    # the sweep's progress bar: the first measured step after 2 warm-up steps is step 1 of 5
    event = {"label": "z2 bf16 mb2", "step": 2, "samples_per_s": 12.0, "memory_bytes": 3 * 2**20}
    assert _postfix(event, warmup=2, steps=5) == "z2 bf16 mb2 step 1 of 5 12.0 samples/s 3 MiB"


def sweep_folder(folder: Path, run_id: str = "20250101T000000.000000001", warmup: int = 2, steps: int = 3):
    """A kit sweep's launch spec (``kit.run.sweep``: ``launch-<run_id>.json``), the fields the reader uses."""
    folder.mkdir(parents=True, exist_ok=True)
    spec = {"sweep": folder.name, "run_id": run_id, "records": str(folder / "records.jsonl")}
    (folder / f"launch-{run_id}.json").write_text(json.dumps({**spec, "steps": steps, "warmup": warmup}))
    return run_id


def test_a_sweeps_warm_up_is_named_and_its_measured_steps_count_from_1(tmp_path, capsys):
    """A kit sweep's ranks beat at every step, warm-up included, with the loop's count (0, 1 warm-up;
    2, 3, 4 measured); the reader finds the warm-up in the launch spec: rank 0 at loop step 3 is at
    measured step 2 of 3, rank 1 at loop step 1 in its warm-up (no measured step yet), and a finished
    rank ends at step 3 of 3. ``zerokit monitor --json`` and the panel say the same."""
    from kit.lab.monitor_panel import monitor_panel

    run_id = sweep_folder(tmp_path)
    sweep = {"run_id": run_id, "sweep": tmp_path.name, "label": "z2 bf16 mb2"}
    beat(tmp_path, "a", 0, 1.0, **sweep)  # the configuration starts: no step yet
    for t, step in enumerate((0, 1, 2, 3), start=2):
        beat(tmp_path, "a", 0, float(t), step=step, **sweep)
    beat(tmp_path, "a", 1, 3.0, step=0, **sweep)
    beat(tmp_path, "a", 1, 4.0, step=1, **sweep)
    snap = monitor.read(tmp_path, now=5.0)
    keys = ("step", "measured_step", "warmup_step", "sweep_warmup", "sweep_steps", "progress")
    assert [[r[k] for k in keys] for r in snap.ranks] == [
        [3, 2, None, 2, 3, "step 2 of 3"],  # ``step`` as the loop wrote it, the measured one beside it
        [1, None, 2, 2, 3, "warm-up 2 of 2"],
    ]
    job = snap.job
    assert (job["step_min"], job["step_max"]) == (1, 3)  # as written
    assert (job["measured_step_min"], job["measured_step_max"], job["warming_up"]) == (2, 2, 1)
    assert monitor.steps_range(snap.job) == "step 2 (1 rank in warm-up)"
    written = [(line["step"], line["measured_step"]) for line in snap.history if line["rank"] == 0]
    assert written == [(None, None), (0, None), (1, None), (2, 1), (3, 2)]  # the loop's count kept
    out = cli_json(tmp_path, capsys)
    assert [(r["rank"], r["step"], r["measured_step"], r["progress"]) for r in out["ranks"]] == [
        (0, 3, 2, "step 2 of 3"), (1, 1, None, "warm-up 2 of 2"),
    ]  # fmt: skip
    assert (out["job"]["step_min"], out["job"]["measured_step_min"]) == (1, 2)
    text = monitor_cli.table(snap)
    assert "step 2 of 3" in text and "warm-up 2 of 2" in text and "step 2 (1 rank in warm-up)" in text
    panel = monitor_panel(tmp_path)
    assert "warm-up 2 of 2" in panel.ranks.value and "step 2 of 3" in panel.ranks.value
    assert "step 2 (1 rank in warm-up)" in panel.nodes.value
    # the last measured step, then the finished line (which repeats no step)
    beat(tmp_path, "a", 0, 6.0, step=4, **sweep)
    beat(tmp_path, "a", 0, 6.5, status="finished", **sweep)
    done = monitor.read(tmp_path, now=7.0).rank(0)
    assert (done["state"], done["step"], done["measured_step"], done["progress"]) == (
        "finished", 4, 3, "step 3 of 3",
    )  # fmt: skip
    # every rank still warming up: the steps read "warm-up", not a step number
    warming = tmp_path / "warming"
    run_id = sweep_folder(warming, warmup=1)
    beat(warming, "a", 0, 1.0, step=0, run_id=run_id)
    job = monitor.read(warming, now=2.0).job
    assert (job["step_min"], job["measured_step_min"], job["warming_up"]) == (0, None, 1)
    assert monitor.steps_range(job) == "warm-up"
    assert monitor.steps_range({"measured_step_min": None, "warming_up": 0}) is None


def test_a_loop_without_a_launch_spec_keeps_its_own_step(tmp_path):
    """Any other loop's step is shown as it wrote it (its warm-up, if any, is unknown to the reader); a
    run id whose spec is missing or unreadable is such a loop too."""
    beat(tmp_path, "a", 0, 1.0, step=0, warmup=500, steps=10_000)  # a loop's own keys (its LR warm-up)
    beat(tmp_path, "a", 1, 1.0, step=7, run_id="no-such-launch")
    (tmp_path / "launch-bad.json").write_text("{not json")
    beat(tmp_path, "a", 2, 1.0, step=3, run_id="bad")
    beat(tmp_path, "a", 3, 1.0, step=3, run_id="../../etc/passwd")
    snap = monitor.read(tmp_path, now=2.0)
    assert [(r["step"], r["measured_step"], r["sweep_warmup"], r["progress"]) for r in snap.ranks] == [
        (0, 0, None, "step 0"), (7, 7, None, "step 7"), (3, 3, None, "step 3"), (3, 3, None, "step 3"),
    ]  # fmt: skip
    assert monitor.steps_range(snap.job) == "steps 0-7"
    assert monitor.launch_steps(tmp_path, "../../etc/passwd") is None
    assert (snap.history[0]["warmup"], snap.history[0]["steps"]) == (500, 10_000)  # kept, not read


def test_a_torn_last_line_is_skipped(tmp_path):
    beat(tmp_path, "a", 0, 1.0, step=1)
    with open(monitor.heartbeat_path(tmp_path, "a", 0), "a") as f:
        f.write('{"time": 2.0, "node": "a", "ra')  # a rank killed mid-write
    assert monitor.read(tmp_path, now=2.0).rank(0)["step"] == 1


def test_heartbeat_files_in_the_folder_itself_are_read_too(tmp_path):
    beat(tmp_path, "a", 0, 1.0, step=4)
    assert monitor.read(tmp_path / "heartbeats", now=2.0).rank(0)["step"] == 4


def test_read_refuses_a_folder_without_heartbeats_and_bad_thresholds(tmp_path):
    with pytest.raises(ValueError, match=r"^folder: .*missing holds no heartbeats"):
        monitor.read(tmp_path / "missing")
    (tmp_path / "heartbeats").mkdir()
    with pytest.raises(ValueError, match="^folder: .* holds no heartbeats"):
        monitor.read(tmp_path)
    beat(tmp_path, "a", 0, 1.0)
    with pytest.raises(ValueError, match=r"^offline_s: seconds > stale_s \(5\), got 5"):
        monitor.read(tmp_path, offline_s=5)
    with pytest.raises(ValueError, match="^stale_s: seconds > 0, got 0"):
        monitor.read(tmp_path, stale_s=0)


# ---------------------------------------------------------------------------------------------------- CLI


def cli_json(folder: Path, capsys, *flags: str) -> dict:
    capsys.readouterr()
    assert main(["monitor", str(folder), "--once", "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_once_json_is_the_snapshot(tmp_path, capsys):
    now = time.time()
    beat(tmp_path, "a", 0, now, step=3, samples_per_s=5.0, rss_bytes=2**20)
    beat(tmp_path, "a", 1, now - 3.0, step=2, rss_bytes=2**20)
    out = cli_json(tmp_path, capsys, "--stale-s", "1", "--offline-s", "60")
    assert out.keys() == JSON_KEYS and (out["stale_s"], out["offline_s"]) == (1.0, 60.0)
    assert [(r["rank"], r["state"], r["step"]) for r in out["ranks"]] == [(0, "online", 3), (1, "stale", 2)]
    assert out["job"]["states"]["stale"] == 1 and out["nodes"][0]["node"] == "a"
    # the terminal view: per node its averages and a row per rank, the job last
    assert main(["monitor", str(tmp_path), "--once", "--stale-s", "1"]) == 0
    text = capsys.readouterr().out
    assert "node a: 2 rank(s) (1 online, 1 stale)" in text
    assert text.rstrip().splitlines()[-1].startswith("job: 2 rank(s) (1 online, 1 stale); steps 2-3")


def test_cli_bad_folder_or_flags_exit_2_with_one_line(tmp_path):
    def zerokit(*argv: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "kit", "monitor", *argv]
        return subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=120)

    done = zerokit(str(tmp_path / "nope"), "--once", "--json")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"zerokit monitor: folder: {tmp_path / 'nope'} holds no heartbeats")
    assert len(done.stderr.splitlines()) == 1
    done = zerokit(str(tmp_path), "--stale-s", "3", "--offline-s", "2")
    assert (done.returncode, done.stderr) == (
        2,
        "zerokit monitor: --offline-s: seconds > --stale-s (3), got 2\n",
    )
    done = zerokit(str(tmp_path), "--interval", "0")
    assert (done.returncode, done.stderr) == (2, "zerokit monitor: --interval: seconds > 0, got 0\n")


#: starts the rest of argv (a Python command line) with SIGINT at the disposition named by argv[1]
WITH_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, getattr(signal, sys.argv[1]));"
    "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])"
)


@pytest.mark.parametrize("sigint", ["SIG_DFL", "SIG_IGN"])
def test_cli_refreshes_until_ctrl_c_and_exits_0(tmp_path, sigint):
    """Without --once it prints a table per refresh (to a pipe: no screen clearing) and sees new ranks
    arrive; Ctrl-C (SIGINT) ends it with exit 0, also when it was started with SIGINT ignored (as a
    non-interactive shell starts a background job, e.g. ``make test &``: the child inherits SIG_IGN,
    and Python then never raises KeyboardInterrupt). The disposition is set here, not inherited from
    however pytest was started."""
    beat(tmp_path, "a", 0, time.time(), step=1)
    command = [sys.executable, "-c", WITH_SIGINT, sigint, "-m", "kit", "monitor", str(tmp_path)]
    command += ["--interval", "0.2"]
    watching = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(watching.stdout), daemon=True)
    reader.start()

    def wait_for(text: str, times: int) -> None:
        deadline = time.monotonic() + 60
        while sum(line.startswith(text) for line in list(out)) < times:
            assert time.monotonic() < deadline and watching.poll() is None, "".join(out)
            time.sleep(0.1)

    try:
        wait_for("job: 1 rank(s) (", 1)
        beat(tmp_path, "a", 1, time.time(), step=2)
        wait_for("job: 2 rank(s) (", 2)
        watching.send_signal(signal.SIGINT)
        assert watching.wait(timeout=60) == 0, watching.stderr.read()
    finally:
        if watching.poll() is None:
            watching.kill()
    reader.join(timeout=10)
    assert "\x1b[" not in "".join(out) and sum(line.startswith("node a: ") for line in out) >= 3


# ------------------------------------------------------------------------------------- plots and panel


def test_the_heartbeats_plot_has_a_line_per_rank(tmp_path):
    from kit.lab import plots

    for t in (1.0, 2.0, 3.0):
        beat(tmp_path, "a", 0, t, step=int(t), samples_per_s=t, rss_bytes=int(t) * 2**20)
        beat(tmp_path, "a", 1, t, step=int(t), rss_bytes=2 * 2**20)
    memory_ax, speed_ax = plots.heartbeats(monitor.read(tmp_path, now=4.0)).axes
    assert [line.get_label() for line in memory_ax.get_lines()] == ["a rank 0", "a rank 1"]
    assert memory_ax.get_lines()[0].get_ydata().tolist() == [1.0, 2.0, 3.0]  # MiB
    assert memory_ax.get_lines()[0].get_xdata().tolist() == [0.0, 1.0, 2.0]
    assert speed_ax.get_lines()[0].get_ydata().tolist() == [1.0, 2.0, 3.0]
    assert len(speed_ax.get_lines()[1].get_xdata()) == 0  # rank 1 reported no samples/s


def test_the_monitor_panel_refreshes_by_button_and_timer(tmp_path):
    from kit.lab.comparison_panel import ComparisonPanel
    from kit.lab.monitor_panel import monitor_panel

    panel = monitor_panel(tmp_path, interval_s=0.05)
    # before the first heartbeat: a waiting line, not an error, and no (broken, empty) image
    assert panel.snapshot is None and panel.error is None and panel.plot.layout.display == "none"
    assert (
        "waiting for the first heartbeat in" in panel.message.value
        and "color:#b00" not in panel.message.value
    )
    assert (
        monitor_panel(tmp_path, stale_s=-1).error == "stale_s: seconds > 0, got -1"
    )  # a real error stays one
    beat(tmp_path, "a", 0, time.time(), step=1, rss_bytes=2**20)
    panel.refresh_button.click()
    assert panel.snapshot.rank(0)["state"] == "online" and panel.error is None
    assert "online" in panel.ranks.value and "1 online" in panel.message.value
    assert (
        panel.plot.layout.display == "none" and "plots start at the second heartbeat" in panel.message.value
    )
    beat(tmp_path, "a", 0, time.time() + 0.5, step=2, rss_bytes=2**20)
    panel.refresh()
    assert panel.plot.value and panel.plot.layout.display is None  # one instant would span 0.002 s
    panel.auto.value = True  # the timer
    beat(tmp_path, "a", 0, time.time(), status="finished")
    deadline = time.monotonic() + 30
    while panel.snapshot.rank(0)["state"] != "finished" and time.monotonic() < deadline:
        time.sleep(0.05)
    panel.stop()
    assert panel.snapshot.rank(0)["state"] == "finished" and panel.auto.value is False
    assert not panel._timer.is_alive()
    # the comparison panel shows the monitor of the sweep it runs
    compare = ComparisonPanel(runs_dir=tmp_path.parent, sweep=tmp_path.name)
    assert compare.monitor().folder == tmp_path and compare.monitor().snapshot.job["ranks"] == 1


def test_measure_reads_the_peak_rss_with_the_monitor_reader():
    from kit.ranks import measure

    assert measure.peak_rss_bytes() == monitor.rss_bytes(peak=True) >= monitor.rss_bytes() > 0


# ------------------------------------------------------------------------------------- two real CPU ranks


@pytest.mark.distributed
def test_a_killed_rank_turns_stale_then_offline_while_the_other_reports(tmp_path, capsys):
    """Two ranks of a training loop (``heartbeat_loop.py``, a heartbeat every 0.1 s); SIGKILL rank 1; with
    ``--stale-s 2 --offline-s 6`` it reads stale first, then offline, while rank 0 stays online and its
    step goes on; rank 0 then ends its loop and reads finished."""
    job = tmp_path / "job"
    flags = ("--stale-s", "2", "--offline-s", "6")
    env = {**os.environ, "WORLD_SIZE": "2", "PYTHONPATH": str(REPO)}
    ranks = [
        subprocess.Popen(
            [sys.executable, str(LOOP), str(job), "--step-s", "0.1"],
            cwd=REPO,
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
        )  # fmt: skip
        for r in (0, 1)
    ]

    def poll(until, timeout_s: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            out = cli_json(job, capsys, *flags) if monitor.heartbeat_files(job) else None
            if out is not None and until(out):
                return out
            assert time.monotonic() < deadline, f"timed out; last snapshot: {out}"
            time.sleep(0.2)

    def of(out: dict, rank: int) -> dict:
        return next(r for r in out["ranks"] if r["rank"] == rank)

    try:
        started = poll(lambda o: len(o["ranks"]) == 2 and all(r["heartbeats"] >= 3 for r in o["ranks"]))
        assert [r["state"] for r in started["ranks"]] == ["online", "online"]
        ranks[1].kill()  # SIGKILL: no finished line, no cleanup
        ranks[1].wait(timeout=30)
        first = poll(lambda o: of(o, 1)["state"] != "online")
        assert of(first, 1)["state"] == "stale" and 2.0 < of(first, 1)["age_s"] <= 6.0
        assert of(first, 0)["state"] == "online"
        poll(lambda o: of(o, 1)["state"] == "offline", timeout_s=30)
        command = [sys.executable, "-m", "kit", "monitor", str(job), "--once", "--json", *flags]
        done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=120)
        assert done.returncode == 0, done.stderr
        later = json.loads(done.stdout)
        assert of(later, 1)["state"] == "offline" and of(later, 1)["step"] == of(first, 1)["step"]
        assert of(later, 0)["state"] == "online" and of(later, 0)["step"] > of(first, 0)["step"]
        assert later["job"]["states"] == {"online": 1, "stale": 0, "offline": 1, "finished": 0, "failed": 0}
        (job / "stop").touch()
        assert ranks[0].wait(timeout=60) == 0
        final = cli_json(job, capsys, *flags)
        assert [r["state"] for r in final["ranks"]] == ["finished", "offline"]
        assert of(final, 0)["step"] >= of(later, 0)["step"] and of(final, 0)["samples_per_s"] > 0
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
                rank.wait()
