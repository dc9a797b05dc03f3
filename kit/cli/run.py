"""``zerokit run``: short real DeepSpeed runs of several ZeRO configurations, one launch, resumable.

    zerokit run --stages 0,1,2,3 --offload-optimizer none,cpu --nprocs 2 --steps 5 --json

Configurations are every valid combination of the list flags (``kit.grid.grid``: stage 0 cannot
offload, only stage 3 offloads parameters), or one per ``--ds-config`` file. Records go to
``RUNS_DIR/SWEEP/records.jsonl``; re-running the same ``--sweep`` skips what is already measured.
"""

from __future__ import annotations

import argparse
import contextlib

from kit import settings
from kit.cli.args import (
    UsageError,
    add_hostfile_args,
    add_json,
    add_model_overrides,
    add_offload_args,
    add_precision,
    add_seq_len,
    add_zero_args,
    engine_stage,
    items,
    model_from_args,
    nodes_from_args,
    print_json,
    stdout_to_stderr,
    zero_from_args,
)
from kit.components import MODEL_STATES, Component
from kit.units import MIB

#: the settings ``run`` sweeps, each a comma-separated list of its own (``--stages``, ``--offload-*``,
#: ``--precision``); every other setting is one flag applied to each configuration
SWEPT = ("stage", "offload_optimizer", "offload_param", "precision")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="short real multi-process DeepSpeed runs of several ZeRO configurations",
        description="Run ZeRO configurations for a few steps on N local ranks (CPU without CUDA), "
        "measure them, and compare with the estimate.",
    )
    add_launch_args(p, sweep="sweep")
    p.add_argument(
        "--memory-timeline",
        action="store_true",
        help="on CPU, profile each measured step: peak device-tensor bytes per phase on every rank (slower)",
    )
    p.add_argument(
        "--stages",
        default="0,1,2,3",
        help="comma-separated ZeRO stages 0-3 and PyTorch baselines ddp, fsdp, fsdp-grad-op",
    )
    add_offload_args(p)
    add_precision(p)
    add_zero_args(p, skip=SWEPT)  # every other setting, on each configuration (ZeRO++ on stage 3's)
    p.add_argument(
        "--ds-config",
        action="append",
        help="a ds_config.json to run (repeatable; instead of --stages/--offload-*/--precision)",
    )
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--grad-accum", type=int, default=1)
    add_seq_len(p)
    s = p.add_mutually_exclusive_group()
    s.add_argument(
        "--max-tokens",
        type=int,
        help="token budget per micro batch: variable-length data (up to --seq-len) packed by DeepSpeed's "
        "batch_by_seqlens, the learning rate scaled with each step's samples (toy GPT)",
    )
    s.add_argument(
        "--batch-schedule",
        metavar="STEP=BATCH,...",
        help="global batch by step, e.g. 0=8,2=16,4=32 (the micro batch stays, grad accum follows; "
        "warm-up steps count)",
    )
    s.add_argument(
        "--batch-ramp",
        metavar="START:END:STEPS",
        help="global batch growing linearly from START to END over STEPS steps (multiples of micro x ranks)",
    )
    p.set_defaults(func=run)


