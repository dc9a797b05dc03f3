"""Tutorial tables and pictures: ranks, shards, bytes per parameter, the ZeRO paper, what fits where."""

import pytest

from kit import models
from kit.components import MEASURED, MODEL_STATES
from kit.lab.teach import batches, roundtrip, shards, sweeps
from kit.schema import Setup

#: ZeRO paper (arXiv 1910.02054) Table 1, GB per device for 7.5B parameters
PAPER_TABLE_1 = {
    "P_os (ZeRO-1)": [120, 52.5, 35.6, 31.4, 30.4, 30.1],
    "P_os+g (ZeRO-2)": [120, 41.3, 21.6, 16.6, 15.4, 15.1],
    "P_os+g+p (ZeRO-3)": [120, 30, 7.5, 1.88, 0.47, 0.12],
}


@pytest.fixture(scope="module")
def llama7b():
    return Setup(model=models.preset("llama-2-7b"), batch={"micro_batch": 1, "seq_len": 2048})


def test_the_package_names_each_topic_and_re_exports_nothing():
    """A notebook imports a topic (``from kit.lab.teach import shards``); the package only lists them."""
    import pkgutil

    from kit.lab import teach

    topics = {m.name for m in pkgutil.iter_modules(teach.__path__)}
    assert topics == {"shards", "sweeps", "batches", "zero_plus_plus", "offloading", "roundtrip", "peak"}
    assert all(f"- ``{t}``:" in (teach.__doc__ or "") for t in topics)
    assert {name for name in vars(teach) if not name.startswith("__")} <= topics


