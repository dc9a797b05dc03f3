"""Estimator speed: one in-process estimate (target < 1 ms, so widgets update live) and the CLI's wall
time as a ratio to ``python -c "import torch"`` (target well under 1: the estimate path imports no torch).
"""

import subprocess
import sys

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
    cli_s = median_seconds(lambda: subprocess.run(cli, check=True, capture_output=True), 5)
    torch_s = median_seconds(lambda: subprocess.run(torch, check=True, capture_output=True), 5)
    print(f"zerokit_estimate_wall: {cli_s:.3f} s")
    print(f"import_torch_wall: {torch_s:.3f} s")
    print(f"zerokit_estimate_over_import_torch: {cli_s / torch_s:.3f} ratio")
