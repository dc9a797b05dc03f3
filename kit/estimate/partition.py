"""How DeepSpeed splits a model's elements across data-parallel ranks (the shapes behind every byte count).

Stages 1-2 flatten the 16-bit parameters into one buffer padded to a multiple of ``2 x dp`` elements
and give rank ``r`` the range ``[r P, (r+1) P)``; stage 3 partitions every tensor separately,
``ceil(numel / dp)`` each. Both need the model's tensor list (``kit.models.tensor_numels``); a bare
parameter count is approximated as its largest layer plus one tensor for the rest.

With a trainable subset (``kit.trainable``: LoRA, frozen groups) the list is the adapted model's
(``kit.workloads.adapters.listing``, built on the meta device) and only the trainable tensors are
flattened at stages 0-2, have fp32 master weights, optimizer states and gradients (``trainable``); every
tensor, frozen or not, is partitioned and gathered at stage 3 (``numels``). With QLoRA a 4-bit weight's
tensor is its packed bf16 storage (``kit.trainable.nf4_bytes``), partitioned at stage 3 like any bf16
parameter that does not train; its quant state is no parameter, whole on every rank (``quant_state``).
"""

from __future__ import annotations

import math
from functools import lru_cache

from kit import trainable as subset
from kit.models import spec_shapes, spec_tensors
from kit.rules import NCCL_ALIGNMENT, Offload
from kit.schema import ModelSpec, Setup


