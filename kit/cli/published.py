"""``zerokit published``: the published measurements of real GPU runs (``data/published/``) beside the kit's
predictions, row by row (``kit.accuracy.published``): a table, the summary, and what the kit cannot
express yet; ``--json`` prints ``{"rows": [...], "summary": {...}}``."""

from __future__ import annotations

import argparse

from kit.cli.args import UsageError, add_json, print_json
from kit.units import GIB

#: ``--table`` choices: the published tables, and the kit's own GPU runs (``data/reference``)
TABLE_CHOICES = ("all", "memory", "throughput", "reference")
#: the text table's columns and widths
COLUMNS = (("id", 3), ("check", 18), ("measured", 9), ("predicted", 25), ("error", 9), ("conf.", 6))
#: quantities as the text names them


def register(sub) -> None:
    p = sub.add_parser(
        "published",
        help="published GPU runs (data/published) beside the kit's predictions, row by row",
        description="Every published measurement of a real GPU run in data/published/ beside the kit's "
        "prediction: max allocated and max reserved bytes per GPU, fit / OOM at a micro batch, seconds per "
        "step (kit.steptime.perf on the row's GPU and fabric), or the one reason the kit cannot express the "
        "run yet.",
    )
    p.add_argument(
        "--table", default="all", help=f"which rows: {', '.join(TABLE_CHOICES)} (default %(default)s)"
    )
    p.add_argument(
        "--id",
        dest="ids",
        nargs="+",
        action="extend",
        default=[],
        metavar="ID",
        help="only these rows (A18 ...)",
    )
    add_json(p, '{"rows": [...], "summary": {...}, "reference": {"configurations": [...], "summary": {...}}}')
    p.set_defaults(func=published_command)


def published_command(args: argparse.Namespace) -> int:
    from kit.accuracy import published

    if args.table not in TABLE_CHOICES:
        raise UsageError(f"--table: choose one of {', '.join(TABLE_CHOICES)}, got {args.table!r}")
    from kit.accuracy import reference, traces

    if args.table == "reference" and args.ids:
        raise UsageError("--id: the reference table's runs have no ids; leave --id out")
    known = published.ids("all" if args.table == "reference" else args.table)
    unknown = [i for i in dict.fromkeys(args.ids) if i not in known]
    if unknown:
        raise UsageError(
            f"--id: no row {', '.join(unknown)} in table {args.table}; choose from {_ranges(known)}"
        )
    result = None if args.table == "reference" else published.report(args.table, args.ids)
    own = reference.configurations() if args.table in ("all", "reference") and not args.ids else None
    runs = traces.runs() if own is not None else []
    if args.json:
        data = result.to_dict() if result else {}
        if own is not None:
            data["reference"] = {
                "configurations": [c.to_dict() for c in own],
                "summary": reference.summary(own),
                "traces": [r.to_dict() for r in runs],
            }
        print_json(data)
    else:
        parts = ([text(result)] if result else []) + ([reference_text(own)] if own is not None else [])
        parts += [traces_text(runs)] if runs else []
        print("\n\n".join(parts))
    return 0


def text(result) -> str:
    """The readable report: one line per compared quantity or fit boundary, the summary, the notes (each
    once, with the rows it applies to), and every row the kit cannot express yet with its reason."""
    shown = [c for c in result.comparisons if c.expressed and (c.values or c.checks or c.timings)]
    lines = [
        "Published GPU runs (data/published) beside the kit's predictions, per GPU",
        "(GiB = 2^30 bytes; error = predicted / measured - 1, of a step time too; fits: kit.fit's verdict "
        "on the row's GPU; a step time is converted from the row's metric as its note says)",
        "",
        "  ".join(f"{name:<{width}}" for name, width in COLUMNS) + "  setup",
    ]
    for c in shown:
        for n, cells in enumerate(_cells(c)):
            row = "  ".join(f"{cell:<{w}}" for cell, (_, w) in zip(cells, COLUMNS, strict=True))
            lines.append((row + "  " + (_setup_text(c) if n == 0 else "")).rstrip())
    if not shown:
        lines.append("(no row of this selection is compared)")
    lines += ["", "summary:"] + [f"  {line}" for line in summary_lines(result.summary())]
    notes: dict[str, list[str]] = {}
    for c in shown:
        for note in _notes(c):
            notes.setdefault(note, []).append(c.id)
    if notes:
        lines += ["", "notes:"] + [f"  {', '.join(ids)}: {note}" for note, ids in notes.items()]
    refused = [c for c in result.comparisons if not c.expressed]
    if refused:
        lines += ["", "cannot express yet:"] + [f"  {c.id}  {c.reason}" for c in refused]
    return "\n".join(lines)


