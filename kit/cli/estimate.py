"""``zerokit estimate`` and ``zerokit plan``: parse flags into a Setup, call kit, print."""

from __future__ import annotations

import argparse

from kit.cli.args import add_setup_args, print_json, setup_from_args
from kit.units import GIB


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "estimate",
        help="memory per GPU and CPU RAM per node for a model, cluster, ZeRO setting and batch",
        description="Estimate memory per GPU (by component) and CPU RAM per node; say what fits.",
    )
    add_setup_args(p)
    p.add_argument("--formula", default="deepspeed", help="deepspeed (what it allocates) or zero-paper")
    p.add_argument("--list-models", action="store_true", help="list the model presets and exit")
    p.add_argument(
        "--trace",
        action="store_true",
        help="also trace the activations under FakeTensorMode (imports torch), beside the formula",
    )
    p.set_defaults(func=run_estimate)

    p = sub.add_parser(
        "plan",
        help="smallest cluster per ZeRO stage, and the batch decompositions of a global batch",
        description="For a model and GPU type: the fewest GPUs each ZeRO variant fits on, and every "
        "(micro batch, gradient accumulation) pair that makes --train-batch on the chosen cluster.",
    )
    add_setup_args(p)
    p.add_argument("--max-nodes", type=int, default=64)
    p.set_defaults(func=run_plan)


def run_estimate(args: argparse.Namespace) -> int:
    from kit.estimate import estimate
    from kit.models import preset, preset_names

    if args.list_models:
        rows = {name: preset(name).params for name in preset_names()}
        if args.json:
            print_json({"models": rows})
        else:
            for name, params in rows.items():
                print(f"{name:16} {params / 1e9:8.3f} B params")
        return 0
    result = estimate(setup_from_args(args), formula=args.formula, trace=args.trace)
    if args.json:
        print_json(result.to_dict())
    else:
        print(render(result))
    return 0


def render(result) -> str:
    """The readable table: components with formulas, totals, and the fit per GPU type."""
    s = result.setup
    z, b, c = s.zero, s.batch, s.cluster
    lines = [
        f"{s.model.name}: {s.model.params:,} params (largest layer {s.model.largest_layer_params:,})",
        f"{c.nodes} node(s) x {c.gpus_per_node} GPU(s), ZeRO stage {z.stage}, {z.precision}, {z.optimizer}, "
        f"offload optimizer={z.offload_optimizer} param={z.offload_param}",
        f"batch: {b.train_batch} = {b.micro_batch} (micro) x {s.dp} (GPUs) x {b.grad_accum} (grad accum), "
        + ("" if s.model.source else f"seq {b.seq_len}   ")  # a model file's batch() sets its own shapes
        + f"formula: {result.formula}",
        "",
        f"{'per GPU':18}{'GiB':>9}  formula",
    ]
    for name, term in result.terms.items():
        lines.append(f"{name:18}{term.bytes / GIB:9.2f}  {term.formula}")
    lines.append(f"{'total':18}{result.per_gpu_bytes / GIB:9.2f}")
    if result.trace:
        t = result.trace
        lines.append(
            f"{'traced activations':18}{t.saved_bytes / GIB:9.2f}  saved for backward; "
            f"{t.checkpointed_bytes / GIB:.2f} GiB with checkpointing of {t.blocks} blocks; peak live "
            f"{t.peak_bytes / GIB:.2f} GiB ({t.transient_bytes / GIB:.2f} GiB transient), {t.seconds:.1f} s"
        )
    lines.append(f"{'CPU RAM per node':18}{result.cpu_bytes_per_node / GIB:9.2f}  {result.cpu_term.formula}")
    lines.append(f"{'checkpoint on disk':18}{result.checkpoint_bytes / GIB:9.2f}  one saved tag, all ranks")
    lines += ["", "fits: " + ", ".join(f"{g} {'yes' if ok else 'no'}" for g, ok in result.fits.items())]
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines)


def run_plan(args: argparse.Namespace) -> int:
    from kit.estimate import plan

    setup = setup_from_args(args)
    clusters = plan.smallest_cluster(setup, max_nodes=args.max_nodes)
    batches = plan.batch_options(setup, setup.batch.train_batch)
    if args.json:
        print_json(
            {
                "setup": setup.model_dump(mode="json"),
                "smallest_cluster": clusters.to_dict(orient="records"),
                "batch_options": batches.to_dict(orient="records"),
            }
        )
        return 0
    print(f"Smallest cluster of {setup.cluster.gpu} per ZeRO variant ({setup.model.name}):")
    print(clusters.to_string(index=False))
    print(f"\nDecompositions of train_batch {setup.batch.train_batch} on {setup.dp} GPUs:")
    print(batches.to_string(index=False))
    return 0
