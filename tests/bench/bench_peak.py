"""Cost of the memory timeline on 2 CPU ranks (``run_sweep(..., memory_timeline=True)``).

Per measured step, the wall time between rank 0's consecutive step events (the step, its profiler and
the replay of its event tree, the record) with the timeline over without it, median over the steps of
one launch each, for the toy GPT at stage 2 and stage 3. Above 1.05 the timeline stays a switch
(``zerokit run --memory-timeline``), off by default on CPU.
"""

import statistics
import tempfile
import time

from kit.run.sweep import run_sweep
from kit.toys import toy_setup

STEPS = 12


def seconds_per_step(runs_dir: str, stage: int, memory_timeline: bool) -> float:
    times: list[float] = []

    def on_event(event: dict) -> None:
        if event.get("event") == "step":
            times.append(time.perf_counter())

    setup = toy_setup(2).replace(zero={"stage": stage})
    name = f"z{stage}-{'timeline' if memory_timeline else 'plain'}"
    run_sweep(
        [setup], sweep=name, runs_dir=runs_dir, steps=STEPS, warmup=2, progress=False,
        memory_timeline=memory_timeline, on_event=on_event,
    )  # fmt: skip
    return statistics.median(b - a for a, b in zip(times, times[1:], strict=False))


def main() -> None:
    with tempfile.TemporaryDirectory() as runs:
        for stage in (2, 3):
            plain = seconds_per_step(runs, stage, False)
            timeline = seconds_per_step(runs, stage, True)
            print(f"step_s_plain_z{stage}: {plain * 1e3:.1f} ms")
            print(f"step_s_memory_timeline_z{stage}: {timeline * 1e3:.1f} ms")
            print(f"memory_timeline_over_plain_z{stage}: {timeline / plain:.2f} ratio")
