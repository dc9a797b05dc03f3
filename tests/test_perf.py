"""The step-time model (kit.steptime.perf): each part equals its formula, and the rules behind them hold."""

import math

import pytest

from kit import models
from kit.gpus import gpu, network
from kit.schema import Setup
from kit.steptime import calibrated, kernels, perf
from kit.steptime.comm import collective_calls, collectives, comm_bytes


def llama(**zero) -> Setup:
    return Setup(
        model=models.preset("llama-2-7b"),
        cluster={"nodes": 1, "gpus_per_node": 8},
        zero={"stage": 2, **zero},
        batch={"micro_batch": 2, "grad_accum": 4, "seq_len": 4096},
    )


def test_compute_is_k_micro_steps_of_the_kernels_roofline():
    s = llama()
    t = perf.step_time(s)
    hw = perf.hardware(s)
    micro = kernels.block_seconds(kernels.work(s), hw.peak_tflops, hw.memory_gbps, hw.sms, 0.8)
    assert t.compute.seconds == pytest.approx(4 * micro, rel=1e-12)  # grad_accum 4
    # a large-shape step is bound by its FLOPs: above them at peak x efficiency, below 1.4x (flash attention
    # runs at FLASH_EFFICIENCY, the elementwise ops at the memory bandwidth)
    flops = kernels.work(s).flops * 4
    assert flops / (989e12 * 0.8) < t.compute.seconds < 1.4 * flops / (989e12 * 0.8)
    recompute = perf.step_time(llama(activation_checkpointing=True))
    assert 1.25 < recompute.compute.seconds / t.compute.seconds < 4 / 3  # one more forward, not the head's
    slower = perf.step_time(s, assume=perf.with_assumptions(efficiency=0.4))
    assert 1.6 < slower.compute.seconds / t.compute.seconds < 2  # only the matmuls slow down


def test_flops_count_the_causal_half_of_flash_attention_and_all_of_eager():
    s = llama()
    m = s.model
    per_token, formula = perf.flops_per_token(s)
    assert per_token == 6 * m.params + 6 * m.layers * m.hidden * 4096 and "causal" in formula
    gpt = s.replace(model=models.preset("gpt2-xl"), batch={"seq_len": 1024})
    per_token, formula = perf.flops_per_token(gpt)
    assert per_token == 6 * gpt.model.params + 12 * 48 * 1600 * 1024 and "causal" not in formula
    assert kernels.attention(m) == "sdpa" and kernels.attention(gpt.model) == "eager"


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


