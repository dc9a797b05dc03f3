"""Planner speed: setups evaluated per second by ``kit.planning.plan.search`` (target >= 50,000/s), the
``zerokit plan --json`` wall time, and one refresh of the plan panel with its default settings (target
<= 0.3 s, so it follows its controls live) with the search's share of it; medians of 3 runs."""

import os
import statistics
import subprocess
import sys
import time

from kit import Setup
from kit.estimate.memory import estimate
from kit.models import preset
from kit.planning import plan

RATE_TARGET = 50_000
PANEL_TARGET_S = 0.3


def main() -> None:
    rates = []
    for model in ("llama-2-7b", "llama-2-70b"):
        setup = Setup(model=preset(model), batch={"micro_batch": 1, "seq_len": 4096})
        estimate(setup)  # the model's tensor list is counted once, outside the timing
        runs = [plan.search(setup, train_batch=plan.DEFAULT_TRAIN_BATCH) for _ in range(3)]
        rate = statistics.median(r.setups_per_s for r in runs)
        rates.append(rate)
        print(f"plan_search_{model.replace('-', '')}_setups: {len(runs[0].table)} setups")
        print(f"plan_search_{model.replace('-', '')}_rate: {rate:,.0f} setups/s")
    cli = [sys.executable, "-m", "kit", "plan", "--model", "llama-2-7b", "--seq-len", "4096", "--json"]
    walls = []
    for _ in range(3):
        start = time.perf_counter()
        subprocess.run(cli, check=True, capture_output=True)
        walls.append(time.perf_counter() - start)
    print(f"zerokit_plan_json_wall: {statistics.median(walls):.2f} s")
    print(f"plan_rate_over_target: {min(rates) / RATE_TARGET:.2f} ratio")
    refresh, search = panel_refresh()
    print(f"plan_panel_refresh: {refresh:.3f} s")
    print(f"plan_panel_refresh_search: {search:.3f} s")
    print(f"plan_panel_refresh_over_target: {refresh / PANEL_TARGET_S:.2f} ratio")


def panel_refresh() -> tuple[float, float]:
    """Seconds of one ``PlanPanel.update`` with the default settings (figures drawn with Agg, outside a
    kernel), and of the ``plan.search`` inside it (``Plan.seconds``); medians of 3 after a first refresh."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    from kit.lab.plan_panel import PlanPanel

    panel = PlanPanel()
    walls, searched = [], []
    for _ in range(3):
        start = time.perf_counter()
        panel.update()
        walls.append(time.perf_counter() - start)
        searched.append(panel.plan.seconds)
    return statistics.median(walls), statistics.median(searched)
