"""The planner's grid (``kit.planning.plan_grid``) against the per-setup path: every column of sampled rows
of ``plan.search`` is what ``estimate``, ``perf.step_time``, ``comm_by_scope`` and ``fit`` say of the row's
Setup (``Plan.setup``), with and without a calibration, and for a batch schedule (estimated whole)."""

import random

import pytest

from kit import models
from kit.estimate import estimate
from kit.fit import fit
from kit.gpus import gpu, prices
from kit.planning import plan
from kit.schema import Setup
from kit.steptime import calibrated, perf
from kit.steptime.calibration import Calibration, EngineCost, Link, engine_key, model_text
from kit.steptime.comm import comm_by_scope
from kit.units import GIB

PRICE = {"H100-SXM-80GB": 5.0}


def h100_calibration() -> Calibration:
    """A calibration measured on an H100 (made-up rates; what matters is that every row uses them)."""
    return Calibration(
        device="NVIDIA H100 80GB HBM3", accelerator="cuda", backend="nccl", ranks=8, cores=64,
        threads_per_rank=1, model="toy", layers=2, tensors=28, precision="bf16", tflops=400.0,
        micro_fixed_s=0.004, adam_s_per_param=2e-11, host_adam_s_per_param=3e-9, to_host_gbps=20.0,
        to_device_gbps=22.0,
        collectives={
            "all_reduce": Link(3e-5, 150.0), "all_gather": Link(2e-5, 160.0),
            "reduce_scatter": Link(2e-5, 155.0),
        },
        engines={
            "z2": EngineCost(2e-6, 1e-6), "z3": EngineCost(1e-6, 3e-6), "z3+offload": EngineCost(5e-6, 0)
        },
        created="2026-01-01T00:00:00+00:00", host="here", versions={"torch": "t", "deepspeed": "d"},
    )  # fmt: skip


def expected_row(found: plan.Plan, i: int, calibration: Calibration | None) -> dict:
    """Row ``i`` of ``found.table`` as the per-setup path computes it from the row's Setup."""
    s = found.setup(i)
    c, z, b, name = s.cluster, s.zero, s.batch, s.cluster.gpu
    est = estimate(s)
    t = calibrated.step_time(s, perf.hardware(s), found.assumptions, calibration)
    run = t.run(found.tokens, PRICE.get(name, prices()[name][0]))
    scope = comm_by_scope(s)
    verdict = fit(  # the screen: what no setup needs less than (the plan confirms what it names)
        name, z.precision, est.screen_bytes, est.cpu_bytes_per_node, c.cpu_ram_per_node_bytes, found.headroom
    )
    return {
        "gpu": name,
        "nodes": c.nodes,
        "gpus_per_node": c.gpus_per_node,
        "gpus": c.world_size,
        "engine": z.engine,
        "stage": z.stage,
        "offload_optimizer": z.offload_optimizer,
        "offload_param": z.offload_param,
        "zeropp": z.zeropp_label,
        "checkpointing": z.activation_checkpointing,
        "micro_batch": b.micro_batch,
        "grad_accum": b.grad_accum,
        "per_gpu_gib": est.screen_bytes / GIB,
        "capacity_gib": gpu(name).memory_bytes / GIB,
        "fits": verdict.ok,
        "flushes": False,
        "confirmed": False,
        "cpu_gib_per_node": est.cpu_bytes_per_node / GIB,
        "nvme_gib_per_node": est.nvme_bytes_per_node / GIB,
        "comm_intra_gib": scope["intra"] / GIB,
        "comm_inter_gib": scope["inter"] / GIB,
        "step_s": t.step_s,
        "tokens_per_s": t.tokens_per_s,
        "hours": run["hours"],
        "cost_usd": run["cost_usd"],
        "label": f"{name} {c.nodes}x{c.gpus_per_node} {s.label}",
    }


def assert_rows_are_the_setups(found: plan.Plan, rows, calibration=None) -> None:
    for i in rows:
        want = expected_row(found, i, calibration)
        row = found.table.loc[i]
        assert list(found.table.columns) == list(want)
        for column, value in want.items():
            if isinstance(value, float):
                assert row[column] == pytest.approx(value, rel=1e-9, abs=0), (i, column)
            else:
                assert row[column] == value, (i, column)


#: DeepSpeed's checkpoints in CPU RAM (``kit.checkpointing``): the rows with checkpointing add them per node
CPU_CHECKPOINTS = {"activation_checkpointing": True, "cpu_checkpointing": True, "partition_activations": True}


@pytest.mark.parametrize(
    ("name", "seq_len", "calibrated", "zero"),
    [
        ("gpt2", 1024, False, {}),
        ("llama-2-7b", 4096, False, CPU_CHECKPOINTS),
        ("gpt2", 1024, True, {}),
        ("llama-2-7b", 4096, True, {}),
    ],
)
def test_sampled_rows_equal_the_per_setup_path(name, seq_len, calibrated, zero):
    base = Setup(model=models.preset(name), zero=zero, batch={"micro_batch": 1, "seq_len": seq_len})
    cal = h100_calibration() if calibrated else None
    found = plan.search(base, train_batch=512, tokens=1e10, price=PRICE, calibration=cal)
    table = found.table
    assert set(table.gpu) == {"H100-SXM-80GB"} if calibrated else len(set(table.gpu)) > 5
    assert len(table) > (300 if calibrated else 3000) and table.fits.any() and not table.fits.all()
    # every variant and cluster size is among the rows checked: the terms shared per cluster and variant
    rows = random.Random(27).sample(list(table.index), 200)
    rows += list(
        table.drop_duplicates(["gpus", "engine", "stage", "offload_optimizer", "offload_param"]).index
    )
    assert_rows_are_the_setups(found, rows, cal)
    if calibrated:  # what the calibration did not measure for this plan, each once: its model, engines
        zs = [found.setup(i).zero for i in rows]
        engines = {engine_key(z.stage, z.engine, z.offload_optimizer, z.offload_param) for z in zs}
        measured, datasheet = found.calibration.split("; from datasheets: ")  # several nodes, NVMe swap
        assert datasheet == "bandwidth across nodes (the network's figure), NVMe swap (the drives' figures)"
        carried = measured.split("; carried over, not measured: ")[1].split("; ")
        assert carried[0] == f"model {model_text(base.model)} (the calibration measured toy)"
        named = [c.split()[1] for c in carried[1:]]  # "engine z1 (no fixed costs)"
        assert set(named) == engines - set(cal.engines) and len(named) == len(set(named))


def test_a_batch_schedule_is_estimated_setup_by_setup():
    schedule = [{"step": 100, "micro_batch": 4, "grad_accum": 1}]
    base = Setup(model=models.preset("gpt2"), batch={"micro_batch": 1, "seq_len": 512, "schedule": schedule})
    found = plan.search(base, train_batch=16, gpus=["H100-SXM-80GB"], max_nodes=2, price=PRICE)
    assert len(found.table) > 50
    assert_rows_are_the_setups(found, found.table.index)
    # the schedule's larger micro batch later on is what decides the memory of a row starting at 1
    first = found.setup(found.table.index[found.table.micro_batch == 1][0])
    assert estimate(first).per_gpu_bytes > estimate(first.at_step(0)).per_gpu_bytes
