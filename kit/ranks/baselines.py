"""PyTorch's own data-parallel engines inside a launched rank: DDP and FSDP2, run like the ZeRO configs.

``wrap(model, setup)`` returns a ``TorchEngine``: the same calls ``kit.ranks.engine.train_step`` makes
of a DeepSpeed engine (``engine(*args)``, ``backward(loss)``, ``step()``, ``device``, ``destroy()``)
with DeepSpeed's semantics, so that every configuration of a sweep trains the same way on the same data:
the loss is divided by the gradient accumulation steps, gradients are averaged over ranks, clipped to
the ds_config's ``gradient_clipping`` and stepped at the boundary by the torch optimizer DeepSpeed's
``torch_adam`` uses, at the same learning rate.

- ``ddp``: ``DistributedDataParallel`` (default buckets, ``gradient_as_bucket_view=False``), ``no_sync``
  on the micro-steps before the boundary, bf16 under ``torch.autocast``.
- ``fsdp`` / ``fsdp-grad-op``: FSDP2 ``fully_shard`` on every block of the model's largest ModuleList
  and on the root, over a 1-D device mesh of all ranks; ``reshard_after_forward`` True for ``fsdp``
  (stage 3), False for ``fsdp-grad-op`` (stage 2); bf16 through ``MixedPrecisionPolicy``; gradients
  reduce-scattered every micro-step, as ZeRO-3 does.

What they send is counted where it is sent: a DDP communication hook and FSDP2's custom all-gather and
reduce-scatter (``set_custom_all_gather``), in the comms logger's convention (``kit.rules.wire_factor``);
``model_state_bytes`` reads what a rank holds (the measured side of ``kit.estimate.baselines``).
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
from torch.distributed.tensor import DTensor

from kit.components import HELD, Component
from kit.ds_config import GRADIENT_CLIPPING, LEARNING_RATE
from kit.rules import baseline_name
from kit.schema import Setup
from kit.workloads import blocks


class CommCounter:
    """Bytes per collective since the last ``reset``, and the DDP buckets of the last synced backward."""

    def __init__(self) -> None:
        self.sent: dict[str, int] = {}
        self.buckets: dict[int, int] = {}

    def add(self, op: str, tensor) -> None:
        self.sent[op] = self.sent.get(op, 0) + tensor.numel() * tensor.element_size()

    def reset(self) -> None:
        self.sent.clear()


#: this process's counter (``kit.ranks.measure.comm_bytes`` adds it to DeepSpeed's collectives)
COUNTER = CommCounter()


class TorchEngine:
    """A DDP- or FSDP-wrapped module and its optimizer, stepped as DeepSpeed steps an engine."""

    def __init__(self, module, optimizer, setup: Setup, device) -> None:
        self.module, self.optimizer, self.device = module, optimizer, device
        self.name = baseline_name(setup.zero.engine, setup.zero.stage)
        self.grad_accum = setup.batch.grad_accum
        self.micro_steps = 0
        bf16 = setup.zero.precision == "bf16" and self.name == "ddp"
        self._autocast = (
            (lambda: torch.autocast(device.type, torch.bfloat16)) if bf16 else contextlib.nullcontext
        )
        self._no_sync = contextlib.ExitStack()

    @property
    def boundary(self) -> bool:
        return (self.micro_steps + 1) % self.grad_accum == 0

    def __call__(self, *args, **kwargs):
        if self.name == "ddp":
            if self.boundary:
                COUNTER.buckets.clear()
            else:  # DDP's no_sync covers forward and backward: entered here, left after backward
                self._no_sync.enter_context(self.module.no_sync())
        with self._autocast():
            return self.module(*args, **kwargs)

    def backward(self, loss) -> None:
        (loss / self.grad_accum).backward()
        self._no_sync.close()

    def step(self) -> None:
        if self.boundary:
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), GRADIENT_CLIPPING)
            self.optimizer.step()
            self.optimizer.zero_grad()
        self.micro_steps += 1

    def destroy(self) -> None:
        COUNTER.buckets.clear()
        self.optimizer.state.clear()
        self.module = self.optimizer = None


def wrap(model, setup: Setup) -> TorchEngine:
    """``model`` (built on CPU, same weights on every rank) wrapped for ``setup``'s baseline on this rank."""
    device = torch.device(get_accelerator().current_device_name())
    model = model.to(device)
    z = setup.zero
    if z.engine == "ddp":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        from torch.nn.parallel import DistributedDataParallel

        local = [int(os.environ.get("LOCAL_RANK", 0))] if device.type == "cuda" else None
        module = DistributedDataParallel(model, device_ids=local)

        def counted(state, bucket):
            buffer = bucket.buffer()
            COUNTER.add("all_reduce", buffer)
            COUNTER.buckets[bucket.index()] = buffer.untyped_storage().nbytes()
            return allreduce_hook(state, bucket)

        module.register_comm_hook(None, counted)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if z.precision == "bf16" else None)
        reshard = z.stage == 3
        for block in blocks(model):  # then the root holds what is left (embeddings, head)
            fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
        module = fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
        for unit in module.modules():
            if hasattr(unit, "set_custom_all_gather"):
                unit.set_custom_all_gather(_CountedAllGather())
                unit.set_custom_reduce_scatter(_CountedReduceScatter())
    return TorchEngine(module, _optimizer(module, setup), setup, device)


