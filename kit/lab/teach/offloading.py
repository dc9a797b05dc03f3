"""Offload to CPU and NVMe (ZeRO-Infinity): stage 3 with CPU offload beside NVMe offload for a model
(``nvme_table``), and the ZeRO-Infinity paper's memory per model size (``infinity_table``) and bandwidth
per tier (``infinity_bandwidth``).

What it cannot see: a drive's real speed (``zerokit calibrate --nvme`` measures it); the paper's tables
are its idealised numbers.
"""

from __future__ import annotations

import pandas as pd

from kit.ds_keys import EXAMPLE_NVME_PATH
from kit.schema import Setup


def nvme_table(setup: Setup, nvme_path: str = EXAMPLE_NVME_PATH) -> pd.DataFrame:
    """Stage 3 with CPU offload beside ZeRO-Infinity's NVMe offload for ``setup``'s model and cluster:
    GiB per GPU, pinned CPU RAM and swap files per node, predicted step time and slowdown vs CPU offload
    (``kit.estimate``, ``kit.steptime.perf``; parameter ``buffer_size`` sized to the largest tensor)."""
    from kit.estimate import estimate, partition
    from kit.steptime import perf

    base = setup.replace(zero={"stage": 3})
    size = max(base.zero.buffer_size, partition.largest_tensor(base))
    variants = {
        "CPU: optimizer": {"offload_optimizer": "cpu", "offload_param": "none"},
        "CPU: optimizer + params": {"offload_optimizer": "cpu", "offload_param": "cpu"},
        "NVMe: optimizer": {"offload_optimizer": "nvme", "offload_param": "none"},
        "NVMe: optimizer + params": {"offload_optimizer": "nvme", "offload_param": "nvme"},
    }
    rows, steps = [], {}
    for name, zero in variants.items():
        s = base.replace(zero={**zero, "nvme_path": nvme_path, "buffer_size": size})
        e, t = estimate(s), perf.step_time(s)
        steps[name] = t.step_s
        rows.append(
            {
                "variant": name,
                "GPU GiB": e.per_gpu_bytes / 2**30,
                "CPU RAM GiB per node": e.cpu_bytes_per_node / 2**30,
                "NVMe GiB per node": e.nvme_bytes_per_node / 2**30,
                "step s": t.step_s,
                "slowdown vs CPU": t.step_s / steps[name.replace("NVMe", "CPU")],
            }
        )
    return pd.DataFrame(rows).set_index("variant")


def infinity_table(batch: int = 32, gpu_batch: int = 4, seq: int = 1024, ci: int = 1) -> pd.DataFrame:
    """The ZeRO-Infinity paper's memory requirements per model size (its Figure 2a,
    ``kit.estimate.infinity``): model states and activation checkpoints in TiB for the whole model,
    working memory per GPU in GiB."""
    from kit.estimate import infinity

    rows = []
    for name, (layers, hidden, heads) in infinity.PAPER_MODELS.items():
        m = infinity.memory(layers, hidden, heads, batch=batch, gpu_batch=gpu_batch, seq=seq, ci=ci)
        rows.append(
            {
                "model": name,
                "params (T)": m.params / 1e12,
                "layers": layers,
                "hidden": hidden,
                "heads": heads,
                "model states (TiB)": m.model_states / 2**40,
                "act. checkpoints (TiB)": m.activation_checkpoints / 2**40,
                "model-state working mem per GPU (GiB)": m.model_state_working / 2**30,
                "act. working mem per GPU (GiB)": m.activation_working / 2**30,
            }
        )
    return pd.DataFrame(rows).set_index("model")


def infinity_bandwidth(
    batches: tuple[int, ...] = (1, 2, 4, 8, 16),
    hidden: int = 2048,
    seq: int = 1024,
    peak_tflops: float = 70.0,
) -> pd.DataFrame:
    """GB/s each tier needs for 50% and 90% efficiency (the paper's section 4, ``kit.estimate.infinity``):
    parameters and gradients and optimizer states per batch size per GPU, activation checkpoints at
    ``hidden``."""
    from kit.estimate import infinity

    rows = []
    for tier in ("params_grads", "optimizer_states", "activation_checkpoints"):
        for b in batches if tier != "activation_checkpoints" else (1,):
            ait = infinity.intensity(tier, seq=seq, batch=b, hidden=hidden)
            row = {"tier": tier, "batch per GPU": b if tier != "activation_checkpoints" else None, "ait": ait}
            for e in (0.5, 0.9):
                row[f"GB/s for {e:.0%}"] = infinity.bandwidth_for(e, ait, peak_tflops)
            rows.append(row)
    return pd.DataFrame(rows)
