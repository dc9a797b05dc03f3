"""DDP, FSDP or ZeRO: a sweep's engines side by side, and what its own measurements say to choose.

``engines_table(results)`` has one row per configuration: its engine (PyTorch DDP / FSDP, or DeepSpeed
ZeRO and the stage), the model states and buffers rank 0 held (measured, and estimated), the bytes it
sent per step (measured, and estimated), and its speed. ``advice(results)`` turns the table into a
few sentences, every number from the table.
"""

from __future__ import annotations

import pandas as pd

from kit.components import HELD
from kit.rules import baseline_name
from kit.run.results import Results
from kit.schema import Setup
from kit.units import MB


def engines_table(results: Results) -> pd.DataFrame:
    """One row per ok configuration: ``configuration``, ``engine``, ``held MB`` (model states and buffers
    rank 0 held, measured), ``estimate MB``, ``wire MB/step`` (measured), ``estimate wire MB``,
    ``samples/s``, ``loss``."""
    summary = results.summary()
    ok = summary[summary["status"] == "ok"]
    if ok.empty:
        raise ValueError(f"results: no configuration ran in {results.path}; see results.summary()")
    setups = {r["config_id"]: Setup.model_validate(r["setup"]) for r in results.records if r.get("setup")}
    rows = []
    for _, row in ok.iterrows():
        z = setups[row["config_id"]].zero
        rows.append(
            {
                "configuration": row["label"],
                "engine": f"PyTorch {baseline_name(z.engine, z.stage)}"
                if z.engine != "deepspeed"
                else f"DeepSpeed ZeRO-{z.stage}",
                "held MB": sum(row[f"measured_{c}"] for c in HELD) / MB,
                "estimate MB": sum(row[f"estimate_{c}"] for c in HELD) / MB,
                "wire MB/step": row.get("comm_wire_bytes", float("nan")) / MB,
                "estimate wire MB": row.get("estimate_comm_wire_bytes", float("nan")) / MB,
                "samples/s": row["samples_per_s"],
                "loss": row["loss"],
            }
        )
    return pd.DataFrame(rows)


def advice(results: Results) -> str:
    """What this sweep's measurements say: the fastest and the leanest configuration, DDP against
    ZeRO-0 and FSDP against ZeRO-3 where both ran, and the rule that follows (markdown)."""
    table = engines_table(results)
    fastest = table.loc[table["samples/s"].idxmax()]
    leanest = table.loc[table["held MB"].idxmin()]
    lines = [
        f"- Fastest here: **{fastest['configuration']}** ({fastest['samples/s']:.1f} samples/s); fewest "
        f"bytes held per rank: **{leanest['configuration']}** ({leanest['held MB']:.2f} MB)."
    ]
    for baseline, zero, what in (
        ("PyTorch ddp", "DeepSpeed ZeRO-0", "replicate everything"),
        ("PyTorch fsdp", "DeepSpeed ZeRO-3", "shard parameters, gradients and optimizer states"),
        ("PyTorch fsdp-grad-op", "DeepSpeed ZeRO-2", "gather or hold parameters once per forward"),
    ):
        a, b = table[table["engine"] == baseline], table[table["engine"] == zero]
        if a.empty or b.empty:
            continue
        a, b = a.iloc[0], b.iloc[0]
        lines.append(
            f"- {a['configuration']} vs {b['configuration']} (both {what}): "
            f"{_ratio(a['held MB'], b['held MB'])} the bytes held, "
            f"{_ratio(a['wire MB/step'], b['wire MB/step'])} the bytes sent per step, "
            f"{_ratio(a['samples/s'], b['samples/s'])} the speed, loss {a['loss']:.4f} vs {b['loss']:.4f}."
        )
    lines.append(
        "- So: when the whole model's states fit a GPU with room for activations, the replicating engine "
        "that ran fastest above is the one to book; once they do not, shard (FSDP or ZeRO-3, the one "
        "faster here), and reach for ZeRO's offload (notebook 03) only when sharding over every GPU "
        "still does not fit."
    )
    return "\n".join(lines)


def _ratio(a: float, b: float) -> str:
    """``a / b`` to three significant digits (a toy's ZeRO-3 bucket can dwarf its states 1000 to 1)."""
    return f"{a / b:.3g}x" if b else "n/a (none to compare)"
