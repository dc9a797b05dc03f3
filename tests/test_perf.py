"""The step-time model (kit.estimate.perf): each part equals its formula, and the rules behind them hold."""

import math

import pytest

from kit import models
from kit.estimate import perf
from kit.estimate.comm import collective_calls, collectives, comm_bytes
from kit.gpus import gpu, network
from kit.schema import Setup


def llama(**zero) -> Setup:
    return Setup(
        model=models.preset("llama-2-7b"),
        cluster={"nodes": 1, "gpus_per_node": 8},
        zero={"stage": 2, **zero},
        batch={"micro_batch": 2, "grad_accum": 4, "seq_len": 4096},
    )


def test_compute_is_flops_over_peak_times_efficiency():
    s = llama()
    m = s.model
    per_token = 6 * m.params + 12 * m.layers * m.hidden * 4096  # matmuls + attention scores (PaLM)
    t = perf.step_time(s)
    assert t.compute.seconds == pytest.approx(per_token * 2 * 4 * 4096 / (989e12 * 0.4), rel=1e-12)
    recompute = perf.step_time(llama(activation_checkpointing=True))
    assert recompute.compute.seconds / t.compute.seconds == pytest.approx(4 / 3)  # one more forward
    slower = perf.step_time(s, assume=perf.with_assumptions(efficiency=0.2))
    assert slower.compute.seconds == pytest.approx(2 * t.compute.seconds)


@pytest.mark.parametrize(
    ("stage", "grad_accum", "ratio"),
    [(0, 1, 1.0), (1, 1, 1.5), (2, 1, 1.5), (3, 1, 1.5), (1, 4, 1.5), (2, 4, 4.5), (3, 4, 6.0)],
)
def test_comm_bytes_per_stage_against_stage_0(stage, grad_accum, ratio):
    """Stage 0's all-reduce moves 2 M at the boundary; stages 1-2 add the parameter all-gather (DeepSpeed
    all-reduces the buckets: 1.5x, as measured); stage 2 reduces every micro-step, stage 3 moves 3 M each
    (its norms, kept whole below the persistence threshold, are gathered once a step: 1e-5 of M)."""
    base = llama(stage=0).replace(batch={"micro_batch": 2, "grad_accum": grad_accum})
    s = base.replace(zero={"stage": stage})
    m, n = 2 * s.model.params, s.dp
    assert comm_bytes(base)[0] == round(2 * (n - 1) / n * m)
    assert comm_bytes(s)[0] / comm_bytes(base)[0] == pytest.approx(ratio, rel=1e-4 if stage == 3 else 1e-9)
    one = s.replace(cluster={"gpus_per_node": 1})
    assert comm_bytes(one)[0] == 0 and perf.step_time(one).comm.seconds == 0


