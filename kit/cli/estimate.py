"""``zerokit estimate`` and ``zerokit plan``: parse flags into a Setup, call kit, print."""

from __future__ import annotations

import argparse

from kit.cli.args import UsageError, add_setup_args, count, items, print_json, setup_from_args
from kit.estimate.perf import Assumptions, step_time
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
    add_calibration(p)
    p.set_defaults(func=run_estimate)

    p = sub.add_parser(
        "plan",
        help="every setup that fits, with predicted time and cost; what makes yours fit",
        description="For a model: every GPU type x cluster size x ZeRO variant x checkpointing x batch "
        "decomposition of the global batch, estimated and timed; the Pareto front of time vs cost, the "
        "cheapest and fastest per GPU, the smallest changes that make the given setup fit, the fewest GPUs "
        "each ZeRO variant fits on, and the batch decompositions on the given cluster.",
    )
    add_setup_args(p)
    p.add_argument("--max-nodes", type=int, default=64)
    s = p.add_argument_group("search")
    s.add_argument(
        "--gpus", help="GPU types to consider, comma-separated (default: every row of data/gpus.csv)"
    )
    s.add_argument("--tokens", type=count, help="tokens to train on, e.g. 2T (default: 20 x params)")
    s.add_argument(
        "--price",
        action="append",
        default=[],
        metavar="[GPU=]USD",
        help="USD per GPU-hour, for every GPU or one (repeatable); default: data/prices.csv",
    )
    s.add_argument("--headroom", type=float, help="share of GPU memory kept free (default 0.1)")
    s.add_argument("--max-hours", type=float, help="only setups that finish within this wall-clock time")
    s.add_argument(
        "--network", help="inter-node fabric in data/networks.csv (default: per --interconnect kind)"
    )
    s.add_argument("--top", type=int, default=10, help="fitting setups listed, cheapest first (0: all)")
    a = p.add_argument_group("performance-model assumptions (kit.estimate.perf.Assumptions)")
    for name, value in vars(Assumptions()).items():
        a.add_argument(f"--{name.replace('_', '-')}", type=float, default=value, help=f"default {value:g}")
    add_calibration(p)
    p.set_defaults(func=run_plan)


def add_calibration(p) -> None:
    p.add_argument(
        "--calibration",
        metavar="FILE",
        help="step times from this machine's calibration (zerokit calibrate --measure), not the datasheet",
    )


def _calibration(args: argparse.Namespace):
    from kit.estimate.calibration import Calibration

    return Calibration.load(args.calibration) if args.calibration else None


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
    calibration = _calibration(args)
    timed = step_time(result.setup, calibration=calibration) if calibration else None
    if args.json:
        print_json({**result.to_dict(), **({"step_time": timed.to_dict()} if timed else {})})
    else:
        print(render(result))
        if timed:
            print(f"step time: {timed.step_s:.4g} s ({timed.calibration})")
            for name in ("compute", "exposed_comm", "optimizer", "offload", "fixed"):
                part = getattr(timed, name)
                print(f"  {name:13}{part.seconds:10.4g} s  {part.formula}")
    return 0


