"""``zerokit checkpoint layout|consolidate|size|roundtrip``: DeepSpeed checkpoints through the kit.

Parse, call kit.scaleout.checkpoints (and kit.estimate.checkpoint_size), print. ``roundtrip`` exits 1
when a resumed run or the consolidated weights differ. ``consolidate`` draws one progress line on stderr
once it has run a second (``--no-progress``: none); stdout keeps its one line, or its JSON.
"""

from __future__ import annotations

import argparse

from kit.cli.args import UsageError, add_json, add_setup_args, print_json, setup_from_args


def register(sub) -> None:
    p = sub.add_parser("checkpoint", help="DeepSpeed checkpoints: layout, consolidate, size, round trip")
    actions = p.add_subparsers(dest="action", required=True)
    a = actions.add_parser("layout", help="the files of a checkpoint folder, by kind and rank")
    a.add_argument("dir")
    add_json(a)
    a.set_defaults(func=layout_command)
    a = actions.add_parser(
        "consolidate", help="merge ZeRO partitions into one fp32 state dict (zero_to_fp32)"
    )
    a.add_argument("dir")
    a.add_argument("--tag", help="checkpoint tag (default: the one in 'latest')")
    a.add_argument("--out", required=True, help="file to torch.save the state dict to")
    a.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress line (on stderr; shown only for a consolidation that takes over a second)",
    )
    add_json(a)
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
    add_json(a)
    a.set_defaults(func=roundtrip_command)


def layout_command(args: argparse.Namespace) -> int:
    from kit.scaleout.checkpoints import checkpoint_layout

    df = checkpoint_layout(args.dir)
    if args.json:
        print_json(
            {"dir": args.dir, "files": df.to_dict(orient="records"), "total_bytes": int(df["bytes"].sum())}
        )
    else:
        print(df.to_string(index=False))
    return 0


def consolidate_command(args: argparse.Namespace) -> int:
    from kit.scaleout.checkpoints import consolidate, unique_numel

    # one progress line on stderr for a large checkpoint (zero_to_fp32's own bars are silenced)
    state = consolidate(args.dir, args.tag, args.out, progress=not args.no_progress)
    summary = {"out": args.out, "tensors": len(state), "numel": unique_numel(state)}
    if args.json:
        print_json(summary)
    else:
        print(f"wrote {summary['tensors']} fp32 tensors ({summary['numel']:,} elements) to {args.out}")
    return 0


def size_command(args: argparse.Namespace) -> int:
    from kit.estimate.checkpoint_size import checkpoint_bytes

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
    from kit.scaleout.checkpoints import run_roundtrip
    from kit.toys import toy_setup

    bad = [s for s in args.stages if s not in (0, 1, 2, 3)]
    if bad:
        raise UsageError(f"stages: each must be 0, 1, 2 or 3, got {bad}")
    base = toy_setup(args.nprocs)
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
