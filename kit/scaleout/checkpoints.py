"""DeepSpeed checkpoints through the kit: save, look at, resume and consolidate them.

A ZeRO checkpoint is a folder per tag (``global_step<k>``) plus a ``latest`` file naming the tag.
Stages 0-2 write one model-states file (16-bit weights, written by rank 0) and, from stage 1 (or with
bf16), one optimizer-states file per rank (its fp32 master partition and Adam moments). Stage 3 writes
one small model-states file per rank (partitioned weights are placeholders) and one optimizer-states
file per rank. ``zero_to_fp32`` (copied next to the tags) merges the partitions into one fp32 state
dict. ``run_roundtrip`` shows all of it on real ranks; ``kit.estimate.checkpoint_size`` predicts the sizes.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from kit.schema import Setup
from kit.specs import RoundtripConfig, RoundtripSpec

#: the per-rank script, run as a module (``--module``) so that kit/ itself is not put on sys.path
WORKER = "kit.ranks.checkpoint_worker"


def file_kind(path: str) -> str:
    """``model_states``, ``optim_states``, ``latest`` or ``script`` (``zero_to_fp32.py`` and friends)."""
    name = os.path.basename(path)
    if name.endswith("_model_states.pt"):
        return "model_states"
    if name.endswith("_optim_states.pt"):
        return "optim_states"
    if name == "latest":
        return "latest"
    return "script" if name.endswith(".py") else "other"


def checkpoint_layout(ckpt_dir: str | os.PathLike):
    """Every file of a checkpoint folder as a DataFrame: path, tag, kind, rank (of per-rank files), bytes."""
    import pandas as pd

    root = Path(ckpt_dir)
    if not root.is_dir():
        raise ValueError(f"ckpt_dir: {root} is not a folder")
    rows = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root)
        rank = re.search(r"zero_pp_rank_(\d+)_", path.name)
        rows.append(
            {
                "path": str(rel),
                "tag": rel.parts[0] if len(rel.parts) > 1 else "",
                "kind": file_kind(path.name),
                "rank": int(rank.group(1)) if rank else None,
                "bytes": path.stat().st_size,
            }
        )
    return pd.DataFrame(rows, columns=["path", "tag", "kind", "rank", "bytes"]).astype({"rank": "Int64"})


def run_roundtrip(
    setups: list[Setup],
    ckpt_dir: str | os.PathLike,
    *,
    steps: int = 4,
    save_step: int = 2,
    seed: int = 0,
    timeout_s: float = 600.0,
    on_line=None,
) -> list[dict]:
    """Save, consolidate and resume each setup on real ranks; one report dict per setup.

    Each report has ``losses`` (uninterrupted), ``resumed_losses`` (after loading at ``save_step`` into
    an engine built from another seed) and ``resume_equal``; ``client_state`` as loaded;
    ``consolidated`` (``zero_to_fp32`` vs the live fp32 weights: ``equal``, ``max_abs_diff``); and
    ``files`` (path and bytes of every file written). Checkpoints stay in ``ckpt_dir/stage<k>-<i>``.
    """
    from kit.run.launcher import launch_argv, run_launch, worker_env

    if not setups:
        raise ValueError("setups: give at least one Setup")
    if not 1 <= save_step < steps:
        raise ValueError(f"save_step: must be in 1..{steps - 1} (steps={steps}), got {save_step}")
    worlds = {s.cluster.world_size for s in setups}
    if len(worlds) != 1:
        raise ValueError(f"cluster: all setups must have the same world size, got {sorted(worlds)}")
    nprocs = worlds.pop()
    root = Path(ckpt_dir)
    root.mkdir(parents=True, exist_ok=True)
    out = root / "roundtrip.jsonl"
    out.unlink(missing_ok=True)
    configs = tuple(RoundtripConfig(name=f"stage{s.zero.stage}-{i}", setup=s) for i, s in enumerate(setups))
    spec = RoundtripSpec(
        dir=str(root), out=str(out), steps=steps, save_step=save_step, seed=seed, configs=configs
    )
    spec_path = spec.write(root / "roundtrip-spec.json")
    argv = launch_argv(WORKER, ["--spec", str(spec_path)], nprocs)
    rc, output = run_launch(argv, worker_env(nprocs), timeout_s, on_line)
    reports = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    if rc != 0 or len(reports) != len(setups):
        tail = " | ".join(output.strip().splitlines()[-5:])
        raise RuntimeError(f"checkpoint round trip failed (exit status {rc}, {len(reports)} reports): {tail}")
    return reports


#: seconds a consolidation runs before its progress line shows (``consolidate(progress=True)``): a small
#: checkpoint, merged in well under a second, prints nothing
PROGRESS_DELAY_S = 1.0


def consolidate(
    ckpt_dir: str | os.PathLike,
    tag: str | None = None,
    out: str | os.PathLike | None = None,
    progress: bool = False,
):
    """One fp32 state dict from a ZeRO checkpoint (DeepSpeed's ``zero_to_fp32``); saved to ``out`` if given.

    Runs in this process (it only reads files): no ranks, no GPU. Tied weights appear under each of
    their names, as the same tensor (see ``unique_numel``). ``progress``: one tqdm line on stderr through
    loading the shards, gathering stage 3's weights and saving, shown once the consolidation has run
    ``PROGRESS_DELAY_S`` (``zerokit checkpoint consolidate``: a terminal's); by default nothing, as a
    notebook wants (no stderr, no red block): zero_to_fp32's own bars stay off either way.
    """
    import contextlib
    import io
    from unittest import mock

    import torch
    from deepspeed.utils import zero_to_fp32

    if not (Path(ckpt_dir) / (tag or "latest")).exists():
        raise ValueError(f"ckpt_dir: no {'tag ' + tag if tag else 'latest'} in {ckpt_dir}")
    # zero_to_fp32 prints its progress ("Processing zero checkpoint ...", "Detected checkpoint of type zero
    # stage N", "Reconstructed fp32 state dict with ...") and draws tqdm bars on stderr ("Loading checkpoint
    # shards", "Gathering sharded weights": a red block in a notebook): what the returned dict says, noise
    # in a terminal and a notebook; kept out (its tqdm replaced by one line of ours, off unless asked, the
    # prints swallowed), a failure still raises
    line = _ProgressLine(progress)
    try:
        with mock.patch.object(zero_to_fp32, "tqdm", line), contextlib.redirect_stdout(io.StringIO()):
            state = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(str(ckpt_dir), tag=tag)
        if out is not None:
            line.step(f"saving {Path(out).name}")
            torch.save(state, out)
            line.bar.update()
    finally:
        line.bar.close()
    return state


class _ProgressLine:
    """What ``consolidate`` puts in place of zero_to_fp32's ``tqdm``: each loop it wraps (the shards it
    loads, stage 3's weights it gathers) advances one bar, its description the loop's, its total growing
    as each loop starts, so a whole consolidation is one line; disabled, nothing is drawn."""

    def __init__(self, enabled: bool):
        from tqdm import tqdm

        self.bar = tqdm(
            total=0, desc="consolidate", unit="step", disable=not enabled, delay=PROGRESS_DELAY_S, leave=True
        )

    def __call__(self, iterable, desc: str = "", **_):
        items = list(iterable)
        self.step(desc.lower(), len(items))
        for item in items:
            yield item
            self.bar.update()

    def step(self, what: str, count: int = 1) -> None:
        """A new part of the work: ``count`` more steps, the line saying ``what``."""
        self.bar.total += count
        self.bar.set_description(f"consolidate: {what}" if what else "consolidate", refresh=False)
        self.bar.update(0)  # redrawn now where the line already shows (or its delay is over)


def unique_numel(state: dict) -> int:
    """Elements of a state dict counting tied weights (tensors starting at the same address) once."""
    return sum({t.data_ptr(): t.numel() for t in state.values()}.values())
