"""``kit.planning.plan.search``'s grid, evaluated a cluster and ZeRO variant at a time.

A plan's setups share most of their terms: the model states, CPU RAM and NVMe files of a cluster size and
ZeRO variant do not depend on the batch (``kit.estimate.memory.states``), the activations depend only on
the micro batch and checkpointing (``memory.batch_activations``), the bytes per GPU the fit screens on are
``memory.peak_per_gpu`` of those (``Estimate.screen_bytes``: the allocator's replay, which the verdict
adds, is ``Plan.confirm``'s, on the rows the plan names), and what a step asks of a GPU does not
depend on the GPU's type (``kit.steptime.perf.load``). So each term is computed once, by the functions
``estimate`` and ``step_time`` call, and the step time, cost and fit of every setup on every GPU type
come from one numpy evaluation of the same arithmetic (``perf.seconds`` of ``perf.Load.arrays`` on
``perf.stack``'s hardware, ``perf.run_cost``, ``kit.fit.fits``). ``tests/test_plan_grid.py`` checks rows
against the per-setup path.

A batch schedule or a token budget changes the batch a Setup trains with: such a plan estimates each of
its setups whole (``estimate``); a calibrated one times each setup per GPU type (``kit.steptime.calibrated``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from kit import batch as batch_math
from kit.estimate import memory
from kit.estimate.result import Term
from kit.fit import fits
from kit.gpus import gpu
from kit.schema import Setup
from kit.steptime import calibrated, perf
from kit.steptime.calibration import Calibration
from kit.units import GIB


def evaluate(
    base: Setup,
    groups: list[tuple[int, int, dict]],
    checkpointing: tuple[bool, ...],
    train_batch: int,
    hardware: dict[str, perf.Hardware],
    rates: dict[str, float],
    tokens: float,
    headroom: float,
    assume: perf.Assumptions,
    calibration: Calibration | None,
) -> pd.DataFrame:
    """``Plan.table``: for each ``(nodes, gpus_per_node, zero)`` of ``groups`` (``zero``: the Setup's
    ZeroSettings fields), each of ``checkpointing`` and each (micro batch, grad accum) making
    ``train_batch``, one row per GPU type of ``hardware`` (priced at ``rates``, USD per GPU-hour)."""
    names = list(hardware)
    stacked = perf.stack(list(hardware.values()))
    usd = np.array([rates[name] for name in names], dtype=float)
    whole = bool(base.batch.schedule or base.batch.max_tokens)  # the batch varies: estimate each setup
    precision = base.zero.precision
    rows: dict[str, list] = {key: [] for key in _PER_SETUP}
    loads: list[perf.Load] = []
    timed: list[list[float]] = []  # with a calibration: each setup's step_s per GPU type
    labels: list[str] = []
    saved: dict[tuple[int, bool], Term] = {}  # activations by (micro batch, checkpointing)
    for nodes, per, zero in groups:
        options = batch_math.decompositions(train_batch, nodes * per // base.zero.sequence_parallel_size)
        if not options:
            continue
        first = options[0]
        plain = base.replace(
            cluster={"nodes": nodes, "gpus_per_node": per},
            zero={**zero, **base.zero.checkpointing(False)},
            batch={"micro_batch": first.micro_batch, "grad_accum": first.grad_accum},
        )
        held = None if whole else memory.states(plain)
        batches = [plain.batch.model_copy(update=d._asdict()) for d in options]
        for ckpt in checkpointing:
            zero_ckpt = plain.zero.model_copy(update=base.zero.checkpointing(ckpt))
            for d, batch in zip(options, batches, strict=True):
                if whole:
                    candidate = base.replace(
                        cluster={"nodes": nodes, "gpus_per_node": per},
                        zero={**zero, **base.zero.checkpointing(ckpt)},
                        batch={"micro_batch": d.micro_batch, "grad_accum": d.grad_accum},
                    )
                    est = memory.estimate(candidate)
                    per_gpu, cpu, disk = est.screen_bytes, est.cpu_bytes_per_node, est.nvme_bytes_per_node
                else:
                    # checkpointing and a decomposition of the same global batch: valid where plain is
                    candidate = plain.model_copy(update={"zero": zero_ckpt, "batch": batch})
                    assert held is not None  # computed above when not whole
                    key = (d.micro_batch, ckpt)
                    if key not in saved:
                        saved[key] = memory.batch_activations(candidate)
                    line, overhead = memory.peak_per_gpu(candidate, held, saved[key])
                    per_gpu = line.peak_tensor_bytes + overhead.bytes
                    cpu, disk = memory.cpu_per_node(candidate, held).bytes, held.disk.bytes
                need = perf.load(candidate)
                loads.append(need)
                if calibration is not None:
                    timed.append(
                        [
                            calibrated.step_time(candidate, hw, assume, calibration).step_s
                            for hw in hardware.values()
                        ]
                    )
                z = candidate.zero
                values: tuple[object, ...] = (nodes, per, nodes * per, z.engine, z.stage)
                values += (z.offload_optimizer, z.offload_param)
                values += (z.zeropp_label, ckpt, d.micro_batch, d.grad_accum, per_gpu, cpu, disk)
                values += (need.intra, need.inter + need.rail, candidate.tokens_per_step)
                for column, value in zip(_PER_SETUP, values, strict=True):
                    rows[column].append(value)
                labels.append(f"{nodes}x{per} {candidate.label}")
    if not labels:
        return pd.DataFrame()
    step: float | NDArray[np.float64]  # perf.seconds' floats are arrays of (setup, GPU type) here
    if calibration is None:
        parts = perf.seconds(perf.Load.arrays(loads), stacked, assume)
        step = sum(parts[name] for name in perf.STEP_PARTS)
    else:
        step = np.array(timed)
    per_step = np.asarray(rows["tokens_per_step"])[:, None]
    world = np.asarray(rows["gpus"])[:, None]
    run = perf.run_cost(tokens, per_step, step, world, usd)
    times = {
        "step_s": step,
        "tokens_per_s": per_step / step,
        "hours": run["hours"],
        "cost_usd": run["cost_usd"],
    }
    return _table(rows, times, labels, names, precision, base.cluster.cpu_ram_per_node_bytes, headroom)


#: the columns that are one value per setup whatever its GPU type, in ``Plan.table``'s words where
#: they have one (bytes are turned into GiB at the end)
_PER_SETUP = (
    "nodes", "gpus_per_node", "gpus", "engine", "stage", "offload_optimizer", "offload_param", "zeropp",
    "checkpointing", "micro_batch", "grad_accum", "per_gpu", "cpu", "nvme", "intra", "inter",
    "tokens_per_step",
)  # fmt: skip


def _table(rows, times, labels, names, precision, ram, headroom) -> pd.DataFrame:
    """The per-setup columns repeated for each GPU type beside the per-GPU ones, in ``Plan.table``'s order."""
    count, strings = len(names), ("engine", "offload_optimizer", "offload_param", "zeropp")
    each = {key: np.repeat(np.asarray(values), count) for key, values in rows.items() if key not in strings}
    texts = {key: [value for value in rows[key] for _ in range(count)] for key in strings}
    per_gpu, cpu = np.asarray(rows["per_gpu"]), np.asarray(rows["cpu"])
    verdict = np.stack([fits(name, precision, per_gpu, cpu, ram, headroom) for name in names], axis=1)
    capacity = np.array([gpu(name).memory_bytes for name in names], dtype=float) / GIB
    grid = {key: np.broadcast_to(values, (len(labels), count)).ravel() for key, values in times.items()}
    return pd.DataFrame(
        {
            "gpu": names * len(labels),
            "nodes": each["nodes"],
            "gpus_per_node": each["gpus_per_node"],
            "gpus": each["gpus"],
            "engine": texts["engine"],
            "stage": each["stage"],
            "offload_optimizer": texts["offload_optimizer"],
            "offload_param": texts["offload_param"],
            "zeropp": texts["zeropp"],
            "checkpointing": each["checkpointing"],
            "micro_batch": each["micro_batch"],
            "grad_accum": each["grad_accum"],
            "per_gpu_gib": each["per_gpu"] / GIB,
            "capacity_gib": np.tile(capacity, len(labels)),
            "fits": verdict.ravel(),
            "flushes": False,  # the allocator's replay sets them (``Plan.confirm``)
            "confirmed": False,
            "cpu_gib_per_node": each["cpu"] / GIB,
            "nvme_gib_per_node": each["nvme"] / GIB,
            "comm_intra_gib": each["intra"] / GIB,
            "comm_inter_gib": each["inter"] / GIB,
            "step_s": grid["step_s"],
            "tokens_per_s": grid["tokens_per_s"],
            "hours": grid["hours"],
            "cost_usd": grid["cost_usd"],
            "label": [f"{name} {label}" for label in labels for name in names],
        }
    )
