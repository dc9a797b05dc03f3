"""``zerokit plan``: every setup that fits, timed and priced; the booking to make and what makes yours fit."""

from __future__ import annotations

import argparse

from kit.cli.args import UsageError, add_setup_args, count, items, print_json, setup_from_args
from kit.cli.estimate import _calibration, add_calibration
from kit.steptime import calibrated, perf
from kit.steptime.perf import Assumptions
from kit.units import GIB


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="every setup that fits, with predicted time and cost; what makes yours fit",
        description="For a model: every GPU type x cluster size x ZeRO variant x checkpointing x batch "
        "decomposition of the global batch, estimated and timed. First the booking to make for --goal "
        "(the cheapest within --max-hours, or the fastest within --budget), the command that writes its "
        "ds_config, and a few alternatives with why each differs; with --micro-batch (or --ds-config), "
        "whether your setting fits and the smallest changes that make it fit. --all adds every table: the "
        "Pareto front of time vs cost, the cheapest and fastest per GPU, the cheapest setups, NVMe "
        "offload, the fewest GPUs each ZeRO variant fits on, the batch decompositions on your cluster.",
    )
    add_setup_args(p)
    p.add_argument("--max-nodes", type=int, default=64)
    s = p.add_argument_group("search")
    s.add_argument(
        "--node-counts",
        help="node counts to plan, any, comma-separated, e.g. 3,6,12 (default: 2, 4, 8 ... --max-nodes)",
    )
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
    s.add_argument("--budget", type=float, metavar="USD", help="only setups that cost at most this")
    s.add_argument(
        "--goal",
        choices=("cheapest", "fastest"),
        default="cheapest",
        help="recommend the cheapest setup (within --max-hours) or the fastest (within --budget)",
    )
    s.add_argument("--all", action="store_true", help="also print every table (Pareto front, per GPU ...)")
    s.add_argument(
        "--network", help="inter-node fabric in data/networks.csv (default: per --interconnect kind)"
    )
    s.add_argument("--top", type=int, default=10, help="fitting setups listed, cheapest first (0: all)")
    a = p.add_argument_group("performance-model assumptions (kit.steptime.perf.Assumptions)")
    for name, value in vars(Assumptions()).items():
        a.add_argument(f"--{name.replace('_', '-')}", type=float, default=value, help=f"default {value:g}")
    add_calibration(p)
    p.set_defaults(func=run_plan)


def _node_counts(text: str | None) -> list[int] | None:
    """``--node-counts 3,6,12`` as numbers; a word that is not one is refused in one line."""
    counts = items(text)
    bad = [n for n in counts if not n.isdigit()]
    if bad:
        raise UsageError(f"--node-counts: whole numbers in [1, 4096], comma-separated; got {bad[0]!r}")
    return [int(n) for n in counts] or None


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
#: the columns of the alternatives beside the recommendation
ALTERNATIVE_COLUMNS = ["label", "per_gpu_gib", "hours", "cost_usd", "why"]
#: the columns of make-it-fit's table
FIX_COLUMNS = ["change", "per_gpu_gib", "step_s", "tokens_per_s"]
#: make-it-fit rows on the default screen (``--all``: every one)
FIXES_SHOWN = 5
#: the text columns of the plan's tables, left-aligned (numbers are right-aligned)
TEXT_COLUMNS = {"label", "why", "change", "variant", "gpu", "pick", "offload_param", "fits"}


