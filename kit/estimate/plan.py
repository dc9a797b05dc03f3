"""Planning before booking: the smallest cluster each ZeRO variant fits on, and the batch choices.

Every verdict is ``kit.estimate``'s; these functions search over Setups and arrange the answers as
pandas tables (used by ``zerokit plan``, the notebooks and the widgets).
"""

from __future__ import annotations

import pandas as pd

from kit import batch as batch_math
from kit.schema import Setup
from kit.units import GIB, whole_number

#: the common ZeRO variants ``smallest_cluster`` (and ``zerokit demo``) compare
DEFAULT_VARIANTS = [
    {"stage": 0, "offload_optimizer": "none", "offload_param": "none"},
    {"stage": 1, "offload_optimizer": "none", "offload_param": "none"},
    {"stage": 2, "offload_optimizer": "none", "offload_param": "none"},
    {"stage": 2, "offload_optimizer": "cpu", "offload_param": "none"},
    {"stage": 3, "offload_optimizer": "none", "offload_param": "none"},
    {"stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"},
]


def smallest_cluster(setup: Setup, variants: list[dict] | None = None, max_nodes: int = 64) -> pd.DataFrame:
    """The fewest GPUs of ``setup``'s type on which each ZeRO variant fits (``kit.estimate``'s verdict).

    ``variants`` are ``zero`` changes (default: stages 0-3, plus optimizer offload at stage 2 and
    optimizer + parameter offload at stage 3). Candidates grow as 1, 2, 4 ... GPUs in one node, then
    whole nodes of ``setup.cluster.gpus_per_node``; micro batch and gradient accumulation stay fixed.
    """
    from kit.estimate import estimate

    whole_number("max_nodes", max_nodes, 1)
    variants = variants or DEFAULT_VARIANTS
    per_node = setup.cluster.gpus_per_node
    sizes = [(1, g) for g in _powers_of_two_up_to(per_node)] + [
        (n, per_node) for n in range(2, max_nodes + 1)
    ]
    rows = []
    for change in variants:
        found = None
        for nodes, gpus in sizes:
            candidate = setup.replace(cluster={"nodes": nodes, "gpus_per_node": gpus}, zero=change, batch={})
            est = estimate(candidate)
            if est.fits[candidate.cluster.gpu]:
                found = est
                break
        label = (found.setup if found else setup.replace(zero=change)).label
        rows.append(
            {
                "variant": label,
                "nodes": found.setup.cluster.nodes if found else None,
                "gpus": found.setup.cluster.world_size if found else None,
                "per_gpu_gib": round(found.per_gpu_bytes / GIB, 2) if found else None,
                "cpu_gib_per_node": round(found.cpu_bytes_per_node / GIB, 1) if found else None,
                "verdict": "fits" if found else f"does not fit on {max_nodes * per_node} GPUs",
            }
        )
    return pd.DataFrame(rows).astype({"nodes": "Int64", "gpus": "Int64"})


def batch_options(setup: Setup, train_batch: int) -> pd.DataFrame:
    """Every (micro batch, gradient accumulation) pair giving ``train_batch`` on setup's GPUs, estimated.

    Larger micro batches mean fewer, bigger steps (faster) but more activation memory per GPU.
    """
    from kit.estimate import estimate

    options = batch_math.decompositions(train_batch, setup.dp)
    if not options:
        raise batch_math.BatchError(
            f"train_batch: must be a multiple of the data-parallel size {setup.dp}, got {train_batch}; "
            + batch_math.nearest_valid(train_batch, setup.dp)
        )
    rows = []
    for d in options:
        est = estimate(setup.replace(batch={"micro_batch": d.micro_batch, "grad_accum": d.grad_accum}))
        rows.append(
            {
                "micro_batch": d.micro_batch,
                "grad_accum": d.grad_accum,
                "train_batch": d.train_batch,
                "activations_gib": round(est.components["activations"] / GIB, 2),
                "per_gpu_gib": round(est.per_gpu_bytes / GIB, 2),
                "fits": est.fits[setup.cluster.gpu],
            }
        )
    return pd.DataFrame(rows)


def largest_micro_batch(setup: Setup, limit: int = 65536) -> int:
    """The largest micro batch per GPU that ``kit.estimate`` says fits (0 if not even 1 does)."""
    from kit.estimate import estimate

    def fits(micro: int) -> bool:
        candidate = setup.replace(batch={"micro_batch": micro})
        return estimate(candidate).fits[candidate.cluster.gpu]

    if not fits(1):
        return 0
    low, high = 1, 2
    while high <= limit and fits(high):
        low, high = high, high * 2
    high = min(high, limit + 1)
    while high - low > 1:  # invariant: fits(low), not fits(high) (or high past the limit)
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def _powers_of_two_up_to(n: int) -> list[int]:
    sizes = [1]
    while sizes[-1] * 2 <= n:
        sizes.append(sizes[-1] * 2)
    return sizes if sizes[-1] == n else [*sizes, n]
