"""ZeRO++: ZeRO-3 beside hpZ, qwZ, qgZ and all three, estimated (``zeropp_table``: memory, the ZeRO++
paper's cross-node volumes, this model's bytes inside and across nodes) and measured on simulated nodes
(``zeropp_measured``).

What it cannot see: a real fabric; simulated nodes share one machine, so their bytes are measured, not
their speed.
"""

from __future__ import annotations

import pandas as pd

from kit.components import Component
from kit.schema import Setup
from kit.steptime.comm import comm_by_scope


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
                "parameters_gib": e.components[Component.PARAMETERS] / 2**30,
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
                "parameters measured": r["measured"][Component.PARAMETERS],
                "parameters estimated": rank_states(setup, r["rank"])["device"][Component.PARAMETERS],
                "intra-node sent": r["comm_scope_wire_bytes"]["intra"],
                "intra-node predicted": predicted["intra"],
                "inter-node sent": r["comm_scope_wire_bytes"]["inter"],
                "inter-node predicted": predicted["inter"],
            }
        )
    return pd.DataFrame(rows).sort_values(["label", "rank", "step"], ignore_index=True)
