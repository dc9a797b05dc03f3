"""Peak device-tensor bytes per phase of one training step, on this rank.

A step's phases are ``forward`` (the micro batch, the forward and the loss; at stage 3 the all-gathers it
triggers), ``backward`` (``engine.backward``: the gradients, their reduction that overlaps it and its
epilogue; at stage 3 its all-gathers too) and ``optimizer`` (``engine.step``); with gradient accumulation
each phase's peak is the largest over the micro-steps. ``peak_tensor_bytes`` is the largest phase.

On a CUDA device each phase is ``max_memory_allocated`` after ``reset_peak_memory_stats`` at its start:
the caching allocator's own count of live tensor bytes, so host memory (offloaded states, pinned
buffers) is not in it. On the CPU accelerator every tensor lives in the same RAM, so the step runs
under PyTorch's profiler (``profile_memory=True``, ``record_shapes=True``) and its event tree
(``torch.profiler._memory_profiler.OpTree``) is replayed: every allocation and free with its pointer and
bytes, and the tensors each op reads. The level entering the step is the storages live before it
(the state walk's device-side model states, exact, and any other storage an op reads before the window
allocates at its address, sized by its free in the window or by its extent); what DeepSpeed keeps on
the host is left out: the storages the state walk puts there (``host``) and whatever is allocated inside
a ``host_side()`` block (the wrapped torch optimizer's step on offloaded states). The profiler costs
more than a step of a small model, so on CPU it runs only when asked (``zerokit run --memory-timeline``).

Gloo's frees: the profiler records a thread's allocations and frees only while that thread carries its
state, and gloo's worker thread holds a finished collective's work (its tensors, and the copies it made)
a moment after the caller's wait returns: about half of a toy's synchronous all-reduces still have
their tensor held there when the call returns. Whenever the caller dropped its last reference first
(a flat gradient bucket, say), the storage was freed on gloo's thread, unrecorded, and went on counting
in later phases (up to 45 % of a phase under load; FSDP2's reduce-scatter inputs, 273,920 B of a toy's
optimizer phase, 1 run in 3). So while recording on CPU every collective of DeepSpeed's backend, and
FSDP2's own, is settled (``settled_collectives``): waited at once, and returned only once its
tensors are held no more than before the call (or after ``SETTLE_S``, on a loaded machine); the storages
its work allocated die with the work, by the end of the collective's window. The caller's own frees then
happen on its thread, when they really do, as a GPU's allocator would count them. A storage that still
dies on another thread (gloo holding it past ``SETTLE_S``, or through another tensor of it, which its hold
on the given one does not show: a stage 1-2 flat gradient bucket, 2 launches in 37 under load, +14-25 % of
an optimizer phase) is caught by a finalizer on its Python object, which PyTorch keeps for as long as the
storage and which runs on the thread that frees it (``LostFrees``): the replay puts the free back at that
moment.

What it cannot see: on CPU, a storage allocated before any profiling and freed during the window (the
CPU allocator does not report such a free, so that storage still counts after it), any other free on a
thread the profiler does not record until its address is reused, non-tensor allocations the profiler
does not record, and the caching allocator's fragmentation (a GPU's reserved bytes); on CUDA,
allocations made outside PyTorch's allocator (NCCL's buffers, the CUDA context).
"""

from __future__ import annotations

import contextlib
import heapq
import os
import threading
import time
import weakref
from collections.abc import Iterator, Sequence

#: the phases of a step, in order
PHASES = ("forward", "backward", "optimizer")
_PHASE = "zerokit::phase::"
_HOST = "zerokit::host"
_COLLECTIVE = "zerokit::collective"
#: the backend methods (``deepspeed.comm.comm.cdb``, a ``TorchBackend``) a CPU recording settles
COLLECTIVES = (
    "all_reduce", "all_reduce_coalesced", "reduce", "reduce_scatter", "reduce_scatter_tensor", "broadcast",
    "all_gather", "all_gather_into_tensor", "all_gather_base", "all_gather_coalesced", "all_to_all_single",
    "all_to_all",
)  # fmt: skip
#: the ``torch.distributed`` functions a PyTorch baseline calls itself (FSDP2's all-gather and
#: reduce-scatter, ``kit.ranks.baselines``), settled too
TORCH_COLLECTIVES = ("all_gather_into_tensor", "reduce_scatter_tensor")
#: the longest a collective waits for gloo's worker to let go of its tensors (a storage it frees later is
#: one of ``LostFrees``'s)
SETTLE_S = 1.0
#: the sleep between looks at gloo's hold: a real sleep, so that the worker thread gets the core
POLL_S = 1e-4