def run_plan(args: argparse.Namespace) -> int:
    from kit.planning import plan
    from kit.planning.report import report

    setup = setup_from_args(args)
    given = bool(args.ds_config or args.micro_batch or args.grad_accum)  # a setting of the user's own
    for flag, value, unit in (("max-hours", args.max_hours, "hours"), ("budget", args.budget, "USD")):
        if value is not None and not value > 0:
            raise UsageError(f"{flag}: must be > 0 {unit}, got {value:g}")
    assume = Assumptions(**{name: getattr(args, name) for name in vars(Assumptions())})
    fixed = args.train_batch or args.grad_accum or args.ds_config  # the user's batch sets the global one
    train_batch = setup.batch.train_batch if fixed else plan.DEFAULT_TRAIN_BATCH
    if given and not fixed:  # a micro batch alone: grad accum makes the planned global batch
        setup = _with_global_batch(setup, train_batch)
    headroom = plan.DEFAULT_HEADROOM if args.headroom is None else args.headroom
    prices = _prices(args.price, items(args.gpus))
    calibration = _calibration(args)
    within = {"max_hours": args.max_hours, "budget": args.budget}
    planned = report(
        setup,
        goal=args.goal,
        **within,
        start=setup if given else None,
        train_batch=train_batch,
        gpus=items(args.gpus) or None,
        max_nodes=args.max_nodes,
        node_counts=_node_counts(args.node_counts),
        headroom=headroom,
        tokens=args.tokens,
        price=prices,
        assumptions=assume,
        fabric=args.network,
        calibration=calibration,
    )
    found, booked, fix = planned.plan, planned.booking, planned.fixes
    r = booked.recommended
    command = (
        _ds_config_command(args, found.setup(r.name)) if r is not None and r.engine == "deepspeed" else None
    )
    sized = setup if given else setup.replace(batch={"micro_batch": 1, "grad_accum": 1})
    gpus = list(dict.fromkeys(found.table.gpu))
    if setup.cluster.gpu not in gpus:  # --gpus leaves it out: the recommended type's, or the first planned
        sized = sized.replace(cluster={"gpu": r.gpu if r is not None else gpus[0]})
    every = args.json or args.all  # the tables only they show
    clusters = plan.smallest_cluster(sized, max_nodes=args.max_nodes) if every else None
    batches = plan.batch_options(setup, setup.batch.train_batch) if given and every else None

    def listed():
        options = found.options(**within)
        return options if args.top == 0 else options.head(args.top)

    top = found.settle(listed)  # the rows printed, each confirmed by the allocator's replay
    fitting = found.options(**within)
    if args.json:
        print_json(
            {
                "setup": setup.model_dump(mode="json"),
                **found.to_dict(**within),
                "train_batch": train_batch,
                "goal": args.goal,
                "max_hours": args.max_hours,
                "budget": args.budget,
                "recommended": _recommended_json(found, booked, command),
                "alternatives": plan.records(booked.alternatives),
                "setting_given": given,
                "setups": plan.records(top),
                "make_it_fit": plan.records(fix) if fix is not None else [],
                "smallest_cluster": plan.records(clusters),
                "batch_options": plan.records(batches) if batches is not None else [],
                "nvme_slowdown": plan.records(planned.nvme()),
            }
        )
        return 0
    lines = _recommendation(found, booked, command)
    if given:
        lines += _your_setting(setup, found, fix, prices, calibration, args)
    if args.all:
        lines += _every_table(planned, top, fitting, clusters, batches, sized, setup)
    else:
        tables = "Pareto front, cheapest and fastest per GPU, cheapest setups, NVMe, smallest cluster"
        lines += ["", f"--all: every table ({tables}{', decompositions' if given else ''})"]
    # the counts last: every row named above is confirmed by then (Plan.settle)
    print("\n".join([*_plan_header(found, train_batch, booked), *lines]))
    return 0


