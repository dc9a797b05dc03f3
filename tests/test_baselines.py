"""PyTorch's DDP and FSDP2 beside the ZeRO stages: the estimate like for like, the CLI, and one real sweep.

The sweep runs ``ddp,fsdp,fsdp-grad-op,0,1,2,3`` (fp32, two micro-steps per step) and FSDP in bf16 in one
launch on 2 CPU ranks (the session's shared sweep, tests/conftest.py) and checks, for every configuration
and rank, measured == estimated model-state bytes, the same losses, and the bytes each rank sent against
the prediction.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pytest

from kit import estimate
from kit.ds_config import to_ds_config
from kit.estimate import baselines
from kit.models import preset, toy_spec
from kit.rules import BASELINES, baseline_name
from kit.run.sweep import check, config_id
from kit.schema import Setup
from kit.steptime.comm import comm_bytes
from kit.toys import TOY_ZERO

NPROCS = 2
TOY = Setup(
    model=toy_spec(),
    cluster={"nodes": 1, "gpus_per_node": NPROCS},
    zero={**TOY_ZERO, "precision": "fp32"},
    batch={"micro_batch": 2, "grad_accum": 2},
)
#: bytes of the scalars a step also reduces (DeepSpeed's gradient norm and overflow flag), not predicted
SCALARS = 64
#: fp32: sharding changes only the order of the reductions over 2 ranks
FP32_LOSS_RTOL = 1e-5


def variant(name: str, **zero) -> Setup:
    """TOY as a ZeRO stage ("0".."3") or a baseline ("ddp", "fsdp", "fsdp-grad-op")."""
    engine, stage = BASELINES[name] if name in BASELINES else ("deepspeed", int(name))
    return TOY.replace(zero={"engine": engine, "stage": stage, **zero})


NAMES = ["ddp", "fsdp", "fsdp-grad-op", "0", "1", "2", "3"]
SETUPS = [variant(n) for n in NAMES]
SETUPS += [variant("fsdp", precision="bf16"), variant("ddp", precision="bf16")]


def toy_shapes() -> list[tuple[int, ...]]:
    """The toy GPT's parameter shapes, from the module itself (built on the meta device)."""
    import torch

    from kit import workloads

    with torch.device("meta"):
        model = workloads.for_model(TOY.model).build()
    return [tuple(p.shape) for p in model.parameters()]


def test_ddp_keeps_everything_in_fp32_plus_its_buckets():
    psi = TOY.model.params
    for precision in ("fp32", "bf16"):
        states = estimate.rank_states(variant("ddp", precision=precision), rank=1)["device"]
        assert states == {
            "parameters": 4 * psi, "gradients": 4 * psi, "optimizer_states": 8 * psi, "buffers": 4 * psi,
        }  # fmt: skip


def test_fsdp_shards_each_tensor_along_its_first_dimension():
    shapes = toy_shapes()
    chunk = [math.ceil(s[0] / NPROCS) * math.prod(s[1:]) for s in shapes]
    for name in ("fsdp", "fsdp-grad-op"):
        for rank in range(NPROCS):
            local = sum(
                max(0, min(math.ceil(s[0] / NPROCS), s[0] - rank * math.ceil(s[0] / NPROCS)))
                * math.prod(s[1:])
                for s in shapes
            )
            states = estimate.rank_states(variant(name), rank)["device"]
            assert states == {
                "parameters": 4 * sum(chunk), "gradients": 4 * sum(chunk), "optimizer_states": 8 * local,
                "buffers": 0,
            }  # fmt: skip


def test_fsdp_gathers_one_unit_at_a_time_and_grad_op_keeps_them_all():
    llama = Setup(model=preset("llama-2-7b"), zero={"engine": "fsdp", "stage": 3}, batch={"micro_batch": 1})
    unit, _ = baselines.largest_unit(llama)
    m = llama.model
    assert unit == 2 * m.vocab * m.hidden  # embeddings + untied head: larger than one block (202M)
    full = estimate.estimate(llama).components["buffers"]
    grad_op = estimate.estimate(llama.replace(zero={"stage": 2})).components["buffers"]
    assert full == 3 * 2 * unit
    assert grad_op == 2 * m.params + 2 * unit


def test_communication_per_step_ddp_twice_fsdp_three_times_the_model():
    ring = (NPROCS - 1) / NPROCS
    m32, k = 4 * TOY.model.params, TOY.batch.grad_accum
    assert comm_bytes(variant("ddp"))[0] == round(2 * ring * m32)
    assert comm_bytes(variant("fsdp"))[0] == round(3 * k * ring * m32)
    assert comm_bytes(variant("fsdp-grad-op"))[0] == round(2 * k * ring * m32)
    assert comm_bytes(variant("fsdp", precision="bf16"))[0] == round(3 * k * ring * m32 / 2)
    assert comm_bytes(variant("ddp", precision="bf16"))[0] == round(2 * ring * m32)  # fp32 grads


