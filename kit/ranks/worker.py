"""The script each rank runs: every configuration of a launch spec back to back, one records line per step.

By hand (``kit.run.sweep`` writes the spec and runs exactly this)::

    DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 PYTHONPATH=. \\
        deepspeed --num_gpus 2 --module kit.ranks.worker --spec runs/demo/launch-<run_id>.json

(drop ``DS_ACCELERATOR=cpu`` on a CUDA machine; ``torchrun --nproc_per_node 2 -m kit.ranks.worker --spec ...``
works too). The spec is ``kit.specs.SweepSpec`` (its fields and what each means are there; a spec that
does not validate stops every rank with one line naming the file and the field); the bench's ``probes``
(``probe_cycle``) switches measurements per step. Per configuration each rank builds the engine, warms
up, measures ``steps`` steps (appending one record per step to records.jsonl, flushed per line), tears
the engine down and meets the others at a barrier. A configuration that raises becomes a record with status
``error`` (``oom`` for out-of-memory) and the next configuration runs. Rank 0 prints one
``ZEROKIT {...}`` line per event on stdout, which the runner parses for progress and its watchdog.

Test-only hook: a config may carry ``"fault"``: ``"raise"`` (every rank raises in the build),
``"hang"`` (rank 0 sleeps instead of building), ``"die"`` (rank 0 exits with status 3) or ``"die-last"``
(the last rank does: on the last node of several). The runner
sets it only through ``run_sweep(..., faults=...)``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable

from kit import model_files, monitor
from kit.components import Component
from kit.estimate import trace_store
from kit.records import PROBES, append_record, emit
from kit.rules import Offload
from kit.specs import SweepConfig, SweepSpec
from kit.steptime.comm import comm_bytes


def main(argv: list[str] | None = None) -> int:
    import deepspeed.comm as dist

    from kit.ranks import engine

    spec, rank, world = engine.join(argv, "Run a zero-kit launch spec on this rank.", SweepSpec)
    # a rank traces its model where it runs (kit.estimate.trace_store off): a model file may behave
    # otherwise here than in the process that launched it (another environment, another device)
    os.environ[trace_store.ENV] = "off"
    setups = [c.setup for c in spec.configs]
    if any(s.zero.nvme for s in setups):
        # NVMe offload's async_io op, JIT-built the first time (minutes): during the launch's startup
        # allowance, not inside a configuration's watchdog
        from deepspeed.ops.op_builder import AsyncIOBuilder

        AsyncIOBuilder().load(verbose=False)
    engine.preload(setups)
    for config in spec.configs:
        if rank == 0:
            emit({"event": "start", "config_id": config.config_id, "label": config.label})
        status = run_config(spec, config, rank, world)
        dist.barrier()
        if rank == 0:
            emit({"event": "done", "config_id": config.config_id, "status": status})
    return 0


def probe_cycle(spec: SweepSpec) -> list[frozenset[str]]:
    """The ``PROBES`` each measured step takes: measured step ``k`` takes ``cycle[k % len(cycle)]``. The
    spec's ``probes`` (a list of lists: the bench's hook), else every probe (only the heartbeat when the
    spec's ``instrument`` is false)."""
    if spec.probes:
        return [frozenset(chosen) for chosen in spec.probes]
    return [frozenset(PROBES if spec.instrument else ("heartbeat",))]


def run_config(spec: SweepSpec, config: SweepConfig, rank: int, world: int) -> str:
    """Run one configuration, turning an exception into an ``error``/``oom`` record; returns its status."""
    import torch

    from kit.ranks import comm_scopes, engine

    started = time.perf_counter()
    setup = config.setup
    base = _base_record(spec, config, setup, rank, world)
    built: list = []  # the engine, so that it is torn down even after an exception
    try:
        _beat(spec, base)
        _inject(config.fault, rank, world)
        measure_config(spec, setup, base, rank, world, built, started)
        _beat(spec, base, status="finished")
        return "ok"
    except Exception as error:  # a failed configuration is a record; the sweep goes on
        oom = isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()
        # the kit's one-line errors already say where; anything else gets its (user's) last frame
        mine = isinstance(error, ValueError) and str(error).startswith("model: ")
        text = str(error) if mine else model_files.where(error, setup.model.source)
        append_record(spec.records, {**base, "status": "oom" if oom else "error", "error": text})
        _beat(spec, base, status="failed", error=text.splitlines()[0] if text else None)
        if rank == 0:
            print(traceback.format_exc(), file=sys.stderr, flush=True)
        return "oom" if oom else "error"
    finally:
        comm_scopes.uninstall()
        if built:
            engine.teardown(built.pop())


def measure_config(
    spec: SweepSpec, setup, base: dict, rank: int, world: int, built: list, started: float
) -> None:
    """Build the engine (kept in ``built``), warm up, then measure and record ``spec.steps`` steps.

    Each step takes the probes ``probe_cycle`` gives it (``PROBES``: what is measured beside step time,
    throughput and loss; without any it is the bare loop benchmarks compare to). Every record carries
    the step's batch (a batch schedule changes it; warm-up steps count as steps); with a schedule the
    model states are read again at every step and predicted for that step's batch. ``started``
    (``time.perf_counter()`` when the configuration began) gives every record ``start_s``: the seconds
    until the first step.
    """
    from deepspeed.comm import comm

    from kit import estimate
    from kit.ranks import comm_scopes, engine, measure, nvme_files

    cycle = probe_cycle(spec)
    used = frozenset().union(*cycle)
    measure.use_allocator(setup.zero.expandable_segments)
    measure.reset_peaks()
    if setup.zero.nvme:
        nvme_files.clear(setup.zero.nvme_path, rank)  # the swap files measured below are this config's
    run = engine.build_engine(setup, spec.seed, comms_logger="comm_logger" in used)
    eng = run.engine
    built.append(eng)
    # communication split by node: rank // gpus_per_node, the launcher's contiguous placement
    scopes = comm_scopes.CommScopes(setup.cluster.gpus_per_node) if "comm" in used else None
    # per batch of the schedule, before training (a model file that cannot run fails in its trace here):
    # the whole-GPU estimate, what this rank holds once a step's gradients are in place, bytes it sends
    predictions = {
        state.batch: {
            "whole_gpu": estimate.estimate(state),
            "resident": estimate.rank_states(state, rank),
            "comm_wire_bytes": comm_bytes(state)[0],
        }
        for _, state in setup.batch_states()
    }
    base["start_s"] = time.perf_counter() - started
    for step in range(spec.warmup):
        loss = engine.train_step(eng, run.workload, setup, step, rank, world, seed=spec.seed)
        if "heartbeat" in used:
            _beat(spec, base, eng, step=step, loss=loss)  # samples/s from the engine's sample count
    held: dict = {}  # what is measured once per configuration (measure_step), cleared where a batch differs
    for k, step in enumerate(range(spec.warmup, spec.warmup + spec.steps)):
        probes = cycle[k % len(cycle)]
        if scopes is not None:
            scopes.install() if "comm" in probes else comm_scopes.uninstall()
        if "comm_logger" in used:
            comm.comms_logger.enabled = "comm_logger" in probes
        if setup.batch.schedule:
            held.clear()  # the batch may change: read the states and activations of every step
        if setup.batch.max_tokens:
            held.pop("activations", None)  # each step packs sequences of other lengths
        record = {
            **base,
            "step": step,
            **measure_step(spec, setup, run, step, rank, world, probes, held, scopes),
        }
        if "comm_logger" in probes:
            record["comm_logger_bytes"] = measure.logged_comm_bytes()
        if "records" in probes:
            _predicted(record, setup.at_step(step), rank, predictions, probes)
        append_record(spec.records, {**record, "status": "ok", "error": None})
        if "heartbeat" in probes:
            _beat(spec, base, eng, step=step, samples_per_s=record["samples_per_s"], loss=record["loss"])
        if rank == 0:
            emit({"event": "step", **_progress(record)})


def measure_step(
    spec: SweepSpec, setup, run, step: int, rank: int, world: int, probes, held: dict, scopes
) -> dict:
    """Run step ``step`` under ``probes``; its record's measured fields (the base and estimates aside).

    ``held`` keeps what is measured once per configuration (the caller clears it where a step's batch
    differs): the model-state bytes (a walk inside the step while the gradients are held, timed and left
    out of ``step_time_s``, and one after the optimizer update) and the activations (the saved-tensor
    hooks watch the first step that takes them; the same shapes save the same tensors)."""
    from kit import workloads
    from kit.ranks import engine, measure, memory_timeline, nvme_files, state_walk

    eng = run.engine
    now = setup.at_step(step)
    reading = "state_walk" in probes and "device" not in held
    watching = "activations" in probes and "activations" not in held
    walked = {"s": 0.0, "cpu_s": 0.0}

    def read_states(micro: int) -> None:
        if micro == now.batch.grad_accum - 1 and reading:
            start, cpu = time.perf_counter(), time.process_time()
            held.update(state_walk.model_state_bytes(eng, now))
            walked["s"] += time.perf_counter() - start
            walked["cpu_s"] += time.process_time() - cpu

    counter = measure.SavedActivations()
    measure.reset_comm()
    if scopes is not None:
        scopes.reset()

    def watch(micro: int):
        return counter.watch(run.model, run.checkpointing) if micro == 0 else contextlib.nullcontext()

    hooks: dict[str, Callable] = {"around_micro_step": watch} if watching else {}
    if reading:
        hooks["after_backward"] = read_states
    memory = None
    if {"records", "state_walk"} <= probes and (spec.memory_timeline or not measure.on_cpu()):
        # on CPU the replay starts from the walk's storages; a GPU's allocator needs none
        places = state_walk.locations(eng, now) if measure.on_cpu() else ()
        memory = memory_timeline.StepMemory(*places)
        hooks["phase"] = memory.phase
    recording = memory.recording() if memory else contextlib.nullcontext()
    with recording, _host_steps(memory, eng, setup), measure.timed() as t:
        loss = engine.train_step(eng, run.workload, setup, step, rank, world, seed=spec.seed, **hooks)
    if reading:  # again after the optimizer update, which creates the optimizer states in the first step
        held.update(_most(held, state_walk.model_state_bytes(eng, now)))
    if watching:
        held["activations"] = counter.bytes
    seconds = t["s"] - walked["s"]
    b = now.batch
    sizes = {"train_batch": b.train_batch, "micro_batch": b.micro_batch, "tokens": now.tokens_per_step}
    if b.max_tokens:  # variable-length data: what this step really held, and its scaled learning rate
        sizes = workloads.packed_sizes(b, step, world, spec.seed)
        sizes["lr"] = eng.optimizer.param_groups[0]["lr"]
    record = {
        **sizes,
        "grad_accum": b.grad_accum,
        "step_time_s": seconds,
        "step_cpu_s": t["cpu_s"] - walked["cpu_s"],
        **measure.throughput(now, seconds, samples=sizes["train_batch"], tokens=sizes["tokens"]),
        "loss": loss,
    }
    if "records" in probes:
        record.update(memory.with_earlier(measure.peaks()) if memory else measure.peaks())
    if "state_walk" in probes or "activations" in probes:
        record["measured"] = dict(held["device"]) if "state_walk" in probes else {}
        if "activations" in probes:
            record["measured"][Component.ACTIVATIONS] = held["activations"]
        if memory is not None:
            record["measured"].update(memory.result())
    if "state_walk" in probes:
        record["measured_host"] = held["host"]
        if setup.zero.nvme:  # ZeRO-Infinity: the swap files under nvme_path, after the step
            record["measured_nvme"] = nvme_files.swap_file_bytes(setup.zero.nvme_path, rank)
    if scopes is not None and "comm" in probes:
        record.update(comm_bytes=measure.comm_bytes(scopes))
        record.update(comm_wire_bytes=measure.comm_wire_bytes(scopes, world))  # each group's own ring
        record.update(comm_scope_bytes=scopes.bytes(), comm_scope_wire_bytes=scopes.wire_bytes())
    return record


def _predicted(record: dict, now, rank: int, predictions: dict, probes) -> None:
    """Add the estimate beside each measured field of ``record`` (step ``now``; ``predictions`` of its
    batch, computed before the steps, the peak timeline at its first use)."""
    predicted = predictions[now.batch]
    whole_gpu, resident = predicted["whole_gpu"], predicted["resident"]
    measured = record.get("measured", {})
    if measured:
        record["estimate"] = dict(resident["device"]) if "state_walk" in probes else {}
        if Component.ACTIVATIONS in measured:
            record["estimate"][Component.ACTIVATIONS] = whole_gpu.components[Component.ACTIVATIONS]
        if "peak_tensor_bytes" in measured:  # the timeline this rank's run follows: torch_adam, its backend
            if "peak" not in predicted:
                predicted["peak"], predicted["cpu_matmul"] = _peak(now, rank, whole_gpu)
            record["estimate"].update(predicted["peak"])
            if predicted["cpu_matmul"] is not None:  # the CPU matmuls the prediction assumed
                record["cpu_matmul"] = predicted["cpu_matmul"].record()
    if "measured_host" in record:
        record["estimate_host"] = resident["host"]
    if "measured_nvme" in record:
        record["estimate_nvme"] = {k: resident["nvme"][k] for k in record["measured_nvme"]}
    record["estimate_peak_bytes"] = whole_gpu.per_gpu_bytes
    record["estimate_comm_wire_bytes"] = predicted["comm_wire_bytes"]


def _peak(setup, rank: int, whole_gpu) -> tuple[dict, object]:
    """The predicted peak per phase of this rank's step (``kit.estimate.peak``): the runner steps
    ``torch_adam`` (torch's single-tensor path on CPU, foreach on CUDA) over gloo or NCCL."""
    from kit.estimate.memory import peak_timeline
    from kit.estimate.peak import runner_path
    from kit.ranks import measure, memory_timeline

    implementation, backend = runner_path("cpu" if measure.on_cpu() else "cuda")
    cpu = memory_timeline.cpu_matmul() if measure.on_cpu() else None
    line = peak_timeline(
        setup,
        rank,
        implementation=implementation,
        backend=backend,
        activations=whole_gpu.terms[Component.ACTIVATIONS],
        cpu=cpu,
    )
    return {"peak_tensor_bytes": line.peak_tensor_bytes, "phases": line.totals}, cpu


def _most(before: dict, after: dict) -> dict:
    """Per place and component, the larger of two reads of the model states (gradients are held after
    backward, the optimizer states exist after the update)."""
    return {place: {k: max(v, before[place][k]) for k, v in parts.items()} for place, parts in after.items()}


def _host_steps(memory, eng, setup):
    """With optimizer offload the wrapped torch optimizer's step works on host tensors (not counted)."""
    from kit.ranks import memory_timeline

    if memory is None or setup.zero.engine != "deepspeed" or setup.zero.offload_optimizer is Offload.NONE:
        return contextlib.nullcontext()
    return memory_timeline.host_optimizer(memory, eng)


def _base_record(spec: SweepSpec, config: SweepConfig, setup, rank: int, world: int) -> dict:
    import deepspeed
    import torch
    from deepspeed.accelerator import get_accelerator

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else get_accelerator().device_name()
    return {
        "sweep": spec.sweep,
        "run_id": spec.run_id,
        "config_id": config.config_id,
        "label": config.label,
        "setup": setup.model_dump(),
        "rank": rank,
        "world_size": world,
        # where the launcher placed it: DeepSpeed's launcher sets CROSS_RANK (the node), torchrun GROUP_RANK
        "node": socket.gethostname(),
        "node_rank": int(os.environ.get("CROSS_RANK", os.environ.get("GROUP_RANK", "0"))),
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "device": device,
        "step": None,
        "start_s": None,
        "time": time.time(),
        "torch": torch.__version__,
        "deepspeed": deepspeed.__version__,
    }


def _beat(spec: SweepSpec, base: dict, engine=None, **values) -> None:
    """A heartbeat of this rank in the sweep folder (``kit.monitor``; ``zerokit monitor runs/<sweep>``)."""
    keys = ("sweep", "run_id", "config_id", "label")
    monitor.heartbeat(engine, os.path.dirname(spec.records), **{k: base[k] for k in keys}, **values)


def _progress(record: dict) -> dict:
    memory = record.get("peak_allocated_bytes") or record.get("peak_rss_bytes")
    keys = ("config_id", "label", "step", "samples_per_s", "loss")
    return {**{k: record[k] for k in keys}, "memory_bytes": memory}


def _inject(fault: str | None, rank: int, world: int) -> None:
    if fault == "raise":
        raise RuntimeError("injected fault: raise (test hook)")
    if fault == "hang" and rank == 0:
        time.sleep(3600)
    if (fault == "die" and rank == 0) or (fault == "die-last" and rank == world - 1):
        os._exit(3)


if __name__ == "__main__":
    sys.exit(main())
