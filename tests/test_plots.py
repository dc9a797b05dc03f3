"""kit.run.results and kit.lab.plots on a small hand-written records.jsonl (no launch): what is drawn is what
was recorded."""

from __future__ import annotations

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from kit import models
from kit.components import MEASURED as COMPONENTS
from kit.estimate import estimate
from kit.fit import estimate_fit, shown_bytes
from kit.gpus import gpu
from kit.lab import plots
from kit.records import append_record, load_records
from kit.rules import wire_bytes
from kit.run.results import Results
from kit.schema import Setup
from kit.units import GIB, MIB

MB = 1e6


def record(cid: str, label: str, step: int, rank: int = 0, run_id: str = "r1", **extra) -> dict:
    """A step record of config ``cid`` whose numbers are derived from (config, step, rank)."""
    n = int(cid[-1])
    base = {"sweep": "s", "run_id": run_id, "config_id": cid, "label": label, "setup": {}, "rank": rank}
    base.update(world_size=2, device="cpu", step=step, time=1e9 + step, status="ok", error=None)
    base.update(step_time_s=0.1 * n + 0.01 * step, loss=5.0 - 0.1 * step * n, tflops=0.001 * n)
    base.update(samples_per_s=100.0 * n + step, tokens_per_s=6400.0 * n, peak_allocated_bytes=None)
    base.update(peak_rss_bytes=10**8 * n)
    base["measured"] = {c: (i + 1) * 10**6 * n for i, c in enumerate(COMPONENTS)}
    base["estimate"] = {c: (i + 2) * 10**6 * n for i, c in enumerate(COMPONENTS)} | {"overhead": 7}
    base["comm_bytes"] = {"all_reduce": 4 * 10**6 * n} | ({"all_gather": 2 * 10**6} if n == 2 else {})
    base["comm_wire_bytes"] = wire_bytes(base["comm_bytes"], 2)
    return base | extra


@pytest.fixture
def results(tmp_path) -> Results:
    path = tmp_path / "records.jsonl"
    for cid, label in (("c1", "z0 bf16 mb2"), ("c2", "z3 bf16 mb2")):
        for step in (1, 2, 3):
            for rank in (0, 1):
                append_record(str(path), record(cid, label, step, rank))
    failure = {"sweep": "s", "run_id": "r1", "config_id": "c3", "label": "z2 bf16 mb9", "setup": {}}
    failure |= {"rank": None, "step": None, "time": 1e9, "status": "timeout", "error": "hung"}
    append_record(str(path), failure)
    with open(path, "a") as f:
        f.write('{"sweep": "s", "config_')  # a line torn by a killed process
    return Results.load(tmp_path)


def test_summary_one_row_per_config_with_medians_and_components(results):
    table = results.summary().set_index("config_id")
    assert list(table.index) == ["c1", "c2", "c3"]
    assert list(table["status"]) == ["ok", "ok", "timeout"] and table.loc["c3", "error"] == "hung"
    assert table.loc["c2", "samples_per_s"] == 202.0  # median of 201, 202, 203
    assert table.loc["c2", "step_time_s"] == pytest.approx(0.22)
    assert table.loc["c2", "loss"] == pytest.approx(5.0 - 0.1 * 3 * 2)
    assert table.loc["c1", "measured_activations"] == 5 * 10**6
    assert table.loc["c2", "estimate_parameters"] == 4 * 10**6


def test_torn_line_is_skipped_and_missing_records_are_a_file_error(results, tmp_path):
    assert len(load_records(results.path)) == 13
    with pytest.raises(FileNotFoundError):
        Results.load(tmp_path / "nothing")


def test_a_retried_config_counts_only_its_latest_launch(tmp_path):
    path = tmp_path / "records.jsonl"
    append_record(str(path), record("c1", "z0", 1) | {"status": "error", "error": "boom"})
    append_record(str(path), record("c1", "z0", 1, run_id="r2"))
    table = Results.load(path).summary()
    assert list(table["status"]) == ["ok"] and table["error"].isna().all()


def test_worst_status_wins_and_the_runners_reason_comes_first(tmp_path):
    path = tmp_path / "records.jsonl"
    append_record(str(path), record("c1", "z0", 1, rank=1) | {"status": "error", "error": "peer reset"})
    append_record(str(path), record("c1", "z0", 1, rank=None) | {"status": "error", "error": "rank 0 died"})
    append_record(str(path), record("c1", "z0", 1, rank=0))
    row = Results.load(path).summary().iloc[0]
    assert (row["status"], row["error"]) == ("error", "rank 0 died")