def test_labels_and_bad_settings_name_the_field():
    assert [variant(n).label.split()[0] for n in NAMES] == [
        "ddp",
        "fsdp",
        "fsdp-grad-op",
        "z0",
        "z1",
        "z2",
        "z3",
    ]
    assert baseline_name("fsdp", 2) == "fsdp-grad-op" and baseline_name("deepspeed", 2) is None
    cases = [
        ("ddp", 2, {}, "stage: engine 'ddp' stands for ZeRO stage 0, got stage 2"),
        ("fsdp", 1, {}, "stage: engine 'fsdp' stands for ZeRO stage 3 or 2, got stage 1"),
        ("fsdp", 3, {"offload_optimizer": "cpu"}, "offload_optimizer: engine 'fsdp': offload is DeepSpeed's"),
        ("ddp", 0, {"precision": "fp16"}, "precision: engine 'ddp': fp32 or bf16"),
        (
            "fsdp",
            3,
            {"hpz_partition_size": 2},
            "engine: ZeRO++ (hpZ, qwZ, qgZ) is DeepSpeed's; engine 'fsdp' has",
        ),
    ]
    for engine, stage, extra, message in cases:
        with pytest.raises(ValueError, match=re.escape(message)):
            TOY.replace(zero={"engine": engine, "stage": stage, **extra})


def test_a_baseline_has_no_ds_config_and_refuses_what_only_deepspeed_runs():
    with pytest.raises(ValueError, match="zero.engine: 'fsdp' is PyTorch's own engine.*stage 3"):
        to_ds_config(variant("fsdp"))
    with pytest.raises(ValueError, match="batch.schedule: ddp runs take a fixed batch"):
        check(variant("ddp").replace(batch={"schedule": [{"step": 2, "micro_batch": 4, "grad_accum": 2}]}))
    with pytest.raises(ValueError, match="zero.activation_checkpointing: fsdp runs here train without it"):
        check(variant("fsdp", activation_checkpointing=True))


def test_config_ids_of_deepspeed_setups_ignore_the_engine_field():
    data = variant("2").model_dump(mode="json")
    del data["zero"]["engine"]
    assert config_id(variant("2")) == config_id(Setup.model_validate(data))
    assert config_id(variant("ddp")) != config_id(variant("0"))