def partition_numel(setup: Setup) -> int:
    """Elements of the fp32 master partition one rank holds (what its optimizer-state file stores):
    stages 1-2, the 16-bit flat buffer of the trainable parameters padded to a multiple of ``2 x dp``
    divided by dp; stage 3, the sum over trainable tensors of ``ceil(numel / dp)``; stage 0, every
    trainable parameter."""
    n = setup.zero_dp
    if setup.zero.stage == 3:
        return _sharded(trainable(setup), n)
    if setup.zero.stage in (1, 2):
        return -(-trainable_params(setup) // (NCCL_ALIGNMENT * n)) * NCCL_ALIGNMENT
    return trainable_params(setup)


def stage3_params(setup: Setup) -> int:
    """Elements of the 16-bit parameter partitions one rank holds at stage 3: ``ceil(numel / dp)`` of every
    tensor, trainable or frozen."""
    return _sharded(numels(setup), setup.zero_dp)


@lru_cache(maxsize=512)
def _sharded(tensors: tuple[int, ...], n: int) -> int:
    return sum(-(-t // n) for t in tensors)


def numels(setup: Setup) -> tuple[int, ...]:
    """Every parameter tensor's numel, adapters and frozen ones included; for a bare count, the largest
    layer and one tensor for the rest."""
    if subset.is_subset(setup.zero):
        return tuple(n for n, _ in listing(setup).tensors)
    exact = spec_tensors(setup.model)
    if exact is not None:
        return exact
    m = setup.model
    rest = m.params - m.largest_layer_params
    return (m.largest_layer_params,) + ((rest,) if rest else ())


def trainable(setup: Setup) -> tuple[int, ...]:
    """The numels of the tensors that train, in the model's order (what the ZeRO optimizers flatten,
    partition and step, and what gradients are reduced for): ``numels`` without a subset."""
    if subset.is_subset(setup.zero):
        return tuple(n for n, trains in listing(setup).tensors if trains)
    return numels(setup)


def computed_with(setup: Setup) -> tuple[int, ...]:
    """Per trainable tensor (``trainable``'s order), the elements of the tensor before it in the same
    module, whose gradient one backward node computes with its own and whose hook runs after its (the
    hooks walk the model backwards): a linear layer's weight before its bias, a 1-D tensor as long as one
    of the weight's dimensions and not followed by a 1-D tensor of its length (a norm's weight starts such
    a run, as after an embedding or a Llama MLP; a bias followed by a norm is missed, counted alone). 0
    throughout for a trainable subset or a bare count."""
    shapes = None if subset.is_subset(setup.zero) else spec_shapes(setup.model)
    if shapes is None:
        return (0,) * len(trainable(setup))
    out = [0] * len(shapes)
    for i in range(1, len(shapes)):
        weight, bias = shapes[i - 1], shapes[i]
        following = shapes[i + 1] if i + 1 < len(shapes) else None
        norm = following is not None and len(following) == 1 and following[0] == bias[0]
        if len(weight) == 2 and len(bias) == 1 and bias[0] in weight and not norm:
            out[i] = math.prod(weight)
    return tuple(out)


def trainable_params(setup: Setup) -> int:
    """Parameters that train (the model's count without a subset)."""
    return sum(trainable(setup)) if subset.is_subset(setup.zero) else setup.model.params


def frozen_params(setup: Setup) -> int:
    """Parameters that do not train (16-bit weights only, whole on every rank at stages 0-2)."""
    return sum(numels(setup)) - trainable_params(setup) if subset.is_subset(setup.zero) else 0


def quant_state(setup: Setup) -> tuple[int, int]:
    """(4-bit weights, bytes of their QuantStates) with QLoRA: modelled from bitsandbytes' algorithm
    (``kit.trainable.nf4_bytes``), measured on CPU through a plain-PyTorch equivalent (``kit.workloads.nf4``);
    (0, 0) without."""
    if not setup.zero.qlora:
        return 0, 0
    quantized = listing(setup).quantized
    return len(quantized), sum(subset.nf4_bytes(n)[1] for n in quantized)


def listing(setup: Setup):
    """What trains of ``setup``'s model (``kit.workloads.adapters.Listing``, built on the meta device and
    cached); None when every parameter trains (no torch then)."""
    if not subset.is_subset(setup.zero):
        return None
    from kit.workloads import adapters

    return adapters.listing(setup.model, setup.zero)


def gathers_in_place(setup: Setup) -> bool:
    """Whether stage 3's gathers allocate nothing: one rank holds every partition and they are on the
    device, so ``all_gather_coalesced`` takes ``_no_gather_coalesced`` and each parameter becomes a view
    of its own partition (DeepSpeed 0.19, ``partition_parameters.py`` ``NoGatherHandle``). With parameter
    offload its partition is copied to the device whole, a gather's size."""
    return setup.zero_dp == 1 and setup.zero.offload_param is Offload.NONE


def padded(numel: int, n: int) -> int:
    """``numel`` rounded up to a multiple of ``n`` ranks: ceil(numel / n) x n, a stage-3 tensor's size
    gathered (its n partitions) or flattened for a reduce-scatter."""
    return -(-numel // n) * n


def released(setup: Setup) -> tuple[int, ...]:
    """Numels of the tensors stage 3 partitions and gathers for each use (more than
    ``param_persistence_threshold`` elements), in the model's order."""
    return _released(numels(setup), setup.zero.param_persistence_threshold)


@lru_cache(maxsize=512)
def _released(tensors: tuple[int, ...], threshold: int) -> tuple[int, ...]:
    return tuple(t for t in tensors if t > threshold)


@lru_cache(maxsize=256)
def blocks(model: ModelSpec) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int]:
    """The model's tensors as ``(before, block, after, count)``: what precedes its repeated block (the
    embeddings), one block's tensors, what follows (the final norm, an untied head) and how many blocks:
    the longest run of ``layers`` copies of one block; a model without one is one block of every tensor."""
    tensors = numels(Setup(model=model, batch={}))
    layers = model.layers or 1
    n = len(tensors)
    for size in range(n // layers, 0, -1):
        for start in range(n - layers * size + 1):
            span = tensors[start : start + layers * size]
            if all(span[i] == span[i % size] for i in range(len(span))):
                return tensors[:start], span[:size], tensors[start + layers * size :], layers
    return (), tensors, (), 1


def prefetch_call(setup: Setup, after_head: bool = False) -> int:
    """Elements of one stage-3 prefetch of the repeated blocks' tensors: ``fetch_sub_module`` takes the
    released tensors in the trace's order into one call until they pass ``stage3_prefetch_bucket_size``,
    so a call overshoots the bucket by at most its last tensor. The largest over the blocks in the
    forward's order and the backward's; ``after_head``: the call the head's fetch makes, the backward's
    first (the last block's tensors, last first). Without a tensor list, the bucket."""
    bucket = setup.zero.prefetch_bucket_size
    if bucket <= 0 or not is_exact(setup):
        return max(bucket, 0)
    _, block, _, count = blocks(setup.model)
    threshold = setup.zero.param_persistence_threshold
    tensors = tuple(t for t in block * count if t > threshold)
    orders = (tensors[::-1],) if after_head else (tensors, tensors[::-1])
    return max(_prefetch_call(order, bucket, after_head) for order in orders)


@lru_cache(maxsize=512)
def _prefetch_call(order: tuple[int, ...], bucket: int, first_only: bool) -> int:
    """The largest call over ``order`` (only the one from its start with ``first_only``)."""
    best, end, total = 0, 0, 0
    for start in range(min(1, len(order)) if first_only else len(order)):
        while end < len(order) and total < bucket:  # from ``start``: until the bucket is passed
            total, end = total + order[end], end + 1
        best = max(best, total)
        total -= order[start]
    return best


def kept_to_backward(setup: Setup) -> frozenset[int]:
    """Indices (in ``numels``' order) of the tensors stage 3 keeps gathered from their forward to their
    backward: released ones used again within ``max_reuse_distance`` elements of the trace still to run
    (``release_sub_module``'s ``__params_to_release``): for tensor i, the tensors after it in the forward
    and then the same ones again in backward, 2 x the elements after it."""
    z = setup.zero
    return _kept(numels(setup), z.param_persistence_threshold, z.max_reuse_distance)


@lru_cache(maxsize=512)
def _kept(tensors: tuple[int, ...], threshold: int, reuse_distance: int) -> frozenset[int]:
    kept, after = set(), 0
    for i in reversed(range(len(tensors))):  # ``after``: the elements after tensor i in the forward
        if tensors[i] > threshold and 2 * after < reuse_distance:
            kept.add(i)
        after += tensors[i]
    return frozenset(kept)


def external_head(setup: Setup) -> int:
    """Elements of the tied word embeddings stage 3 holds gathered for the whole step, 0 if none. A model
    whose forward multiplies by the embeddings' weight itself, outside a head module
    (``ModelSpec.head_weight_external``: Megatron's ``GPTModel`` calls ``parallel_lm_logits`` with
    ``word_embeddings_weight()``), reads it through ``ZeROOrderedDict.__getitem__`` while the engine's
    forward runs, which registers it as an external parameter of the module running, the top one
    (DeepSpeed 0.8-0.19, ``parameter_offload.py``): fetched with that module's forward and held until its
    backward ends, from the step's first hook to its last."""
    m, z = setup.model, setup.zero
    fused = z.loss != "plain"
    if not ((m.head_weight_external and m.tied_embeddings) or fused) or not (m.vocab and m.hidden):
        return 0
    if z.engine != "deepspeed" or z.stage != 3 or m.vocab * m.hidden <= z.param_persistence_threshold:
        return 0
    return m.vocab * m.hidden


def gathered_padded(setup: Setup) -> tuple[int, int]:
    """Elements, each tensor padded to the ranks, of every released tensor and of those
    ``kept_to_backward`` (what stage 3 holds gathered at most, and to the backward)."""
    z = setup.zero
    return _gathered_padded(numels(setup), z.param_persistence_threshold, z.max_reuse_distance, setup.zero_dp)


@lru_cache(maxsize=512)
def _gathered_padded(
    tensors: tuple[int, ...], threshold: int, reuse_distance: int, n: int
) -> tuple[int, int]:
    every = sum(padded(t, n) for t in _released(tensors, threshold))
    return every, sum(padded(tensors[i], n) for i in _kept(tensors, threshold, reuse_distance))


def persistent(setup: Setup) -> tuple[int, ...]:
    """Numels of the tensors stage 3 keeps whole on every rank (at most ``param_persistence_threshold``
    elements), in the model's order."""
    return _persistent(numels(setup), setup.zero.param_persistence_threshold)


@lru_cache(maxsize=512)
def _persistent(tensors: tuple[int, ...], threshold: int) -> tuple[int, ...]:
    return tuple(t for t in tensors if t <= threshold)


def persistent_padded(setup: Setup) -> int:
    """Elements of the persistent tensors, each padded to the ranks (what stage 3 gathers of them)."""
    return _persistent_padded(numels(setup), setup.zero.param_persistence_threshold, setup.zero_dp)


@lru_cache(maxsize=512)
def _persistent_padded(tensors: tuple[int, ...], threshold: int, n: int) -> int:
    return sum(padded(t, n) for t in _persistent(tensors, threshold))


def is_exact(setup: Setup) -> bool:
    """Whether the tensor list is known (not approximated from a bare count)."""
    return subset.is_subset(setup.zero) or spec_tensors(setup.model) is not None


def touched(setup: Setup) -> list[int]:
    """Per rank, the elements of every trainable tensor overlapping its flat range (stage 1/2's gradient
    buffer, ``params_in_partition``); the last rank's range also carries the alignment padding. Without
    a tensor list every rank counts exactly its partition."""
    part = partition_numel(setup)
    return list(
        _touched(trainable(setup), setup.zero_dp, part) if is_exact(setup) else (part,) * setup.zero_dp
    )


@lru_cache(maxsize=512)
def _touched(tensors: tuple[int, ...], n: int, part: int) -> tuple[int, ...]:
    out = [0] * n
    start = 0
    for t in tensors:
        first, last = start // part, min((start + t - 1) // part, n - 1)
        for r in range(first, last + 1):
            out[r] += t
        start += t
    out[-1] += part * n - start
    return tuple(out)


def largest_piece(setup: Setup, rank: int = 0) -> int:
    """Stages 1-2: the largest piece of one trainable tensor inside ``rank``'s flat range (an entry of its
    ``averaged_gradients``, which ``get_grad_norm_direct`` copies to fp64 one at a time). Without a tensor
    list, the largest layer, at most the partition."""
    part = partition_numel(setup)
    if not is_exact(setup):
        return min(setup.model.largest_layer_params, part)
    return _largest_piece(trainable(setup), part, rank)


@lru_cache(maxsize=512)
def _largest_piece(tensors: tuple[int, ...], part: int, rank: int) -> int:
    low, high, start, out = rank * part, (rank + 1) * part, 0, 0
    for t in tensors:
        out = max(out, min(start + t, high) - max(start, low))
        start += t
    return out


def worst_rank(setup: Setup) -> int:
    """The rank whose stage 1/2 gradient buffer is largest (ranks differ only there, and in FSDP's
    optimizer states, whose largest shards are rank 0's)."""
    z = setup.zero
    if z.engine != "deepspeed" or z.stage not in (1, 2) or z.offload_optimizer is Offload.CPU:
        return 0
    per_rank = touched(setup)
    return max(range(setup.zero_dp), key=per_rank.__getitem__)


def largest_tensor(setup: Setup) -> int:
    """The largest single trainable tensor (the largest layer when the tensor list is unknown)."""
    return max(trainable(setup)) if is_exact(setup) else setup.model.largest_layer_params
