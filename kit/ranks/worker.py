"""The script each rank runs: every configuration of a launch spec back to back, one records line per step.

By hand (``kit.run.sweep`` writes the spec and runs exactly this)::

    DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 PYTHONPATH=. \\
        deepspeed --num_gpus 2 --module kit.ranks.worker --spec runs/demo/launch-<run_id>.json

(drop ``DS_ACCELERATOR=cpu`` on a CUDA machine; ``torchrun --nproc_per_node 2 -m kit.ranks.worker --spec ...``
works too). The spec is JSON: ``sweep``, ``run_id``, ``records`` (path of records.jsonl), ``steps``,
``warmup``, ``seed``, ``instrument`` (false: time the bare loop only), ``memory_timeline`` (on the CPU
accelerator, profile each measured step for its peak device-tensor bytes per phase, ``kit.ranks.
memory_timeline``; always measured on a GPU) and ``configs``, a list of
``{config_id, label, setup}``. Per configuration each rank builds the engine, warms up, measures
``steps`` steps (appending one record per step to records.jsonl, flushed per line), tears the engine
down and meets the others at a barrier. A configuration that raises becomes a record with status
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
import sys
import time
import traceback

from kit import model_files, monitor
from kit.estimate.comm import comm_bytes
from kit.records import append_record, emit
from kit.rules import wire_bytes


def main(argv: list[str] | None = None) -> int:
    import deepspeed.comm as dist

    from kit.ranks import engine
    from kit.schema import Setup

    spec, rank, world = engine.join(argv, "Run a zero-kit launch spec on this rank.")
    if any(Setup.model_validate(c["setup"]).zero.nvme for c in spec["configs"]):
        # NVMe offload's async_io op, JIT-built the first time (minutes): during the launch's startup
        # allowance, not inside a configuration's watchdog
        from deepspeed.ops.op_builder import AsyncIOBuilder

        AsyncIOBuilder().load(verbose=False)
    for config in spec["configs"]:
        if rank == 0:
            emit({"event": "start", "config_id": config["config_id"], "label": config["label"]})
        status = run_config(spec, config, rank, world)
        dist.barrier()
        if rank == 0:
            emit({"event": "done", "config_id": config["config_id"], "status": status})
    return 0


def run_config(spec: dict, config: dict, rank: int, world: int) -> str:
    """Run one configuration, turning an exception into an ``error``/``oom`` record; returns its status."""
    import torch

    from kit.ranks import comm_scopes, engine
    from kit.schema import Setup

    setup = Setup.model_validate(config["setup"])
    base = _base_record(spec, config, setup, rank, world)
    built: list = []  # the engine, so that it is torn down even after an exception
    try:
        _beat(spec, base)
        _inject(config.get("fault"), rank, world)
        measure_config(spec, setup, base, rank, world, built)
        _beat(spec, base, status="finished")
        return "ok"
    except Exception as error:  # a failed configuration is a record; the sweep goes on
        oom = isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()
        # the kit's one-line errors already say where; anything else gets its (user's) last frame
        mine = isinstance(error, ValueError) and str(error).startswith("model: ")
        text = str(error) if mine else model_files.where(error, setup.model.source)
        append_record(spec["records"], {**base, "status": "oom" if oom else "error", "error": text})
        _beat(spec, base, status="failed", error=text.splitlines()[0] if text else None)
        if rank == 0:
            print(traceback.format_exc(), file=sys.stderr, flush=True)
        return "oom" if oom else "error"
    finally:
        comm_scopes.uninstall()
        if built:
            engine.teardown(built.pop())


def measure_config(spec: dict, setup, base: dict, rank: int, world: int, built: list) -> None:
    """Build the engine (kept in ``built``), warm up, then measure and record ``spec["steps"]`` steps.

    With ``spec["instrument"]`` false only step time, throughput and loss are recorded (no comms
    logger, no saved-tensor hooks, no state walk, no memory reads): the bare loop benchmarks compare to.
    Every record carries the step's batch (a batch schedule changes it; warm-up steps count as steps);
    with a schedule the model states are read again at every step and predicted for that step's batch.
    """
    from kit import estimate, workloads
    from kit.ranks import comm_scopes, engine, measure, memory_timeline, nvme_files, state_walk

    instrument = spec.get("instrument", True)
    measure.reset_peaks()
    if setup.zero.nvme:
        nvme_files.clear(setup.zero.nvme_path, rank)  # the swap files measured below are this config's
    run = engine.build_engine(setup, spec["seed"], comms_logger=instrument)
    eng = run.engine
    built.append(eng)
    # communication split by node: rank // gpus_per_node, the launcher's contiguous placement
    scopes = comm_scopes.CommScopes(setup.cluster.gpus_per_node).install() if instrument else None
    # per batch of the schedule, before training (a model file that cannot run fails in its trace here):
    # the whole-GPU estimate and what this rank holds once a step's gradients are in place
    predictions = {
        state.batch: (estimate.estimate(state), estimate.rank_states(state, rank))
        for _, state in setup.batch_states()
    }
    for step in range(spec["warmup"]):
        loss = engine.train_step(eng, run.workload, setup, step, rank, world, seed=spec["seed"])
        _beat(spec, base, eng, step=step, loss=loss)  # samples/s from the engine's sample count
    held: dict = {}  # model-state bytes per place and component (read again every step with a schedule)
    timeline = spec.get("memory_timeline", False) or not measure.on_cpu()

    for step in range(spec["warmup"], spec["warmup"] + spec["steps"]):
        now = setup.at_step(step)
        if setup.batch.schedule:
            held.clear()  # the batch may change: read the states of every step
        reading = instrument and not held

        def read_states(micro: int, now=now, reading=reading) -> None:
            if micro == now.batch.grad_accum - 1 and reading:
                held.update(state_walk.model_state_bytes(eng, now))

        counter = measure.SavedActivations()
        measure.reset_comm()
        if scopes is not None:
            scopes.reset()

        def watch(micro: int, counter=counter):
            return counter.watch(run.model, run.checkpointing) if micro == 0 else contextlib.nullcontext()

        hooks = {"around_micro_step": watch, "after_backward": read_states} if instrument else {}
        memory = None
        if instrument and timeline:
            # on CPU the replay starts from the walk's storages; a GPU's allocator needs none
            places = state_walk.locations(eng, now) if measure.on_cpu() else ()
            memory = memory_timeline.StepMemory(*places)
            hooks["phase"] = memory.phase
        recording = memory.recording() if memory else contextlib.nullcontext()
        with recording, _host_steps(memory, eng, setup), measure.timed() as t:
            loss = engine.train_step(eng, run.workload, setup, step, rank, world, seed=spec["seed"], **hooks)
        if reading:  # again after the optimizer update, which creates the optimizer states in the first step
            held.update(_most(held, state_walk.model_state_bytes(eng, now)))
        b = now.batch
        sizes = {"train_batch": b.train_batch, "micro_batch": b.micro_batch, "tokens": now.tokens_per_step}
        if b.max_tokens:  # variable-length data: what this step really held, and its scaled learning rate
            sizes = workloads.packed_sizes(b, step, world, spec["seed"])
            sizes["lr"] = eng.optimizer.param_groups[0]["lr"]
        record = {
            **base,
            "step": step,
            **sizes,
            "grad_accum": b.grad_accum,
            "step_time_s": t["s"],
            **measure.throughput(now, t["s"], samples=sizes["train_batch"], tokens=sizes["tokens"]),
            "loss": loss,
        }
        if instrument:
            comm = measure.comm_bytes()
            whole_gpu, resident = predictions[now.batch]
            record.update(memory.with_earlier(measure.peaks()) if memory else measure.peaks())
            record["measured"] = {**held["device"], "activations": counter.bytes}
            if memory is not None:
                record["measured"].update(memory.result())
            record["measured_host"] = held["host"]
            record["estimate"] = {**resident["device"], "activations": whole_gpu.components["activations"]}
            if memory is not None:  # the timeline this rank's run follows: torch_adam, its backend
                record["estimate"].update(_peak(now, rank, whole_gpu))
            record["estimate_host"] = resident["host"]
            if setup.zero.nvme:  # ZeRO-Infinity: the swap files under nvme_path, after the step
                record["measured_nvme"] = nvme_files.swap_file_bytes(setup.zero.nvme_path, rank)
                record["estimate_nvme"] = {k: resident["nvme"][k] for k in record["measured_nvme"]}
            record["estimate_peak_bytes"] = whole_gpu.per_gpu_bytes
            record.update(comm_bytes=comm, comm_wire_bytes=wire_bytes(comm, world))
            record["estimate_comm_wire_bytes"] = comm_bytes(now)[0]
            record.update(comm_scope_bytes=scopes.bytes(), comm_scope_wire_bytes=scopes.wire_bytes())
        append_record(spec["records"], {**record, "status": "ok", "error": None})
        _beat(spec, base, eng, step=step, samples_per_s=record["samples_per_s"], loss=loss)
        if rank == 0:
            emit({"event": "step", **_progress(record)})


def _peak(setup, rank: int, whole_gpu) -> dict:
    """The predicted peak per phase of this rank's step (``kit.estimate.peak``): the runner steps
    ``torch_adam`` (torch's single-tensor path on CPU, foreach on CUDA) over gloo or NCCL."""
    from kit.estimate.memory import peak_timeline
    from kit.estimate.peak import runner_path
    from kit.ranks import measure

    implementation, backend = runner_path("cpu" if measure.on_cpu() else "cuda")
    line = peak_timeline(
        setup,
        rank,
        implementation=implementation,
        backend=backend,
        activations=whole_gpu.terms["activations"],
    )
    return {"peak_tensor_bytes": line.peak_tensor_bytes, "phases": line.totals}


def _most(before: dict, after: dict) -> dict:
    """Per place and component, the larger of two reads of the model states (gradients are held after
    backward, the optimizer states exist after the update)."""
    return {place: {k: max(v, after[place][k]) for k, v in parts.items()} for place, parts in before.items()}


def _host_steps(memory, eng, setup):
    """With optimizer offload the wrapped torch optimizer's step works on host tensors (not counted)."""
    from kit.ranks import memory_timeline

    if memory is None or setup.zero.engine != "deepspeed" or setup.zero.offload_optimizer == "none":
        return contextlib.nullcontext()
    return memory_timeline.host_optimizer(memory, eng)


def _base_record(spec: dict, config: dict, setup, rank: int, world: int) -> dict:
    import deepspeed
    import torch
    from deepspeed.accelerator import get_accelerator

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else get_accelerator().device_name()
    return {
        "sweep": spec["sweep"],
        "run_id": spec["run_id"],
        "config_id": config["config_id"],
        "label": config["label"],
        "setup": setup.model_dump(),
        "rank": rank,
        "world_size": world,
        # where the launcher placed it: DeepSpeed's launcher sets CROSS_RANK (the node), torchrun GROUP_RANK
        "node_rank": int(os.environ.get("CROSS_RANK", os.environ.get("GROUP_RANK", "0"))),
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "device": device,
        "step": None,
        "time": time.time(),
        "torch": torch.__version__,
        "deepspeed": deepspeed.__version__,
    }


def _beat(spec: dict, base: dict, engine=None, **values) -> None:
    """A heartbeat of this rank in the sweep folder (``kit.monitor``; ``zerokit monitor runs/<sweep>``)."""
    keys = ("sweep", "run_id", "config_id", "label")
    monitor.heartbeat(engine, os.path.dirname(spec["records"]), **{k: base[k] for k in keys}, **values)


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