def test_cli_stages_take_baseline_names_and_refuse_others():
    from kit.cli import build_parser
    from kit.cli.run import setups_from_args

    args = build_parser().parse_args(
        ["run", "--stages", "ddp,fsdp,fsdp-grad-op,3", "--offload-optimizer", "none,cpu"]
    )
    labels = [
        s.label.split()[0] + (" opt-off" if s.zero.offload_optimizer == "cpu" else "")
        for s in setups_from_args(args)
    ]
    assert labels == ["ddp", "fsdp", "fsdp-grad-op", "z3", "z3 opt-off"]  # baselines skip offload
    bad = subprocess.run(
        [sys.executable, "-m", "kit", "run", "--stages", "0,fsdpx"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2
    assert (
        bad.stderr.strip()
        .splitlines()[-1]
        .endswith("stages: comma-separated integers 0-3 or ddp, fsdp, fsdp-grad-op, got 'fsdpx'")
    )


#: run in the session's shared 2-rank sweep (tests/conftest.py); two measured steps asserted
TWO_RANK_SETUPS = SETUPS


@pytest.fixture(scope="module")
def sweep(two_rank_sweep):
    return two_rank_sweep.results(SETUPS, steps=2)


def steps_of(results, setup, rank):
    cid = config_id(setup)
    return sorted(
        (r for r in results.records if r["config_id"] == cid and r["status"] == "ok" and r["rank"] == rank),
        key=lambda r: r["step"],
    )


@pytest.mark.distributed
def test_measured_model_states_equal_the_estimate_for_all_engines(sweep):
    table = sweep.summary().set_index("label")
    assert set(table["status"]) == {"ok"}, table["error"].dropna().to_dict()
    for setup in SETUPS:
        for rank in range(NPROCS):
            steps = steps_of(sweep, setup, rank)
            assert len(steps) == 2, setup.label
            for record in steps:
                parts = ("parameters", "gradients", "optimizer_states", "buffers")
                measured = {k: record["measured"][k] for k in parts}
                assert measured == {k: record["estimate"][k] for k in parts}, (setup.label, rank)
                assert record["measured_host"] == record["estimate_host"]


@pytest.mark.distributed
def test_every_engine_trains_to_the_same_loss(sweep):
    fp32 = SETUPS[: len(NAMES)]
    reference = [r["loss"] for r in steps_of(sweep, SETUPS[NAMES.index("0")], 0)]
    for setup in fp32:
        losses = [r["loss"] for r in steps_of(sweep, setup, 0)]
        assert losses == pytest.approx(reference, rel=FP32_LOSS_RTOL), setup.label


@pytest.mark.distributed
def test_bytes_sent_per_step_match_the_prediction(sweep):
    """DDP all-reduces 2x the model, FSDP sends 3x per micro-step (2x without the backward all-gather);
    the ZeRO stages as DeepSpeed's comms logger sees them, give or take a few scalars (gradient norms)."""
    for setup in SETUPS:
        record = steps_of(sweep, setup, 0)[-1]
        assert abs(record["comm_wire_bytes"] - record["estimate_comm_wire_bytes"]) <= SCALARS, setup.label
    ddp, fsdp = (steps_of(sweep, variant(n), 0)[-1] for n in ("ddp", "fsdp"))
    assert set(ddp["comm_bytes"]) == {"all_reduce"}
    assert set(fsdp["comm_bytes"]) == {"all_gather", "reduce_scatter"}


def test_the_comparison_panel_offers_the_baselines_beside_the_stages():
    from kit.lab.comparison_panel import ComparisonPanel

    panel = ComparisonPanel(stages=("ddp", "fsdp", 3))
    panel.offload_optimizer.value = True
    assert [s.label.split(" bf16")[0] for s in panel.setups] == ["ddp", "fsdp", "z3", "z3 opt-off"]
    assert [s.zero.engine for s in panel.setups] == ["ddp", "fsdp", "deepspeed", "deepspeed"]
    assert list(panel.stages.options) == ["ddp", "fsdp", "fsdp-grad-op", 0, 1, 2, 3]


@pytest.mark.distributed
def test_the_engines_table_and_advice_come_from_the_measurements(sweep):
    from kit.lab.engine_report import advice, engines_table

    table = engines_table(sweep).set_index("configuration")
    assert list(table["engine"])[: len(NAMES)] == [
        "PyTorch ddp", "PyTorch fsdp", "PyTorch fsdp-grad-op", *(f"DeepSpeed ZeRO-{s}" for s in range(4)),
    ]  # fmt: skip
    assert (table["held MiB"] == table["estimate MiB"]).all()
    ddp, z0 = table.loc["ddp fp32 mb2 gas2"], table.loc["z0 fp32 mb2 gas2"]
    assert ddp["held MiB"] / z0["held MiB"] == pytest.approx(20 / 16)  # DDP's buckets: 4 B more per param
    text = advice(sweep)
    assert f"{ddp['held MiB'] / z0['held MiB']:.3g}x the bytes held" in text  # 1.25x
    assert "fsdp fp32 mb2 gas2 vs z3 fp32 mb2 gas2" in text and "fsdp-grad-op fp32 mb2 gas2 vs z2" in text


def test_zerokit_estimate_takes_a_baseline_as_its_stage():
    out = subprocess.run(
        [sys.executable, "-m", "kit", "estimate", "--model", "llama-2-7b", "--stage", "fsdp", "--nodes", "2",
         "--gpus-per-node", "8", "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    setup = Setup.model_validate(result["setup"])
    assert (setup.zero.engine, setup.zero.stage) == ("fsdp", 3)
    padded, _, _ = baselines.shard_elements(setup, 0)
    assert result["components"]["parameters"] == result["components"]["gradients"] == 4 * padded
    assert result["components"]["optimizer_states"] == 8 * padded


def test_the_planner_prices_ddp_and_fsdp_beside_zero():
    from kit.planning import plan

    llama = Setup(model=preset("llama-2-7b"), batch={"micro_batch": 1})
    found = plan.search(llama, gpus=["H100-SXM-80GB"], checkpointing=(False,), train_batch=256, max_nodes=2)
    table = found.table
    assert set(table.engine) == {"deepspeed", "ddp", "fsdp"}
    assert not (table[table.gpus == 1].engine != "deepspeed").any()  # one GPU: nothing to replicate
    for i in table[table.engine != "deepspeed"].index[:6]:
        setup = found.setup(i)
        assert setup.label in table.loc[i, "label"]
        assert table.loc[i, "per_gpu_gib"] * 2**30 == pytest.approx(estimate.estimate(setup).per_gpu_bytes)
    fsdp = table[(table.engine == "fsdp") & (table.stage == 3) & (table.gpus == 16)].iloc[0]
    z3 = table[(table.engine == "deepspeed") & (table.stage == 3) & (table.gpus == 16) & (table.zeropp == "")]
    z3 = z3[(z3.offload_optimizer == "none") & (z3.micro_batch == fsdp.micro_batch)].iloc[0]
    assert fsdp.comm_inter_gib == pytest.approx(z3.comm_inter_gib, rel=1e-3)  # both move 3 (N-1)/N M
