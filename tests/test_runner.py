"""Real 2-rank DeepSpeed sweeps on CPU: records, failures, timeout, resume, exactness checks, CLI.

The configurations below run in the session's shared 2-rank sweep (``tests/conftest.py``), in as few
launches as the faults allow (a rank that dies forces one relaunch); the resume test replays it.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kit import cli, estimate, monitor
from kit.estimate import trace
from kit.models import toy_spec
from kit.ranks import worker
from kit.records import PROBES, load_records
from kit.run.results import Results
from kit.run.sweep import config_id, on_ranks, run_sweep
from kit.schema import Setup
from kit.specs import SweepConfig, SweepSpec
from tests.conftest import NPROCS, STEPS, SWEEP, TIMEOUT_S, WARMUP

pytestmark = pytest.mark.distributed
#: fp32 sharding only changes the order of reductions over 2 ranks: losses agree to float rounding
FP32_LOSS_RTOL = 1e-5
#: bf16 rounds parameters to 8 mantissa bits (2^-8 = 0.4 %); partitioned copies round at other places
BF16_LOSS_RTOL = 1e-2
#: activations: the estimator counts every (b, s, h)-, (b, s, f)- and (b, a, s, s)-sized tensor autograd
#: saves; left out are O(s^2 + bs + bh) tensors (causal mask, LayerNorm statistics, token ids, adaLN
#: vectors): 1.0-1.4 % of the toy models' total, less at real sizes.
ACTIVATION_RTOL = 0.02
RECORD_KEYS = {
    "sweep", "config_id", "label", "setup", "rank", "world_size", "device", "step", "step_time_s",
    "samples_per_s", "tokens_per_s", "tflops", "loss", "peak_allocated_bytes", "peak_reserved_bytes",
    "peak_rss_bytes", "measured", "measured_host", "estimate", "comm_bytes", "status", "error", "torch",
    "deepspeed", "start_s", "step_cpu_s", "node", "node_rank", "local_rank",
}  # fmt: skip

BASE = Setup(model=toy_spec(), zero={"stage": 0, "precision": "fp32"}, batch={"micro_batch": 2})
Z = [
    {"stage": 0},
    {"stage": 1},
    {"stage": 2},
    {"stage": 3},
    {"stage": 1, "offload_optimizer": "cpu"},
    {"stage": 2, "offload_optimizer": "cpu"},
    {"stage": 3, "offload_optimizer": "cpu"},
    {"stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"},
    {"stage": 0, "precision": "bf16"},
    {"stage": 1, "precision": "bf16"},
    {"stage": 2, "precision": "bf16"},
    {"stage": 3, "precision": "bf16"},
    {"stage": 2, "precision": "bf16", "offload_optimizer": "cpu"},
    {"stage": 3, "precision": "bf16", "offload_optimizer": "cpu", "offload_param": "cpu"},
    {"stage": 3, "prefetch_bucket_size": 0, "max_live_parameters": 0, "param_persistence_threshold": 0},
    {"stage": 2, "activation_checkpointing": True},
    {"stage": 3, "prefetch_bucket_size": 0, "max_live_parameters": 0, "param_persistence_threshold": 0}
    | {"max_reuse_distance": 0},
]
SETUPS = [BASE.replace(zero=z) for z in Z]
SETUPS.append(BASE.replace(batch={"grad_accum": 2}))
SETUPS.append(Setup(model=toy_spec("dit"), zero={"stage": 2, "precision": "bf16"}, batch={"micro_batch": 2}))
#: test-only faults (kit/ranks/worker.py): a config that raises, one whose rank 0 dies (forcing a relaunch),
#: and one that hangs (last, so that nothing is left to relaunch after its timeout)
RAISE, DIE, HANG = (BASE.replace(batch={"micro_batch": m}) for m in (3, 5, 6))
ALL = [*SETUPS[:3], RAISE, *SETUPS[3:8], DIE, *SETUPS[8:], HANG]
FAULTS = {ALL.index(RAISE): "raise", ALL.index(DIE): "die", ALL.index(HANG): "hang"}


#: run in the shared sweep; the resume test replays ``EXTRA``
TWO_RANK_SETUPS = [*ALL, BASE.replace(batch={"micro_batch": 4})]
TWO_RANK_FAULTS = FAULTS
EXTRA = TWO_RANK_SETUPS[-1]


@pytest.fixture(scope="module")
def sweep(two_rank_sweep):
    return two_rank_sweep.results(ALL), two_rank_sweep.runs


def cid(setup: Setup) -> str:
    return config_id(on_ranks(setup, NPROCS))


def records_of(results: Results, setup: Setup) -> list[dict]:
    return [r for r in results.records if r["config_id"] == cid(setup)]


def ok_steps(records: list[dict], rank: int) -> list[dict]:
    return sorted((r for r in records if r["status"] == "ok" and r["rank"] == rank), key=lambda r: r["step"])


def test_every_config_has_a_status_and_healthy_ones_all_steps(sweep):
    results, _ = sweep
    table = results.summary().set_index("config_id")
    assert len(table) == len(ALL)
    assert [table.loc[cid(s), "status"] for s in (RAISE, DIE, HANG)] == ["error", "error", "timeout"]
    for setup in SETUPS:
        assert table.loc[cid(setup), "status"] == "ok", table.loc[cid(setup), "error"]
        for rank in range(NPROCS):
            steps = [r["step"] for r in ok_steps(records_of(results, setup), rank)]
            assert steps == list(range(WARMUP, WARMUP + STEPS))


def test_records_follow_the_schema(sweep):
    results, runs = sweep
    lines = (runs / SWEEP / "records.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line is whole JSON
    ok = [r for r in records if r["status"] == "ok"]
    assert ok and all(r.keys() >= RECORD_KEYS for r in ok)
    assert {r["world_size"] for r in ok} == {NPROCS} and {r["device"] for r in ok} == {"cpu"}
    assert all(r["peak_allocated_bytes"] is None and r["peak_rss_bytes"] > 0 for r in ok)
    assert all(r["step_cpu_s"] > 0 and r["start_s"] > 0 for r in ok if r["rank"] is not None)


def test_a_raising_config_is_recorded_and_the_launch_goes_on(sweep):
    results, _ = sweep
    failed = records_of(results, RAISE)
    assert sorted(r["rank"] for r in failed) == [0, 1]
    raised = inspect.getsourcelines(worker._inject)  # the error names the line that raised
    line = raised[1] + next(i for i, text in enumerate(raised[0]) if "raise RuntimeError" in text)
    expected = f"RuntimeError: injected fault: raise (test hook) (worker.py line {line}, in _inject)"
    assert all(r["error"] == expected for r in failed)
    # each rank's heartbeats (kit.monitor) say so: running at the start, then failed with the error
    beats = [b for b in monitor.read(sweep[1] / SWEEP).history if b["config_id"] == cid(RAISE)]
    assert sorted((b["rank"], b["status"], b.get("error")) for b in beats) == [
        (rank, status, expected if status == "failed" else None)
        for rank in (0, 1)
        for status in ("failed", "running")
    ]
    i = ALL.index(RAISE)
    before, after = records_of(results, ALL[i - 1]), records_of(results, ALL[i + 1])
    assert {r["run_id"] for r in before} == {r["run_id"] for r in after} == {failed[0]["run_id"]}


def test_a_dying_rank_fails_its_config_and_the_rest_is_relaunched(sweep):
    results, _ = sweep
    died = records_of(results, DIE)
    assert {r["status"] for r in died} == {"error"}  # rank 1 may record its broken connection too
    parent = [r for r in died if r["rank"] is None]
    assert not [r for r in died if r["rank"] == 0]  # rank 0 exited (status 3) before writing anything
    # the deepspeed launcher polls its ranks once a second, in a set's order: when rank 1 fails on the
    # broken connection within the same second, the launch exits with either rank's status
    assert len(parent) == 1 and parent[0]["error"].startswith(
        ("launch exited with status 3", "launch exited with status 1")
    )
    i = ALL.index(DIE)
    before, after = records_of(results, ALL[i - 1]), records_of(results, ALL[i + 1])
    assert before[0]["run_id"] == died[0]["run_id"] != after[0]["run_id"]
    assert len(ok_steps(after, 0)) == STEPS


def test_a_hanging_config_times_out_and_leaves_no_process(sweep):
    results, runs = sweep
    hung = records_of(results, HANG)
    assert [r["status"] for r in hung] == ["timeout"]
    assert hung[0]["error"].startswith(f"no progress for {TIMEOUT_S:g} s")
    # the killed ranks' last heartbeats are the hung configuration's start, at least the watchdog's
    # timeout old when the sweep returns: a live view whose offline limit is under it (kit.monitor's
    # default, 30 s, is not: judged with it, the state would depend on how long ago the sweep ran)
    beats = monitor.read(runs / SWEEP, stale_s=TIMEOUT_S / 4, offline_s=TIMEOUT_S / 2)
    assert [(r["rank"], r["state"], r["label"]) for r in beats.ranks] == [
        (rank, "offline", hung[0]["label"]) for rank in (0, 1)
    ]
    leftovers = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(runs) in cmdline.read_bytes().decode(errors="replace"):
                leftovers.append(cmdline.parent.name)
        except OSError:
            continue  # the process ended while we looked
    assert leftovers == []


def test_losses_are_the_same_for_every_stage(sweep):
    results, _ = sweep
    for precision, rtol in (("fp32", FP32_LOSS_RTOL), ("bf16", BF16_LOSS_RTOL)):
        stages = [BASE.replace(zero={"stage": stage, "precision": precision}) for stage in range(4)]
        for rank in range(NPROCS):
            curves = [[r["loss"] for r in ok_steps(records_of(results, s), rank)] for s in stages]
            assert all(len(c) == STEPS for c in curves)
            for curve in curves[1:]:
                assert curve == pytest.approx(curves[0], rel=rtol), (precision, rank, curves)
    # ranks see different data (DistributedSampler-style split)
    z0 = records_of(results, SETUPS[0])
    assert ok_steps(z0, 0)[0]["loss"] != ok_steps(z0, 1)[0]["loss"]


def test_measured_model_states_equal_the_estimator_exactly(sweep):
    results, _ = sweep
    mismatches, compared = {}, 0
    for setup in SETUPS:
        for rank in range(NPROCS):
            steps = ok_steps(records_of(results, setup), rank)
            assert steps, f"{cid(setup)} rank {rank}: no step to compare"
            compared += 1
            last = steps[-1]
            predicted = estimate.rank_states(Setup.model_validate(last["setup"]), rank)
            measured = {k: v for k, v in last["measured"].items() if k != "activations"}
            if measured != predicted["device"] or last["measured_host"] != predicted["host"]:
                mismatches[f"{steps[0]['label']} {cid(setup)} rank {rank}"] = {
                    "measured": (measured, last["measured_host"]),
                    "estimated": (predicted["device"], predicted["host"]),
                }
    assert compared == len(SETUPS) * NPROCS and mismatches == {}


def test_activations_match_the_estimate(sweep):
    results, _ = sweep
    table = results.summary()
    ok = table[table["status"] == "ok"]
    ratio = ok["measured_activations"] / ok["estimate_activations"]
    off = [
        f"{row.label} ({row.config_id}): measured {row.measured_activations:,.0f} B, "
        f"estimated {row.estimate_activations:,.0f} B, ratio {r:.4f}"
        for row, r in zip(ok.itertuples(), ratio, strict=True)
        if abs(r - 1) > ACTIVATION_RTOL
    ]
    assert not off, "\n".join(off)


def test_activation_checkpointing_keeps_less(sweep):
    """With checkpointing only the blocks' inputs stay saved, plus one block while it is recomputed."""
    table = sweep[0].summary().set_index("config_id")
    kept = table.loc[
        cid(BASE.replace(zero={"stage": 2, "activation_checkpointing": True})), "measured_activations"
    ]
    full = table.loc[cid(BASE.replace(zero={"stage": 2})), "measured_activations"]
    # what autograd saves in the run equals the FakeTensorMode trace of the same micro-step: all of it
    # without checkpointing; the blocks' inputs, the rest and one block's recomputation with it
    b = BASE.batch
    traced = trace.trace(BASE.model, b.micro_batch, b.seq_len, BASE.zero.precision)
    assert (kept, full) == pytest.approx((traced.checkpointed_bytes, traced.saved_bytes), rel=ACTIVATION_RTOL)
    assert kept < 0.75 * full


