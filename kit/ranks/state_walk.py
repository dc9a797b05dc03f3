"""Model-state bytes one rank really holds, read from DeepSpeed's own structures.

Walks the engine's module (parameters, their ``.grad`` and ZeRO-3 ``ds_tensor`` partitions) and the
ZeRO optimizer's attributes (lists, dicts, the wrapped torch optimizer and its ``state``), counts
each storage once (by storage pointer and device) and sorts it into parameters (ZeRO++ hpZ's
``ds_secondary_tensor`` included), gradients,
optimizer states or buffers by the structure it was found in. Scalars (step counters, norms, flags)
are left out. This is the measured side of ``kit.estimate.rank_states``.

What it cannot see: memory outside the structures it walks (the caching allocator's reserved but free
blocks, CUDA/NCCL workspaces, the comm backend's own buffers, temporaries of a step in flight); a
storage is sorted by the first path that reaches it, so a buffer DeepSpeed aliases under another name
counts once, under that name's component; and NVMe offload's files (``kit.ranks.nvme_files`` reads
those), only their pinned buffers in RAM.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator
from typing import TYPE_CHECKING

from kit.components import HELD, Component
from kit.rules import Offload

if TYPE_CHECKING:
    import torch

#: (pattern on the path where a storage is first found, component); first match wins.
RULES = [
    (r"\.grad$|averaged_gradients|grads_in_partition|grad_partitions_flat_buffer", Component.GRADIENTS),
    (r"all_grad_tensors|fp32_groups_gradient|unswapped_gradients", Component.GRADIENTS),
    (r"ipg_|temp_grad_buffer|param_buffer_of_bit16|nvme_swapper", Component.BUFFERS),
    (
        r"\.state\[|single_partition_of_fp32|fp32_partitioned_groups_flat|fp32_groups",
        Component.OPTIMIZER_STATES,
    ),
    (r"param_groups", Component.OPTIMIZER_STATES),
    (
        r"^module\.|bit16_groups_flat|fp16_partitioned_groups_flat|ds_tensor|ds_secondary_tensor",
        Component.PARAMETERS,
    ),
]
#: Structures DeepSpeed puts in CPU RAM when offloading (used when the accelerator itself is the CPU).
OFFLOADED_WITH_OPTIMIZER = r"\.state\[|single_partition_of_fp32|fp32_partitioned_groups_flat|param_groups|"
OFFLOADED_WITH_OPTIMIZER += r"grad_partitions_flat_buffer|temp_grad_buffer_for_cpu|param_buffer_of_bit16"
OFFLOADED_WITH_PARAMS = r"ds_tensor|ds_secondary_tensor|fp16_partitioned_groups_flat"
#: NVMe offload's pinned staging buffers in CPU RAM (the swappers' buffer pools)
NVME_SWAP_BUFFERS = r"swapper|param_groups_fp16_flat_cpu_memory"
MAX_DEPTH = 8


def model_state_bytes(engine, setup) -> dict[str, dict[str, int]]:
    """``{"device": {parameters, gradients, optimizer_states, buffers}, "host": {...}}`` for this rank
    (a PyTorch baseline's: ``kit.ranks.baselines.model_state_bytes``)."""
    if setup.zero.engine != "deepspeed":
        from kit.ranks import baselines

        return baselines.model_state_bytes(engine, setup)
    out: dict[str, dict[str, int]] = {"device": dict.fromkeys(HELD, 0), "host": dict.fromkeys(HELD, 0)}
    for path, tensor, nbytes in storages(engine):
        out[_location(path, tensor, setup)][classify(path)] += nbytes
    return out


def locations(engine, setup) -> tuple[dict[int, int], set[int]]:
    """The storages of ``model_state_bytes`` by place: ``({pointer: bytes} on the device, {pointers} on the
    host)`` (``kit.ranks.memory_timeline`` starts a step's level from them; none for a PyTorch baseline,
    whose states it finds as its ops read them)."""
    device: dict[int, int] = {}
    host: set[int] = set()
    if setup.zero.engine != "deepspeed":
        return device, host
    for path, tensor, nbytes in storages(engine):
        ptr = tensor.untyped_storage().data_ptr()
        if _location(path, tensor, setup) == "host":
            host.add(ptr)
        else:
            device[ptr] = nbytes
    return device, host


def storages(engine) -> list[tuple[str, torch.Tensor, int]]:
    """(path, tensor, storage bytes) for every distinct non-scalar storage the engine holds.

    Depth first, by an explicit stack: a recursive closure would be a reference cycle holding every tensor
    it found until Python's cyclic collector ran, at a random point of a later step (the memory timeline
    then counted a gradient bucket DeepSpeed had long dropped)."""
    import torch

    seen: dict[tuple[int, str], tuple[str, torch.Tensor, int]] = {}
    visited: set[int] = set()
    stack: list[tuple[object, str, int]] = [(engine.optimizer, "optimizer", 0), (engine.module, "module", 0)]
    while stack:
        obj, path, depth = stack.pop()
        if depth > MAX_DEPTH or id(obj) in visited:
            continue
        visited.add(id(obj))
        if isinstance(obj, torch.Tensor) and obj.device.type != "meta" and obj.numel() > 1:
            storage = obj.untyped_storage()
            key = (storage.data_ptr(), obj.device.type)
            if storage.nbytes() and key not in seen:
                seen[key] = (path, obj, storage.nbytes())
        stack.extend((item, name, depth + 1) for item, name in reversed(list(_children(obj, path))))
    return list(seen.values())


def _children(obj, path: str) -> Iterator[tuple[object, str]]:
    """(object, path) for what ``storages`` walks into from ``obj``, in order."""
    import torch

    if isinstance(obj, torch.Tensor):
        # the gradient, ZeRO-3's partition, ZeRO++ hpZ's secondary one, ZeRO-Infinity's pinned swap buffers
        for name in ("grad", "ds_tensor", "ds_secondary_tensor", "nvme_swapper"):
            if getattr(obj, name, None) is not None:
                yield getattr(obj, name), f"{path}.{name}"
    elif isinstance(obj, torch.nn.Module):
        yield from ((p, f"{path}.{name}") for name, p in obj.named_parameters())
    elif isinstance(obj, (list, tuple)):
        yield from ((item, f"{path}[{i}]") for i, item in enumerate(obj))
    elif isinstance(obj, dict):
        yield from ((item, f"{path}[{key if isinstance(key, str) else '.'}]") for key, item in obj.items())
    elif type(obj).__module__.startswith(("deepspeed", "torch.optim")) and hasattr(obj, "__dict__"):
        yield from ((item, f"{path}.{name}") for name, item in vars(obj).items())


def classify(path: str) -> str:
    for pattern, component in RULES:
        if re.search(pattern, path):
            return component
    return Component.BUFFERS


def _location(path: str, tensor, setup) -> str:
    """host (CPU RAM) or device; on the CPU accelerator, by the structures offload moves to CPU."""
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() != "cpu":
        return "host" if tensor.device.type == "cpu" else "device"
    z = setup.zero
    if z.offload_optimizer is not Offload.NONE and re.search(OFFLOADED_WITH_OPTIMIZER, path):
        return "host"
    if z.offload_param is not Offload.NONE and re.search(OFFLOADED_WITH_PARAMS, path):
        return "host"
    if z.nvme and re.search(NVME_SWAP_BUFFERS, path):
        return "host"
    return "device"


def summary(engine) -> dict[str, int]:
    """Bytes per first-seen structure path (indices folded): for debugging a mismatch."""
    out: dict[str, int] = defaultdict(int)
    for path, _, nbytes in storages(engine):
        out[re.sub(r"\[\d+\]", "[]", path)] += nbytes
    return dict(out)
