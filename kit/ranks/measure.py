"""What a rank measures about a training step: time, throughput, activations, peak memory, communication.

Model-state bytes come from ``kit.ranks.state_walk`` (DeepSpeed's own partitioned structures); everything
else is here. All functions run inside a launched rank, on GPU or on the CPU accelerator.

What it cannot see: activations are the tensors autograd saves (``saved_tensors_hooks``), not the
transient ones freed inside an op; on CPU there is no device peak (``peak_*_bytes`` are null), only the
process's RSS high-water mark, which includes Python, the libraries and anything allocated before the
window; communication is what goes through ``deepspeed.comm``'s backend (``kit.ranks.comm_scopes``,
which also splits it by node; DeepSpeed's comms logger sees the same), not torch.distributed calls made
around it; step times include this process's share of a shared machine.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from kit.monitor import rss_bytes
from kit.schema import Setup
from kit.steptime.perf import model_flops


def throughput(
    setup: Setup, step_time_s: float, samples: int | None = None, tokens: int | None = None
) -> dict[str, float]:
    """Global samples/s, tokens/s and achieved TFLOP/s (``model_flops``) of one optimizer step (of
    ``samples`` and ``tokens`` when a step's data differs from the Setup's nominal batch)."""
    samples = samples or setup.batch.train_batch
    tokens = tokens or setup.tokens_per_step
    return {
        "samples_per_s": samples / step_time_s,
        "tokens_per_s": tokens / step_time_s,
        "tflops": model_flops(setup, tokens) / step_time_s / 1e12,
    }


@contextlib.contextmanager
def timed() -> Iterator[dict[str, float]]:
    """``with timed() as t: ...`` then ``t["s"]``: wall seconds, the device synchronized at both ends, and
    ``t["cpu_s"]``: this process's CPU seconds meanwhile (every thread; what other processes of a shared
    machine take does not count, time waiting on the other ranks neither)."""
    from deepspeed.accelerator import get_accelerator

    result: dict[str, float] = {}
    get_accelerator().synchronize()
    start, cpu = time.perf_counter(), time.process_time()
    yield result
    get_accelerator().synchronize()
    result["s"], result["cpu_s"] = time.perf_counter() - start, time.process_time() - cpu


class SavedActivations:
    """Peak bytes of tensors autograd saves for backward, in ``with counter.watch(model):`` around the
    forward, loss and backward of one micro-step.

    Each storage is counted once, at its full size; parameters (and views of them, also ZeRO-3's
    gathered ones) are excluded. Everything is saved by the end of the forward, so that is the peak,
    except with activation checkpointing (pass its ``Checkpointing`` to ``watch``): then what each
    checkpointed block keeps plus the other saved tensors, plus the largest block's recomputation in
    backward.
    """

    def __init__(self) -> None:
        self.saved: dict[tuple[str, int], int] = {}
        self.recompute_peak = 0
        self._recomputed: dict[tuple[str, int], int] | None = None
        self._is_parameter = lambda key, nbytes: False  # set by ``watch``

    @property
    def bytes(self) -> int:
        return sum(self.saved.values()) + self.recompute_peak

    def checkpoint_inputs(self, tensors) -> None:
        for t in tensors:
            self.saved.setdefault(_storage_key(t), t.untyped_storage().nbytes())

    def recomputed(self, storages) -> None:
        """Storages a recomputation saved out of the hooks' sight (``Checkpointing``'s non-reentrant one)."""
        into = self._recomputed if self._recomputed is not None else self.saved
        for storage in storages:
            key = (str(storage.device), storage.data_ptr())
            if storage.nbytes() and not self._is_parameter(key, storage.nbytes()):
                into.setdefault(key, storage.nbytes())

    @contextlib.contextmanager
    def recomputing(self) -> Iterator[None]:
        self._recomputed = {}
        try:
            yield
        finally:
            self.recompute_peak = max(self.recompute_peak, sum(self._recomputed.values()))
            self._recomputed = None

    @contextlib.contextmanager
    def watch(self, model, checkpointing=None) -> Iterator[SavedActivations]:
        """Count what autograd saves within the block; ``checkpointing`` (``kit.ranks.engine.Checkpointing``)
        lets it see the inputs checkpointed blocks keep and their recomputation."""
        import torch

        # FSDP2's parameters are DTensors: their storage is the local shard's
        params = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
        # storage sizes a parameter can have (ZeRO-3 gathers into a buffer padded to a multiple of
        # the world size): only a saved tensor of such a size is compared with every parameter
        sizes = {p.untyped_storage().nbytes() for p in params} | {_gathered_bytes(p) for p in params}

        def is_parameter(key, nbytes) -> bool:  # a parameter's storage (a view, or ZeRO-3's gathered copy)
            return nbytes in sizes and key in {_storage_key(p) for p in params if p.numel()}

        self._is_parameter = is_parameter

        def pack(t):
            if isinstance(t, torch.nn.Parameter) or isinstance(t._base, torch.nn.Parameter) or not t.numel():
                return t  # a parameter, or a view of one (FSDP2's gathered parameters are new ones)
            into = self.saved if self._recomputed is None else self._recomputed
            key = _storage_key(t)
            if key in into:
                return t
            nbytes = t.untyped_storage().nbytes()
            if not is_parameter(key, nbytes):
                into[key] = nbytes
            return t

        watching = checkpointing.observed_by(self) if checkpointing else contextlib.nullcontext()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), watching:
            yield self


def _gathered_bytes(p) -> int:
    """Bytes of the buffer ZeRO-3 gathers parameter ``p`` into (0 for an ordinary parameter)."""
    if not hasattr(p, "ds_numel"):
        return 0
    import deepspeed.comm as dist

    world = dist.get_world_size()
    return -(-p.ds_numel // world) * world * p.element_size()


def _storage_key(t) -> tuple[str, int]:
    return str(t.device), t.untyped_storage().data_ptr()


def on_cpu() -> bool:
    """Whether this rank runs on DeepSpeed's CPU accelerator (no device memory counters)."""
    from deepspeed.accelerator import get_accelerator

    return get_accelerator().device_name() == "cpu"


