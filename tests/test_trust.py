"""Notebook 11's tables, figures and answer (``kit.lab.trust``): the published runs beside the kit, each
number where the report puts it, the labels inside the figure and apart, what it cannot express grouped."""

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from kit.lab import trust
from kit.units import GIB


def _renderer(fig: Figure):
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    return renderer


def test_published_draws_each_measured_number_at_the_reports_bytes(published_report):
    fig = trust.figure(published_report)
    _renderer(fig)
    (ax,) = fig.axes
    drawn = {c.get_gid(): c.get_offsets().tolist() for c in ax.collections if c.get_gid()}
    numbers = [(c, v) for c in published_report.comparisons for v in c.values]
    assert numbers and drawn == {
        f"{c.id} {v.quantity}": [[v.measured_bytes / GIB, v.predicted_bytes / GIB]] for c, v in numbers
    }  # exactly the report's bytes, in GiB
    (identity,) = ax.lines
    assert list(identity.get_xdata()) == list(identity.get_ydata())  # predicted = measured
    assert list(identity.get_xdata()) == list(ax.get_xlim()) == list(ax.get_ylim())
    assert ax.get_xscale() == ax.get_yscale() == "log"
    (band,) = [c for c in ax.collections if not c.get_gid()]
    corners = band.get_paths()[0].vertices
    low, high = ax.get_xlim()
    for x in (low, high):  # the band runs from 0.9 x to 1.1 x at both ends
        ys = sorted(y for cx, y in corners if cx == pytest.approx(x))
        assert ys[0] == pytest.approx(0.9 * x) and ys[-1] == pytest.approx(1.1 * x)
    rows = len({c.id for c, _ in numbers})
    assert ax.get_title(loc="left") == (
        f"Predicted vs measured per GPU: {len(numbers)} numbers from {rows} of "
        f"{len(published_report.comparisons)} published rows"
    )
    texts = [t.get_text() for t in ax.texts]
    assert texts == [f"{c.id} {v.quantity.replace('_', ' ')} ({100 * v.error:+.1f} %)" for c, v in numbers]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend[:2] == ["predicted = measured", "within 10 %"]
    assert {"ZeRO-3", "high confidence (filled)", "medium / low confidence"} <= set(legend)
    assert "max allocated vs peak_tensor_bytes" in legend


def test_published_marks_engine_and_confidence(published_report):
    import dataclasses

    from kit.accuracy.published import Report

    a18, a19 = (c for c in published_report.comparisons if c.id in ("A18", "A19"))
    medium = dataclasses.replace(a19, row={**a19.row, "confidence": "medium"})
    ax = trust.figure(Report((a18, medium))).axes[0]
    points = {c.get_gid(): c for c in ax.collections if c.get_gid()}
    high, hollow = points["A18 max_allocated"], points["A19 max_allocated"]
    assert list(high.get_facecolor()[0]) == list(high.get_edgecolor()[0])  # filled
    assert list(hollow.get_facecolor()[0]) == [1.0, 1.0, 1.0, 1.0]  # hollow: medium confidence
    shapes = {gid: c.get_paths()[0].vertices.shape for gid, c in points.items()}
    assert shapes["A18 max_allocated"] != shapes["A19 max_allocated"]  # ZeRO-3 vs ZeRO-3 + ZeRO++
    empty = trust.figure(Report(()))
    assert "no row of this report has a number" in empty.axes[0].texts[0].get_text()


def test_published_labels_stay_inside_and_apart(published_report):
    from matplotlib.transforms import Bbox

    fig = trust.figure(published_report)
    renderer = _renderer(fig)
    (ax,) = fig.axes
    page, frame = fig.bbox, ax.get_window_extent(renderer)
    labels = [t.get_window_extent(renderer) for t in ax.texts]
    points = ax.transData.transform(
        [c.get_offsets()[0] for c in ax.collections if c.get_gid()]
    )  # each marker: s=56 pt^2, about 7.5 pt across
    radius = 3.75 * fig.dpi / 72
    for i, box in enumerate(labels):
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
        assert not any(box.overlaps(other) for other in labels[i + 1 :]), ax.texts[i].get_text()
        dots = [Bbox.from_extents(x - radius, y - radius, x + radius, y + radius) for x, y in points]
        assert not any(box.overlaps(dot) for dot in dots), ax.texts[i].get_text()
    texts = [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.get_legend().get_texts()]
    for text in texts:
        box = text.get_window_extent(renderer)
        assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1, text
    assert min(t.get_fontsize() for t in [*ax.texts, *ax.get_legend().get_texts()]) >= 8


