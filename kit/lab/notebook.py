"""What every notebook shares: its sizes (``profile``), in one place. Small under ``ZEROKIT_SMOKE=1``
(what ``make test`` runs: a tiny GPT-2 on 2 CPU ranks for 2 steps, records in a temporary folder), real
otherwise (GPT-2 small's shape on the 8 GPUs of a box, 10 steps, records under ``runs/``).

A notebook's ``parameters`` cell reads it once and everything after uses it::

    SMOKE = os.environ.get("ZEROKIT_SMOKE") == "1"  # or set True: the CPU-sized run
    RUN = profile("02", SMOKE)                        # from kit.lab.notebook import profile
    toy = RUN.toy_setup(zero={"precision": "bf16"})   # the toy GPT on RUN.nprocs ranks
    run_sweep(setups, sweep="02-stages", runs_dir=RUN.runs_dir, nprocs=RUN.nprocs, steps=RUN.steps)

Even the small profile teaches with real numbers: every byte the ranks hold is measured and compared
with the estimate, only the model, the ranks and the steps are few.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

from kit.models import toy_spec
from kit.run.sweep import TOY_ZERO
from kit.schema import Setup

#: the environment variable ``make test`` sets
SMOKE_ENV = "ZEROKIT_SMOKE"
#: the toy GPT's shape: tiny for CPU ranks, GPT-2 small's on GPUs (``kit.models.toy_spec``'s arguments)
SMOKE_TOY = {"layers": 2, "hidden": 64, "heads": 4, "vocab": 512, "seq_len": 64}
REAL_TOY = {"layers": 12, "hidden": 768, "heads": 12, "vocab": 50257, "seq_len": 1024}


@dataclass(frozen=True)
class Profile:
    """How big a notebook's real runs are: ``nprocs`` ranks, ``steps`` measured steps (after the sweep's
    warm-up), ``micro_batch`` per rank, the toy GPT's ``toy`` shape, and ``runs_dir`` for the records."""

    smoke: bool
    nprocs: int
    steps: int
    micro_batch: int
    toy: dict
    runs_dir: str

    def toy_setup(self, **sections) -> Setup:
        """The toy GPT on one node of ``nprocs`` ranks at ``micro_batch``, with ``TOY_ZERO``'s buckets;
        ``sections`` (``zero=``, ``batch=``) change its fields as ``Setup.replace`` does."""
        base = self.local(Setup(model=toy_spec(**self.toy), batch={"micro_batch": self.micro_batch}))
        return base.replace(**sections) if sections else base

    def local(self, setup: Setup) -> Setup:
        """``setup`` on this machine: one node of ``nprocs`` ranks, with ``TOY_ZERO``'s small buckets (a
        CPU rank has no room for DeepSpeed's default 500M-element ones); its batch per rank is kept."""
        return setup.replace(cluster={"nodes": 1, "gpus_per_node": self.nprocs}, zero=TOY_ZERO, batch={})


def profile(notebook: str, smoke: bool | None = None) -> Profile:
    """The profile of notebook ``notebook`` (its number, e.g. ``"02"``: it names the temporary folder);
    ``smoke`` None reads ``ZEROKIT_SMOKE`` ("1": the small one)."""
    if smoke is None:
        smoke = os.environ.get(SMOKE_ENV) == "1"
    if smoke:
        runs = tempfile.mkdtemp(prefix=f"zerokit-{notebook}-")
        return Profile(True, nprocs=2, steps=2, micro_batch=2, toy=dict(SMOKE_TOY), runs_dir=runs)
    return Profile(False, nprocs=8, steps=10, micro_batch=8, toy=dict(REAL_TOY), runs_dir="runs")
