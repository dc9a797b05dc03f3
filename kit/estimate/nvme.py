"""ZeRO-Infinity (NVMe offload, stage 3): what goes to the drive, what stays in pinned RAM, on the GPU.

Read from DeepSpeed 0.19's swappers (``deepspeed/runtime/swap_tensor/``) and ``runtime/zero/stage3.py``,
checked against the swap files and tensors of a live 2-rank engine (``tests/test_nvme.py``):

- a tensor is swapped only when it is at least ``max(MIN_AIO_BYTES, aio.block_size)`` bytes
  (``swappable_tensor`` / ``is_swappable_tensor``); smaller ones stay in (pinned) CPU RAM;
- every swap file is a multiple of ``AIO_ALIGNED_BYTES x intra_op_parallelism`` bytes
  (``_io_aligned_numel``);
- parameters (``offload_param: nvme``): each released tensor's partition, ``ceil(numel / dp)``
  16-bit elements, is one file ``<ds_id>_param.tensor.swp`` written by ``zero.Init``; tensors kept
  whole (persistence threshold) stay on the GPU. ``max_in_cpu`` elements of partitions are copied into
  one pinned flat buffer per parameter group at engine start (``_create_param_groups_fp16_flat_cpu_memory``)
  and live there; their files stay on the drive, unused. The swapper's pool is ``buffer_count`` pinned
  buffers of ``buffer_size`` elements; with sub groups left on NVMe, a pinned reuse buffer of the
  largest sub group's whole tensors (``reserve_partitioned_swap_space``) too;
- optimizer (``offload_optimizer: nvme``): per sub group of partitions (``sub_group_size``), the fp32
  master and each fp32 optimizer state are one file each; the pool is ``buffer_count`` pinned buffers
  of the largest sub group (``SwapBufferManager``).

``stage3`` turns the device/host terms of ``kit.estimate.memory`` into those of an NVMe setup and adds
the third place, ``nvme``: bytes of this rank's swap files.
"""

from __future__ import annotations

from functools import lru_cache

from kit.components import HELD, Component
from kit.estimate import partition
from kit.estimate.result import NONE, Term, total
from kit.rules import (
    AIO_ALIGNED_BYTES,
    DS_SUB_GROUP_SIZE,
    FP32,
    MIN_AIO_BYTES,
    Offload,
    element_bytes,
    optimizer_states,
)
from kit.schema import ModelSpec, Setup


def min_swap_bytes(setup: Setup) -> int:
    """The smallest tensor (bytes) DeepSpeed swaps: max(MIN_AIO_BYTES, aio.block_size)."""
    return max(MIN_AIO_BYTES, setup.zero.aio.block_size)