def _with_global_batch(setup, train_batch: int):
    """``setup`` with grad accum making ``train_batch``; UsageError when its micro batch cannot."""
    per_step = setup.batch.micro_batch * setup.dp
    if train_batch % per_step:
        raise UsageError(
            f"train-batch: {train_batch} (the plan's default) is not a multiple of micro batch "
            f"{setup.batch.micro_batch} x {setup.dp} {setup.dp_words}; give --train-batch or --grad-accum"
        )
    return setup.replace(batch={"grad_accum": train_batch // per_step})


def _more_sequence_parallel(setup) -> str:
    """The hint to split each sequence over more GPUs, where the model and settings take it."""
    from kit import sequence_parallel as ulysses

    more = 2 * setup.zero.sequence_parallel_size
    zero = setup.zero.model_copy(update={"sequence_parallel_size": more})
    ok = ulysses.problem(zero, setup.model, more, setup.batch) is None
    return f", sequence parallelism (--sequence-parallel-size {more})" if ok else ""


def _limits(booked) -> str:
    """The plan's limits in words: "240 h and $300,000", or ""."""
    hours = f"{booked.max_hours:,g} h" if booked.max_hours else ""
    usd = f"${booked.budget:,.0f}" if booked.budget else ""
    return " and ".join(x for x in (hours, usd) if x)


def _plan_header(found, train_batch: int, booked) -> list[str]:
    from kit.units import count_text

    s, limits = found.base, _limits(booked)
    lines = [
        f"{s.model.name}: {count_text(found.tokens)} tokens, global batch {train_batch:,} x seq "
        f"{s.batch.seq_len:,}, {s.zero.precision}, headroom {found.headroom * 100:.0f} %; "
        f"{len(found.table):,} setups in {found.seconds:.2f} s, {int(found.table.fits.sum()):,} pass the "
        f"memory screen (the {int(found.table.confirmed.sum()):,} named here: the allocator replayed"
        + (f", {found.refused:,} of them refused" if found.refused else "")
        + ")"
        + (f", {len(found.fitting(booked.max_hours, booked.budget)):,} within {limits}" if limits else ""),
        "assumptions: "
        + ", ".join(f"{k} {v:g}" for k, v in vars(found.assumptions).items())
        + f"; step times {found.calibration}",
    ]
    return lines + [f"skipped {line}" for line in found.skipped]


def _recommendation(found, booked, command: list[str] | None) -> list[str]:
    """The booking for the goal, its ds_config command, and the alternatives with why each differs."""
    import shlex

    from kit.fit import FLUSHES
    from kit.planning import booking

    r, limits = booked.recommended, _limits(booked)
    if r is None:
        fit = found.fitting()
        if fit.empty:
            sp = _more_sequence_parallel(found.base)
            return ["", f"Nothing fits with {found.headroom * 100:.0f} % headroom: try larger GPUs (--gpus), "
                    f"more nodes (--max-nodes){sp} or a smaller --train-batch"]  # fmt: skip
        fast, cheap = fit.loc[fit.hours.idxmin()], fit.iloc[0]
        return [
            "",
            f"Nothing that fits is within {limits}. Fastest: {fast.label}, {fast.hours:,.1f} h, "
            f"${fast.cost_usd:,.0f}. Cheapest: {cheap.label}, {cheap.hours:,.1f} h, ${cheap.cost_usd:,.0f}.",
        ]
    c = found.setup(r.name).cluster
    nodes = f"{c.nodes} node{'s' if c.nodes > 1 else ''} x {c.gpus_per_node}"
    lines = [
        "",
        f"Book (the {booked.goal}{'' if booked.fallback else ' DeepSpeed setup with exact numerics'}"
        f"{' within ' + limits if limits else ''}): {r.gpus} x {r.gpu} ({nodes}), "
        f"{booking.variant(r)}, micro batch {r.micro_batch} x grad accum {r.grad_accum}",
        f"  {r.hours:,.1f} h, ${r.cost_usd:,.0f}; {r.per_gpu_gib:,.1f} of {r.capacity_gib:,.1f} GiB per "
        f"GPU, {r.step_s:,.3g} s per step, {r.tokens_per_s:,.0f} tokens/s",
    ]
    lines += [f"  ({FLUSHES})"] if r.flushes else []
    flag = booking.numerics(r, found.base.zero.precision)
    lines += [f"  numerics: {flag}"] if flag else []
    lines += [f"  ({booked.fallback})"] if booked.fallback else []
    if command is None:
        lines.append("ds_config: none, PyTorch's own engine (zerokit launch-cmd --stage 2 is its ZeRO twin)")
    else:
        lines.append(f"ds_config: {shlex.join(command)}")
        if c.nodes > 1:
            lines.append(
                f"  (with a {c.nodes}-node hostfile: zerokit hostfile --hosts HOST1,HOST2,... "
                f"--slots {c.gpus_per_node} --out hostfile)"
            )
    alt = booked.alternatives
    if alt.empty:
        return lines
    lines += ["", f"Alternatives ({booked.goal} first; why each differs from the booking):"]
    lines.append(_table(alt, ALTERNATIVE_COLUMNS))
    notes = dict.fromkeys(n for n in alt.numerics if n and n != flag)
    return lines + [f"! {note}" for note in notes]


def _your_setting(setup, found, fix, prices, calibration, args) -> list[str]:
    """Whether the user's own setting fits, its time and cost when it does, else what makes it fit."""
    from kit.estimate import estimate
    from kit.fit import FLUSHES, estimate_fit
    from kit.gpus import prices as list_prices

    c = setup.cluster
    here = f"Your setting, {setup.label} on {c.nodes}x{c.gpus_per_node} {c.gpu}"
    verdict = estimate_fit(estimate(setup), headroom=found.headroom)
    if verdict.problem == "precision":
        return ["", f"{here}: the {c.gpu} has no {setup.zero.precision}; choose another --gpu or --precision"]
    usable = f"{verdict.need / GIB:,.1f} GiB per GPU, {verdict.capacity / GIB:,.1f} usable"
    if verdict.ok:
        rate = {**{n: usd for n, (usd, _) in list_prices().items()}, **prices}.get(c.gpu)
        t = calibrated.step_time(setup, perf.hardware(setup, args.network), found.assumptions, calibration)
        run = t.run(found.tokens, rate) if rate else None
        cost = f"; {run['hours']:,.1f} h, ${run['cost_usd']:,.0f}" if run else ""
        return ["", f"{here}: fits ({usable}){cost}" + (f"; {FLUSHES}" if verdict.flushes else "")]
    lines = ["", f"{here}: does not fit ({usable}); the smallest changes that make it fit:"]
    if fix.empty:
        return [*lines, "  (none within one or two changes)"]
    shown = fix if args.all else fix.head(FIXES_SHOWN)
    lines.append(_table(shown, FIX_COLUMNS))
    return lines + ([f"  ({len(fix) - len(shown)} more with --all)"] if len(shown) < len(fix) else [])


def _every_table(planned, top, fitting, clusters, batches, sized, setup) -> list[str]:
    """``--all``: the Pareto front, the picks per GPU, the cheapest setups, NVMe offload, the smallest
    cluster per variant and the decompositions, the first four within the same limits."""
    from kit.planning import booking

    pareto = planned.plan.pareto(**planned.limits)
    lines = ["", "Pareto front, wall-clock time vs cost (fastest first):", _table(pareto)]
    lines += ["", "Cheapest and fastest per GPU type:", _table(planned.picks(), ["pick", *PLAN_COLUMNS])]
    lines += ["", f"Cheapest fitting setups, the best batch of each ({len(top)} of {len(fitting):,}):"]
    lines.append(_table(top))
    nvme = planned.nvme()
    if not nvme.empty:
        lines += [
            "",
            "NVMe offload (ZeRO-Infinity) beside CPU offload, the fastest fitting per GPU and variant:",
        ]
        columns = ["gpu", "gpus", "offload_param", "per_gpu_gib", "nvme_gib_per_node", "step_s", "slowdown"]
        lines.append(_table(nvme, columns))
    what = "your micro batch" if batches is not None else "micro batch 1"
    lines += ["", f"Smallest cluster of {sized.cluster.gpu} per ZeRO variant ({setup.model.name}, {what}):"]
    lines.append(_clusters_text(clusters))
    if batches is not None:
        lines += [
            "",
            f"Decompositions of train_batch {setup.batch.train_batch:,} on {setup.dp} {setup.dp_words}:",
        ]
        shown = batches.assign(fits=batches.fits.map({True: "fits", False: "does not fit"}))
        columns = ["micro_batch", "grad_accum", "train_batch", "activations_gib", "per_gpu_gib", "fits"]
        lines.append(_table(shown, columns))
    return [*lines, "", booking.NOTE]


def _clusters_text(clusters) -> str:
    """``smallest_cluster``'s table: a variant that fits nowhere is one line saying so, no blank cells."""
    fits = clusters[clusters.verdict == "fits"]
    lines = []
    if len(fits):
        shown = fits.assign(nodes=fits.nodes.astype(int), gpus=fits.gpus.astype(int))
        lines.append(_table(shown, ["variant", "nodes", "gpus", "per_gpu_gib", "cpu_gib_per_node"]))
    lines += [f"{row.variant}: {row.verdict}" for row in clusters[clusters.verdict != "fits"].itertuples()]
    return "\n".join(lines)


def _recommended_json(found, booked, command) -> dict | None:
    from kit.planning import booking, plan

    r = booked.recommended
    if r is None:
        return None
    row = plan.records(found.table.loc[[r.name]])[0]
    return {
        **row,
        "variant": booking.variant(r),
        "numerics": booking.numerics(r, found.base.zero.precision),
        "fallback": booked.fallback,
        "ds_config_command": command,
    }


def _ds_config_command(args: argparse.Namespace, s) -> list[str]:
    """The ``zerokit launch-cmd`` argv that writes setup ``s``'s ds_config.json (and its launch files) to
    launch/: the model as the user gave it, then each ZeRO field of ``s`` that is not the default."""
    from kit import settings

    c, z, b = s.cluster, s.zero, s.batch
    argv = ["zerokit", "launch-cmd", *_model_flags(args)]
    argv += ["--nodes", str(c.nodes), "--gpus-per-node", str(c.gpus_per_node), "--gpu", c.gpu]
    if args.cpu_ram_gb:
        argv += ["--cpu-ram-gb", f"{args.cpu_ram_gb:g}"]
    argv += settings.argv(z)
    argv += [
        "--micro-batch",
        str(b.micro_batch),
        "--grad-accum",
        str(b.grad_accum),
        "--seq-len",
        str(b.seq_len),
    ]
    argv += ["--target-len", str(b.target_len)] if b.target_len else []  # an encoder-decoder's labels
    return [*argv, *(["--hostfile", "hostfile"] if c.nodes > 1 else []), "--out", "launch"]


def _model_flags(args: argparse.Namespace) -> list[str]:
    """The model flags as given: ``--model`` or ``--params [--largest-layer]``, then each override."""
    out = ["--model", args.model] if args.model else ["--params", str(args.params)]
    if args.largest_layer and not args.model:
        out += ["--largest-layer", str(args.largest_layer)]
    for name in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "experts"):
        if getattr(args, name) is not None:
            out += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    for item in args.set:
        out += ["--set", item]
    return out


def _table(frame, columns: list[str] = PLAN_COLUMNS) -> str:
    """``frame``'s ``columns`` with units (``plan.readable``), text left and numbers right, in full."""
    if frame.empty:
        return "  (none)"
    from kit.planning.booking import marked
    from kit.planning.plan import readable

    shown = readable(frame[columns])
    if "label" in columns and "zeropp" in frame:
        shown["label"] = marked(frame)
    cells = [[str(v) for v in shown[c]] for c in columns]
    widths = [max(len(c), *map(len, column)) for c, column in zip(columns, cells, strict=True)]

    def line(values) -> str:
        parts = zip(values, widths, columns, strict=True)
        return "  ".join(v.ljust(w) if c in TEXT_COLUMNS else v.rjust(w) for v, w, c in parts).rstrip()

    return "\n".join([line(columns), *(line(row) for row in zip(*cells, strict=True))])


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