def test_published_fits_puts_each_boundary_at_its_share_of_the_gpu(published_report):
    fig = trust.fits_figure(published_report)
    renderer = _renderer(fig)
    (ax,) = fig.axes
    checks = [(c, k) for c in published_report.comparisons for k in c.checks]
    drawn = {c.get_gid(): c for c in ax.collections if c.get_gid()}
    assert checks and list(drawn) == [f"{c.id} mb{k.micro_batch}" for c, k in checks]
    for (c, k), point in zip(checks, drawn.values(), strict=True):
        x, y = point.get_offsets()[0]
        assert x == 100 * k.predicted_bytes / k.capacity_bytes  # the verdict's own bytes
        fits = [tuple(point.get_facecolor()[0][:3])] == [(46 / 255, 125 / 255, 50 / 255)]
        assert fits == (k.measured == "fits"), c.id  # green: it fit; red: it ran out of memory
    (line,) = ax.lines
    assert list(line.get_xdata()) == [100, 100]
    verdicts = [t.get_text() for t in ax.texts]
    shown = {"agrees": "agrees", "disagrees": "DISAGREES", "open": "open"}
    assert [v.split(":")[0] for v in verdicts] == [shown[k.verdict] for _, k in checks]
    agree, held = (sum(k.verdict == v for _, k in checks) for v in ("agrees", "open"))
    assert held == 4  # A25, A27, A28, A30: batches padded to their longest, lengths not published
    rows = len({c.id for c, _ in checks})
    assert ax.get_title() == (
        f"Fit or OOM on {rows} of {len(published_report.comparisons)} published rows: {agree} of "
        f"{len(checks)} verdicts agree, {held} open"
    )
    a27 = next(v for v, (c, _) in zip(verdicts, checks, strict=True) if c.id == "A27")
    assert a27 == "open: fits up to 80 of 128 tokens"  # where the kit fits its micro batch of 40
    page = fig.bbox
    everything = [ax.title, ax.xaxis.label, *ax.texts, *ax.get_yticklabels(), *fig.legends[0].get_texts()]
    boxes = [t.get_window_extent(renderer) for t in everything]
    for text, box in zip(everything, boxes, strict=True):
        assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1, text
    ticks = boxes[2 + len(verdicts) :][: len(checks)]
    assert not any(a.overlaps(b) for i, a in enumerate(ticks) for b in ticks[i + 1 :])
    assert min(t.get_fontsize() for t in everything) >= 8


def test_published_table_shows_each_number_and_boundary_as_a_reader_reads_it(published_report):
    from kit.units import GIB

    table = trust.table(published_report)
    assert list(table.columns) == ["id", "check", "measured", "predicted", "error", "confidence", "setup"]
    found = {c.id: c for c in published_report.comparisons}
    a18 = found["A18"]
    allocated, reserved = a18.values
    rows = table[table["id"] == "A18"].to_dict("records")
    assert rows == [
        {
            "id": "A18",
            "check": "max allocated",
            "measured": "8.09 GiB",  # Megatron's 8284.7 "MB" of 2^20 bytes
            "predicted": f"{allocated.predicted_bytes / GIB:.2f} GiB",
            "error": f"{100 * allocated.error:+.1f} %",
            "confidence": "high",
            "setup": a18.label,
        },
        {
            "id": "A18",
            "check": "max reserved",
            "measured": "18.40 GiB",  # 18838.0 MiB
            "predicted": f"{reserved.predicted_bytes / GIB:.2f} GiB",
            "error": f"{100 * reserved.error:+.1f} %",
            "confidence": "high",
            "setup": a18.label,
        },
    ]
    assert a18.label.startswith("megatron-gpt-18b: z3 fp16 mb1 ckpt on 4 x 16 V100-SXM2-32GB")
    assert allocated.error > 0 and rows[0]["error"].startswith("+") and rows[0]["error"].endswith(" %")
    a33 = found["A33"]
    (check,) = a33.checks
    capacity = f"{check.capacity_bytes / GIB:.2f}"
    (row,) = table[table["id"] == "A33"].to_dict("records")
    assert row == {
        "id": "A33",
        "check": "fit at mb 7 (max)",
        "measured": "fits",
        "predicted": f"{check.predicted} ({check.predicted_bytes / GIB:.2f} of {capacity} GiB)",
        "error": "agrees",
        "confidence": "low",
        "setup": f"{a33.label}; the kit's largest mb {a33.largest_micro_batch}",
    }
    (a30,) = table[table["id"] == "A30"].to_dict("records")  # a padded run: its bound, not a largest mb
    assert a30["error"] == "fits to 96 tok" and a30["setup"].endswith(
        "batches padded to at most 128 tokens; the kit fits mb 40 up to 96 tokens"
    )
    assert row["predicted"].endswith(" of 23.65 GiB)")  # a TITAN RTX's 24 GB
    expressed = [c for c in published_report.comparisons if c.expressed]
    assert len(table) == sum(len(c.values) + len(c.checks) + len(c.timings) for c in expressed)
    assert "A37" not in set(table["id"])  # a row the kit cannot express has no number beside it


