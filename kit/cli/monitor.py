"""``zerokit monitor FOLDER``: every rank of a running job, per node, from the heartbeats in FOLDER.

Parse, call ``kit.monitor.read``, print: a table refreshed every ``--interval`` seconds (the screen
cleared between refreshes when stdout is a terminal; Ctrl-C exits 0), or one snapshot with ``--once``;
``--json`` prints one snapshot as one JSON object (``Snapshot.to_dict()``, keys in docs/contracts.md).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time

from kit import monitor
from kit.cli.args import UsageError, add_json, print_json
from kit.units import MIB

#: ANSI: cursor home, clear the screen
CLEAR = "\x1b[H\x1b[2J"


def register(sub) -> None:
    p = sub.add_parser(
        "monitor",
        help="every rank of a running job: online / stale / offline / finished / failed, step, memory",
        description="Read the heartbeats ranks append to FOLDER/heartbeats/ (a sweep folder runs/NAME, or "
        "the folder a training loop passes to kit.monitor.heartbeat) and show every rank per node.",
    )
    p.add_argument("folder", help="a sweep folder (runs/NAME) or any folder the job's heartbeats go to")
    p.add_argument("--once", action="store_true", help="print one snapshot and exit")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (default 2)")
    p.add_argument(
        "--stale-s",
        type=float,
        default=monitor.STALE_S,
        help="a rank is stale after this many seconds without a heartbeat (default %(default)g)",
    )
    p.add_argument(
        "--offline-s",
        type=float,
        default=monitor.OFFLINE_S,
        help="... and offline after this many (default %(default)g)",
    )
    add_json(p, "one snapshot as one JSON object")
    p.set_defaults(func=monitor_command)


def monitor_command(args: argparse.Namespace) -> int:
    if not args.interval > 0:
        raise UsageError(f"--interval: seconds > 0, got {args.interval:g}")
    if not args.stale_s > 0:
        raise UsageError(f"--stale-s: seconds > 0, got {args.stale_s:g}")
    if not args.offline_s > args.stale_s:
        raise UsageError(f"--offline-s: seconds > --stale-s ({args.stale_s:g}), got {args.offline_s:g}")
    snapshot = monitor.read(args.folder, stale_s=args.stale_s, offline_s=args.offline_s)
    if args.json:
        print_json(snapshot.to_dict())
        return 0
    tty = sys.stdout.isatty()
    if args.once:
        print((CLEAR if tty else "") + table(snapshot), flush=True)
        return 0
    # Ctrl-C is the only way out of the loop: a process started with SIGINT ignored (a non-interactive
    # shell's background job, and everything it starts, inherits SIG_IGN) would otherwise refresh forever
    main_thread = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGINT, signal.default_int_handler) if main_thread else None
    try:
        while True:
            print((CLEAR if tty else "") + table(snapshot), flush=True)
            time.sleep(args.interval)
            if not tty:
                print()
            snapshot = monitor.read(args.folder, stale_s=args.stale_s, offline_s=args.offline_s)
    except KeyboardInterrupt:
        return 0
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, before)


def table(snapshot: monitor.Snapshot) -> str:
    """The terminal view: per node a line of averages, then one row per rank; the job's averages last."""
    job = snapshot.job
    stamp = time.strftime("%H:%M:%S", time.localtime(snapshot.time))
    lines = [
        f"{snapshot.folder}: {job['ranks']} rank(s) of world size {job['world_size']} on {job['nodes']} "
        f"node(s) at {stamp}; stale after {snapshot.stale_s:g} s, offline after {snapshot.offline_s:g} s",
        "",
    ]
    header = (
        "rank",
        "state",
        "age s",
        "progress",
        "samples/s",
        "mean",
        "loss",
        "memory MiB",
        "peak MiB",
        "util %",
    )
    widths = (6, 9, 7, 16, 10, 10, 9, 11, 10, 7)
    row = "  ".join(f"{{:>{w}}}" for w in widths) + "  {}"
    for node in snapshot.nodes:
        lines.append(f"node {node['node']}: {_averages(node)}")
        lines.append("  " + row.format(*header, "configuration"))
        for r in (r for r in snapshot.ranks if r["node"] == node["node"]):
            values = (
                r["rank"], r["state"], _num(r["age_s"], "{:.1f}"), _progress(r),
                _num(r["samples_per_s"], "{:,.1f}"), _num(r["samples_per_s_mean"], "{:,.1f}"),
                _num(r["loss"], "{:.4f}"), _mib(r["memory_bytes"]) + f" {r['memory']}", _mib(r["peak_bytes"]),
                _num(r["gpu_util_percent"], "{}"),
            )  # fmt: skip
            lines.append(
                "  " + row.format(*values, (r["label"] or "") + (f"  {r['error']}" if r["error"] else ""))
            )
        lines.append("")
    lines.append(f"job: {_averages(job)}")
    return "\n".join(lines)


def _averages(group: dict) -> str:
    states = ", ".join(f"{n} {s}" for s, n in group["states"].items() if n)
    steps = monitor.steps_range(group) or "no step"
    return (
        f"{group['ranks']} rank(s) ({states}); {steps}; mean {_num(group['samples_per_s_mean'], '{:,.1f}')} "
        f"samples/s, {_mib(group['memory_bytes_mean'])} MiB; peak {_mib(group['peak_bytes_max'])} MiB"
        + (
            f"; util {group['gpu_util_percent_mean']:.0f} %"
            if group["gpu_util_percent_mean"] is not None
            else ""
        )
    )


def _progress(row: dict) -> str:
    """A rank's step as every view numbers it: its ``progress`` ("warm-up 1 of 2", "step 3 of 10"), else
    its measured step."""
    if row.get("progress"):
        return row["progress"]
    return _num(row.get("measured_step"), "{}")


def _num(value, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _mib(nbytes) -> str:
    return "-" if nbytes is None else f"{nbytes / MIB:,.1f}"