class StepMemory:
    """``with memory.recording(): ...`` around one training step, ``memory.phase(name)`` around each
    phase inside it, ``memory.host_side()`` around host-only work; then ``memory.result()``.

    ``device`` (storage pointer -> bytes) and ``host`` (pointers) are the storages the state walk found
    before the step, on the device and on the host (used on the CPU accelerator only).
    """

    def __init__(self, device: dict[int, int] | None = None, host: set[int] | None = None) -> None:
        from deepspeed.accelerator import get_accelerator

        self.accelerator = get_accelerator()
        self.on_cpu = self.accelerator.device_name() == "cpu"
        self.known = dict(device or {})
        self.host = set(host or ())
        self.phases: dict[str, int] = {}
        self.lost: LostFrees | None = None  # CPU: the frees the last recording put back
        self.earlier = {"peak_allocated_bytes": 0, "peak_reserved_bytes": 0}  # GPU: peaks each reset ended

    @contextlib.contextmanager
    def recording(self) -> Iterator[StepMemory]:
        if not self.on_cpu:
            yield self
            return
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        with (
            profile(activities=activities, profile_memory=True, record_shapes=True) as prof,
            settled_collectives() as lost,
        ):
            yield self
        self.lost = lost
        self.phases = replay(prof.profiler.kineto_results, self.known, self.host, lost.frees)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name not in PHASES:
            raise ValueError(f"phase: choose one of {', '.join(PHASES)}, got {name!r}")
        if self.on_cpu:
            from torch.profiler import record_function

            with record_function(_PHASE + name):
                yield
            return
        self.accelerator.synchronize()
        acc, earlier = self.accelerator, self.earlier
        earlier["peak_allocated_bytes"] = max(earlier["peak_allocated_bytes"], acc.max_memory_allocated())
        earlier["peak_reserved_bytes"] = max(earlier["peak_reserved_bytes"], acc.max_memory_reserved())
        acc.reset_peak_memory_stats()
        yield
        self.accelerator.synchronize()
        self.phases[name] = max(self.phases.get(name, 0), self.accelerator.max_memory_allocated())

    @contextlib.contextmanager
    def host_side(self) -> Iterator[None]:
        """Work on host tensors only (an offloaded optimizer's step): on CPU what it allocates is not
        counted; on CUDA the allocator does not see host tensors anyway."""
        if not self.on_cpu:
            yield
            return
        from torch.profiler import record_function

        with record_function(_HOST):
            yield

    def with_earlier(self, peaks: dict) -> dict:
        """``kit.ranks.measure.peaks()`` read after the step, with the peaks the per-phase resets ended
        (GPU): the device's peak since the previous step's last phase, not just this one's."""
        return {
            k: max(v, self.earlier[k]) if k in self.earlier and v is not None else v for k, v in peaks.items()
        }

    def result(self) -> dict:
        """``{"peak_tensor_bytes": int, "phases": {phase: bytes}}``."""
        return {"peak_tensor_bytes": max(self.phases.values(), default=0), "phases": dict(self.phases)}


@contextlib.contextmanager
def host_optimizer(memory: StepMemory, engine) -> Iterator[None]:
    """Within the block, the torch optimizer a ZeRO optimizer wraps steps under ``memory.host_side()``:
    with ``offload_optimizer`` it updates the host's fp32 partition, so its temporaries are host RAM."""
    inner = engine.optimizer.optimizer
    step = inner.step

    def on_host(*args, **kwargs):
        with memory.host_side():
            return step(*args, **kwargs)

    inner.step = on_host
    try:
        yield
    finally:
        del inner.step  # the class's own step again


