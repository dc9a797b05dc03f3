"""``zerokit calibrate``: how far the step-time model is from what a sweep measured
(``kit.run.calibrate.report``), this machine measured into a calibration file (``--measure``), or a
drive's NVMe bandwidth (``--nvme``). Parse, call kit, print.
"""

from __future__ import annotations

import argparse
import shlex

from kit.cli.args import UsageError, add_json, add_model_overrides, items, print_json, stdout_to_stderr


def register(sub) -> None:
    p = sub.add_parser(
        "calibrate",
        help="the step-time model's predictions beside a sweep's measured step times, and its error",
        description="Predict each configuration of a sweep with kit.steptime.perf and compare with its "
        "measured median step time. CPU records use this machine's measured matmul rate and gloo bandwidth.",
    )
    p.add_argument("sweep", nargs="?", help="a sweep folder (runs/<sweep>) or its records.jsonl")
    p.add_argument(
        "--nprocs",
        type=int,
        default=2,
        help="ranks to measure on (--measure), or the sweep ran on (default 2)",
    )
    p.add_argument(
        "--calibration",
        metavar="FILE",
        help="predict the sweep from this calibration (zerokit calibrate --measure)",
    )
    m = p.add_argument_group("--measure: one short launch measuring what the step-time model needs")
    m.add_argument("--measure", action="store_true", help="measure this machine into --out")
    m.add_argument("--out", default="calibration.json", help="the calibration file (default %(default)s)")
    m.add_argument("--model", help="the model to measure (default: a toy GPT, 4 x 256, 3.3M parameters)")
    add_model_overrides(m)
    m.add_argument("--micro-batch", type=int, default=2, help="micro batch (and twice it) (default 2)")
    m.add_argument("--seq-len", type=int, default=64, help="tokens per sample (default 64)")
    m.add_argument("--precision", default="fp32", help="fp32 (default), bf16 or fp16")
    m.add_argument(
        "--engines",
        help="engines to time, comma-separated (default: z0,z1,z2,z3,z2+offload,z3+offload,ddp,fsdp)",
    )
    m.add_argument("--steps", type=int, default=5, help="timed steps per engine (default 5)")
    m.add_argument(
        "--comm-ranks",
        help="then time the collectives alone on these numbers of ranks, one short launch each "
        "(comma-separated; default: twice --nprocs on CPU ranks, where they share the cores, none on GPUs; "
        "0 for none)",
    )
    p.add_argument(
        "--nvme",
        metavar="PATH",
        help="instead: read / write GB/s of PATH's drive through DeepSpeed's async_io (NVMe offload's path)",
    )
    p.add_argument("--nvme-mib", type=int, default=256, help="with --nvme: MiB per transfer")
    add_json(p)
    p.set_defaults(func=calibrate_command)


def _nvme_bandwidth(args: argparse.Namespace) -> int:
    """``zerokit calibrate --nvme PATH``: the drive's GB/s beside the planner's default (data/nvme.csv)."""
    from kit.gpus import nvme
    from kit.scaleout import nvme_bench

    with stdout_to_stderr():
        found = nvme_bench.measure(args.nvme, mib=args.nvme_mib)
    default = nvme()
    found["planner_default"] = {
        "name": default.name,
        "read_gbps": default.read_gbps,
        "write_gbps": default.write_gbps,
        "source": default.source,
    }
    if args.json:
        print_json(found)
        return 0
    print(
        f"{found['path']}: read {found['read_gbps']:.2f} GB/s, write {found['write_gbps']:.2f} GB/s "
        f"({found['bytes'] / 2**20:,.0f} MiB, DeepSpeed async_io, aio {found['aio']})\n"
        f"planner default per node ({default.name}): read {default.read_gbps:g} GB/s, "
        f"write {default.write_gbps:g} GB/s"
    )
    return 0