def test_communication_volume_per_stage(sweep):
    """Stages 1-2 all-reduce the gradients and all-gather the updated partitions: 1.5x stage 0's
    all-reduce. Stage 3 reduce-scatters gradients and all-gathers parameters once: on a model this
    small DeepSpeed keeps them gathered from forward to backward (their reuse distance is under
    stage3_max_reuse_distance), so 1.0x, even with prefetch, live-parameter and persistence limits 0;
    with max_reuse_distance 0 as well it gathers them again for the backward (measured 1.74x)."""
    wire = sweep[0].summary().set_index("config_id")["comm_wire_bytes"]
    ratio = {i: wire[cid(SETUPS[i])] / wire[cid(SETUPS[0])] for i in (1, 2, 3, 14)}
    assert ratio == pytest.approx({1: 1.5, 2: 1.5, 3: 1.0, 14: 1.0}, rel=1e-3)
    regather = wire[cid(SETUPS[16])] / wire[cid(SETUPS[0])]
    assert regather == pytest.approx(952_840 / 547_844, rel=1e-3)  # bytes measured once, fp32 toy GPT


def test_comm_bytes_are_what_deepspeeds_comms_logger_records(sweep):
    """The records' comm_bytes (``kit.ranks.comm_scopes`` at DeepSpeed's comm backend) equal what
    DeepSpeed's own comms logger records (the shared sweep takes its optional probe), per collective
    and step, in every configuration: the stages, offload, bf16, grad accumulation, checkpointing."""
    results, _ = sweep
    ok = [r for r in results.records if r["status"] == "ok" and r["rank"] is not None]
    assert len({r["config_id"] for r in ok}) == len(SETUPS)
    for r in ok:
        logged = {op: size for op, size in r["comm_logger_bytes"].items() if size}  # a barrier logs 0 B
        assert r["comm_bytes"] == logged, (r["label"], r["step"])
    assert all(r["comm_bytes"] for r in ok)


