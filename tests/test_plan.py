"""Planning: every setup with its time and cost, the Pareto front, make-it-fit, the smallest cluster per ZeRO
variant, the largest micro batch, a global batch's choices."""

import json
import re

import pandas as pd
import pytest

from kit import models
from kit.estimate import estimate
from kit.fit import estimate_fit
from kit.gpus import gpu, prices
from kit.planning import boundary, fixes, plan
from kit.schema import Setup
from kit.steptime import perf
from kit.units import GIB


@pytest.fixture(scope="module")
def llama7b():
    return Setup(model=models.preset("llama-2-7b"), batch={"micro_batch": 1, "seq_len": 2048})


def test_smallest_cluster_is_the_first_that_fits(llama7b):
    table = plan.smallest_cluster(llama7b, max_nodes=4)
    assert len(table) == len(plan.DEFAULT_VARIANTS) == 7  # each stage without and with the most offload
    # 7B x 16 B = 108 GB of model states alone: plain data parallelism never fits an 80 GB GPU
    assert table.loc[0, "verdict"] == "does not fit on 32 GPUs"
    assert pd.isna(table.loc[0, "gpus"]) and pd.isna(table.loc[0, "per_gpu_gib"])
    sizes = [(1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (3, 8), (4, 8)]
    for row in table.itertuples():
        if row.verdict != "fits":
            continue
        change = plan.DEFAULT_VARIANTS[row.Index]
        i = sizes.index((row.nodes, row.gpus // row.nodes))

        def fits(nodes, gpus, change=change):
            s = llama7b.replace(cluster={"nodes": nodes, "gpus_per_node": gpus}, zero=change, batch={})
            return estimate(s)

        found = fits(*sizes[i])
        verdict = estimate_fit(found)  # its bytes: past the memory, what the flushed allocator holds there
        assert verdict.ok and found.fits["H100-SXM-80GB"] and round(verdict.need / GIB, 2) == row.per_gpu_gib
        assert all(not fits(*smaller).fits["H100-SXM-80GB"] for smaller in sizes[:i])
    # on their peak (issue 39), ZeRO-1, 2 and 3 need 2 GPUs, optimizer offload 1 (their component sums
    # asked for 4 at ZeRO-1/2: the step's fp32 gradient copy, the bucket and the activations all at once)
    assert list(table["gpus"].iloc[1:]) == [2, 1, 2, 1, 2, 1]


def test_largest_micro_batch_is_the_boundary(llama7b):
    ckpt = llama7b.replace(zero={"stage": 3, "activation_checkpointing": True})
    micro = boundary.largest_micro_batch(ckpt)
    # 8 x H100 80 GB, seq 2048: 2sbh per layer kept, one layer recomputed, and at the loss's backward the
    # fp32 logits' two gradients (their component sum, without them, said 49; the tensors alone, 46), and
    # the caching allocator's replay within the GPU's memory
    assert micro == 41
    assert estimate(ckpt.replace(batch={"micro_batch": micro})).fits["H100-SXM-80GB"]
    assert not estimate(ckpt.replace(batch={"micro_batch": micro + 1})).fits["H100-SXM-80GB"]
    too_big = Setup(
        model=models.preset("llama-2-70b"), cluster={"gpus_per_node": 1}, batch={"micro_batch": 1}
    )
    assert boundary.largest_micro_batch(too_big) == 0
    assert boundary.largest_micro_batch(ckpt, limit=10) == 10  # 46 fit: the limit is the answer


def test_longest_sequence_is_the_boundary_by_lines_as_by_scanning(monkeypatch):
    """The longest sequence a micro batch fits (a padded published run's bound): found by lines from the
    estimate at the limit, in a handful of estimates, as a scan of every length finds it."""
    setup = Setup(
        model=models.preset("qwen2.5-0.5b"),
        cluster={"gpu": "RTX-4090"},
        zero={"stage": 2, "activation_checkpointing": True},
        batch={"micro_batch": 1, "seq_len": 32768},
    )
    asked = []
    fits = boundary._fits
    monkeypatch.setattr(boundary, "_fits", lambda s: asked.append(s.batch.seq_len) or fits(s))
    longest = boundary.longest_sequence(setup, 32768, 256)
    # the limit, half of it, the line's crossing, one step on, and one more: the replayed allocator's share
    # makes the bytes less straight in the length than the tensors alone
    assert asked == [32768, 16384, 10240, 10496, 10752]
    scan = [n for n in range(256, 32768, 256) if fits(setup.replace(batch={"seq_len": n}))[0]]
    assert longest == max(scan) == 10496 and scan == list(range(256, longest + 1, 256))
    too_big = setup.replace(model=models.preset("llama-2-70b"), batch={"seq_len": 4096})
    assert boundary.longest_sequence(too_big, 4096, 256) == 0  # not even 256 tokens fit
    with pytest.raises(ValueError, match="32768 tokens fit"):
        boundary.longest_sequence(setup.replace(zero={"stage": 3, "loss": "chunked"}), 32768, 256)
    with pytest.raises(ValueError, match="step must be 1..4095 tokens"):
        boundary.longest_sequence(setup, 4096, 4096)


@pytest.mark.parametrize(
    "model, zero, gpu",
    [
        ("gpt2-xl", {"stage": 2}, "RTX-4090"),  # the optimizer step leads the peak at small micro batches
        ("gpt2", {"stage": 2}, "RTX-4090"),
        ("qwen2.5-0.5b", {"stage": 3, "activation_checkpointing": True}, "H100-SXM-80GB"),
        ("llama-2-7b", {"stage": 3, "activation_checkpointing": True, "loss": "chunked"}, "H200-SXM-141GB"),
    ],
)
def test_largest_micro_batch_is_the_boundary_by_lines_as_by_scanning(model, zero, gpu):
    """The search by lines (a few estimates) finds what estimating every micro batch would."""
    setup = Setup(model=models.preset(model), cluster={"gpu": gpu}, zero=zero, batch={"seq_len": 1024})
    micro = boundary.largest_micro_batch(setup)

    def fits(m: int) -> bool:
        return estimate(setup.replace(batch={"micro_batch": m})).fits[gpu]

    assert micro >= 3 and fits(micro) and not fits(micro + 1)  # 3, 19, 20 and 58: the line has work
    assert all(fits(m) for m in range(1, micro + 1))  # nothing below it is refused


def test_batch_options_for_a_global_batch(llama7b):
    table = plan.batch_options(llama7b, 64)
    assert [(r.micro_batch, r.grad_accum) for r in table.itertuples()] == [(8, 1), (4, 2), (2, 4), (1, 8)]
    assert set(table["train_batch"]) == {64}
    one = estimate(llama7b.replace(batch={"micro_batch": 1, "grad_accum": 8}))
    assert table.loc[3, "activations_gib"] == round(one.components["activations"] / GIB, 2)
    assert table["activations_gib"].is_monotonic_decreasing
    with pytest.raises(
        ValueError, match=r"^train_batch: must be a multiple of the data-parallel size 8, got 60"
    ):
        plan.batch_options(llama7b, 60)


@pytest.fixture
def searched():  # per test: the plan confirms rows as it names them (Plan.confirm)
    s = Setup(model=models.preset("llama-2-7b"), batch={"micro_batch": 1, "seq_len": 4096})
    return plan.search(s, train_batch=256, max_nodes=8, tokens=1e11, price={"H100-SXM-80GB": 5.0})


def test_search_rows_are_what_estimate_and_perf_say_of_their_setup(searched):
    table = searched.table
    assert len(table) > 1000 and searched.skipped == [
        "V100-SXM2-16GB: no bf16 support", "V100-SXM2-32GB: no bf16 support", "RTX-3090: no price; pass one",
        "TITAN-RTX: no bf16 support",
    ]  # fmt: skip
    assert ((table.micro_batch * table.gpus * table.grad_accum) == 256).all()  # the global batch is kept
    one_gpu = table[table.gpus == 1]
    assert ((one_gpu.stage == 0) | one_gpu.offload_optimizer.isin(["cpu", "nvme"])).all()
    for i in table.index[::53]:
        s = searched.setup(i)
        row = table.loc[i]
        est = estimate(s)
        t = perf.step_time(s)
        assert row.per_gpu_gib == est.screen_bytes / GIB and row.step_s == pytest.approx(t.step_s, rel=1e-12)
        assert row.fits == (est.screen_bytes <= gpu(s.cluster.gpu).memory_bytes * 0.9)  # the screen
        usd = 5.0 if s.cluster.gpu == "H100-SXM-80GB" else prices()[s.cluster.gpu][0]
        assert row.cost_usd == pytest.approx(t.run(1e11, usd)["cost_usd"], rel=1e-12)
    # a row the plan names is confirmed: the estimate's own verdict, the allocator replayed
    sample = [i for i in table.index[::53] if table.fits[i]][:5]
    assert searched.confirm(sample) and not searched.confirm(sample)  # once each
    for i in sample:
        verdict = estimate_fit(estimate(searched.setup(i)), headroom=0.1)
        row = table.loc[i]
        assert row.confirmed and row.fits == verdict.ok and row.flushes == verdict.flushes
        assert row.per_gpu_gib == verdict.need / GIB >= estimate(searched.setup(i)).screen_bytes / GIB


def test_search_tries_the_grids_variants(searched):
    """Several nodes: every ZeRO stage x offload to CPU (optimizer; optimizer and parameters at stage 3),
    stage 3 offloading to NVMe, hpZ and hpZ + qwZ + qgZ, DDP / FSDP; one node: no ZeRO++."""
    columns = ["engine", "stage", "offload_optimizer", "offload_param", "zeropp"]
    tried = {
        n: set(map(tuple, t[columns].values)) for n, t in searched.table.groupby(searched.table.nodes > 1)
    }
    ds = [("deepspeed", s, "none", "none", "") for s in range(4)]
    offloaded = [("deepspeed", s, "cpu", "none", "") for s in (1, 2, 3)] + [
        ("deepspeed", 3, "cpu", "cpu", "")
    ]
    nvme = [("deepspeed", 3, "nvme", p, "") for p in ("none", "nvme")]
    baselines = [
        ("ddp", 0, "none", "none", ""),
        ("fsdp", 3, "none", "none", ""),
        ("fsdp", 2, "none", "none", ""),
    ]
    zeropp = [("deepspeed", 3, "none", "none", z) for z in ("hpz8", "hpz8 qwz qgz")]
    assert tried[False] == {*ds, *offloaded, *nvme, *baselines}
    assert tried[True] == {*ds, *offloaded, *nvme, *baselines, *zeropp}


def test_pareto_front_and_picks_per_gpu(searched):
    front, picks = searched.pareto(), searched.best_per_gpu()  # each row confirmed (Plan.settle)
    assert set(front.confirmed) == set(picks.confirmed) == {True} and front.fits.all() and picks.fits.all()
    fit = searched.fitting()  # screened or confirmed: the rows the replay refused are gone
    assert fit.fits.all() and fit.cost_usd.is_monotonic_increasing
    assert front.hours.is_monotonic_increasing and front.cost_usd.is_monotonic_decreasing
    for _, row in front.iterrows():  # nothing that fits beats a front point on both time and cost
        assert not ((fit.hours < row.hours) & (fit.cost_usd < row.cost_usd)).any()
    for (name, pick), row in picks.set_index(["gpu", "pick"]).iterrows():
        mine = fit[fit.gpu == name]
        column = "cost_usd" if pick == "cheapest" else "hours"
        assert row[column] == mine[column].min()
    assert searched.fitting(max_hours=100).hours.max() <= 100
    options = searched.options()
    variant = [
        "gpu",
        "gpus",
        "engine",
        "stage",
        "offload_optimizer",
        "offload_param",
        "zeropp",
        "checkpointing",
    ]
    assert len(options) < len(fit) and not options.duplicated(variant).any()


def test_make_it_fit_lists_changes_that_fit(llama7b):
    big = llama7b.replace(zero={"stage": 0}, batch={"micro_batch": 8, "grad_accum": 1, "seq_len": 4096})
    capacity = gpu(big.cluster.gpu).memory_bytes * 0.9
    assert estimate(big).per_gpu_bytes > capacity
    table = fixes.make_it_fit(big)
    kept = "(global 64 kept)"
    assert set(table.change) == {
        f"micro batch 1 x grad accum 8 {kept} + ZeRO stage 1",
        f"micro batch 1 x grad accum 8 {kept} + ZeRO stage 2",
        f"micro batch 1 x grad accum 8 {kept} + ZeRO stage 3",
        f"micro batch 2 x grad accum 4 {kept} + ZeRO stage 3",
        "activation checkpointing on + ZeRO stage 1",
        "activation checkpointing on + ZeRO stage 2",
        "activation checkpointing on + ZeRO stage 3",
    }  # no single change fits a 7B at ZeRO-0 on 80 GB: the fewest pairs that do
    assert table.fits.all() and table.step_s.is_monotonic_increasing
    assert table.changes.is_monotonic_increasing  # the fewest changes first
    # within the capacity, or past it only where the allocator's flushes keep it within (Fit.flushes)
    assert all(row.per_gpu_gib * GIB <= capacity or row.flushes for row in table.itertuples())
    assert any("global 64 kept" in change for change in table.change)
    single = fixes.make_it_fit(big.replace(zero={"stage": 3}))  # one knob suffices: no pairs are tried
    assert (single.changes == 1).all() and "activation checkpointing on" in set(single.change)
    assert fixes.make_it_fit(llama7b.replace(zero={"stage": 3})).empty  # it already fits


def test_every_table_keeps_to_the_limits(searched):
    """max_hours and budget filter the Pareto front, the picks per GPU and the NVMe rows, not only the
    cheapest setups (issue 24: the front listed setups of 3,201 to 49,815 h under --max-hours 240)."""
    hours = searched.fitting().hours.median()
    budget = searched.fitting().cost_usd.median()
    assert searched.pareto().hours.max() > hours  # without a limit the front goes past it
    for limits in ({"max_hours": hours}, {"budget": budget}, {"max_hours": hours, "budget": budget}):
        tables = [searched.pareto(**limits), searched.best_per_gpu(**limits), searched.options(**limits)]
        tables.append(plan.nvme_slowdown(searched, **limits))
        for table in tables:
            assert len(table) and table.fits.all()
            assert table.hours.max() <= limits.get("max_hours", float("inf"))
            assert table.cost_usd.max() <= limits.get("budget", float("inf"))
        within = searched.fitting(**limits)
        assert set(searched.pareto(**limits).index) == set(plan.front(within).index)
    assert len(plan.nvme_slowdown(searched)) > len(plan.nvme_slowdown(searched, max_hours=hours))
    assert searched.fitting(budget=1).empty and searched.pareto(budget=1).empty


def test_the_booking_is_the_best_exact_setup_with_flagged_alternatives(searched):
    from kit.planning import booking

    fit = searched.fitting()
    for goal, key in (("cheapest", "cost_usd"), ("fastest", "hours")):
        b = booking.recommend(searched, goal)
        exact = fit[(fit.engine == "deepspeed") & ~fit.zeropp.str.contains("qwz|qgz")]
        assert b.recommended[key] == exact[key].min() and b.fallback == ""
        alt = b.alternatives
        assert 1 <= len(alt) <= booking.ALTERNATIVES and b.recommended.name not in alt.index
        assert list(alt[key]) == sorted(alt[key]) and (alt.why != "").all()
        quantized = alt[alt.zeropp.str.contains("qwz")]
        assert len(quantized) <= 1  # the best that quantizes, flagged, and only where it does better
        for _, row in quantized.iterrows():
            assert row[key] < b.recommended[key] and "int8 weights" in row.numerics
            assert "changes numerics (!)" in row.why
        assert not alt[alt.numerics == ""].zeropp.str.contains("q").any()  # unflagged: nothing quantized
    with pytest.raises(ValueError, match=r"^goal: choose one of cheapest, fastest, got 'best'"):
        booking.recommend(searched, "best")
    empty = booking.recommend(searched, budget=1)
    assert empty.recommended is None and empty.alternatives.empty and empty.fitting == 0


def test_why_an_alternative_differs(searched):
    from kit.planning import booking

    t = searched.table
    base = t[(t.gpu == "H100-SXM-80GB") & (t.gpus == 8) & (t.stage == 2) & (t.zeropp == "")].iloc[0]
    other = t[(t.gpu == "A100-SXM-80GB") & (t.gpus == 16) & (t.stage == 3) & (t.zeropp == "hpz8 qwz qgz")]
    other = other[other.checkpointing == base.checkpointing].iloc[0]
    text = booking.why(other, base)
    assert text.startswith("A100-SXM-80GB, 2x the GPUs, ZeRO-3 + hpZ8 + qwZ + qgZ, ")
    assert text.endswith("changes numerics (!)") and re.search(r"\d+ % (faster|slower)|x the time", text)
    assert booking.why(base, base) == ""
    assert booking.variant(t[t.engine == "fsdp"].iloc[0]) in ("FSDP", "FSDP grad-op")
    assert booking.numerics(other, "bf16") == "qwZ all-gathers int8 weights; qgZ reduces int4 gradients"
    mi300 = other.copy()
    mi300["gpu"] = "MI300X"
    assert "for CUDA only, not on MI300X" in booking.numerics(mi300, "bf16")
    assert (
        booking.numerics(base, "fp16") == booking.FP16 + "; the H100-SXM-80GB has bf16: plan --precision bf16"
    )
    v100 = base.copy()
    v100["gpu"] = "V100-SXM2-32GB"
    assert booking.numerics(v100, "fp16") == booking.FP16 and booking.numerics(base, "bf16") == ""
    assert booking._compare(1.999, "faster", "slower", "the time") == "2.0x the time"
    assert booking._compare(0.6, "faster", "slower", "the time") == "40 % faster"


def test_readable_units_and_records_without_missing_markers(llama7b):
    row = {"per_gpu_gib": 3171.97, "comm_inter_gib": 6.649728, "hours": 49814.9, "cost_usd": 243595.4}
    shown = plan.readable(pd.DataFrame([row])).iloc[0]
    assert list(shown) == ["3,172.0 GiB", "6.6 GiB", "49,814.9 h", "$243,595"]
    clusters = plan.smallest_cluster(llama7b, max_nodes=1)
    records = plan.records(clusters)
    assert records[0]["gpus"] is None and records[0]["per_gpu_gib"] is None  # JSON null, not "<NA>"
    assert all(isinstance(r["gpus"], int) for r in records if r["verdict"] == "fits")


def test_the_cli_and_the_plan_panel_book_from_one_report(monkeypatch, capsys):
    """Issue 40: `zerokit plan` and the plan panel both call ``kit.planning.report.report`` and only show
    it: the same inputs give the same booking, alternatives and make-it-fit rows in both."""
    from kit.cli import main
    from kit.lab.plan_panel import plan_panel
    from kit.planning import report as reports

    made = []
    real = reports.report

    def spy(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(reports, "report", spy)
    argv = ["plan", "--model", "llama-2-7b", "--stage", "0", "--micro-batch", "8", "--seq-len", "4096"]
    argv += ["--train-batch", "256", "--gpus", "H100-SXM-80GB", "--max-nodes", "4", "--tokens", "2e12"]
    assert main([*argv, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    start = Setup(
        model=models.preset("llama-2-7b"), zero={"stage": 0}, batch={"micro_batch": 8, "seq_len": 4096}
    )
    panel = plan_panel(start, train_batch=256, max_nodes=4, tokens=2e12, max_hours=0)  # as the CLI: no limit
    panel.gpus.value = ("H100-SXM-80GB",)
    assert len(made) == 3  # the CLI's, the panel's first (every GPU type), the panel's for the H100 alone
    cli, drawn = made[0], panel.report
    assert drawn.plan is made[2].plan and drawn.booking.recommended.label == printed["recommended"]["label"]
    assert cli.booking.alternatives.label.tolist() == drawn.booking.alternatives.label.tolist()
    assert [r["label"] for r in printed["alternatives"]] == drawn.booking.alternatives.label.tolist()
    assert cli.fixes is not None and cli.fixes.change.tolist() == drawn.fixes.change.tolist() != []
    assert [kind for kind, _, _ in drawn.tables()] == ["alternatives", "picks", "fixes"]


# ----- sequence parallelism (kit.sequence_parallel) ---------------------------------------------------


def _long(sp: int, seq_len: int = 262_144) -> Setup:
    """Llama-3-8B at a long sequence (its position limit lifted), checkpointed, chunked loss, ZeRO-3."""
    model = models.override(models.preset("llama-3-8b"), {"max_position_embeddings": seq_len})
    return Setup(
        model=model,
        cluster={"nodes": 1, "gpus_per_node": 8, "gpu": "H100-SXM-80GB"},
        zero={"stage": 3, "activation_checkpointing": True, "loss": "chunked", "sequence_parallel_size": sp},
        batch={"micro_batch": 1, "seq_len": seq_len, "train_batch": 16},
    )


def test_a_plan_under_sequence_parallelism_keeps_to_what_ulysses_runs():
    """Cluster sizes sp divides, the batch decomposed over world / sp groups, no variant Ulysses refuses
    (NVMe offload, ZeRO++: the plan tries both on 2 nodes); each row is its Setup's estimate."""
    found = plan.search(_long(4), gpus=["H100-SXM-80GB"], max_nodes=2, tokens=1e8)
    assert not found.table.empty
    assert (found.table.gpus % 4 == 0).all()
    assert set(found.table.offload_optimizer) == {"none", "cpu"} and set(found.table.stage) == {0, 1, 2, 3}
    assert not found.table.label.str.contains("hpz|qwz|qgz|nvme").any()
    for i in (0, len(found.table) // 2, len(found.table) - 1):
        s = found.setup(found.table.index[i])
        assert s.zero.sequence_parallel_size == 4
        b = s.batch
        assert b.train_batch == b.micro_batch * s.cluster.world_size // 4 * b.grad_accum == 16
        row = found.table.iloc[i]
        assert row.per_gpu_gib == pytest.approx(estimate(s).per_gpu_bytes / GIB, rel=1e-6)


def test_make_it_fit_splits_a_sequence_that_does_not_fit_one_gpu():
    """262,144 tokens of Llama-3-8B do not fit an H100 even checkpointed with the chunked loss; split over 2
    GPUs neither, over 4 they do: the one change that fits on this node."""
    setup = _long(1)
    assert not any(estimate(_long(sp)).fits["H100-SXM-80GB"] for sp in (1, 2))
    found = fixes.make_it_fit(setup, max_nodes=1)
    assert list(found.change) == ["sequence parallelism over 4 GPUs (global 16 kept)"]
    assert found.fits.all() and found.per_gpu_gib[0] == pytest.approx(estimate(_long(4)).per_gpu_bytes / GIB)


def test_the_smallest_cluster_under_sequence_parallelism_is_a_size_it_divides():
    table = plan.smallest_cluster(_long(8, seq_len=32_768), max_nodes=2)
    assert len(table) == len(plan.DEFAULT_VARIANTS) and table.variant.str.endswith("sp8").all()
    assert (table.dropna().gpus % 8 == 0).all() and table.gpus.notna().any()
    assert table.variant.str.contains("nvme").sum() == 0
    nvme = plan.smallest_cluster(_long(8, seq_len=32_768), [{"stage": 3, "offload_optimizer": "nvme",
                                 "nvme_path": "/nvme"}], max_nodes=2)  # fmt: skip
    assert nvme.empty  # NVMe offload beside Ulysses: refused on every cluster, so no row


def test_a_row_the_replay_refuses_leaves_the_answer(searched):
    """The grid screens rows on what they cannot need less than; a row it passes that the allocator's replay
    refuses is dropped from what the plan names, and the next one is confirmed in its place. Here a row
    whose screen is past its GPU is made to pass it and to be the cheapest."""
    table = searched.table
    bf16 = table.gpu.map(lambda name: gpu(name).peak_tflops("bf16") > 0)
    over = table[~table.fits & bf16].index[0]
    table.loc[over, ["fits", "cost_usd"]] = [True, 0.0]
    assert searched.fitting().index[0] == over
    picked = searched.settle(lambda: searched.fitting().head(3))
    assert over not in picked.index and len(picked) == 3 and picked.confirmed.all() and picked.fits.all()
    assert table.at[over, "confirmed"] and not table.at[over, "fits"]
    assert table.at[over, "per_gpu_gib"] * GIB > table.at[over, "capacity_gib"] * GIB * 0.9
    assert over not in searched.pareto().index and over not in searched.fitting().index
    assert searched.refused == 1
    assert searched.to_dict(limit=3)["refused"] == searched.refused >= 1  # with the rows JSON names too