def _cells(c) -> list[tuple[str, ...]]:
    """The table's cells, one tuple per compared quantity or fit boundary of one row."""
    from kit.accuracy.published import QUANTITY_TEXT

    conf = c.row["confidence"]
    out: list[tuple[str, ...]] = []
    for v in c.values:
        measured, predicted = _gib(v.measured_bytes), _gib(v.predicted_bytes)
        out.append((c.id, QUANTITY_TEXT[v.quantity], measured, predicted, f"{100 * v.error:+.1f} %", conf))
    for k in c.checks:
        check = f"fit at mb {k.micro_batch}" + (" (max)" if k.largest else "")
        predicted = k.predicted_text(c.setup.zero.precision)
        out.append((c.id, check, k.measured, predicted, k.verdict_text(), conf))
    for t in c.timings:
        out.append(
            (
                c.id,
                "step time",
                f"{t.measured_s:.4g} s",
                f"{t.predicted_s:.4g} s",
                f"{100 * t.error:+.1f} %",
                conf,
            )
        )
    return out


def _setup_text(c) -> str:
    if c.checks:
        return f"{c.label}; {c.fit_text()}"
    if c.timings:
        t = c.timings[0]
        rate = f"{t.measured_value:.4g} measured, {t.predicted_value:.4g} predicted {t.unit}"
        return f"{c.label}{f' over {t.fabric}' if t.fabric else ''}; {rate}"
    return c.label


def _notes(c) -> list[str]:
    """What a reader needs beside a row's numbers: the mapping's assumptions, a prediction that stands in
    for another quantity, a measured reading not compared."""
    from kit.accuracy.published import QUANTITY_TEXT

    notes = list(c.notes)
    notes += [f"step time = {t.conversion}" for t in c.timings]
    for v in c.values:
        if v.predicted_as == "peak_per_gpu_bytes":
            notes.append(
                f"{QUANTITY_TEXT[v.quantity]} predicted by peak_per_gpu_bytes (the Estimate has no "
                "reserved_bytes yet; it adds the CUDA context and NCCL's buffers, which are not reserved)"
            )
    if c.measured_bytes is not None:
        also = c.row.get("value_secondary")
        notes.append(
            f"measured {_gib(c.measured_bytes)}{f' ({also})' if also else ''} by {c.row['measured_what']}, "
            f"not compared; the kit's peak of live tensors {_gib(c.checks[0].peak_tensor_bytes)}"
        )
    return notes


def summary_lines(summary: dict) -> list[str]:
    """The summary as lines: rows expressed per table, per quantity the median |error| and the worst, and
    the fit / OOM agreement."""
    from kit.accuracy.published import QUANTITY_TEXT

    lines = []
    for table, counts in summary["tables"].items():
        lines.append(f"{table}: {counts['expressed']} of {counts['rows']} rows expressed")
    for quantity, q in summary["quantities"].items():
        median, worst, by = 100 * q["median_abs_error"], 100 * q["worst_error"], ", ".join(q["predicted_as"])
        lines.append(
            f"{QUANTITY_TEXT[quantity]}: {q['rows']} row(s), median |error| {median:.1f} %, "
            f"worst {worst:+.1f} % ({q['worst_id']}); predicted by {by}"
        )
    step = summary.get("step_time")
    if step:
        median, worst = 100 * step["median_abs_error"], 100 * step["worst_error"]
        lines.append(
            f"step time: {step['rows']} row(s), median |error| {median:.1f} %, worst {worst:+.1f} % "
            f"({step['worst_id']}); {step['within_25']} within 25 %, {step['within_2x']} within 2x"
        )
        for group in step["stage_sets"]:
            verdict = "right" if group["agrees"] else "WRONG"
            lines.append(
                f"stage order {', '.join(group['ids'])}: {verdict} (measured fastest first "
                f"{' < '.join(group['measured'])}; predicted {' < '.join(group['predicted'])})"
            )
    fit = summary["fit"]
    if fit["rows"]:
        disagree = f"; disagree: {', '.join(fit['disagree'])}" if fit["disagree"] else ""
        held = (
            f"; open: {', '.join(fit['open'])} (batches padded to their longest, lengths not published: "
            "see the notes)"
            if fit["open"]
            else ""
        )
        lines.append(f"fit / OOM: {fit['agree']} of {fit['rows']} row(s) agree{disagree}{held}")
    return lines


