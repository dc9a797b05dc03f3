"""Subcommands for scaling out: ``zerokit doctor``, ``zerokit commtest``, ``zerokit checkpoint ...``.

Parse, call kit, print. ``doctor`` and ``commtest`` exit 1 when a check fails (0 otherwise), so a job
script can stop before it books nodes for nothing.
"""

from __future__ import annotations

import argparse

from kit.cli import UsageError, add_setup_args, print_json, setup_from_args


def register(sub) -> None:
    p = sub.add_parser("doctor", help="preflight checks: versions, GPUs, network, shm, ulimit, hosts")
    p.add_argument("--hostfile", help="also check what the launcher needs to reach these hosts (pdsh, ssh)")
    p.add_argument("--master-port", type=int, default=29500, help="port the launch will use (default 29500)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(func=doctor_command)

    p = sub.add_parser("commtest", help="check collectives on N ranks and measure their bandwidth")
    p.add_argument("--nprocs", type=int, default=2, help="ranks on this machine (default 2)")
    p.add_argument("--sizes", type=byte_size, nargs="+", help="message sizes, e.g. 4096 64K 1M 1G (x 1024)")
    p.add_argument("--iters", type=int, default=5, help="timed calls per size (default 5)")
    p.add_argument("--arrive-s", type=float, default=60.0, help="seconds ranks wait for each other")
    p.add_argument("--timeout-s", type=float, default=300.0, help="seconds before the launch is killed")
    p.add_argument("--launcher", default="torchrun", help="torchrun (default, faster start) or deepspeed")
    p.add_argument("--plot", help="save the bandwidth plot to this file (.png, .svg)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(func=commtest_command)

    p = sub.add_parser("checkpoint", help="DeepSpeed checkpoints: layout, consolidate, size, round trip")
    actions = p.add_subparsers(dest="action", required=True)
    a = actions.add_parser("layout", help="the files of a checkpoint folder, by kind and rank")
    a.add_argument("dir")
    a.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    a.set_defaults(func=layout_command)
    a = actions.add_parser(
        "consolidate", help="merge ZeRO partitions into one fp32 state dict (zero_to_fp32)"
    )
    a.add_argument("dir")
    a.add_argument("--tag", help="checkpoint tag (default: the one in 'latest')")
    a.add_argument("--out", required=True, help="file to torch.save the state dict to")
    a.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    a.set_defaults(func=consolidate_command)
    a = actions.add_parser("size", help="predicted checkpoint size on disk for a setup")
    add_setup_args(a)
    a.set_defaults(func=size_command)
    a = actions.add_parser("roundtrip", help="save, consolidate and resume a toy model on CPU/GPU ranks")
    a.add_argument("--dir", required=True, help="folder for the checkpoints")
    a.add_argument("--stages", type=int, nargs="+", default=[2, 3], help="ZeRO stages (default 2 3)")
    a.add_argument("--nprocs", type=int, default=2)
    a.add_argument("--steps", type=int, default=4)
    a.add_argument("--save-step", type=int, default=2)
    a.add_argument("--timeout-s", type=float, default=600.0)
    a.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    a.set_defaults(func=roundtrip_command)


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
    from kit.doctor import doctor

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
    from kit.commtest import DEFAULT_SIZES, run_commtest

    if args.nprocs < 2:
        raise UsageError(f"nprocs: a communication test needs at least 2 ranks, got {args.nprocs}")
    result = run_commtest(
        args.nprocs,
        tuple(args.sizes or DEFAULT_SIZES),
        iters=args.iters,
        timeout_s=args.timeout_s,
        arrive_s=args.arrive_s,
        launcher=args.launcher,
    )
    if args.plot and result.timings:
        result.plot().savefig(args.plot, dpi=120)
    if args.json:
        print_json(result.to_dict())
    else:
        for c in result.checks:
            print(f"{'ok  ' if c['ok'] else 'FAIL'} {c['op']:<15} {c['detail']}")
        if result.timings:
            print(result.bandwidth().to_string(index=False, float_format=lambda x: f"{x:.4g}"))
        print("commtest: ok" if result.ok else f"commtest: FAILED: {result.error}")
    return 0 if result.ok else 1


def layout_command(args: argparse.Namespace) -> int:
    from kit.checkpoints import checkpoint_layout

    df = checkpoint_layout(args.dir)
    if args.json:
        print_json(
            {"dir": args.dir, "files": df.to_dict(orient="records"), "total_bytes": int(df["bytes"].sum())}
        )
    else:
        print(df.to_string(index=False))
    return 0


def consolidate_command(args: argparse.Namespace) -> int:
    from kit.checkpoints import consolidate, unique_numel

    state = consolidate(args.dir, args.tag, args.out)
    summary = {"out": args.out, "tensors": len(state), "numel": unique_numel(state)}
    if args.json:
        print_json(summary)
    else:
        print(f"wrote {summary['tensors']} fp32 tensors ({summary['numel']:,} elements) to {args.out}")
    return 0


def size_command(args: argparse.Namespace) -> int:
    from kit.checkpoints import checkpoint_bytes

    size = checkpoint_bytes(setup_from_args(args))
    if args.json:
        print_json(size)
    else:
        for kind in ("model_states", "optim_states"):
            k = size[kind]
            print(f"{kind}: {k['files']} file(s) x {k['bytes'] / 1e9:.3f} GB   {k['formula']}")
        print(f"total: {size['total_bytes'] / 1e9:.3f} GB per checkpoint tag")
    return 0


def roundtrip_command(args: argparse.Namespace) -> int:
    from kit.checkpoints import run_roundtrip
    from kit.setup import Setup
    from kit.toymodels import toy_spec

    bad = [s for s in args.stages if s not in (0, 1, 2, 3)]
    if bad:
        raise UsageError(f"stages: each must be 0, 1, 2 or 3, got {bad}")
    cluster = {"nodes": 1, "gpus_per_node": args.nprocs}
    base = Setup(model=toy_spec(), cluster=cluster, batch={"micro_batch": 2, "grad_accum": 1})
    reports = run_roundtrip(
        [base.replace(zero={"stage": s}) for s in args.stages],
        args.dir,
        steps=args.steps,
        save_step=args.save_step,
        timeout_s=args.timeout_s,
    )
    ok = all(r["resume_equal"] and (r["consolidated"] or {"equal": True})["equal"] for r in reports)
    if args.json:
        print_json({"ok": ok, "reports": reports})
    else:
        for r in reports:
            cons = r["consolidated"]
            merged = "n/a (stage 0)" if cons is None else ("equal" if cons["equal"] else "DIFFERENT")
            print(
                f"{r['label']}: resume {'equal' if r['resume_equal'] else 'DIFFERENT'}, zero_to_fp32 {merged}"
            )
            for f in r["files"]:
                print(f"    {f['bytes']:>12,}  {f['path']}")
    return 0 if ok else 1
