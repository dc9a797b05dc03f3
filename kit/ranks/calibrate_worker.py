"""The per-rank script of ``zerokit calibrate --measure``: what the step-time model needs, measured here.

By hand (``kit.run.calibrate.measure`` writes the spec and runs exactly this)::

    DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 PYTHONPATH=. \\
        deepspeed --num_gpus 2 --module kit.ranks.calibrate_worker --spec runs/calibration-spec.json

Every rank measures at the same time as the others (a barrier before each measurement), so the rates
include what ranks sharing a machine do to each other; rank 0 prints one ``ZEROKIT_CALIBRATION {json}``
line per measurement, which the parent fits (``kit.run.calibrate.fit``):

- ``compute``: forward and backward of the spec's model alone (no engine) at each micro batch of
  ``micro_batches``, in rounds;
- ``adam``: one ``torch.optim.Adam`` step on ``adam_numel`` elements, on the device and on the host;
- ``copy``: device to host and host to device copies of ``copy_bytes``;
- ``collective``: commtest's timed collectives (``kit.ranks.commtest_worker.time_collective``) per size,
  the median of ``repeat`` rounds (a spec with ``collectives_only`` measures only these: the second
  launch that measures them on another number of ranks);
- ``engine``: per engine of ``engines`` (a Setup with grad accum >= 2), each micro-step of each timed
  step: ``train_step`` of ``kit.ranks.engine``, as a sweep steps it, timed at the end of every
  ``engine.step()``; the last micro-step of a step carries the optimizer step and the boundary's work.

Seconds are CUDA events on a GPU (NCCL), ``perf_counter`` on the CPU accelerator (gloo).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from typing import TYPE_CHECKING

from kit.specs import TIMED, CalibrateSpec, EngineConfig
from kit.steptime.calibration import TAG

if TYPE_CHECKING:
    import torch

    from kit.schema import Setup


def seconds(fn, device, repeat: int, warmup: int = 1) -> tuple[float, float]:
    """Median seconds of ``fn()`` over ``repeat`` calls after ``warmup`` (CUDA events on a GPU), and the
    median share of them this process kept a core busy (``busy``)."""
    import torch

    for _ in range(warmup):
        fn()
    times, shares = [], []
    for _ in range(repeat):
        cpu = time.process_time()
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        shares.append(busy(time.process_time() - cpu, times[-1]))
    return statistics.median(times), statistics.median(shares)


def busy(cpu_s: float, wall_s: float) -> float:
    """The share of ``wall_s`` a rank of ``torch.get_num_threads()`` threads kept its cores busy: its
    process CPU seconds (every thread's, gloo's included) over wall x threads, at most 1. What is not
    busy is waiting (a peer, a collective's socket, a core another process holds)."""
    import torch

    return min(1.0, cpu_s / (wall_s * torch.get_num_threads())) if wall_s > 0 else 1.0


class Bare:
    """The spec's model without an engine: one forward + backward of a micro batch, timed."""

    def __init__(self, setup: Setup, device: torch.device, dtype: torch.dtype) -> None:
        from kit import workloads

        self.setup, self.device, self.dtype = setup, device, dtype
        self.workload = workloads.for_model(setup.model)
        self.model = self.workload.build().to(device=device, dtype=dtype)
        self.inputs: dict[int, tuple] = {}

    def seconds(self, micro_batch: int) -> tuple[float, float]:
        """Seconds of one forward + backward at ``micro_batch``, and their busy share."""
        from kit.ranks import engine

        if micro_batch not in self.inputs:
            at = self.setup.replace(batch={"micro_batch": micro_batch, "grad_accum": 1})
            args, kwargs = engine.micro_batch(self.workload, at, 0, 0, 1)
            args = tuple(engine._to(x, self.device, self.dtype) for x in args)
            kwargs = {k: engine._to(x, self.device, self.dtype) for k, x in kwargs.items()}
            self.inputs[micro_batch] = (args, kwargs)
            for _ in range(2):  # warm-up: the first backward allocates the gradients, the allocator settles
                self.step(micro_batch)
        return seconds(lambda: self.step(micro_batch), self.device, 1, warmup=0)

    def step(self, micro_batch: int) -> None:
        args, kwargs = self.inputs[micro_batch]
        self.workload.loss(self.model(*args, **kwargs)).backward()


def compute(spec: CalibrateSpec, bare: Bare) -> dict:
    """Forward + backward without an engine at each micro batch of ``micro_batches``, in turn for
    ``repeat`` rounds: seconds per round (a changing load on a shared machine falls on a round's
    micro batches alike, so their ratio holds), and each time's busy share."""
    seq = bare.setup.batch.seq_len
    _barrier()
    rounds = [[bare.seconds(mb) for mb in spec.micro_batches] for _ in range(spec.repeat)]
    return {"micro_batches": spec.micro_batches, "tokens": [mb * seq for mb in spec.micro_batches]} | {
        "rounds_s": [[t for t, _ in r] for r in rounds],
        "rounds_busy": [[b for _, b in r] for r in rounds],
    }


def adam(numel: int, device, repeat: int) -> dict:
    """Seconds of one Adam step on ``numel`` fp32 elements, on ``device`` and on the host (and the host
    step's busy share)."""
    import torch

    out: dict[str, float] = {"numel": numel}
    for where in {device.type: device, "cpu": torch.device("cpu")}.values():
        p = torch.nn.Parameter(torch.zeros(numel, device=where))
        p.grad = torch.ones_like(p)
        opt = torch.optim.Adam([p], lr=1e-4)
        _barrier()
        took, share = seconds(opt.step, where, repeat)
        out["host_s" if where.type == "cpu" else "device_s"] = took
        if where.type == "cpu":
            out["host_busy"] = share
        del opt, p
    if device.type == "cpu":
        out["device_s"] = out["host_s"]
    return out


def copies(nbytes: int, device, repeat: int) -> dict:
    """Seconds of a device-to-host and a host-to-device copy of ``nbytes`` (pinned host memory on a GPU),
    and the busy share of both."""
    import torch

    on_device = torch.empty(nbytes, dtype=torch.uint8, device=device)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
    _barrier()
    down, down_busy = seconds(lambda: host.copy_(on_device, non_blocking=True), device, repeat)
    up, up_busy = seconds(lambda: on_device.copy_(host, non_blocking=True), device, repeat)
    share = (down * down_busy + up * up_busy) / (down + up)
    return {"bytes": nbytes, "to_host_s": down, "to_device_s": up, "busy": share}


def collectives(sizes: tuple[int, ...], device, iters: int, repeat: int) -> list[dict]:
    """Seconds per call of commtest's collectives over message sizes (the full buffer, as nccl-tests),
    and the busy share of the whole timing (its warm-up call and barrier are the same kind of wait):
    the median of ``repeat`` rounds over every op and size in turn (a load spike on a shared machine
    then falls on one round, not on one size's line)."""
    import torch.distributed as dist

    from kit.ranks.commtest_worker import buffer_numel, time_collective

    cases = [(op, buffer_numel(size, dist.get_world_size())) for op in TIMED for size in sizes]
    rounds: dict[tuple[str, int], list[tuple[float, float]]] = {case: [] for case in cases}
    for _ in range(repeat):
        for op, numel in cases:
            cpu, start = time.process_time(), time.perf_counter()
            took = time_collective(op, numel, device, iters, 1)
            rounds[op, numel].append((took, busy(time.process_time() - cpu, time.perf_counter() - start)))
    return [
        {
            "op": op,
            "size_bytes": 4 * numel,
            "s": statistics.median(t for t, _ in rounds[op, numel]),
            "busy": statistics.median(b for _, b in rounds[op, numel]),
        }
        for op, numel in cases
    ]


def engine_steps(config: EngineConfig, spec: CalibrateSpec, rank: int, world: int, bare: Bare) -> dict:
    """Each micro-step's seconds of ``config``'s engine over the timed steps (after ``warmup`` steps),
    and after each step the same micro batch's forward + backward without the engine (``bare_s``): the
    engine's own cost is the difference of two times measured under the same load; beside each time its
    process CPU seconds (``micro_steps_cpu_s``, ``bare_cpu_s``)."""
    from deepspeed.accelerator import get_accelerator

    from kit.ranks import engine

    setup = config.setup
    run = engine.build_engine(setup, spec.seed)
    marks: list[tuple[float, float]] = []

    @contextlib.contextmanager
    def phase(name):
        yield
        if name == "optimizer":
            get_accelerator().synchronize()
            marks.append((time.perf_counter(), time.process_time()))

    try:
        for step in range(spec.warmup):
            engine.train_step(run.engine, run.workload, setup, step, rank, world, seed=spec.seed)
        steps, cpus, reference = [], [], []
        for step in range(spec.warmup, spec.warmup + spec.steps):
            _barrier()
            marks.clear()
            get_accelerator().synchronize()
            start = (time.perf_counter(), time.process_time())
            engine.train_step(run.engine, run.workload, setup, step, rank, world, seed=spec.seed, phase=phase)
            ends = [start, *marks]
            steps.append([b[0] - a[0] for a, b in zip(ends, ends[1:], strict=False)])
            cpus.append([b[1] - a[1] for a, b in zip(ends, ends[1:], strict=False)])
            reference.append(bare.seconds(setup.batch.micro_batch))
    finally:
        engine.teardown(run.engine)
        del run
    return {
        "key": config.key,
        "setup": config.setup.model_dump(mode="json"),
        "micro_steps_s": steps,
        "micro_steps_cpu_s": cpus,
        "bare_s": [t for t, _ in reference],
        "bare_busy": [b for _, b in reference],
    }


def _barrier() -> None:
    import torch.distributed as dist

    dist.barrier()


def main(argv: list[str] | None = None) -> int:
    import deepspeed
    import torch
    from deepspeed.accelerator import get_accelerator

    from kit.ranks import engine
    from kit.ranks.commtest_worker import emit

    spec, rank, world = engine.join(
        argv, "Measure this machine for the step-time model (zerokit calibrate).", CalibrateSpec
    )
    cuda = get_accelerator().device_name() == "cuda"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)  # before any collective: NCCL runs on this rank's own GPU
    setup = spec.setup
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(setup.zero.precision, torch.float32)

    def report(kind: str, value) -> None:
        if rank == 0:
            emit(TAG, {"kind": kind, "value": value})

    report(
        "machine",
        {
            "device": torch.cuda.get_device_name() if cuda else "cpu",
            "backend": torch.distributed.get_backend(),
            "world_size": world,
            "threads_per_rank": torch.get_num_threads(),
            "torch": torch.__version__,
            "deepspeed": deepspeed.__version__,
        },
    )
    only = spec.collectives_only  # the launch on other rank counts
    if not only:
        bare = Bare(setup, device, dtype)
        report("compute", compute(spec, bare))
        report("adam", adam(spec.adam_numel, device, spec.repeat))
        report("copy", copies(spec.copy_bytes, device, spec.repeat))
    report("collective", collectives(spec.sizes, device, spec.iters, spec.repeat))
    for config in () if only else spec.engines:
        report("engine", engine_steps(config, spec, rank, world, bare))
        _barrier()
    # every rank leaves gloo together: a rank exiting while a peer's gloo thread still holds its socket
    # aborted the peer ("terminate called without an active exception", 1 launch in 2 on 4 ranks)
    _barrier()
    torch.distributed.destroy_process_group()
    report("done", True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
