"""PyTorch FSDP2's step as the allocations ``kit.estimate.reserved`` replays, from torch 2.13's
``distributed/fsdp/_fully_shard`` (``fully_shard`` on each block and on the root, the kit's ``fsdp`` engine;
``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` in bf16, as torchtitan runs it):

- **resident**: every parameter's fp32 shard, a storage each; AdamW's two moments of each, made in the
  first step.
- **unshard** (``FSDPParamGroup.unshard``, ``foreach_all_gather``): on the all-gather copy-in stream each
  shard cast to the all-gather dtype and the flat all-gather output (world size x the padded shards), the
  casts freed once copied in; then on the default stream (``wait_for_unshard``,
  ``foreach_all_gather_copy_out``) each parameter's unsharded storage. In forward the flat output lives until
  the next unit's copy-out (``comm_ctx.all_gather_state``: it overlaps the next all-gather), in backward it
  is freed at once (the last forward one by the root's post-forward); a block's backward prefetches the one
  before it.
- **reshard**: a block's unsharded storages freed after its forward (``reshard_after_forward``; not with
  ``fsdp-grad-op``) and after its backward; the root (embeddings, final norm, head) stays unsharded from
  its forward to the end of the backward.
- **gradients**: autograd's unsharded gradients (the all-gather dtype) of a unit live to its post-backward
  (the root's to the end of the backward); ``foreach_reduce`` then copies them into a flat fp32
  reduce-scatter input on the default stream, frees them, and reduce-scatters into an fp32 output on the
  reduce-scatter stream that becomes the sharded ``.grad`` (a later micro-step's is added into it and
  freed). The input lives until the next unit's post-backward (``reduce_scatter_states``, one buffer).
- **optimizer**: ``_multi_tensor_adamw`` (foreach) makes one ``_foreach_sqrt`` copy of every shard; the
  gradients are dropped by ``zero_grad(set_to_none=True)`` after the step.

What it cannot see: explicit forward prefetching (``set_modules_to_forward_prefetch``), a last block left
unsharded after forward (torchtitan does so; the kit's runs do not), HSDP's all-reduce, CPU offload, and
the per-tensor dim-0 padding (each tensor is padded as a whole to a multiple of the world size).
"""

from __future__ import annotations

from kit.components import Component
from kit.estimate import partition
from kit.estimate.deepspeed_events import DEFAULT, GATHER, REDUCE, Step
from kit.rules import FP32, baseline_name, optimizer_states

#: the root's unit: the tensors before and after the blocks
ROOT = -1


