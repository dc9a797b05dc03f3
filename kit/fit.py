"""The fit rule, written once: whether a setup's estimate fits a GPU type.

A setup fits a GPU when the GPU computes in the training precision (bf16 needs Ampere or newer: a
V100 has no bf16, ``data/gpus.csv``), its bytes per GPU fit the GPU's memory less a ``headroom`` share,
and its CPU RAM per node fits the node's (when the cluster gives it). An estimate's bytes per GPU are its
predicted max reserved and what the GPU holds outside the allocator (``Estimate.per_gpu_bytes``); where
they exceed the memory, PyTorch frees its cached segments and retries before it runs out, so the
allocator's replay within the memory decides (``within``: ``Fit.flushes``). ``Estimate.fits``, the
review of a ds_config, the panels' verdict and the plan ask ``estimate_fit``; the planner's grid screens
arrays of setups with ``fits`` on what no setup needs less than (``Estimate.screen_bytes``), and the plan
confirms the setups it names with ``estimate_fit`` (``kit.planning.plan.Plan.settle``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from kit.gpus import gpu

if TYPE_CHECKING:
    import numpy as np


#: what a verdict says where the setup fits only by the allocator's flushes (``Fit.flushes``)
FLUSHES = "fits only by flushing the allocator's cache near the memory: slower steps"


class Fit(NamedTuple):
    """The verdict and what it compared: ``problem`` is ``""`` (fits), ``"precision"``, ``"gpu"`` or
    ``"cpu"``; ``need`` / ``capacity`` bytes per GPU (capacity less the headroom: ``need`` is the estimate's
    ``per_gpu_bytes``, or its ``screen_bytes`` where even those are past the capacity); ``flushes``: it
    fits only because the caching allocator frees its cache and retries near the capacity (``need`` is
    then what it reserves there, within the capacity; each flush slows the step)."""

    problem: str
    need: int
    capacity: int
    flushes: bool = False

    @property
    def ok(self) -> bool:
        return not self.problem


def supports(gpu_name: str, precision: str) -> bool:
    """Whether the GPU computes in ``precision`` (a datasheet TFLOP/s figure for it, ``Gpu.peak_tflops``)."""
    return gpu(gpu_name).peak_tflops(precision) > 0


def fit(
    gpu_name: str,
    precision: str,
    per_gpu_bytes: int,
    cpu_bytes_per_node: int = 0,
    cpu_ram_per_node_bytes: int | None = None,
    headroom: float = 0.0,
) -> Fit:
    """Whether ``per_gpu_bytes`` in ``precision`` fit ``gpu_name`` leaving ``headroom`` (a share of its
    memory) free, and the node's CPU RAM when given; the first reason it does not."""
    capacity, checks = _checks(
        gpu_name, precision, per_gpu_bytes, cpu_bytes_per_node, cpu_ram_per_node_bytes, headroom
    )
    return Fit(next((problem for problem, ok in checks if not ok), ""), per_gpu_bytes, capacity)


def fits(
    gpu_name: str,
    precision: str,
    per_gpu_bytes: np.ndarray,
    cpu_bytes_per_node: np.ndarray,
    cpu_ram_per_node_bytes: int | None = None,
    headroom: float = 0.0,
) -> np.ndarray:
    """``fit(...).ok`` of arrays of setups' bytes on one GPU type (the planner's grid)."""
    import numpy as np

    _, checks = _checks(
        gpu_name, precision, per_gpu_bytes, cpu_bytes_per_node, cpu_ram_per_node_bytes, headroom
    )
    return np.logical_and.reduce([np.broadcast_to(ok, np.shape(per_gpu_bytes)) for _, ok in checks])


def _checks(gpu_name, precision, per_gpu_bytes, cpu_bytes_per_node, cpu_ram_per_node_bytes, headroom):
    """The capacity less the headroom, and ``(problem, passed)`` in the order ``fit`` reports them."""
    if not 0 <= headroom < 1:
        raise ValueError(f"headroom: must be in [0, 1), got {headroom!r}")
    capacity = int(gpu(gpu_name).memory_bytes * (1 - headroom))
    cpu_ok = True if cpu_ram_per_node_bytes is None else cpu_bytes_per_node <= cpu_ram_per_node_bytes
    checks = (
        ("precision", supports(gpu_name, precision)),
        ("gpu", per_gpu_bytes <= capacity),
        ("cpu", cpu_ok),
    )
    return capacity, checks


def estimate_fit(est, gpu_name: str | None = None, headroom: float = 0.0) -> Fit:
    """``fit`` for an ``Estimate`` on ``gpu_name`` (default: its cluster's GPU), its bytes per GPU weighed
    by ``within``."""
    s = est.setup
    screened = fit(
        gpu_name or s.cluster.gpu,
        s.zero.precision,
        est.screen_bytes,
        est.cpu_bytes_per_node,
        s.cluster.cpu_ram_per_node_bytes,
        headroom,
    )
    if screened.problem in ("precision", "gpu"):
        return screened
    weighed = within(est, screened.capacity)
    return weighed if weighed.problem else weighed._replace(problem=screened.problem)


def shown_bytes(est, verdict: Fit) -> int:
    """The bytes a verdict on ``est`` is shown with: its ``need`` where it fits (past the memory, what the
    flushed allocator holds there), else the estimate's ``per_gpu_bytes`` (``within`` decides on the screen
    alone where that is past the memory; showing the bytes replays the allocator)."""
    return verdict.need if verdict.ok else est.per_gpu_bytes


def within(est, capacity: int) -> Fit:
    """Whether an ``Estimate``'s bytes per GPU fit ``capacity`` bytes (``problem`` ``""`` or ``"gpu"``): its
    ``per_gpu_bytes`` within them; past them, the caching allocator's replay within them less the CUDA
    context and NCCL's buffers (``Fit.flushes``, ``need`` what it reserves there); a setup whose
    ``screen_bytes`` are past them is not replayed (it cannot fit, whatever the allocator holds)."""
    if est.screen_bytes > capacity:
        return Fit("gpu", est.screen_bytes, capacity)
    need = est.per_gpu_bytes
    if need <= capacity:
        return Fit("", need, capacity)
    held = est.reserved.flushed(capacity - est.peak_overhead.bytes) if est.reserved is not None else None
    if held is not None:
        # a replay that held less than it reserves with room to spare flushed its cache
        return Fit("", held + est.peak_overhead.bytes, capacity, flushes=held < est.reserved.reserved)
    return Fit("gpu", need, capacity)
