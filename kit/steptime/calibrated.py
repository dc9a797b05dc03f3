"""The step time from a calibration (``zerokit calibrate --measure``): each term a rate measured on this
machine's ranks instead of a datasheet's, plus the engine's fixed costs per parameter tensor.

On CPU ranks it predicts CPU runs. It does not carry to a GPU: a CPU's matmul rate, gloo's latency and the
engine's bookkeeping on a core shared with the compute are not a GPU's. What carries are the shapes and
the counts (FLOPs, bytes on the wire, collective calls, parameter tensors), which ``kit.steptime.perf``'s
datasheet model prices on the GPU instead.
"""

from __future__ import annotations

from kit.estimate import partition
from kit.rules import Offload, element_bytes
from kit.schema import Setup
from kit.steptime import perf
from kit.steptime.calibration import Calibration, Link, engine_key
from kit.steptime.comm import TIMED_AS, collective_calls, collectives, comm_bytes
from kit.steptime.perf import (
    Assumptions,
    Hardware,
    Part,
    StepTime,
    _g,
    _swap_s,
    flops_per_token,
    hardware,
    nvme_traffic,
)  # fmt: skip


def step_time(
    setup: Setup,
    hw: Hardware | None = None,
    assume: Assumptions | None = None,
    calibration: Calibration | None = None,
) -> StepTime:
    """``calibrated`` with a calibration, else the datasheet's ``perf.step_time``."""
    if calibration is None:
        return perf.step_time(setup, hw, assume)
    return calibrated(setup, calibration, hw, assume)


def calibrated(
    setup: Setup, cal: Calibration, hw: Hardware | None = None, assume: Assumptions | None = None
) -> StepTime:
    """``step_time`` from a calibration: each term a measured rate, plus the engine's fixed costs.

    x = ``Calibration.stretch`` of each term (CPU ranks sharing cores: 1 - b + b s, b the term's measured
    busy share over the compute passes', s the ranks' slowdown on the cores), k = micro-steps,
    B = blocks (layers + 1), n = tensors: compute = k (FLOPs / tflops + micro_fixed_s B / B_cal) x;
    communication = sum over collectives of (bytes / bus_gbps + calls x latency x (N-1)/(N_m-1)) x of
    that collective, its links those measured on N_m ranks (``Calibration.links``: the most ranks up to
    N; x stretches from N_m ranks); optimizer = P x adam_s_per_param x; offload = (the bytes of
    ``_offload`` over the measured copies) x + P x host_adam_s_per_param x (NVMe from ``hw``); bytes
    across nodes at most over the fabric's datasheet bandwidth per GPU (``hw``, x
    ``assume.link_efficiency``); fixed = n (step_s_per_tensor + k micro_step_s_per_tensor) x, of this
    engine as calibrated. A calibration of one
    rank has no links: the datasheet's intra-node bandwidth x ``assume.link_efficiency``, no latency. On a GPU
    ``overlap_comm`` hides ``assume.overlap`` of the communication; gloo's CPU collectives block, so on
    a CPU machine nothing.
    """
    assume = assume or Assumptions()
    b, c, z, m = setup.batch, setup.cluster, setup.zero, setup.model
    k, g = b.grad_accum, c.gpus_per_node
    per_token, how = flops_per_token(setup)
    flops = per_token * b.micro_batch * b.seq_len
    blocks, cal_blocks = (m.layers or 0) + 1, cal.layers + 1
    x, shared = cal.stretch(g, "compute")
    compute = Part(
        k * (flops / (cal.tflops * 1e12) + cal.micro_fixed_s * blocks / cal_blocks) * x,
        f"k={k} x (({how}) x {b.micro_batch * b.seq_len:,} tokens / {cal.tflops * 1e3:.3g} GFLOP/s + "
        f"{cal.micro_fixed_s * 1e3:.3g} ms x {blocks}/{cal_blocks} blocks) {shared}",
    )
    sent = comm_bytes(setup)[0]
    # across nodes the calibration's links do not reach: the fabric's datasheet bandwidth per GPU
    across = (hw or hardware(setup)).inter_gbps * assume.link_efficiency / g if c.nodes > 1 else 0
    datasheet = Link(0.0, (hw or hardware(setup)).intra_gbps * assume.link_efficiency)
    by_op: dict[str, tuple[float, list[str]]] = {}  # per measured collective: seconds and their formula

    def add(op: str, took: float, formula: str) -> None:
        before, why = by_op.get(op, (0.0, []))
        by_op[op] = (before + took, [*why, formula])

    on = cal.links(setup.zero_dp)[0]  # the ranks the links were measured on
    for part in collectives(setup):
        op = TIMED_AS.get(part.name, "all_reduce")
        gbps = (cal.link(op, on) or datasheet).bus_gbps
        gbps = min(gbps, across) if part.scope == "inter" and across else gbps
        add(op, part.bytes / (gbps * 1e9), f"{part.bytes:,} B / {gbps:.3g} GB/s")
    hops = (setup.zero_dp - 1) / max(1, on - 1)
    for op, calls, formula in collective_calls(setup):
        latency = (cal.link(op, on) or datasheet).latency_s
        add(op, calls * latency * hops, f"{calls} {op} ({formula}) x {latency * 1e6:,.4g} us x {hops:.3g}")
    seconds, why = 0.0, []
    for op, (took, formulas) in by_op.items():
        x, shared = cal.stretch(g, "comm", op, against=on)
        seconds += took * x
        why.append(f"{op}: ({' + '.join(formulas)}) {shared}")
    comm = Part(seconds, "; ".join(why) if why else "one rank: no communication")
    hidden = assume.overlap if z.overlap and cal.accelerator != "cpu" else 0.0
    exposed = Part(comm.seconds * (1 - hidden), f"{1 - hidden:g} x communication")
    numel = partition.partition_numel(setup)
    if z.offload_optimizer is Offload.NONE:
        x, shared = cal.stretch(g, "adam")
        optimizer = Part(
            numel * cal.adam_s_per_param * x,
            f"P ({numel:,}) x {cal.adam_s_per_param * 1e9:.3g} ns Adam {shared}",
        )
    else:
        optimizer = Part(0.0, "on the host (offload)")
    offload = _calibrated_offload(setup, cal, hw)
    key = engine_key(z.stage, z.engine, z.offload_optimizer, z.offload_param)
    cost, which = cal.engine(key)
    n = len(partition.numels(setup))
    x, shared = cal.stretch(g, "fixed", which)
    fixed = Part(
        n * (cost.step_s_per_tensor + k * cost.micro_step_s_per_tensor) * x,
        f"n={n} tensors x ({cost.step_s_per_tensor * 1e6:.3g} us per step + k={k} x "
        f"{cost.micro_step_s_per_tensor * 1e6:.3g} us per micro-step) {shared}, engine {which}",
    )
    measured_link = cal.link("all_reduce") or datasheet
    hw = Hardware(
        name=f"{cal.device}, {cal.backend} (calibrated)",
        peak_tflops=cal.tflops,
        intra_gbps=measured_link.bus_gbps,
        inter_gbps=measured_link.bus_gbps,
        host_gbps=cal.to_device_gbps,
        memory_gbps=0.0,
        source=cal.label,
    )
    label = cal.label_for(setup)
    return StepTime(setup, hw, assume, compute, comm, exposed, optimizer, offload, sent, fixed, label)


