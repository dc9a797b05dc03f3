"""Bytes one rank keeps on NVMe: the swap files DeepSpeed's ZeRO-Infinity swappers write under nvme_path.

DeepSpeed 0.19 lays them out as (``deepspeed/runtime/swap_tensor/``):

- ``<nvme_path>/zero_stage_3/<dtype>params/rank<r>/<ds_id>_param.tensor.swp``: one 16-bit parameter
  partition each (``partitioned_param_swapper.py``);
- ``<nvme_path>/zero_stage_3/optimizer/rank<r>/<ds_id>.tensor.swp``: the fp32 master partition of a
  sub group and each of its optimizer states, and ``<ds_id>_gradient_<offset>_<length>.tensor.swp``:
  fp32 gradient pieces swapped during backward (``optimizer_utils.py``).

What this cannot see: bytes the file system allocates beyond a file's length (``st_size`` is counted,
not blocks), and files of other ranks or of a run that used another ``nvme_path``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from kit.components import MODEL_STATES, Component

#: DeepSpeed's folder for stage-3 swap files under nvme_path
STAGE3_FOLDER = "zero_stage_3"


def rank_folders(nvme_path: str | Path, rank: int) -> list[Path]:
    """This rank's swap folders that exist under ``nvme_path``."""
    base = Path(nvme_path) / STAGE3_FOLDER
    return sorted(p for p in base.glob(f"*/rank{rank}") if p.is_dir())


def swap_file_bytes(nvme_path: str | Path, rank: int) -> dict[str, int]:
    """``{parameters, gradients, optimizer_states}``: bytes of this rank's swap files, by what they hold."""
    out: dict[str, int] = dict.fromkeys(MODEL_STATES, 0)
    for folder in rank_folders(nvme_path, rank):
        for f in folder.glob("*.tensor.swp"):
            if folder.parent.name.endswith("params"):
                kind = Component.PARAMETERS
            elif "_gradient_" in f.name:
                kind = Component.GRADIENTS
            else:
                kind = Component.OPTIMIZER_STATES
            out[kind] += f.stat().st_size
    return out


def clear(nvme_path: str | Path, rank: int) -> None:
    """Remove this rank's swap folders (before a configuration starts, so that its files are its own;
    DeepSpeed's parameter swapper removes its own folder the same way when it starts)."""
    for folder in rank_folders(nvme_path, rank):
        shutil.rmtree(folder, ignore_errors=True)