def test_comm_uses_the_slowest_link_and_overlap_hides_a_share():
    s = llama(stage=3)
    inside = perf.step_time(s)
    sent = comm_bytes(s)[0]
    assert inside.comm.seconds == pytest.approx(sent / (gpu(s.cluster.gpu).interconnect_gbps / 2 * 0.8e9))
    across = s.replace(cluster={"nodes": 2, "interconnect": "ethernet"})
    t = perf.step_time(across)
    per_gpu = network("ethernet").gbytes_per_node / 8
    assert t.comm.seconds == pytest.approx(comm_bytes(across)[0] / (per_gpu * 0.8e9))
    assert t.exposed_comm.seconds == pytest.approx(0.5 * t.comm.seconds)  # stage 3 overlaps by default
    stage2 = perf.step_time(llama())
    assert stage2.exposed_comm.seconds == stage2.comm.seconds  # overlap_comm is off at stages 0-2
    hidden = perf.step_time(llama(overlap_comm=True))
    assert hidden.exposed_comm.seconds == pytest.approx(0.5 * hidden.comm.seconds)
    parts = (t.compute, t.exposed_comm, t.optimizer, t.offload)
    assert t.step_s == pytest.approx(sum(part.seconds for part in parts))
    part = sum(-(-n // 16) for n in models.tensor_numels(s.model))  # stage 3: each tensor split 16 ways
    assert t.optimizer.seconds == pytest.approx((28 + 2) * part / (gpu(s.cluster.gpu).memory_bw_gbps * 1e9))
    assert perf.step_time(llama(offload_optimizer="cpu")).optimizer.seconds == 0  # stepped on the CPU


def test_offload_moves_the_partition_over_pcie_and_steps_adam_on_the_cpu():
    s = llama(offload_optimizer="cpu")
    t = perf.step_time(s)
    part = -(-s.model.params // 16) * 2  # stage 2's padded partition per rank
    pcie = 2 * part * (4 + 1) / (64 * 0.8e9)  # 4 gradient copies + 1 parameter copy, bf16, Gen5 x16
    adam = (28 + 2) * part * 8 / 300e9
    assert t.offload.seconds == pytest.approx(pcie + adam)
    assert perf.step_time(llama()).offload.seconds == 0
    params = perf.step_time(llama(stage=3, offload_optimizer="cpu", offload_param="cpu"))
    assert params.offload.seconds > perf.step_time(llama(stage=3, offload_optimizer="cpu")).offload.seconds


def test_run_time_and_cost():
    t = perf.step_time(llama())
    run = t.run(1e9, usd_per_gpu_hour=2.0)
    steps = math.ceil(1e9 / (2 * 8 * 4 * 4096))
    assert run["steps"] == steps
    assert run["hours"] == pytest.approx(steps * t.step_s / 3600)
    assert run["cost_usd"] == pytest.approx(run["hours"] * 8 * 2.0)
    assert t.tokens_per_s == pytest.approx(2 * 8 * 4 * 4096 / t.step_s)


def test_bad_assumptions_and_hardware_name_the_field():
    with pytest.raises(ValueError, match="^efficiency: must be in"):
        perf.Assumptions(efficiency=0)
    with pytest.raises(ValueError, match="^overlap: must be in"):
        perf.with_assumptions(overlap=1.5)
    with pytest.raises(ValueError, match="^speed: not an assumption"):
        perf.with_assumptions(speed=2)
    with pytest.raises(ValueError, match="^precision: the V100-SXM2-16GB has no bf16"):
        perf.hardware(llama().replace(cluster={"gpu": "V100-SXM2-16GB"}))
    with pytest.raises(ValueError, match="^network: unknown network 'wifi'"):
        perf.hardware(llama(), "wifi")


def test_every_formula_is_shown():
    parts = perf.step_time(llama(stage=3, offload_optimizer="cpu")).to_dict()["parts"]
    assert "12 L h s" in parts["compute"]["formula"] and "989 TFLOP/s" in parts["compute"]["formula"]
    assert (
        "(N-1)/N M_g x k=4" in parts["comm"]["formula"]
        and "M_p" in parts["comm"]["formula"]
        and "overlap_comm" in parts["exposed_comm"]["formula"]
    )
    assert "CPU Adam" in parts["offload"]["formula"]


def calibration(**changes):
    from kit.estimate.calibration import Calibration, EngineCost, Link, model_text

    fields = dict(
        device="cpu", accelerator="cpu", backend="gloo", ranks=2, cores=2, threads_per_rank=1,
        model=model_text(models.toy_spec()), layers=2, tensors=28, precision="fp32", tflops=0.05,
        micro_fixed_s=0.004,
        adam_s_per_param=2e-8, host_adam_s_per_param=3e-8, to_host_gbps=4.0, to_device_gbps=5.0,
        collectives={
            "all_reduce": Link(3e-4, 0.7), "all_gather": Link(5e-4, 0.3), "reduce_scatter": Link(1e-3, 0.5)
        },
        engines={
            "z2": EngineCost(2e-4, 1e-4), "z3": EngineCost(1e-4, 3e-4), "z3+offload": EngineCost(5e-4, 0)
        },
        created="2026-01-01T00:00:00+00:00", host="here", versions={"torch": "t", "deepspeed": "d"},
    )  # fmt: skip
    return Calibration(**{**fields, **changes})


def toy(**zero) -> Setup:
    from kit.run.sweep import TOY_ZERO

    return Setup(
        model=models.toy_spec(),
        cluster={"gpus_per_node": 2},
        zero={**TOY_ZERO, "precision": "fp32", **zero},
        batch={"micro_batch": 3, "grad_accum": 2, "seq_len": 64},
    )


def test_a_calibration_replaces_the_datasheet_term_by_term():
    from kit.estimate import partition

    cal, s = calibration(), toy(stage=3)
    t = perf.step_time(s, calibration=cal)
    per_token = perf.flops_per_token(s)[0]
    blocks = s.model.layers + 1
    compute = 2 * (per_token * 3 * 64 / 0.05e12 + 0.004 * blocks / 3)
    assert t.compute.seconds == pytest.approx(compute)
    calls = {op: n for op, n, _ in collective_calls(s)}
    big = sum(1 for n in partition.numels(s) if n > s.zero.param_persistence_threshold)
    assert calls["all_gather"] == 2 * 2 * big + 1  # forward and backward per tensor, the persistent once
    links = cal.collectives
    by_op = {"forward all-gather": "all_gather", "backward all-gather": "all_gather"}
    by_op |= {"persistent all-gather": "all_gather", "gradient reduce-scatter": "reduce_scatter"}
    bandwidth = sum(c.bytes / (links[by_op[c.name]].bus_gbps * 1e9) for c in collectives(s))
    latency = sum(n * links[op].latency_s for op, n, _ in collective_calls(s))
    assert t.comm.seconds == pytest.approx(bandwidth + latency)
    assert t.exposed_comm.seconds == t.comm.seconds  # gloo blocks: overlap_comm hides nothing on CPU
    tensors = len(partition.numels(s))
    assert t.fixed.seconds == pytest.approx(tensors * (1e-4 + 2 * 3e-4))
    assert t.optimizer.seconds == pytest.approx(partition.partition_numel(s) * 2e-8)
    assert t.step_s == pytest.approx(sum(p.seconds for p in (t.compute, t.comm, t.optimizer, t.fixed)))
    assert t.to_dict()["calibration"] == cal.label and "engine z3" in t.fixed.formula
    assert perf.step_time(s).to_dict()["calibration"] == "uncalibrated"
    assert perf.step_time(s).fixed.seconds == 0


def test_a_calibration_offload_and_engine_fallback():
    cal = calibration()
    s = toy(stage=2, offload_optimizer="cpu")
    t = perf.step_time(s, calibration=cal)
    from kit.estimate import partition

    part = partition.partition_numel(s)
    down, up = 4 * part * 2, 4 * part  # gradients every micro-step at stage 2, parameters once
    assert t.offload.seconds == pytest.approx(down / 4e9 + up / 5e9 + part * 3e-8)
    assert t.optimizer.seconds == 0
    assert "engine z2" in t.fixed.formula  # not calibrated with offload: the stage's own costs
    assert "engine none" in perf.step_time(toy(stage=1), calibration=cal).fixed.formula


def test_what_a_calibration_did_not_measure_is_said_where_its_step_time_is():
    """Another precision, model or engine than the calibration measured: its rates and fixed costs are
    carried over, and the step time's label says which (micro batch and ranks are modelled: not listed)."""
    cal = calibration()
    assert cal.carried_over(toy(stage=2)) == []
    assert perf.step_time(toy(stage=2), calibration=cal).calibration == cal.label
    assert (
        cal.carried_over(toy(stage=2).replace(batch={"micro_batch": 1}, cluster={"gpus_per_node": 4})) == []
    )
    other = toy(stage=1, precision="bf16").replace(model=models.override(models.toy_spec(), {"layers": 4}))
    assert cal.carried_over(other) == [
        "precision bf16 (the calibration measured fp32)",
        f"model gpt2 4 x {other.model.hidden}, {other.model.params:,} parameters (the calibration measured "
        f"{cal.model})",
        "engine z1 (no fixed costs)",
    ]
    assert perf.step_time(other, calibration=cal).calibration == (
        f"{cal.label}; carried over, not measured: {'; '.join(cal.carried_over(other))}"
    )
    assert cal.carried_over(toy(stage=2, offload_optimizer="cpu")) == ["engine z2+offload (z2 measured)"]


def test_ranks_beyond_the_cores_share_them():
    cal = calibration()
    assert cal.share(2) == (1.0, 1.0)
    assert cal.share(4) == (2.0, 2.0)  # 4 ranks of one thread on 2 cores
    assert cal.share(1) == (0.5, 1.0)  # one rank gets both cores' threads for its matmuls
    assert calibration(accelerator="cuda").share(8) == (1.0, 1.0)
    s = toy(stage=2).replace(cluster={"gpus_per_node": 4})
    two = perf.step_time(toy(stage=2), calibration=cal)
    four = perf.step_time(s, calibration=cal)
    assert four.compute.seconds == pytest.approx(2 * two.compute.seconds)


def test_calibration_file_round_trip(tmp_path):
    from kit.estimate.calibration import Calibration

    cal = calibration()
    cal.save(tmp_path / "c.json")
    assert Calibration.load(tmp_path / "c.json") == cal
    (tmp_path / "bad.json").write_text('{"kind": "other"}')
    with pytest.raises(ValueError, match="^kind: not a zerokit calibration"):
        Calibration.load(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="^tflops: a measured rate must be > 0"):
        calibration(tflops=0)
    assert calibration(device="NVIDIA H200").gpus(["H100-SXM-80GB", "H200-SXM-141GB"]) == ["H200-SXM-141GB"]


def test_a_calibration_of_one_gpu_takes_the_links_from_the_datasheet():
    cal = calibration(device="NVIDIA H100 80GB HBM3", accelerator="cuda", backend="nccl", ranks=1)
    cal = calibration(**{**cal.__dict__, "collectives": {}})
    s = llama()
    t = perf.step_time(s, calibration=cal)
    sent = comm_bytes(s)[0]
    assert t.comm.seconds == pytest.approx(sent / (perf.hardware(s).intra_gbps * 0.8e9))
    assert t.compute.seconds == pytest.approx(
        4 * (perf.flops_per_token(s)[0] * 2 * 4096 / 0.05e12 + 0.004 * 33 / 3)
    )
