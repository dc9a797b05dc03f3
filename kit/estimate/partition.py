"""How DeepSpeed splits a model's elements across data-parallel ranks (the shapes behind every byte count).

Stages 1-2 flatten the 16-bit parameters into one buffer padded to a multiple of ``2 x dp`` elements
and give rank ``r`` the range ``[r P, (r+1) P)``; stage 3 partitions every tensor separately,
``ceil(numel / dp)`` each. Both need the model's tensor list (``kit.models.tensor_numels``); a bare
parameter count is approximated as its largest layer plus one tensor for the rest.
"""

from __future__ import annotations

from functools import lru_cache

from kit.models import spec_tensors
from kit.rules import NCCL_ALIGNMENT
from kit.schema import ModelSpec, Setup


def partition_numel(setup: Setup) -> int:
    """Elements of the fp32 master partition one rank holds (what its optimizer-state file stores):
    stages 1-2, the 16-bit flat buffer padded to a multiple of ``2 x dp`` divided by dp; stage 3, the
    sum over tensors of ``ceil(numel / dp)``; stage 0, every parameter."""
    n = setup.dp
    if setup.zero.stage == 3:
        return _stage3_partition(setup.model, n)
    if setup.zero.stage in (1, 2):
        return -(-setup.model.params // (NCCL_ALIGNMENT * n)) * NCCL_ALIGNMENT
    return setup.model.params


@lru_cache(maxsize=512)
def _stage3_partition(model: ModelSpec, n: int) -> int:
    return sum(-(-t // n) for t in numels(Setup(model=model)))


def numels(setup: Setup) -> tuple[int, ...]:
    """Every parameter tensor's numel; for a bare count, the largest layer and one tensor for the rest."""
    exact = spec_tensors(setup.model)
    if exact is not None:
        return exact
    m = setup.model
    rest = m.params - m.largest_layer_params
    return (m.largest_layer_params,) + ((rest,) if rest else ())


def padded(numel: int, n: int) -> int:
    """``numel`` rounded up to a multiple of ``n`` ranks: ceil(numel / n) x n, a stage-3 tensor's size
    gathered (its n partitions) or flattened for a reduce-scatter."""
    return -(-numel // n) * n


def released(setup: Setup) -> tuple[int, ...]:
    """Numels of the tensors stage 3 partitions and gathers for each use (more than
    ``param_persistence_threshold`` elements), in the model's order."""
    return _released(setup.model, setup.zero.param_persistence_threshold)


@lru_cache(maxsize=512)
def _released(model: ModelSpec, threshold: int) -> tuple[int, ...]:
    return tuple(t for t in numels(Setup(model=model)) if t > threshold)


def kept_to_backward(setup: Setup) -> frozenset[int]:
    """Indices (in ``numels``' order) of the tensors stage 3 keeps gathered from their forward to their
    backward: released ones used again within ``max_reuse_distance`` elements of the trace still to run
    (``release_sub_module``'s ``__params_to_release``): for tensor i, the tensors after it in the forward
    and then the same ones again in backward, 2 x the elements after it."""
    z = setup.zero
    return _kept(setup.model, z.param_persistence_threshold, z.max_reuse_distance)


@lru_cache(maxsize=512)
def _kept(model: ModelSpec, threshold: int, reuse_distance: int) -> frozenset[int]:
    tensors, kept, after = numels(Setup(model=model)), set(), 0
    for i in reversed(range(len(tensors))):  # ``after``: the elements after tensor i in the forward
        if tensors[i] > threshold and 2 * after < reuse_distance:
            kept.add(i)
        after += tensors[i]
    return frozenset(kept)


def gathered_padded(setup: Setup) -> tuple[int, int]:
    """Elements, each tensor padded to the ranks, of every released tensor and of those
    ``kept_to_backward`` (what stage 3 holds gathered at most, and to the backward)."""
    z = setup.zero
    return _gathered_padded(setup.model, z.param_persistence_threshold, z.max_reuse_distance, setup.dp)


@lru_cache(maxsize=512)
def _gathered_padded(model: ModelSpec, threshold: int, reuse_distance: int, n: int) -> tuple[int, int]:
    tensors = numels(Setup(model=model))
    every = sum(padded(t, n) for t in _released(model, threshold))
    return every, sum(padded(tensors[i], n) for i in _kept(model, threshold, reuse_distance))


def persistent(setup: Setup) -> tuple[int, ...]:
    """Numels of the tensors stage 3 keeps whole on every rank (at most ``param_persistence_threshold``
    elements), in the model's order."""
    return _persistent(setup.model, setup.zero.param_persistence_threshold)


@lru_cache(maxsize=512)
def _persistent(model: ModelSpec, threshold: int) -> tuple[int, ...]:
    return tuple(t for t in numels(Setup(model=model)) if t <= threshold)


def persistent_padded(setup: Setup) -> int:
    """Elements of the persistent tensors, each padded to the ranks (what stage 3 gathers of them)."""
    return _persistent_padded(setup.model, setup.zero.param_persistence_threshold, setup.dp)


@lru_cache(maxsize=512)
def _persistent_padded(model: ModelSpec, threshold: int, n: int) -> int:
    return sum(padded(t, n) for t in _persistent(model, threshold))


def is_exact(setup: Setup) -> bool:
    """Whether the tensor list is known (not approximated from a bare count)."""
    return spec_tensors(setup.model) is not None


def touched(setup: Setup) -> list[int]:
    """Per rank, the elements of every tensor overlapping its flat range (stage 1/2's gradient buffer,
    ``params_in_partition``); the last rank's range also carries the alignment padding. Without a
    tensor list every rank counts exactly its partition."""
    return list(_touched(setup.model, setup.dp, partition_numel(setup)))


@lru_cache(maxsize=512)
def _touched(model: ModelSpec, n: int, part: int) -> tuple[int, ...]:
    if spec_tensors(model) is None:
        return (part,) * n
    out = [0] * n
    start = 0
    for t in spec_tensors(model):
        first, last = start // part, min((start + t - 1) // part, n - 1)
        for r in range(first, last + 1):
            out[r] += t
        start += t
    out[-1] += part * n - start
    return tuple(out)


def worst_rank(setup: Setup) -> int:
    """The rank whose stage 1/2 gradient buffer is largest (ranks differ only there, and in FSDP's
    optimizer states, whose largest shards are rank 0's)."""
    z = setup.zero
    if z.engine != "deepspeed" or z.stage not in (1, 2) or z.offload_optimizer == "cpu":
        return 0
    per_rank = touched(setup)
    return max(range(setup.dp), key=per_rank.__getitem__)


def largest_tensor(setup: Setup) -> int:
    """The largest single parameter tensor (the largest layer when the tensor list is unknown)."""
    return max(numels(setup)) if is_exact(setup) else setup.model.largest_layer_params
