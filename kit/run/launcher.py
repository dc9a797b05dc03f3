"""Start multi-process runs: torchrun or DeepSpeed's launcher as a subprocess in its own process group.

The one place the kit starts ranks. Commands are argument lists (never a shell), each launch gets a
free master port, and a timeout, a watchdog, a cancel hook or Ctrl-C kills the whole process group
(launcher and every rank), so nothing is left behind. Without CUDA the ranks run on CPU
(``DS_ACCELERATOR=cpu``, gloo); with CUDA the same command uses NCCL.
"""

from __future__ import annotations

import collections
import contextlib
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from kit.paths import PACKAGE_PARENT

#: exit status reported when a launch was killed for running past its time (as coreutils ``timeout``).
TIMEOUT_RC = 124
#: exit status reported when a launch was stopped by its ``cancel`` hook (as a shell reports SIGINT).
CANCEL_RC = 130
#: how many of the last output lines ``run_launch`` keeps.
KEEP_LINES = 5000
#: seconds between SIGTERM and SIGKILL when stopping a process group.
GRACE_S = 3.0


def free_port() -> int:
    """A TCP port that is free on this machine now (the OS picks it; tiny race until the launch binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: the launcher for a run on this machine alone: torchrun starts 2 CPU ranks about 4 s sooner than
#: ``deepspeed --num_gpus``, whose runner and per-node launch each import DeepSpeed before the ranks start
LOCAL = "torchrun"
#: the launchers of one node's ranks
LAUNCHERS = ("torchrun", "deepspeed")


def check_launcher(name: str | None) -> None:
    """ValueError, one line, unless ``name`` is one of ``LAUNCHERS`` (None: the default)."""
    if name is not None and name not in LAUNCHERS:
        raise ValueError(f"launcher: choose {' or '.join(LAUNCHERS)} on this machine, got {name!r}")


def launch_argv(
    script: str,
    script_args: list[str],
    nprocs: int,
    *,
    launcher: str | None = None,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
    hostfile: str | os.PathLike | None = None,
) -> list[str]:
    """The argument list that starts ``nprocs`` ranks of ``script`` on this node.

    ``script`` is a file path (``*.py``) or a module name (``kit.ranks.worker``: ``-m``/``--module``).
    ``launcher`` defaults to ``deepspeed`` with a ``hostfile``, else ``LOCAL``. ``launcher="deepspeed"``
    uses the ``deepspeed`` command next to ``sys.executable``; with a ``hostfile`` it runs this node only
    (``--no_ssh --node_rank``): start one launch per node, as a two-node test on one machine does.
    ``launcher="torchrun"`` uses ``python -m torch.distributed.run`` with the same rendezvous
    (``--nnodes --node_rank --master_addr --master_port``).
    """
    if nprocs < 1:
        raise ValueError(f"nprocs: must be >= 1, got {nprocs}")
    if nnodes < 1 or not 0 <= node_rank < nnodes:
        raise ValueError(f"node_rank: must be in 0..{nnodes - 1} for nnodes={nnodes}, got {node_rank}")
    check_launcher(launcher)
    launcher = launcher or ("deepspeed" if hostfile is not None else LOCAL)
    port = master_port or free_port()
    is_module = not script.endswith(".py")
    if launcher == "deepspeed":
        exe = Path(sys.executable).parent / "deepspeed"
        if not exe.exists():
            raise ValueError(
                f"launcher: no deepspeed command next to {sys.executable}; pip install deepspeed"
            )
        argv = [str(exe), "--num_gpus", str(nprocs), "--master_addr", master_addr, "--master_port", str(port)]
        if hostfile is not None:
            argv += ["--hostfile", str(hostfile), "--no_ssh", "--node_rank", str(node_rank)]
            argv += ["--num_nodes", str(nnodes)]
        elif nnodes > 1:
            raise ValueError("hostfile: the deepspeed launcher needs a hostfile for nnodes > 1")
        return argv + (["--module", script] if is_module else [script]) + list(script_args)
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nprocs)]  # torchrun
    argv += ["--nnodes", str(nnodes), "--node_rank", str(node_rank)]
    argv += ["--master_addr", master_addr, "--master_port", str(port)]
    return argv + (["-m", script] if is_module else [script]) + list(script_args)


def ranks_accelerator() -> str:
    """The accelerator the ranks will use: ``DS_ACCELERATOR`` when set, else ``cuda`` where torch sees a
    GPU and ``cpu`` otherwise (what ``worker_env`` arranges)."""
    import torch

    return os.environ.get("DS_ACCELERATOR") or ("cuda" if torch.cuda.is_available() else "cpu")


def on_this_accelerator(env: dict[str, str]) -> dict[str, str]:
    """``env`` with ``DS_ACCELERATOR=cpu`` where torch sees no GPU (unless it names one): DeepSpeed then
    takes the CPU accelerator without warning about it. The ranks' and JupyterLab's kernels' rule."""
    import torch

    if not torch.cuda.is_available():
        env.setdefault("DS_ACCELERATOR", "cpu")
    return env