def test_each_configuration_records_its_start_cost(sweep):
    """``start_s``, from a configuration's start to its first step (engine and model builds), is one
    positive number per configuration and rank, carried into the summary."""
    results, _ = sweep
    ok = results.df[(results.df["status"] == "ok") & results.df["rank"].notna()]
    per_rank = ok.groupby(["config_id", "rank"])["start_s"].agg(["min", "max"])
    assert len(per_rank) == len(SETUPS) * NPROCS
    assert (per_rank["min"] == per_rank["max"]).all() and (per_rank["min"] > 0).all()
    summary = results.summary().set_index("config_id")
    for setup in SETUPS:
        assert summary.loc[cid(setup), "start_s"] == per_rank.loc[(cid(setup), 0), "min"]


def test_probes_outside_the_list_are_refused_before_launch(tmp_path):
    with pytest.raises(ValueError, match=r"^probes: each step takes some of heartbeat, comm, .*'walk'"):
        run_sweep([BASE], sweep="p", runs_dir=tmp_path, progress=False, probes=[("records",), ("walk",)])
    assert not (tmp_path / "p").exists()


def test_probe_cycle_defaults_to_every_probe_and_bare_runs_keep_the_heartbeat():
    def probe_cycle(**given):
        spec = SweepSpec(
            sweep="t", run_id="r", records="r.jsonl", steps=1, warmup=0, seed=0, configs=(), **given
        )
        return worker.probe_cycle(spec)

    assert probe_cycle() == [frozenset(PROBES)] and "comm_logger" not in PROBES
    assert probe_cycle(instrument=False) == [frozenset({"heartbeat"})]
    assert probe_cycle(probes=[[], ["comm", "records"]]) == [frozenset(), frozenset({"comm", "records"})]


