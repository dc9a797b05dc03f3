"""kit.run.launcher: argument lists, rank environment, process-group cleanup (no DeepSpeed launch here)."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import pytest

from kit.paths import PACKAGE_PARENT
from kit.run import launcher

#: its process-group tests time what they start: one at a time, beside no other test
pytestmark = pytest.mark.distributed

DEEPSPEED = str(Path(sys.executable).parent / "deepspeed")

#: a process that starts a child in its own process group, prints the child's pid, then waits forever
PARENT_WITH_CHILD = (
    "import subprocess, sys, time;"
    "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
    "print('child', c.pid, flush=True); time.sleep(600)"
)


def test_one_machine_gets_torchrun_and_a_hostfile_deepspeed_unless_asked(tmp_path):
    assert launcher.launch_argv("kit.ranks.worker", [], 2, master_port=1)[:3] == [
        sys.executable, "-m", "torch.distributed.run",
    ]  # fmt: skip
    assert (
        launcher.launch_argv("t.py", [], 1, nnodes=2, hostfile=tmp_path / "h", master_port=1)[0] == DEEPSPEED
    )


def test_deepspeed_single_node_argv():
    argv = launcher.launch_argv(
        "kit.ranks.worker", ["--spec", "s.json"], 2, launcher="deepspeed", master_port=29512
    )
    assert argv == [
        DEEPSPEED, "--num_gpus", "2", "--master_addr", "127.0.0.1", "--master_port", "29512",
        "--module", "kit.ranks.worker", "--spec", "s.json",
    ]  # fmt: skip


def test_deepspeed_multi_node_argv_runs_one_node_without_ssh(tmp_path):
    hostfile = tmp_path / "hostfile"
    argv = launcher.launch_argv(
        "train.py", [], 1, nnodes=2, node_rank=1, master_addr="10.0.0.1", master_port=29600, hostfile=hostfile
    )
    assert argv == [
        DEEPSPEED, "--num_gpus", "1", "--master_addr", "10.0.0.1", "--master_port", "29600",
        "--hostfile", str(hostfile), "--no_ssh", "--node_rank", "1", "--num_nodes", "2", "train.py",
    ]  # fmt: skip


def test_torchrun_argv():
    argv = launcher.launch_argv(
        "kit.ranks.worker", ["--x"], 4, launcher="torchrun", nnodes=2, node_rank=0, master_port=1
    )
    assert argv == [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "4", "--nnodes", "2",
        "--node_rank", "0", "--master_addr", "127.0.0.1", "--master_port", "1",
        "-m", "kit.ranks.worker", "--x",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nprocs": 0}, "nprocs: must be >= 1, got 0"),
        ({"nprocs": 2, "nnodes": 2, "node_rank": 2}, "node_rank: must be in 0..1 for nnodes=2, got 2"),
        (
            {"nprocs": 2, "launcher": "mpirun"},
            "launcher: choose torchrun or deepspeed on this machine, got 'mpirun'",
        ),
        (
            {"nprocs": 2, "nnodes": 2, "launcher": "deepspeed"},
            "hostfile: the deepspeed launcher needs a hostfile for nnodes > 1",
        ),
    ],
)
def test_invalid_launch_is_one_clear_error(kwargs, message):
    with pytest.raises(ValueError) as error:
        launcher.launch_argv("kit.ranks.worker", [], **kwargs)
    assert str(error.value) == message


def test_free_port_can_be_bound():
    port = launcher.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
    assert 1024 <= port <= 65535


def test_worker_env_splits_cores_and_selects_cpu_without_cuda(monkeypatch):
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    cores = len(os.sched_getaffinity(0))
    env = launcher.worker_env(2)
    assert env["OMP_NUM_THREADS"] == str(max(1, cores // 2))
    assert launcher.worker_env(10 * cores)["OMP_NUM_THREADS"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(PACKAGE_PARENT)
    import torch

    assert env.get("DS_ACCELERATOR") == (None if torch.cuda.is_available() else "cpu")


def test_run_launch_streams_lines_and_returns_exit_status():
    seen = []
    argv = [sys.executable, "-c", "print('one'); print('two'); raise SystemExit(3)"]
    rc, output = launcher.run_launch(argv, dict(os.environ), 30, seen.append)
    assert (rc, output, seen) == (3, "one\ntwo", ["one", "two"])


def _child_pid(output: str) -> int:
    return int(output.split("child ")[1].split()[0])


def _gone(pid: int, wait_s: float = 5.0) -> bool:
    """The process has ended (or is a zombie) within ``wait_s``: SIGKILL is delivered asynchronously."""
    stop = time.monotonic() + wait_s
    while time.monotonic() < stop:
        try:
            if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_timeout_kills_the_whole_process_group():
    start = time.monotonic()
    rc, output = launcher.run_launch([sys.executable, "-c", PARENT_WITH_CHILD], dict(os.environ), 2.0)
    assert rc == launcher.TIMEOUT_RC
    assert time.monotonic() - start < 2.0 + 2 * launcher.GRACE_S
    assert _gone(_child_pid(output))


#: the same, its child in a session of its own (as torchrun starts each rank): out of the launch's group
SESSION_CHILD = PARENT_WITH_CHILD.replace("sleep(600)']", "sleep(600)'], start_new_session=True")


def test_timeout_kills_a_rank_that_left_the_process_group():
    sessions = []

    def on_line(line: str) -> None:
        child = _child_pid(line)
        sessions.append((child, os.getsid(child)))

    rc, _ = launcher.run_launch([sys.executable, "-c", SESSION_CHILD], dict(os.environ), 1.0, on_line)
    [(child, session)] = sessions
    assert rc == launcher.TIMEOUT_RC and session == child  # its own session, not the launch's group
    assert _gone(child)


def test_watchdog_deadline_kills_before_the_timeout():
    start = time.monotonic()
    rc, output = launcher.run_launch(
        [sys.executable, "-c", PARENT_WITH_CHILD], dict(os.environ), 600, deadline=lambda: start + 1.0
    )
    assert rc == launcher.TIMEOUT_RC
    assert time.monotonic() - start < 1.0 + 2 * launcher.GRACE_S
    assert _gone(_child_pid(output))


def test_keyboard_interrupt_kills_the_group_and_propagates():
    pids = []

    def interrupt(line: str) -> None:
        pids.append(_child_pid(line))
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        launcher.run_launch([sys.executable, "-c", PARENT_WITH_CHILD], dict(os.environ), 600, interrupt)
    assert _gone(pids[0])


def test_cancel_kills_the_whole_process_group_and_returns():
    stop = {"now": False}
    groups = []

    def on_line(line: str) -> None:
        groups.append(os.getpgid(_child_pid(line)))  # the launch's group: the child did not leave it
        stop["now"] = True  # as a Stop button would, once the launch is under way

    start = time.monotonic()
    rc, _ = launcher.run_launch(
        [sys.executable, "-c", PARENT_WITH_CHILD], dict(os.environ), 600, on_line, cancel=lambda: stop["now"]
    )
    assert rc == launcher.CANCEL_RC
    assert time.monotonic() - start < 2 * launcher.GRACE_S
    with pytest.raises(ProcessLookupError):  # kill_launch returns once the whole group is gone
        os.killpg(groups[0], 0)
