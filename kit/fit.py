"""The fit rule, written once: whether a setup's estimate fits a GPU type.

A setup fits a GPU when the GPU computes in the training precision (bf16 needs Ampere or newer: a
V100 has no bf16, ``data/gpus.csv``), its bytes per GPU fit the GPU's memory less a ``headroom`` share,
and its CPU RAM per node fits the node's (when the cluster gives it). ``Estimate.fits``, the review of a
ds_config, the panels' verdict and the plan ask ``fit`` (the planner's grid ``fits``, for arrays).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from kit.gpus import gpu

if TYPE_CHECKING:
    import numpy as np


class Fit(NamedTuple):
    """The verdict and what it compared: ``problem`` is ``""`` (fits), ``"precision"``, ``"gpu"`` or
    ``"cpu"``; ``need`` / ``capacity`` bytes per GPU (capacity less the headroom)."""

    problem: str
    need: int
    capacity: int

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
    """``fit`` for an ``Estimate`` on ``gpu_name`` (default: its cluster's GPU)."""
    s = est.setup
    return fit(
        gpu_name or s.cluster.gpu,
        s.zero.precision,
        est.per_gpu_bytes,
        est.cpu_bytes_per_node,
        s.cluster.cpu_ram_per_node_bytes,
        headroom,
    )