def test_a_launch_spec_that_does_not_validate_is_one_line_naming_the_file_and_field(tmp_path):
    """Issue 40: what the parent hands the ranks is typed (kit.specs); a rank reading a wrong spec stops
    before the process group with the file and the field, not a KeyError inside a configuration."""
    good = SweepSpec(
        sweep="t", run_id="r", records=str(tmp_path / "records.jsonl"), steps=2, warmup=1, seed=0,
        configs=(SweepConfig(config_id=cid(BASE), label=BASE.label, setup=BASE),),
    )  # fmt: skip
    path = good.write(tmp_path / "launch.json")
    assert SweepSpec.read(path) == good
    data = json.loads(path.read_text())
    for change, line in (
        ({"steps": 0}, "steps: Input should be greater than or equal to 1"),
        (
            {"probes": [["heartbeat", "gpu_temperature"]]},
            "probes: Value error, unknown probe 'gpu_temperature'",
        ),
        (
            {"configs": [{**data["configs"][0], "fault": "explode"}]},
            "configs.0.fault: Input should be 'raise'",
        ),
        ({"seeds": 3}, "seeds: Extra inputs are not permitted"),
    ):
        path.write_text(json.dumps({**data, **change}))
        with pytest.raises(ValueError) as error:
            SweepSpec.read(path)
        assert str(error.value).startswith(f"{path}: {line}") and "\n" not in str(error.value), error.value