def render(result) -> str:
    """The readable table: components with formulas, totals, and the fit per GPU type."""
    s = result.setup
    z, b, c = s.zero, s.batch, s.cluster
    lines = [
        f"{s.model.name}: {s.model.params:,} params (largest layer {s.model.largest_layer_params:,})",
        f"{c.nodes} node(s) x {c.gpus_per_node} GPU(s), {z.name}, {z.precision}, {z.optimizer}, "
        f"offload optimizer={z.offload_optimizer} param={z.offload_param}",
        f"batch: {b.train_batch} = {b.micro_batch} (micro) x {s.dp} (GPUs) x {b.grad_accum} (grad accum), "
        + ("" if s.model.source else f"seq {b.seq_len}   ")  # a model file's batch() sets its own shapes
        + f"formula: {result.formula}",
        "",
        f"{'per GPU':18}{'GiB':>9}  formula",
    ]
    for name, term in result.terms.items():
        lines.append(f"{name:18}{term.bytes / GIB:9.2f}  {term.formula}")
    lines.append(f"{'total':18}{result.per_gpu_bytes / GIB:9.2f}  every component at once (the fit uses it)")
    if result.timeline:
        lines += [
            "",
            f"{'peak per phase':18}{'GiB':>9}  what is live at its peak, GiB (--json: every formula)",
        ]
        line = result.timeline
        for phase, terms in line.phases.items():
            mark = " (peak)" if phase == result.peak_phase else ""
            parts = [f"{k.replace('_', ' ')} {t.bytes / GIB:.2f}" for k, t in terms.items() if t.bytes]
            extra = terms["temporaries"]
            how = f" ({extra.formula})" if extra.bytes else ""
            live = f"{line.moments[phase]}: {' + '.join(parts)}{how}"
            lines.append(f"{phase + mark:18}{line.totals[phase] / GIB:9.2f}  {live}")
        lines.append(
            f"{'overhead':18}{result.peak_overhead.bytes / GIB:9.2f}  {result.peak_overhead.formula}"
        )
        lines.append(f"{'peak per GPU':18}{result.peak_per_gpu_bytes / GIB:9.2f}  the peak phase + overhead")
    if result.trace:
        t = result.trace
        lines.append(
            f"{'traced activations':18}{t.saved_bytes / GIB:9.2f}  saved for backward; "
            f"{t.checkpointed_bytes / GIB:.2f} GiB with checkpointing of {t.blocks} blocks; peak live "
            f"{t.peak_bytes / GIB:.2f} GiB ({t.transient_bytes / GIB:.2f} GiB transient), {t.seconds:.1f} s"
        )
    lines.append(f"{'CPU RAM per node':18}{result.cpu_bytes_per_node / GIB:9.2f}  {result.cpu_term.formula}")
    if result.nvme_bytes_per_node:
        disk = result.nvme_bytes_per_node / GIB
        lines.append(f"{'NVMe per node':18}{disk:9.2f}  {result.nvme_term.formula} under {z.nvme_path}")
    lines.append(f"{'checkpoint on disk':18}{result.checkpoint_bytes / GIB:9.2f}  one saved tag, all ranks")
    lines += ["", "fits: " + ", ".join(f"{g} {'yes' if ok else 'no'}" for g, ok in result.fits.items())]
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines)


#: columns of the plan's text tables
PLAN_COLUMNS = [
    "label",
    "per_gpu_gib",
    "comm_inter_gib",
    "comm_intra_gib",
    "step_s",
    "tokens_per_s",
    "hours",
    "cost_usd",
]


