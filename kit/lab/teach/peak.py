"""The peak of a step, phase by phase: rank 0's measured MiB beside the predicted peak per configuration
and phase (``peak_table``) and what is live at a phase's predicted peak moment (``peak_terms``).

What it cannot see: ranks other than 0, and records measured without the memory timeline
(``run_sweep(..., memory_timeline=True)``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from kit.components import Component

if TYPE_CHECKING:
    from kit.run.results import Results


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
        column["buffers formula"] = terms[Component.BUFFERS].formula or "none"
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
