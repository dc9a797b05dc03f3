"""Estimator speed: one in-process estimate (target < 1 ms, so widgets update live) and the CLI's wall
time as a ratio to ``python -c "import torch"`` (target < 0.15: the estimate path imports no torch, and
each command imports only its own group of ``kit.cli``).

The two commands run in turns (a load on the machine slows both alike), each with its bytecode cached as
an installed package has it: torch's wheel comes compiled, and PYTHONDONTWRITEBYTECODE (set in some
sandboxes) would otherwise recompile kit's ~45 modules from source on every run.
"""

import os
import statistics
import subprocess
import sys
import time

from kit import Setup
from kit.estimate import estimate
from kit.models import preset
from kit.run.calibrate import median_seconds


def main() -> None:
    setup = Setup(
        model=preset("llama-2-70b"),
        cluster={"nodes": 8, "gpus_per_node": 8},
        zero={"stage": 3},
        batch={"micro_batch": 1, "seq_len": 4096},
    )
    one = median_seconds(lambda: estimate(setup), 200)
    print(f"estimate_llama70b_64gpu_stage3: {one * 1e3:.3f} ms")
    cli = [sys.executable, "-m", "kit", "estimate", "--model", "llama-2-70b", "--stage", "3", "--json"]
    torch = [sys.executable, "-c", "import torch"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    walls: dict[int, list[float]] = {0: [], 1: []}
    for i in range(12):  # the first of each writes the bytecode cache and is not counted
        for which, argv in enumerate((cli, torch)):
            start = time.perf_counter()
            subprocess.run(argv, check=True, capture_output=True, env=env)
            if i:
                walls[which].append(time.perf_counter() - start)
    cli_s, torch_s = statistics.median(walls[0]), statistics.median(walls[1])
    print(f"zerokit_estimate_wall: {cli_s:.3f} s")
    print(f"import_torch_wall: {torch_s:.3f} s")
    print(f"zerokit_estimate_over_import_torch: {cli_s / torch_s:.3f} ratio")