def io_aligned(numel: int, element: int, setup: Setup) -> int:
    """``numel`` rounded up to the swap files' alignment, ``AIO_ALIGNED_BYTES x intra_op_parallelism``."""
    step = AIO_ALIGNED_BYTES * setup.zero.aio.intra_op_parallelism // element
    return -(-numel // step) * step


def partitions(setup: Setup) -> list[tuple[int, int]]:
    """(numel, partition numel ``ceil(numel / dp)``) of every tensor, in the model's order."""
    return list(_partitions(setup.model, setup.zero_dp))


@lru_cache(maxsize=512)
def _partitions(model: ModelSpec, n: int) -> tuple[tuple[int, int], ...]:
    return tuple((t, -(-t // n)) for t in partition.numels(Setup(model=model, batch={})))


def sub_groups(setup: Setup) -> list[list[tuple[int, int]]]:
    """Stage 3's sub groups (``_create_fp16_sub_groups``): partitions packed in order until a group
    reaches ``sub_group_size`` elements; one group when the whole partition is smaller."""
    return [list(group) for group in _sub_groups(setup.model, setup.zero_dp)]


@lru_cache(maxsize=512)
def _sub_groups(model: ModelSpec, n: int) -> tuple[tuple[tuple[int, int], ...], ...]:
    parts = _partitions(model, n)
    if sum(p for _, p in parts) <= DS_SUB_GROUP_SIZE:
        return (parts,)
    groups, group, size = [], [], 0
    for item in parts:
        group.append(item)
        size += item[1]
        if size >= DS_SUB_GROUP_SIZE:
            groups.append(tuple(group))
            group, size = [], 0
    if group:
        groups.append(tuple(group))
    return tuple(groups)


def swapped_params(setup: Setup) -> list[int]:
    """Partition numels of the tensors ``zero.Init`` swaps to NVMe (released and large enough)."""
    z, p = setup.zero, element_bytes(setup.zero.precision)
    return list(_swapped(setup.model, setup.zero_dp, z.param_persistence_threshold, p, min_swap_bytes(setup)))


@lru_cache(maxsize=512)
def _swapped(model: ModelSpec, n: int, threshold: int, p: int, smallest: int) -> tuple[int, ...]:
    return tuple(part for numel, part in _partitions(model, n) if numel > threshold and part * p >= smallest)


def problem(setup: Setup) -> tuple[str, str] | None:
    """``(field, reason)`` for what DeepSpeed's swappers would assert on, else None."""
    z = setup.zero
    if z.offload_param is not Offload.NVME:
        return None
    swapped = swapped_params(setup)
    if swapped and max(swapped) > z.buffer_size:
        return "buffer_size", (
            f"must be >= {max(swapped):,} elements, the largest parameter partition swapped to NVMe "
            f"(DeepSpeed asserts 'More elements ... than buffer size'), got {z.buffer_size:,}"
        )
    return None


def stage3(setup: Setup, device: dict[str, Term], host: dict[str, Term]) -> dict[str, dict[str, Term]]:
    """The stage-3 ``device``/``host`` terms of ``kit.estimate.memory`` with NVMe offload applied,
    and ``nvme``: this rank's swap files."""
    z = setup.zero
    issue = problem(setup)
    if issue:
        raise ValueError(": ".join(issue))
    nvme: dict[str, Term] = dict.fromkeys(HELD, NONE)
    device, host = dict(device), dict(host)
    if z.offload_param is Offload.NVME:
        _params(setup, device, host, nvme)
    if z.offload_optimizer is Offload.NVME:
        _optimizer(setup, device, host, nvme)
    return {"device": device, "host": host, "nvme": nvme}


def _params(setup: Setup, device: dict, host: dict, nvme: dict) -> None:
    z, p = setup.zero, element_bytes(setup.zero.precision)
    parts = partitions(setup)
    swapped = swapped_params(setup)
    files = sum(io_aligned(s, p, setup) for s in swapped)
    nvme[Component.PARAMETERS] = Term(
        p * files,
        f"{p} B x {files:,}: {len(swapped)} partitions of >= {min_swap_bytes(setup):,} B "
        f"(max(1 MiB, aio.block_size)), each aligned to {AIO_ALIGNED_BYTES * z.aio.intra_op_parallelism} B",
    )
    # what stays in RAM: max_in_cpu elements of partitions in one pinned flat buffer per group, the rest
    # in pinned partitions of their own where too small to swap
    size = sum(part for _, part in parts)
    in_cpu = min(size, z.max_in_cpu)
    kept: list[Term] = []
    if in_cpu == size:
        kept.append(Term(p * size, f"{p} B x S = {size:,} (fp16 flat buffer in CPU, S <= max_in_cpu)"))
    else:
        # every partition not swapped keeps a pinned ds_tensor in RAM (kept-whole tensors included)
        small = sum(part for _, part in parts) - sum(swapped)
        if in_cpu:
            kept.append(Term(p * in_cpu, f"{p} B x max_in_cpu {in_cpu:,} (fp16 flat buffer in CPU)"))
        if small:
            kept.append(Term(p * small, f"{p} B x {small:,} (partitions too small to swap)"))
    host[Component.PARAMETERS] = total(kept)
    pool = z.buffer_count * io_aligned(z.buffer_size, p, setup)
    host[Component.BUFFERS] = host[Component.BUFFERS] + Term(
        p * pool,
        f"{p} B x buffer_count {z.buffer_count} x buffer_size {z.buffer_size:,} (param swap buffers)",
    )
    if in_cpu < size:
        largest = max(sub_groups(setup), key=lambda g: sum(part for _, part in g))
        reuse = sum(io_aligned(t, p, setup) for t, _ in largest)
        host[Component.BUFFERS] = host[Component.BUFFERS] + Term(
            p * reuse, f"{p} B x {reuse:,} (reuse buffer: the largest sub group's tensors, whole)"
        )
    device[Component.PARAMETERS] = _persistent(setup)


def _optimizer(setup: Setup, device: dict, host: dict, nvme: dict) -> None:
    z = setup.zero
    k = optimizer_states(z.optimizer, z.momentum)
    groups = [sum(part for _, part in g) for g in sub_groups(setup)]
    swapped = [s for s in groups if s * FP32 >= min_swap_bytes(setup)]
    aligned = sum(io_aligned(s, FP32, setup) for s in swapped)
    nvme[Component.OPTIMIZER_STATES] = Term(
        (1 + k) * FP32 * aligned,
        f"(1 fp32 master + {k} fp32 states) x 4 B x {aligned:,} ({len(swapped)} sub group partition(s), "
        "aligned)",
    )
    kept = sum(s for s in groups if s * FP32 < min_swap_bytes(setup))
    host[Component.OPTIMIZER_STATES] = (
        Term((1 + k) * FP32 * kept, "sub groups too small to swap") if kept else NONE
    )
    largest = io_aligned(max(groups), FP32, setup)
    host[Component.BUFFERS] = host[Component.BUFFERS] + Term(
        FP32 * z.optimizer_buffer_count * largest,
        f"4 B x buffer_count {z.optimizer_buffer_count} x largest sub group {largest:,} "
        "(optimizer swap buffers)",
    )
    # gradients: the 16-bit partition buffer in RAM (as with CPU offload); each tensor's fp32 gradient
    # partition goes to a file of its own when large enough (``_swap_out_gradients``; a length that is not
    # a multiple of the alignment is split and its remainder kept in RAM, ``_adjust_for_misaligned_lengths``)
    p, size = element_bytes(z.precision), sum(groups)
    files = _gradient_files(setup.model, setup.zero_dp, min_swap_bytes(setup), io_aligned(1, FP32, setup))
    nvme[Component.GRADIENTS] = Term(
        FP32 * files, f"4 B x {files:,} (fp32 gradient partitions of >= {min_swap_bytes(setup):,} B)"
    )
    host[Component.GRADIENTS] = Term(p * size, f"{p} B x S (grad_partitions_flat_buffer)") + (
        Term(FP32 * (size - files), f"4 B x {size - files:,} (fp32 gradients too small to swap)")
        if size - files
        else NONE
    )
    device[Component.OPTIMIZER_STATES] = NONE
    device[Component.GRADIENTS] = NONE


@lru_cache(maxsize=512)
def _gradient_files(model: ModelSpec, n: int, smallest: int, step: int) -> int:
    """Elements of all of a rank's fp32 gradient partitions that go to swap files: of each tensor's, when
    at least ``smallest`` bytes, its multiple of ``step`` (the alignment) if that still is."""
    files = 0
    for _, part in _partitions(model, n):
        aligned = part // step * step
        if part * FP32 >= smallest and aligned * FP32 >= smallest:
            files += aligned
    return files


def _persistent(setup: Setup) -> Term:
    z, p, n = setup.zero, element_bytes(setup.zero.precision), setup.zero_dp
    kept = [t for t in partition.numels(setup) if t <= z.param_persistence_threshold]
    elements = sum(-(-t // n) * n for t in kept)
    if not elements:
        return NONE
    return Term(p * elements, f"{len(kept)} tensors <= {z.param_persistence_threshold:,} kept whole")


def nvme_bytes_per_node(setup: Setup, per_rank: dict[str, Term]) -> Term:
    """Bytes of swap files on one node's drives: every rank's files (stage 3 ranks hold equal partitions)."""
    g, z = setup.cluster.gpus_per_node, setup.zero
    each = sum(t.bytes for t in per_rank.values())
    pairs = (("parameters", z.offload_param), ("optimizer states and fp32 gradients", z.offload_optimizer))
    held = [what for what, device in pairs if device is Offload.NVME]
    return Term(g * each, f"{g} ranks x {each:,} B of swap files ({' + '.join(held)})")