def reference_text(configs) -> str:
    """The kit's own GPU runs (``kit.accuracy.reference``): per configuration measured / predicted and the
    error of max allocated, max reserved and the median step, their summary and what is not predicted."""
    from kit.accuracy.reference import QUANTITIES, summary

    lines = [
        "Measured on a GPU by the kit's own runner (data/reference, make gpu-reference GPUS=N), per GPU",
        "(measured / predicted, error = predicted / measured - 1; the estimate on the GPU the run used)",
        "",
    ]
    if not configs:
        return "\n".join([*lines, "(no runs yet: make gpu-reference GPUS=N on a machine with GPUs)"])
    header = ("configuration", "GPU", "max allocated GiB", "max reserved GiB", "step time s")
    rows = [header]
    for c in configs:
        cells = [f"{c.sweep} {c.label}", c.gpu or c.device]
        for quantity in QUANTITIES:
            scale, digits = (1.0, 3) if quantity == "step_time" else (GIB, 2)
            measured = f"{c.measured[quantity] / scale:.{digits}f}"
            error = c.error(quantity)
            if error is None:
                cells.append(f"{measured} / -")
            else:
                cells.append(f"{measured} / {c.predicted[quantity] / scale:.{digits}f} {100 * error:+6.1f} %")
        rows.append(tuple(cells))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines += ["  ".join(f"{cell:<{w}}" for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines += ["", f"{configs[0].device}, {configs[0].versions}", "summary:"]
    for quantity, q in summary(configs).items():
        lines.append(
            f"  {quantity.replace('_', ' ')}: {q['configurations']} configuration(s), median |error| "
            f"{100 * q['median_abs_error']:.1f} %, worst {100 * q['worst_error']:+.1f} % ({q['worst']})"
        )
    notes: dict[str, list[str]] = {}
    for c in configs:
        if c.unpredicted:
            notes.setdefault(c.unpredicted, []).append(f"{c.sweep} {c.label}")
    if notes:
        lines += ["notes:"] + [f"  {', '.join(labels)}: {note}" for note, labels in notes.items()]
    return "\n".join(lines)


def traces_text(runs) -> str:
    """The allocator traces (``kit.accuracy.traces``): per run the device's max allocated and reserved,
    the replay of its own allocations and the kit's estimate, with the estimate's error."""
    lines = [
        "Rank 0 of many on one GPU (data/reference/allocator-traces: a fake process group, every allocation "
        "real, no collective run)",
        "(measured / the allocator's replay of the recorded allocations / the kit's estimate (its error))",
        "",
    ]
    header = ("run", "ranks", "max allocated GiB", "max reserved GiB")
    rows = [header]
    for r in runs:
        rows.append((r.name, str(r.ranks), r.cell("max_allocated"), r.cell("max_reserved")))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines += ["  ".join(f"{c:<{w}}" for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines += ["", f"{runs[0].device}, {runs[0].versions}", "runs:"]
    lines += [f"  {r.name}: {r.what}" for r in runs]
    return "\n".join(lines)


def _gib(nbytes: int) -> str:
    return f"{nbytes / GIB:.2f} GiB"


def _ranges(ids: list[str]) -> str:
    """``A01-A10, A18-A39, B01-B36``: consecutive ids of one letter as ranges."""
    runs: list[list[str]] = []
    for i in ids:
        last = runs[-1][-1] if runs else ""
        if last and last[0] == i[0] and int(i[1:]) == int(last[1:]) + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(run[0] if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)
