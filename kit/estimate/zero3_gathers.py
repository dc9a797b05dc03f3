"""Stage 3's parameter gathers as DeepSpeed 0.19 allocates and frees them, for the replay of
``kit.estimate.deepspeed_events``: its ``PartitionedParameterCoordinator``
(``partitioned_param_coordinator.py``) over ``all_gather_coalesced`` (``partition_parameters.py``).

A module is what one ``fetch_sub_module`` gathers: tensor indices in ``partition.numels``' order (a
weight and its bias; the tied head's module is the embeddings' weight again).

- **fetch** (``_fetch_sub_module_impl``): the module's tensors not gathered go out in one call and are
  waited for; with a recorded trace the fetch queue is consumed up to the module and the next tensors not
  gathered are prefetched in one call, while fewer than ``min(stage3_max_live_parameters - live,
  stage3_prefetch_bucket_size)`` elements are on their way. The first step records the order modules
  are fetched in (``record_module``, from ``reset_step`` at the forward's start); the later ones prefetch
  from it.
- **a call** (``all_gather_coalesced``): one tensor gets a buffer of its padded size, its storage
  (``_all_gather_sequential``); several, one flat buffer of their padded partitions
  (``_all_gather_coalesced``) and, at the first wait, a ``torch.cat`` copy of each, the flat buffer freed
  once every tensor of the call was waited for. All on the gather stream.
- **release** (``release_sub_module``): while recording, the module's tensors; then those not fetched
  again within ``stage3_max_reuse_distance`` elements of the trace and not prefetched for a later use
  (``__params_to_release``). Tensors of at most ``stage3_param_persistence_threshold`` elements are never
  released by a module, nor is an external one (``partition.external_head``).
- **the step's end** (``_partition_all_parameters``): every tensor is released, the persistent ones too,
  and those are gathered again after the update (``_post_step``), on the default stream.
- **one rank** (``kit.estimate.partition.gathers_in_place``): the same calls, none allocating.

What it cannot see: a module holding several large tensors (each large tensor is its own module here;
a small tensor after a weight without a bias, a norm's, is taken as its bias),
hpZ's secondary partitions and quantized gathers (gathered as plain 16-bit ones), NVMe, ``fast_fetch``
of leaf modules, and when the frees of ``record_stream`` come back (at once here).
"""

from __future__ import annotations

import itertools
from bisect import bisect_left
from collections import defaultdict, deque
from collections.abc import Callable

from kit.estimate import partition
from kit.schema import ZeroSettings

Module = tuple[int, ...]


