"""``zerokit doctor`` and ``zerokit commtest``: preflight checks before a (multi-node) run.

Parse, call kit.scaleout, print. doctor and commtest exit 1 when a check fails (0 otherwise), so a job
script can stop before it books nodes for nothing.
"""

from __future__ import annotations

import argparse

from kit.cli.args import UsageError, add_json, print_json
from kit.rules import DEFAULT_MASTER_PORT


def register(sub) -> None:
    p = sub.add_parser("doctor", help="preflight checks: versions, GPUs, network, shm, ulimit, hosts")
    p.add_argument("--hostfile", help="also check what the launcher needs to reach these hosts (pdsh, ssh)")
    p.add_argument(
        "--master-port",
        type=int,
        default=DEFAULT_MASTER_PORT,
        help="port the launch will use (default %(default)s)",
    )
    add_json(p)
    p.set_defaults(func=doctor_command)

    p = sub.add_parser("commtest", help="check collectives on N ranks and measure their bandwidth")
    p.add_argument("--nprocs", type=int, default=2, help="ranks on this machine (default 2)")
    p.add_argument("--sizes", type=byte_size, nargs="+", help="message sizes, e.g. 4096 64K 1M 1G (x 1024)")
    p.add_argument("--iters", type=int, default=5, help="timed calls per size (default 5)")
    p.add_argument("--arrive-s", type=float, default=60.0, help="seconds ranks wait for each other")
    p.add_argument("--timeout-s", type=float, default=300.0, help="seconds before the launch is killed")
    p.add_argument("--launcher", default="torchrun", help="torchrun (default, faster start) or deepspeed")
    p.add_argument(
        "--hostfile", help="run across the hosts of this hostfile (DeepSpeed's launcher reaches them)"
    )
    p.add_argument(
        "--local",
        action="store_true",
        help="with --hostfile: start every host's ranks on this machine (a rehearsal)",
    )
    p.add_argument("--plot", help="save the bandwidth plot to this file (.png, .svg)")
    add_json(p)
    p.set_defaults(func=commtest_command)


def byte_size(text: str) -> int:
    """``4096``, ``64K``, ``1M``, ``1G`` as bytes (binary multiples, as nccl-tests' -b/-e flags)."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    digits = text[:-1] if scale > 1 else text
    if not digits.isdigit() or int(digits) * scale < 4:
        raise argparse.ArgumentTypeError(
            f"not a message size of at least 4 bytes: {text!r} (try 4096, 64K, 1M)"
        )
    return int(digits) * scale


def doctor_command(args: argparse.Namespace) -> int:
    from kit.scaleout.doctor import doctor

    report = doctor(args.hostfile, args.master_port)
    if args.json:
        print_json(report.to_dict())
    else:
        width = max(len(c.name) for c in report.checks)
        for c in report.checks:
            print(f"{c.status:<5} {c.name:<{width}}  {c.detail}")
            if c.fix and c.status != "ok":
                print(f"{'':<5} {'':<{width}}  fix: {c.fix}")
        counts = report.counts()
        print(", ".join(f"{n} {status}" for status, n in counts.items()))
    return 1 if report.failed else 0


def commtest_command(args: argparse.Namespace) -> int:
    from kit.scaleout.commtest import DEFAULT_SIZES, run_commtest, run_on_hostfile

    sizes, nodes = tuple(args.sizes or DEFAULT_SIZES), None
    timing = {"iters": args.iters, "timeout_s": args.timeout_s, "arrive_s": args.arrive_s}
    if args.hostfile:
        result, nodes = run_on_hostfile(args.hostfile, sizes, local=args.local or None, **timing)
    elif args.local:
        raise UsageError(
            "local: --local rehearses the hosts of a --hostfile on this machine; give --hostfile"
        )
    else:
        if args.nprocs < 2:
            raise UsageError(f"nprocs: a communication test needs at least 2 ranks, got {args.nprocs}")
        result = run_commtest(args.nprocs, sizes, launcher=args.launcher, **timing)
    if args.plot and result.timings:
        result.plot().savefig(args.plot, dpi=120)
    if args.json:
        print_json({**result.to_dict(), "nodes": nodes})
    else:
        for n in nodes or []:
            missing = f", missing {n['missing']}" if n["missing"] else ""
            late = f", late {n['late']}" if n["late"] else ""
            print(
                f"node {n['node_rank']} {n['host']:<16} {n['status']:<8} ranks {n['joined']}{missing}{late}"
            )
        for c in result.checks:
            print(f"{'ok  ' if c['ok'] else 'FAIL'} {c['op']:<15} {c['detail']}")
        if result.timings:
            print(result.bandwidth().to_string(index=False, float_format=lambda x: f"{x:.4g}"))
        print("commtest: ok" if result.ok else f"commtest: FAILED: {result.error}")
    return 0 if result.ok else 1