def worker_env(nprocs: int) -> dict[str, str]:
    """Environment for the ranks: this one plus the kit on PYTHONPATH, CPU accelerator without CUDA,
    and ``OMP_NUM_THREADS = max(1, cores // ranks)`` (the deepspeed launcher leaves it unset, and two
    ranks with all cores each oversubscribe the machine: a step was 3x slower)."""
    env = on_this_accelerator(dict(os.environ))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    env["OMP_NUM_THREADS"] = str(max(1, cores // nprocs))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_PARENT), env.get("PYTHONPATH")) if p)
    # this Python's bin first: the ranks JIT-build DeepSpeed ops (async_io for NVMe offload) with the venv's
    # ninja; a system ninja of another version hashes the commands differently and rebuilds every op
    env["PATH"] = os.pathsep.join(p for p in (os.path.dirname(sys.executable), env.get("PATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def start_launch(
    argv: list[str], env: dict[str, str], cwd: str | os.PathLike | None = None
) -> subprocess.Popen:
    """Start ``argv`` in a new session (its own process group), stdout and stderr merged, line-buffered."""
    return subprocess.Popen(
        argv,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        start_new_session=True,
    )


def kill_launch(proc: subprocess.Popen) -> None:
    """Stop the launch's whole process group: SIGTERM, ``GRACE_S`` to exit, then SIGKILL to whatever is
    left in the group (ranks outliving their launcher too) and to every process the launch started in a
    session of its own (torchrun starts each rank so), so nothing is orphaned."""
    import psutil

    started = []
    with contextlib.suppress(psutil.Error):
        started = psutil.Process(proc.pid).children(recursive=True)  # before the launcher can exit
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=GRACE_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    for child in started:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(started, timeout=GRACE_S)
    # SIGKILL lands asynchronously and orphaned ranks are reaped by init: wait until the group is gone
    stop = time.monotonic() + GRACE_S
    while time.monotonic() < stop:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)


def run_launch(
    argv: list[str],
    env: dict[str, str],
    timeout_s: float,
    on_line: Callable[[str], None] | None = None,
    *,
    deadline: Callable[[], float | None] | None = None,
    cancel: Callable[[], bool] | None = None,
    cwd: str | os.PathLike | None = None,
) -> tuple[int, str]:
    """Run a launch to completion, streaming each output line to ``on_line``.

    Returns ``(rc, output)``: the exit status (``TIMEOUT_RC`` when killed for time) and the last
    ``KEEP_LINES`` lines. The group is killed after ``timeout_s`` seconds, or when ``deadline()`` (a
    watchdog polled twice a second, returning a ``time.monotonic()`` instant or None) has passed. When
    ``cancel()`` (polled as often; e.g. ``threading.Event().is_set``) is true, the group is killed and
    ``CANCEL_RC`` returned. KeyboardInterrupt kills the group and is re-raised.
    """
    proc = start_launch(argv, env, cwd)
    lines: queue.Queue[str | None] = queue.Queue()
    reader = threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True)
    reader.start()
    kept: collections.deque[str] = collections.deque(maxlen=KEEP_LINES)
    stop_at = time.monotonic() + timeout_s
    try:
        while True:
            try:
                line = lines.get(timeout=0.5)
            except queue.Empty:
                line = ""
            if line is None:
                break
            if line:
                kept.append(line)
                if on_line is not None:
                    on_line(line)
            if cancel is not None and cancel():
                kill_launch(proc)
                reader.join(timeout=GRACE_S)
                return CANCEL_RC, "\n".join(kept)
            watchdog = deadline() if deadline is not None else None
            now = time.monotonic()
            if now > stop_at or (watchdog is not None and now > watchdog):
                kill_launch(proc)
                reader.join(timeout=GRACE_S)
                return TIMEOUT_RC, "\n".join(kept)
        rc = proc.wait()
        kill_launch(proc)
        return rc, "\n".join(kept)
    except BaseException:
        kill_launch(proc)
        raise


def _pump(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line.rstrip("\n"))
    lines.put(None)