#: oneDNN's ``ONEDNN_MAX_CPU_ISA`` values that keep its bf16 matmul off AMX, and off AVX-512 bf16
BELOW_AVX512_BF16 = {"sse41", "avx", "avx2", "avx2_vnni", "avx2_vnni_2", "avx512_core", "avx512_core_vnni"}
BELOW_AMX = BELOW_AVX512_BF16 | {"avx512_core_bf16", "avx10_1_512", "avx512_core_fp16"}


def cpu_matmul():
    """How this process's CPU matmuls run (``kit.estimate.cpu_matmul.CpuMatmul``): the ISA oneDNN's
    brgemm picks for bf16 and the threads it books scratch for (``torch.get_num_threads``); on an ISA
    the model does not cover, ``lone_mm_scratch`` measures each shape asked for."""
    import torch

    from kit.estimate.cpu_matmul import CpuMatmul

    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").lower()
    if torch.cpu._is_amx_tile_supported() and cap not in BELOW_AMX:
        isa = "avx512_core_amx"
    elif torch.cpu._is_avx512_bf16_supported() and cap not in BELOW_AVX512_BF16:
        isa = "avx512_core_bf16"
    else:
        isa = torch.backends.cpu.get_cpu_capability().lower()
    return CpuMatmul(isa=isa, threads=torch.get_num_threads(), measure=lone_mm_scratch)


def lone_mm_scratch(m: int, k: int, n: int, transposed_a: bool, transposed_b: bool = False) -> int:
    """Bytes a lone bf16 ``torch.mm`` of an m x k (a transposed view when ``transposed_a``) by a k x n
    matrix (a transposed view when ``transposed_b``: ``x @ weight.t()``) allocates under the profiler
    besides its output: oneDNN's scratchpad, on this CPU and this thread count. Not inside a recording
    (one profiler at a time)."""
    import torch
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import OpTree

    a = torch.ones(k, m, dtype=torch.bfloat16).t() if transposed_a else torch.ones(m, k, dtype=torch.bfloat16)
    b = torch.ones(n, k, dtype=torch.bfloat16).t() if transposed_b else torch.ones(k, n, dtype=torch.bfloat16)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        c = torch.mm(a, b)
        del c
    nodes = OpTree(prof.profiler.kineto_results).sorted_nodes
    allocated = [n.typed[1].alloc_size for n in nodes if n.typed[0] == _EventType.Allocation]
    return sum(size for size in allocated if size > 0) - m * n * 2


def replay(
    result, known: dict[int, int], host: set[int], lost: Sequence[tuple[int, int, int]] = ()
) -> dict[str, int]:
    """Peak live device-tensor bytes per phase from a profiler result (see the module's doc); ``lost``:
    frees the profiler did not record (``LostFrees.frees``), put back where they happened."""
    from torch._C._profiler import _EventType
    from torch.profiler._memory_profiler import OpTree

    nodes = OpTree(result).sorted_nodes
    phases = [
        (n.start_time_ns, n.end_time_ns, n.name[len(_PHASE) :]) for n in nodes if n.name.startswith(_PHASE)
    ]
    host_windows = [(n.start_time_ns, n.end_time_ns) for n in nodes if n.name == _HOST]
    collectives = sorted((n.start_time_ns, n.end_time_ns) for n in nodes if n.name == _COLLECTIVE)
    ends: list[
        tuple[int, int, int]
    ] = []  # (a collective's end, pointer, allocation time): its work's storages
    events = [
        (n.start_time_ns, n.typed[1].ptr, n.typed[1].alloc_size)
        for n in nodes
        if n.typed[0] == _EventType.Allocation
    ]
    live = _live_before(nodes, events, known, host)
    events = _with_lost_frees(events, lost)
    level = sum(live.values())
    peaks: dict[str, int] = {}
    entered = 0  # phases whose entry level is counted
    born: dict[int, int] = {}  # pointer -> when its live storage was allocated
    for t, ptr, size in events:
        while ends and ends[0][0] < t:  # a collective's work died by its end, on whichever thread
            _, dead, at = heapq.heappop(ends)
            if born.get(dead) == at:
                level -= live.pop(dead, 0)
                born.pop(dead)
        while entered < len(phases) and phases[entered][0] <= t:
            name = phases[entered][2]
            peaks[name] = max(peaks.get(name, 0), level)
            entered += 1
        if size > 0:
            if ptr in host or any(start <= t <= end for start, end in host_windows):
                continue  # a host buffer, or allocated by host-side work
            # an address still live was freed unseen (a free the profiler missed): the new storage replaces it
            level += size - live.get(ptr, 0)
            live[ptr] = size
            born[ptr] = t
            end = _within(collectives, t)
            if end is not None:
                heapq.heappush(ends, (end, ptr, t))
        else:
            level -= live.pop(ptr, 0)
            born.pop(ptr, None)
        for start, end, name in phases:
            if start <= t <= end:
                peaks[name] = max(peaks.get(name, 0), level)
    for _, _, name in phases[entered:]:
        peaks[name] = max(peaks.get(name, 0), level)
    return {name: peaks[name] for name in PHASES if name in peaks}


