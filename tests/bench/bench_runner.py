"""Runner speed on 2 CPU ranks.

- one launch for a sweep of 4 configurations vs 4 launches of one each: ratio of wall times (target
  <= 0.5: the launcher and imports are paid once); per configuration its start cost (``start_s``: from
  the configuration's start to its first step, the engine and model builds), and the one-launch sweep's
  wall time over its measured steps' time;
- what each measurement costs (``kit.records.PROBES``, ``OPTIONAL_PROBES``), side by side in one
  launch (``run_sweep(probes=...)``): one configuration's measured steps run through the variants
  (bare: no probe; each probe alone; all of ``PROBES``, instrumented) ``ROUNDS`` times, each round in
  its own order. Per variant and round its step time (the timed window the records' throughput comes
  from), step CPU time (``step_cpu_s``, this rank's: the other processes of a loaded machine leave it
  alone, while the same step's wall time varies 5x on 2 shared cores) and loop period (rank 0's step
  events apart: the step plus the heartbeat and record around it) over the same round's bare step; a
  probe's cost is the median of those ratios, minus 1; ``instrumented_over_bare`` is 1 / (1 + the
  instrumented cost) (target >= 0.95). The walk and the activations' hooks run once per configuration
  (its first step that takes them): their cost is that step's excess over the bare median, in seconds.
"""

import random
import statistics
import tempfile
import time

from kit.models import toy_spec
from kit.records import OPTIONAL_PROBES, PROBES
from kit.run.sweep import run_sweep
from kit.schema import Setup

NPROCS = 2
#: the variants of the probe launch, in the order its steps cycle through them
VARIANTS = {"bare": (), **{p: (p,) for p in (*PROBES, *OPTIONAL_PROBES)}, "instrumented": PROBES}
#: rounds of the probe launch: each runs every variant once, in an order of its own (a seeded shuffle)
ROUNDS, WARMUP = 100, 3
#: what is compared per step: wall time, this rank's CPU time, rank 0's loop period
MEASURES = ("step", "cpu", "loop")
#: probes that measure once per configuration, and where their cost shows: the walk inside the step is
#: left out of its time, the one after it is not; the activations' hooks are inside the step
ONCE = {"state_walk": "loop", "activations": "step"}


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


def probe_costs(runs_dir: str, setup: Setup) -> tuple[dict, dict[str, float], dict[str, float]]:
    """Per variant and measure (``MEASURES``), the median over rounds of its ratio to the same round's
    bare step, minus 1; the bare step's medians (s); the seconds the probes that measure once per
    configuration (``ONCE``) add to the first step that takes them, beyond the bare median."""
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
    steps = results.steps()
    rounds: list[dict[str, dict[str, float]]] = [{} for _ in range(ROUNDS)]
    for k, (wall, cpu) in enumerate(zip(steps["step_time_s"], steps["step_cpu_s"], strict=True)):
        # rank 0's events of the measured steps: the loop period of step k ends at its event
        loop = arrivals[k] - arrivals[k - 1] if k else 0.0
        rounds[k // len(VARIANTS)][names[k]] = {"step": wall, "cpu": cpu, "loop": loop}
    # round 0 is left out: its first step has no loop period
    costs = {
        n: {key: statistics.median(r[n][key] / r["bare"][key] - 1 for r in rounds[1:]) for key in MEASURES}
        for n in VARIANTS
        if n != "bare"
    }
    bare = {key: statistics.median(r["bare"][key] for r in rounds[1:]) for key in MEASURES}
    once = {}
    for probe, key in ONCE.items():
        k = next(k for k, n in enumerate(names) if probe in VARIANTS[n])  # the later ones do not measure
        once[probe] = rounds[k // len(VARIANTS)][names[k]][key] - bare[key]
    return costs, bare, once


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
        costs, bare, once = probe_costs(runs + "/probes", setup)
        name = setup.label.replace(" ", "_")
        print(f"step_ms_bare_{name}: {bare['step'] * 1e3:.2f} ms")
        print(f"step_cpu_ms_bare_{name}: {bare['cpu'] * 1e3:.2f} ms")
        print(f"loop_ms_bare_{name}: {bare['loop'] * 1e3:.2f} ms")
        for probe, cost in costs.items():
            print(f"probe_cost_{probe}: {cost['step']:+.3f} of a step")
            print(f"probe_cpu_cost_{probe}: {cost['cpu']:+.3f} of a step's CPU time")
            print(f"probe_loop_cost_{probe}: {cost['loop']:+.3f} of a loop period")
        for probe, seconds in once.items():
            print(f"{probe}_once_per_config: {seconds:.3f} s")
        instrumented = costs["instrumented"]
        print(f"instrumented_over_bare: {1 / (1 + instrumented['step']):.3f} ratio")
        print(f"instrumented_over_bare_cpu: {1 / (1 + instrumented['cpu']):.3f} ratio")
        print(f"instrumented_over_bare_loop: {1 / (1 + instrumented['loop']):.3f} ratio")


if __name__ == "__main__":
    main()
