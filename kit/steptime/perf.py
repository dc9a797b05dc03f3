"""Step time of a Setup on GPUs before booking: compute, communication, the optimizer and offload, each
with its formula, from the mechanisms and the datasheets (no calibration needed).

- compute: ``kit.steptime.kernels``: every matmul of a micro-step on a roofline (peak x ``efficiency``,
  wave quantization over the SMs, or the memory bandwidth), flash attention's causal half, the
  memory-bound elementwise ops and loss; each block the longer of its device time and its host's launch
  and hook time (small models at small micro batches wait on the host);
- communication: the bytes one GPU sends per optimizer step under the engine (``comm_bytes``) over the
  link their ring crosses: NVLink inside a node; across nodes the node's NICs together (NCCL's rings run
  one per NIC, so a ring's inter-node hop carries the node's share at the fabric's aggregate rate), the
  slower of the two; ZeRO++'s hpZ and qgZ hops each over its own link; plus a latency per collective call
  that grows with the nodes a ring crosses (``collective_calls``);
- overlap, only where the engine overlaps (``Load.hideable``, ``Load.window``): DDP's bucketed
  all-reduce behind the last micro-step's backward; stage 1-2 gradient reductions behind backward with
  ``overlap_comm``; stage 3's prefetched gathers and reduce-scatters, and FSDP's, behind forward and
  backward; stage 0's all-reduce, the post-step parameter all-gather and the persistent gather are exposed;
- optimizer: the Adam step on the GPU's partition, bound by the GPU's memory bandwidth (it reads and
  writes every fp32 state once per step), or by the host launching the step's ops per parameter tensor
  (``kernels.step_host``), whichever is longer; offloaded, Adam runs on the CPU instead (below) and the
  host's per-tensor ops remain;
- offload: gradients down and parameters up over the host link (PCIe), and the CPU Adam step, which is
  bound by the node's memory bandwidth; not overlapped.

``step_time`` is ``seconds`` (the arithmetic) of a ``load`` (what the step asks of a GPU, whatever its
type) with each part's formula; ``kit.planning.plan`` evaluates ``seconds`` once on arrays of loads and
GPU types (``Load.arrays``, ``stack``) to rank its grid; ``kit.steptime.calibrated`` prices the same
counts with this machine's measured rates instead.

What it cannot see: the data loader and the framework's own loop (logging, timers), stragglers and load
imbalance, congestion from other jobs on a shared fabric, topology beyond "NVLink inside, NICs across"
(rail-optimised networks, NVSwitch contention, NCCL's tree all-reduce at scale), the SMs collectives take
from overlapped compute, ZeRO++'s quantization kernels' own time, GPU clocks under a power limit, and the
page-cache and file-system effects on NVMe swaps.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from functools import cached_property
from typing import Any

from kit.estimate import partition
from kit.estimate.activations import recomputed, recomputed_share
from kit.estimate.result import Term, total
from kit.gpus import DEFAULT_NVME, gpu, network, nvme
from kit.rules import (
    FP32,
    Offload,
    element_bytes,
    optimizer_states,
)
from kit.schema import Setup
from kit.steptime import kernels
from kit.steptime.comm import RAIL, collective_calls, collectives, comm_by_scope, comm_bytes
from kit.steptime.kernels import Work

#: bytes of memory traffic per parameter in one Adam step: read fp32 parameter, gradient and two moments
#: (16 B), write parameter and moments back (12 B); mixed precision adds the 16-bit copy it writes
ADAM_TRAFFIC_BYTES = 7 * FP32


@dataclass(frozen=True)
class Assumptions:
    """What the model cannot read from a datasheet; every field is shown beside the result."""

    #: achieved / peak TFLOP/s of a large tensor-core GEMM (cuBLAS reaches 75-90 % of the dense peak on
    #: V100, A100 and H100 at large shapes); smaller shapes lose more through wave quantization and the
    #: memory bandwidth (``kit.steptime.kernels``)
    efficiency: float = 0.8
    #: achieved / nominal bandwidth of a collective (nccl-tests bus bandwidth is ~80% of the link)
    link_efficiency: float = 0.8
    #: share of overlapped communication that really hides behind compute: NCCL's kernels run on up to 32
    #: channels (one SM each, NCCL's NCCL_MAX_NCHANNELS default on NVLink systems) of the GPU's 80-132 SMs
    #: and share its memory bandwidth, so the compute beside them slows by about a fifth
    overlap: float = 0.8
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
    """The figures the model uses for one GPU type and fabric (GB/s are 1e9 bytes/s, one direction);
    ``stack`` makes one whose figures are arrays, one per GPU type, for which ``step_time`` gives arrays
    of seconds."""

    name: str
    peak_tflops: float  # per GPU at the training precision
    intra_gbps: float  # one GPU to the others of its node
    inter_gbps: float  # one node to the others, all NICs together
    host_gbps: float  # one GPU to host memory
    memory_gbps: float  # the GPU's own memory
    source: str = ""
    nvme_read_gbps: float = 0.0  # one node's NVMe drives together (ZeRO-Infinity's swap space)
    nvme_write_gbps: float = 0.0
    sms: float = 0.0  # streaming multiprocessors (compute units): wave quantization's slots


def hardware(setup: Setup, fabric: str | None = None, drives: str | None = None) -> Hardware:
    """``setup``'s GPU (data/gpus.csv), fabric (data/networks.csv; default: the cluster's interconnect) and
    NVMe drives per node (data/nvme.csv; default ``DEFAULT_NVME``)."""
    g = gpu(setup.cluster.gpu)
    net = network(fabric or setup.cluster.interconnect)
    disks = nvme(drives or DEFAULT_NVME)
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
        source=f"{g.name}: {g.source}; {net.name}: {net.source}; NVMe {disks.name}: {disks.source}",
        nvme_read_gbps=disks.read_gbps,
        nvme_write_gbps=disks.write_gbps,
        sms=g.sms,
    )


def stack(hardwares: list[Hardware]) -> Hardware:
    """One ``Hardware`` whose figures are numpy arrays, one element per GPU type of ``hardwares``, in
    order: ``step_time`` on it, or ``seconds`` of ``Load.arrays``, times Setups on all of them at once
    (``kit.planning.plan_grid``)."""
    import numpy as np

    out: dict[str, Any] = {}  # arrays where the fields say float: one element per GPU type
    for f in fields(Hardware):
        values = [getattr(h, f.name) for h in hardwares]
        out[f.name] = "; ".join(values) if f.type == "str" else np.array(values, dtype=float)
    return Hardware(**out)


@dataclass(frozen=True)
class Part:
    """Seconds per optimizer step of one part of the step, and how they were computed."""

    seconds: float
    formula: str


#: the parts a step waits for, in the order ``StepTime.step_s`` adds them
STEP_PARTS = ("compute", "exposed_comm", "optimizer", "offload", "fixed")


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
    fixed: Part = Part(0.0, "uncalibrated: the engine's fixed costs are not modelled")
    calibration: str | None = None  # what the rates were measured on (None: datasheet assumptions)

    @cached_property
    def step_s(self) -> float:
        return sum(getattr(self, name).seconds for name in STEP_PARTS)

    @property
    def tokens_per_s(self) -> float:
        return self.setup.tokens_per_step / self.step_s

    @property
    def samples_per_s(self) -> float:
        return self.setup.batch.train_batch / self.step_s

    def run(self, tokens: float, usd_per_gpu_hour: float) -> dict[str, float]:
        """Steps, wall-clock hours, GPU-hours and cost of training on ``tokens`` tokens (``run_cost``)."""
        s = self.setup
        return run_cost(tokens, s.tokens_per_step, self.step_s, s.cluster.world_size, usd_per_gpu_hour)

    def to_dict(self) -> dict:
        parts = {"compute": self.compute, "comm": self.comm, "exposed_comm": self.exposed_comm}
        parts["optimizer"] = self.optimizer
        parts["fixed"] = self.fixed
        return {
            "step_s": self.step_s,
            "calibration": self.calibration or "uncalibrated",
            "tokens_per_s": self.tokens_per_s,
            "samples_per_s": self.samples_per_s,
            "comm_bytes_per_gpu": self.comm_bytes,
            "parts": {name: asdict(part) for name, part in {**parts, "offload": self.offload}.items()},
            "hardware": asdict(self.hardware),
            "assumptions": asdict(self.assumptions),
        }


def run_cost(tokens: float, tokens_per_step, step_s, world_size, usd_per_gpu_hour) -> dict[str, float]:
    """Steps, wall-clock hours, GPU-hours and cost of training on ``tokens`` tokens; numpy arrays of
    the others (one element per setup, the planner's grid) give arrays."""
    if not tokens > 0:
        raise ValueError(f"tokens: must be > 0, got {tokens!r}")
    steps = tokens / tokens_per_step
    if isinstance(steps, float):
        steps = math.ceil(steps)
    else:
        import numpy as np

        steps = np.ceil(steps)
    hours = steps * step_s / 3600
    gpu_hours = hours * world_size
    return {"steps": steps, "hours": hours, "gpu_hours": gpu_hours, "cost_usd": gpu_hours * usd_per_gpu_hour}


def model_flops(setup: Setup, tokens: int) -> float:
    """Model FLOPs of training on ``tokens`` tokens, 6 x params x tokens (Kaplan et al. 2020: 2 for the
    forward matmuls, 4 for the backward): the convention behind model FLOPs utilisation and the
    ``tflops`` of the records, without attention scores or recomputation."""
    return 6.0 * setup.model.params * tokens


def flops_per_token(setup: Setup) -> tuple[float, str]:
    """FLOPs one token costs a GPU, and the formula: matmuls, attention scores (the causal half under
    SDPA's flash kernels, all of them under eager attention: ``kernels.attention``), recomputation."""
    m, s = setup.model, setup.batch.seq_len
    again = recomputed(setup)
    full = 12 * m.layers * m.hidden * s if m.is_transformer and m.layers and m.hidden else 0
    causal = bool(full) and kernels.attention(m) == "sdpa"
    attention = full // 2 if causal else full
    trained = partition.trainable_params(setup)
    scores = f"{'6' if causal else '12'} L h s ({m.layers} x {m.hidden} x {s}{', causal' if causal else ''})"
    flops: float
    if trained == m.params:
        flops, formula = 6 * m.params + attention, "6 Psi"
    else:  # frozen weights get no weight gradient: 2 Psi forward, 2 Psi input gradients, 2 Psi_t
        flops, formula = (
            4 * m.params + 2 * trained + attention,
            f"4 Psi + 2 Psi_t (Psi_t = {trained:,} train)",
        )
    formula += f" + {scores}" if attention else ""
    if again.any:
        linear, att = recomputed_share(setup), again.attention
        flops += linear * 2 * m.params + att * attention / 3
        parts = [f"{_share(linear)}2 Psi"] + ([f"{_share(att)}{scores} / 3"] if attention and att else [])
        formula += " + recomputed forward (" + " + ".join(parts) + ")"
    return float(flops), formula


def _share(x: float) -> str:
    return "" if x == 1 else f"{x:.2g} x "


#: host and wire microseconds a collective call costs whatever its size: the launch and NCCL's
#: small-message protocol (nccl-tests: ~10 us inside a node), plus each hop its ring takes (about 1 us
#: over NVLink, 4 us more where it crosses a NIC)
CALL_US = 10.0
HOP_US = 1.0
NIC_HOP_US = 4.0


@dataclass(frozen=True)
class Load:
    """What one optimizer step of a Setup asks of each of its GPUs, whatever their type (``load``): the
    micro-step's kernels and host work (``work``), the bytes on the wire and the collective calls, through
    the GPU's memory (its Adam step), over the host link and through the node's memory (offload), and
    through the node's NVMe drives, with how each was counted. ``seconds`` turns it into time on a
    ``Hardware``."""

    work: Work  # one micro-step's kernels and host time (``kit.steptime.kernels``)
    micro_steps: int
    sent: int  # bytes one GPU sends (``comm_bytes``)
    intra: int  # of them inside its node and across nodes in rings (``comm_by_scope``)
    inter: int
    rail: int  # of them across nodes from each GPU over its own NIC (qgZ's second hop, an all-to-all)
    split: bool  # ZeRO++ on several nodes: ``intra`` and ``inter`` each over its own link
    nodes: int
    gpus_per_node: int
    latency_s: float  # collective calls x their latency
    hideable: float  # share of the bytes the engine sends beside compute
    window: float  # share of the step's compute they can hide behind
    gpu_memory_bytes: int  # the Adam step's reads and writes in the GPU's memory (0 when offloaded)
    step_host_s: float  # the host's launches of the optimizer step's per-tensor ops
    host_link_bytes: int  # between the GPU and the host (offload)
    host_memory_bytes: int  # the CPU Adam step's reads and writes in one node's memory
    nvme_read_bytes: int  # one node's swap files
    nvme_write_bytes: int
    formulas: dict[str, str]  # of flops, sent, overlap, step_host, and of each of the last five not 0

    @staticmethod
    def arrays(loads: list[Load]) -> Load:
        """One Load whose numbers are numpy columns (shape ``(len(loads), 1)``): ``seconds`` of it on
        ``stack``'s hardware (a row of GPU types) is an array of (setup, GPU type)."""
        import numpy as np

        numbers = [f.name for f in fields(Load) if f.name not in ("formulas", "work")]
        # arrays where the fields say int, bool or float: the vectorised twin of a Load
        columns: dict[str, Any] = {
            name: np.array([getattr(x, name) for x in loads])[:, None] for name in numbers
        }
        return Load(work=Work.arrays([x.work for x in loads]), **columns, formulas={})


def overlapped(setup: Setup) -> tuple[float, float, str]:
    """``(hideable, window, formula)``: the share of the step's bytes the engine sends beside compute,
    and the share of the step's compute they can hide behind, where the engine overlaps: DDP's buckets
    behind the last micro-step's backward; stage 1-2 gradient reductions behind backward with
    ``overlap_comm`` (every micro-step's at stage 2, the last one's at stage 1), the parameter all-gather
    after the step exposed; stage 3 (``overlap_comm``) and FSDP behind forward and backward, the
    persistent tensors' gather after the step exposed; stage 0's all-reduce exposed."""
    z, k = setup.zero, setup.batch.grad_accum
    again = recomputed_share(setup)
    backward = (2 + again) / (3 + again)
    if setup.zero_dp == 1:
        return 0.0, 0.0, "one rank"
    if z.engine == "ddp":
        return 1.0, backward / k, "DDP: all of it, behind the last micro-step's backward"
    if z.engine != "deepspeed":
        return 1.0, 1.0, "FSDP: all of it, behind forward and backward (prefetch)"
    if z.stage == 0 or not z.overlap:
        return 0.0, 0.0, f"stage {z.stage}{'' if z.stage == 0 else ' without overlap_comm'}: none"
    if z.stage in (1, 2):
        reductions = 2 * (k if z.stage == 2 else 1)
        share = reductions / (reductions + 1)
        window = backward / (1 if z.stage == 2 else k)
        return share, window, f"the gradient reductions ({reductions} of {reductions + 1} M), behind backward"
    parts = collectives(setup)
    persistent = sum(c.bytes for c in parts if c.name == "persistent all-gather")
    sent = sum(c.bytes for c in parts) or 1
    return 1 - persistent / sent, 1.0, "all but the persistent gather, behind forward and backward"


def load(setup: Setup) -> Load:
    """``Load`` of one optimizer step of ``setup`` (the model behind ``step_time``, uncalibrated)."""
    c, z, k = setup.cluster, setup.zero, setup.batch.grad_accum
    micro = kernels.work(setup)
    parts = collectives(setup)
    sent, sent_formula = comm_bytes(setup, parts)
    calls = sum(n for _, n, _ in collective_calls(setup))
    latency = (CALL_US + HOP_US * (setup.zero_dp - 1) + NIC_HOP_US * (c.nodes - 1)) * 1e-6
    hideable, window, how = overlapped(setup)
    formulas = {"flops": micro.formula, "sent": sent_formula, "overlap": how}
    formulas["latency"] = (
        f"{calls:,} calls x ({CALL_US:g} + {HOP_US:g} x (N-1) + {NIC_HOP_US:g} x (nodes-1)) us"
    )
    scope = comm_by_scope(setup, parts)
    rail = sum(c.bytes for c in parts if c.name.endswith(RAIL))
    p, part = element_bytes(z.precision), partition.partition_numel(setup)
    per_param = ADAM_TRAFFIC_BYTES + (p if z.mixed_precision else 0)
    adam = moved = node = 0
    if z.offload_optimizer is Offload.NONE:
        adam = per_param * part
        formulas["gpu_memory"] = f"{per_param} B x P ({part:,})"
    step_host, formulas["step_host"] = kernels.step_host(setup)
    why = []
    if z.offload_optimizer is not Offload.NONE:
        micro_steps = k if z.stage >= 2 else 1
        moved += p * part * (micro_steps + 1)
        why.append(f"{p} B x P x ({micro_steps} gradient copies + 1 parameter copy)")
        node = per_param * part * c.gpus_per_node
        formulas["host_memory"] = f"{per_param} B x P x {c.gpus_per_node} GPUs per node"
    if z.offload_param is not Offload.NONE:
        moved += 2 * k * p * part
        why.append(f"2 x k={k} x {p} B x P (parameters fetched for forward and backward)")
    if why:
        formulas["host_link"] = f"({' + '.join(why)}), P = {part:,}"
    read = write = 0
    if z.nvme:
        swap, g = nvme_traffic(setup), c.gpus_per_node
        read, write = g * swap["read"].bytes, g * swap["write"].bytes
        formulas["nvme_read"] = f"{g} GPUs x ({swap['read'].formula})"
        formulas["nvme_write"] = f"{g} GPUs x ({swap['write'].formula})"
    split = bool(z.zeropp and c.nodes > 1)
    return Load(
        micro, k, sent, scope["intra"], scope["inter"] - rail, rail, split, c.nodes,
        c.gpus_per_node, calls * latency, hideable, window, adam, step_host, moved, node, read, write,
        formulas,
    )  # fmt: skip


def seconds(need: Load, hw: Hardware, assume: Assumptions) -> dict[str, float]:
    """Seconds of each part of a step (``STEP_PARTS``, and ``comm``, hidden or not) asking ``need`` of
    ``hw``: compute, k micro-steps of ``kernels.block_seconds`` at ``efficiency``; the bytes on the wire
    x ``link_efficiency`` over NVLink inside a node, across nodes over the slower of NVLink and the node's
    NICs together (ZeRO++ on several nodes: each scope over its own link), plus the calls' latency; of
    it the engine's overlapped share hides behind its window of compute (x ``overlap``); the Adam step at
    the GPU's memory bandwidth or the host's per-tensor launches, the longer; offload over the host link
    and the node's memory, and the swap files over its drives. Floats, or arrays of ``Load.arrays`` by
    ``stack``'s GPU types."""
    import numpy as np

    efficiency = assume.link_efficiency
    across = _smaller(hw.intra_gbps, hw.inter_gbps)
    bandwidth = _where(need.nodes > 1, across, hw.intra_gbps) * efficiency * 1e9
    intra_bw = hw.intra_gbps * efficiency * 1e9
    rail_bw = hw.inter_gbps / need.gpus_per_node * efficiency * 1e9  # one GPU's share of the NICs
    split = need.inter / bandwidth + _per(need.rail, rail_bw) + need.intra / intra_bw
    wire = _where(need.split, split, need.sent / bandwidth)
    comm = wire + need.latency_s
    compute = need.micro_steps * kernels.block_seconds(
        need.work, hw.peak_tflops, hw.memory_gbps, hw.sms, assume.efficiency
    )
    hidden = assume.overlap * np.minimum(need.hideable * comm, need.window * compute)
    offload = _per(need.host_link_bytes, hw.host_gbps * efficiency * 1e9)
    offload += _per(need.host_memory_bytes, assume.host_memory_gbps * 1e9)
    offload = offload + _swap_s(need.nvme_read_bytes, need.nvme_write_bytes, hw)
    exposed = comm - hidden
    return {
        "compute": compute,
        "comm": comm,
        "exposed_comm": float(exposed) if np.ndim(exposed) == 0 else exposed,
        "optimizer": _larger(_per(need.gpu_memory_bytes, hw.memory_gbps * 1e9), need.step_host_s),
        "offload": offload,
        "fixed": 0.0,
    }


def _swap_s(read: int, write: int, hw: Hardware) -> float:
    """Seconds of one node's swap-file reads and writes over its drives."""
    return _per(read, hw.nvme_read_gbps * 1e9) + _per(write, hw.nvme_write_gbps * 1e9)


def _g(figure) -> str:
    """A hardware figure in a formula (``stack``'s arrays are named, not listed)."""
    return f"{figure:g}" if isinstance(figure, int | float) else "each GPU type's"


def _smaller(a, b):
    """``min`` of two figures, element by element for arrays."""
    return a.clip(max=b) if hasattr(a, "clip") else min(a, b)


def _larger(a, b):
    import numpy as np

    out = np.maximum(a, b)
    return float(out) if np.ndim(out) == 0 else out


def _where(condition, a, b):
    """``a if condition else b``, element by element for an array of conditions."""
    if isinstance(condition, bool):
        return a if condition else b
    import numpy as np

    return np.where(condition, a, b)


def _per(amount, rate):
    """``amount / rate``, and 0 where the amount is (a rate left at 0 is then never divided by)."""
    if isinstance(amount, int | float):
        return amount / rate if amount else 0.0
    import numpy as np

    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(amount > 0, amount / rate, 0.0)


def step_time(setup: Setup, hw: Hardware | None = None, assume: Assumptions | None = None) -> StepTime:
    """Predicted seconds per optimizer step of ``setup`` on ``hw`` (default: ``hardware(setup)``):
    ``seconds`` of its ``load``, each part with its formula (``kit.steptime.calibrated.step_time`` prices
    the same step with a calibration's measured rates when one is given)."""
    hw = hw or hardware(setup)
    assume = assume or Assumptions()
    need = load(setup)
    took, f, efficiency = seconds(need, hw, assume), need.formulas, assume.link_efficiency
    compute = Part(
        took["compute"],
        f"k={need.micro_steps} x ({f['flops']}) on {_g(hw.peak_tflops)} TFLOP/s x {assume.efficiency:g}, "
        f"{_g(hw.memory_gbps)} GB/s, {_g(hw.sms)} SMs",
    )
    if need.nodes > 1:
        where = f"min(NVLink {_g(hw.intra_gbps)}, the node's NICs {_g(hw.inter_gbps)}) GB/s"
    else:
        where = f"intra-node {_g(hw.intra_gbps)} GB/s"
    if need.split:
        how = (
            f"{f['sent']}: inter-node {need.inter:,} B over {where}"
            + (
                f" + {need.rail:,} B over each GPU's NIC, {_g(hw.inter_gbps)} / {need.gpus_per_node}"
                if need.rail
                else ""
            )
            + f" + intra-node {need.intra:,} B over "
            f"intra {_g(hw.intra_gbps)} GB/s, x {efficiency:g}"
        )
    else:
        how = f"{f['sent']} over {where} x {efficiency:g}"
    how += f"; + latency {f['latency']}"
    exposed = Part(
        took["exposed_comm"],
        f"communication - {assume.overlap:g} x min(overlapped {need.hideable:.3g} x communication, "
        f"{need.window:.3g} x compute) ({f['overlap']})",
    )
    optimizer = f"{f['step_host']} (Adam itself steps on the CPU: offload)"
    if "gpu_memory" in f:
        optimizer = (
            f"max({f['gpu_memory']} / {_g(hw.memory_gbps)} GB/s GPU memory (Adam reads, writes each "
            f"state), {f['step_host']})"
        )
    offload = "no offload"
    if "host_link" in f:
        offload = f"{f['host_link']}, over {_g(hw.host_gbps)} GB/s x {efficiency:g}"
    if "host_memory" in f:
        offload += f" + CPU Adam: {f['host_memory']} / {assume.host_memory_gbps:g} GB/s host memory"
    if "nvme_read" in f:
        offload += (
            f" + NVMe: {f['nvme_read']} read / {_g(hw.nvme_read_gbps)} GB/s + {f['nvme_write']} written / "
            f"{_g(hw.nvme_write_gbps)} GB/s per node"
        )
    return StepTime(
        setup, hw, assume, compute, Part(took["comm"], how), exposed, Part(took["optimizer"], optimizer),
        Part(took["offload"], offload), need.sent,
    )  # fmt: skip


def nvme_traffic(setup: Setup) -> dict[str, Term]:
    """Bytes one GPU's swap files are read and written per optimizer step (ZeRO-Infinity, stage 3).

    Parameters on NVMe (``kit.estimate.nvme.swapped_params``, S_p elements of 16-bit partitions) are read
    for every forward and backward (2 k p S_p) and written once after the step (p S_p); optimizer states
    on NVMe (S = the fp32 partition) are read and written once per step: the fp32 master and its states,
    (1 + K) 4 S each way, and the fp32 gradient, written during backward and read for the step, 4 S each way.
    """
    from kit.estimate import nvme as swap

    z, k = setup.zero, setup.batch.grad_accum
    p = element_bytes(z.precision)
    read, write = [], []
    if z.offload_param is Offload.NVME:
        sp = sum(swap.swapped_params(setup))
        read.append(Term(2 * k * p * sp, f"2 x k={k} x {p} B x S_p"))
        write.append(Term(p * sp, f"{p} B x S_p"))
    if z.offload_optimizer is Offload.NVME:
        s = partition.partition_numel(setup)
        states = optimizer_states(z.optimizer, z.momentum)
        both = Term((2 + states) * FP32 * s, f"(1 + {states} + 1 gradient) x 4 B x S")
        read.append(both)
        write.append(both)
    return {"read": total(read), "write": total(write)}


def with_assumptions(assume: Assumptions | None = None, **changes: float) -> Assumptions:
    """``assume`` (default ``Assumptions()``) with some fields changed; ValueError names a bad one."""
    base = assume or Assumptions()
    unknown = set(changes) - set(asdict(base))
    if unknown:
        raise ValueError(f"{sorted(unknown)[0]}: not an assumption; choose from {', '.join(asdict(base))}")
    return replace(base, **changes)