def test_throughput_follows_from_step_time(sweep):
    steps = sweep[0].steps()
    setup = BASE.replace(cluster={"gpus_per_node": NPROCS}, batch={})
    row = steps[steps["config_id"] == cid(SETUPS[0])].iloc[0]
    assert row["samples_per_s"] == pytest.approx(setup.batch.train_batch / row["step_time_s"], rel=1e-12)
    tokens = setup.tokens_per_step
    assert row["tflops"] == pytest.approx(
        6 * setup.model.params * tokens / row["step_time_s"] / 1e12, rel=1e-12
    )


def test_resume_runs_only_what_is_missing(two_rank_sweep, replay_launches, tmp_path):
    runs = tmp_path
    records_file = two_rank_sweep.copy(ALL, runs, "t") / "records.jsonl"
    before = load_records(records_file)
    launches = len(list((runs / "t").glob("launch-*.json")))
    run_sweep(SETUPS[:3], sweep="t", runs_dir=runs, nprocs=NPROCS, steps=STEPS, warmup=WARMUP, progress=False)
    assert load_records(records_file) == before
    assert len(list((runs / "t").glob("launch-*.json"))) == launches and replay_launches == []
    extra = EXTRA
    results = run_sweep(
        [SETUPS[0], extra],
        sweep="t",
        runs_dir=runs,
        nprocs=NPROCS,
        steps=STEPS,
        warmup=WARMUP,
        progress=False,
    )
    new = load_records(records_file)[len(before) :]
    assert {r["label"] for r in new} == {on_ranks(extra, NPROCS).label}
    assert replay_launches == [[on_ranks(extra, NPROCS).label]]  # one launch, of the missing one
    assert len(results.summary()) == len(ALL) + 1


def test_invalid_setup_is_rejected_before_launch(tmp_path):
    bad = Setup(model=estimate_free_spec(), zero={"stage": 2}, batch={"micro_batch": 1})
    with pytest.raises(ValueError, match=r"^config 0 \(z2 bf16 mb1\): model: 'custom' has no architecture"):
        run_sweep([bad], sweep="bad", runs_dir=tmp_path, progress=False)
    assert not (tmp_path / "bad" / "records.jsonl").exists()


def estimate_free_spec():
    from kit import models

    return models.from_count(1_000_000)