def _optimizer(module, setup: Setup):
    """The torch optimizer DeepSpeed builds for ``torch_adam`` (AdamW, Adam) or SGD, with its defaults."""
    z = setup.zero
    params = module.parameters()
    if z.optimizer == "sgd":
        return torch.optim.SGD(params, lr=LEARNING_RATE, momentum=z.momentum)
    kind = torch.optim.AdamW if z.optimizer == "adamw" else torch.optim.Adam
    return kind(params, lr=LEARNING_RATE)


class _CountedAllGather(AllGather):
    """FSDP2's all-gather, counted (the shard each rank sends, as the comms logger records it)."""

    def allocate(self, size, *, dtype, device):
        return torch.empty(size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        COUNTER.add("all_gather", input_tensor)
        return dist.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)


class _CountedReduceScatter(ReduceScatter):
    """FSDP2's reduce-scatter, counted (the whole input, as the comms logger records it)."""

    def allocate(self, size, *, dtype, device):
        return torch.empty(size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        COUNTER.add("reduce_scatter", input_tensor)
        return dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group, async_op=async_op)


def model_state_bytes(engine: TorchEngine, setup: Setup) -> dict[str, dict[str, int]]:
    """What this rank holds right after a boundary backward, by component: the (local shards of the)
    parameters, their gradients, the optimizer's state and DDP's gradient buckets; each storage once."""
    out: dict[str, dict[str, int]] = {"device": dict.fromkeys(HELD, 0), "host": dict.fromkeys(HELD, 0)}
    on_cpu = get_accelerator().device_name() == "cpu"
    seen: set[tuple[int, str]] = set()

    def count(tensor, component: str) -> None:
        tensor = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        if not isinstance(tensor, torch.Tensor) or tensor.numel() <= 1:
            return
        storage = tensor.untyped_storage()
        key = (storage.data_ptr(), tensor.device.type)
        if storage.nbytes() and key not in seen:
            seen.add(key)
            where = "host" if tensor.device.type == "cpu" and not on_cpu else "device"
            out[where][component] += storage.nbytes()

    for p in engine.module.parameters():
        count(p, Component.PARAMETERS)
        if p.grad is not None:
            count(p.grad, Component.GRADIENTS)
    for state in engine.optimizer.state.values():
        for value in state.values():
            count(value, Component.OPTIMIZER_STATES)
    out["device"][Component.BUFFERS] += sum(COUNTER.buckets.values())
    return out