def calibrate_command(args: argparse.Namespace) -> int:
    from kit.run import calibrate as cal
    from kit.scaleout.commtest import allreduce_bus_gbps

    if args.nvme:
        return _nvme_bandwidth(args)
    if args.measure:
        return _measure(args)
    if not args.sweep:
        raise UsageError("sweep: give a sweep folder (runs/<sweep>), --measure or --nvme PATH")
    found = cal.report(args.sweep, allreduce_bus_gbps, args.nprocs, args.calibration)
    if args.json:
        print_json(found.to_dict())
        return 0
    table, machine = found.table, found.machine
    print(f"predictions: {found.label}")
    if machine:
        rates = ", ".join(f"{k} {v * 1e3:.1f} GFLOP/s" for k, v in machine.tflops.items())
        print(
            f"this machine: {machine.threads} thread(s) per rank, matmul {rates}, gloo all-reduce "
            f"{machine.bus_gbps:.2f} GB/s, memory copy {machine.copy_gbps:.1f} GB/s"
        )
    steps = [
        f"{a * 1e3:,.0f}-{b * 1e3:,.0f}"
        for a, b in zip(table.measured_min_s, table.measured_max_s, strict=True)
    ]
    shown = table.assign(error=table.error.map("{:+.0%}".format)).drop(
        columns=["config_id", "carried_over", "measured_min_s", "measured_max_s", "within_steps"]
    )
    shown.insert(shown.columns.get_loc("measured_s") + 1, "steps_ms", steps)
    print(shown.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    error = cal.median_abs_error(table)
    print(
        f"median |predicted / measured - 1| = {error:.0%} over {len(table)} configurations; "
        f"{int(table.within_steps.sum())} predicted within their fastest to slowest step (steps_ms)"
    )
    for what, labels, argv in found.carried_over:
        print(f"carried over, not measured: {what} ({', '.join(labels)}): measure it with {shlex.join(argv)}")
    return 0


def measure_base(args: argparse.Namespace):
    """``zerokit calibrate --measure``'s arguments as ``(base Setup, engines, comm_ranks)``; UsageError on a
    bad one, before anything launches."""
    from kit import models
    from kit.run import calibrate as cal
    from kit.schema import Setup
    from kit.toys import TOY_ZERO

    spec = models.resolve(args.model) if args.model else cal.DEFAULT_MODEL
    changes = {
        name: getattr(args, name)
        for name in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "experts")
        if getattr(args, name) is not None
    }
    if args.set:
        raise UsageError("set: --measure takes the named overrides (--layers, --hidden, ...), not --set")
    spec = models.override(spec, changes) if changes else spec
    if args.steps < 1:
        raise UsageError(f"steps: must be >= 1, got {args.steps}")
    base = Setup(
        model=spec,
        cluster={"gpus_per_node": args.nprocs},
        zero={**TOY_ZERO, "precision": args.precision},
        batch={"micro_batch": args.micro_batch, "seq_len": args.seq_len},
    )
    engines = tuple(items(args.engines)) or cal.DEFAULT_ENGINES
    for key in engines:
        cal.engine_setup(base, key)  # a bad name: one line before anything launches
    return base, engines, _comm_ranks(args.comm_ranks)


def _comm_ranks(text: str | None) -> tuple[int, ...] | None:
    """``--comm-ranks``' rank counts; None without it (``measure`` then takes
    ``kit.run.calibrate.default_comm_ranks`` and checks them); UsageError on one that is not a number."""
    if text is None:
        return None
    counts = items(text)
    bad = [n for n in counts if not n.isdigit()]
    if bad:
        raise UsageError(f"comm-ranks: a comma-separated list of rank counts (or 0 for none), got {bad[0]!r}")
    return tuple(int(n) for n in counts if n != "0")


def _measure(args: argparse.Namespace) -> int:
    """``zerokit calibrate --measure``: one launch measuring this machine, written to ``--out``."""
    from kit.run import calibrate as cal

    base, engines, comm_ranks = measure_base(args)
    with stdout_to_stderr():
        found = cal.measure(base, args.nprocs, engines, steps=args.steps, comm_ranks=comm_ranks)
    found.save(args.out)
    if args.json:
        print_json({"out": args.out, **found.to_dict()})
        return 0
    print(cal.describe(found))
    print(f"wrote {args.out}")
    return 0
