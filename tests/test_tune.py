"""``kit.run.tune`` and ``zerokit tune``: candidates, pruning by the estimate, ranking by measured throughput.

One real tune on the toy model (2 CPU ranks; its launch replays the session's shared sweep of the same
configurations, tests/conftest.py) checks pruning, records, the ranking and the ds_config written; the
rest runs without launching (``run_sweep`` replaced by fake records).
"""

from __future__ import annotations

import json

import pytest

from kit.cli import main
from kit.ds_config import to_ds_config, validate_ds_config
from kit.estimate import estimate
from kit.records import load_records
from kit.run import tune as tuning
from kit.run.results import Results
from kit.run.sweep import config_id
from kit.toys import toy_setup

NPROCS = 2


def by_label(found):
    return {c.label: c for c in found}


def test_candidates_cover_stage_offload_micro_batch_and_skip_what_no_stage_can_run():
    found = tuning.candidates(
        toy_setup(), stages=(0, 1, 3), micro_batches=(1, 2), nprocs=NPROCS, accelerator="cuda"
    )
    zero = [(c.setup.zero.stage, c.setup.zero.offload_optimizer, c.setup.zero.offload_param) for c in found]
    # stage 0 cannot offload; "cpu" is the optimizer at stages 1-2, optimizer and parameters at stage 3
    assert sorted(set(zero)) == [(0, "none", "none"), (1, "cpu", "none"), (1, "none", "none")] + [
        (3, "cpu", "cpu"),
        (3, "none", "none"),
    ]
    assert len(found) == 5 * 2
    assert {c.setup.cluster.world_size for c in found} == {NPROCS}
    # the bytes the pruning compares are each candidate's predicted peak per GPU, the verdict's number
    assert [c.estimated_bytes for c in found] == [estimate(c.setup).per_gpu_bytes for c in found]


def test_candidates_keep_the_train_batch_like_deepspeeds_autotuner_or_the_grad_accum():
    base = toy_setup().replace(batch={"grad_accum": 2})
    fixed = tuning.candidates(base, stages=(2,), offloads=("none",), micro_batches=(1, 2, 4), nprocs=NPROCS)
    assert [(c.setup.batch.micro_batch, c.setup.batch.grad_accum) for c in fixed] == [(1, 8), (2, 4), (4, 2)]
    assert {c.setup.batch.train_batch for c in fixed} == {4 * 2 * NPROCS}
    grown = tuning.candidates(
        base, stages=(2,), offloads=("none",), micro_batches=(1, 3), nprocs=NPROCS, keep="grad_accum"
    )
    assert [(c.setup.batch.micro_batch, c.setup.batch.grad_accum) for c in grown] == [(1, 2), (3, 2)]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"stages": (0, 4)}, "stages: choose from 0, 1, 2, 3"),
        ({"stages": ()}, "stages: choose from 0, 1, 2, 3 (at least one)"),
        ({"offloads": ("nvme",)}, "offloads: choose from none, cpu"),
        ({"micro_batches": (0, 2)}, "micro_batches: whole numbers >= 1"),
        ({"micro_batches": (3, 4)}, "micro_batches: with keep='train_batch' each must divide"),
        ({"keep": "tokens"}, "keep: choose one of train_batch, grad_accum"),
        ({"nprocs": 0}, "nprocs: must be a whole number >= 1"),
    ],
)
def test_invalid_search_spaces_are_one_line_naming_the_argument(change, message):
    with pytest.raises(ValueError, match=f"^{message}".replace("(", r"\(").replace(")", r"\)")):
        tuning.candidates(toy_setup(), **change)


