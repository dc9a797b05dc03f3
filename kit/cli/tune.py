"""``zerokit tune``: search stage x offload x micro batch by real runs, in one launch, under a memory budget.

    zerokit tune --stages 0,1,2,3 --offload none,cpu --micro-batches 1,2,4,8 --budget-gib 0.76 \\
        --nprocs 2 --steps 3 --out ds_config.json

Candidates the estimate says exceed ``--budget-gib`` per GPU (default: the ``--gpu``'s memory; per rank on
CPU ranks, where the estimate has no CUDA context, NCCL buffers or caching allocator) are listed as pruned
and never run; the rest run in one launch (``zerokit run``'s runner, resumable by
``--sweep``) and are ranked by median samples/s. ``--out`` writes the best one's ds_config.json.
"""

from __future__ import annotations

import argparse
import contextlib
import math

from kit.cli.args import (
    UsageError,
    add_gpu,
    add_seq_len,
    add_zero_args,
    items,
    model_from_args,
    print_json,
    stdout_to_stderr,
    whole,
    zero_from_args,
)
from kit.cli.run import add_launch_args, launch_options
from kit.units import GIB

#: the settings tune takes as one flag each (it searches stages, offloads and micro batches itself)
TUNE_SETTINGS = ("precision", "activation_checkpointing", "checkpoint_every", "checkpoint_policy")
#: the API's argument names, as ``--flags`` in this command's error lines
FLAGS = {
    "stages": "--stages",
    "offloads": "--offload",
    "micro_batches": "--micro-batches",
    "budget": "--budget-gib",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune",
        help="search ZeRO stage x offload x micro batch by short real runs under a memory budget",
        description="Prune by the estimate what cannot fit the budget per GPU (per rank on CPU ranks, "
        "without a GPU's CUDA context and NCCL buffers), run the rest for a few "
        "steps in one launch on N local ranks, rank by measured throughput, write the best ds_config.",
    )
    add_launch_args(p, sweep="tune")
    p.add_argument("--stages", default="0,1,2,3", help="comma-separated ZeRO stages")
    p.add_argument(
        "--offload",
        default="none,cpu",
        help="comma-separated: none,cpu (cpu = optimizer at stages 1-2, optimizer + parameters at stage 3)",
    )
    p.add_argument("--micro-batches", default="1,2,4,8", help="comma-separated micro batches per rank")
    p.add_argument(
        "--keep",
        default="train_batch",
        choices=("train_batch", "grad_accum"),
        help="train_batch: global batch fixed at max micro batch x grad accum x ranks (as DeepSpeed's "
        "autotuner); grad_accum: --grad-accum at every micro batch",
    )
    p.add_argument(
        "--budget-gib",
        type=float,
        help="memory budget per GPU (per rank on CPU ranks), GiB (default: the --gpu's memory)",
    )
    add_gpu(p, "a name in data/gpus.csv (the default budget)")
    add_zero_args(p, only=TUNE_SETTINGS)
    p.add_argument("--grad-accum", type=int, default=1)
    add_seq_len(p)
    p.add_argument("--out", help="write the best configuration's ds_config.json here")
    p.add_argument(
        "--calibration",
        metavar="FILE",
        help="predict each candidate's step time (zerokit calibrate --measure)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kit.run.tune import tune

    setup, options = plan_from_args(args)
    options.update(launch_options(args))
    with stdout_to_stderr() if args.json else contextlib.nullcontext(), _flag_names():
        tuned = tune(setup, **options)
    if args.out and tuned.best is not None:
        tuned.write_ds_config(args.out)
    if args.json:
        print_json({**tuned.to_dict(), "sweep": args.sweep, "ds_config": args.out if tuned.best else None})
    else:
        print(render(tuned, args.out))
    return 0 if tuned.best is not None else 1


def plan_from_args(args: argparse.Namespace) -> tuple:
    """The base Setup and ``tune``'s search arguments from the flags; UsageError (exit 2) naming the flag."""
    from kit.schema import Setup

    if args.budget_gib is not None and not (math.isfinite(args.budget_gib) and args.budget_gib > 0):
        raise UsageError(f"budget-gib: must be a number of GiB > 0, got {args.budget_gib:g}")
    for flag in ("nprocs", "steps", "grad_accum"):
        if getattr(args, flag) < 1:
            raise UsageError(
                f"{flag.replace('_', '-')}: must be a whole number >= 1, got {getattr(args, flag)}"
            )
    if args.warmup < 0:
        raise UsageError(f"warmup: must be a whole number >= 0, got {args.warmup}")
    spec = model_from_args(args)
    zero = zero_from_args(args)
    setup = Setup(
        model=spec,
        cluster={"nodes": 1, "gpus_per_node": args.nprocs, "gpu": args.gpu},
        zero=zero,
        batch={"micro_batch": 1, "grad_accum": args.grad_accum, "seq_len": args.seq_len},
    )
    options = {
        "stages": [whole("stages", s) for s in items(args.stages)],
        "offloads": items(args.offload),
        "micro_batches": [whole("micro-batches", s, ">= 1") for s in items(args.micro_batches)],
        "budget_bytes": None if args.budget_gib is None else int(args.budget_gib * GIB),
        "keep": args.keep,
        "nprocs": args.nprocs,
    }
    if args.calibration:
        from kit.steptime.calibration import Calibration

        options["calibration"] = Calibration.load(args.calibration)
    return setup, options


def render(tuned, out: str | None) -> str:
    """The ranking table, the pruned candidates and the best configuration."""
    import pandas as pd

    budget = f"budget per {tuned.device}: {tuned.budget_bytes / GIB:.3f} GiB"
    if tuned.accelerator == "cpu":
        budget += " (CPU ranks: the estimates without a GPU's CUDA context and NCCL buffers)"
    lines = [f"records: {tuned.records}", budget, ""]
    lines.append(
        f"{'rank':>4}  {'configuration':36}{'offload':>8}{'micro':>6}{'accum':>6}{'est GiB':>9}"
        f"{'samples/s':>11}  status"
    )
    for _, row in tuned.table.iterrows():
        rank = "" if pd.isna(row["rank"]) else int(row["rank"])
        speed = "" if math.isnan(row["samples_per_s"]) else f"{row['samples_per_s']:.1f}"
        lines.append(
            f"{rank!s:>4}  {row['label']:36}{row['offload']:>8}{row['micro_batch']:>6}{row['grad_accum']:>6}"
            f"{row['estimated_gib']:9.3f}{speed:>11}  {row['status']}"
        )
    for label, _, reason in tuned.pruned:
        lines.append(f"pruned: {label}: {reason}")
    lines.append("")
    lines.append(f"step times: {tuned.calibration}")
    for _, row in tuned.table.dropna(subset=["predicted_s"]).iterrows():
        measured = "not measured" if math.isnan(row["measured_s"]) else f"measured {row['measured_s']:.3f} s"
        lines.append(f"  {row['label']:36} predicted {row['predicted_s']:.3f} s, {measured}")
    if tuned.best is None:
        lines.append("best: none (no candidate ran successfully; see the status column and the records)")
    else:
        lines.append(f"best: {tuned.best.label}")
        if out:
            lines.append(f"ds_config: {out}")
    return "\n".join(lines)


@contextlib.contextmanager
def _flag_names():
    """Errors of ``kit.run.tune`` name its arguments; say the flags instead."""
    try:
        yield
    except ValueError as error:
        name, sep, rest = str(error).partition(": ")
        if sep and name in FLAGS:
            raise UsageError(f"{FLAGS[name].lstrip('-')}: {rest}") from None
        raise
