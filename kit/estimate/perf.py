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

``step_time`` is ``seconds`` (the arithmetic) of a ``load`` (what the step asks of a GPU, whatever its
type) with each part's formula; ``kit.estimate.plan`` evaluates ``seconds`` once on arrays of loads and
GPU types (``Load.arrays``, ``stack``) to rank its grid; ``kit.run.calibrate`` compares ``step_time`` with
measured step times.

What it cannot see: kernel launch overheads and small-message latency (every collective is bytes over
bandwidth), the data loader, the Python host loop and synchronisation stalls, stragglers and load
imbalance between ranks, congestion from other jobs on a shared fabric, topology beyond "slowest link"
(rail-optimised networks, NVSwitch contention), how much of the communication really hides behind
compute (``overlap`` is a single assumed share), ZeRO++'s quantization kernels' own time, GPU clocks
under a power limit, and the page-cache and file-system effects on NVMe swaps.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from functools import cached_property

from kit.estimate import partition
from kit.estimate.calibration import Calibration, Link, engine_key
from kit.estimate.comm import TIMED_AS, collective_calls, collectives, comm_by_scope, comm_bytes
from kit.estimate.result import Term, total
from kit.gpus import DEFAULT_NVME, gpu, network, nvme
from kit.rules import (
    FP32,
    element_bytes,
    optimizer_states,
)
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
    )


def stack(hardwares: list[Hardware]) -> Hardware:
    """One ``Hardware`` whose figures are numpy arrays, one element per GPU type of ``hardwares``, in
    order: ``step_time`` on it, or ``seconds`` of ``Load.arrays``, times Setups on all of them at once
    (``kit.estimate.plan_grid``)."""
    import numpy as np

    out = {}
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


@dataclass(frozen=True)
class Load:
    """What one optimizer step of a Setup asks of each of its GPUs, whatever their type (``load``): the
    FLOPs, the bytes on the wire, through the GPU's memory (its Adam step), over the host link and
    through the node's memory (offload), and through the node's NVMe drives, with how each was counted.
    ``seconds`` turns it into time on a ``Hardware``."""

    flops: float  # executed by one GPU
    tokens: int  # one GPU's
    sent: int  # bytes one GPU sends (``comm_bytes``)
    intra: int  # of them inside its node and across nodes (``comm_by_scope``)
    inter: int
    split: bool  # ZeRO++ on several nodes: ``intra`` and ``inter`` each over its own link
    nodes: int
    gpus_per_node: int
    overlap: bool  # overlap_comm
    gpu_memory_bytes: int  # the Adam step's reads and writes in the GPU's memory (0 when offloaded)
    host_link_bytes: int  # between the GPU and the host (offload)
    host_memory_bytes: int  # the CPU Adam step's reads and writes in one node's memory
    nvme_read_bytes: int  # one node's swap files
    nvme_write_bytes: int
    formulas: dict[str, str]  # of flops, sent, and of each of the last five that is not 0

    @staticmethod
    def arrays(loads: list[Load]) -> Load:
        """One Load whose numbers are numpy columns (shape ``(len(loads), 1)``): ``seconds`` of it on
        ``stack``'s hardware (a row of GPU types) is an array of (setup, GPU type)."""
        import numpy as np

        numbers = [f.name for f in fields(Load) if f.name != "formulas"]
        return Load(
            **{name: np.array([getattr(x, name) for x in loads])[:, None] for name in numbers}, formulas={}
        )


def load(setup: Setup) -> Load:
    """``Load`` of one optimizer step of ``setup`` (the model behind ``step_time``, uncalibrated)."""
    b, c, z, k = setup.batch, setup.cluster, setup.zero, setup.batch.grad_accum
    per_token, how = flops_per_token(setup)
    tokens = b.micro_batch * b.grad_accum * b.seq_len
    parts = collectives(setup)
    sent, formulas = comm_bytes(setup, parts)
    formulas = {"flops": how, "sent": formulas}
    scope = comm_by_scope(setup, parts)
    p, part = element_bytes(z.precision), partition.partition_numel(setup)
    per_param = ADAM_TRAFFIC_BYTES + (p if z.mixed_precision else 0)
    adam = moved = node = 0
    if z.offload_optimizer == "none":
        adam = per_param * part
        formulas["gpu_memory"] = f"{per_param} B x P ({part:,})"
    why = []
    if z.offload_optimizer != "none":
        micro_steps = k if z.stage >= 2 else 1
        moved += p * part * (micro_steps + 1)
        why.append(f"{p} B x P x ({micro_steps} gradient copies + 1 parameter copy)")
        node = per_param * part * c.gpus_per_node
        formulas["host_memory"] = f"{per_param} B x P x {c.gpus_per_node} GPUs per node"
    if z.offload_param != "none":
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
        per_token * tokens, tokens, sent, scope["intra"], scope["inter"], split, c.nodes, c.gpus_per_node,
        z.overlap, adam, moved, node, read, write, formulas,
    )  # fmt: skip


