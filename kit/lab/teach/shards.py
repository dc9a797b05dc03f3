"""How ZeRO shards a model's states over the ranks: which rank is which (``rank_table``), what one
parameter costs (``bytes_per_param``), which shards each rank holds at each stage (``shards_held``,
``shard_figure``) and the ZeRO paper's Table 1 (``zero_paper_table``).

The bytes come from ``kit.rules`` and ``kit.estimate``; what it cannot see: activations, buffers and the
allocator, which the paper's model-state formulas leave out as well.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from kit.components import MODEL_STATES
from kit.rules import FP32, SHARDED, element_bytes, master_bytes, optimizer_states
from kit.schema import Setup
from kit.units import whole_number

if TYPE_CHECKING:
    from matplotlib.figure import Figure

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


def _stage(stage: int) -> None:
    if stage not in SHARDED:
        raise ValueError(f"stage: choose 0, 1, 2 or 3, got {stage!r}")