def test_rank_table_two_nodes_of_four():
    table = shards.rank_table(2, 4)
    assert table["rank"].tolist() == list(range(8))
    assert table["node_rank"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert table["local_rank"].tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    assert set(table["world_size"]) == {8}


def test_rank_table_rejects_zero_nodes():
    with pytest.raises(ValueError, match=r"^nodes: must be a whole number >= 1, got 0$"):
        shards.rank_table(0, 4)


@pytest.mark.parametrize(
    ("precision", "optimizer", "momentum", "optimizer_bytes", "total"),
    [
        ("bf16", "adamw", 0.0, 12, 16),  # the paper's K = 12
        ("fp16", "adam", 0.0, 12, 16),
        ("fp32", "adamw", 0.0, 8, 16),  # no master copy, 4 + 4 + 8
        ("bf16", "sgd", 0.0, 4, 8),  # master copy only
        ("fp32", "sgd", 0.9, 4, 12),  # momentum buffer only
    ],
)
def test_bytes_per_param(precision, optimizer, momentum, optimizer_bytes, total):
    table = shards.bytes_per_param(precision, optimizer, momentum)
    by = table.groupby("component")["bytes_per_param"].sum()
    assert by["optimizer_states"] == optimizer_bytes
    assert by["total"] == total
    assert by["parameters"] == by["gradients"] == (4 if precision == "fp32" else 2)


def test_bytes_per_param_rejects_unknown_precision():
    with pytest.raises(ValueError, match=r"^precision: choose fp32, fp16 or bf16, got 'int8'$"):
        shards.bytes_per_param("int8")


@pytest.mark.parametrize(("stage", "per_param"), [(0, 16), (1, 4 + 12 / 4), (2, 2 + 14 / 4), (3, 16 / 4)])
def test_shards_held_add_up_to_the_paper_formula(stage, per_param):
    held = shards.shards_held(stage, 4)
    widths = {"parameters": 2, "gradients": 2, "optimizer_states": 12}
    for rank in range(4):
        total = sum(widths[s] * len(held.loc[rank, s]) / 4 for s in MODEL_STATES)
        assert total == per_param
    if stage:
        assert held.loc[2, "optimizer_states"] == [2]
    assert held.loc[3, "parameters"] == ([3] if stage == 3 else [0, 1, 2, 3])


def test_shard_figure_draws_held_shards():
    import matplotlib.pyplot as plt

    fig = shards.shard_figure(ranks=2, stages=(0, 3))
    top, bottom = fig.axes[:2]
    white = (1.0, 1.0, 1.0, 1.0)
    # 3 states x 2 shards x 2 ranks cells per panel; stage 0 fills all 12, stage 3 half of them
    assert len(top.patches) == len(bottom.patches) == 12
    assert sum(p.get_facecolor() != white for p in top.patches) == 12
    assert sum(p.get_facecolor() != white for p in bottom.patches) == 6
    assert top.get_title().startswith("stage 0") and "(2+2+K)Ψ/N" in bottom.get_title()
    plt.close(fig)


def test_zero_paper_table_reproduces_table_1():
    table = shards.zero_paper_table()
    assert list(table.columns) == [1, 4, 16, 64, 256, 1024]
    for row, values in PAPER_TABLE_1.items():
        digits = [0, 1, 1, 1, 1, 1] if row != "P_os+g+p (ZeRO-3)" else [0, 0, 1, 2, 2, 2]
        for ours, paper, d in zip(table.loc[row], values, digits, strict=True):
            assert abs(ours - paper) <= 0.5 * 10**-d + 1e-9, (row, ours, paper)  # the paper rounds half up
    assert set(table.loc["baseline DP"]) == {120.0}


def _toy(**zero) -> Setup:
    spec = models.from_hf_config(
        {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 512, "n_positions": 64}
    )
    return Setup(model=spec, cluster={"gpus_per_node": 2}, zero=zero, batch={"micro_batch": 2})


def _record(setup: Setup, config_id: str, rank: int, step: int, **fields) -> dict:
    record = {"sweep": "t", "run_id": "r1", "config_id": config_id, "label": setup.label, "rank": rank}
    record.update(setup=setup.model_dump(mode="json"), world_size=2, step=step, status="ok", error=None)
    return {**record, **fields}


def test_results_states_puts_every_rank_measured_beside_its_estimate():
    from kit.estimate import rank_states
    from kit.run.results import Results

    setup = _toy(stage=2)
    records = []
    for rank in (0, 1):
        exact = rank_states(setup, rank)
        measured = dict(exact["device"], gradients=exact["device"]["gradients"] + (2 if rank else 0))
        device = {
            "measured": {**measured, "activations": 7},
            "estimate": {**exact["device"], "activations": 5},
        }
        host = {"measured_host": exact["host"], "estimate_host": exact["host"]}
        records.append(_record(setup, "a", rank, 1, loss=5.0, **device, **host))
        records.append(_record(setup, "a", rank, 2, loss=5.0, **device, **host))  # the last step counts
    records.append(_record(setup, "a", 0, 3, measured={}, measured_host={}, status="error"))  # ignored
    states = Results(records).states()
    assert len(states) == 2 * 8 and set(states["step"]) == {2}  # 4 device + 4 host components per rank
    wrong = states[states["difference"] != 0]
    assert wrong[["rank", "where", "component", "difference"]].values.tolist() == [
        [1, "device", "gradients", 2]
    ]
    # stage 2 shards gradients by the tensors touching each rank's partition: the two ranks differ
    grads = states[(states["component"] == "gradients") & (states["where"] == "device")]["estimate"].tolist()
    assert grads == [
        rank_states(setup, 0)["device"]["gradients"],
        rank_states(setup, 1)["device"]["gradients"],
    ]
    assert grads[0] != grads[1]
    with_activations = Results(records).states(MEASURED)
    activations = with_activations[with_activations["component"] == "activations"]
    assert activations[["rank", "where", "measured", "estimate"]].values.tolist() == [
        [0, "device", 7, 5],
        [1, "device", 7, 5],
    ]
    summary = Results(records).summary().iloc[0]  # rank 0's device pairs, from the same table
    assert (summary["measured_activations"], summary["estimate_activations"]) == (7, 5)
    assert summary["measured_gradients"] == summary["estimate_gradients"] == grads[0]


def test_an_unknown_status_is_an_error_not_an_oom():
    from kit.run.results import Results

    setup = _toy(stage=2)
    records = [_record(setup, "a", 0, 2), _record(setup, "a", 1, 2, status="exploded")]
    with pytest.raises(ValueError, match=r"^status: 'exploded' in the records of a is not one of error, oom"):
        Results(records).summary()
    worst = [_record(setup, "b", 0, 2, status="timeout"), _record(setup, "b", 1, 2, status="oom")]
    assert Results(worst).summary()["status"].tolist() == ["oom"]


def _engine_records(speeds: dict[str, float], held: dict[str, int]) -> list[dict]:
    """Step records of one configuration per name of ``speeds`` (ddp, fsdp or a ZeRO stage) that held
    ``held[name]`` bytes on rank 0 (measured = estimated) and ran at ``speeds[name]`` samples/s."""
    rows = []
    for name, speed in speeds.items():
        zero = (
            {"engine": name, "stage": 0 if name == "ddp" else 3}
            if not name.isdigit()
            else {"stage": int(name)}
        )
        setup = _toy(**zero)
        parts = {"parameters": held[name], "gradients": 0, "optimizer_states": 0, "buffers": 0}
        fields = dict(measured=parts, estimate=parts, samples_per_s=speed, loss=5.0, step_time_s=1 / speed)
        rows += [_record(setup, name, 0, 2, comm_wire_bytes=10**6, **fields)]
    return rows


def test_the_engine_advice_follows_the_numbers():
    from kit.lab.engine_report import advice
    from kit.run.results import Results

    held = {"ddp": 5 * 2**20, "0": 4 * 2**20, "fsdp": 1 * 2**20, "3": 2 * 2**20}  # MiB, as the advice reads
    text = advice(Results(_engine_records({"ddp": 90.0, "0": 100.0, "fsdp": 50.0, "3": 60.0}, held)))
    lines = text.splitlines()
    z0, z3, fsdp = _toy(stage=0).label, _toy(stage=3).label, _toy(engine="fsdp", stage=3).label
    assert (
        lines[0]
        == f"- Fastest here: **{z0}** (100.0 samples/s); fewest bytes held per rank: **{fsdp}** (1.00 MiB)."
    )
    assert "1.25x the bytes held" in lines[1] and "0.9x the speed" in lines[1]  # ddp vs z0
    assert lines[-1].startswith("- So, by the room per rank for model states and buffers")
    assert f"4.00 MiB or more: **{z0}** (100.0 samples/s, 1x the fastest's speed)" in lines[-1]
    assert f"2.00 MiB or more: **{z3}** (60.0 samples/s, 0.6x the fastest's speed)" in lines[-1]
    assert f"1.00 MiB or more: **{fsdp}**" in lines[-1] and "The other 1 are no faster" in lines[-1]  # ddp
    # other measurements, other advice: FSDP now the fastest and the leanest
    text = advice(Results(_engine_records({"ddp": 90.0, "0": 100.0, "fsdp": 150.0, "3": 60.0}, held)))
    assert text.splitlines()[-1].startswith(f"- So: **{fsdp}** is both the fastest and the leanest here")
    assert "4.00 MiB or more" not in text


def test_sweep_table_medians_per_configuration():
    from kit.run.results import Results

    small, large = _toy(stage=3, reduce_bucket_size=10_000), _toy(stage=3, reduce_bucket_size=1_000_000)
    records = [
        _record(s, cid, 0, step, step_time_s=t, measured_buffers=b)
        for s, cid, b in ((small, "s", 20_000), (large, "l", 2_000_000))
        for step, t in ((2, 1.0), (3, 3.0), (4, 2.0))
    ]
    records.append(_record(small, "s", 1, 2, step_time_s=9.0, measured_buffers=0))  # rank 1: not shown
    table = sweeps.sweep_table(
        Results(records), ("zero.reduce_bucket_size",), ("step_time_s", "measured_buffers")
    )
    assert table.to_dict("records") == [
        {
            "label": small.label,
            "zero.reduce_bucket_size": 10_000,
            "step_time_s": 2.0,
            "measured_buffers": 20_000,
        },
        {
            "label": large.label,
            "zero.reduce_bucket_size": 1_000_000,
            "step_time_s": 2.0,
            "measured_buffers": 2e6,
        },
    ]
    with pytest.raises(ValueError, match=r"^settings/metrics: no column setup_zero_nope"):
        sweeps.sweep_table(Results(records), ("zero.nope",))


def test_wire_table_shows_mb_per_step_and_a_percentage_of_the_first():
    from kit.lab.notebook import frame_html
    from kit.run.results import Results

    z0, z3 = _toy(stage=0), _toy(stage=3)
    records = [
        _record(s, cid, 0, step, comm_wire_bytes=wire)
        for s, cid, wire in ((z0, "a", 2_000_000), (z3, "b", 1_500_000))
        for step in (2, 3)
    ]
    table = sweeps.wire_table(Results(records))
    assert table.index.name == "setting" and table.index.tolist() == [z0.label, z3.label]
    assert table.to_dict("list") == {"MB sent per step": [2.0, 1.5], f"% of {z0.label}": [100.0, 75.0]}
    assert ">75</td>" in frame_html(table)  # a percentage, not a ratio of 0.75
    silent = [_record(s, cid, 0, 2, comm_wire_bytes=0) for s, cid in ((z0, "a"), (z3, "b"))]
    with pytest.raises(ValueError, match=r"^results: .* sent no bytes on the wire to compare with$"):
        sweeps.wire_table(Results(silent))


def test_estimates_table_shows_each_estimate_and_the_settings_asked_for(llama7b):
    from kit.estimate import estimate

    small, large = (
        llama7b.replace(zero={"stage": 3, "reduce_bucket_size": n}) for n in (5_000_000, 500_000_000)
    )
    offloaded = llama7b.replace(zero={"stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"})
    estimates = [estimate(s) for s in (small, large, offloaded)]
    table = sweeps.estimates_table(estimates, ("zero.reduce_bucket_size",))
    assert table["label"].tolist() == [small.label, large.label, offloaded.label]
    assert table["zero.reduce_bucket_size"].tolist() == [
        5_000_000,
        500_000_000,
        offloaded.zero.reduce_bucket_size,
    ]
    for row, e in zip(table.itertuples(index=False), estimates, strict=True):
        assert row[2:] == (
            e.per_gpu_bytes / 2**30,
            e.model_states_bytes / 2**30,
            e.components["buffers"] / 2**30,
            e.cpu_bytes_per_node / 2**30,
        )
    assert table["buffers GiB"][0] < table["buffers GiB"][1]  # stage 3 allocates its reduce bucket
    assert table["CPU RAM GiB per node"][2] > table["CPU RAM GiB per node"][0]


def test_batch_splits_keep_the_global_batch_then_double_it_by_accumulation():
    splits = batches.batch_splits(_toy(stage=2), micro_batch=4)
    pairs = [(s.batch.micro_batch, s.batch.grad_accum, s.batch.train_batch) for s in splits]
    assert pairs == [(4, 1, 8), (2, 2, 8), (1, 4, 8), (4, 2, 16)]  # 2 ranks
    assert [(s.batch.micro_batch, s.batch.grad_accum) for s in batches.batch_splits(_toy(), 1)] == [
        (1, 1),
        (1, 2),
    ]
    with pytest.raises(ValueError, match=r"^micro_batch: must be a whole number >= 1, got 0$"):
        batches.batch_splits(_toy(), 0)


def test_round_trip_tables_read_the_reports():
    state = {"global_step": 2}
    reports = [
        {"label": "z2 bf16 mb2", "name": "stage2-0", "client_state": state, "resume_equal": True,
         "consolidated": {"equal": True}, "losses": [5.0, 4.0, 3.0, 2.0], "resumed_losses": [3.0, 2.0]},
        {"label": "z3 bf16 mb2", "name": "stage3-1", "client_state": state, "resume_equal": False,
         "consolidated": {"equal": True}, "losses": [5.5, 4.5, 3.5, 2.5], "resumed_losses": [3.5, 2.6]},
    ]  # fmt: skip
    table = roundtrip.roundtrip_table(reports)
    assert table["resumed = uninterrupted"].tolist() == [True, False]
    assert table["client state"].tolist() == [{"global_step": 2}] * 2
    losses = roundtrip.resume_losses(reports, save_step=2)
    assert list(losses.columns) == [
        "z2 bf16 mb2",
        "z3 bf16 mb2",
        "z2 bf16 mb2 (resumed)",
        "z3 bf16 mb2 (resumed)",
    ]
    assert losses["z3 bf16 mb2 (resumed)"].tolist()[2:] == [3.5, 2.6]
    assert losses["z3 bf16 mb2 (resumed)"].isna().tolist() == [True, True, False, False]
    assert list(losses.index) == [1, 2, 3, 4]  # counted from 1: the resumed run starts at step 3
    assert losses["z3 bf16 mb2 (resumed)"].first_valid_index() == 2 + 1


def test_checkpoint_size_table_adds_up_each_stage(llama7b):
    from kit.estimate.checkpoint_size import checkpoint_bytes
    from kit.lab.notebook import frame_html

    table = roundtrip.checkpoint_size_table(llama7b)
    assert table[["stage", "file"]].values.tolist() == [
        [s, k] for s in range(4) for k in ("model_states", "optim_states")
    ]
    for stage in range(4):
        rows = table[table["stage"] == stage]
        predicted = checkpoint_bytes(llama7b.replace(zero={"stage": stage}))
        assert rows["GiB in all"].sum() * 2**30 == pytest.approx(predicted["total_bytes"])
        files = predicted["model_states"]["files"], predicted["optim_states"]["files"]
        assert rows["files"].tolist() == list(files)
    # a size a person reads: MiB below a GiB (a stage-3 model file holds placeholders), a dash for none
    by = table.set_index(["stage", "file"])["size per file"]
    assert by[(3, "model_states")].endswith(" MiB") and by[(0, "model_states")].endswith(" GiB")
    assert by.isna().tolist() == [False, True] + [False] * 6  # stage 0: no optimizer file of its own
    page = frame_html(table)
    assert "e-0" not in page and f">{by[(3, 'model_states')]}<" in page
    totals = roundtrip.per_checkpoint(table)
    assert list(totals.columns) == ["GiB per checkpoint"] and totals.index.name == "stage"
    assert totals["GiB per checkpoint"].tolist() == pytest.approx(
        [checkpoint_bytes(llama7b.replace(zero={"stage": s}))["total_bytes"] / 2**30 for s in range(4)]
    )
    assert ">stage</th>" in frame_html(totals) and "dtype" not in frame_html(totals)


def test_the_notebook_profile_is_small_under_smoke_and_real_otherwise(monkeypatch):
    from kit.lab.notebook import profile
    from kit.toys import TOY_ZERO

    monkeypatch.setenv("ZEROKIT_SMOKE", "1")
    small = profile("02")
    assert (small.smoke, small.nprocs, small.steps, small.micro_batch) == (True, 2, 2, 2)
    assert small.runs_dir.split("/")[-1].startswith("zerokit-02-")
    toy = small.toy_setup(zero={"precision": "fp32"})
    assert (toy.model.layers, toy.model.hidden, toy.cluster.world_size, toy.batch.micro_batch) == (
        2,
        64,
        2,
        2,
    )
    assert toy.zero.precision == "fp32" and toy.zero.reduce_bucket_size == TOY_ZERO["reduce_bucket_size"]
    monkeypatch.setenv("ZEROKIT_SMOKE", "0")
    real = profile("02")
    assert (real.smoke, real.nprocs, real.runs_dir, real.toy_setup().model.hidden) == (False, 8, "runs", 768)
    assert profile("02", smoke=True).smoke  # the notebook's SMOKE wins over the environment


def test_measured_steps_count_from_1_after_each_launchs_warm_up(tmp_path):
    """The notebooks' step tables number steps as the panels and ``zerokit monitor`` do: a record's step
    (the loop's count, warm-up first) less its launch's warm-up (the spec beside records.jsonl), from 1;
    a launch without a spec counts from its configuration's first measured step."""
    import json

    from kit.lab.notebook import measured_steps
    from kit.run.results import Results

    two, three = _toy(stage=2), _toy(stage=3)
    (tmp_path / "launch-r1.json").write_text(json.dumps({"run_id": "r1", "warmup": 2, "steps": 2}))
    records = [
        _record(setup, config, rank, step, loss=float(step), run_id=run_id)
        for config, setup, run_id, steps in (("a", two, "r1", (2, 3)), ("b", three, "r2", (5, 6)))
        for step in steps
        for rank in (0, 1)
    ]
    records.append(_record(two, "a", 0, None, run_id="r1", status="error"))  # no step: left out
    results = Results(records, tmp_path / "records.jsonl")
    rank0 = measured_steps(results)
    assert rank0[["config_id", "rank", "step", "loss"]].values.tolist() == [
        ["a", 0, 1, 2.0], ["a", 0, 2, 3.0], ["b", 0, 1, 5.0], ["b", 0, 2, 6.0],
    ]  # fmt: skip
    every = measured_steps(results, rank=None).pivot_table(index="step", columns="rank", values="loss")
    assert every.index.tolist() == [1, 2] and list(every.columns) == [0, 1]
    assert measured_steps(Results([])).empty


def test_bucket_grid_crosses_every_reduce_bucket_with_every_prefetch():
    grid = sweeps.bucket_grid(_toy(stage=2), (10_000, 1_000_000), (0, 50_000))
    assert [(s.zero.stage, s.zero.reduce_bucket_size, s.zero.prefetch_bucket_size) for s in grid] == [
        (3, 10_000, 0), (3, 10_000, 50_000), (3, 1_000_000, 0), (3, 1_000_000, 50_000),
    ]  # fmt: skip


def test_schedule_table_shows_each_batch_of_a_ramp_with_its_estimate():
    from kit.batch import ramp
    from kit.estimate import estimate

    ramped = _toy(stage=2).replace(batch={"micro_batch": 2, "grad_accum": 1, "schedule": ramp(4, 16, 3, 4)})
    table = batches.schedule_table(ramped)
    states = ramped.batch_states()
    assert table["from step"].tolist() == [step for step, _ in states] and len(states) > 1
    assert table["train_batch"].tolist() == [s.batch.train_batch for _, s in states]
    assert table["train_batch"].iloc[-1] == 16 and set(table["micro_batch"]) == {2}  # GAS grows, micro stays
    assert table["estimate MiB/GPU"].tolist() == [estimate(s).per_gpu_bytes / 2**20 for _, s in states]


def test_schedule_table_on_cpu_ranks_estimates_per_rank_without_the_gpus_overheads():
    """The toy's ranks on CPU: no CUDA context, no NCCL buffers (``Estimate.on_accelerator("cpu")``), and
    the column says per rank, not per GPU."""
    from kit.batch import ramp
    from kit.estimate import estimate

    ramped = _toy(stage=2).replace(batch={"micro_batch": 2, "grad_accum": 1, "schedule": ramp(4, 16, 3, 4)})
    table = batches.schedule_table(ramped, accelerator="cpu")
    states = ramped.batch_states()
    assert "estimate MiB/GPU" not in table.columns
    on_cpu = [estimate(s).on_accelerator("cpu").per_gpu_bytes / 2**20 for _, s in states]
    assert table["estimate MiB per rank"].tolist() == on_cpu
    on_gpu = batches.schedule_table(ramped)["estimate MiB/GPU"]
    assert (table["estimate MiB per rank"] < on_gpu).all()  # the GPU's overheads are not on a CPU rank
    with pytest.raises(ValueError, match="accelerator"):
        batches.schedule_table(ramped, accelerator="tpu")


# --------------------------------------------------- what the notebooks show (kit.lab.notebook, tables)


def test_numbers_are_formatted_for_a_reader():
    from kit.units import number

    assert [number(v) for v in (273920.0, 0.41087999999999997, 12.3456, 1234.56, 3.0, -0.000123)] == [
        "273,920", "0.4109", "12.35", "1,234.6", "3", "-0.000123"
    ]  # fmt: skip


def test_a_frame_shows_in_full_labels_on_one_line_long_text_wrapped(llama7b):
    import pandas as pd

    from kit.estimate import estimate
    from kit.lab.notebook import ONE_LINE_CHARS, frame_html, readable

    table = estimate(llama7b).table()
    page = frame_html(table)
    for name, term in estimate(llama7b).terms.items():
        assert f">{name}</td>" in page and f">{term.bytes:,}</td>" in page  # the index, separators
        assert f">{term.formula}</td>" in page.replace("&#x27;", "'")  # in full: no "..."
    assert "..." not in page and "overflow-wrap:anywhere;min-width:200px'>2 B x Psi" in page
    assert ">component</th>" in page and ">optimizer states</th>" in frame_html(table.T)  # headers in words
    assert "white-space:nowrap'>parameters<" in page and len("parameters") <= ONE_LINE_CHARS
    many = pd.DataFrame({"x": [0.5] * 70})
    assert frame_html(many).count("<tr>") == 1 + 60 and "10 more rows" in frame_html(many)
    readable()
    assert pd.get_option("display.max_colwidth") is None
    assert "0.4109" in repr(pd.Series([0.41087999999999997])) and "273,920" in repr(pd.Series([273920.0]))


def test_the_notebook_tables_of_01_04_and_09(llama7b):
    from kit import grid
    from kit.estimate import estimate
    from kit.lab import tables
    from kit.steptime import comm, perf

    v100 = llama7b.replace(cluster={"gpu": "V100-SXM2-32GB"}, zero={"precision": "fp16", "optimizer": "adam"})
    paper = tables.paper_vs_deepspeed(v100)
    assert paper.index.tolist() == ["z1 fp16 mb1", "z2 fp16 mb1", "z3 fp16 mb1"]
    z3 = v100.replace(zero={"stage": 3})
    assert (
        paper.loc["z3 fp16 mb1", "paper's states GB"]
        == estimate(z3, formula="zero-paper").model_states_bytes / 1e9
    )
    assert paper.loc["z3 fp16 mb1", "peak / GPU GB"] == estimate(z3).per_gpu_bytes / 1e9
    s3 = llama7b.replace(cluster={"nodes": 2}, zero={"stage": 3})
    zeropp = s3.replace(zero=grid.zeropp_variants(8)["ZeRO++ (hpZ + qwZ + qgZ)"])
    parts = tables.collectives_table([s3, zeropp])
    assert len(parts) == len(comm.collectives(s3)) + len(comm.collectives(zeropp))
    assert parts.groupby("setting")["GiB"].sum()[s3.label] * 2**30 == pytest.approx(
        sum(c.bytes for c in comm.collectives(s3))
    )
    times = tables.step_time_table([s3, zeropp])
    assert times.loc[zeropp.label, "step s"] == perf.step_time(zeropp).step_s < times.loc[s3.label, "step s"]
    assert times.loc[s3.label, "exposed comm s"] == perf.step_time(s3).exposed_comm.seconds


def test_a_record_of_named_values_is_a_one_column_table_not_a_series():
    from kit.lab.notebook import frame_html, record

    table = record({"largest micro batch": 2, "with checkpointing": 23}, "micro batch", index="choice")
    assert list(table.columns) == ["micro batch"] and table.index.name == "choice"
    page = frame_html(table)
    assert ">choice</th>" in page and ">micro batch</th>" in page and ">23</td>" in page
    assert "dtype" not in page
    with pytest.raises(ValueError, match=r"^values: nothing to show under 'x'$"):
        record({}, "x")


def test_largest_micro_batches_without_and_with_checkpointing(llama7b):
    from kit.planning import boundary

    h100 = llama7b.replace(cluster={"gpus_per_node": 8, "gpu": "H100-SXM-80GB"}, zero={"stage": 3})
    table = batches.largest_micro_batches(h100)
    assert list(table.columns) == ["largest micro batch that fits"]
    on = h100.replace(zero={"activation_checkpointing": True})
    assert table["largest micro batch that fits"].to_dict() == {
        "without activation checkpointing": boundary.largest_micro_batch(h100),
        "with activation checkpointing": boundary.largest_micro_batch(on),
    }
    assert boundary.largest_micro_batch(on) > boundary.largest_micro_batch(h100) > 0


def test_a_trace_reads_in_mib_or_gib_with_the_unit_in_each_row():
    from kit.estimate.trace import Trace
    from kit.lab import tables
    from kit.lab.notebook import frame_html

    small = tables.trace_table(Trace(97_030_148, 60_837_892, 99_639_304, blocks=3, seconds=1.1414))
    values = small["one micro batch"]
    assert values["saved for backward, MiB"] == 97_030_148 / 2**20
    assert values["transient: the peak above what is saved, MiB"] == (99_639_304 - 97_030_148) / 2**20
    assert values["blocks (the largest ModuleList)"] == 3
    page = frame_html(small)
    assert ">92.54</td>" in page and ">1.141</td>" in page and "_bytes" not in page
    large = tables.trace_table(Trace(3 * 2**30, 2**30, 4 * 2**30, blocks=32, seconds=2.0))
    assert large["one micro batch"]["peak of live tensors, GiB"] == 4
    with pytest.raises(ValueError, match=r"^trace: this estimate used formulas"):
        tables.trace_table(None)


def test_a_step_times_parts_and_assumptions_read_in_words_and_percentages(llama7b):
    from kit.lab import tables
    from kit.lab.notebook import frame_html
    from kit.steptime import perf

    step = perf.step_time(llama7b.replace(cluster={"gpus_per_node": 8, "gpu": "H100-SXM-80GB"}))
    parts = tables.step_parts(step)
    assert "exposed comm" in parts.index and parts.loc["compute", "seconds"] == step.compute.seconds
    assumed = tables.assumptions(step)["assumed"]
    assert assumed.to_dict() == {
        "GEMM efficiency: achieved / peak TFLOP/s, %": 80,
        "link efficiency: achieved / nominal bandwidth, %": 80,
        "overlapped communication that hides behind compute, %": 80,
        "host memory bandwidth for CPU Adam, GB/s": 300,
    }
    assert ">80</td>" in frame_html(tables.assumptions(step))


def test_tunes_table_shows_the_error_in_percent():
    from types import SimpleNamespace

    import pandas as pd

    from kit.lab import tables

    table = pd.DataFrame(
        {
            "label": ["z3 fp32 mb1 gas4", "z0 fp32 mb4"], "rank": pd.array([1, None], "Int64"),
            "estimated_gib": [0.7797, 0.7849], "samples_per_s": [30.4, None], "status": ["ok", "pruned"],
            "predicted_s": [0.2551, 0.05316], "measured_s": [0.3187, None], "error": [-0.1996, None],
        }
    )  # fmt: skip
    shown = tables.tune_table(SimpleNamespace(table=table))
    assert list(shown.columns) == [
        "rank", "setting", "estimate GiB", "samples/s", "status", "predicted s", "measured s", "error %"
    ]  # fmt: skip
    assert shown["error %"].iloc[0] == pytest.approx(-19.96) and pd.isna(shown["error %"].iloc[1])


def test_consolidate_keeps_zero_to_fp32s_bars_and_prints_out(tmp_path, capfd, monkeypatch):
    """zero_to_fp32's tqdm bars went to stderr: a red block in notebook 06 (issue 43)."""
    with capfd.disabled():  # DeepSpeed's logger keeps the stream it is imported under: not the captured one
        from deepspeed.utils import zero_to_fp32
    from tqdm import tqdm

    from kit.scaleout import checkpoints

    def chatty(folder, tag=None):  # what zero_to_fp32 does around the merge
        print(f"Processing zero checkpoint '{folder}'")
        for _ in zero_to_fp32.tqdm(range(2), desc="Loading checkpoint shards"):
            pass
        return {"w": folder}

    (tmp_path / "latest").write_text("global_step2")
    monkeypatch.setattr(zero_to_fp32, "get_fp32_state_dict_from_zero_checkpoint", chatty)
    capfd.readouterr()
    assert checkpoints.consolidate(tmp_path) == {"w": str(tmp_path)}
    assert capfd.readouterr() == ("", "")
    assert zero_to_fp32.tqdm is tqdm  # its bars are back for everyone else


def test_schedules_side_by_side_reads_rank_0s_steps():
    from kit.lab import tables
    from kit.run.results import Results

    def record(label, rank, step, train_batch, micro_batch):
        batch = {
            "train_batch": train_batch,
            "micro_batch": micro_batch,
            "grad_accum": train_batch // micro_batch // 2,
        }
        return {"config_id": label, "run_id": "r", "label": label, "rank": rank, "step": step, "status": "ok",
                "loss": 5.0 - step / 10, **batch}  # fmt: skip

    records = [
        record(label, rank, step, 4 * (step + 1), micro)
        for label, micro in (("ramp", 2), ("by micro", 4))
        for rank in (0, 1)
        for step in range(3)
    ]
    records.append(record("other", 0, 0, 8, 2))
    table = tables.schedules_side_by_side(Results(records), ["ramp", "by micro"])
    assert table.columns.get_level_values(0).unique().tolist() == [
        "train_batch",
        "grad_accum",
        "micro_batch",
        "loss",
    ]
    assert (
        table["train_batch"]["ramp"].tolist() == [4, 8, 12]
        and table["micro_batch"]["by micro"].tolist() == [4] * 3
    )
    assert set(table.columns.get_level_values(1)) == {"ramp", "by micro"}
    with pytest.raises(ValueError, match="labels: none of"):
        tables.schedules_side_by_side(Results(records), ["absent"])


def test_snake_case_headers_read_in_words_and_setting_keys_stay():
    from kit.lab.notebook import header_text

    assert [header_text(n) for n in ("per_gpu_gib", "samples_per_s", "step_time_s", "local_rank")] == [
        "per GPU GiB", "samples/s", "step time (s)", "local rank"
    ]  # fmt: skip
    assert header_text("algbw_gbps") == "algbw GB/s" and header_text("cpu_gib_per_node") == "CPU GiB per node"
    assert header_text("zero.reduce_bucket_size") == "zero.reduce_bucket_size"  # a setting's key, as written
    assert header_text("z3 bf16 mb2 reduce_bucket_size=20,000") == "z3 bf16 mb2 reduce_bucket_size=20,000"
    assert header_text("label") == "label"
