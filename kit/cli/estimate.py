"""``zerokit estimate``: parse flags into a Setup, call kit, print (``zerokit plan``: ``kit.cli.plan``)."""

from __future__ import annotations

import argparse

from kit.cli.args import add_setup_args, print_json, setup_from_args
from kit.steptime import calibrated
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


def add_calibration(p) -> None:
    p.add_argument(
        "--calibration",
        metavar="FILE",
        help="step times from this machine's calibration (zerokit calibrate --measure), not the datasheet",
    )


#: how ``estimate`` names an uncalibrated step time
DATASHEET = "uncalibrated: datasheet figures and kit.steptime.kernels' roofline, see its parts"


def _step_time(setup, calibration):
    """The step time ``estimate`` prints: calibrated when a calibration is given, else the datasheet's
    (None where the GPU cannot run the precision: the fit verdict says so)."""
    try:
        return calibrated.step_time(setup, calibration=calibration)
    except ValueError:
        return None


def _calibration(args: argparse.Namespace):
    from kit.steptime.calibration import Calibration

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
    timed = _step_time(result.setup, calibration)
    if args.json:
        print_json({**result.to_dict(), **({"step_time": timed.to_dict()} if timed else {})})
    else:
        print(render(result))
        if timed:
            print(f"step time: {timed.step_s:.4g} s ({timed.calibration or DATASHEET})")
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
        f"batch: {b.train_batch} = {b.micro_batch} (micro) x {s.dp} ({s.dp_words}) x {b.grad_accum} "
        "(grad accum), "
        + ("" if s.model.source else f"seq {b.seq_len}   ")  # a model file's batch() sets its own shapes
        + (f"target {b.target_len}   " if b.target_len else "")  # an encoder-decoder's decoder tokens
        + f"formula: {result.formula}",
        "",
        f"{'per GPU':18}{'GiB':>9}  formula",
    ]
    for name, term in result.terms.items():
        lines.append(f"{name:18}{term.bytes / GIB:9.2f}  {term.formula}")
    whole = result.components_bytes / GIB
    verdict = "not the verdict: the peak below is" if result.timeline else "the verdict"
    lines.append(f"{'sum':18}{whole:9.2f}  every component at once ({verdict})")
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
        if result.reserved:
            z = result.setup.zero
            published = (
                "published ZeRO-3 runs reserved more"
                if z.engine == "deepspeed" and z.stage == 3
                else "how close it came on published runs"
            )
            other = (
                f"with expandable segments; without them: {result.reserved_plain_bytes / GIB:.2f}"
                if z.expandable_segments
                else f"expandable_segments: {result.reserved_expandable_bytes / GIB:.2f}"
            )
            lines.append(
                f"{'max reserved':18}{result.reserved_bytes / GIB:9.2f}  torch.cuda.max_memory_reserved: the "
                f"peak phase + the caching allocator's {result.reserved.cached / GIB:.2f} GiB, replayed over "
                f"two steps ({other}); {published}: zerokit published"
            )
            if result.reserved.initialize > result.reserved.allocated:
                lines.append(
                    f"{'at initialize':18}{result.reserved.initialize / GIB:9.2f}  tensors while DeepSpeed "
                    "builds the states, more than any step (ZeRO-1/2 flatten the 16-bit module beside its "
                    "tensors where the card has room): what max_memory_allocated since the start reads"
                )
        lines.append(
            f"{'overhead':18}{result.peak_overhead.bytes / GIB:9.2f}  {result.peak_overhead.formula}"
        )
        verdict = (
            "max reserved + overhead (the verdict; past a GPU's memory, the allocator replayed within it)"
            if result.reserved
            else "the peak phase + overhead (the verdict)"
        )
        lines.append(f"{'peak per GPU':18}{result.per_gpu_bytes / GIB:9.2f}  {verdict}")
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
    size = result.checkpoint_bytes
    saved = (
        ("-", "not modelled for a trainable subset yet")
        if size is None
        else (f"{size / GIB:.2f}", "one saved tag, all ranks")
    )
    lines.append(f"{'checkpoint on disk':18}{saved[0]:>9}  {saved[1]}")
    lines += ["", "fits: " + ", ".join(_fits_on(result, g) for g in result.fits)]
    lines += [f"note: {n}" for n in result.notes]
    plain, grown = result.reserved_plain_bytes, result.reserved_expandable_bytes
    if plain and plain - grown > 0.05 * plain and not result.setup.zero.expandable_segments:
        less = (plain - grown) / GIB
        lines.append(
            f"note: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True would reserve {less:.2f} GiB less "
            f"({plain / GIB:.2f} -> {grown / GIB:.2f} GiB, replayed): --expandable-segments"
        )
    return "\n".join(lines)


def _fits_on(result, gpu: str) -> str:
    """``"H100-SXM-80GB yes"``, ``"L4 no"``, or ``"V100-SXM2-32GB no (no bf16)"``: kit.fit's verdict, as the
    memory panel says it."""
    from kit.fit import estimate_fit

    verdict = estimate_fit(result, gpu)
    if verdict.problem == "precision":
        return f"{gpu} no (no {result.setup.zero.precision})"
    return f"{gpu} {'yes' if verdict.ok else 'no'}" + (
        " (flushing the allocator's cache)" if verdict.flushes else ""
    )