def test_unexpressed_table_groups_what_the_kit_cannot_express_by_reason(published_report):
    table = trust.unexpressed(published_report)
    assert list(table.columns) == ["id", "table", "model", "reason"]
    refused = [c for c in published_report.comparisons if not c.expressed]
    assert sorted(table["id"]) == sorted(c.id for c in refused)
    reasons = table["reason"].tolist()
    assert reasons == sorted(reasons, key=lambda r: (-reasons.count(r), r))  # grouped, the most first
    (a37,) = table[table["id"] == "A37"].to_dict("records")
    assert a37 == {
        "id": "A37",
        "table": "memory",
        "model": "BLOOM prototype 20B (NLAYERS=8, NHIDDEN=14400)",
        "reason": "tensor parallelism (TP=8)",
    }
    assert table.iloc[0].to_dict() == {
        "id": "A05",
        "table": "memory",
        "model": table.iloc[0]["model"],
        "reason": "Float8 linears",
    }  # the largest group first: four rows, A05, A06, B31, B36
    grouped = trust.unexpressed(published_report, by_reason=True).set_index("reason")
    assert grouped.loc["FSDP1 flat parameters"].tolist() == [3, "A34, A35, A36"]  # step-time rows take it
    assert grouped.loc["tensor parallelism (TP=8)", "ids"] == "A37"
    assert grouped["rows"].sum() == len(refused)


def test_published_answer_is_built_from_the_summary(published_report):
    from kit.estimate import estimate
    from kit.fit import estimate_fit

    answer = trust.answer(published_report)
    s = published_report.summary()
    allocated, reserved, fit = s["quantities"]["max_allocated"], s["quantities"]["max_reserved"], s["fit"]
    assert answer.startswith(
        f"The tensor peak is within {100 * abs(allocated['worst_error']):.1f} % of max allocated on 2 rows "
        f"(median {100 * allocated['median_abs_error']:.1f} %); "
    )
    assert (
        f"; {fit['agree']} of {fit['rows']} fit / OOM rows agree, 4 hang on lengths their runs did not "
        "publish (A25, A27, A28, A30);" in answer
    )
    assert f"{100 * reserved['median_abs_error']:.1f} % (median; worst" in answer
    assert "; 18 of 32 published memory rows are expressed;" in answer
    zero3 = [c for c in published_report.comparisons if c.id in ("A18", "A19")]
    over = {
        c.id: max(v.measured_bytes for v in c.values) / estimate_fit(estimate(c.setup)).need for c in zero3
    }
    ratio, worst = max((r, i) for i, r in over.items())
    assert ratio > 1 and f" At ZeRO-3 the published max reserved was up to {ratio:.2f}x" in answer
    assert f"the verdict's peak per GPU ({worst})" in answer