@pytest.fixture
def no_launch(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("run_sweep must not be called")

    monkeypatch.setattr(tuning, "run_sweep", refuse)


@pytest.mark.parametrize(("accelerator", "per"), [("cuda", "GPU"), ("cpu", "rank")])
def test_nothing_fits_the_budget_fails_before_launching(no_launch, tmp_path, monkeypatch, accelerator, per):
    monkeypatch.setenv("DS_ACCELERATOR", accelerator)  # where the ranks would run
    with pytest.raises(ValueError, match=rf"^budget: no candidate fits 0\.001 GiB per {per}; the smallest"):
        tuning.tune(toy_setup(), budget_bytes=2**20, runs_dir=tmp_path)
    with pytest.raises(ValueError, match=r"^stages: no valid candidate"):
        tuning.tune(toy_setup(), stages=(0,), offloads=("cpu",), runs_dir=tmp_path)


@pytest.mark.parametrize(
    ("flags", "names"),
    [
        (["--stages", "0,5"], "tune: stages: choose from 0, 1, 2, 3"),
        (["--stages", "two"], "tune: stages: comma-separated integers 0-3"),
        (["--offload", "none,gpu"], "tune: offload: choose from none, cpu"),
        (["--micro-batches", "1,x"], "tune: micro-batches: comma-separated integers >= 1"),
        (["--micro-batches", "0"], "tune: micro-batches: whole numbers >= 1"),
        (["--micro-batches", "3,4"], "tune: micro-batches: with keep='train_batch' each must divide"),
        (["--budget-gib", "0"], "tune: budget-gib: must be a number of GiB > 0"),
        (["--budget-gib", "0.001"], "tune: budget-gib: no candidate fits"),  # 1 MiB: not even a CPU rank
        (["--steps", "0"], "tune: steps: must be a whole number >= 1"),
        (["--nprocs", "0"], "tune: nprocs: must be a whole number >= 1"),
        (["--gpu", "H900"], "tune: cluster.gpu: unknown GPU"),
    ],
)
def test_bad_flags_exit_2_with_one_line_before_anything_launches(no_launch, flags, names, capsys, tmp_path):
    assert main(["tune", "--runs-dir", str(tmp_path), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"zerokit {names}") and err.count("\n") == 1, err


def test_candidates_on_cpu_ranks_are_estimated_as_cpu_ranks_hold_them(monkeypatch):
    """Issue 43: on CPU ranks a candidate's bytes are the estimate as it applies there
    (``Estimate.on_accelerator("cpu")``: no CUDA context, NCCL buffers or allocator slack), not the GPU's;
    by default where the ranks will run (``kit.run.launcher.ranks_accelerator``: ``DS_ACCELERATOR``)."""
    space = {"stages": (0, 3), "offloads": ("none",), "micro_batches": (1, 2), "nprocs": NPROCS}
    on_cpu = tuning.candidates(toy_setup(), accelerator="cpu", **space)
    on_gpu = tuning.candidates(toy_setup(), accelerator="cuda", **space)
    cpu_bytes = [estimate(c.setup).on_accelerator("cpu").per_gpu_bytes for c in on_cpu]
    assert [c.estimated_bytes for c in on_cpu] == cpu_bytes
    assert [c.estimated_bytes for c in on_gpu] == [estimate(c.setup).per_gpu_bytes for c in on_gpu]
    # a GPU's overheads are hundreds of MiB: a toy's CPU rank holds a few MiB of tensors
    assert all(
        g.estimated_bytes - c.estimated_bytes > 500 * 2**20 for c, g in zip(on_cpu, on_gpu, strict=True)
    )
    for accelerator, expected in (("cpu", on_cpu), ("cuda", on_gpu)):
        monkeypatch.setenv("DS_ACCELERATOR", accelerator)
        assert tuning.candidates(toy_setup(), **space) == expected
    with pytest.raises(ValueError, match=r"^accelerator: choose one of cuda, cpu, got 'tpu'"):
        tuning.candidates(toy_setup(), accelerator="tpu", **space)


def test_a_tune_on_cpu_ranks_prunes_by_the_cpu_rank_estimate(monkeypatch, tmp_path, capsys):
    """Issue 43: a budget of a few MiB on CPU ranks keeps what the CPU-rank estimate says fits and prunes
    the rest; the GPU estimate (CUDA context and NCCL buffers, some 770 MiB) would have pruned them all."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    space = {"stages": (0, 3), "offloads": ("none", "cpu"), "micro_batches": (1, 2, 4)}
    found = tuning.candidates(toy_setup(), **space)
    budget = sorted(c.estimated_bytes for c in found)[len(found) // 2]  # about half of them fit
    assert budget < min(estimate(c.setup).per_gpu_bytes for c in found)  # nothing fits the GPU estimate
    ran = []

    def fake_sweep(setups, **_):
        ran.extend(s.label for s in setups)
        return fake_results(tmp_path / "r.jsonl", [(s, 10.0) for s in setups])

    monkeypatch.setattr(tuning, "run_sweep", fake_sweep)
    tuned = tuning.tune(toy_setup(), budget_bytes=budget, runs_dir=tmp_path, **space)
    assert ran == [c.label for c in found if c.estimated_bytes <= budget] and 0 < len(ran) < len(found)
    assert [(label, b) for label, b, _ in tuned.pruned] == [
        (c.label, c.estimated_bytes) for c in found if c.estimated_bytes > budget
    ]
    for _, nbytes, reason in tuned.pruned:
        cpu = estimate(next(c.setup for c in found if c.estimated_bytes == nbytes)).on_accelerator("cpu")
        assert nbytes == cpu.per_gpu_bytes and "> budget" in reason
    assert tuned.accelerator == "cpu" and tuned.device == "rank"
    assert "budget_bytes" in tuned.to_dict() and "accelerator" not in tuned.to_dict()  # the JSON as it was
    from kit.cli.tune import render

    text = render(tuned, None)
    assert f"budget per rank: {budget / 2**30:.3f} GiB (CPU ranks:" in text and "per GPU" not in text


def fake_results(path, rows) -> Results:
    """Records as the ranks write them: three measured steps of rank 0 per (setup, samples/s or status)."""
    records = []
    for setup, value in rows:
        base = {"sweep": "t", "run_id": "r1", "config_id": config_id(setup), "label": setup.label}
        base.update(setup=setup.model_dump(mode="json"), rank=0, time=1e9, error=None)
        if isinstance(value, str):
            records.append({**base, "step": None, "status": value, "error": "boom"})
            continue
        for step, factor in enumerate((0.5, 1.0, 1.5)):  # median = value
            speed = value * factor
            records.append({**base, "step": step, "status": "ok", "samples_per_s": speed})
            records[-1].update(step_time_s=1 / speed, loss=1.0)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return Results.load(path)


def test_the_ranking_is_by_median_throughput_and_failures_are_unranked(monkeypatch, tmp_path, capsys):
    found = tuning.candidates(toy_setup(), stages=(1, 2), offloads=("none",), micro_batches=(1, 2))
    speeds = dict(zip([c.label for c in found], [10.0, 40.0, "error", 20.0], strict=True))
    monkeypatch.setattr(
        tuning, "run_sweep",
        lambda setups, **_: fake_results(tmp_path / "r.jsonl", [(s, speeds[s.label]) for s in setups]),
    )  # fmt: skip
    tuned = tuning.tune(
        toy_setup(), stages=(1, 2), offloads=("none",), micro_batches=(1, 2), runs_dir=tmp_path
    )
    table = tuned.table
    assert list(table["label"]) == [found[i].label for i in (1, 3, 0, 2)]
    assert list(table["rank"].astype(object).where(table["rank"].notna(), None)) == [1, 2, 3, None]
    assert list(table["status"]) == ["ok", "ok", "ok", "error"]
    assert tuned.best == found[1].setup and tuned.pruned == []
    assert json.loads(json.dumps(tuned.to_dict()))["best"]["samples_per_s"] == 40.0
    out = tmp_path / "best.json"
    argv = [
        "tune",
        "--stages",
        "1,2",
        "--offload",
        "none",
        "--micro-batches",
        "1,2",
        "--runs-dir",
        str(tmp_path),
    ]
    assert main([*argv, "--json", "--out", str(out)]) == 0
    shown = json.loads(capsys.readouterr().out)  # one JSON object on stdout
    assert shown["best"]["label"] == found[1].label and shown["ds_config"] == str(out)
    assert [c["rank"] for c in shown["candidates"]] == [1, 2, 3, None]
    assert json.loads(out.read_text())["train_micro_batch_size_per_gpu"] == found[1].setup.batch.micro_batch
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert f"best: {found[1].label}" in text and "error" in text


def test_a_calibration_predicts_every_candidate_and_the_run_ones_carry_their_error(monkeypatch, tmp_path):
    """With a calibration every candidate gets its predicted step time (pruned ones too, ranked among
    themselves by predicted samples/s), and each measured one its error: predicted / measured - 1."""
    from kit.steptime import calibrated
    from tests.test_perf import calibration

    cal = calibration()
    space = {"stages": (1, 2, 3), "offloads": ("none",), "micro_batches": (1, 2)}
    found = tuning.candidates(toy_setup(), **space)
    budget = sorted(c.estimated_bytes for c in found)[2]
    kept = [c for c in found if c.estimated_bytes <= budget]
    assert 0 < len(kept) < len(found)
    speeds = {c.label: 10.0 * (i + 1) for i, c in enumerate(kept)}  # median step 1 / speed s
    monkeypatch.setattr(
        tuning, "run_sweep",
        lambda setups, **_: fake_results(tmp_path / "r.jsonl", [(s, speeds[s.label]) for s in setups]),
    )  # fmt: skip
    tuned = tuning.tune(toy_setup(), budget_bytes=budget, runs_dir=tmp_path, calibration=cal, **space)
    table = tuned.table.set_index("label")
    for c in found:
        assert table.loc[c.label, "predicted_s"] == calibrated.step_time(c.setup, calibration=cal).step_s
    for label, speed in speeds.items():
        row = table.loc[label]
        assert row.status == "ok" and row.measured_s == pytest.approx(1 / speed)
        assert row.error == pytest.approx(row.predicted_s * speed - 1)
    pruned = tuned.table[tuned.table.status == "pruned"]
    assert len(pruned) == len(found) - len(kept) and pruned.error.isna().all()
    faster = list(pruned.train_batch / pruned.predicted_s)
    assert faster == sorted(faster, reverse=True)
    assert tuned.calibration.startswith("calibrated on cpu")


SPACE = {"stages": (0, 3), "offloads": ("none", "cpu"), "micro_batches": (1, 2, 4)}


def real_tune_budget() -> tuple[dict, int]:
    found = by_label(tuning.candidates(toy_setup(NPROCS), nprocs=NPROCS, **SPACE))
    return found, found["z0 bf16 mb2 gas2"].estimated_bytes  # keeps the smaller ones, prunes the rest


def TWO_RANK_SETUPS(_root) -> list:  # noqa: N802 (what tests/conftest.py reads)
    """The candidates the real tune keeps: run in the session's shared 2-rank sweep (tests/conftest.py),
    replayed into the tune's own sweep."""
    found, budget = real_tune_budget()
    return [c.setup for c in found.values() if c.estimated_bytes <= budget]


@pytest.mark.distributed
def test_a_real_tune_prunes_by_the_estimate_and_picks_the_fastest_measured(tmp_path, replay_launches):
    setup = toy_setup(NPROCS)
    space = SPACE
    found, budget = real_tune_budget()
    tuned = tuning.tune(
        setup, **space, budget_bytes=budget, steps=2, warmup=1, sweep="t", runs_dir=tmp_path, nprocs=NPROCS,
        progress=False, timeout_s=60.0,
    )  # fmt: skip
    records = load_records(tuned.records)
    recorded = {r["label"] for r in records}
    assert tuned.pruned and len(tuned.pruned) < len(found)
    for label, nbytes, reason in tuned.pruned:
        assert nbytes == found[label].estimated_bytes > budget and "> budget" in reason
        assert label not in recorded  # what cannot fit is never run
    kept = [c for label, c in found.items() if c.estimated_bytes <= budget]
    for c in kept:  # every kept candidate ran: both ranks recorded each measured step
        mine = [r for r in records if r["config_id"] == config_id(c.setup) and r["status"] == "ok"]
        assert sorted((r["rank"], r["step"]) for r in mine) == [(k, s) for k in range(NPROCS) for s in (1, 2)]
    summary = tuned.results.summary()
    fastest = summary.loc[summary["samples_per_s"].idxmax(), "label"]
    assert tuned.best.label == fastest == tuned.table.loc[tuned.table["rank"] == 1, "label"].iloc[0]
    ran = tuned.table[tuned.table["status"] != "pruned"]
    assert len(ran) == len(kept) and set(ran["status"]) == {"ok"}
    assert ran["samples_per_s"].max() == tuned.table.loc[0, "samples_per_s"]
    written = json.loads(tuned.write_ds_config(tmp_path / "ds_config.json").read_text())
    assert written == to_ds_config(tuned.best)
    validate_ds_config(written, tuned.best.dp)
    # resumable: the same sweep again measures nothing new and picks the same configuration
    again = tuning.tune(
        setup, **space, budget_bytes=budget, steps=2, warmup=1, sweep="t", runs_dir=tmp_path, nprocs=NPROCS,
        progress=False,
    )  # fmt: skip
    assert again.best == tuned.best and len(load_records(again.records)) == len(records)
    assert len(replay_launches) == 1  # the second tune launched nothing


def test_a_gpu_budget_keeps_what_fits_by_flushing_the_allocators_cache():
    """On GPUs a candidate is weighed as the fit rule weighs it (``kit.fit.within``): Llama-2-7B at stage 3
    reserves 46.34 GiB with room to spare, and with a 44 GiB budget it is kept, as the same allocations
    replayed within 44 GiB (less the CUDA context and NCCL) never run out; at 40 GiB they do: not kept."""
    from kit import Setup
    from kit.models import preset
    from kit.units import GIB

    s = Setup(model=preset("llama-2-7b"), zero={"stage": 3}, batch={"micro_batch": 1, "seq_len": 4096})
    (found,) = tuning.candidates(
        s, stages=(3,), offloads=("none",), micro_batches=(1,), nprocs=8, accelerator="cuda"
    )
    e = found.estimate
    assert found.estimated_bytes == e.per_gpu_bytes > 44 * GIB > e.screen_bytes
    held = e.reserved.flushed(44 * GIB - e.peak_overhead.bytes)
    assert held is not None and held + e.peak_overhead.bytes <= 44 * GIB and found.fits(44 * GIB)
    assert e.reserved.flushed(40 * GIB - e.peak_overhead.bytes) is None and not found.fits(40 * GIB)
    assert found.fits(e.per_gpu_bytes) and not found.fits(e.screen_bytes - 1)