def add_launch_args(p: argparse.ArgumentParser, *, sweep: str) -> None:
    """The flags of a command that runs Setups for real (``run``, ``tune``): the sweep and its folder,
    the model (as ``--model`` plus the architecture overrides), the ranks, steps, watchdog, launcher,
    progress bar and ``--json``."""
    p.add_argument("--sweep", default=sweep, help="sweep name: folder under --runs-dir; re-running resumes")
    p.add_argument("--runs-dir", default="runs")
    m = p.add_argument_group("model")
    m.add_argument(
        "--model",
        default="toy",
        help="toy (tiny GPT), toy-dit, a preset, a config.json or a model file (my_model.py)",
    )
    add_model_overrides(m)
    p.add_argument("--nprocs", type=int, default=2, help="ranks on this machine")
    p.add_argument("--steps", type=int, default=5, help="measured steps per configuration")
    p.add_argument("--warmup", type=int, default=2, help="unmeasured steps first")
    p.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds without progress before a configuration counts as hung",
    )
    p.add_argument(
        "--launcher",
        default=None,
        help="on this machine torchrun (default: starts sooner) or deepspeed; with --hostfile DeepSpeed's "
        "runner: pdsh (default), openmpi or slurm",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar (on stderr)")
    add_hostfile_args(p)
    add_json(p)


def launch_options(args: argparse.Namespace) -> dict:
    """``run_sweep``'s keyword arguments from ``add_launch_args``' flags (``nodes``: the hostfile's,
    checked against ``--nodes`` and ``--nprocs``, or None on this machine alone)."""
    nodes = nodes_from_args(args)
    return {
        "sweep": args.sweep,
        "runs_dir": args.runs_dir,
        "nprocs": args.nprocs,
        "steps": args.steps,
        "warmup": args.warmup,
        "timeout_s": args.timeout,
        "launcher_name": "deepspeed" if nodes else args.launcher,
        "progress": not args.no_progress,
        "nodes": nodes,
    }


def run(args: argparse.Namespace) -> int:
    from kit.run.local_nodes import per_node
    from kit.run.sweep import run_sweep

    options = launch_options(args)
    setups = setups_from_args(args, options["nodes"])
    with stdout_to_stderr() if args.json else contextlib.nullcontext():
        results = run_sweep(setups, **options, memory_timeline=args.memory_timeline)
    names = options["nodes"].names if options["nodes"] else ()
    nodes = per_node(results.records, names) if names else None
    if args.json:
        out = {"sweep": args.sweep, "records": str(results.path), "configs": results.configs()}
        print_json(out if nodes is None else {**out, "nodes": nodes})
    else:
        print(render(results, nodes))
    return 0


def setups_from_args(args: argparse.Namespace, nodes=None) -> list:
    """The Setups the flags describe, on one node of ``--nprocs`` ranks (or each of ``nodes``)."""
    from kit import grid
    from kit.review import checked_setup
    from kit.schema import Setup

    spec = model_from_args(args)
    cluster = {"nodes": nodes.count if nodes else 1, "gpus_per_node": args.nprocs}
    batch = {"micro_batch": args.micro_batch, "grad_accum": args.grad_accum, "seq_len": args.seq_len}
    batch.update(_batch_schedule(args, cluster["nodes"] * args.nprocs))
    if args.ds_config:  # each checked by DeepSpeed's own parser first, as `zerokit explain` does
        return [
            checked_setup(path, model=spec, cluster=cluster, seq_len=args.seq_len)[0]
            for path in args.ds_config
        ]
    given = zero_from_args(args, skip=SWEPT)
    stages = items(args.stages)
    for item in stages:
        engine_stage("stages", item)  # the CLI's own line for a bad item
    found = grid.grid(
        stages,
        offload_optimizer=items(args.offload_optimizer),
        offload_param=items(args.offload_param),
        precision=items(args.precision),
        # ZeRO++ on the stage-3 configurations
        zeropp=[{f: given.get(f, off) for f, off in settings.ZEROPP_OFF.items()}],
    )
    if not found.accepted and not found.refused:
        raise UsageError(f"stages: choose at least one of {', '.join(grid.STAGES)}")
    for flag, value in _refused_everywhere(args, found):
        first = next(r for r in found.refused if getattr(r.variant, flag) == value)
        raise UsageError(f"{first.field}: {first.reason} (--{flag.replace('_', '-')} {value})")
    zero = settings.fields({f: v for f, v in given.items() if f not in settings.ZEROPP_OFF})
    return [
        Setup(model=spec, cluster=cluster, zero={**variant.zero, **zero}, batch=batch)
        for variant in found.accepted
    ]


def _refused_everywhere(args: argparse.Namespace, found) -> list[tuple[str, str]]:
    """(field, value) of each list item no accepted configuration has (``--offload-param cpu`` with
    ``--stages 1,2``): bad input, not a combination to leave out."""
    flags = {f: items(getattr(args, f)) for f in ("offload_optimizer", "offload_param", "precision")}
    return [
        (f, value)
        for f, values in flags.items()
        for value in values
        if not any(getattr(v, f) == value for v in found.accepted)
    ]


def _batch_schedule(args: argparse.Namespace, ranks: int) -> dict:
    """The batch fields ``--max-tokens``, ``--batch-schedule`` or ``--batch-ramp`` give: a token budget, or
    the global batch of step 0 (grad accum then follows from it) and the later changes."""
    from kit import batch as batch_math

    if args.max_tokens is not None:
        return {"max_tokens": args.max_tokens}
    if args.batch_ramp:
        parts = args.batch_ramp.split(":")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise UsageError(f"batch-ramp: expected START:END:STEPS like 8:64:10, got {args.batch_ramp!r}")
        start, end, steps = map(int, parts)
        changes = batch_math.ramp(start, end, steps, args.micro_batch * ranks)
        return {"train_batch": start, "grad_accum": None, "schedule": changes}
    if args.batch_schedule:
        changes = {c["step"]: c["train_batch"] for c in batch_math.schedule_entries(args.batch_schedule)}
        first = changes.pop(0, None)
        return {"schedule": changes, **({"train_batch": first, "grad_accum": None} if first else {})}
    return {}


def render(results, nodes: list[dict] | None = None) -> str:
    """The summary table: throughput and rank 0's bytes measured beside the estimate (MiB), the pairs
    ``Results.summary()`` reads from ``Results.states()``; with ``nodes`` (``per_node``'s rows) a table
    per node: its ranks' model states and the bytes each sent inside and across nodes."""
    table = results.summary()
    width = max([28, *(len(label) + 1 for label in table["label"])])  # e.g. "z3 opt-nvme param-nvme bf16 mb2"
    lines = [
        f"records: {results.path}",
        "measured: rank 0's bytes; estimated: kit.estimate's prediction for rank 0",
        "",
    ]
    lines.append(
        f"{'configuration':{width}}{'status':>8}{'samples/s':>11}{'step ms':>9}{'loss':>8}"
        f"  {'MiB measured / estimated: params  grads  optim  activations'}"
    )
    for _, row in table.iterrows():
        line = f"{row['label']:{width}}{row['status']:>8}"
        if row["status"] == "ok":
            line += f"{row['samples_per_s']:11.1f}{row['step_time_s'] * 1e3:9.1f}{row['loss']:8.3f}  "
            line += "  ".join(
                f"{row[f'measured_{c}'] / MIB:.2f}/{row[f'estimate_{c}'] / MIB:.2f}"
                for c in (*MODEL_STATES, Component.ACTIVATIONS)
            )
        else:
            line += f"  {str(row['error']).splitlines()[0]}"
        lines.append(line)
    if nodes:
        lines += ["", "per node: its ranks' model states (MiB), and MB each rank sent inside / across nodes"]
        lines.append(
            f"{'configuration':{width}}{'node':>6}  {'host':16}{'ranks':>8}"
            f"  {'states MiB measured/est':>23}  {'intra MB meas/est':>18}  {'inter MB meas/est':>18}"
        )
        for n in nodes:
            states = f"{n['model_states_bytes'] / MIB:.2f}/{n['estimate_model_states_bytes'] / MIB:.2f}"
            intra = f"{n['intra_wire_bytes'] / 1e6:.2f}/{n['estimate_intra_wire_bytes'] / 1e6:.2f}"
            inter = f"{n['inter_wire_bytes'] / 1e6:.2f}/{n['estimate_inter_wire_bytes'] / 1e6:.2f}"
            ranks = ",".join(map(str, n["ranks"]))
            lines.append(
                f"{n['label']:{width}}{n['node_rank']:>6}  {n['host']:16}{ranks:>8}"
                f"  {states:>23}  {intra:>18}  {inter:>18}"
            )
    return "\n".join(lines)