def test_comm_crosses_nvlink_or_the_nodes_nics_and_hides_only_where_the_engine_overlaps():
    s = llama(stage=3)
    inside = perf.step_time(s)
    sent, calls = comm_bytes(s)[0], sum(n for _, n, _ in collective_calls(s))
    latency = calls * (perf.CALL_US + perf.HOP_US * 7) * 1e-6
    nvlink = gpu(s.cluster.gpu).interconnect_gbps / 2 * 0.8e9
    assert inside.comm.seconds == pytest.approx(sent / nvlink + latency)
    across = s.replace(cluster={"nodes": 2, "interconnect": "ethernet"})
    t = perf.step_time(across)
    node = network("ethernet").gbytes_per_node  # NCCL's rings: one per NIC, the node's NICs together
    latency = sum(n for _, n, _ in collective_calls(across)) * (10 + 15 + 4) * 1e-6
    assert t.comm.seconds == pytest.approx(comm_bytes(across)[0] / (node * 0.8e9) + latency)
    # stage 3 (overlap_comm) hides all but the persistent gather behind forward and backward
    hideable, window, _ = perf.overlapped(across)
    assert window == 1 and 0.999 < hideable < 1
    assert t.exposed_comm.seconds == pytest.approx(
        t.comm.seconds - 0.8 * min(hideable * t.comm.seconds, t.compute.seconds)  # NCCL takes SMs: 0.8
    )
    stage2 = perf.step_time(llama())
    assert stage2.exposed_comm.seconds == stage2.comm.seconds  # overlap_comm is off at stages 0-2
    hidden = perf.step_time(llama(overlap_comm=True))  # the reductions (8 of 9 M) behind backward
    assert perf.overlapped(llama(overlap_comm=True))[:2] == (8 / 9, 2 / 3)
    hidden_s = 0.8 * min(8 / 9 * hidden.comm.seconds, 2 / 3 * hidden.compute.seconds)
    assert hidden.exposed_comm.seconds == pytest.approx(hidden.comm.seconds - hidden_s, rel=1e-6)
    assert perf.overlapped(llama(stage=0))[0] == 0  # stage 0 all-reduces after backward
    parts = (t.compute, t.exposed_comm, t.optimizer, t.offload)
    assert t.step_s == pytest.approx(sum(part.seconds for part in parts))
    part = sum(-(-n // 16) for n in models.tensor_numels(s.model))  # stage 3: each tensor split 16 ways
    adam = (28 + 2) * part / (gpu(s.cluster.gpu).memory_bw_gbps * 1e9)
    tensors = len(models.tensor_numels(s.model))  # the host launches stage 3's 10 ops per tensor meanwhile
    assert t.optimizer.seconds == pytest.approx(max(adam, tensors * 10 * kernels.HOST_US_PER_OP * 1e-6))
    offloaded = perf.step_time(llama(offload_optimizer="cpu")).optimizer  # Adam on the CPU: the host's ops
    assert offloaded.seconds == pytest.approx(tensors * 24 * kernels.HOST_US_PER_OP * 1e-6)


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
    assert "roofline" in parts["compute"]["formula"] and "989 TFLOP/s" in parts["compute"]["formula"]
    assert (
        "(N-1)/N M_g x k=4" in parts["comm"]["formula"]
        and "M_p" in parts["comm"]["formula"]
        and "behind forward and backward" in parts["exposed_comm"]["formula"]
    )
    assert "CPU Adam" in parts["offload"]["formula"]


def calibration(**changes):
    from kit.steptime.calibration import Calibration, EngineCost, Link, model_text

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
    from kit.toys import TOY_ZERO

    return Setup(
        model=models.toy_spec(),
        cluster={"gpus_per_node": 2},
        zero={**TOY_ZERO, "precision": "fp32", **zero},
        batch={"micro_batch": 3, "grad_accum": 2, "seq_len": 64},
    )


def test_a_calibration_replaces_the_datasheet_term_by_term():
    from kit.estimate import partition

    cal, s = calibration(), toy(stage=3)
    t = calibrated.step_time(s, calibration=cal)
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
    t = calibrated.step_time(s, calibration=cal)
    from kit.estimate import partition

    part = partition.partition_numel(s)
    down, up = 4 * part * 2, 4 * part  # gradients every micro-step at stage 2, parameters once
    assert t.offload.seconds == pytest.approx(down / 4e9 + up / 5e9 + part * 3e-8)
    assert t.optimizer.seconds == 0
    assert "engine z2" in t.fixed.formula  # not calibrated with offload: the stage's own costs
    assert "engine none" in calibrated.step_time(toy(stage=1), calibration=cal).fixed.formula


def test_what_a_calibration_did_not_measure_is_said_where_its_step_time_is():
    """Another precision, model or engine than the calibration measured: its rates and fixed costs are
    carried over, and the step time's label says which (micro batch and ranks are modelled: not listed)."""
    cal = calibration()
    assert cal.carried_over(toy(stage=2)) == []
    assert calibrated.step_time(toy(stage=2), calibration=cal).calibration == cal.label
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
    assert calibrated.step_time(other, calibration=cal).calibration == (
        f"{cal.label}; carried over, not measured: {'; '.join(cal.carried_over(other))}"
    )
    assert cal.carried_over(toy(stage=2, offload_optimizer="cpu")) == ["engine z2+offload (z2 measured)"]
    # what a calibration of one node's ranks cannot have measured comes from datasheets, and says so
    two_nodes = toy(stage=2).replace(cluster={"nodes": 2})
    assert calibrated.step_time(two_nodes, calibration=cal).calibration == (
        f"{cal.label}; from datasheets: bandwidth across nodes (the network's figure)"
    )
    assert cal.label_for(toy(stage=2), across_nodes=True).endswith("across nodes (the network's figure)")


def test_ranks_beyond_the_cores_share_them():
    cal = calibration()
    assert cal.share(2) == (1.0, 1.0)
    assert cal.share(4) == (2.0, 2.0)  # 4 ranks of one thread on 2 cores
    assert cal.share(1) == (0.5, 1.0)  # one rank gets both cores' threads for its matmuls
    assert calibration(accelerator="cuda").share(8) == (1.0, 1.0)
    s = toy(stage=2).replace(cluster={"gpus_per_node": 4})
    two = calibrated.step_time(toy(stage=2), calibration=cal)
    four = calibrated.step_time(s, calibration=cal)
    assert four.compute.seconds == pytest.approx(2 * two.compute.seconds)


def test_calibration_file_round_trip(tmp_path):
    from kit.steptime.calibration import Calibration

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
    t = calibrated.step_time(s, calibration=cal)
    sent = comm_bytes(s)[0]
    assert t.comm.seconds == pytest.approx(sent / (perf.hardware(s).intra_gbps * 0.8e9))
    assert t.compute.seconds == pytest.approx(
        4 * (perf.flops_per_token(s)[0] * 2 * 4096 / 0.05e12 + 0.004 * 33 / 3)
    )
