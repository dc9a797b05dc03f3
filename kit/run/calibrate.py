"""How good is the step-time model? Its predictions beside the step times a sweep measured (``report``).

The hardware figures come from measurements independent of the step times (nothing is fitted to them):
- GPU records: the GPU's datasheet figures and fabric (``kit.steptime.perf.hardware``) and the default
  ``Assumptions``;
- CPU records (``DS_ACCELERATOR=cpu``): this machine measured by ``cpu_machine``: matmul TFLOP/s of
  one rank's threads at the run's precision and a host memory copy, beside the bus bandwidth of gloo's
  all-reduce between the ranks that the caller measured (``kit.scaleout.commtest.allreduce_bus_gbps``);
  efficiency and link efficiency are then 1, since the measured rates are already the achieved ones.

What it cannot see: the per-step work the step-time model does not count (DeepSpeed's Python-side
bookkeeping, hooks, allocator calls, data loading), which dominates small models on CPU; contention
between ranks sharing cores and memory bandwidth beyond what one matmul and one copy show; overlap of
communication with compute as it really happens (the model assumes a fixed share); and a GPU's real
rates (GPU records use datasheet figures, not a measurement of this machine).
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from kit.estimate import partition
from kit.models import override, preset_names
from kit.rules import bus_factor
from kit.run.results import Results
from kit.schema import Setup
from kit.specs import CalibrateSpec, EngineConfig
from kit.steptime import calibrated, perf
from kit.steptime.calibration import TAG, Calibration, EngineCost, Link, engine_key, model_text
from kit.toys import calibration_toy

#: the per-rank script of ``measure``
WORKER = "kit.ranks.calibrate_worker"
#: engines ``measure`` times by default: each stage, optimizer offload at stages 2 and 3, DDP and FSDP
DEFAULT_ENGINES = ("z0", "z1", "z2", "z3", "z2+offload", "z3+offload", "ddp", "fsdp")
#: message sizes of the collectives (bytes): latency from the small ones, bandwidth from the large
CALIBRATION_SIZES = (4096, 65536, 1 << 20, 16 << 20)


#: what ``zerokit calibrate --measure`` measures without --model: a toy GPT of 4 blocks of width 256
DEFAULT_MODEL = calibration_toy()


def holdout(base: Setup, nprocs: int = 2) -> list[Setup]:
    """Configurations a calibration of ``base`` (``measure``: micro batches mb and 2 mb alone, every
    engine at mb and grad accum 2) never runs, to check it on: each stage at grad accum 3 or micro batch
    3, optimizer offload at stages 2 and 3, a model twice as deep and one twice as wide, on one node of
    ``nprocs`` ranks (with 4 ranks, stages 1-3 at ``base``'s batch)."""
    on = base.replace(cluster={"nodes": 1, "gpus_per_node": nprocs}, batch={"grad_accum": 1})
    if nprocs != 2:
        return [on.replace(zero={"stage": s}) for s in (1, 2, 3)]
    m = base.model
    # override needs a spec read from a config (arch), whose shape from_hf_config fills in
    assert m.layers is not None and m.hidden is not None and m.ffn is not None, m.name
    deep = override(m, {"layers": 2 * m.layers})
    wide = override(m, {"hidden": 2 * m.hidden, "ffn": 2 * m.ffn})
    return [
        on.replace(zero={"stage": 0}, batch={"grad_accum": 3}),
        on.replace(zero={"stage": 1}, batch={"micro_batch": 3}),
        on.replace(zero={"stage": 2}, batch={"grad_accum": 3}),
        on.replace(zero={"stage": 3}, batch={"micro_batch": 3}),
        on.replace(zero={"stage": 2, "offload_optimizer": "cpu"}, batch={"micro_batch": 3}),
        on.replace(zero={"stage": 3, "offload_optimizer": "cpu"}, batch={"grad_accum": 3}),
        on.replace(model=deep, zero={"stage": 2}),
        on.replace(model=wide, zero={"stage": 3}),
    ]


def describe(cal: Calibration) -> str:
    """A calibration in a few readable lines."""
    links = _describe_links(cal.collectives)
    engines = ", ".join(
        f"{k} {e.step_s_per_tensor * 1e6:+.0f}/{e.micro_step_s_per_tensor * 1e6:+.0f} us"
        for k, e in cal.engines.items()
    )
    return "\n".join(
        [
            f"{cal.label}; torch {cal.versions['torch']}, deepspeed {cal.versions['deepspeed']}; "
            f"{cal.seconds:.0f} s",
            f"compute: {cal.tflops * 1e3:.1f} GFLOP/s per rank + {cal.micro_fixed_s * 1e3:.1f} ms per "
            f"micro-step ({cal.model}, {cal.layers} blocks, {cal.precision})",
            f"Adam: {cal.adam_s_per_param * 1e9:.1f} ns/param on the device, "
            f"{cal.host_adam_s_per_param * 1e9:.1f} on the host; copies: to host "
            f"{cal.to_host_gbps:.2f} GB/s, to device {cal.to_device_gbps:.2f} GB/s",
            f"collectives (latency + bus bandwidth): {links or 'none (one rank: the datasheet links)'}",
            *(f"collectives on {n} ranks: {_describe_links(at)}" for n, at in cal.collectives_at.items()),
            f"engines, fixed per tensor (per step / per micro-step, {cal.tensors} tensors): {engines}",
            _describe_busy(cal.busy),
            *_describe_moved(moved(cal)),
        ]
    )


def moved(cal: Calibration) -> tuple[float, float] | None:
    """The fastest and slowest seconds the calibration's forward + backward of one micro batch took over
    its launch (each compute round, and the median beside each engine): how far the machine itself moved
    while it measured; None in a file without them."""
    rounds = [r[0] for r in cal.measured.get("compute", {}).get("rounds_s", [])]
    times = rounds + [e["bare_s"] for e in cal.measured.get("engines", {}).values()]
    return (min(times), max(times)) if times else None


def _describe_moved(span: tuple[float, float] | None) -> list[str]:
    if span is None:
        return []
    low, high = span
    return [
        f"this machine moved: the same forward + backward took {low * 1e3:.1f}-{high * 1e3:.1f} ms over the "
        f"launch (x {high / low:.2f}): the machine's own noise, which no prediction gets under"
    ]


def _describe_links(links: dict[str, Link]) -> str:
    return ", ".join(
        f"{op} {c.latency_s * 1e6:.0f} us + {c.bus_gbps:.2f} GB/s" for op, c in sorted(links.items())
    )


def _describe_busy(busy: dict | None) -> str:
    if busy is None:
        return "busy shares: not measured (an older calibration): ranks beyond the cores stretch every term"
    comm = ", ".join(f"{op} {b:.2f}" for op, b in sorted(busy["comm"].items()))
    fixed = ", ".join(f"{k} {b:.2f}" for k, b in busy["fixed"].items())
    return (
        f"busy shares (CPU / wall seconds; only they share cores): compute {busy['compute']:.2f}, Adam "
        f"{busy['adam']:.2f}, copies {busy['copy']:.2f}; collectives {comm or 'none'}; "
        f"engines {fixed or 'none'}"
    )


def engine_setup(base: Setup, key: str) -> Setup:
    """``base`` with the engine ``key`` names (``kit.steptime.calibration.engine_key``)."""
    if key in ("ddp", "fsdp"):
        return base.replace(zero={"engine": key, "stage": 0 if key == "ddp" else 3})
    stage, _, offload = key.partition("+")
    if not (stage[:1] == "z" and stage[1:] in ("0", "1", "2", "3")) or offload not in ("", "offload"):
        raise ValueError(f"engines: {key!r} is not an engine; choose from {', '.join(DEFAULT_ENGINES)}")
    return base.replace(zero={"stage": int(stage[1:]), "offload_optimizer": "cpu" if offload else "none"})


def measure_argv(setup: Setup, calibration: Calibration) -> list[str]:
    """The ``zerokit calibrate --measure`` command that measures what ``calibration`` did not for ``setup``
    (``Calibration.carried_over``): its model, its precision, and its engine beside the engines measured.
    A model is named by its file, or by its preset with its shape (a preset ``kit.models.override``
    changed keeps the preset's name in front); a toy GPT by its shape (the default model's family); any
    other by ``M`` with its shape, since its spec keeps no name ``--model`` reads."""
    argv, m, z = ["zerokit", "calibrate", "--measure"], setup.model, setup.zero
    if model_text(m) != calibration.model:
        preset = _preset_of(m.name)
        named = m.source or preset
        if named or m.family != DEFAULT_MODEL.family:
            argv += ["--model", named or "M"]
        if not m.source and m.name != preset:
            shape = {"layers": m.layers, "hidden": m.hidden, "heads": m.heads, "ffn": m.ffn, "vocab": m.vocab}
            if m.kv_heads not in (None, m.heads):
                shape["kv-heads"] = m.kv_heads
            argv += [a for k, v in shape.items() if v is not None for a in (f"--{k}", str(v))]
    if z.precision != calibration.precision:
        argv += ["--precision", z.precision]
    key = engine_key(z.stage, z.engine, z.offload_optimizer, z.offload_param)
    if calibration.engine(key)[1] != key:
        argv += ["--engines", ",".join([*calibration.engines, key])]
    return argv


def _preset_of(name: str) -> str | None:
    """The preset a model of this name is (``llama-2-7b``) or was changed from (``llama-2-7b-layers2-...``,
    ``kit.models.override``'s names), the longest that fits; None for any other."""
    fits = [p for p in preset_names() if name == p or name.startswith(p + "-")]
    return max(fits, key=len, default=None)


def default_comm_ranks(nprocs: int) -> tuple[int, ...]:
    """The rank counts ``zerokit calibrate --measure`` also times the collectives on (``measure``'s
    ``comm_ranks``) unless told: twice ``nprocs`` on CPU ranks (gloo's latency on ranks sharing the cores
    does not scale by hops: measured 2 -> 4 ranks on 2 cores, all-reduce x 4.3, all-gather x 7.5,
    reduce-scatter x 7-10 per 4 KiB call), none on GPUs (a node has no ranks beyond its GPUs) or on one
    rank."""
    import torch

    cpu = os.environ.get("DS_ACCELERATOR") == "cpu" or not torch.cuda.is_available()
    return (2 * nprocs,) if cpu and nprocs > 1 else ()


def measure(
    base: Setup,
    nprocs: int = 2,
    engines: tuple[str, ...] = DEFAULT_ENGINES,
    *,
    steps: int = 5,
    warmup: int = 2,
    repeat: int = 5,
    iters: int = 5,
    sizes: tuple[int, ...] = CALIBRATION_SIZES,
    comm_ranks: tuple[int, ...] | None = None,
    timeout_s: float = 300.0,
) -> Calibration:
    """One launch of ``kit.ranks.calibrate_worker`` on ``nprocs`` ranks measuring ``base``'s model (its
    micro batch and the one twice as large, grad accum 2 for the engines), fitted by ``fit``; one rank
    (a single GPU) measures no collectives. Then one short launch per rank count of ``comm_ranks`` that
    measures the collectives alone on that many ranks (``Calibration.collectives_at``); None, as
    ``zerokit calibrate --measure`` without ``--comm-ranks``: ``default_comm_ranks(nprocs)``; ``()``: none."""
    if nprocs < 1:
        raise ValueError(f"nprocs: must be >= 1 (one rank measures no collectives), got {nprocs}")
    if comm_ranks is None:
        comm_ranks = default_comm_ranks(nprocs)
    bad = [n for n in comm_ranks if n < 2 or n == nprocs]
    if bad:
        raise ValueError(f"comm-ranks: each must be >= 2 ranks, other than nprocs ({nprocs}), got {bad[0]}")
    base = base.replace(cluster={"nodes": 1, "gpus_per_node": nprocs}, batch={"grad_accum": 2})
    spec = CalibrateSpec(
        setup=base,
        engines=tuple(EngineConfig(key=key, setup=engine_setup(base, key)) for key in engines),
        micro_batches=(base.batch.micro_batch, 2 * base.batch.micro_batch),
        adam_numel=max(base.model.params, 1 << 22),
        copy_bytes=64 << 20,
        sizes=tuple(sizes) if nprocs > 1 else (),
        iters=iters,
        repeat=repeat,
        steps=steps,
        warmup=warmup,
    )
    start = time.monotonic()
    cal = fit(_launch(spec, nprocs, timeout_s), base)
    only = spec.model_copy(update={"collectives_only": True, "sizes": tuple(sizes)})
    rows = {str(n): _launch(only, n, timeout_s)["collective"] for n in sorted(set(comm_ranks))}
    return replace(
        cal,
        collectives_at={n: _links(timed, int(n)) for n, timed in rows.items()},
        measured={**cal.measured, "collectives_at": rows},
        seconds=time.monotonic() - start,
    )


def _launch(spec: CalibrateSpec, nprocs: int, timeout_s: float) -> dict:
    """The worker's measurements (``_parse``) from one launch of ``spec`` on ``nprocs`` ranks."""
    from kit.run.launcher import launch_argv, run_launch, worker_env

    with tempfile.TemporaryDirectory(prefix="zerokit-calibrate-") as folder:
        path = str(spec.write(os.path.join(folder, "spec.json")))
        rc, output = run_launch(launch_argv(WORKER, ["--spec", path], nprocs), worker_env(nprocs), timeout_s)
    lines = _parse(output)
    if rc != 0 or "done" not in lines:
        failed = f"calibrate: the measuring launch on {nprocs} ranks failed (exit status {rc})"
        raise RuntimeError(f"{failed}: {last_words(output)}")
    return lines


def last_words(output: str, n: int = 3) -> str:
    """A failed launch's last ``n`` lines from its ranks, before torch's launcher reports exit codes."""
    lines = output.strip().splitlines()
    cut = next((i for i, line in enumerate(lines) if "torch/distributed/elastic" in line), len(lines))
    return " | ".join((lines[:cut] or lines)[-n:]) or "no output"


def _links(rows: list[dict], ranks: int) -> dict[str, Link]:
    """Per collective the worker timed (``rows``) on ``ranks`` ranks, its line through the sizes
    (``_hockney``)."""
    links = {}
    for op in sorted({c["op"] for c in rows}):
        mine = [c for c in rows if c["op"] == op]
        x = [c["size_bytes"] * bus_factor(op, ranks) for c in mine]
        per_byte, latency = _hockney(x, [c["s"] for c in mine])
        links[op] = Link(latency_s=max(0.0, latency), bus_gbps=1 / per_byte / 1e9)
    return links


def _parse(output: str) -> dict:
    found: dict = {"engine": []}
    for line in output.splitlines():
        at = line.find(TAG + " ")
        if at >= 0:
            item = json.loads(line[at + len(TAG) + 1 :])
            if item["kind"] == "engine":
                found["engine"].append(item["value"])
            else:
                found[item["kind"]] = item["value"]
    return found


def fit(lines: dict, base: Setup) -> Calibration:
    """The calibration from the worker's measurements (``_parse``): each rate from its own measurement,
    then each engine's fixed costs as what those rates leave unexplained in its micro-steps (>= 0)."""
    machine, m = lines["machine"], base.model
    per_token = perf.flops_per_token(base)[0]
    tflops, fixed = _compute_rate(lines, per_token)
    n = machine["world_size"]
    links = _links(lines["collective"], n)
    adam, copy = lines["adam"], lines["copy"]
    cal = Calibration(
        device=machine["device"],
        accelerator="cuda" if machine["backend"] == "nccl" else "cpu",
        backend=machine["backend"],
        ranks=n,
        cores=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1,
        threads_per_rank=machine["threads_per_rank"],
        model=model_text(m),
        layers=base.model.layers or 0,
        tensors=len(partition.numels(base)),
        precision=base.zero.precision,
        tflops=tflops,
        micro_fixed_s=fixed,
        adam_s_per_param=adam["device_s"] / adam["numel"],
        host_adam_s_per_param=adam["host_s"] / adam["numel"],
        to_host_gbps=copy["bytes"] / copy["to_host_s"] / 1e9,
        to_device_gbps=copy["bytes"] / copy["to_device_s"] / 1e9,
        collectives=links,
        engines={},
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        host=socket.gethostname(),
        versions={"torch": machine["torch"], "deepspeed": machine["deepspeed"]},
        measured={
            "compute": lines["compute"],
            "collectives": lines["collective"],
            "adam": adam,
            "copy": copy,
        },
    )
    engines, medians, fixed_busy = {}, {}, {}
    for item in lines["engine"]:
        setup = Setup.model_validate(item["setup"])
        micro = statistics.median(t for step in item["micro_steps_s"] for t in step[:-1])
        last = statistics.median(step[-1] for step in item["micro_steps_s"])
        bare = statistics.median(item["bare_s"])
        one = calibrated.step_time(setup.replace(batch={"grad_accum": 1}), calibration=cal)
        two = calibrated.step_time(setup.replace(batch={"grad_accum": 2}), calibration=cal)
        per_micro, per_step = two.step_s - one.step_s, 2 * one.step_s - two.step_s  # per_step + k per_micro
        # the micro-step's compute as measured beside it, not as the rates predict it
        per_micro += bare - (two.compute.seconds - one.compute.seconds)
        tensors = len(partition.numels(setup))
        # an engine's bookkeeping costs time or nothing: a negative residual is the shared machine's noise
        engines[item["key"]] = EngineCost(
            step_s_per_tensor=max(0.0, (last - micro) - per_step) / tensors,
            micro_step_s_per_tensor=max(0.0, micro - per_micro) / tensors,
        )
        medians[item["key"]] = {"micro_step_s": micro, "last_micro_step_s": last, "bare_s": bare}
        fixed_busy[item["key"]] = _engine_busy(item, machine["threads_per_rank"])
    busy = {
        "compute": _round(
            statistics.median(
                [b for r in lines["compute"]["rounds_busy"] for b in r]
                + [b for item in lines["engine"] for b in item["bare_busy"]]
            )
        ),
        "adam": _round(adam["host_busy"]),
        "copy": _round(copy["busy"]),
        "comm": {
            op: _round(statistics.median(c["busy"] for c in lines["collective"] if c["op"] == op))
            for op in links
        },
        "fixed": fixed_busy,
    }
    return replace(cal, engines=engines, busy=busy, measured={**cal.measured, "engines": medians})


def _engine_busy(item: dict, threads: int) -> float:
    """The busy share of what engine ``item`` adds to the bare model: the CPU seconds (per thread) of its
    timed steps beyond as many bare forward + backward passes over their wall seconds beyond them (the
    whole steps' share when the bare passes took nearly as long)."""
    wall = sum(t for step in item["micro_steps_s"] for t in step)
    cpu = sum(t for step in item["micro_steps_cpu_s"] for t in step) / threads
    passes = len(item["micro_steps_s"][0])  # micro-steps per step
    bare = statistics.median(item["bare_s"]) * passes * len(item["micro_steps_s"])
    bare_cpu = statistics.median(t * b for t, b in zip(item["bare_s"], item["bare_busy"], strict=True))
    bare_cpu *= passes * len(item["micro_steps_s"])
    if wall - bare > 0.05 * wall:
        return _round(min(1.0, max(0.0, (cpu - bare_cpu) / (wall - bare))))
    return _round(min(1.0, cpu / wall))


def _round(share: float) -> float:
    """A busy share as the file keeps it: 3 decimals, in [0, 1]."""
    return round(min(1.0, max(0.0, share)), 3)


def _compute_rate(lines: dict, per_token: float) -> tuple[float, float]:
    """(TFLOP/s, fixed seconds per micro-step) of forward + backward: seconds = fixed + FLOPs / rate.

    The micro batch's seconds are the median of every time it was measured (the compute rounds and
    beside each engine's steps: the whole launch's load); the larger micro batch enters only as the
    median ratio of the two within a round, kept between 1 and the FLOPs' ratio (fixed >= 0)."""
    c = lines["compute"]
    small, large = (per_token * t for t in c["tokens"][:2])
    seconds = statistics.median(
        [r[0] for r in c["rounds_s"]] + [t for item in lines["engine"] for t in item["bare_s"]]
    )
    ratio = min(max(statistics.median(r[1] / r[0] for r in c["rounds_s"]), 1.0), large / small)
    per_flop = seconds * (ratio - 1) / (large - small)
    if per_flop <= 0:  # the larger batch took no longer: no fixed part is measurable
        return small / seconds / 1e12, 0.0
    return 1 / per_flop / 1e12, seconds - small * per_flop


def _hockney(x: list[float], y: list[float]) -> tuple[float, float]:
    """Seconds per byte and latency of t = latency + bytes x per_byte through measurements spanning orders
    of magnitude: least squares of the relative residuals (weights 1 / t^2), so each size counts by its
    own precision. A plain least-squares line lets the large messages' noise (milliseconds) and gloo's
    slower middle sizes set the intercept: its latencies came out up to 2.4x the 4 KiB call's whole time,
    and the latency is what more ranks multiply (``kit.steptime.calibrated``: x (N-1)/(N_cal-1))."""
    slope, latency = np.polyfit(x, y, 1, w=[1 / t for t in y])  # polyfit squares w x residual
    return float(slope), float(latency)


@dataclass(frozen=True)
class CpuMachine:
    """This machine's rates as the step-time model needs them, measured."""

    threads: int  # per rank
    tflops: dict[str, float]  # per rank, by precision
    bus_gbps: float  # gloo all-reduce bus bandwidth between the ranks
    copy_gbps: float  # host memory copy (what offload moves on a CPU machine)

    def hardware(self, precision: str) -> perf.Hardware:
        return perf.Hardware(
            name=f"this CPU machine, {self.threads} thread(s) per rank, gloo",
            peak_tflops=self.tflops[precision],
            intra_gbps=self.bus_gbps,
            inter_gbps=self.bus_gbps,
            host_gbps=self.copy_gbps,
            memory_gbps=self.copy_gbps,
            source="measured by kit.run.calibrate.cpu_machine",
        )


#: measured rates are achieved rates: nothing to discount
MEASURED = perf.Assumptions(efficiency=1.0, link_efficiency=1.0)


def matmul_shape(setup: Setup) -> tuple[int, int, int]:
    """(tokens of a micro batch, hidden, ffn): the MLP matmul of ``setup``'s model, the shape that
    dominates its FLOPs (1024 cubed for a model without a known shape)."""
    m, b = setup.model, setup.batch
    if not (m.hidden and m.ffn):
        return (1024, 1024, 1024)
    return (b.micro_batch * b.seq_len, m.hidden, m.ffn)


def cpu_machine(
    nprocs: int,
    precisions: tuple[str, ...] = ("fp32", "bf16"),
    shape: tuple[int, int, int] = (1024,) * 3,
    *,
    bus_gbps: float,
) -> CpuMachine:
    """Measure matmul TFLOP/s (an (m, k) x (k, n) ``shape``, median of 5, with the threads each of
    ``nprocs`` ranks gets) and memory copy bandwidth; ``bus_gbps`` is the ranks' measured all-reduce bus
    bandwidth (``kit.scaleout.commtest.allreduce_bus_gbps(nprocs)``)."""
    import torch

    if not bus_gbps > 0:
        raise ValueError(f"bus_gbps: must be a measured bandwidth > 0 GB/s, got {bus_gbps!r}")

    threads = max(1, (os.cpu_count() or 1) // nprocs)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
        tflops = {}
        m, k, n = shape
        for precision in precisions:
            a = torch.randn(m, k, dtype=dtypes[precision])
            b = torch.randn(k, n, dtype=dtypes[precision])
            seconds = median_seconds(lambda a=a, b=b: a @ b)
            tflops[precision] = 2 * m * k * n / seconds / 1e12
        src = torch.empty(64 * 2**20, dtype=torch.uint8)
        dst = torch.empty_like(src)
        copy_gbps = src.numel() / median_seconds(lambda: dst.copy_(src)) / 1e9
    finally:
        torch.set_num_threads(before)
    return CpuMachine(threads, tflops, bus_gbps, copy_gbps)


def calibrate(
    results: Results, machine: CpuMachine | None = None, calibration: Calibration | None = None
) -> pd.DataFrame:
    """Per configuration of a sweep: measured median step time (and its fastest and slowest step,
    ``measured_min_s``, ``measured_max_s``: how far the machine moved it), the model's prediction (and its
    parts), and the error ``predicted / measured - 1``. With a ``calibration`` (``measure``) every record is
    predicted from it; without, CPU records need ``machine`` (``cpu_machine()``) and GPU records use
    the datasheet."""
    rows = []
    for config in results.summary().itertuples():
        if config.status != "ok":
            continue
        first = next(r for r in results.records if r["config_id"] == config.config_id and "device" in r)
        setup, device = Setup.model_validate(first["setup"]), first["device"]
        if calibration is not None:
            t = calibrated.step_time(setup, calibration=calibration)
        elif device == "cpu":
            if machine is None:
                raise ValueError(
                    "machine: CPU records need the machine measured: calibrate(results, cpu_machine())"
                )
            t = perf.step_time(setup, machine.hardware(setup.zero.precision), MEASURED)
        else:
            t = perf.step_time(setup)
        measured = float(config.step_time_s)
        rows.append(
            {
                "label": config.label,
                "config_id": config.config_id,
                "device": device,
                "measured_s": measured,
                "measured_min_s": float(config.step_time_min_s),
                "measured_max_s": float(config.step_time_max_s),
                "predicted_s": t.step_s,
                "compute_s": t.compute.seconds,
                "comm_s": t.exposed_comm.seconds,
                "optimizer_s": t.optimizer.seconds,
                "offload_s": t.offload.seconds,
                "fixed_s": t.fixed.seconds,
                "error": error(t.step_s, measured),
                "carried_over": "; ".join(calibration.carried_over(setup)) if calibration else "",
            }
        )
    table = pd.DataFrame(rows)
    if len(table):
        table["within_steps"] = within_steps(table)
    return table


def within_steps(table: pd.DataFrame) -> pd.Series:
    """Per configuration of ``calibrate``'s table: whether the prediction lies between its fastest and
    slowest measured step (an error the run's own step-to-step noise covers)."""
    return (table.predicted_s >= table.measured_min_s) & (table.predicted_s <= table.measured_max_s)


def error(predicted_s: float, measured_s: float) -> float:
    """The step-time model's error on one configuration: predicted / measured - 1 (``configs[].error``)."""
    return predicted_s / measured_s - 1


def median_abs_error(table: pd.DataFrame) -> float:
    """The calibration's one number: the median of |predicted / measured - 1| over configurations."""
    return float(table.error.abs().median()) if len(table) else float("nan")


@dataclass(frozen=True)
class CalibrationReport:
    """``report``'s answer: ``calibrate``'s ``table``, the ``machine`` CPU records were predicted on, the
    calibration's ``label``; per kind of rates it carried over, (kind, labels, argv that measures them)."""

    table: pd.DataFrame
    machine: CpuMachine | None
    label: str
    carried_over: list[tuple[str, list[str], list[str]]]

    def to_dict(self) -> dict:
        """``zerokit calibrate SWEEP --json``'s object (docs/contracts.md)."""
        t, machine = self.table, vars(self.machine) if self.machine else None
        most = float(t.error.abs().max()) if len(t) else None
        return {"configs": t.to_dict(orient="records"), "median_abs_error": median_abs_error(t),
                "max_abs_error": most, "machine": machine, "calibration": self.label}  # fmt: skip


def report(
    sweep: str, bus: Callable[[int], float], nprocs: int = 2, calibration: str | None = None
) -> CalibrationReport:
    """The step-time model beside what ``sweep`` measured, from the ``calibration`` file or as ``calibrate``:
    CPU records on ``cpu_machine`` for ``nprocs`` ranks at ``bus(nprocs)`` GB/s (``allreduce_bus_gbps``)."""
    results = Results.load(sweep)
    ok = [r for r in results.records if r.get("status") == "ok" and "device" in r]
    if not ok:
        raise ValueError(f"sweep: {sweep} has no measured configuration to compare with")
    cal = Calibration.load(calibration) if calibration else None
    precisions = tuple(sorted({r["setup"]["zero"]["precision"] for r in ok}))
    shape = matmul_shape(Setup.model_validate(ok[0]["setup"]))
    cpu = cal is None and any(r["device"] == "cpu" for r in ok)
    machine = cpu_machine(nprocs, precisions, shape, bus_gbps=bus(nprocs)) if cpu else None
    table = calibrate(results, machine, cal)
    if cal is None:
        return CalibrationReport(table, machine, "uncalibrated", [])
    setups = {r["config_id"]: Setup.model_validate(r["setup"]) for r in ok}
    carried = [
        (what, list(rows.label), measure_argv(setups[rows.config_id.iloc[0]], cal))
        for what, rows in table[table.carried_over != ""].groupby("carried_over", sort=False)
    ]
    return CalibrationReport(table, machine, cal.label, carried)


def median_seconds(fn, repeat: int = 5) -> float:
    """Median wall seconds of ``repeat`` calls of ``fn`` after one warm-up call."""
    fn()  # warm up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
