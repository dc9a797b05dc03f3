"""The per-rank script of the checkpoint round trip: save, resume, consolidate, compare.

``kit.scaleout.checkpoints.run_roundtrip`` writes the spec and launches exactly this; by hand::

    DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 \\
        deepspeed --num_gpus 2 --module kit.ranks.checkpoint_worker --spec s.json

The spec is JSON: ``dir`` (checkpoints go to ``dir/<name>``), ``out`` (rank 0 appends one JSON line per
configuration), ``steps``, ``save_step``, ``seed`` and ``configs``, a list of ``{name, setup}``.
Per configuration: train ``steps`` steps, saving at ``save_step`` (tag ``global_step<k>``, client state
``{"global_step": k}``) and comparing DeepSpeed's ``zero_to_fp32`` consolidation with the live fp32
master weights; then build a fresh engine from another seed, load the checkpoint and train the
remaining steps: their losses must equal the uninterrupted run's.
"""

from __future__ import annotations

import json
import os
import sys

from kit.specs import RoundtripConfig, RoundtripSpec


def live_fp32(engine) -> dict:
    """Every parameter's full fp32 master weight (``safe_get_full_fp32_param``: a collective in stage 3)."""
    from deepspeed.utils import safe_get_full_fp32_param

    return {
        name: safe_get_full_fp32_param(p).detach().cpu().clone()
        for name, p in engine.module.named_parameters()
    }


def compare_consolidated(ckpt_dir: str, tag: str, live: dict) -> dict:
    """Consolidate with DeepSpeed's ``zero_to_fp32`` and compare with the live fp32 weights."""
    import torch

    from kit.scaleout.checkpoints import consolidate, unique_numel

    state = consolidate(ckpt_dir, tag)
    params = {k: v for k, v in state.items() if k in live}
    unequal = [k for k, v in live.items() if k not in params or not torch.equal(params[k].float(), v)]
    max_diff = max(
        (float((params[k].float() - v).abs().max()) for k, v in live.items() if k in params), default=0
    )
    return {
        "tensors": len(state),
        "numel": unique_numel(state),
        "dtypes": sorted({str(v.dtype).removeprefix("torch.") for v in state.values()}),
        "missing": sorted(set(live) - set(params)),
        "unequal": unequal,
        "max_abs_diff": max_diff,
        "equal": not unequal,
    }


def roundtrip(spec: RoundtripSpec, config: RoundtripConfig, rank: int, world: int) -> dict | None:
    """One configuration's save / consolidate / resume; the report on rank 0, None elsewhere."""
    import deepspeed.comm as dist

    from kit.ranks import engine as eng
    from kit.scaleout.checkpoints import checkpoint_layout

    setup = config.setup
    ckpt_dir = os.path.join(spec.dir, config.name)
    steps, k, seed = spec.steps, spec.save_step, spec.seed
    tag = f"global_step{k}"

    built = eng.build_engine(setup, seed)
    engine, workload = built.engine, built.workload
    losses, consolidated = [], None
    for step in range(steps):
        losses.append(eng.train_step(engine, workload, setup, step, rank, world, seed=seed))
        if step + 1 == k:
            engine.save_checkpoint(ckpt_dir, tag=tag, client_state={"global_step": k})
            if setup.zero.stage > 0:  # zero_to_fp32 reads ZeRO optimizer partitions
                live = live_fp32(engine)
                if rank == 0:
                    consolidated = compare_consolidated(ckpt_dir, tag, live)
            dist.barrier()
    eng.teardown(engine)
    del engine, built

    built = eng.build_engine(setup, seed + 1)
    engine = built.engine
    path, client = engine.load_checkpoint(ckpt_dir)
    resumed = [
        eng.train_step(engine, workload, setup, step, rank, world, seed=seed) for step in range(k, steps)
    ]
    eng.teardown(engine)
    del engine, built

    import torch
    from deepspeed.accelerator import get_accelerator

    same = torch.tensor([float(resumed == losses[k:])], device=get_accelerator().current_device_name())
    dist.all_reduce(same, op=dist.ReduceOp.MIN)
    if rank != 0:
        return None
    return {
        "name": config.name,
        "label": setup.label,
        "setup": setup.model_dump(),
        "stage": setup.zero.stage,
        "world_size": world,
        "tag": tag,
        "loaded_path": os.path.relpath(path, ckpt_dir) if path else None,
        "client_state": {"global_step": client.get("global_step")} if client else None,
        "losses": losses,
        "resumed_losses": resumed,
        "resume_equal": bool(same.item()),
        "consolidated": consolidated,
        "files": checkpoint_layout(ckpt_dir)[["path", "bytes"]].to_dict(orient="records"),
    }


def main(argv: list[str] | None = None) -> int:
    import deepspeed.comm as dist

    from kit.ranks import engine

    spec, rank, world = engine.join(argv, "Checkpoint round trip on this rank.", RoundtripSpec)
    for config in spec.configs:
        report = roundtrip(spec, config, rank, world)
        if report is not None:
            with open(spec.out, "a") as f:
                f.write(json.dumps(report) + "\n")
        dist.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
