"""A DeepSpeed step as the allocations and frees ``kit.estimate.reserved`` replays, in order, from its
code (0.19, ``stage_1_and_2.py``, ``stage3.py``, ``partition_parameters.py``,
``partitioned_param_coordinator.py``); ``Step`` also writes what every engine shares (a block's
activations, the loss), which ``kit.estimate.fsdp_events`` builds on:

- **before the first step**: the resident states as DeepSpeed builds them. Stage 3's ``zero.Init`` builds
  every tensor whole on the device and partitions it at once (its own partition, the whole freed), and
  ``_create_fp16_partitions_with_defragmentation`` (``zero/utils.py`` ``defragment``) copies the
  partitions to the host, frees them, empties the cache (``EmptyCache``) and copies them back into one flat
  buffer; the fp32 master copy, ``initialize_optimizer_states``' zero fp32 gradients (freed), and
  ``create_reduce_and_remove_grad_hooks`` gathering every tensor once, one at a time. Stages 1-2 flatten
  the module's 16-bit tensors into one buffer on the device beside them where the card has room
  (``flatten_on_accelerator``), else through the host. The fp32 master comes through a copy (stages 1-2
  clone the 16-bit partition, stage 3 converts a sub group's and clones that). Adam's two states come in
  the first step. Optimizer offload keeps the fp32 gradients and the step on the host. Stage 0 in 16 bits
  with a torch optimizer is ``FP16_UnfusedOptimizer``: an fp32 clone of every tensor and, at initialize,
  one step over zero gradients (its states, tensor by tensor).
- **stage 3's gathers** on their own stream, module by module as DeepSpeed's coordinator makes them
  (``kit.estimate.zero3_gathers``: the first step records the trace, the next prefetch from it).
- **gradients**: a module's together, then each one's hook; one larger than ``reduce_bucket_size`` waits
  in the bucket for the next hook's reduction; a tied head's is held to the embeddings'. Stage 1-2's ipg
  buffer is allocated at the first hook, overlap_comm's second beside it. Reductions run
  on the reduction stream with ``overlap_comm`` (stage 1-2's ``reduction_stream``: ``allreduce_bucket``'s
  flat copy; stage 3's ``reduce_and_partition_stream``: ``reduce_scatter_coalesced``'s padded flat copy (its
  outputs are views of it), and fp16's ``has_overflow``), else on the default stream.
- **activations and temporaries** on the default stream, a block at a time: a transformer block's saved
  tensors as tensors of ``s b h`` and ``s b f`` elements (and the eager attention scores); with
  checkpointing the block's input, the block recomputed in its backward; the logits and their fp32 upcast
  die with the forward, log-softmax's output is saved; cuBLAS's workspace of each thread's handle (the
  forward's, autograd's) at its first matmul, held for good (``Gpu.blas_workspace_bytes``).
- **the update**: ``get_grad_norm_direct``'s fp64 copy of each gradient piece (stages 1-2) or
  partition (stage 3), one at a time; stage 3's gradients flattened, then their fp32 copy; stage 0's
  fp32 copy of every gradient (flattened by a fused Adam's FP16_Optimizer); the torch optimizer's own
  temporaries (``implementation``: torch_adam's foreach ``_foreach_sqrt``, none for a fused Adam); the
  persistent tensors gathered again after it.
"""

from __future__ import annotations

import itertools
from functools import cached_property

from kit import checkpointing, gpus
from kit.components import Component
from kit.estimate import partition, peak
from kit.estimate.activations import (
    FORMULA_FAMILIES,
    SWIGLU_FAMILIES,
    _head_activations,
    also_saved,
    eager_scores,
    formula,
    kept_by_policy,
)
from kit.estimate.allocator import Alloc, EmptyCache, Event, Free, Mark, allocation_size, round_size
from kit.estimate.result import Term
from kit.estimate.zero3_gathers import Gathers, Module
from kit.rules import DS_SUB_GROUP_SIZE, FP32, Offload, element_bytes, fallback_copies, optimizer_states
from kit.schema import Setup

#: the streams a DeepSpeed step allocates on
DEFAULT, GATHER, REDUCE = 0, 1, 2
#: steps replayed: the first builds the optimizer's states, the second runs from the cache it left
STEPS = 2