def test_configs_carry_the_cli_fields(results):
    configs = results.configs()
    assert [c["status"] for c in configs] == ["ok", "ok", "timeout"]
    assert configs[1]["samples_per_s"] == 202.0
    assert configs[1]["measured"] == record("c2", "", 3)["measured"]
    assert configs[1]["estimate"] == record("c2", "", 3)["estimate"]
    assert configs[2]["measured"] is None and configs[2]["samples_per_s"] is None


def test_throughput_bars_are_the_median_samples_per_s(results):
    fig = plots.throughput(results)
    assert isinstance(fig, Figure)
    assert [p.get_height() for p in fig.axes[0].patches] == [102.0, 202.0]


def test_memory_stacks_components_estimate_beside_measured(results):
    ax = plots.memory(results).axes[0]
    bars = ax.patches
    assert len(bars) == 2 * len(COMPONENTS) * 2  # (estimate, measured) x components x ok configs
    tops = {}
    for bar in bars:
        key = (round(bar.get_x() + bar.get_width() / 2, 2), bool(bar.get_hatch()))
        tops[key] = max(tops.get(key, 0.0), bar.get_y() + bar.get_height())
    total = sum(range(1, len(COMPONENTS) + 1)) * MB / MIB  # the records' 10**6 B steps, drawn in MiB
    assert tops[(0.19, False)] == pytest.approx(total * 1)  # config 1 measured, MiB
    assert tops[(-0.19, True)] == pytest.approx((total + len(COMPONENTS) * MB / MIB) * 1)  # its estimate
    assert tops[(1.19, False)] == pytest.approx(total * 2)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [c.replace("_", " ") for c in COMPONENTS]
    assert ax.get_ylabel() == "MiB per CPU rank (rank 0)"  # the records' device: CPU ranks, no GPU


@pytest.mark.parametrize(
    ("devices", "word"),
    [(["cuda"], "GPU"), (["cpu"], "CPU rank"), (["cuda", "cpu"], "rank"), ([None], "rank")],
)
def test_memory_says_per_gpu_only_where_the_ranks_ran_on_gpus(devices, word):
    """Issue 43: memory is MiB per GPU on GPUs, per CPU rank on CPU ranks (the records' ``device``), and
    neutral where they mix or no record says; bytes sent stay MB (1e6), as traffic is counted."""
    rows = [
        record(f"c{i + 1}", f"z{i} bf16 mb2", step, device=device)
        for i, device in enumerate(devices)
        for step in (1, 2)
    ]
    results = Results(rows)
    assert results.rank_word() == word
    assert plots.memory(results).axes[0].get_ylabel() == f"MiB per {word} (rank 0)"
    assert plots.comm_volume(results).axes[0].get_ylabel() == "MB sent per rank per step"


def test_comm_volume_is_wire_bytes_by_collective(results):
    ax = plots.comm_volume(results).axes[0]
    heights = [p.get_height() for p in ax.patches]
    # all_gather (N-1 = 1x the logged shard) then all_reduce (2(N-1)/N = 1x) for configs 1 and 2
    assert heights == pytest.approx([0.0, 2.0, 4.0, 8.0])
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["all-gather", "all-reduce"]


def test_loss_curves_one_line_per_config(results):
    lines = plots.loss_curves(results).axes[0].get_lines()
    assert [line.get_label() for line in lines] == ["z0 bf16 mb2", "z3 bf16 mb2"]
    assert list(lines[1].get_xdata()) == [1, 2, 3]
    assert list(lines[1].get_ydata()) == pytest.approx([4.8, 4.6, 4.4])


def test_plots_number_steps_as_the_tables_do(tmp_path):
    """A sweep's records keep the loop's step (from 0, the warm-up first); the loss and batch plots number
    the measured steps from 1, as ``kit.lab.notebook.measured_steps`` (the notebooks' tables) does."""
    import json

    from kit.lab.notebook import measured_steps

    path = tmp_path / "records.jsonl"
    (tmp_path / "launch-r1.json").write_text(json.dumps({"run_id": "r1", "warmup": 2, "steps": 3}))
    for step in (2, 3, 4):  # the measured steps after 2 warm-up steps (0, 1)
        append_record(str(path), record("c1", "z0 bf16 mb2", step, tokens=4 * 64, train_batch=4))
    results = Results.load(path)
    table = measured_steps(results, rank=0)
    assert list(table["step"]) == [1, 2, 3]
    (line,) = plots.loss_curves(results).axes[0].get_lines()
    assert list(line.get_xdata()) == list(table["step"])
    assert list(line.get_ydata()) == pytest.approx(list(table["loss"]))
    batch_ax, _, speed_ax = plots.batch_schedule(results).axes
    assert list(batch_ax.lines[0].get_xdata()) == list(speed_ax.lines[0].get_xdata()) == [1, 2, 3]
    assert speed_ax.get_xlabel() == "measured step"


