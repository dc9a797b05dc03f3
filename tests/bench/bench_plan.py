"""Planner speed: setups evaluated per second by ``kit.planning.plan.search`` (target >= 50,000/s), the
``zerokit plan --json`` wall time, and the plan panel with its default settings: its first update (with the
search's share of it) and a refresh (target <= 0.3 s, so it follows its controls live); medians of 3
runs."""

import contextlib
import io
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
    first, search, refresh = panel_refresh()
    print(f"plan_panel_first: {first:.3f} s")
    print(f"plan_panel_first_search: {search:.3f} s")
    print(f"plan_panel_refresh: {refresh:.3f} s")
    print(f"plan_panel_refresh_over_target: {refresh / PANEL_TARGET_S:.2f} ratio")


def panel_refresh() -> tuple[float, float, float]:
    """Seconds of ``PlanPanel.update`` with the default settings (figures drawn with Agg, outside a
    kernel, where ``display`` prints: silenced): the first (it searches, ``Plan.seconds``, and confirms
    the rows it names), then the median of 3 with the same inputs (no search: the goal and limits only
    filter)."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    from kit.lab.plan_panel import PlanPanel

    with contextlib.redirect_stdout(io.StringIO()):
        start = time.perf_counter()
        panel = PlanPanel()  # its first update
        first = time.perf_counter() - start
        walls = []
        for _ in range(3):
            start = time.perf_counter()
            panel.update()
            walls.append(time.perf_counter() - start)
    return first, panel.plan.seconds, statistics.median(walls)