class FsdpStep(Step):
    """The events of ``kit.estimate.deepspeed_events.STEPS`` FSDP2 steps (see the module's doc)."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.reshard_forward = baseline_name(self.z.engine, self.z.stage) == "fsdp"
        self.unsharded: dict[int, list[int]] = {}  # unit -> its parameters' unsharded storages
        self.prefetched: dict[int, list[int]] = {}  # unit -> its flat all-gather output, not yet copied out
        self.forward_gather: list[int] = []  # the last forward all-gather output (comm_ctx.all_gather_state)
        self.reduce_input: int | None = None  # the last reduce-scatter input (reduce_scatter_states)
        self.unit_grads: dict[int, list[int]] = {}  # unit -> autograd's unsharded gradients
        self.sharded_grads: dict[int, int] = {}  # unit -> its fp32 reduce-scatter output (.grad)
        self.numels: dict[int, list[int]] = {}  # unit -> its tensors' numels, in the forward's order
        for g, t in self.tensors:
            self.numels.setdefault(self._unit(g), []).append(t)

    def _unit(self, group: int) -> int:
        return ROOT if group in (-1, self.count) else group

    # ----- before the first step ---------------------------------------------------------------------
    def _shards(self) -> list[int]:
        """Each parameter's shard, in elements (its own storage: FSDP2 shards tensor by tensor)."""
        n = self.setup.zero_dp
        return [partition.padded(t, n) // n for _, t in self.tensors]

    def _resident(self) -> None:
        for shard in self._shards():
            self.alloc(FP32 * shard)

    @property
    def master(self) -> int:
        return 0  # the sharded parameters are the fp32 copy

    # ----- unshard and reshard -----------------------------------------------------------------------
    def _all_gather(self, unit: int) -> list[int]:
        """``foreach_all_gather`` on the copy-in stream: the shards cast, the flat output, the casts freed."""
        n, p = self.setup.zero_dp, self.p
        shards = [partition.padded(t, n) // n for t in self.numels[unit]]
        casts = [self.alloc(p * s, GATHER) for s in shards] if p != FP32 else []
        output = self.alloc(p * n * sum(shards), GATHER)
        self.free(*casts)
        return [output]

    def _unshard(self, unit: int, forward: bool) -> None:
        """``unshard`` (or the prefetched one) and ``wait_for_unshard``'s copy-out."""
        gathered = self.prefetched.pop(unit, None) or self._all_gather(unit)
        n = self.setup.zero_dp
        self.unsharded[unit] = [self.alloc(self.p * partition.padded(t, n)) for t in self.numels[unit]]
        if forward:  # kept to overlap the next all-gather, freed at the next copy-out
            self.free(*self.forward_gather)
            self.forward_gather = gathered
        else:
            self.free(*gathered)

    def _reshard(self, unit: int) -> None:
        self.free(*self.unsharded.pop(unit, []))

    def _gather_tensors(self, group: int, forward: bool) -> None:
        unit = self._unit(group)
        if unit not in self.unsharded:
            self._unshard(unit, forward)
        if not forward:  # a block's (or the root's) pre-backward prefetches the next block of the backward
            following = self.count - 1 if unit == ROOT else unit - 1
            if group != -1 and following >= 0 and following not in self.unsharded:
                self.prefetched.setdefault(following, self._all_gather(following))

    def _release_tensors(self, group: int, forward: bool) -> None:
        unit = self._unit(group)
        if forward:
            if unit != ROOT and self.reshard_forward:
                self._reshard(unit)
            if group == self.count:  # the root's post-forward frees the last all-gather output
                self.free(*self.forward_gather)
                self.forward_gather = []
            return
        if unit == ROOT and group != -1:
            return  # the root's post-backward comes once its embeddings' gradients are made
        self.free(self.reduce_input)  # reduce_scatter_states: the previous unit's input
        self._reshard(unit)
        self._reduce_unit(unit)

    # ----- gradients ---------------------------------------------------------------------------------
    def _gradients(self, group: int) -> None:
        """Autograd's unsharded gradients of ``group``'s tensors, held to its unit's post-backward."""
        n = self.setup.zero_dp
        grads = self.unit_grads.setdefault(self._unit(group), [])
        grads += [self.alloc(self.p * partition.padded(t, n)) for g, t in self.tensors if g == group]

    def _reduce_unit(self, unit: int) -> None:
        """``foreach_reduce``: the fp32 flat input on the default stream, the gradients freed, the output on
        the reduce-scatter stream (the sharded ``.grad``, or added into it and freed)."""
        n = self.setup.zero_dp
        total = sum(partition.padded(t, n) for t in self.numels[unit])
        self.reduce_input = self.alloc(FP32 * total, DEFAULT)
        self.free(*self.unit_grads.pop(unit, []))
        output = self.alloc(FP32 * total // n, REDUCE)
        if unit in self.sharded_grads:
            self.free(output)  # accumulated into the .grad of an earlier micro-step
        else:
            self.sharded_grads[unit] = output

    def _reduce(self, held: list[int] | None = None) -> None:
        self.free(*(held or []))  # FSDP reduces per unit (``_release_tensors``), not through buckets

    # ----- the optimizer -----------------------------------------------------------------------------
    def _optimizer(self, first: bool) -> None:
        """Foreach AdamW: each moment of each shard in the first step (``zeros_like``, tensor by tensor),
        then one fp32 ``_foreach_sqrt`` copy of every shard; the gradients dropped after it."""
        self.free(self.reduce_input)
        self.reduce_input = None
        k = optimizer_states(self.z.optimizer, self.z.momentum)
        if first and k and self.device[Component.OPTIMIZER_STATES].bytes:
            for shard in self._shards():
                for _ in range(k):
                    self.alloc(FP32 * shard)
        if k:
            self.free(*[self.alloc(FP32 * shard) for shard in self._shards()])
        self.free(*self.sharded_grads.values())
        self.sharded_grads = {}