def test_estimated_memory_stacks_components():
    llama7b = Setup(model=models.preset("llama-2-7b"), batch={"micro_batch": 1, "seq_len": 2048})
    estimates = [estimate(llama7b.replace(zero={"stage": s})) for s in (0, 3)]
    fig = plots.estimated_memory(estimates)
    ax = fig.axes[0]
    tops = {}
    for bar in ax.patches:
        x = round(bar.get_x(), 3)
        tops[x] = max(tops.get(x, 0.0), bar.get_y() + bar.get_height())
    assert sorted(tops.values()) == pytest.approx(
        sorted(e.components_bytes / GIB for e in estimates), rel=1e-9
    )
    # the verdict's number, the peak per GPU, is the tick across each bar (where it fits past the GPU's
    # memory, what the flushed allocator holds there)
    ticks = ax.collections[0].get_segments()
    shown = [shown_bytes(e, estimate_fit(e)) / GIB for e in estimates]
    assert [seg[0][1] for seg in ticks] == pytest.approx(shown, rel=1e-9)
    assert ax.lines[0].get_ydata()[0] == pytest.approx(79.65)


def test_pareto_plot_draws_every_fitting_setup_and_the_front():
    from kit.planning import plan as planning
    from kit.schema import Setup

    found = planning.search(Setup(model=models.preset("llama-2-7b"), batch={}), train_batch=64, max_nodes=2)
    fig = plots.pareto(found)
    ax = fig.axes[0]
    points = sum(len(c.get_offsets()) for c in ax.collections)
    assert points == len(found.fitting())
    (front,) = ax.lines
    assert list(front.get_xdata()) == list(found.pareto().hours)
    assert ax.get_xscale() == "log" and "USD" in ax.get_ylabel()


def test_batch_schedule_plot_follows_the_records():
    rows = [
        record(
            cid,
            label,
            step,
            train_batch=batch,
            micro_batch=2,
            grad_accum=batch // 4,
            tokens=batch * 64,
            order=i,
        )
        for i, (cid, label) in enumerate((("c1", "ramp by grad accum"), ("c2", "ramp by micro batch")))
        for step, batch in ((1, 4), (2, 8), (3, 16))
    ]
    fig = plots.batch_schedule(Results(rows))
    batch_ax, memory_ax, speed_ax = fig.axes
    assert [list(line.get_ydata()) for line in batch_ax.lines] == [[4, 8, 16], [4, 8, 16]]
    states = sum((i + 1) * 10**6 for i, _ in enumerate(COMPONENTS[:3]))  # parameters, gradients, optimizer
    assert list(memory_ax.lines[0].get_ydata()) == [states / MIB] * 3  # memory in MiB, as estimates show it
    assert memory_ax.get_ylabel() == "MiB" and memory_ax.get_title().startswith("Memory per CPU rank, rank 0")
    assert [list(line.get_ydata()) for line in speed_ax.lines] == [
        [101.0, 102.0, 103.0],
        [201.0, 202.0, 203.0],
    ]
    assert "x 64" in speed_ax.get_ylabel()


def test_bars_never_touch_the_top_edge(results):
    for draw in (plots.throughput, plots.memory, plots.comm_volume):
        ax = draw(results).axes[0]
        top = max(p.get_y() + p.get_height() for p in ax.patches)
        assert ax.get_ylim()[1] >= 1.1 * top, draw.__name__


@pytest.mark.parametrize("plot", [plots.throughput, plots.memory, plots.comm_volume, plots.loss_curves])
def test_comparison_plots_keep_every_text_inside_the_figure(results, plot):
    """A title wider than its axes (the legend beside them) is cut at the figure's edge in a notebook."""
    fig = plot(results)
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    page = fig.bbox
    for ax in fig.axes:
        low, high = sorted(ax.get_xlim())
        ticks = [t for t in ax.get_xticklabels() if low <= t.get_position()[0] <= high]  # the drawn ones
        for text in [ax.title, *ax.texts, *ticks, ax.xaxis.label, ax.yaxis.label]:
            if text.get_text():
                box = text.get_window_extent(renderer)
                assert page.x0 - 1 <= box.x0 and box.x1 <= page.x1 + 1, text.get_text()


