"""``kit.run.tune`` beside DeepSpeed's own autotuner (``deepspeed --autotuning tune``, fast mode).

Same model (the kit's toy GPT-2, fp32), same search space (ZeRO stages 0-3 x micro batches 1 and 2, the
global batch fixed at 2 per rank as the autotuner fixes it: micro batch 1 accumulates 2), the same
DeepSpeed defaults for the ZeRO buckets (fast mode replaces the ``zero_optimization`` section with the
stage alone), 2 CPU ranks, the same environment (``kit.run.launcher.worker_env``). zero-kit measures 3
steps after 2 of warm-up, the autotuner profiles steps 2-4. Prints both wall times, their ratio (target
<= 0.3), how many launches each made, and whether each tool's pick is the best by its own records.

The autotuner launches once per experiment (a model-info profile run, then one per stage and micro
batch) and polls its experiments every 5 s; on a CPU machine it needs ``LOCAL_SIZE`` (the CPU
accelerator's device count), no hostfile, ``deepspeed`` on PATH and ``tabulate``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from kit.ds_config import to_ds_config
from kit.models import toy_spec
from kit.run import launcher
from kit.run.tune import tune
from kit.schema import Setup

NPROCS = 2
STAGES = (0, 1, 2, 3)
MICRO_BATCHES = (1, 2)
WARMUP, STEPS = 2, 3
TIMEOUT_S = 1200.0
SCRIPT = Path(__file__).resolve().parent / "autotune_train.py"


def base_setup() -> Setup:
    return Setup(
        model=toy_spec(),
        cluster={"nodes": 1, "gpus_per_node": NPROCS},
        zero={"precision": "fp32"},
        batch={"micro_batch": 1, "grad_accum": 1},
    )


def run_zerokit(runs: Path) -> tuple[float, dict]:
    start = time.perf_counter()
    tuned = tune(
        base_setup(), stages=STAGES, offloads=("none",), micro_batches=MICRO_BATCHES, steps=STEPS,
        warmup=WARMUP, sweep="tune", runs_dir=runs, nprocs=NPROCS, progress=False,
    )  # fmt: skip
    wall = time.perf_counter() - start
    configs = [c for c in tuned.results.configs() if c["samples_per_s"] is not None]
    best = Setup.model_validate(max(configs, key=lambda c: c["samples_per_s"])["setup"])
    return wall, {
        "pick": _kit_name(tuned.best),
        "best": _kit_name(best),
        "launches": len(list(Path(tuned.records).parent.glob("launch-*.json"))),
    }


def _kit_name(setup: Setup) -> str:
    return f"stage{setup.zero.stage}_mb{setup.batch.micro_batch}"


def autotuner_config(folder: Path) -> Path:
    """The user's ds_config for ``deepspeed --autotuning tune``: the kit's own for the toy (torch Adam,
    fp32), with lists for the stage and the micro batch and the autotuning section."""
    config = to_ds_config(base_setup(), torch_adam=True)
    config.pop("train_batch_size")
    config["train_micro_batch_size_per_gpu"] = list(MICRO_BATCHES)
    config["gradient_accumulation_steps"] = 1
    config["zero_optimization"] = {"stage": list(STAGES)}
    config["autotuning"] = {
        "enabled": True,
        "fast": True,
        "metric": "throughput",
        "start_profile_step": WARMUP,
        "end_profile_step": WARMUP + STEPS - 1,
        "results_dir": str(folder / "autotuning_results"),
        "exps_dir": str(folder / "autotuning_exps"),
        "overwrite": True,
    }
    path = folder / "ds_config.json"
    path.write_text(json.dumps(config, indent=1))
    return path


def run_autotuner(folder: Path) -> tuple[float, dict]:
    config = autotuner_config(folder)
    deepspeed = Path(sys.executable).parent / "deepspeed"
    argv = [str(deepspeed), "--autotuning", "tune", "--num_gpus", str(NPROCS)]
    argv += ["--master_port", str(launcher.free_port()), str(SCRIPT), "--deepspeed_config", str(config)]
    env = launcher.worker_env(NPROCS)
    env["PATH"] = os.pathsep.join([str(deepspeed.parent), env.get("PATH", "")])
    env["LOCAL_SIZE"] = str(NPROCS)
    start = time.perf_counter()
    rc, output = launcher.run_launch(argv, env, TIMEOUT_S, cwd=folder)
    wall = time.perf_counter() - start
    results = folder / "autotuning_results"
    optimal = results / "ds_config_optimal.json"
    if rc != 0 or not optimal.exists():
        tail = "\n".join(output.splitlines()[-20:])
        raise RuntimeError(f"deepspeed --autotuning tune failed (status {rc}):\n{tail}")
    measured = {}  # experiment -> its metric, from each experiment's own metrics.json
    for metrics in results.glob("*/metrics.json"):
        exp = json.loads((metrics.parent / "exp.json").read_text())
        measured[_ds_name(exp["ds_config"])] = json.loads(metrics.read_text())["throughput"]
    launches = sum(1 for d in results.iterdir() if (d / "cmd.txt").exists())
    pick = _ds_name(json.loads(optimal.read_text()))
    return wall, {"pick": pick, "best": max(measured, key=measured.get), "launches": launches}


def _ds_name(config: dict) -> str:
    stage = config.get("zero_optimization", {}).get("stage", 0)
    return f"stage{stage}_mb{config['train_micro_batch_size_per_gpu']}"


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ours, mine = run_zerokit(Path(tmp) / "runs")
        folder = Path(tmp) / "autotuner"
        folder.mkdir()
        theirs, ds = run_autotuner(folder)
    print(f"zerokit_tune_wall: {ours:.1f} s")
    print(f"deepspeed_autotuner_wall: {theirs:.1f} s")
    print(f"zerokit_over_autotuner: {ours / theirs:.2f} ratio")
    print(f"zerokit_tune_launches: {mine['launches']} launches")
    print(f"deepspeed_autotuner_launches: {ds['launches']} launches")
    for name, found in (("zerokit", mine), ("deepspeed_autotuner", ds)):
        print(f"{name}_pick_is_best_by_own_records: {int(found['pick'] == found['best'])} bool")
        print(f"{name}_pick: {found['pick']} config")
        print(f"{name}_best_by_own_records: {found['best']} config")


if __name__ == "__main__":
    main()
