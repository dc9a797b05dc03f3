"""The notebooks' small comparison tables, so that a cell only calls one: the ZeRO paper's model states
beside DeepSpeed's per stage (01), each ZeRO-3 collective and the step time of a setting beside its ZeRO++
variant (09), a batch schedule's steps side by side and the checkpointing policies (04), the published
runs beside the kit's predictions and what it cannot express yet (11), what a trace of a model file
measured and the sequence-parallel sizes (07), a step time's parts and assumptions and ``tune``'s
candidates (08). Each is a DataFrame a test can read, its units in its headers (or, where its rows differ,
in each row's name); 11's answer is one paragraph."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING

import pandas as pd

from kit.components import Component
from kit.lab.notebook import record
from kit.schema import Setup
from kit.units import GIB, MIB

if TYPE_CHECKING:
    from kit.estimate.trace import Trace
    from kit.run.tune import Tuned
    from kit.steptime.perf import StepTime

#: ``kit.steptime.perf.Assumptions``' fields as a reader reads them: the row's name with its unit, and the
#: factor to it (a ratio as a percentage); a field not named here shows under its own name
ASSUMPTIONS = {
    "efficiency": ("GEMM efficiency: achieved / peak TFLOP/s, %", 100),
    "link_efficiency": ("link efficiency: achieved / nominal bandwidth, %", 100),
    "overlap": ("overlapped communication that hides behind compute, %", 100),
    "host_memory_gbps": ("host memory bandwidth for CPU Adam, GB/s", 1),
}


def fit_text(verdict) -> str:
    """A verdict as a table cell: "yes", "no", or "yes, flushing" where it fits only by the allocator's
    flushes (its bytes then are what the allocator holds within the memory)."""
    return ("yes, flushing" if verdict.flushes else "yes") if verdict.ok else "no"


def paper_vs_deepspeed(setup: Setup, stages: Sequence[int] = (1, 2, 3)) -> pd.DataFrame:
    """Per ZeRO stage of ``setup``: model states by the ZeRO paper's formula (``formula="zero-paper"``)
    beside DeepSpeed's (what it allocates) and the predicted peak per GPU with DeepSpeed, in GB (1e9 bytes,
    the paper's unit), one row per setting's label."""
    from kit.estimate import estimate

    rows = {}
    for stage in stages:
        s = setup.replace(zero={"stage": stage})
        faithful = estimate(s)
        rows[s.label] = {
            "paper's states GB": estimate(s, formula="zero-paper").model_states_bytes / 1e9,
            "DeepSpeed's states GB": faithful.model_states_bytes / 1e9,
            "peak / GPU GB": faithful.per_gpu_bytes / 1e9,
        }
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("setting")


def collectives_table(setups: Sequence[Setup]) -> pd.DataFrame:
    """Each setting's collectives per optimizer step (``kit.steptime.comm.collectives``): scope (inside
    the node or across nodes), GiB per GPU and the formula."""
    from kit.steptime import comm

    rows = [
        {
            "setting": s.label,
            "collective": c.name,
            "scope": c.scope,
            "GiB": c.bytes / GIB,
            "formula": c.formula,
        }
        for s in setups
        for c in comm.collectives(s)
    ]
    return pd.DataFrame(rows)


def step_time_table(setups: Sequence[Setup]) -> pd.DataFrame:
    """Each setting's step time (``kit.steptime.perf.step_time``): the step, its compute, all its
    communication and the part of it the step waits for, in seconds."""
    from kit.steptime import perf

    rows = []
    for s in setups:
        t = perf.step_time(s)
        rows.append(
            {
                "setting": s.label,
                "step s": t.step_s,
                "compute s": t.compute.seconds,
                "comm s": t.comm.seconds,
                "exposed comm s": t.exposed_comm.seconds,
            }
        )
    return pd.DataFrame(rows).set_index("setting")


def step_parts(step: StepTime) -> pd.DataFrame:
    """The parts of a step time (``kit.steptime.perf.step_time``), one row each: seconds and formula."""
    parts = step.to_dict()["parts"]
    return pd.DataFrame([{"part": name.replace("_", " "), **part} for name, part in parts.items()]).set_index(
        "part"
    )


def assumptions(step: StepTime) -> pd.DataFrame:
    """What a step time assumed (``kit.steptime.perf.Assumptions``) as a small table: efficiencies as
    percentages, bandwidths in GB/s (``ASSUMPTIONS``)."""
    rows = {}
    for name, value in asdict(step.assumptions).items():
        label, factor = ASSUMPTIONS.get(name, (name.replace("_", " "), 1))
        rows[label] = round(value * factor, 9)  # 0.8 x 100 is 80.00000000000001
    return record(rows, "assumed", index="kit.steptime.perf.Assumptions")


def trace_table(trace: Trace | None) -> pd.DataFrame:
    """What the trace of one micro batch measured (``kit.estimate.trace``): the bytes autograd saves for
    backward, with every block checkpointed, the peak of live tensors and the transient above what is
    saved (in GiB from 1 GiB, else MiB), the blocks of the model's largest ``ModuleList`` and the trace's
    seconds."""
    if trace is None:
        raise ValueError("trace: this estimate used formulas, not a trace (a model file or config traces)")
    unit, scale = ("GiB", GIB) if trace.peak_bytes >= GIB else ("MiB", MIB)
    return record(
        {
            f"saved for backward, {unit}": trace.saved_bytes / scale,
            f"saved with every block checkpointed, {unit}": trace.checkpointed_bytes / scale,
            f"peak of live tensors, {unit}": trace.peak_bytes / scale,
            f"transient: the peak above what is saved, {unit}": trace.transient_bytes / scale,
            "blocks (the largest ModuleList)": trace.blocks,
            "seconds the trace took": trace.seconds,
        },
        "one micro batch",
        index="trace",
    )


def tune_table(tuned: Tuned) -> pd.DataFrame:
    """``tune``'s candidates (``Tuned.table``) as a reader reads them: rank, setting (its label names the
    stage, offload and batch, so the columns that repeat them are left out and the table fits the page),
    the estimate in GiB, the measured samples/s, the status, the predicted and measured seconds per step
    and the prediction's error in %."""
    t = tuned.table
    return pd.DataFrame(
        {
            "rank": t["rank"],
            "setting": t["label"],
            "estimate GiB": t["estimated_gib"],
            "samples/s": t["samples_per_s"],
            "status": t["status"],
            "predicted s": t["predicted_s"],
            "measured s": t["measured_s"],
            "error %": 100 * t["error"],
        }
    )


