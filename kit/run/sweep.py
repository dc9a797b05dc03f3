"""Run a sweep of Setups for real: one launch of ``kit.ranks.worker`` for all, resumable, failure-proof.

``run_sweep`` validates every Setup before anything starts, skips the ones the sweep's records.jsonl
already holds, writes a launch spec and starts the launcher once (``launcher_name``: torchrun on one
machine by default, ``deepspeed --num_gpus N`` when asked, DeepSpeed's runner per node with a hostfile).
Rank 0's event lines drive a tqdm bar and a per-configuration watchdog: a configuration that runs
past ``timeout_s`` gets a ``timeout`` record, one that kills a rank an ``error`` record, the process
group is killed and the remaining configurations are relaunched. Ctrl-C kills the group and
re-raises; re-run to resume. A ``cancel`` hook (e.g. a Stop button's ``threading.Event().is_set``)
kills the group too: the configuration under way gets a ``cancelled`` record, the records so far are
kept and the sweep returns.
"""

from __future__ import annotations

import hashlib
import json
import time
import typing
from collections.abc import Callable
from pathlib import Path

from kit.monitor import step_label
from kit.records import OPTIONAL_PROBES, PROBES, append_record, load_records, parse_event, unknown_probes
from kit.rules import Offload
from kit.run import launcher
from kit.run.results import Results
from kit.schema import Setup
from kit.specs import Fault, SweepConfig, SweepSpec

#: a torch extension build lock older than this (s) was left by a killed build (async_io builds in minutes)
STALE_BUILD_LOCK_S = 1800.0
#: test-only faults the worker understands (see kit/ranks/worker.py)
FAULTS = typing.get_args(Fault)


#: the fields of each Setup section that the first sweeps were recorded with: a record of history, never
#: edited; every field added since is one of the ``LATER_FIELDS``
FIRST_FIELDS: dict[str, tuple[str, ...]] = {
    "model": (
        "arch", "family", "ffn", "heads", "hidden", "kv_heads", "largest_layer_params", "layers",
        "max_seq_len", "name", "params", "source", "tied_embeddings", "vocab",
    ),
    "cluster": ("cpu_ram_per_node_bytes", "gpu", "gpus_per_node", "interconnect", "nodes"),
    "zero": (
        "activation_checkpointing", "allgather_bucket_size", "contiguous_gradients", "max_live_parameters",
        "max_reuse_distance", "momentum", "offload_optimizer", "offload_param", "optimizer", "overlap_comm",
        "param_persistence_threshold", "precision", "prefetch_bucket_size", "reduce_bucket_size", "stage",
        "zero_init",
    ),
    "batch": ("grad_accum", "micro_batch", "seq_len", "train_batch"),
}  # fmt: skip


def later_fields() -> dict[str, dict[str, object]]:
    """Every Setup field not in ``FIRST_FIELDS``, with its unset value (its default, as JSON): a Setup
    that leaves them unset hashes as before they existed, so older sweeps still resume. TypeError for a
    later field without a default (older records could not say its value)."""
    from pydantic import BaseModel, TypeAdapter

    later: dict[str, dict[str, object]] = {}
    for section, info in Setup.model_fields.items():
        section_model = info.annotation  # every section of a Setup is a model
        assert isinstance(section_model, type) and issubclass(section_model, BaseModel)
        for key, field in section_model.model_fields.items():
            if key in FIRST_FIELDS[section]:
                continue
            if field.is_required():
                raise TypeError(f"{section}.{key}: a field added to Setup needs a default (older sweeps)")
            default = field.get_default(call_default_factory=True)
            assert field.annotation is not None  # a model's fields have their annotations
            unset = TypeAdapter(field.annotation).dump_python(default, mode="json")
            later.setdefault(section, {})[key] = unset
    return later


#: derived from the schema by ``later_fields``: a new field can never be forgotten here
LATER_FIELDS = later_fields()