def test_cli_run_json_then_resume(tmp_path, replay_launches, capsys):
    """``zerokit run --json`` end to end in this process, the launch replayed from the shared sweep's real
    records: the JSON contract, then a second call that resumes every configuration and launches nothing."""
    argv = ["run", "--runs-dir", str(tmp_path), "--sweep", "cli", "--stages", "0,3"]
    argv += [
        "--offload-optimizer",
        "none,cpu",
        "--precision",
        "fp32",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--json",
    ]
    assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sweep"] == "cli" and out["records"] == str(tmp_path / "cli" / "records.jsonl")
    labels = ["z0 fp32 mb2", "z3 fp32 mb2", "z3 opt-off fp32 mb2"]
    assert [c["label"] for c in out["configs"]] == labels and replay_launches == [labels]
    for config in out["configs"]:
        assert config["status"] == "ok" and config["samples_per_s"] > 0
        assert {"parameters", "gradients", "optimizer_states", "activations"} <= config["measured"].keys()
        setup = Setup.model_validate(config["setup"])
        activations = estimate.estimate(setup).components["activations"]
        assert config["estimate"] == {**estimate.rank_states(setup, 0)["device"], "activations": activations}
    assert cli.main(argv) == 0
    assert json.loads(capsys.readouterr().out) == out and replay_launches == [labels]


def test_every_rank_leaves_a_heartbeat_per_step_of_each_configuration(sweep):
    """kit.monitor's files in the sweep folder: per configuration and rank one heartbeat at its start, one
    per warm-up and measured step and a finished one; the job reads 2 ranks on 1 node."""
    beats = monitor.read(sweep[1] / SWEEP)
    assert (beats.job["world_size"], beats.job["nodes"]) == (2, 1) and beats.job["peak_bytes_max"] > 0
    for setup in SETUPS:
        label = on_ranks(setup, NPROCS).label
        for rank in range(NPROCS):
            lines = [b for b in beats.history if b.get("config_id") == cid(setup) and b["rank"] == rank]
            assert [b["status"] for b in lines] == ["running"] * (1 + WARMUP + STEPS) + ["finished"], label
            assert [b["step"] for b in lines[1:-1]] == list(range(WARMUP + STEPS)), label
            assert all(b["samples_per_s"] > 0 for b in lines[2:-1]), label


def test_cli_rejects_bad_flags_with_one_line():
    result = subprocess.run(
        [sys.executable, "-m", "kit", "run", "--stages", "0,x", "--json"], capture_output=True, text=True
    )
    assert result.returncode == 2 and result.stdout == ""
    assert (
        result.stderr
        == "zerokit run: stages: comma-separated integers 0-3 or ddp, fsdp, fsdp-grad-op, got 'x'\n"
    )


def test_saved_activations_count_each_storage_once_and_skip_parameters():
    import torch

    from kit.ranks.measure import SavedActivations

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x = torch.randn(3, 8)
    counter = SavedActivations()
    with counter.watch(model):
        model(x).sum().backward()
    # Linear 1 saves x (3x8), ReLU its output (3x16), Linear 2 that same output: fp32, weights excluded
    assert counter.bytes == 4 * (3 * 8 + 3 * 16)


def test_wire_bytes_per_collective():
    from kit.rules import wire_bytes

    logged = {"all_reduce": 1000, "reduce_scatter": 1000, "all_gather": 100, "broadcast": 10}
    assert wire_bytes(logged, 4) == 1500 + 750 + 300 + 10
    assert wire_bytes(logged, 1) == 0


def test_a_configuration_gets_the_allocator_it_asks_for_on_a_gpu(monkeypatch):
    """``measure.use_allocator`` before each engine: on a GPU, torch's caching allocator takes the
    configuration's ``expandable_segments`` (read back from torch's own settings); the CPU accelerator
    has no caching allocator, and its settings are left alone."""
    import torch

    from kit.ranks import measure

    settings = torch._C._accelerator_getAllocatorSettings
    before = settings()
    measure.use_allocator(True)
    assert settings() == before  # DS_ACCELERATOR=cpu
    monkeypatch.setattr(measure, "on_cpu", lambda: False)
    try:
        measure.use_allocator(True)
        assert settings() == "expandable_segments:True"
        measure.use_allocator(False)
        assert settings() == "expandable_segments:False"
    finally:
        torch._C._accelerator_setAllocatorSettings(before or "expandable_segments:False")