def checkpointing_policies(setup: Setup) -> pd.DataFrame:
    """Per activation checkpointing choice (``kit.checkpointing.CHOICES``) of ``setup``: its activations
    and predicted peak per GPU (GiB), whether that fits the cluster's GPU, the largest micro batch that
    does, and the compute a token costs beside no checkpointing (the recomputed forward, by FLOPs); a
    choice the estimate cannot model for this model says why instead."""
    from kit import checkpointing
    from kit.estimate import estimate
    from kit.fit import estimate_fit, shown_bytes
    from kit.planning import boundary
    from kit.steptime import perf

    plain = perf.flops_per_token(setup.replace(zero=setup.zero.checkpointing(False)))[0]
    rows: dict[str, dict[str, object]] = {}
    for label, value in checkpointing.CHOICES:
        s = setup.replace(zero=checkpointing.choice(setup.zero, value))
        try:
            e = estimate(s)
        except ValueError as error:
            rows[label] = {"why not": str(error)}
            continue
        rows[label] = {
            "activations GiB": e.components[Component.ACTIVATIONS] / GIB,
            "peak / GPU GiB": shown_bytes(e, estimate_fit(e)) / GIB,
            "fits": fit_text(estimate_fit(e)),
            "largest micro batch": boundary.largest_micro_batch(s),
            "compute per token": f"{perf.flops_per_token(s)[0] / plain:.2f}x",
        }
    return pd.DataFrame.from_dict(rows, orient="index").round(2)


def trainable_subsets(setup: Setup) -> pd.DataFrame:
    """Per choice of what trains (``kit.trainable.CHOICES``) of ``setup``: the parameters that train, the
    model states and activations per GPU and the predicted peak (GiB), whether it fits the cluster's
    GPU, and the step time (the datasheet's); a choice the kit cannot model for this model says why."""
    from kit import trainable
    from kit.estimate import estimate, partition
    from kit.fit import estimate_fit, shown_bytes
    from kit.steptime import calibrated

    rows: dict[str, dict[str, object]] = {}
    for label, value in trainable.CHOICES:
        try:
            s = setup.replace(zero=dict(zip(trainable.FIELDS, value, strict=True)))
            e = estimate(s)
        except ValueError as error:
            rows[label] = {"why not": str(error)}
            continue
        rows[label] = {
            "trainable": f"{partition.trainable_params(s):,}",
            "model states GiB": e.model_states_bytes / GIB,
            "activations GiB": e.components[Component.ACTIVATIONS] / GIB,
            "peak / GPU GiB": shown_bytes(e, estimate_fit(e)) / GIB,
            "fits": fit_text(estimate_fit(e)),
            "step s": calibrated.step_time(s).step_s,
        }
    return pd.DataFrame.from_dict(rows, orient="index").round(2)