def _calibrated_offload(setup: Setup, cal: Calibration, hw: Hardware | None) -> Part:
    z, k = setup.zero, setup.batch.grad_accum
    if not z.offloaded:
        return Part(0.0, "no offload")
    p, part = element_bytes(z.precision), partition.partition_numel(setup)
    down = up = 0
    if z.offload_optimizer is not Offload.NONE:
        down += p * part * (k if z.stage >= 2 else 1)  # gradients to the host
        up += p * part  # updated parameters back
    if z.offload_param is not Offload.NONE:
        up += 2 * k * p * part
    x, shared = cal.stretch(setup.cluster.gpus_per_node, "copy")
    seconds = (down / (cal.to_host_gbps * 1e9) + up / (cal.to_device_gbps * 1e9)) * x
    formula = f"({down:,} B to host / {cal.to_host_gbps:.3g} GB/s + {up:,} B to device / "
    formula += f"{cal.to_device_gbps:.3g} GB/s) {shared}"
    if z.offload_optimizer is not Offload.NONE:
        x, shared = cal.stretch(setup.cluster.gpus_per_node, "adam")
        seconds += part * cal.host_adam_s_per_param * x
        formula += f" + P ({part:,}) x {cal.host_adam_s_per_param * 1e9:.3g} ns host Adam {shared}"
    if z.nvme:
        swap = _nvme(setup, hw or hardware(setup))
        seconds, formula = seconds + swap.seconds, f"{formula} + {swap.formula} (datasheet)"
    return Part(seconds, formula)


def _nvme(setup: Setup, hw: Hardware) -> Part:
    """The swap files' reads and writes per step over the node's drives (``nvme_traffic``)."""
    swap = nvme_traffic(setup)
    g = setup.cluster.gpus_per_node
    read, write = g * swap["read"].bytes, g * swap["write"].bytes
    return Part(
        _swap_s(read, write, hw),
        f"NVMe: {g} GPUs x ({swap['read'].formula}) read / {_g(hw.nvme_read_gbps)} GB/s + {g} GPUs x "
        f"({swap['write'].formula}) written / {_g(hw.nvme_write_gbps)} GB/s per node",
    )