def run_plan(args: argparse.Namespace) -> int:
    from kit.estimate import plan

    setup = setup_from_args(args)
    assume = Assumptions(**{name: getattr(args, name) for name in vars(Assumptions())})
    train_batch = args.train_batch or plan.DEFAULT_TRAIN_BATCH
    headroom = plan.DEFAULT_HEADROOM if args.headroom is None else args.headroom
    found = plan.search(
        setup,
        train_batch=train_batch,
        gpus=items(args.gpus) or None,
        max_nodes=args.max_nodes,
        headroom=headroom,
        tokens=args.tokens,
        price=_prices(args.price, items(args.gpus)),
        assumptions=assume,
        fabric=args.network,
        calibration=_calibration(args),
    )
    fix = plan.make_it_fit(setup, headroom=headroom, assumptions=assume, fabric=args.network)
    clusters = plan.smallest_cluster(setup, max_nodes=args.max_nodes)
    batches = plan.batch_options(setup, setup.batch.train_batch)
    fitting = found.options(args.max_hours)
    top = fitting if args.top == 0 else fitting.head(args.top)
    if args.json:
        print_json(
            {
                "setup": setup.model_dump(mode="json"),
                **found.to_dict(),
                "train_batch": train_batch,
                "setups": plan.records(top),
                "make_it_fit": plan.records(fix),
                "smallest_cluster": clusters.to_dict(orient="records"),
                "batch_options": batches.to_dict(orient="records"),
                "nvme_slowdown": plan.records(_nvme_best(found)),
            }
        )
        return 0
    print(
        f"{setup.model.name}: global batch {train_batch} x seq {setup.batch.seq_len}, "
        f"{found.tokens:.3g} tokens, {setup.zero.precision}, headroom {headroom:.0%}; "
        f"{len(found.table):,} setups in {found.seconds:.2f} s ({found.setups_per_s:,.0f}/s), "
        f"{int(found.table.fits.sum()):,} fit"
    )
    print("assumptions: " + ", ".join(f"{k} {v:g}" for k, v in vars(assume).items()))
    print(f"step times: {found.calibration}")
    for line in found.skipped:
        print(f"skipped {line}")
    print("\nPareto front, wall-clock time vs cost (fastest first):")
    print(_table(found.pareto()))
    print("\nCheapest and fastest per GPU type:")
    print(_table(found.best_per_gpu(), ["pick", *PLAN_COLUMNS]))
    print(f"\nCheapest fitting setups, the best batch of each ({len(top)} of {len(fitting):,}):")
    print(_table(top))
    here = f"{setup.label} on {setup.cluster.nodes}x{setup.cluster.gpus_per_node} {setup.cluster.gpu}"
    if fix.empty:
        print(f"\n{here}: fits with {headroom:.0%} headroom.")
    else:
        print(f"\n{here} does not fit; the smallest changes that make it fit:")
        print(_table(fix, ["change", "per_gpu_gib", "step_s", "tokens_per_s"]))
    nvme = _nvme_best(found)
    if not nvme.empty:
        print(
            "\nNVMe offload (ZeRO-Infinity) beside CPU offload, the fastest fitting of each GPU and variant:"
        )
        print(
            _table(
                nvme,
                ["gpu", "gpus", "offload_param", "per_gpu_gib", "nvme_gib_per_node", "step_s", "slowdown"],
            )
        )
    print(f"\nSmallest cluster of {setup.cluster.gpu} per ZeRO variant ({setup.model.name}):")
    print(clusters.to_string(index=False))
    print(f"\nDecompositions of train_batch {setup.batch.train_batch} on {setup.dp} GPUs:")
    print(batches.to_string(index=False))
    return 0


def _nvme_best(found):
    """Per GPU type and NVMe variant, the fastest fitting setup with its slowdown vs CPU offload."""
    from kit.estimate import plan

    slow = plan.nvme_slowdown(found)
    slow = slow[slow.fits].round({"nvme_gib_per_node": 1, "slowdown": 2})
    return (
        slow.sort_values("step_s")
        .drop_duplicates(["gpu", "offload_param"])
        .sort_values(["gpu", "offload_param"])
    )


def _table(frame, columns: list[str] = PLAN_COLUMNS) -> str:
    if frame.empty:
        return "  (none)"
    from kit.estimate.plan import readable

    return readable(frame[columns]).to_string(index=False)


def _prices(items: list[str], gpus: list[str] | None) -> dict[str, float]:
    """``--price 2.5`` (every GPU) and ``--price H100-SXM-80GB=6.9`` (one) as {gpu: USD per GPU-hour}."""
    from kit.gpus import gpu_names

    out: dict[str, float] = {}
    for item in items:
        name, _, value = item.rpartition("=")
        try:
            usd = float(value)
        except ValueError:
            raise UsageError(f"price: expected USD or GPU=USD, got {item!r}") from None
        if usd <= 0:
            raise UsageError(f"price: must be > 0 USD per GPU-hour, got {item!r}")
        for target in [name] if name else gpus or gpu_names():
            if target not in gpu_names():
                raise UsageError(f"price: unknown GPU {target!r}; choose one of {', '.join(gpu_names())}")
            out[target] = usd
    return out