def _with_lost_frees(events: list[tuple[int, int, int]], lost) -> list[tuple[int, int, int]]:
    """``events`` (time, pointer, bytes: < 0 a free) with each lost free put at its time, or just before
    the first allocation at its address after it was watched if that comes first (the profiler's clock
    and Python's differ by a fraction of a millisecond)."""
    if not lost:
        return events
    allocations: dict[int, list[int]] = {}
    for t, ptr, size in events:
        if size > 0:
            allocations.setdefault(ptr, []).append(t)
    frees = []
    for t, ptr, since in lost:
        reused = next((a for a in allocations.get(ptr, ()) if a > since), None)
        frees.append((t if reused is None else min(t, reused - 1), ptr, -1))
    return sorted(events + frees, key=lambda e: e[0])


def _within(windows: list[tuple[int, int]], t: int) -> int | None:
    """The end of the (sorted, disjoint) window holding time ``t``, if any."""
    import bisect

    i = bisect.bisect_right(windows, (t, float("inf"))) - 1
    return windows[i][1] if i >= 0 and windows[i][0] <= t <= windows[i][1] else None


@contextlib.contextmanager
def settled_collectives() -> Iterator[LostFrees]:
    """Within the block, each collective of DeepSpeed's backend, and each of ``TORCH_COLLECTIVES``,
    returns only once its work is done and gloo's worker thread has let go of it (see ``_settle``), and
    the storages it was given that still die on another thread are noted (``LostFrees``); restores the
    functions after."""
    import torch.distributed as dist
    from deepspeed.comm import comm

    cdb, lost = comm.cdb, LostFrees()
    methods = COLLECTIVES if cdb is not None else ()
    saved = {name: vars(cdb)[name] for name in methods if name in vars(cdb)}
    functions = {name: getattr(dist, name) for name in TORCH_COLLECTIVES}
    for name in methods:
        method = getattr(cdb, name, None)
        if method is not None:
            setattr(cdb, name, _settle(method, lost))
    for name, function in functions.items():
        setattr(dist, name, _settle(function, lost))
    try:
        yield lost
    finally:
        for name in methods:
            vars(cdb).pop(name, None)
        if cdb is not None:
            vars(cdb).update(saved)
        for name, function in functions.items():
            setattr(dist, name, function)
        lost.close()