def use_allocator(expandable_segments: bool) -> None:
    """PyTorch's caching allocator as the configuration asks (``zero.expandable_segments``, what
    ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` sets at start-up), before its engine is built:
    torch applies it to the segments made from then on (the configuration before this one emptied its
    cache at teardown). Nothing on the CPU accelerator, which has no caching allocator."""
    if on_cpu():
        return
    import torch

    torch._C._accelerator_setAllocatorSettings(f"expandable_segments:{expandable_segments}")


def reset_peaks() -> None:
    """Start new peak-memory windows: the device's max_memory_* and the process's RSS high-water mark."""
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    if acc.device_name() != "cpu":
        acc.reset_peak_memory_stats()
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS (Linux proc(5))


def peaks() -> dict[str, int | None]:
    """Peak device bytes since ``reset_peaks`` (None on the CPU accelerator) and peak process RSS."""
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    on_gpu = acc.device_name() != "cpu"
    return {
        "peak_allocated_bytes": acc.max_memory_allocated() if on_gpu else None,
        "peak_reserved_bytes": acc.max_memory_reserved() if on_gpu else None,
        "peak_rss_bytes": peak_rss_bytes(),
    }


def peak_rss_bytes() -> int | None:
    """This process's resident-set high-water mark (VmHWM in /proc/self/status), None off Linux."""
    return rss_bytes(peak=True)


def comm_bytes(scopes=None) -> dict[str, int]:
    """Bytes per collective family since the last ``reset_comm``: what ``scopes``
    (``kit.ranks.comm_scopes.CommScopes``, every collective through ``deepspeed.comm``) counted, intra- and
    inter-node together, plus what a PyTorch baseline sent (``kit.ranks.baselines.COUNTER``); both in the
    convention of DeepSpeed's comms logger (``logged_comm_bytes``, which they equal)."""
    from kit.ranks.baselines import COUNTER

    totals: dict[str, int] = dict(COUNTER.sent)
    for ops in (scopes.bytes() if scopes is not None else {}).values():
        for op, size in ops.items():
            totals[op] = totals.get(op, 0) + size
    return totals


def comm_wire_bytes(scopes, world: int) -> int:
    """Bytes this rank put on the wire since the last ``reset_comm``: each collective ``scopes`` counted
    priced by its own group's ring factor (hpZ's gathers inside a node are 2-rank rings, not the world's),
    plus a PyTorch baseline's over the world (``kit.rules.wire_bytes``)."""
    from kit.ranks.baselines import COUNTER
    from kit.rules import wire_bytes

    scoped = sum(scopes.wire_bytes().values()) if scopes is not None else 0
    return scoped + wire_bytes(dict(COUNTER.sent), world)


def logged_comm_bytes() -> dict[str, int]:
    """Bytes DeepSpeed's comms logger recorded since the last ``reset_comm``, per collective family (op
    names folded: ``all_gather_into_tensor`` -> ``all_gather``). The logger synchronizes the device after
    every collective and times each, so it is a probe of its own (``comm_logger``), off by default."""
    from deepspeed.comm import comm

    totals: dict[str, int] = {}
    for name, sizes in comm.comms_logger.comms_dict.items():
        op = _collective(name)
        totals[op] = totals.get(op, 0) + sum(size * entry[0] for size, entry in sizes.items())
    return totals


def reset_comm() -> None:
    """Forget what the comms logger, its timers and a baseline's counter recorded (call before the
    measured step). The timers matter: each keeps every latency since the process began and sums them
    all at every collective."""
    from deepspeed.comm import comm

    from kit.ranks.baselines import COUNTER

    comm.comms_logger.reset_data()
    comm.timers.timers.clear()
    COUNTER.reset()


def _collective(name: str) -> str:
    for family in (
        "all_reduce",
        "reduce_scatter",
        "all_gather",
        "all_to_all",
        "broadcast",
        "reduce",
        "barrier",
    ):
        if name.startswith(family):
            return family
    return name