def micro_steps(grad_accum: int) -> list[int]:
    """The micro-steps of a step replayed: the first, one of those between (each leaves the pools as the
    one before found them, so more add nothing: ``tests/test_reserved.py``) and the boundary one."""
    return sorted({0, min(1, grad_accum - 1), grad_accum - 1})


class Step:
    """The events of ``STEPS`` steps (see the module's doc); one instance per replay."""

    def __init__(
        self, setup: Setup, device: dict[str, Term], act: Term, implementation: peak.Implementation = "fused"
    ) -> None:
        self.setup, self.device, self.act = setup, device, act
        self.implementation = implementation  # the torch optimizer's path (kit.estimate.peak.Implementation)
        self.z = setup.zero
        self.p = element_bytes(self.z.precision)
        self.out: list[Event] = []
        self.keys = itertools.count()
        before, block, after, count = partition.blocks(setup.model)
        self.count = count
        # every tensor's numel, in the forward's order, grouped: -1 before the blocks, count after them
        self.tensors = [(-1, t) for t in before]
        self.tensors += [(i, t) for i in range(count) for t in block]
        self.tensors += [(count, t) for t in after]
        self.groups: dict[int, list[int]] = {}  # a group: its tensors' indices
        for k, (g, _) in enumerate(self.tensors):
            self.groups.setdefault(g, []).append(k)
        self.grads: list[int] = []  # gradient keys held to the optimizer (stage 0; stages 1-2's partition)
        self.bucket: list[int] = []  # numels of the gradients in the ipg bucket
        self.pending: list[int] = []  # keys of gradients larger than the bucket, waiting in it
        self.workspaces: set[str] = set()  # the threads whose cuBLAS workspace is allocated
        self.ipg: list[int] = []  # stages 1-2: the contiguous ipg buffer(s), from the first hook
        self.held_full = False  # stage 1 with accumulation: every full gradient is held in .grad
        # stage 3's gathers (parameters on the device): DeepSpeed's coordinator over the tensors
        z = self.z
        self.stage3 = z.engine == "deepspeed" and z.stage == 3 and z.offload_param is Offload.NONE
        self.head = self._tied_head()  # the tied head's weight: the embeddings' tensor index
        self.head_grad: int | None = None  # the tied head's gradient, from the loss to the embeddings'
        external = (self.head,) if self.head is not None and partition.external_head(setup) else ()
        self.gathers = Gathers(
            [t for _, t in self.tensors],
            self.p,
            setup.zero_dp,
            z,
            self.alloc,
            self.free,
            (DEFAULT, GATHER),
            external,
            partition.gathers_in_place(setup),
        )

    # ----- the sequence ------------------------------------------------------------------------------
    def _tied_head(self) -> int | None:
        """The index of the embeddings' weight a tied language-model head multiplies by, else None."""
        m = self.setup.model
        if not (m.tied_embeddings and m.vocab and m.hidden and self.shape[3]):
            return None
        return next((k for k, (g, t) in enumerate(self.tensors) if g < 0 and t == m.vocab * m.hidden), None)

    def events(self) -> list[Event]:
        self._resident()
        for step in range(STEPS):
            last = self.setup.batch.grad_accum - 1
            for micro in micro_steps(last + 1):
                self.out.append(Mark("forward"))
                saved, tokens = self._forward()
                self.out.append(Mark("backward"))
                self._backward(saved, tokens, boundary=micro == last)
            self.out.append(Mark("optimizer"))
            self._optimizer(first=step == 0)
        return self.out

    def _blas_workspace(self, thread: str) -> None:
        """The cuBLAS workspace of ``thread``'s handle on the default stream, at its first matmul, held
        for good (``Gpu.blas_workspace_bytes``): the forward's, autograd's backward thread's."""
        if thread not in self.workspaces:
            self.workspaces.add(thread)
            self.alloc(gpus.gpu(self.setup.cluster.gpu).blas_workspace_bytes)

    def alloc(self, size: int, stream: int = DEFAULT) -> int:
        key, size = next(self.keys), int(size)
        self.out.append(Alloc(key, size if size > 0 else 0, stream))
        return key

    def free(self, *keys: int | None) -> None:
        for key in keys:
            if key is not None:
                self.out.append(Free(key))

    # ----- before the first step ---------------------------------------------------------------------
    def _resident(self) -> None:
        """The states DeepSpeed allocates at ``initialize``; stage 3's tensors built whole by ``zero.Init``
        and partitioned at once, the partitions copied into the flat buffer and freed; the fp32 master
        copy (a third of the optimizer states with Adam: Adam's moments come in the first step)."""
        z, d = self.z, self.device
        if z.engine == "deepspeed" and z.stage == 3 and d[Component.PARAMETERS].bytes:
            n, parts = self.setup.zero_dp, []
            for _, t in self.tensors:  # zero.Init: the tensor built whole on the device, then partitioned
                whole = self.alloc(self.p * t)
                parts.append(self.alloc(self.p * -(-t // n)))
                self.free(whole)
            self.free(*parts)  # defragment: the partitions copied to the host, freed, the cache emptied,
            self.out.append(EmptyCache())  # then one flat buffer copied back
            self.alloc(d[Component.PARAMETERS].bytes)
        elif z.engine == "deepspeed" and z.stage in (1, 2) and d[Component.PARAMETERS].bytes:
            # the module moved to the device tensor by tensor, then flattened into one buffer: on the
            # device while the tensors are live if the card has room for it, else through the host
            module = [self.alloc(self.p * t) for _, t in self.tensors]
            flat = d[Component.PARAMETERS].bytes
            if self._room_to_flatten(flat):
                self.alloc(flat)
                self.free(*module)
            else:
                self.free(*module)
                self.out.append(EmptyCache())
                self.alloc(flat)
        elif self._unfused:  # FP16_UnfusedOptimizer: the module's tensors and an fp32 clone of each
            for _, t in self.tensors:
                self.alloc(self.p * t)
            for _, t in self.tensors:
                copy = self.alloc(self.p * t)
                self.alloc(FP32 * t)
                self.free(copy)
            self._unfused_states()
            return
        else:
            self.alloc(d[Component.PARAMETERS].bytes)
        stage3 = z.engine == "deepspeed" and z.stage == 3
        zero = z.engine == "deepspeed" and z.stage in (1, 2, 3) and z.offload_optimizer is Offload.NONE
        part = 0  # elements of the partition (stage 3: of a sub group) initialize_optimizer_states zeroes
        if zero and self.master:
            # the fp32 master through a copy: stages 1-2 clone the 16-bit partition, then convert it;
            # stage 3 converts a sub group's, then clones that
            part = partition.partition_numel(self.setup)
            part = min(part, DS_SUB_GROUP_SIZE) if stage3 else part
            copy = self.alloc((FP32 if stage3 else self.p) * part)
            self.alloc(self.master)
            self.free(copy)
        else:
            self.alloc(self.master)
        self.free(self.alloc(FP32 * part) if part else None)  # its zero fp32 gradient, dropped
        if stage3:
            self.alloc(d[Component.GRADIENTS].bytes)  # grad_partitions_flat_buffer
        self.alloc(d[Component.BUFFERS].bytes)  # stage 3's ipg bucket, hpZ's secondary partition
        # create_reduce_and_remove_grad_hooks: each tensor gathered, then released
        if self.stage3 and not self.gathers.in_place:
            for _, t in self.tensors:
                self.free(self.alloc(self.p * partition.padded(t, self.setup.zero_dp)))

    @property
    def _unfused(self) -> bool:
        """Stage 0 in 16 bits with a torch optimizer (``torch_adam``): DeepSpeed's FP16_UnfusedOptimizer,
        tensor by tensor (a fused Adam gets FP16_Optimizer, flat buffers)."""
        z = self.z
        return z.engine == "deepspeed" and z.stage == 0 and self.p != FP32 and self.implementation != "fused"

    def _unfused_states(self) -> None:
        """FP16_UnfusedOptimizer's ``initialize_optimizer_states``: a zero 16-bit and fp32 gradient for every
        tensor, one step of the torch optimizer (its states, tensor by tensor, and its temporaries), the
        gradients dropped."""
        grads = [self.alloc(self.p * t) for _, t in self.tensors]
        grads += [self.alloc(FP32 * t) for _, t in self.tensors]
        for _, t in self.tensors:
            for _ in range(optimizer_states(self.z.optimizer, self.z.momentum)):
                self.alloc(FP32 * t)
        self._torch_temporaries([t for _, t in self.tensors])
        self.free(*grads)

    def _torch_temporaries(self, tensors: list[int]) -> None:
        """The torch optimizer's own temporaries stepping fp32 ``tensors`` (numels; none for a fused Adam):
        foreach's ``_foreach_sqrt`` outputs all at once, the single-tensor path's a tensor at a time."""
        sizes = [peak.optimizer_temporaries(self.setup, [t], self.implementation).bytes for t in tensors if t]
        if self.implementation == "foreach":
            self.free(*[self.alloc(size) for size in sizes if size])
        else:
            for size in sizes:
                self.free(self.alloc(size) if size else None)

    def _room_to_flatten(self, flat: int) -> bool:
        """``DeepSpeedZeroOptimizer``'s ``flatten_on_accelerator``: the card's free memory (NVML's: less the
        CUDA context, NCCL's buffers from the module's broadcast and the module's tensors) holds the flat
        16-bit buffer."""
        module = sum(allocation_size(round_size(self.p * t)) for _, t in self.tensors)
        outside = gpus.CUDA_CONTEXT_BYTES + gpus.nccl_bytes(self.setup.zero_dp)
        free = gpus.gpu(self.setup.cluster.gpu).memory_bytes - outside - module
        return free >= flat

    @property
    def master(self) -> int:
        """Bytes of the fp32 master partition among the optimizer states (all of them without moments)."""
        states = self.device[Component.OPTIMIZER_STATES].bytes
        k = optimizer_states(self.z.optimizer, self.z.momentum)
        return states // (1 + k) if states else 0

    # ----- one micro-step ----------------------------------------------------------------------------
    @cached_property
    def shape(self) -> tuple[int, int, int, int]:
        """Elements of ``s b h`` and ``s b f``, the eager attention scores' (0 under SDPA), and the logits."""
        m, b = self.setup.model, self.setup.batch
        tokens = b.micro_batch * self.setup.rank_seq_len
        hidden = m.hidden or 0
        ffn = m.ffn or 4 * hidden
        eager = m.family == "gpt2" and m.is_transformer
        scores = eager_scores(self.setup)[0] if eager else 0
        lm = m.family in FORMULA_FAMILIES and m.family != "dit" and m.vocab and not m.source
        return tokens * hidden, tokens * ffn, scores, tokens * (m.vocab or 0) if lm else 0

    def _checkpointed(self, block: int) -> bool:
        z = self.z
        return z.activation_checkpointing and checkpointing.is_checkpointed(block, z.checkpoint_every)

    def _block_saved(self, kept: int = 0) -> list[int]:
        """One block's saved activations as tensors (bytes), less ``kept`` (what a selective policy's
        recomputation does not save again): the bytes per block cut into the shapes a transformer block
        saves, its MLP's two ``s b f`` and the eager scores first."""
        sbh, sbf, scores, logits = self.shape
        p, per_block = self.p, max(self.per_block - kept, 0)
        out = []
        for size, count in ((p * sbf, 2 if sbh else 0), (p * scores, 1 if scores else 0)):
            for _ in range(count):
                if per_block >= size > 0:
                    out.append(size)
                    per_block -= size
        unit = p * sbh if sbh else per_block
        while unit and per_block >= unit:
            out.append(unit)
            per_block -= unit
        return out + ([per_block] if per_block > 0 else [])

    @cached_property
    def per_block(self) -> int:
        """Saved bytes of one block without checkpointing (the activations less the head's, per block)."""
        m = self.setup.model
        if m.family in FORMULA_FAMILIES and m.is_transformer and not m.source:
            plain = self.setup.replace(zero=self.z.checkpointing(False))
            head = _head_activations(self.setup, self.p // 2).bytes
            return max(formula(plain).bytes - head, 0) // max(m.layers or 1, 1)
        return self.act.bytes // self.count

    def _forward(self) -> tuple[list[list[int]], int]:
        """The forward: per block its gathers (stage 3), its saved tensors (with checkpointing its input,
        the rest made and freed), the loss's logits; returns the saved keys per block and the token ids'."""
        sbh, _, _, logits = self.shape
        p = self.p
        tokens = self.alloc(8 * self.setup.batch.micro_batch * self.setup.rank_seq_len)
        saved: list[list[int]] = []
        if self.stage3:  # reset_step at the forward's start; an external head fetched with the top module
            self.gathers.reset()
            if self.gathers.external:
                self.gathers.fetch(tuple(self.gathers.external))
        self._gather_tensors(-1, forward=True)
        self._release_tensors(-1, forward=True)
        kept = kept_by_policy(self.setup).bytes
        for i in range(self.count):
            self._gather_tensors(i, forward=True)
            self._blas_workspace("forward")  # the first matmul on this thread
            keys = [self.alloc(size) for size in self._block_saved()]
            if self._checkpointed(i):
                held = [self.alloc(p * sbh)]  # the block's input, saved by the checkpoint
                held += [self.alloc(kept)] if kept else []  # what a selective policy keeps
                self.free(*keys)
                keys = held
            saved.append(keys)
            self._release_tensors(i, forward=True)
        self._gather_tensors(self.count, forward=True)
        if logits:  # the logits, their fp32 upcast; log-softmax's fp32 output is saved, the rest dies
            low = self.alloc(p * logits)  # with the forward (nothing saves them: the caller keeps the loss)
            up = self.alloc(FP32 * logits) if p != FP32 else None
            saved.append([self.alloc(FP32 * logits)])
            self.free(up, low)
        self._release_tensors(self.count, forward=True)
        return saved, tokens

    def _backward(self, saved: list[list[int]], tokens: int, boundary: bool) -> None:
        sbh, sbf, _, logits = self.shape
        p, m = self.p, self.setup.model
        gated = 3 if m.family in SWIGLU_FAMILIES else 1
        head = saved.pop() if logits else []
        grad: int | None = None
        if logits:  # nll_loss and log_softmax backward: two fp32 gradients, then the 16-bit one
            a, b = self.alloc(FP32 * logits), self.alloc(FP32 * logits)
            self.free(a, *head)
            grad = self.alloc(p * logits)
            self.free(b)
        # the head's matmuls: the first of autograd's device thread, a cuBLAS handle of its own
        self._blas_workspace("backward")
        if logits and self.head is not None:  # the head's weight gradient, summed into the embeddings'
            self.head_grad = self.alloc(p * self.tensors[self.head][1])
        self._gather_tensors(self.count, forward=False)
        self._gradients(self.count)
        self.free(grad)
        flowing = self.alloc(p * sbh)
        for i in reversed(range(self.count)):
            self._gather_tensors(i, forward=False)
            recomputed = (
                [self.alloc(size) for size in self._block_saved(also_saved(self.setup))]
                if self._checkpointed(i)
                else []
            )
            work = [self.alloc(p * sbf) for _ in range(gated)]  # the MLP's input gradients
            self._gradients(i)
            self.free(*work, *recomputed, *saved[i])
            incoming, flowing = flowing, self.alloc(p * sbh)
            self.free(incoming)
            self._release_tensors(i, forward=False)
        self._gather_tensors(-1, forward=False)
        self._gradients(-1)
        self.free(flowing, tokens, self.head_grad)
        self.head_grad = None
        if self._holds:
            self.held_full = True
            if boundary and self.z.engine == "deepspeed" and self.z.stage == 0:  # each bucket's flat copy
                numels = [t for _, t in self.tensors]
                for elements in fallback_copies(numels):
                    self.free(self.alloc(self.p * elements) if elements else None)
            if boundary and self.z.stage == 1:  # engine.allreduce_gradients: the held ones through buckets
                for _, t in reversed(self.tensors):
                    if sum(self.bucket) + t > self.z.reduce_bucket_size and self.bucket:
                        self._reduce()
                    self.bucket.append(t)
        self._reduce()
        self._release_tensors(-1, forward=False)
        if boundary or self.z.stage != 1:
            self.free(*self.ipg)
            self.ipg = []

    # ----- gradients and their reduction -------------------------------------------------------------
    @property
    def _holds(self) -> bool:
        """Whether full gradients stay in ``.grad`` to the optimizer: stage 0 (reduced after backward,
        through flat copies), stage 1 with accumulation (reduced at the boundary only), the PyTorch
        baselines."""
        z = self.z
        return z.engine != "deepspeed" or z.stage == 0 or (z.stage == 1 and self.setup.batch.grad_accum > 1)

    def _gradients(self, group: int) -> None:
        """Each tensor's gradient of ``group``, in backward order, and what its hook does with it; at
        stage 3 module by module, each fetched before (its pre-backward hook) and released after."""
        if not self.stage3:
            for index in reversed(self.groups.get(group, [])):
                self._gradient(index)
            return
        modules = list(reversed(self._modules(group)))
        if group < 0:  # the embeddings' outputs are summed: their pre-backward hooks fire together
            for module in modules:
                self.gathers.fetch(module)
        for module in modules:
            if group >= 0:
                self.gathers.fetch(module)
            # autograd makes a module's gradients together, then their hooks run (the tied head's is
            # held, ``head_grad``, to the embeddings')
            indices = [i for i in reversed(module) if not (i == self.head and group == self.count)]
            made = [self.alloc(self.p * self.tensors[i][1]) for i in indices]
            for index, grad in zip(indices, made, strict=True):
                self._gradient(index, grad)
            self.gathers.release(module)

    def _gradient(self, index: int, grad: int | None = None) -> None:
        """Tensor ``index``'s gradient (``grad``: made already; the tied embeddings': the head's summed
        into it) and its hook."""
        z, p = self.z, self.p
        t = self.tensors[index][1]
        holds = self._holds
        staged = z.engine == "deepspeed" and z.stage in (1, 2) and z.contiguous_gradients
        if staged and not self.ipg:  # setup_buckets at the first hook (stage 1: to the boundary): a
            # buffer, and overlap_comm's second
            self.ipg = [self.alloc(p * z.reduce_bucket_size) for _ in range(2 if z.overlap else 1)]
        grad = self.alloc(p * t) if grad is None else grad
        if holds and self.held_full:  # a later micro-step: autograd adds its gradient into .grad
            self.free(grad)
            return
        if index == self.head and self.head_grad is not None:
            self.free(self.head_grad)
            self.head_grad = None
        if holds:
            self.grads.append(grad)
            return
        full = sum(self.bucket) + t > z.reduce_bucket_size
        if full and self.bucket:
            self._reduce()
        if z.contiguous_gradients and t <= z.reduce_bucket_size:
            self.free(grad)  # copied into the ipg bucket
            self.bucket.append(t)
        else:  # larger than the bucket: the gradient itself waits in it for the next flush
            self.bucket.append(t)
            self.pending.append(grad)

    def _reduce(self, held: list[int] | None = None) -> None:
        """A bucket's reduction: stage 1-2 ``allreduce_bucket``'s flat copy (and, at the first, this rank's
        gradient partition buffer, held to the optimizer); stage 3 ``reduce_scatter_coalesced``'s padded
        flat copy (its outputs are views of it)."""
        z, p, n = self.z, self.p, self.setup.zero_dp
        if not self.bucket:
            self.free(*(held or []), *self.pending)
            self.pending = []
            return
        stream = REDUCE if z.overlap else DEFAULT
        if z.stage == 3:
            padded = sum(partition.padded(t, n) for t in self.bucket)
            flat = (
                self.alloc(p * padded, stream) if len(self.bucket) > 1 or padded != self.bucket[0] else None
            )
            self.free(flat, *(held or []), *self.pending)
        else:
            if not self.grads and self.device[Component.GRADIENTS].bytes:
                self.grads.append(self.alloc(self.device[Component.GRADIENTS].bytes))
            flat = self.alloc(p * sum(self.bucket), stream) if n > 1 else None
            self.free(flat, *(held or []), *self.pending)
        self.bucket, self.pending = [], []

    # ----- stage 3's gathers (``kit.estimate.zero3_gathers``) ------------------------------------------
    def _modules(self, group: int) -> list[Module]:
        """``group``'s modules in the forward's order; after the blocks, the tied head's last."""
        modules = self.gathers.modules(self.groups.get(group, []))
        return modules + [(self.head,)] if group == self.count and self.head is not None else modules

    def _gather_tensors(self, group: int, forward: bool) -> None:
        """Stage 3 before ``group``'s work: in the forward its first module fetched; before a
        checkpointed block's backward, its forward recomputed (every module fetched, released as the
        reuse distance allows)."""
        if not self.stage3:
            return
        modules = self._modules(group)
        if forward and modules:
            self.gathers.fetch(modules[0])
        elif not forward and 0 <= group < self.count and self._checkpointed(group):
            for module in modules:
                self.gathers.fetch(module)
                self.gathers.release(module)

    def _release_tensors(self, group: int, forward: bool) -> None:
        """Stage 3 after ``group``'s forward: its first module released, the others fetched and released
        one by one (the backward releases module by module in ``_gradients``)."""
        if not (self.stage3 and forward):
            return
        modules = self._modules(group)
        for k, module in enumerate(modules):
            if k:
                self.gathers.fetch(module)
            self.gathers.release(module)

    # ----- the optimizer -----------------------------------------------------------------------------
    def _optimizer(self, first: bool) -> None:
        """Stages 1-2: the fp32 gradient partition; stage 3: a sub group's; stage 0: fp32 copies of the
        16-bit gradients. Adam's moments are made in the first step, while the gradient is live."""
        z, d = self.z, self.device
        k = optimizer_states(z.optimizer, z.momentum)
        moments = d[Component.OPTIMIZER_STATES].bytes - self.master
        if self.stage3:  # _partition_all_parameters
            self.gathers.end()
        if z.engine == "deepspeed" and z.offload_optimizer is not Offload.NONE:
            sub = 0  # the fp32 gradient partitions and the step are on the host (or NVMe)
        elif z.engine == "deepspeed" and z.stage == 3:
            self._stage3_checks()
            sub = FP32 * min(partition.partition_numel(self.setup), DS_SUB_GROUP_SIZE)
        elif z.engine == "deepspeed" and z.stage in (1, 2):
            sub = d[Component.OPTIMIZER_STATES].bytes and FP32 * partition.partition_numel(self.setup)
            # scaled_global_norm: get_grad_norm_direct's fp64 copy of each gradient piece, one at a time
            self.free(self.alloc(8 * partition.largest_piece(self.setup)) if sub else None)
        else:  # stage 0 in 16 bits: FP16_Optimizer's flat fp32 gradient (FP16_UnfusedOptimizer: none)
            sub = FP32 * self.setup.model.params if self.p != FP32 and not self._unfused else 0
        copies = []
        if z.engine == "deepspeed" and z.stage == 0 and self.p != FP32:
            # every gradient's fp32 copy: FP16_Optimizer flattens them and drops the list,
            # FP16_UnfusedOptimizer steps them, then drops them and the 16-bit gradients
            copies = [self.alloc(FP32 * t) for _, t in self.tensors]
        # freed before the step, or (FP16_UnfusedOptimizer) after it
        dropped, held = ([], [*copies, *self.grads]) if self._unfused else ([*copies, *self.grads], [])
        # stage 3's _prepare_fp32_grad_for_sub_group: the 16-bit gradients flattened, then their fp32 copy
        flat = self.alloc(sub // FP32 * self.p) if sub and self.stage3 and self.p != FP32 else None
        grad = self.alloc(sub) if sub else None
        self.free(flat, *dropped)
        self.grads, self.held_full = [], False
        if first and k and moments and not self._unfused:
            for _ in range(k):
                self.alloc(moments // k)
        self._torch_temporaries([t for _, t in self.tensors] if self._unfused else [sub // FP32])
        self.free(grad, *held)
        if self.stage3:
            self.gathers.regather_persistent()

    def _stage3_checks(self) -> None:
        """Before stage 3's step: with fp16, ``has_overflow`` on the reduction stream (``isinf`` of the
        flat gradient partition through its ``abs``, then ``isnan``: a 16-bit copy and two bool masks);
        ``get_grad_norm_direct``'s fp64 copy of each gradient partition, one at a time (the largest)."""
        if self.z.offload_optimizer is not Offload.NONE:
            return
        n = partition.partition_numel(self.setup)
        if self.z.precision == "fp16":
            stream = REDUCE if self.z.overlap else DEFAULT
            magnitude, mask = self.alloc(self.p * n, stream), self.alloc(n, stream)
            self.free(magnitude, mask)
            self.free(self.alloc(n, stream))
        largest = max(-(-t // self.setup.zero_dp) for _, t in self.tensors)
        self.free(self.alloc(8 * largest))
