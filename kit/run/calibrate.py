"""How good is the step-time model? Its predictions beside the step times a sweep measured.

The hardware figures come from measurements independent of the step times (nothing is fitted to them):
- GPU records: the GPU's datasheet figures and fabric (``kit.estimate.perf.hardware``) and the default
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

import os
import statistics
import time
from dataclasses import dataclass

import pandas as pd

from kit.estimate import perf
from kit.run.results import Results
from kit.schema import Setup


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
            seconds = _median_seconds(lambda a=a, b=b: a @ b)
            tflops[precision] = 2 * m * k * n / seconds / 1e12
        src = torch.empty(64 * 2**20, dtype=torch.uint8)
        dst = torch.empty_like(src)
        copy_gbps = src.numel() / _median_seconds(lambda: dst.copy_(src)) / 1e9
    finally:
        torch.set_num_threads(before)
    return CpuMachine(threads, tflops, bus_gbps, copy_gbps)


def calibrate(results: Results, machine: CpuMachine | None = None) -> pd.DataFrame:
    """Per configuration of a sweep: measured median step time, the model's prediction (and its parts),
    and the error ``predicted / measured - 1``. CPU records need ``machine`` (``cpu_machine()``)."""
    rows = []
    for config in results.summary().itertuples():
        if config.status != "ok":
            continue
        first = next(r for r in results.records if r["config_id"] == config.config_id and "device" in r)
        setup, device = Setup.model_validate(first["setup"]), first["device"]
        if device == "cpu":
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
                "device": device,
                "measured_s": measured,
                "predicted_s": t.step_s,
                "compute_s": t.compute.seconds,
                "comm_s": t.exposed_comm.seconds,
                "optimizer_s": t.optimizer.seconds,
                "offload_s": t.offload.seconds,
                "error": t.step_s / measured - 1,
            }
        )
    return pd.DataFrame(rows)


def median_abs_error(table: pd.DataFrame) -> float:
    """The calibration's one number: the median of |predicted / measured - 1| over configurations."""
    return float(table.error.abs().median()) if len(table) else float("nan")


def _median_seconds(fn, repeat: int = 5) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
