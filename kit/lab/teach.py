"""Tables and pictures the tutorials teach with: ranks, shards, bytes per parameter, what fits where, and
the few sweeps and reports the notebooks run (batch splits, checkpoint round trips, a calibration).

Every number comes from ``kit`` (the batch math, ``kit.estimate``, ``kit.run``, ``kit.scaleout``); these
functions only arrange it for reading, so that a notebook's cells stay a few lines. Figures are static
matplotlib; tables are pandas DataFrames. Bytes measured beside the estimate: ``Results.states()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from kit.components import MODEL_STATES
from kit.ds_keys import EXAMPLE_NVME_PATH
from kit.rules import FP32, SHARDED, element_bytes, master_bytes, optimizer_states
from kit.schema import Setup
from kit.steptime.comm import comm_by_scope
from kit.units import whole_number

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from kit.run.results import Results

#: the fp32 tensors Adam keeps per parameter (torch.optim.AdamW's state names)
ADAM_STATES = ("fp32 momentum (exp_avg)", "fp32 variance (exp_avg_sq)")
#: ZeRO paper (arXiv 1910.02054) Table 1: 7.5B parameters, data-parallel degrees, GB = 1e9 bytes.
PAPER_PARAMS = 7_500_000_000
PAPER_DPS = (1, 4, 16, 64, 256, 1024)
PAPER_STAGES = {0: "baseline DP", 1: "P_os (ZeRO-1)", 2: "P_os+g (ZeRO-2)", 3: "P_os+g+p (ZeRO-3)"}
#: the paper's per-device model-state formula for each stage (Psi parameters, N ranks, K = 12)
PAPER_FORMULAS = {
    0: "2Ψ + 2Ψ + KΨ",
    1: "2Ψ + 2Ψ + KΨ/N",
    2: "2Ψ + (2+K)Ψ/N",
    3: "(2+2+K)Ψ/N",
}
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


def rank_table(nodes: int, gpus_per_node: int) -> pd.DataFrame:
    """One row per process: ``rank = node_rank * gpus_per_node + local_rank`` (DeepSpeed and torchrun).

    ``world_size`` is every process in the job; ``local_rank`` picks the GPU inside its node.
    """
    whole_number("nodes", nodes, 1)
    whole_number("gpus_per_node", gpus_per_node, 1)
    rows = [
        {
            "node_rank": node,
            "local_rank": local,
            "rank": node * gpus_per_node + local,
            "world_size": nodes * gpus_per_node,
        }
        for node in range(nodes)
        for local in range(gpus_per_node)
    ]
    return pd.DataFrame(rows)


def bytes_per_param(precision: str = "bf16", optimizer: str = "adamw", momentum: float = 0.0) -> pd.DataFrame:
    """What one trainable parameter costs in model states (ZeRO paper section 3.1, K = optimizer bytes).

    Mixed precision keeps 16-bit weights and gradients plus an fp32 master copy that the optimizer
    updates; Adam adds two fp32 moments (K = 4 + 4 + 4 = 12, 16 bytes in all). fp32 training needs no
    master copy. SGD keeps a momentum buffer only when ``momentum > 0``.
    """
    if precision not in ("fp32", "fp16", "bf16"):
        raise ValueError(f"precision: choose fp32, fp16 or bf16, got {precision!r}")
    if optimizer not in ("adam", "adamw", "sgd"):
        raise ValueError(f"optimizer: choose adam, adamw or sgd, got {optimizer!r}")
    width = element_bytes(precision)
    rows = [
        ("parameters", f"{precision} weights", width),
        ("gradients", f"{precision} gradients", width),
    ]
    if master_bytes(precision):
        rows.append(("optimizer_states", "fp32 master weights", master_bytes(precision)))
    names = ADAM_STATES if optimizer in ("adam", "adamw") else ("fp32 momentum buffer",)
    rows += [("optimizer_states", name, FP32) for name in names[: optimizer_states(optimizer, momentum)]]
    table = pd.DataFrame(rows, columns=["component", "tensor", "bytes_per_param"])
    total = pd.DataFrame([("total", "", int(table["bytes_per_param"].sum()))], columns=table.columns)
    return pd.concat([table, total], ignore_index=True)


def shards_held(stage: int, ranks: int) -> pd.DataFrame:
    """Which of the ``ranks`` equal shards of each model state every rank holds at a ZeRO stage.

    Index: rank; columns: parameters, gradients, optimizer_states; each cell a list of shard indices.
    A sharded state keeps only the rank's own shard; an unsharded one is replicated (every shard).
    """
    _stage(stage)
    whole_number("ranks", ranks, 1)
    every = list(range(ranks))
    rows = {r: {s: [r] if s in SHARDED[stage] else every for s in MODEL_STATES} for r in range(ranks)}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "rank"
    return table


def shard_figure(ranks: int = 4, stages: tuple[int, ...] = (0, 1, 2, 3), precision: str = "bf16") -> Figure:
    """A picture of ``shards_held``: one panel per stage, one row per rank, widths to scale in bytes.

    Block widths follow mixed-precision Adam's bytes per parameter (2 : 2 : 12), like the ZeRO paper's
    Figure 1; filled cells are the shards a rank holds, empty ones live on other ranks.
    """
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    from kit.lab.plots import COLORS

    widths = bytes_per_param(precision).iloc[:-1].groupby("component", sort=False)["bytes_per_param"].sum()
    fig = Figure(figsize=(9, 1.0 + 0.45 * ranks * len(stages)))
    axes = fig.subplots(len(stages), 1, squeeze=False)
    for ax, stage in zip(axes[:, 0], stages, strict=True):
        held = shards_held(stage, ranks)
        for rank in range(ranks):
            x = 0.0
            for state in MODEL_STATES:
                cell = widths[state] / ranks
                for shard in range(ranks):
                    filled = shard in held.loc[rank, state]
                    ax.barh(
                        rank,
                        cell,
                        left=x + shard * cell,
                        height=0.7,
                        color=COLORS[state] if filled else "white",
                        edgecolor="black",
                        linewidth=0.4,
                    )
                x += widths[state] + 0.4
        ax.set_yticks(range(ranks), [f"rank {r}" for r in range(ranks)])
        ax.invert_yaxis()
        ax.set_xticks([])
        ax.set_title(f"stage {stage} ({PAPER_STAGES[stage]}): {PAPER_FORMULAS[stage]} per GPU", fontsize=10)
        for side in ("top", "right", "bottom"):
            ax.spines[side].set_visible(False)
    legend = [Patch(color=COLORS[s], label=s.replace("_", " ")) for s in MODEL_STATES]
    legend.append(Patch(facecolor="white", edgecolor="black", label="held by another rank"))
    fig.legend(handles=legend, loc="lower center", ncol=4, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def zero_paper_table(params: int = PAPER_PARAMS, dps: tuple[int, ...] = PAPER_DPS) -> pd.DataFrame:
    """The ZeRO paper's Table 1: model-state GB (1e9 bytes) per device, stage x data-parallel degree.

    Computed by ``estimate(setup, formula="zero-paper")`` with fp16 Adam (K = 12), as in the paper.
    """
    from kit import models
    from kit.estimate import estimate

    base = Setup(
        model=models.from_count(params),
        cluster={"nodes": 1, "gpus_per_node": 1, "gpu": "V100-SXM2-32GB"},
        zero={"precision": "fp16", "optimizer": "adam"},
        batch={"micro_batch": 1},
    )
    rows = {}
    for stage, name in PAPER_STAGES.items():
        row = {}
        for dp in dps:
            gpus = dp if dp <= 8 else 8
            if dp % gpus:
                raise ValueError(f"dps: data-parallel degrees above 8 must be multiples of 8, got {dp}")
            setup = base.replace(
                cluster={"nodes": dp // gpus, "gpus_per_node": gpus}, zero={"stage": stage}, batch={}
            )
            row[dp] = estimate(setup, formula="zero-paper").model_states_bytes / 1e9
        rows[name] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.columns.name = "GPUs (Nd)"
    return table


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


def _stage(stage: int) -> None:
    if stage not in SHARDED:
        raise ValueError(f"stage: choose 0, 1, 2 or 3, got {stage!r}")


def zeropp_table(setup: Setup) -> pd.DataFrame:
    """ZeRO-3 beside its ZeRO++ variants for ``setup``'s model and cluster (``kit.grid.zeropp_variants``):
    memory per GPU, the ZeRO++ paper's cross-node volume per collective in units of M (16-bit model bytes;
    ``kit.rules.zeropp_paper_volume``: 3 M for ZeRO-3, 0.5 + 0 + 0.25 = 0.75 M for all three) and this
    model's bytes per GPU per step inside the node and across nodes (``kit.steptime.comm.collectives``)
    with the communication time of the step-time model."""
    from kit import grid
    from kit.estimate import estimate
    from kit.rules import ZERO3_COLLECTIVES, zeropp_paper_volume
    from kit.steptime import perf

    rows = []
    for name, change in grid.zeropp_variants(setup.cluster.gpus_per_node).items():
        s = setup.replace(
            zero={
                "stage": 3,
                "hpz_partition_size": 1,
                "quantized_weights": False,
                "quantized_gradients": False,
            }
            | change
        )
        z, e = s.zero, estimate(s)
        paper = zeropp_paper_volume(z.hpz_partition_size > 1, z.quantized_weights, z.quantized_gradients)
        scope = comm_by_scope(s)
        rows.append(
            {
                "setting": name,
                "label": s.label,
                "per_gpu_gib": e.per_gpu_bytes / 2**30,
                "parameters_gib": e.components["parameters"] / 2**30,
                **{f"paper {c} (M)": paper[c] for c in ZERO3_COLLECTIVES},
                "paper cross-node (M)": sum(paper.values()),
                "intra-node GiB/GPU": scope["intra"] / 2**30,
                "inter-node GiB/GPU": scope["inter"] / 2**30,
                "comm s": perf.step_time(s).comm.seconds,
            }
        )
    return pd.DataFrame(rows)


def zeropp_measured(records: list[dict]) -> pd.DataFrame:
    """Per configuration and rank of a multi-node run (``kit.run.local_nodes``): parameter bytes
    measured beside ``rank_states`` (hpZ's secondary partition included), and the bytes sent per step
    inside the node and across nodes, measured (``comm_scope_wire_bytes``) beside
    ``kit.steptime.comm.comm_by_scope``."""
    from kit.estimate import rank_states

    rows = []
    for r in records:
        if r.get("status") != "ok":
            continue
        setup = Setup.model_validate(r["setup"])
        predicted = comm_by_scope(setup)
        rows.append(
            {
                "label": r["label"],
                "rank": r["rank"],
                "step": r["step"],
                "parameters measured": r["measured"]["parameters"],
                "parameters estimated": rank_states(setup, r["rank"])["device"]["parameters"],
                "intra-node sent": r["comm_scope_wire_bytes"]["intra"],
                "intra-node predicted": predicted["intra"],
                "inter-node sent": r["comm_scope_wire_bytes"]["inter"],
                "inter-node predicted": predicted["inter"],
            }
        )
    return pd.DataFrame(rows).sort_values(["label", "rank", "step"], ignore_index=True)


def infinity_table(batch: int = 32, gpu_batch: int = 4, seq: int = 1024, ci: int = 1) -> pd.DataFrame:
    """The ZeRO-Infinity paper's memory requirements per model size (its Figure 2a,
    ``kit.estimate.infinity``): model states and activation checkpoints in TiB for the whole model,
    working memory per GPU in GiB."""
    from kit.estimate import infinity

    rows = []
    for name, (layers, hidden, heads) in infinity.PAPER_MODELS.items():
        m = infinity.memory(layers, hidden, heads, batch=batch, gpu_batch=gpu_batch, seq=seq, ci=ci)
        rows.append(
            {
                "model": name,
                "params (T)": m.params / 1e12,
                "layers": layers,
                "hidden": hidden,
                "heads": heads,
                "model states (TiB)": m.model_states / 2**40,
                "act. checkpoints (TiB)": m.activation_checkpoints / 2**40,
                "model-state working mem per GPU (GiB)": m.model_state_working / 2**30,
                "act. working mem per GPU (GiB)": m.activation_working / 2**30,
            }
        )
    return pd.DataFrame(rows).set_index("model")


def infinity_bandwidth(
    batches: tuple[int, ...] = (1, 2, 4, 8, 16),
    hidden: int = 2048,
    seq: int = 1024,
    peak_tflops: float = 70.0,
) -> pd.DataFrame:
    """GB/s each tier needs for 50% and 90% efficiency (the paper's section 4, ``kit.estimate.infinity``):
    parameters and gradients and optimizer states per batch size per GPU, activation checkpoints at
    ``hidden``."""
    from kit.estimate import infinity

    rows = []
    for tier in ("params_grads", "optimizer_states", "activation_checkpoints"):
        for b in batches if tier != "activation_checkpoints" else (1,):
            ait = infinity.intensity(tier, seq=seq, batch=b, hidden=hidden)
            row = {"tier": tier, "batch per GPU": b if tier != "activation_checkpoints" else None, "ait": ait}
            for e in (0.5, 0.9):
                row[f"GB/s for {e:.0%}"] = infinity.bandwidth_for(e, ait, peak_tflops)
            rows.append(row)
    return pd.DataFrame(rows)


def nvme_table(setup: Setup, nvme_path: str = EXAMPLE_NVME_PATH) -> pd.DataFrame:
    """Stage 3 with CPU offload beside ZeRO-Infinity's NVMe offload for ``setup``'s model and cluster:
    GiB per GPU, pinned CPU RAM and swap files per node, predicted step time and slowdown vs CPU offload
    (``kit.estimate``, ``kit.steptime.perf``; parameter ``buffer_size`` sized to the largest tensor)."""
    from kit.estimate import estimate, partition
    from kit.steptime import perf

    base = setup.replace(zero={"stage": 3})
    size = max(base.zero.buffer_size, partition.largest_tensor(base))
    variants = {
        "CPU: optimizer": {"offload_optimizer": "cpu", "offload_param": "none"},
        "CPU: optimizer + params": {"offload_optimizer": "cpu", "offload_param": "cpu"},
        "NVMe: optimizer": {"offload_optimizer": "nvme", "offload_param": "none"},
        "NVMe: optimizer + params": {"offload_optimizer": "nvme", "offload_param": "nvme"},
    }
    rows, steps = [], {}
    for name, zero in variants.items():
        s = base.replace(zero={**zero, "nvme_path": nvme_path, "buffer_size": size})
        e, t = estimate(s), perf.step_time(s)
        steps[name] = t.step_s
        rows.append(
            {
                "variant": name,
                "GPU GiB": e.per_gpu_bytes / 2**30,
                "CPU RAM GiB per node": e.cpu_bytes_per_node / 2**30,
                "NVMe GiB per node": e.nvme_bytes_per_node / 2**30,
                "step s": t.step_s,
                "slowdown vs CPU": t.step_s / steps[name.replace("NVMe", "CPU")],
            }
        )
    return pd.DataFrame(rows).set_index("variant")


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
                "buffers GiB": e.components["buffers"] / 2**30,
                "CPU RAM GiB per node": e.cpu_bytes_per_node / 2**30,
            }
        )
        rows.append(row)
    return pd.DataFrame(rows)


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


def roundtrip_table(reports: list[dict]) -> pd.DataFrame:
    """Per setup of a checkpoint round trip (``kit.scaleout.checkpoints.run_roundtrip``): the client state
    read back, whether resuming equals the uninterrupted run, and ``zero_to_fp32`` the live fp32 weights."""
    return pd.DataFrame(
        {
            "setup": r["label"],
            "client_state": r["client_state"],
            "resumed = uninterrupted": r["resume_equal"],
            "zero_to_fp32 = live fp32": r["consolidated"]["equal"],
        }
        for r in reports
    )


def resume_losses(reports: list[dict], save_step: int) -> pd.DataFrame:
    """The loss per step of every round trip, uninterrupted beside resumed (from ``save_step`` on)."""
    steps = len(reports[0]["losses"])
    losses = pd.DataFrame({r["label"]: r["losses"] for r in reports}, index=pd.RangeIndex(steps, name="step"))
    for r in reports:
        losses[r["label"] + " (resumed)"] = [None] * save_step + r["resumed_losses"]
    return losses


def checkpoint_sizes(reports: list[dict], setups: list[Setup], folder) -> pd.DataFrame:
    """Per setup and file kind, the bytes ``kit.estimate.checkpoint_size`` predicts for one file beside the
    largest file of that kind the round trip wrote (``checkpoint_layout`` of ``folder / report name``)."""
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
                    "predicted": predicted[kind]["bytes"],
                    "written": files.max(),
                }
            )
    return pd.DataFrame(rows)


def checkpoint_size_table(setup: Setup, stages: tuple[int, ...] = (0, 1, 2, 3)) -> pd.DataFrame:
    """What one checkpoint of ``setup`` takes on disk at each stage, per file kind: the number of files,
    GB (1e9 bytes) per file and in all, and the formula (``kit.estimate.checkpoint_size``)."""
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
                    "GB per file": k["bytes"] / 1e9,
                    "GB all": k["files"] * k["bytes"] / 1e9,
                    "formula": k["formula"],
                }
            )
    return pd.DataFrame(rows)


def bucket_grid(setup: Setup, reduce_buckets, prefetch_buckets) -> list[Setup]:
    """Stage 3 of ``setup`` with every reduce bucket size beside every prefetch bucket size (elements)."""
    return [
        setup.replace(zero={"stage": 3, "reduce_bucket_size": r, "prefetch_bucket_size": p})
        for r in reduce_buckets
        for p in prefetch_buckets
    ]


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


def schedule_table(setup: Setup) -> pd.DataFrame:
    """A batch schedule step by step: from which step each batch holds (micro batch, grad accum, global
    batch) and the estimate's MiB per GPU there (``Setup.batch_states``, ``kit.estimate``)."""
    from kit.estimate import estimate

    rows = []
    for step, s in setup.batch_states():
        batch = s.batch.model_dump(exclude={"schedule", "seq_len"})
        rows.append({"from step": step, **batch, "estimate MiB/GPU": estimate(s).per_gpu_bytes / 2**20})
    return pd.DataFrame(rows)


def peak_table(results: Results) -> pd.DataFrame:
    """Per configuration (rank 0, its last step measured with the memory timeline) and phase of the step:
    the device-tensor MiB measured and predicted (``kit.estimate.peak``), their difference, and the
    phase the prediction peaks in."""
    from kit.lab.comparison_panel import peak_records, record_timeline
    from kit.units import MIB

    rows = []
    records = peak_records(results)
    for r, name in zip(records, _names(records), strict=True):
        line = record_timeline(r)
        for phase, predicted in line.totals.items():
            measured = r["measured"]["phases"][phase]
            rows.append({
                "configuration": name, "phase": phase, "measured MiB": measured / MIB,
                "predicted MiB": predicted / MIB, "difference %": 100 * (measured / predicted - 1),
                "peak": "<- peak" if phase == line.peak_phase else "", "moment": line.moments[phase],
            })  # fmt: skip
    return pd.DataFrame(rows)


def peak_terms(results: Results, phase: str) -> pd.DataFrame:
    """What is live at ``phase``'s predicted peak moment, MiB by category, one column per configuration
    (rank 0), with each configuration's moment and its buffers' formula below."""
    from kit.estimate.peak import CATEGORIES
    from kit.lab.comparison_panel import peak_records, record_timeline
    from kit.units import MIB

    columns = {}
    records = peak_records(results)
    for r, name in zip(records, _names(records), strict=True):
        line = record_timeline(r)
        terms = line.phases[phase]
        column: dict[str, object] = {c: round(terms[c].bytes / MIB, 3) for c in CATEGORIES}
        column["total"] = round(line.totals[phase] / MIB, 3)
        column["moment"] = line.moments[phase]
        column["buffers formula"] = terms["buffers"].formula or "none"
        columns[name] = column
    return pd.DataFrame(columns)


def _names(records: list[dict]) -> list[str]:
    """Each record's label, with the ZeRO settings that tell apart records sharing one (a bucket size)."""
    names = []
    for r in records:
        twins = [o["setup"]["zero"] for o in records if o["label"] == r["label"]]
        differ = [k for k, v in r["setup"]["zero"].items() if any(t[k] != v for t in twins)]
        shown = (
            f"{k}={v:,}" if type(v) is int else f"{k}={v}"
            for k, v in r["setup"]["zero"].items()
            if k in differ
        )
        names.append(" ".join([r["label"], *shown]))
    return names
