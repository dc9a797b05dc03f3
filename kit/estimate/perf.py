"""Step time of a Setup before booking: compute, communication and offload, each with its formula.

A roofline-style model whose every assumption is a named, adjustable number (``Assumptions``) and whose
every hardware figure comes from ``data/`` with its source (``hardware``):

- compute: the FLOPs one GPU executes per optimizer step over peak x ``efficiency``. Per token,
  6 Psi for the matmuls (Kaplan et al. 2020) plus 12 L h s for attention scores (PaLM, Chowdhery et al.
  2022, appendix B); activation checkpointing runs the forward again: + 2 Psi + 4 L h s.
- communication: the bytes one GPU sends per optimizer step under DeepSpeed's ZeRO (``comm_bytes``) over
  the slowest link of its ring, exposed in full unless ``overlap_comm`` hides ``overlap`` of it.
- optimizer: the Adam step on the GPU's partition, bound by the GPU's memory bandwidth (it reads and
  writes every fp32 state once per step); offloaded, it runs on the CPU instead (below).
- offload: gradients down and parameters up over the host link (PCIe), and the CPU Adam step, which is
  bound by the node's memory bandwidth; not overlapped.

``step_time`` is a few microseconds of arithmetic, so ``kit.estimate.plan`` can rank thousands of setups;
``kit.scaleout.calibrate`` compares it with measured step times.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from kit.estimate import partition
from kit.gpus import gpu, network
from kit.rules import FP32, element_bytes
from kit.schema import Setup

#: bytes of memory traffic per parameter in one Adam step: read fp32 parameter, gradient and two moments
#: (16 B), write parameter and moments back (12 B); mixed precision adds the 16-bit copy it writes
ADAM_TRAFFIC_BYTES = 7 * FP32


@dataclass(frozen=True)
class Assumptions:
    """What the model cannot read from a datasheet; every field is shown beside the result."""

    #: achieved / peak TFLOP/s on the FLOPs a GPU executes (PaLM trained at 46% model FLOPs utilisation,
    #: Megatron-LM reports 40-52% of peak on A100s; small models and micro batches reach less)
    efficiency: float = 0.4
    #: achieved / nominal bandwidth of a collective (nccl-tests bus bandwidth is ~80% of the link)
    link_efficiency: float = 0.8
    #: share of communication hidden behind compute when ``overlap_comm`` is on (DeepSpeed's default at
    #: stage 3 only); 0 hides nothing, 1 hides it all
    overlap: float = 0.5
    #: GB/s of one node's memory for the CPU Adam step: a 2-socket DDR5-4800 server (614 GB/s peak) at ~50%
    host_memory_gbps: float = 300.0

    def __post_init__(self) -> None:
        for name in ("efficiency", "link_efficiency"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name}: must be in (0, 1], got {getattr(self, name)!r}")
        if not 0 <= self.overlap <= 1:
            raise ValueError(f"overlap: must be in [0, 1], got {self.overlap!r}")
        if not self.host_memory_gbps > 0:
            raise ValueError(f"host_memory_gbps: must be > 0, got {self.host_memory_gbps!r}")


@dataclass(frozen=True)
class Hardware:
    """The figures the model uses for one GPU type and fabric (GB/s are 1e9 bytes/s, one direction)."""

    name: str
    peak_tflops: float  # per GPU at the training precision
    intra_gbps: float  # one GPU to the others of its node
    inter_gbps: float  # one node to the others, all NICs together
    host_gbps: float  # one GPU to host memory
    memory_gbps: float  # the GPU's own memory
    source: str = ""


def hardware(setup: Setup, fabric: str | None = None) -> Hardware:
    """``setup``'s GPU (data/gpus.csv) and fabric (data/networks.csv; default: the cluster's interconnect)."""
    g = gpu(setup.cluster.gpu)
    net = network(fabric or setup.cluster.interconnect)
    precision = setup.zero.precision
    peak = g.peak_tflops(precision)
    if not peak:
        raise ValueError(f"precision: the {g.name} has no {precision} support; use fp16 or fp32")
    return Hardware(
        name=f"{g.name}, {net.name}",
        peak_tflops=peak,
        intra_gbps=g.interconnect_gbps / 2,  # the datasheet adds both directions
        inter_gbps=net.gbytes_per_node,
        host_gbps=g.host_link_gbps,
        memory_gbps=g.memory_bw_gbps,
        source=f"{g.name}: {g.source}; {net.name}: {net.source}",
    )


@dataclass(frozen=True)
class Part:
    """Seconds per optimizer step of one part of the step, and how they were computed."""

    seconds: float
    formula: str


@dataclass(frozen=True)
class StepTime:
    setup: Setup
    hardware: Hardware
    assumptions: Assumptions
    compute: Part
    comm: Part  # all communication, hidden or not
    exposed_comm: Part  # what the step waits for
    optimizer: Part  # the optimizer step on the GPU (zero when offloaded)
    offload: Part
    comm_bytes: int  # sent by one GPU per optimizer step

    @property
    def step_s(self) -> float:
        return (
            self.compute.seconds + self.exposed_comm.seconds + self.optimizer.seconds + self.offload.seconds
        )

    @property
    def tokens_per_s(self) -> float:
        return self.setup.tokens_per_step / self.step_s

    @property
    def samples_per_s(self) -> float:
        return self.setup.batch.train_batch / self.step_s

    def run(self, tokens: float, usd_per_gpu_hour: float) -> dict[str, float]:
        """Steps, wall-clock hours, GPU-hours and cost of training on ``tokens`` tokens."""
        if not tokens > 0:
            raise ValueError(f"tokens: must be > 0, got {tokens!r}")
        steps = math.ceil(tokens / self.setup.tokens_per_step)
        hours = steps * self.step_s / 3600
        gpu_hours = hours * self.setup.cluster.world_size
        return {
            "steps": steps,
            "hours": hours,
            "gpu_hours": gpu_hours,
            "cost_usd": gpu_hours * usd_per_gpu_hour,
        }

    def to_dict(self) -> dict:
        parts = {"compute": self.compute, "comm": self.comm, "exposed_comm": self.exposed_comm}
        parts["optimizer"] = self.optimizer
        return {
            "step_s": self.step_s,
            "tokens_per_s": self.tokens_per_s,
            "samples_per_s": self.samples_per_s,
            "comm_bytes_per_gpu": self.comm_bytes,
            "parts": {name: asdict(part) for name, part in {**parts, "offload": self.offload}.items()},
            "hardware": asdict(self.hardware),
            "assumptions": asdict(self.assumptions),
        }


def model_flops(setup: Setup, tokens: int) -> float:
    """Model FLOPs of training on ``tokens`` tokens, 6 x params x tokens (Kaplan et al. 2020: 2 for the
    forward matmuls, 4 for the backward): the convention behind model FLOPs utilisation and the
    ``tflops`` of the records, without attention scores or recomputation."""
    return 6.0 * setup.model.params * tokens


def flops_per_token(setup: Setup) -> tuple[float, str]:
    """FLOPs one token costs a GPU, and the formula: matmuls, attention scores, recomputation."""
    m, s = setup.model, setup.batch.seq_len
    ckpt = setup.zero.activation_checkpointing
    attention = 12 * m.layers * m.hidden * s if m.is_transformer and m.layers and m.hidden else 0
    flops = 6 * m.params + attention
    formula = "6 Psi" + (f" + 12 L h s ({m.layers} x {m.hidden} x {s})" if attention else "")
    if ckpt:
        flops += 2 * m.params + attention / 3
        formula += " + recomputed forward " + ("(2 Psi + 4 L h s)" if attention else "(2 Psi)")
    return float(flops), formula


def comm_bytes(setup: Setup) -> tuple[int, str]:
    """Bytes one GPU sends per optimizer step, as DeepSpeed's ZeRO moves them (ring collectives).

    M = 16-bit (or fp32) model bytes, N = data-parallel ranks, k = micro-steps per step. Stage 0
    all-reduces gradients at the boundary (2 (N-1)/N M); stages 1-2 all-reduce the gradient buckets
    (DeepSpeed's multi-rank bucket all-reduce: measured 1.5x stage 0 with the all-gather) and all-gather
    the updated parameters ((N-1)/N M); stage 2 reduces every micro-step, stage 1 at the boundary; stage 3
    all-gathers parameters in forward and backward and reduce-scatters gradients every micro-step
    (3 (N-1)/N M k, the ZeRO paper's 1.5x).
    """
    n, z = setup.dp, setup.zero
    if n == 1:
        return 0, "one rank: no communication"
    m = element_bytes(z.precision) * setup.model.params
    k = setup.batch.grad_accum
    ring = (n - 1) / n
    if z.stage == 0:
        volume, formula = 2 * ring * m, "2 (N-1)/N M (gradient all-reduce)"
    elif z.stage == 1:
        volume, formula = 3 * ring * m, "2 (N-1)/N M (gradient all-reduce) + (N-1)/N M (parameter all-gather)"
    elif z.stage == 2:
        volume = (2 * k + 1) * ring * m
        formula = (
            f"2 (N-1)/N M x k={k} (gradient all-reduce per micro-step) + (N-1)/N M (parameter all-gather)"
        )
    else:
        volume = 3 * k * ring * m
        formula = f"3 (N-1)/N M x k={k} (all-gather forward + backward, reduce-scatter, per micro-step)"
    return round(volume), f"{formula}, M = {m:,} B, N = {n}"


def step_time(setup: Setup, hw: Hardware | None = None, assume: Assumptions | None = None) -> StepTime:
    """Predicted seconds per optimizer step of ``setup`` on ``hw`` (default: ``hardware(setup)``)."""
    hw = hw or hardware(setup)
    assume = assume or Assumptions()
    b, c, z = setup.batch, setup.cluster, setup.zero
    per_token, formula = flops_per_token(setup)
    tokens = b.micro_batch * b.grad_accum * b.seq_len
    achieved = hw.peak_tflops * 1e12 * assume.efficiency
    compute = Part(
        per_token * tokens / achieved,
        f"({formula}) x {tokens:,} tokens per GPU / ({hw.peak_tflops:g} TFLOP/s x {assume.efficiency:g})",
    )
    sent, how = comm_bytes(setup)
    if c.nodes > 1:
        link = min(hw.intra_gbps, hw.inter_gbps / c.gpus_per_node)
        where = f"min(intra {hw.intra_gbps:g}, inter {hw.inter_gbps:g} / {c.gpus_per_node} GPUs) GB/s"
    else:
        link, where = hw.intra_gbps, f"intra-node {hw.intra_gbps:g} GB/s"
    bandwidth = link * assume.link_efficiency * 1e9
    comm = Part(sent / bandwidth, f"{how} over {where} x {assume.link_efficiency:g}")
    hidden = assume.overlap if z.overlap else 0.0
    exposed = Part(
        comm.seconds * (1 - hidden),
        f"{1 - hidden:g} x communication" + (" (overlap_comm hides the rest)" if hidden else ""),
    )
    return StepTime(
        setup, hw, assume, compute, comm, exposed, _optimizer(setup, hw), _offload(setup, hw, assume), sent
    )


def _optimizer(setup: Setup, hw: Hardware) -> Part:
    z = setup.zero
    if z.offload_optimizer != "none":
        return Part(0.0, "on the CPU (offload)")
    p = element_bytes(z.precision)
    part = partition.partition_numel(setup)
    per_param = ADAM_TRAFFIC_BYTES + (p if z.mixed_precision else 0)
    return Part(
        per_param * part / (hw.memory_gbps * 1e9),
        f"{per_param} B x P ({part:,}) / {hw.memory_gbps:g} GB/s GPU memory (Adam reads, writes each state)",
    )


def _offload(setup: Setup, hw: Hardware, assume: Assumptions) -> Part:
    z, k = setup.zero, setup.batch.grad_accum
    if z.offload_optimizer == "none" and z.offload_param == "none":
        return Part(0.0, "no offload")
    p, part = element_bytes(z.precision), partition.partition_numel(setup)
    link = hw.host_gbps * assume.link_efficiency * 1e9
    moved, why = 0, []
    if z.offload_optimizer != "none":
        micro_steps = k if z.stage >= 2 else 1
        moved += p * part * (micro_steps + 1)
        why.append(f"{p} B x P x ({micro_steps} gradient copies + 1 parameter copy)")
    if z.offload_param != "none":
        moved += 2 * k * p * part
        why.append(f"2 x k={k} x {p} B x P (parameters fetched for forward and backward)")
    seconds = moved / link
    formula = f"({' + '.join(why)}), P = {part:,}, over {hw.host_gbps:g} GB/s x {assume.link_efficiency:g}"
    if z.offload_optimizer != "none":
        per_param = ADAM_TRAFFIC_BYTES + p
        node_bytes = per_param * part * setup.cluster.gpus_per_node
        seconds += node_bytes / (assume.host_memory_gbps * 1e9)
        formula += (
            f" + CPU Adam: {per_param} B x P x {setup.cluster.gpus_per_node} GPUs per node / "
            f"{assume.host_memory_gbps:g} GB/s host memory"
        )
    return Part(seconds, formula)


def with_assumptions(assume: Assumptions | None = None, **changes: float) -> Assumptions:
    """``assume`` (default ``Assumptions()``) with some fields changed; ValueError names a bad one."""
    base = assume or Assumptions()
    unknown = set(changes) - set(asdict(base))
    if unknown:
        raise ValueError(f"{sorted(unknown)[0]}: not an assumption; choose from {', '.join(asdict(base))}")
    return replace(base, **changes)
