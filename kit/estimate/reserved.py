"""What PyTorch's caching allocator reserves beyond the tensors: a step's allocations in order, replayed.

``torch.cuda.max_memory_reserved()`` is what a GPU really gives a run (an out-of-memory error comes when a
new segment cannot be had, whatever is free inside the segments already held); ``kit.estimate.peak``
predicts the tensors (``max_memory_allocated``). Between the two are the caching allocator's rules
(``kit.estimate.allocator``: sizes rounded, segments of 2 / 20 MiB or rounded to 2 MiB, best fit with
splitting, nothing returned to the device until an allocation fails) applied to the order in which a step
allocates and frees, and one pool per CUDA stream: a block freed on one stream is never reused by another.
That order is written from the engines' code, two steps (the second from the cache the first left), as the
runs people publish report the peak over many: DeepSpeed's (``kit.estimate.deepspeed_events``) and
PyTorch FSDP2's (``kit.estimate.fsdp_events``). Not replayed (``unreplayed``): PyTorch's DDP (its buckets
and streams), parameters offloaded to the host or NVMe (the swap buffers' own allocations), a trainable
subset, a fused loss and sequence parallelism: ``reserved`` is None. A step's micro-steps are the first,
one between and the boundary one (``deepspeed_events.micro_steps``: those between repeat one another).

The prediction is the tensor peak plus what the replay reserves beyond its own peak of tensors over the
steps (``Reserved.cached``), so the allocator's share is added to the timeline's peak, not a fitted factor;
building the states before the first step can hold more tensors than any step (``Reserved.initialize``:
stages 1-2 flattening the module beside it), which ``max_memory_allocated`` since the start reads.
With ``expandable_segments`` (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, the setup's
``zero.expandable_segments``) the same sequence is replayed on growing segments; the other allocator's
replay says what switching would save or cost (``Reserved.expandable_cached``, ``plain_cached``).
The fit is decided on the run's allocator (``kit.fit.within``): max reserved within the GPU's memory,
or past it, the same sequence replayed within the memory (``Reserved.flushed``), as PyTorch frees its
cached segments and retries before it raises an out-of-memory error.

What it cannot see: ``record_stream``'s deferred frees (a block freed while another stream still uses it
comes back after that stream's work: the replay frees it at once; with a slow network stage 3 holds
more), the ops' own temporaries beyond the block's working set (flash attention's; cuBLAS's workspaces are),
fused kernels that allocate less, the order of autograd's frees inside a block, a model without a
repeating block (one block stands for it). Checked: the allocator's rules replaying the allocations an H100
made give its max reserved and max allocated to the byte, and the kit's step of the same setups (rank 0 of
64 and 32 ranks of the kit's GPT with A18's and A23's shapes, ``kit.accuracy.traces``) from 2.6 % under to
0.2 % over;
the kit's own runs on one H200 (``kit.accuracy.reference``: 9 configurations, stages 0-3, on the
runner's optimizer path, median 0.3 %, from 1.8 % under to 3.4 % over); published runs (``zerokit
published``: torchtitan's Llama 3.1 8B under FSDP2 on 8 and 128 H100s, +0.4 % and +1.1 %; an 18B GPT
at stage 3 on 64 V100s under DeepSpeed 0.8.3 and Megatron reserved 2.3x its tensor peak, the replay of
today's DeepSpeed gives 1.4x).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, lru_cache

from kit.estimate.allocator import Alloc, Event, Mark, Replay, replay
from kit.estimate.deepspeed_events import Step
from kit.estimate.fsdp_events import FsdpStep
from kit.estimate.peak import Implementation
from kit.estimate.result import Term
from kit.rules import Offload
from kit.schema import Setup
from kit.trainable import is_subset
from kit.units import gib


@dataclass(frozen=True)
class Reserved:
    """The replay of a step's allocations under the run's allocator (``expandable``: with expandable
    segments): its tensor peak and what it reserved; ``cached``: reserved beyond the tensor peak, and the
    same under either allocator (``plain_cached``, ``expandable_cached``: the other one replayed when
    asked); ``initialize``: the tensors' peak while DeepSpeed builds the states, before the first step (what
    ``max_memory_allocated`` since the start reads where it is the larger)."""

    allocated: int
    reserved: int
    events: int
    #: the allocations replayed (the other allocator's replay, ``initialize`` and ``flushed`` replay them
    #: when asked)
    sequence: tuple[Event, ...] = field(compare=False, repr=False)
    #: the run's allocator: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    expandable: bool = False
    #: ``flushed``'s answers by capacity
    held_within: dict[int, int | None] = field(default_factory=dict, compare=False, repr=False)

    @cached_property
    def _other_cached(self) -> int:
        """Reserved beyond the tensor peak with the same sequence under the other allocator."""
        other = replay(self.sequence, expandable_segments=not self.expandable)
        return other.max_reserved - _stepping(other)

    @property
    def expandable_cached(self) -> int:
        """Reserved beyond the tensor peak with expandable segments."""
        return self.cached if self.expandable else self._other_cached

    @property
    def plain_cached(self) -> int:
        """Reserved beyond the tensor peak without expandable segments (PyTorch's default)."""
        return self._other_cached if self.expandable else self.cached

    @cached_property
    def initialize(self) -> int:
        built = next(i for i, e in enumerate(self.sequence) if isinstance(e, Mark))
        return replay(self.sequence[:built]).max_allocated

    @property
    def cached(self) -> int:
        return self.reserved - self.allocated

    def flushed(self, capacity: int) -> int | None:
        """Max reserved where the allocator can get only ``capacity`` bytes, None where the steps run out
        of memory there: near it, PyTorch frees its cached segments and retries before it raises an
        out-of-memory error, so a run can fit in less than ``reserved`` (each such flush costs step time:
        ``cudaFree`` synchronises)."""
        if self.reserved <= capacity:
            return self.reserved
        if capacity not in self.held_within:
            run = replay(self.sequence, capacity=capacity, expandable_segments=self.expandable)
            self.held_within[capacity] = None if run.oom else run.max_reserved
        return self.held_within[capacity]

    def term(self) -> Term:
        """The allocator's share beside the tensors, with its formula."""
        other = (
            f"without them: {gib(self.plain_cached)}"
            if self.expandable
            else f"expandable_segments: {gib(self.expandable_cached)}"
        )
        return Term(
            self.cached,
            f"caching allocator{' (expandable segments)' if self.expandable else ''} {gib(self.cached)} "
            f"(replayed: {self.events:,} allocations of two steps, {gib(self.reserved)} reserved for a "
            f"{gib(self.allocated)} tensor peak; {other})"
            + (f"; {gib(self.initialize)} at initialize" if self.initialize > self.allocated else ""),
        )


def reserved(
    setup: Setup, device: dict[str, Term], activations: Term, implementation: Implementation = "fused"
) -> Reserved | None:
    """The replay of two steps of ``setup`` on one GPU holding ``device`` (``kit.estimate.memory``'s
    resident states) with ``activations`` saved per micro-step (DeepSpeed's or FSDP2's sequence);
    None for what it does not replay (PyTorch's DDP, parameters offloaded to the host or NVMe, a
    trainable subset: its gradients are not the replay's; the chunked loss: its chunks are not; sequence
    parallelism: its fp32 reductions and exchanges are not)."""
    if unreplayed(setup):
        return None
    held = tuple((name, term.bytes) for name, term in device.items())  # what the events read of them
    return _replayed(setup, held, activations.bytes, implementation)


@lru_cache(maxsize=32)  # a plan, a boundary search, a panel ask again for the setups they named
def _replayed(setup: Setup, device: tuple, activations: int, implementation: Implementation) -> Reserved:
    step = FsdpStep if setup.zero.engine == "fsdp" else Step
    held = {name: Term(nbytes, "") for name, nbytes in device}
    events = step(setup, held, Term(activations, ""), implementation).events()
    expandable = setup.zero.expandable_segments
    run = replay(events, expandable_segments=expandable)
    count = sum(isinstance(e, Alloc) for e in events)
    return Reserved(_stepping(run), run.max_reserved, count, tuple(events), expandable)


def unreplayed(setup: Setup) -> str:
    """What keeps ``setup`` from the replay (``reserved`` is None for it), or ``""``."""
    z = setup.zero
    reasons = (
        (z.engine == "ddp", "PyTorch's DDP"),
        (z.offload_param is not Offload.NONE, "parameters offloaded"),
        (is_subset(z), "a trainable subset"),
        (z.loss != "plain", f"the {z.loss} loss"),
        (z.sequence_parallel_size > 1, "sequence parallelism"),
    )
    return next((reason for cond, reason in reasons if cond), "")


def _stepping(run: Replay) -> int:
    """The replay's tensor peak over its steps' phases: what the timeline's peak stands for (the states'
    construction before the first step can hold more, as stages 1-2 flattening the module beside it)."""
    return max(allocated for allocated, _ in run.phases.values())