def seconds(need: Load, hw: Hardware, assume: Assumptions) -> dict[str, float]:
    """Seconds of each part of a step (``STEP_PARTS``, and ``comm``, hidden or not) asking ``need`` of
    ``hw``: compute at peak x ``efficiency``; the bytes on the wire over the slowest link of the ring
    (across nodes: a node's network shared by its GPUs; ZeRO++ on several nodes: each scope over its
    own link) x ``link_efficiency``, of which ``overlap`` is hidden with overlap_comm; the Adam step
    at the GPU's memory bandwidth; offload over the host link and the node's memory, and the swap files
    over its drives. Floats, or arrays of ``Load.arrays`` by ``stack``'s GPU types."""
    efficiency = assume.link_efficiency
    across = _smaller(hw.intra_gbps, hw.inter_gbps / need.gpus_per_node)
    bandwidth = _where(need.nodes > 1, across, hw.intra_gbps) * efficiency * 1e9
    intra_bw = hw.intra_gbps * efficiency * 1e9
    comm = _where(need.split, need.inter / bandwidth + need.intra / intra_bw, need.sent / bandwidth)
    hidden = _where(need.overlap, assume.overlap, 0.0)
    offload = _per(need.host_link_bytes, hw.host_gbps * efficiency * 1e9)
    offload += _per(need.host_memory_bytes, assume.host_memory_gbps * 1e9)
    offload = offload + _swap_s(need.nvme_read_bytes, need.nvme_write_bytes, hw)
    return {
        "compute": need.flops / (hw.peak_tflops * 1e12 * assume.efficiency),
        "comm": comm,
        "exposed_comm": comm * (1 - hidden),
        "optimizer": _per(need.gpu_memory_bytes, hw.memory_gbps * 1e9),
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


def step_time(
    setup: Setup,
    hw: Hardware | None = None,
    assume: Assumptions | None = None,
    calibration: Calibration | None = None,
) -> StepTime:
    """Predicted seconds per optimizer step of ``setup`` on ``hw`` (default: ``hardware(setup)``):
    ``seconds`` of its ``load``, each part with its formula; with a ``calibration``
    (``kit.estimate.calibration``) from its measured rates and fixed costs instead of the datasheet and
    ``assume`` (``calibrated``)."""
    if calibration is not None:
        return calibrated(setup, calibration, hw, assume)
    hw = hw or hardware(setup)
    assume = assume or Assumptions()
    need = load(setup)
    took, f, efficiency = seconds(need, hw, assume), need.formulas, assume.link_efficiency
    compute = Part(
        took["compute"],
        f"({f['flops']}) x {need.tokens:,} tokens per GPU / ({_g(hw.peak_tflops)} TFLOP/s x "
        f"{assume.efficiency:g})",
    )
    if need.nodes > 1:
        where = f"min(intra {_g(hw.intra_gbps)}, inter {_g(hw.inter_gbps)} / {need.gpus_per_node} GPUs) GB/s"
    else:
        where = f"intra-node {_g(hw.intra_gbps)} GB/s"
    if need.split:
        how = (
            f"{f['sent']}: inter-node {need.inter:,} B over {where} + intra-node {need.intra:,} B over "
            f"intra {_g(hw.intra_gbps)} GB/s, x {efficiency:g}"
        )
    else:
        how = f"{f['sent']} over {where} x {efficiency:g}"
    hidden = assume.overlap if need.overlap else 0.0
    exposed = Part(
        took["exposed_comm"],
        f"{1 - hidden:g} x communication" + (" (overlap_comm hides the rest)" if hidden else ""),
    )
    optimizer = "on the CPU (offload)"
    if "gpu_memory" in f:
        optimizer = (
            f"{f['gpu_memory']} / {_g(hw.memory_gbps)} GB/s GPU memory (Adam reads, writes each state)"
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
    if z.offload_param == "nvme":
        sp = sum(swap.swapped_params(setup))
        read.append(Term(2 * k * p * sp, f"2 x k={k} x {p} B x S_p"))
        write.append(Term(p * sp, f"{p} B x S_p"))
    if z.offload_optimizer == "nvme":
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

    on = cal.links(setup.dp)[0]  # the ranks the links were measured on
    for part in collectives(setup):
        op = TIMED_AS.get(part.name, "all_reduce")
        gbps = (cal.link(op, on) or datasheet).bus_gbps
        gbps = min(gbps, across) if part.scope == "inter" and across else gbps
        add(op, part.bytes / (gbps * 1e9), f"{part.bytes:,} B / {gbps:.3g} GB/s")
    hops = (setup.dp - 1) / max(1, on - 1)
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
    part = partition.partition_numel(setup)
    if z.offload_optimizer == "none":
        x, shared = cal.stretch(g, "adam")
        optimizer = Part(
            part * cal.adam_s_per_param * x,
            f"P ({part:,}) x {cal.adam_s_per_param * 1e9:.3g} ns Adam {shared}",
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
    if z.offload_optimizer == "none" and z.offload_param == "none":
        return Part(0.0, "no offload")
    p, part = element_bytes(z.precision), partition.partition_numel(setup)
    down = up = 0
    if z.offload_optimizer != "none":
        down += p * part * (k if z.stage >= 2 else 1)  # gradients to the host
        up += p * part  # updated parameters back
    if z.offload_param != "none":
        up += 2 * k * p * part
    x, shared = cal.stretch(setup.cluster.gpus_per_node, "copy")
    seconds = (down / (cal.to_host_gbps * 1e9) + up / (cal.to_device_gbps * 1e9)) * x
    formula = f"({down:,} B to host / {cal.to_host_gbps:.3g} GB/s + {up:,} B to device / "
    formula += f"{cal.to_device_gbps:.3g} GB/s) {shared}"
    if z.offload_optimizer != "none":
        x, shared = cal.stretch(setup.cluster.gpus_per_node, "adam")
        seconds += part * cal.host_adam_s_per_param * x
        formula += f" + P ({part:,}) x {cal.host_adam_s_per_param * 1e9:.3g} ns host Adam {shared}"
    if z.nvme:
        swap = _nvme(setup, hw or hardware(setup))
        seconds, formula = seconds + swap.seconds, f"{formula} + {swap.formula} (datasheet)"
    return Part(seconds, formula)