def test_loss_curves_can_be_told_apart(results):
    lines = plots.loss_curves(results).axes[0].get_lines()
    assert len({(line.get_marker(), line.get_linestyle()) for line in lines}) == len(lines)


def test_the_peak_timeline_shows_the_per_gpu_peak_and_the_gpus_memory():
    """The memory panel's chart: each phase's tensors plus the GPU-only overhead, and on the peak phase's
    the caching allocator's replayed share, so the peak phase's bar is the number the verdict beside it
    quotes (issue 39), and the GPU's memory it is compared with drawn as a line."""
    est = estimate(Setup(model=models.preset("llama-2-7b"), zero={"stage": 1}, batch={"micro_batch": 2}))
    h100 = gpu("H100-SXM-80GB").memory_bytes
    ax = plots.peak_timeline(
        est.timeline, overhead=est.peak_overhead.bytes, capacity=("H100-SXM-80GB", h100),
        allocator=est.reserved.cached,
    ).axes[0]  # fmt: skip
    tops = [float(t.get_text()) for t in ax.texts]
    cached = {p: est.reserved.cached if p == est.peak_phase else 0 for p in est.phases}
    assert tops == [round((b + est.peak_overhead.bytes + cached[p]) / GIB, 2) for p, b in est.phases.items()]
    assert max(tops) == round(est.per_gpu_bytes / GIB, 2)  # the verdict's number is the peak phase's bar
    assert f"{est.peak_phase}, {est.per_gpu_bytes / GIB:,.2f} GiB per GPU" in ax.get_title()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "H100-SXM-80GB: 79.65 GiB" in legend and "overhead" in legend and "caching allocator" in legend
    assert ax.get_lines()[0].get_ydata()[0] == pytest.approx(h100 / GIB)
    assert ax.get_ylim()[1] > h100 / GIB  # the line inside the axes


@pytest.mark.parametrize("stage", [0, 3])
def test_estimated_memory_labels_do_not_overlap_the_bars(stage):
    # stage 0 of a 7B model is over an H100's capacity: the capacity line crosses the bar
    setup = Setup(model=models.preset("llama-2-7b"), zero={"stage": stage}, batch={"micro_batch": 1})
    est = estimate(setup)
    fig = plots.estimated_memory([est])
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    ax = fig.axes[0]
    bars = [p.get_window_extent(renderer) for p in ax.patches if p.get_height() > 0]
    texts = [t for t in ax.texts if t.get_text()]
    assert [t.get_text() for t in texts] == [f"peak {est.per_gpu_bytes / GIB:,.2f} GiB"]  # above its bar
    for text in texts:
        box = text.get_window_extent(renderer)
        assert not any(box.overlaps(bar) for bar in bars)
        assert box.y1 <= ax.get_window_extent(renderer).y1  # inside the axes: room above the bar
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "H100-SXM-80GB: 79.65 GiB" in legend  # the capacity is named in the legend
    assert fig.get_size_inches()[0] >= 4.8 and min(t.get_fontsize() for t in ax.get_legend().get_texts()) >= 9


def test_brief_is_a_few_columns_in_units_and_cancelled_outranks_ok(tmp_path):
    path = tmp_path / "records.jsonl"
    for step in (1, 2):
        append_record(str(path), record("c1", "z0 bf16 mb2", step))
    append_record(str(path), record("c2", "z3 bf16 mb2", 1))
    append_record(str(path), record("c2", "z3", 1, rank=None) | {"status": "cancelled", "error": "stopped"})
    results = Results.load(path)
    brief = results.brief()
    assert list(brief.columns) == [
        "configuration", "status", "step ms", "samples/s", "loss", "model states MiB", "estimate MiB",
        "peak RSS MiB", "wire MB/step", "error",
    ]  # fmt: skip
    first = brief.iloc[0]
    assert first["step ms"] == pytest.approx(115.0)  # median of 110 ms and 120 ms
    # memory in MiB (2**20), as the estimates show it; parameters, gradients, optimizer states
    assert first["model states MiB"] == pytest.approx((1 + 2 + 3) * MB / MIB)
    assert first["estimate MiB"] == pytest.approx((2 + 3 + 4) * MB / MIB)
    assert first["wire MB/step"] == pytest.approx(4.0)  # bytes sent stay MB (1e6): 4e6 B all-reduced
    assert first["peak RSS MiB"] == pytest.approx(1e8 / 2**20)
    assert brief["status"].tolist() == ["ok", "cancelled"]
    assert brief["error"].isna().tolist() == [True, False] and brief["error"].iloc[1] == "stopped"


