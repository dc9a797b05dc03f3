"""The step-time model against measurement on this machine: a compute-heavy toy GPT (3.3M parameters,
hidden 256, fp32, 512 tokens per micro batch) at stages 0-3, with offload and with gradient accumulation,
2 CPU ranks, bare loop; the machine's matmul rate and gloo bandwidth measured independently. Prints each
configuration's error and the median |error| (``kit.run.calibrate``)."""

import tempfile

from kit.models import override, toy_spec
from kit.run.calibrate import calibrate, cpu_machine, matmul_shape, median_abs_error
from kit.run.sweep import TOY_ZERO, run_sweep
from kit.scaleout.commtest import allreduce_bus_gbps
from kit.schema import Setup


def main() -> None:
    spec = override(toy_spec(), {"hidden": 256, "layers": 4, "ffn": 1024})
    base = Setup(
        model=spec,
        cluster={"nodes": 1, "gpus_per_node": 2},
        zero={**TOY_ZERO, "precision": "fp32"},
        batch={"micro_batch": 8, "seq_len": 64},
    )
    setups = [base.replace(zero={"stage": s}) for s in (0, 1, 2, 3)]
    setups += [
        base.replace(zero={"stage": 2, "offload_optimizer": "cpu"}),
        base.replace(batch={"micro_batch": 4, "grad_accum": 2}),
    ]
    with tempfile.TemporaryDirectory() as runs:
        results = run_sweep(
            setups, sweep="calibrate", runs_dir=runs, steps=4, progress=False, instrument=False
        )
    machine = cpu_machine(2, ("fp32",), matmul_shape(base), bus_gbps=allreduce_bus_gbps(2))
    print(f"cpu_matmul_per_rank: {machine.tflops['fp32'] * 1e3:.1f} GFLOP/s")
    print(f"gloo_allreduce_busbw: {machine.bus_gbps:.2f} GB/s")
    table = calibrate(results, machine)
    for row in table.itertuples():
        name = row.label.replace(" ", "_")
        times = f"measured {row.measured_s:.3f} s, predicted {row.predicted_s:.3f} s"
        print(f"calibration_{name}: {times}, {row.error:+.0%}")
    print(f"calibration_median_abs_error: {median_abs_error(table):.2f} ratio")