def loss_choices(setup: Setup) -> pd.DataFrame:
    """Per loss (``kit.loss.CHOICES``) of ``setup``: the activations, the forward's and the backward's peak
    and the predicted peak per GPU (GiB), and whether it fits the cluster's GPU."""
    from kit.estimate import estimate
    from kit.fit import estimate_fit, shown_bytes
    from kit.loss import CHOICES

    rows = {}
    for label, value in CHOICES:
        e = estimate(setup.replace(zero={"loss": value}))
        phases = e.timeline.totals
        rows[label] = {
            "activations GiB": e.components[Component.ACTIVATIONS] / GIB,
            "forward peak GiB": phases["forward"] / GIB,
            "backward peak GiB": phases["backward"] / GIB,
            "peak / GPU GiB": shown_bytes(e, estimate_fit(e)) / GIB,
            "fits": fit_text(estimate_fit(e)),
        }
    return pd.DataFrame.from_dict(rows, orient="index").round(2)


def sequence_parallel_choices(setup: Setup, sizes: Sequence[int] | None = None) -> pd.DataFrame:
    """Per sequence-parallel size of ``setup`` (DeepSpeed's Ulysses, ``kit.sequence_parallel``), one row
    ``sp N`` training the same global batch (gradient accumulation makes up for fewer data-parallel
    groups): the tokens a rank holds outside attention (its ``seq_len / sp`` part x micro batch), the
    data-parallel groups (``Setup.dp``), gradient accumulation, the activations, the forward's and the
    backward's peak and the predicted peak per GPU (GiB), the MB (1e6 bytes) a GPU sends in Ulysses'
    all-to-alls per step (``kit.steptime.comm.all_to_all``) and whether it fits the cluster's GPU.
    ``sizes`` None: every power of two up to the GPUs that the Setup accepts (those it refuses are left
    out); a size given that it refuses raises its one-line reason."""
    from kit.estimate import estimate
    from kit.fit import estimate_fit, shown_bytes
    from kit.steptime.comm import all_to_all

    world = setup.cluster.world_size
    candidates = [2**n for n in range(world.bit_length())] if sizes is None else sizes
    rows = {}
    for sp in candidates:
        try:
            s = setup.replace(
                zero={"sequence_parallel_size": sp}, batch={"train_batch": setup.batch.train_batch}
            )
        except ValueError:
            if sizes is not None:
                raise
            continue
        e = estimate(s)
        phases, exchange = e.timeline.totals, all_to_all(s)
        rows[f"sp {sp}"] = {
            "tokens per rank": s.rank_seq_len * s.batch.micro_batch,
            "data-parallel groups": s.dp,
            "grad accum": s.batch.grad_accum,
            "activations GiB": e.components[Component.ACTIVATIONS] / GIB,
            "forward peak GiB": phases["forward"] / GIB,
            "backward peak GiB": phases["backward"] / GIB,
            "peak / GPU GiB": shown_bytes(e, estimate_fit(e)) / GIB,
            "all-to-all MB per step": (exchange.bytes if exchange else 0) / 1e6,
            "fits": fit_text(estimate_fit(e)),
        }
    return pd.DataFrame.from_dict(rows, orient="index").round(2)


def schedules_side_by_side(results, labels: Sequence[str]) -> pd.DataFrame:
    """Rank 0's measured steps of the configurations ``labels`` of a sweep, one column group per value
    (global batch, grad accum, micro batch, loss) and one column per configuration under it."""
    steps = results.steps()
    steps = steps[steps["label"].isin(list(labels))]
    if steps.empty:
        raise ValueError(f"labels: none of {list(labels)} has an ok step in the sweep")
    return steps.pivot_table(
        index="step", columns="label", values=["train_batch", "grad_accum", "micro_batch", "loss"]
    )[["train_batch", "grad_accum", "micro_batch", "loss"]]
