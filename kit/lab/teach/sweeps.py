"""Sweeps and their tables: several comparisons measured in one launch (``run_together``), stage 3's
bucket sizes crossed (``bucket_grid``), one row per measured configuration (``sweep_table``) or per
estimate (``estimates_table``), the bytes each configuration sent beside the first's (``wire_table``).

What it cannot see: ranks other than 0 in ``sweep_table`` (its medians are over rank 0's measured steps;
``Results.states()`` sets every rank beside its estimate).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from kit.components import Component
from kit.schema import Setup
from kit.units import MB

if TYPE_CHECKING:
    from kit.run.results import Results

#: what ``sweep_table`` shows by default: time, and model states measured on rank 0 (device and host)
SWEEP_METRICS = (
    "step_time_s",
    "samples_per_s",
    "measured_parameters",
    "measured_gradients",
    "measured_optimizer_states",
    "measured_buffers",
    "measured_host_optimizer_states",
    "measured_host_parameters",
)


def run_together(groups: dict[str, list[Setup]], *, sweep: str, runs_dir, nprocs: int, **options) -> dict:
    """The Setups of several comparisons measured in one launch (``run_sweep``: the ranks start once, not
    once per comparison), the ``Results`` split back per comparison; ``options`` go to ``run_sweep``."""
    from kit.run.results import Results
    from kit.run.sweep import config_id, on_ranks, run_sweep

    every = [s for group in groups.values() for s in group]
    results = run_sweep(every, sweep=sweep, runs_dir=runs_dir, nprocs=nprocs, **options)
    out = {}
    for name, group in groups.items():
        ids = {config_id(on_ranks(s, nprocs)) for s in group}
        out[name] = Results([r for r in results.records if r["config_id"] in ids], results.path)
    return out


def bucket_grid(setup: Setup, reduce_buckets, prefetch_buckets) -> list[Setup]:
    """Stage 3 of ``setup`` with every reduce bucket size beside every prefetch bucket size (elements)."""
    return [
        setup.replace(zero={"stage": 3, "reduce_bucket_size": r, "prefetch_bucket_size": p})
        for r in reduce_buckets
        for p in prefetch_buckets
    ]


def sweep_table(results: Results, settings: tuple[str, ...] = (), metrics: tuple[str, ...] = SWEEP_METRICS):
    """One row per configuration of a sweep: its label, the Setup fields named in ``settings``
    (dotted, e.g. ``"zero.reduce_bucket_size"``) and the median of each metric over rank 0's measured
    steps (any ``Results.df`` column: ``step_time_s``, ``measured_buffers``, ``loss``...).

    Labels name stage, offload, precision and batch; ``settings`` shows what else a sweep varies.
    """
    steps = results.steps()
    if steps.empty:
        raise ValueError(f"results: no ok step records in {results.path}; see results.summary() for errors")
    columns = {f"setup_{name.replace('.', '_')}": name for name in settings}
    missing = [c for c in [*columns, *metrics] if c not in steps.columns]
    if missing:
        raise ValueError(f"settings/metrics: no column {', '.join(missing)} in the sweep's records")
    groups = steps.groupby("order", sort=True)
    table = groups[["label", *columns]].first().rename(columns=columns)
    return table.join(groups[list(metrics)].median()).reset_index(drop=True)


def wire_table(results: Results) -> pd.DataFrame:
    """Per configuration of a sweep: the MB (1e6 bytes) rank 0 sent per step on the wire (median over its
    measured steps, DeepSpeed's communication logger or the baselines' hooks), and as a percentage of the
    first configuration's."""
    wire = sweep_table(results, metrics=("comm_wire_bytes",)).set_index("label")["comm_wire_bytes"]
    first = wire.iloc[0]
    if not first > 0:
        raise ValueError(f"results: {wire.index[0]} sent no bytes on the wire to compare with")
    table = pd.DataFrame({"MB sent per step": wire / MB, f"% of {wire.index[0]}": 100 * wire / first})
    return table.rename_axis("setting")


def estimates_table(estimates: list, settings: tuple[str, ...] = ()) -> pd.DataFrame:
    """One row per ``kit.estimate`` result: its label, the Setup fields named in ``settings`` (dotted, e.g.
    ``"zero.reduce_bucket_size"``), GiB per GPU, the model states and buffers on the GPU and the CPU RAM
    per node (offload's share)."""
    rows = []
    for e in estimates:
        row = {"label": e.setup.label}
        for name in settings:
            section, field = name.split(".")
            row[name] = getattr(getattr(e.setup, section), field)
        row.update(
            {
                "GPU GiB per rank": e.per_gpu_bytes / 2**30,
                "model states on GPU GiB": e.model_states_bytes / 2**30,
                "buffers GiB": e.components[Component.BUFFERS] / 2**30,
                "CPU RAM GiB per node": e.cpu_bytes_per_node / 2**30,
            }
        )
        rows.append(row)
    return pd.DataFrame(rows)
