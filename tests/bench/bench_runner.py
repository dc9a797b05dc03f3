"""Runner speed on 2 CPU ranks.

- one launch for a sweep of 4 configurations vs 4 launches of one each: ratio of wall times (target
  <= 0.5: the launcher and imports are paid once); per configuration its start cost (``start_s``: from
  the configuration's start to its first step, the engine and model builds), and the one-launch sweep's
  wall time over its measured steps' time;
- what each measurement costs (``kit.records.PROBES``), side by side in one launch: one configuration's
  measured steps run through the variants (bare: no probe; each probe alone; all of them,
  instrumented) ``ROUNDS`` times, each round in its own order, so that the shared machine's drift falls
  on every variant alike
  (``run_sweep(probes=...)``). Per variant the median step time (the timed window, which the records'
  throughput comes from) and the median loop period (rank 0's step events apart: the step plus what
  is done around it, heartbeat, record). A probe's cost is its variant's median over the bare one's,
  minus 1; ``instrumented_over_bare`` is bare over all probes in steps/s (target >= 0.95). The
  model-state walk runs once per configuration (its first step, left out of that step's time): its
  cost is that step's loop period beyond the bare median, in seconds.
"""

import random
import statistics
import tempfile
import time
from collections import defaultdict

from kit.models import toy_spec
from kit.records import OPTIONAL_PROBES, PROBES
from kit.run.sweep import run_sweep
from kit.schema import Setup

NPROCS = 2
#: the variants of the probe launch, in the order its steps cycle through them
VARIANTS = {"bare": (), **{p: (p,) for p in (*PROBES, *OPTIONAL_PROBES)}, "instrumented": PROBES}
#: rounds of the probe launch: each runs every variant once, in an order of its own (a seeded shuffle)
ROUNDS, WARMUP = 40, 3


def setups() -> list[Setup]:
    base = Setup(model=toy_spec(), zero={"precision": "fp32"}, batch={"micro_batch": 2})
    return [base.replace(zero={"stage": stage}) for stage in range(4)]


def wall_seconds(runs_dir: str, sweeps: list[list[Setup]], **options) -> tuple[float, list]:
    """Wall seconds of running ``sweeps`` one launch each, and their Results."""
    start = time.perf_counter()
    results = [
        run_sweep(sweep, sweep=f"s{i}", runs_dir=runs_dir, nprocs=NPROCS, progress=False, **options)
        for i, sweep in enumerate(sweeps)
    ]
    return time.perf_counter() - start, results


def probe_costs(runs_dir: str, setup: Setup) -> tuple[dict[str, float], dict[str, float], float]:
    """Per variant, the median step time and the median loop period (s); the walk's once-per-configuration
    seconds."""
    # the first round in VARIANTS' order: its first step (no loop period) is bare, not the walk's
    names = list(VARIANTS)
    names += [n for r in range(1, ROUNDS) for n in random.Random(r).sample(list(VARIANTS), len(VARIANTS))]
    arrivals: list[float] = []

    def on_event(event: dict) -> None:
        if event["event"] == "step":
            arrivals.append(time.perf_counter())

    results = run_sweep(
        [setup], sweep="probes", runs_dir=runs_dir, nprocs=NPROCS, steps=len(names), warmup=WARMUP,
        progress=False, probes=[VARIANTS[n] for n in names], on_event=on_event,
    )  # fmt: skip
    step_s: dict[str, list[float]] = defaultdict(list)
    loop_s: dict[str, list[float]] = defaultdict(list)
    for k, seconds in enumerate(results.steps()["step_time_s"]):
        name = names[k]
        step_s[name].append(seconds)
        if k:  # rank 0's events of the measured steps: the loop period of step k ends at its event
            loop_s[name].append(arrivals[k] - arrivals[k - 1])
    loops = {n: statistics.median(v) for n, v in loop_s.items()}
    walked = next(k for k, n in enumerate(names) if "state_walk" in VARIANTS[n])  # the later ones do not
    walk_once = arrivals[walked] - arrivals[walked - 1] - loops["bare"]
    return {n: statistics.median(v) for n, v in step_s.items()}, loops, walk_once


def main() -> None:
    with tempfile.TemporaryDirectory() as runs:
        one, (swept,) = wall_seconds(runs + "/one", [setups()], steps=3)
        four, _ = wall_seconds(runs + "/four", [[s] for s in setups()], steps=3)
        print(f"sweep_4_configs_one_launch: {one:.1f} s")
        print(f"sweep_4_configs_four_launches: {four:.1f} s")
        print(f"one_launch_over_four_launches: {one / four:.2f} ratio")
        summary = swept.summary()
        for row in summary.itertuples():
            print(f"start_s_{row.label.replace(' ', '_')}: {row.start_s:.2f} s")
        measured = swept.steps()["step_time_s"].sum()
        print(f"sweep_wall_over_measured_steps: {one / measured:.1f} ratio")

        setup = setups()[3]
        step_s, loop_s, walk_once = probe_costs(runs + "/probes", setup)
        bare_step, bare_loop = step_s["bare"], loop_s["bare"]
        print(f"step_ms_bare_{setup.label.replace(' ', '_')}: {bare_step * 1e3:.2f} ms")
        print(f"loop_ms_bare_{setup.label.replace(' ', '_')}: {bare_loop * 1e3:.2f} ms")
        for name in VARIANTS:
            if name != "bare":
                print(f"probe_cost_{name}: {step_s[name] / bare_step - 1:+.3f} of a step")
                print(f"probe_loop_cost_{name}: {loop_s[name] / bare_loop - 1:+.3f} of a loop period")
        print(f"state_walk_once_per_config: {walk_once:.3f} s")
        print(f"instrumented_over_bare: {bare_step / step_s['instrumented']:.3f} ratio")
        print(f"instrumented_over_bare_loop: {bare_loop / loop_s['instrumented']:.3f} ratio")


if __name__ == "__main__":
    main()