class Gathers:
    """The gathered tensors of one rank across the steps of a replay; ``alloc(size, stream)`` and
    ``free(*keys)`` write the events (``deepspeed_events.Step``'s)."""

    def __init__(
        self,
        numels: list[int],
        element: int,
        ranks: int,
        zero: ZeroSettings,
        alloc: Callable[[int, int], int],
        free: Callable[..., None],
        streams: tuple[int, int],
        external: Module = (),
        in_place: bool = False,
    ) -> None:
        self.numels, self.element, self.ranks = numels, element, ranks
        self.alloc, self.free = alloc, free
        self.default, self.stream = streams
        self.bucket, self.max_live = zero.prefetch_bucket_size, zero.max_live_parameters
        self.reuse = zero.max_reuse_distance
        self.persistent = {i for i, t in enumerate(numels) if t <= zero.param_persistence_threshold}
        self.external = set(external)
        self.in_place = in_place  # one rank: a gathered tensor is a view of its partition
        self.storage: dict[int, int | None] = {}  # a gathered tensor: the key of its storage
        self.inflight: dict[int, list] = {}  # a tensor in flight: its call [flat key, tensors, copied?]
        self.mode = "invalid"
        self.recording: list[Module] = []
        self.trace: tuple[Module, ...] = ()
        self.before: list[int] = []  # elements of the trace's modules before each one (a running sum)
        self.uses: dict[int, list[int]] = defaultdict(list)  # a tensor: the trace's modules that use it
        self.queue: deque[tuple[int, int]] = deque()
        self.fetched_for: dict[int, int] = defaultdict(lambda: -(10**10))
        self.position = 0
        self.live = 0

    def modules(self, tensors: list[int]) -> list[Module]:
        """``tensors`` (indices, in the forward's order) as modules: each large tensor with the small one
        after it (its bias); small tensors alone are normalization modules (persistent) of their own."""
        out: list[list[int]] = []
        for i in tensors:
            if i in self.persistent and out and len(out[-1]) == 1 and out[-1][0] not in self.persistent:
                out[-1].append(i)
            else:
                out.append([i])
        return [tuple(m) for m in out]

    # ----- the engine's hooks -------------------------------------------------------------------------
    def reset(self) -> None:
        """``reset_step`` (the forward begins): calls in flight waited for and released; the first
        call starts recording the trace, the second completes it; the fetch queue restarts."""
        for i in list(self.inflight):
            self._wait(i)
            self._release(i)
        if self.mode == "invalid":
            self.mode = "record"
        elif self.mode == "record":
            self.mode, self.trace = "complete", tuple(self.recording)
            self.before = list(
                itertools.accumulate((sum(self.numels[i] for i in m) for m in self.trace), initial=0)
            )
            for k, m in enumerate(self.trace):
                for i in m:
                    self.uses[i].append(k)
        self.queue = deque((i, step) for step, m in enumerate(self.trace) for i in sorted(m))
        self.fetched_for = defaultdict(lambda: -(10**10))
        self.position, self.live = 0, 0

    def fetch(self, module: Module) -> None:
        """``fetch_sub_module``: the module's tensors gathered, then the prefetch."""
        if self.mode == "record":
            self.recording.append(module)
        missing = [i for i in module if i not in self.storage and i not in self.inflight]
        if missing:
            self._call(missing)
        for i in module:
            self._wait(i)
        if self.mode == "complete":
            self._prefetch(module)
        self.position += 1

    def release(self, module: Module) -> None:
        """``release_sub_module`` after the module's forward or backward."""
        keep = self._reused(module) if self.mode == "complete" else set()
        for i in module:
            if i not in self.persistent and i not in self.external and i not in keep:
                self._release(i)

    def end(self) -> None:
        """``_partition_all_parameters`` before the update: everything released, the persistent too."""
        for i in list(self.inflight):
            self._wait(i)
        for i in list(self.storage):
            self._release(i)

    def regather_persistent(self) -> None:
        """``_post_step``: the persistent tensors gathered again (one buffer each, the default stream)."""
        for i in sorted(self.persistent):
            size = self.element * partition.padded(self.numels[i], self.ranks)
            self.storage[i] = None if self.in_place else self.alloc(size, self.default)

    # ----- inside -------------------------------------------------------------------------------------
    def _call(self, tensors: list[int]) -> None:
        """One ``all_gather_coalesced``: a buffer for one tensor, else a flat buffer (copies at the wait)."""
        tensors = sorted(tensors)
        self.live += sum(self.numels[i] for i in tensors)
        if self.in_place:
            self.storage.update(dict.fromkeys(tensors))
            return
        padded = [self.element * partition.padded(self.numels[i], self.ranks) for i in tensors]
        if len(tensors) == 1:
            self.storage[tensors[0]] = self.alloc(padded[0], self.stream)
            return
        call = [self.alloc(sum(padded), self.stream), set(tensors), False]
        for i in tensors:
            self.inflight[i] = call

    def _wait(self, i: int) -> None:
        """The wait of tensor ``i``'s call: its first copies each tensor out of the flat buffer, which is
        freed when the last of them was waited for."""
        call = self.inflight.pop(i, None)
        if call is None:
            return
        flat, tensors, copied = call
        if not copied:
            for j in sorted(tensors):
                self.storage[j] = self.alloc(self.element * self.numels[j], self.stream)
            call[2] = True
        tensors.discard(i)
        if not tensors:
            self.free(flat)

    def _release(self, i: int) -> None:
        if i in self.storage:
            self.free(self.storage.pop(i))
            self.live -= self.numels[i]

    def _prefetch(self, module: Module) -> None:
        """The queue consumed up to ``module``'s tensors, then the next ones not gathered, in one call."""
        wanted = {i for i in module if self.fetched_for[i] < self.position}
        discarded: set[int] = set()
        while self.queue and len(discarded) < len(wanted):
            i, step = self.queue.popleft()
            self.fetched_for[i] = step
            discarded.add(i)
        room = min(self.max_live - self.live, self.bucket)
        chosen: list[int] = []
        taken = 0
        while self.queue and taken < room:
            i, step = self.queue.popleft()
            ready = i in self.storage or i in self.inflight
            self.fetched_for[i] = max(self.fetched_for[i], step)
            if not ready and i not in chosen:
                chosen.append(i)
                taken += self.numels[i]
        if chosen:
            self._call(chosen)

    def _reused(self, module: Module) -> set[int]:
        """``__params_to_release``' exceptions: tensors prefetched for a later use, or fetched again
        within the reuse distance (the modules from the next one on, elements counted per module)."""
        # the modules walked: from the position on, while fewer than ``reuse`` elements were walked before
        start = min(self.position, len(self.trace))
        end = bisect_left(self.before, self.before[start] + self.reuse, lo=start)
        kept = {i for i in module if self.fetched_for[i] > self.position}
        for i in module:
            uses = self.uses[i]
            k = bisect_left(uses, start)
            if k < len(uses) and uses[k] < end:
                kept.add(i)
        return kept
