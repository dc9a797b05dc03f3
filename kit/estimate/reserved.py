"""What PyTorch's caching allocator reserves beyond the tensors: a step's allocations in order, replayed.

``torch.cuda.max_memory_reserved()`` is what a GPU really gives a run (an out-of-memory error comes when a
new segment cannot be had, whatever is free inside the segments already held); ``kit.estimate.peak``
predicts the tensors (``max_memory_allocated``). Between the two are the caching allocator's rules
(``kit.estimate.allocator``: sizes rounded, segments of 2 / 20 MiB or rounded to 2 MiB, best fit with
splitting, nothing returned to the device until an allocation fails) applied to the order in which a step
allocates and frees, and one pool per CUDA stream: a block freed on one stream is never reused by another.
That order is written from the engines' code, two steps (the second from the cache the first left), as the
runs people publish report the peak over many: DeepSpeed's (``kit.estimate.deepspeed_events``) and
PyTorch FSDP2's (``kit.estimate.fsdp_events``). Not replayed: PyTorch's DDP (its buckets and streams), and
parameters offloaded to the host or NVMe (the swap buffers' own allocations): ``reserved`` is None.

The prediction is the tensor peak plus what the replay reserves beyond its own peak of tensors over the
steps (``Reserved.cached``), so the allocator's share is added to the timeline's peak, not a fitted factor;
building the states before the first step can hold more tensors than any step (``Reserved.initialize``:
stages 1-2 flattening the module beside it), which ``max_memory_allocated`` since the start reads.
With ``expandable_segments`` (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``) the same sequence is
replayed on growing segments; ``Reserved.expandable`` is that share, and the saving is the difference.

What it cannot see: ``record_stream``'s deferred frees (a block freed while another stream still uses it
comes back after that stream's work: the replay frees it at once; with a slow network stage 3 holds
more), the ops' own temporaries beyond the block's working set (flash attention's; cuBLAS's workspaces are),
fused kernels that allocate less, the order of autograd's frees inside a block, a model without a
repeating block (one block stands for it), and a device's capacity (near it, PyTorch frees its cache and
retries before it would reserve more). Checked: the allocator's rules replaying the allocations an H100
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

from dataclasses import dataclass

from kit.estimate.allocator import Alloc, Mark, Replay, replay
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
    """The replay of a step's allocations: its tensor peak, what it reserved, and the same with
    expandable segments; ``cached`` / ``expandable_cached``: reserved beyond the tensor peak;
    ``initialize``: the tensors' peak while DeepSpeed builds the states, before the first step (what
    ``max_memory_allocated`` since the start reads where it is the larger)."""

    allocated: int
    reserved: int
    expandable_allocated: int
    expandable_reserved: int
    events: int
    initialize: int

    @property
    def cached(self) -> int:
        return self.reserved - self.allocated

    @property
    def expandable_cached(self) -> int:
        return self.expandable_reserved - self.expandable_allocated

    def term(self) -> Term:
        """The allocator's share beside the tensors, with its formula."""
        return Term(
            self.cached,
            f"caching allocator {gib(self.cached)} (replayed: {self.events:,} allocations of two steps, "
            f"{gib(self.reserved)} reserved for a {gib(self.allocated)} tensor peak; "
            f"expandable_segments: {gib(self.expandable_cached)})"
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
    z = setup.zero
    unreplayed = is_subset(z) or z.loss != "plain" or z.sequence_parallel_size > 1
    if z.engine == "ddp" or z.offload_param is not Offload.NONE or unreplayed:
        return None
    step = FsdpStep if z.engine == "fsdp" else Step
    events = step(setup, device, activations, implementation).events()
    plain, grown = replay(events), replay(events, expandable_segments=True)
    count = sum(isinstance(e, Alloc) for e in events)
    built = replay(events[: next(i for i, e in enumerate(events) if isinstance(e, Mark))]).max_allocated
    return Reserved(_stepping(plain), plain.max_reserved, _stepping(grown), grown.max_reserved, count, built)


def _stepping(run: Replay) -> int:
    """The replay's tensor peak over its steps' phases: what the timeline's peak stands for (the states'
    construction before the first step can hold more, as stages 1-2 flattening the module beside it)."""
    return max(allocated for allocated, _ in run.phases.values())
