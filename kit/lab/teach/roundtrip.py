"""Checkpoints: a round trip's reports read back (``roundtrip_table``, ``resume_losses``), the files it
wrote beside the predicted sizes (``checkpoint_sizes``), and one checkpoint's size per stage before
training, per file kind (``checkpoint_size_table``) and in all (``per_checkpoint``).

What it cannot see: the ranks; ``kit.scaleout.checkpoints`` runs the round trip and writes its reports.
"""

from __future__ import annotations

import pandas as pd

from kit.lab.notebook import record
from kit.schema import Setup
from kit.units import GIB, size


def roundtrip_table(reports: list[dict]) -> pd.DataFrame:
    """Per setup of a checkpoint round trip (``kit.scaleout.checkpoints.run_roundtrip``): the client state
    read back, whether resuming equals the uninterrupted run, and ``zero_to_fp32`` the live fp32 weights."""
    return pd.DataFrame(
        {
            "setup": r["label"],
            "client state": r["client_state"],
            "resumed = uninterrupted": r["resume_equal"],
            "zero_to_fp32 = live fp32": r["consolidated"]["equal"],
        }
        for r in reports
    )


def resume_losses(reports: list[dict], save_step: int) -> pd.DataFrame:
    """The loss per step of every round trip, uninterrupted beside resumed (from step ``save_step + 1`` on),
    its index the steps counted from 1 as every view counts the measured steps."""
    steps = len(reports[0]["losses"])
    index = pd.RangeIndex(1, steps + 1, name="step")
    losses = pd.DataFrame({r["label"]: r["losses"] for r in reports}, index=index)
    for r in reports:
        losses[r["label"] + " (resumed)"] = [None] * save_step + r["resumed_losses"]
    return losses


def checkpoint_sizes(reports: list[dict], setups: list[Setup], folder) -> pd.DataFrame:
    """Per setup and file kind, the bytes ``kit.estimate.checkpoint_size`` predicts for one file beside the
    largest file of that kind the round trip wrote (``checkpoint_layout`` of ``folder / report name``):
    bytes, not MiB, so that a difference of a few bytes of pickled metadata shows."""
    from pathlib import Path

    from kit.estimate.checkpoint_size import checkpoint_bytes
    from kit.scaleout.checkpoints import checkpoint_layout

    rows = []
    for r, s in zip(reports, setups, strict=True):
        predicted, written = checkpoint_bytes(s), checkpoint_layout(Path(folder) / r["name"])
        for kind in ("model_states", "optim_states"):
            files = written[written["kind"] == kind]["bytes"]
            rows.append(
                {
                    "setup": r["label"],
                    "file": kind,
                    "predicted bytes": predicted[kind]["bytes"],
                    "written bytes": files.max(),
                }
            )
    return pd.DataFrame(rows)


def checkpoint_size_table(setup: Setup, stages: tuple[int, ...] = (0, 1, 2, 3)) -> pd.DataFrame:
    """What one checkpoint of ``setup`` takes on disk at each stage, per file kind: the number of files,
    the size of one (``kit.units.size``: MiB below a GiB, a stage-3 model file holds placeholders only;
    a dash where there is none), GiB in all, and the formula (``kit.estimate.checkpoint_size``)."""
    from kit.estimate.checkpoint_size import checkpoint_bytes

    rows = []
    for stage in stages:
        sizes = checkpoint_bytes(setup.replace(zero={"stage": stage}))
        for kind in ("model_states", "optim_states"):
            k = sizes[kind]
            rows.append(
                {
                    "stage": stage,
                    "file": kind,
                    "files": k["files"],
                    "size per file": size(k["bytes"]) if k["files"] else None,
                    "GiB in all": k["files"] * k["bytes"] / GIB,
                    "formula": k["formula"],
                }
            )
    return pd.DataFrame(rows)


def per_checkpoint(sizes: pd.DataFrame) -> pd.DataFrame:
    """GiB one checkpoint takes per stage: the ``GiB in all`` of a ``checkpoint_size_table``, summed."""
    totals = sizes.groupby("stage")["GiB in all"].sum()
    return record(dict(totals.items()), "GiB per checkpoint", index="stage")
