"""Runner speed on 2 CPU ranks.

- one launch for a sweep of 4 configurations vs 4 launches of one each: ratio of wall times (target
  <= 0.5: the launcher and imports are paid once);
- instrumentation overhead: median steps/s with every measurement on (comms logger, saved-tensor
  hooks, model-state walk, peak memory) over the bare DeepSpeed loop's (target >= 0.95). Launches
  alternate (instrumented, bare) ``PAIRS`` times and the median of the pairs' ratios is reported: two
  CPU ranks on a shared machine vary by +-20 % from one launch to the next.
"""

import statistics
import tempfile
import time

from kit.models import toy_spec
from kit.run.sweep import run_sweep
from kit.schema import Setup

NPROCS = 2
PAIRS = 3


def setups() -> list[Setup]:
    base = Setup(model=toy_spec(), zero={"precision": "fp32"}, batch={"micro_batch": 2})
    return [base.replace(zero={"stage": stage}) for stage in range(4)]


def wall_seconds(runs_dir: str, sweeps: list[list[Setup]], **options) -> float:
    start = time.perf_counter()
    for i, sweep in enumerate(sweeps):
        run_sweep(sweep, sweep=f"s{i}", runs_dir=runs_dir, nprocs=NPROCS, progress=False, **options)
    return time.perf_counter() - start


def median_steps_per_s(runs_dir: str, setup: Setup, instrument: bool) -> float:
    name = "instrumented" if instrument else "bare"
    results = run_sweep(
        [setup], sweep=name, runs_dir=runs_dir, nprocs=NPROCS, steps=30, warmup=3, progress=False,
        instrument=instrument,
    )  # fmt: skip
    return 1.0 / statistics.median(results.steps()["step_time_s"])


def main() -> None:
    with tempfile.TemporaryDirectory() as runs:
        one = wall_seconds(runs + "/one", [setups()], steps=3)
        four = wall_seconds(runs + "/four", [[s] for s in setups()], steps=3)
        print(f"sweep_4_configs_one_launch: {one:.1f} s")
        print(f"sweep_4_configs_four_launches: {four:.1f} s")
        print(f"one_launch_over_four_launches: {one / four:.2f} ratio")
        setup = setups()[3]
        pairs = [
            (median_steps_per_s(f"{runs}/{i}", setup, True), median_steps_per_s(f"{runs}/{i}", setup, False))
            for i in range(PAIRS)
        ]
        name = setup.label.replace(" ", "_")
        print(f"steps_per_s_instrumented_{name}: {statistics.median(m for m, _ in pairs):.2f} steps/s")
        print(f"steps_per_s_bare_{name}: {statistics.median(b for _, b in pairs):.2f} steps/s")
        ratio = statistics.median(m / b for m, b in pairs)
        print(f"instrumented_over_bare: {ratio:.3f} ratio")


if __name__ == "__main__":
    main()