def test_predicted_vs_measured_draws_each_timed_configuration_on_the_y_equals_x_axes():
    import pandas as pd

    table = pd.DataFrame(
        {
            "label": ["z0 mb1", "z3 mb2", "z3 mb8 (pruned)"],
            "measured_s": [0.020, 0.050, float("nan")],
            "predicted_s": [0.022, 0.040, 0.3],
        }
    )
    fig = plots.predicted_vs_measured(table)
    FigureCanvasAgg(fig).draw()
    (ax,) = fig.axes
    (points,) = ax.collections[1:]  # the band, then the points
    assert points.get_offsets().flatten().tolist() == pytest.approx([20.0, 22.0, 50.0, 40.0])
    assert [t.get_text() for t in ax.texts] == ["z0 mb1 (+10%)", "z3 mb2 (-20%)"]
    assert ax.get_title() == "2 configurations, median |error| 15%"
    (line,) = ax.lines
    assert line.get_xdata() == pytest.approx(line.get_ydata())  # predicted = measured
    assert ax.get_xlim() == pytest.approx(ax.get_ylim()) and ax.get_xscale() == "log"
    empty = plots.predicted_vs_measured(table.iloc[2:])
    assert "no configuration has both" in empty.axes[0].texts[0].get_text()


def test_predicted_vs_measured_bars_each_point_from_its_fastest_to_its_slowest_step():
    import pandas as pd

    table = pd.DataFrame(
        {
            "label": ["z0 mb1", "z3 mb2"],
            "measured_s": [0.020, 0.050],
            "measured_min_s": [0.018, 0.030],
            "measured_max_s": [0.025, 0.060],
            "predicted_s": [0.022, 0.040],
        }
    )
    fig = plots.predicted_vs_measured(table)
    FigureCanvasAgg(fig).draw()
    (ax,) = fig.axes
    (bar,) = ax.containers
    assert bar.get_label() == "measured: fastest to slowest step"
    (bars,) = bar.lines[2]  # the horizontal bars' LineCollection
    spans = [segment[:, 0].tolist() for segment in bars.get_segments()]
    assert spans == [pytest.approx([18.0, 25.0]), pytest.approx([30.0, 60.0])]
    assert [segment[0, 1] for segment in bars.get_segments()] == pytest.approx([22.0, 40.0])
    assert ax.get_xlim()[0] <= 18.0 / 1.4 + 1e-9 and ax.get_xlim()[1] >= 60.0 * 1.4 - 1e-9


def _texts(fig: Figure) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_a_sweep_stopped_before_any_step_draws_no_empty_axes(tmp_path):
    path = tmp_path / "records.jsonl"
    stopped = record("c1", "z0 bf16 mb2", 1, rank=None) | {
        "step": None,
        "status": "cancelled",
        "error": "stopped",
    }
    append_record(str(path), stopped)
    results = Results.load(path)
    for draw in (plots.throughput, plots.memory, plots.comm_volume, plots.loss_curves):
        fig = draw(results)
        (ax,) = fig.axes
        assert any(t.startswith(plots.NOTHING_MEASURED) for t in _texts(fig)), draw.__name__
        assert list(ax.get_xticks()) == list(ax.get_yticks()) == [], draw.__name__  # no 0..1 ticks
    # steps measured, then stopped: the loss shows them, the per-configuration bars say none finished
    append_record(str(path), record("c1", "z0 bf16 mb2", 1))
    results = Results.load(path)
    assert _texts(plots.throughput(results)) == [f"{plots.NOTHING_MEASURED} (no configuration finished)"]
    assert len(plots.loss_curves(results).axes[0].get_lines()) == 1


def test_heartbeats_before_the_first_step_say_nothing_was_measured(tmp_path):
    from kit import monitor
    from kit.records import append_line

    path = monitor.heartbeat_path(tmp_path, "a", 0)
    path.parent.mkdir()
    for t in (1.0, 2.0):  # a rank in its warm-up: memory, no samples/s yet
        line = {"time": t, "node": "a", "rank": 0, "local_rank": 0, "world_size": 1, "pid": 1}
        line |= {"status": "running", "step": None, "samples_per_s": None, "rss_bytes": 2**20}
        append_line(path, line)
    memory_ax, speed_ax = plots.heartbeats(monitor.read(tmp_path, now=3.0)).axes
    assert [t.get_text() for t in speed_ax.texts] == [plots.NOTHING_MEASURED]
    assert list(speed_ax.get_yticks()) == [] and len(speed_ax.get_xticks()) > 0  # the shared x axis stays
    assert not memory_ax.texts and len(memory_ax.get_yticks()) > 0
