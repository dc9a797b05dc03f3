"""The global batch: one batch split every way (``batch_splits``), a batch schedule step by step with its
estimate (``schedule_table``) and the largest micro batch that fits, without and with activation
checkpointing (``largest_micro_batches``).

What it cannot see: the measured steps; ``run_sweep`` runs the splits and a schedule, and
``kit.lab.tables.schedules_side_by_side`` reads a schedule's records back.
"""

from __future__ import annotations

import pandas as pd

from kit.lab.notebook import record
from kit.schema import Setup
from kit.units import whole_number


def batch_splits(setup: Setup, micro_batch: int = 4) -> list[Setup]:
    """One global batch split every way a power of two allows (micro ``micro_batch`` x GAS 1, half of it x
    GAS 2, ... micro 1), then micro ``micro_batch`` x GAS 2: twice the batch by accumulation alone."""
    whole_number("micro_batch", micro_batch, 1)
    splits, micro = [], micro_batch
    while micro >= 1 and micro_batch % micro == 0:
        splits.append((micro, micro_batch // micro))
        micro //= 2
    splits.append((micro_batch, 2))
    return [setup.replace(batch={"micro_batch": m, "grad_accum": g}) for m, g in splits]


def schedule_table(setup: Setup, accelerator: str = "cuda") -> pd.DataFrame:
    """A batch schedule step by step: from which step each batch holds (micro batch, grad accum, global
    batch) and the estimate's MiB per GPU there (``Setup.batch_states``, ``kit.estimate``). ``accelerator``
    ``"cpu"``: ranks on CPU (``kit.run.launcher.ranks_accelerator()``), the estimate per rank without a
    GPU's CUDA context and NCCL buffers (``Estimate.on_accelerator``), headed "estimate MiB per rank"."""
    from kit.estimate import estimate

    header = "estimate MiB/GPU" if accelerator == "cuda" else "estimate MiB per rank"
    rows = []
    for step, s in setup.batch_states():
        batch = s.batch.model_dump(exclude={"schedule", "seq_len"})
        per_device = estimate(s).on_accelerator(accelerator).per_gpu_bytes
        rows.append({"from step": step, **batch, header: per_device / 2**20})
    return pd.DataFrame(rows)


def largest_micro_batches(setup: Setup) -> pd.DataFrame:
    """The largest micro batch per GPU of ``setup`` that fits its GPU (``boundary.largest_micro_batch``;
    0: not even 1 does), without activation checkpointing and with it (``setup``'s policy, else every
    block)."""
    from kit.planning import boundary

    return record(
        {
            f"{label} activation checkpointing": boundary.largest_micro_batch(
                setup.replace(zero=setup.zero.checkpointing(on))
            )
            for label, on in (("without", False), ("with", True))
        },
        "largest micro batch that fits",
    )