def config_id(setup: Setup) -> str:
    """Stable id of a configuration: a hash of its Setup (so a re-run finds it in records.jsonl), leaving
    out the ``LATER_FIELDS`` that are unset."""
    data = setup.model_dump(mode="json")
    for section, fields in LATER_FIELDS.items():
        for key, unset in fields.items():
            if data[section].get(key, unset) == unset:
                data[section].pop(key, None)
    text = json.dumps(data, sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def on_ranks(setup: Setup, nprocs: int, nodes: int = 1) -> Setup:
    """``setup`` on ``nodes`` nodes of ``nprocs`` ranks (micro batch and grad accumulation kept)."""
    return setup.replace(cluster={"nodes": nodes, "gpus_per_node": nprocs}, batch={})


def check(setup: Setup) -> None:
    """Refuse, before launch, what cannot run: a model with nothing to build (a bare count), a user's
    model file that fails (the estimate traces it: the error names the file and function), a batch or
    ZeRO combination the estimator or DeepSpeed's own config parser rejects. ValueError, one line."""
    from kit import checkpointing, estimate, trainable, workloads
    from kit.ds_config import to_ds_config, validate_ds_config

    workload = workloads.for_model(setup.model)
    if setup.batch.max_tokens and not (isinstance(workload, workloads.Toy) and setup.model.family == "gpt2"):
        raise ValueError(
            "batch.max_tokens: runs on variable-length data are built for the toy GPT (--model toy); "
            "the estimate covers any model"
        )
    estimate.estimate(setup)
    if setup.zero.nvme:
        problem = async_io_problem(
            "offload_param" if setup.zero.offload_param is Offload.NVME else "offload_optimizer"
        )
        if problem:
            raise ValueError(problem)
    if setup.zero.engine != "deepspeed":
        name = setup.zero.name
        if setup.batch.schedule or setup.batch.max_tokens:
            raise ValueError(
                f"batch.schedule: {name} runs take a fixed batch; batch schedules and token "
                "budgets are set through DeepSpeed's engine"
            )
        if setup.zero.activation_checkpointing:
            raise ValueError(
                f"zero.activation_checkpointing: {name} runs here train without it; "
                "compare checkpointing with the ZeRO stages"
            )
        return
    problem = checkpointing.engine_problem(setup.zero) or trainable.run_problem(setup.zero)
    if problem:
        raise ValueError(problem)
    validate_ds_config(to_ds_config(setup, torch_adam=True), setup.dp)
    if launcher.ranks_accelerator() == "cpu":
        problem = checkpointing.cpu_ranks_problem(
            setup.zero.cpu_checkpointing, setup.zero.partition_activations
        )
        if problem:
            raise ValueError(problem)
        for field in ("quantized_weights", "quantized_gradients"):
            if getattr(setup.zero, field):
                raise ValueError(
                    f"zero.{field}: needs DeepSpeed's CUDA quantizer kernels (This op had not been "
                    f"implemented on CPU backend); estimate and export it here, run it on a GPU"
                )


def async_io_problem(field: str = "offload_param") -> str | None:
    """Why DeepSpeed's ``async_io`` op (NVMe offload's reads and writes) cannot be built here, or None.

    ``AsyncIOBuilder().is_compatible()`` test-compiles against libaio (about a second); without it the
    launch would fail deep inside ``zero.Init`` ("Unable to JIT load the async_io op")."""
    from deepspeed.ops.op_builder import AsyncIOBuilder

    if AsyncIOBuilder().is_compatible(verbose=False):
        from torch.utils.cpp_extension import _get_build_directory

        # a build killed midway (Ctrl-C, a watchdog) leaves torch's lock file: every later build waits on it
        lock = Path(_get_build_directory("async_io", verbose=False)) / "lock"
        if lock.exists() and time.time() - lock.stat().st_mtime > STALE_BUILD_LOCK_S:
            return (
                f"{field}: 'nvme' needs DeepSpeed's async_io op, and {lock} was left by a build that was "
                "stopped (no build takes this long): remove it and run again"
            )
        return None
    return (
        f"{field}: 'nvme' needs DeepSpeed's async_io op, which cannot be built here: libaio is "
        "missing (Debian/Ubuntu: sudo apt-get install libaio-dev; the first NVMe run then JIT-builds "
        "async_io, 2.5-6 minutes on 2 cores)"
    )


def run_sweep(
    setups: list[Setup],
    *,
    sweep: str = "sweep",
    runs_dir: str | Path = "runs",
    nprocs: int = 2,
    steps: int = 5,
    warmup: int = 2,
    seed: int = 0,
    timeout_s: float = 300.0,
    startup_s: float = 120.0,
    launcher_name: str | None = None,
    progress: bool = True,
    instrument: bool = True,
    memory_timeline: bool = False,
    faults: dict[int, str] | None = None,
    probes: list[tuple[str, ...]] | None = None,
    cancel: Callable[[], bool] | None = None,
    on_event: Callable[[dict], None] | None = None,
    nodes=None,
) -> Results:
    """Run every Setup (on one node of ``nprocs`` ranks, or on each of ``nodes``, a
    ``kit.run.local_nodes.Nodes``) and return the sweep's Results.

    Records go to ``runs_dir/sweep/records.jsonl``; configurations already measured there are
    skipped (the others, failed ones included, run again). ``timeout_s`` is the watchdog: the longest
    time without progress (a configuration starting, a step, a configuration ending; the first
    configuration also gets ``startup_s`` for the launch and imports) before the configuration counts
    as hung. ``instrument=False`` records only step time and loss (the bare loop, for benchmarks).
    ``memory_timeline=True`` also records, on the CPU accelerator, each rank's peak device-tensor bytes per
    phase of each measured step (``measured.peak_tensor_bytes``, ``measured.phases``; the profiler it takes
    costs more than a small step; on a GPU they are always recorded).
    ``faults`` maps an index of ``setups`` to a test-only fault (``FAULTS``). ``probes`` (the bench's
    hook) switches the measurements (``kit.records.PROBES``, ``OPTIONAL_PROBES``) per step: measured
    step ``k`` of each configuration takes ``probes[k % len(probes)]``. ``cancel()``, polled twice a
    second, stops the sweep (see the module's doc). ``on_event`` gets a ``{"event": "sweep", "total",
    "reused", "records"}`` dict before anything launches, then rank 0's event lines (``start``,
    ``step``, ``done``) as they come.
    """
    if not setups:
        raise ValueError("setups: give at least one Setup to run")
    if nprocs < 1:
        raise ValueError(f"nprocs: must be >= 1, got {nprocs}")
    if steps < 1 or warmup < 0:
        raise ValueError(f"steps: must be >= 1 (got {steps}) and warmup >= 0 (got {warmup})")
    faults = faults or {}
    for chosen in probes or []:
        if unknown_probes(chosen):
            names = ", ".join((*PROBES, *OPTIONAL_PROBES))
            raise ValueError(f"probes: each step takes some of {names}, got {sorted(chosen)}")
    configs: list[SweepConfig] = []
    seen: set[str] = set()
    for i, setup in enumerate(setups):
        setup = on_ranks(setup, nprocs, nodes.count if nodes else 1)
        try:
            check(setup)
        except ValueError as error:
            raise ValueError(f"config {i} ({setup.label}): {error}") from None
        cid = config_id(setup)
        if faults.get(i) not in (None, *FAULTS):
            raise ValueError(f"faults: choose one of {', '.join(FAULTS)}, got {faults[i]!r}")
        if cid not in seen:
            seen.add(cid)
            configs.append(SweepConfig(config_id=cid, label=setup.label, setup=setup, fault=faults.get(i)))
    folder = Path(runs_dir) / sweep
    folder.mkdir(parents=True, exist_ok=True)
    records = folder / "records.jsonl"
    done = measured_ids(records, warmup + steps - 1)
    pending = [c for c in configs if c.config_id not in done]
    bar = _bar(len(configs), len(configs) - len(pending), sweep, progress)
    if on_event is not None:
        reused = len(configs) - len(pending)
        on_event(
            {"event": "sweep", "total": len(configs), "reused": reused, "records": str(records.resolve())}
        )
    base = {"sweep": sweep, "records": str(records.resolve()), "steps": steps, "warmup": warmup, "seed": seed}
    base |= {"instrument": instrument, "memory_timeline": memory_timeline}
    base["probes"] = tuple(tuple(sorted(chosen)) for chosen in probes or ())
    limits = {
        "nprocs": nprocs,
        "timeout_s": timeout_s,
        "startup_s": startup_s,
        "launcher_name": launcher_name,
        "cancel": cancel,
        "on_event": on_event,
        "nodes": nodes,
    }
    try:
        while pending and not (cancel is not None and cancel()):
            pending = _launch(base, pending, folder, bar, **limits)
    finally:
        bar.close()
    return Results.load(folder)


def measured_ids(records: Path, last_step: int) -> set[str]:
    """Configurations whose rank 0 recorded an ok measurement of the last step."""
    return {
        r["config_id"]
        for r in load_records(records)
        if r.get("status") == "ok" and r.get("rank") == 0 and r.get("step") == last_step
    }


def _launch(
    base, pending, folder, bar, *, nprocs, timeout_s, startup_s, launcher_name, cancel, on_event, nodes=None
) -> list[SweepConfig]:
    """One launch over ``pending``; returns the configurations still to run (empty when all ran)."""
    run_id = time.strftime("%Y%m%dT%H%M%S") + f".{time.time_ns() % 1_000_000_000:09d}"
    spec = SweepSpec(**base, run_id=run_id, configs=tuple(pending))
    records = Path(spec.records)
    spec_path = spec.write(folder / f"launch-{run_id}.json")
    state = {"current": None, "finished": [], "deadline": time.monotonic() + startup_s + timeout_s}

    def on_line(line: str) -> None:
        event = parse_event(line)
        if event is None:
            return
        state["deadline"] = time.monotonic() + timeout_s
        if on_event is not None:
            on_event(event)
        if event["event"] == "start":
            state["current"] = event["config_id"]
            bar.set_postfix_str(event["label"])
        elif event["event"] == "step":
            bar.set_postfix_str(_postfix(event, base["warmup"], base["steps"]))
        elif event["event"] == "done":
            state["finished"].append(event["config_id"])
            state["current"] = None
            bar.update(1)

    limit, script, where = startup_s + timeout_s * (len(pending) + 1), ["--spec", str(spec_path)], ""
    if nodes is None:
        argv = launcher.launch_argv("kit.ranks.worker", script, nprocs, launcher=launcher_name)
        env = launcher.worker_env(nprocs)
        rc, output = launcher.run_launch(
            argv, env, limit, on_line, deadline=lambda: state["deadline"], cancel=cancel
        )
    else:  # one launcher per node; the node that failed first is named
        done = nodes.launch(
            "kit.ranks.worker", script, limit, on_line, deadline=lambda: state["deadline"], cancel=cancel
        )
        rc, output = done.rc, done.output
        where = "" if done.failed_node is None else f"{nodes.where(done.failed_node)}: "
    left = [c for c in pending if c.config_id not in state["finished"]]
    if not left:
        return []
    failed = next((c for c in left if c.config_id == state["current"]), left[0])
    if rc == launcher.CANCEL_RC:
        _append_failure(records, spec, failed, "cancelled", "stopped by the user; the ranks were killed")
        bar.update(1)
        return []
    status = "timeout" if rc == launcher.TIMEOUT_RC else "error"
    tail = "\n".join(output.splitlines()[-20:])
    reason = (
        f"no progress for {timeout_s:g} s"
        if status == "timeout"
        else f"{where}launch exited with status {rc}"
    )
    _append_failure(records, spec, failed, status, f"{reason}; last output:\n{tail}")
    bar.update(1)
    if state["current"] is None and not state["finished"]:
        # the launch never reached a configuration (e.g. the ranks could not start): do not loop
        for c in left[1:]:
            _append_failure(records, spec, c, "error", f"not run: the launch failed before it ({reason})")
            bar.update(1)
        return []
    return [c for c in left if c is not failed]


def _append_failure(records: Path, spec: SweepSpec, config: SweepConfig, status: str, error: str) -> None:
    """A record the parent writes for a configuration the ranks could not report on."""
    record: dict[str, typing.Any] = {"sweep": spec.sweep, "run_id": spec.run_id}
    record |= {"config_id": config.config_id}
    record |= {"label": config.label, "setup": config.setup.model_dump(mode="json"), "rank": None}
    record |= {"step": None, "time": time.time(), "status": status, "error": error}
    append_record(str(records), record)


def _postfix(event: dict, warmup: int, steps: int) -> str:
    """The bar's text for a measured step: its label, ``step k of N`` (``kit.monitor.step_label``: the
    measured steps from 1, after the warm-up), samples/s and memory."""
    memory = event.get("memory_bytes")
    mem = f" {memory / 2**20:,.0f} MiB" if memory else ""
    where = step_label(event["step"], warmup, steps)
    return f"{event['label']} {where} {event['samples_per_s']:.1f} samples/s{mem}"


def _bar(total: int, done: int, sweep: str, enabled: bool):
    from tqdm.auto import tqdm

    bar = tqdm(total=total, initial=done, desc=sweep, unit="config", disable=not enabled)
    container = getattr(bar, "container", None)  # a notebook's bar: [description, bar, counts] in a row
    if container is not None:  # the description never shrinks (it wrapped "00-" / "sanity: 100%")
        container.children[0].layout.flex = "0 0 auto"
    return bar