class LostFrees:
    """The storages given to settled collectives that died on another thread than the recording one
    (gloo's worker dropping the last reference, which the profiler does not record): ``frees``, a list
    of ``(unix ns, storage pointer, unix ns it was watched from)``. A finalizer on each storage's Python
    object (PyTorch keeps it as long as the storage) runs on the thread that frees it."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.frees: list[tuple[int, int, int]] = []
        self._watching: dict[int, weakref.finalize] = {}  # id of the storage object -> its finalizer

    def watch(self, tensors: list) -> None:
        for t in tensors:
            storage = t.untyped_storage()
            if id(storage) not in self._watching and storage.nbytes():
                ptr, now = storage.data_ptr(), time.time_ns()
                self._watching[id(storage)] = weakref.finalize(storage, self._freed, id(storage), ptr, now)

    def _freed(self, key: int, ptr: int, since: int) -> None:
        self._watching.pop(key, None)
        if threading.get_ident() != self.thread:
            self.frees.append((time.time_ns(), ptr, since))

    def close(self) -> None:
        """Stop watching (the storages still alive keep no finalizer)."""
        for finalizer in list(self._watching.values()):
            finalizer.detach()
        self._watching.clear()


def _settle(method, lost: LostFrees | None = None):
    """``method`` run under ``_COLLECTIVE``: an asynchronous one waited at once (its handle's ``wait`` is
    then a no-op), and the call returns only once every tensor it was given is held no more than before
    (gloo's worker thread keeps the finished work, and with it those tensors, a moment after the wait
    returns: were the caller's reference dropped first, the storage would be freed on that thread, where
    the profiler does not record the free), or for at most ``SETTLE_S`` (``lost`` notes a storage the
    worker frees later). Storages the work itself allocated (gloo's reduce-scatter clones its input) die
    with it: the replay frees them at the window's end."""

    def settled(*args, **kwargs):
        if _SETTLING.depth:  # DeepSpeed's backend calling torch.distributed: the outer call's window
            return method(*args, **kwargs)
        tensors = [t for t in _tensor_args(args, kwargs) if hasattr(t, "_use_count")]
        held = [t._use_count() for t in tensors]
        if lost is not None:
            lost.watch(tensors)
        _SETTLING.depth += 1
        try:
            return _settled_call(method, tensors, held, args, kwargs)
        finally:
            _SETTLING.depth -= 1

    return settled


def _settled_call(method, tensors: list, held: list[int], args: tuple, kwargs: dict):
    from torch.profiler import record_function

    with record_function(_COLLECTIVE):
        work = method(*args, **kwargs)
        asynchronous = work is not None
        if asynchronous:
            work.wait()
            del work
        deadline = time.monotonic() + SETTLE_S
        while _still_held(tensors, held) and time.monotonic() <= deadline:
            time.sleep(POLL_S)
    return _Done() if asynchronous else None


def _still_held(tensors: list, held: list[int]) -> bool:
    return any(t._use_count() > n for t, n in zip(tensors, held, strict=True))


class _Depth(threading.local):
    depth = 0


#: this thread's settled calls in progress (nested ones pass straight through)
_SETTLING = _Depth()


class _Done:
    """The handle of a collective already waited for."""

    def wait(self, *_, **__) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


def _tensor_args(args: tuple, kwargs: dict) -> Iterator:
    for value in (*args, *kwargs.values()):
        if isinstance(value, (list, tuple)):
            yield from value
        else:
            yield value


def _live_before(nodes, events, known: dict[int, int], host: set[int]) -> dict[int, int]:
    """Device storages live as the window opens (pointer -> bytes): the walk's, and every other one an op
    reads before anything is allocated at its address (sized by its first free if that comes first,
    else by the largest extent read)."""
    from torch._C._profiler import _EventType

    live = {ptr: nbytes for ptr, nbytes in known.items() if ptr not in host}
    first_alloc: dict[int, int] = {}
    first_free: dict[int, tuple[int, int]] = {}
    for t, ptr, size in events:
        if size > 0:
            first_alloc.setdefault(ptr, t)
        else:
            first_free.setdefault(ptr, (t, -size))
    never = float("inf")
    extents: dict[int, int] = {}
    for node in nodes:
        if node.typed[0] != _EventType.TorchOp:
            continue
        for t in _tensor_inputs(node.typed[1]):
            ptr = t.storage_data_ptr
            if ptr is None or ptr in live or ptr in host or t.device.type != "cpu":
                continue
            if node.start_time_ns < first_alloc.get(ptr, never):
                extents[ptr] = max(extents.get(ptr, 0), _extent(t))
    for ptr, extent in extents.items():
        freed = first_free.get(ptr)
        live[ptr] = freed[1] if freed is not None and freed[0] < first_alloc.get(ptr, never) else extent
    return live


def _tensor_inputs(op) -> Iterator:
    for i in op.inputs:
        if hasattr(i, "storage_data_ptr"):
            yield i
        elif isinstance(i, list):
            yield from (t for t in i if hasattr(t, "storage_data_ptr"))


def _extent(t) -> int:
    """Bytes a tensor's view reaches in its storage (PyTorch's ``SizeMap`` rule: sizes times strides)."""
    from torch.profiler._memory_profiler import _element_size

    n = max([size * stride for size, stride in zip(t.sizes or [1], t.strides or [1], strict=True)] or [1])
    return n * _element_size(t.dtype)