def test_step_times_in_the_table_the_figure_and_the_answer(published_report):
    timed = [(c, t) for c in published_report.comparisons for t in c.timings]
    table = trust.table(published_report)
    steps = table[table["check"] == "step time"]
    assert len(steps) == len(timed) == 27
    c, t = next((c, t) for c, t in timed if c.id == "B04")
    (row,) = steps[steps["id"] == "B04"].to_dict("records")
    assert row["measured"] == f"{t.measured_s:.4g} s" and row["predicted"] == f"{t.predicted_s:.4g} s"
    assert row["error"] == f"{100 * t.error:+.1f} %" and row["setup"] == c.label
    fig = trust.steps_figure(published_report)
    (ax,) = fig.axes
    bars = {p.get_gid(): p for p in ax.patches if p.get_gid()}
    assert set(bars) == {c.id for c, _ in timed}
    assert bars["B04"].get_width() == pytest.approx(100 * t.error)  # the bar is the error, in %
    assert ax.get_title() == f"Step time: 27 of the {len(published_report.comparisons)} published rows"
    step = published_report.summary()["step_time"]
    answer = trust.answer(published_report)
    assert f"step times are off by a median {100 * step['median_abs_error']:.0f} % on 27 rows" in answer
    assert f"the stages ranked right on {sum(g['agrees'] for g in step['stage_sets'])} of 2 sets" in answer


def test_the_kits_own_gpu_runs_in_a_table_and_the_answer(published_report):
    from kit.accuracy import reference

    own = reference.configurations()
    table = trust.reference_table(own)
    assert len(table) == len(own) == 9
    assert list(table.columns) == ["run", "max allocated, GiB", "max reserved, GiB", "step, s"]
    first, c = table.iloc[0], own[0]
    assert first["run"] == f"gpt2-xl {c.label}"
    measured, predicted = c.measured["max_allocated"] / GIB, c.predicted["max_allocated"] / GIB
    assert (
        first["max allocated, GiB"]
        == f"{measured:.2f} / {predicted:.2f} ({100 * c.error('max_allocated'):+.1f} %)"
    )
    assert first["step, s"].startswith(f"{c.measured['step_time']:.3f} / {c.predicted['step_time']:.3f} (")
    offloaded = table[table["run"].str.contains("opt-off")]
    assert len(offloaded) == 3 and all(step.endswith(" (not compared)") for step in offloaded["step, s"])
    assert max(len(str(cell)) for cell in table.to_numpy().ravel()) <= 30  # narrow enough to read
    heading = trust.reference_heading(own)
    versions = "torch 2.11.0+cu130, DeepSpeed 0.19.8"
    assert heading == f"9 runs on NVIDIA H200 ({versions}); each cell measured / predicted (error):"
    assert trust.reference_heading([]).startswith("No runs on a GPU yet: make gpu-reference")
    text = trust.answer(published_report, own)
    summary = reference.summary(own)
    assert (
        f"On the kit's own runs on NVIDIA H200 (9 configurations) the tensor peak is a median "
        f"{100 * summary['max_allocated']['median_abs_error']:.1f} % from max allocated" in text
    )
    assert text.endswith(f"{summary['step_time']['worst']}).")
    assert "own runs" not in trust.answer(published_report)


def test_the_traces_table_sets_the_replay_and_the_estimate_beside_the_device():
    """Notebook 11's traces: one row per recorded run, measured / replayed / estimated with the estimate's
    error; the replay's number is the device's (the allocator's rules, checked on real allocations)."""
    from kit.accuracy import traces

    runs = traces.runs()
    table = trust.traces_table(runs)
    assert list(table.columns) == ["run", "ranks", "max allocated, GiB", "max reserved, GiB"]
    assert list(table["run"]) == [r.name for r in runs] and list(table["ranks"]) == [r.ranks for r in runs]
    for cell, r in zip(table["max reserved, GiB"], runs, strict=True):
        measured, replayed, estimate = cell.split(" / ")
        assert measured == replayed == f"{r.max_reserved / GIB:.2f}"
        assert (
            estimate == f"{r.predicted['max_reserved'] / GIB:.2f} ({100 * r.errors()['max_reserved']:+.1f} %)"
        )
    assert max(len(str(cell)) for cell in table.to_numpy().ravel()) <= 32  # narrow enough to read
