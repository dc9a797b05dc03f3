"""Planner speed: setups evaluated per second by ``kit.estimate.plan.search`` (target >= 10,000/s, so the
notebook's planner stays live) and the ``zerokit plan --json`` wall time, median of a few runs."""

import statistics
import subprocess
import sys
import time

from kit import Setup
from kit.estimate import plan
from kit.estimate.memory import estimate
from kit.models import preset


def main() -> None:
    rates, counts = [], []
    for model in ("llama-2-7b", "llama-2-70b"):
        setup = Setup(model=preset(model), batch={"micro_batch": 1, "seq_len": 4096})
        estimate(setup)  # the model's tensor list is counted once, outside the timing
        runs = [plan.search(setup, train_batch=plan.DEFAULT_TRAIN_BATCH) for _ in range(3)]
        rate = statistics.median(r.setups_per_s for r in runs)
        rates.append(rate)
        counts.append(len(runs[0].table))
        print(f"plan_search_{model.replace('-', '')}_setups: {len(runs[0].table)} setups")
        print(f"plan_search_{model.replace('-', '')}_rate: {rate:,.0f} setups/s")
    cli = [sys.executable, "-m", "kit", "plan", "--model", "llama-2-7b", "--seq-len", "4096", "--json"]
    walls = []
    for _ in range(3):
        start = time.perf_counter()
        subprocess.run(cli, check=True, capture_output=True)
        walls.append(time.perf_counter() - start)
    print(f"zerokit_plan_json_wall: {statistics.median(walls):.2f} s")
    print(f"plan_rate_over_target: {min(rates) / 10_000:.2f} ratio")
