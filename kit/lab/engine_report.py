"""The engine report of a sweep: PyTorch's DDP and FSDP beside DeepSpeed's ZeRO stages, and what the
sweep's own measurements say to choose.

``engines_table(results)`` has one row per configuration: its engine (PyTorch DDP / FSDP, or DeepSpeed
ZeRO and the stage), the model states and buffers rank 0 held, measured beside the estimate
(``Results.states``), the bytes it sent per step (measured, and estimated), and its speed.
``advice(results)`` turns the table into a few sentences; every sentence, the conclusion included, is
read from the table, so other measurements give other advice.
"""

from __future__ import annotations

import pandas as pd

from kit.rules import baseline_name
from kit.run.results import Results
from kit.schema import Setup
from kit.units import MB, MIB

#: engines that do the same job, compared where both ran: (baseline, ZeRO counterpart, what both do)
COUNTERPARTS = (
    ("PyTorch ddp", "DeepSpeed ZeRO-0", "replicate everything"),
    ("PyTorch fsdp", "DeepSpeed ZeRO-3", "shard parameters, gradients and optimizer states"),
    ("PyTorch fsdp-grad-op", "DeepSpeed ZeRO-2", "gather or hold parameters once per forward"),
)


def engines_table(results: Results) -> pd.DataFrame:
    """One row per ok configuration: ``configuration``, ``engine``, ``held MiB`` (model states and buffers
    rank 0 held, measured; MiB as the estimates show memory), ``estimate MiB``, ``wire MB/step`` (measured;
    MB, 1e6 bytes, as traffic is counted), ``estimate wire MB``, ``samples/s``, ``loss``."""
    summary = results.summary()
    ok = summary[summary["status"] == "ok"]
    if ok.empty:
        raise ValueError(f"results: no configuration ran in {results.path}; see results.summary()")
    states = results.states().query("rank == 0 and where == 'device'")
    held = states.groupby("config_id")[["measured", "estimate"]].sum()
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
                "held MiB": held.loc[row["config_id"], "measured"] / MIB,
                "estimate MiB": held.loc[row["config_id"], "estimate"] / MIB,
                "wire MB/step": row.get("comm_wire_bytes", float("nan")) / MB,
                "estimate wire MB": row.get("estimate_comm_wire_bytes", float("nan")) / MB,
                "samples/s": row["samples_per_s"],
                "loss": row["loss"],
            }
        )
    return pd.DataFrame(rows)


def advice(results: Results) -> str:
    """What this sweep's measurements say (markdown): the fastest and the leanest configuration, each
    baseline against its ZeRO counterpart where both ran, and which configuration to book for the bytes
    a GPU has room for (the configurations no faster one holds fewer bytes than)."""
    table = engines_table(results)
    fastest = table.loc[table["samples/s"].idxmax()]
    leanest = table.loc[table["held MiB"].idxmin()]
    lines = [
        f"- Fastest here: **{fastest['configuration']}** ({fastest['samples/s']:.1f} samples/s); fewest "
        f"bytes held per rank: **{leanest['configuration']}** ({leanest['held MiB']:.2f} MiB)."
    ]
    for baseline, zero, what in COUNTERPARTS:
        a, b = table[table["engine"] == baseline], table[table["engine"] == zero]
        if a.empty or b.empty:
            continue
        a, b = a.iloc[0], b.iloc[0]
        lines.append(
            f"- {a['configuration']} vs {b['configuration']} (both {what}): "
            f"{_ratio(a['held MiB'], b['held MiB'])} the bytes held, "
            f"{_ratio(a['wire MB/step'], b['wire MB/step'])} the bytes sent per step, "
            f"{_ratio(a['samples/s'], b['samples/s'])} the speed, loss {a['loss']:.4f} vs {b['loss']:.4f}."
        )
    lines.append(_choice(table))
    return "\n".join(lines)


def _choice(table: pd.DataFrame) -> str:
    """Which configuration to book for the room a GPU has: walking from the fastest down, each one that
    holds fewer bytes than every faster one (the front of speed against bytes held)."""
    front: list[pd.Series] = []
    for _, row in table.sort_values("samples/s", ascending=False, kind="stable").iterrows():
        if not front or row["held MiB"] < front[-1]["held MiB"]:
            front.append(row)
    if len(front) == 1:
        (only,) = front
        return (
            f"- So: **{only['configuration']}** is both the fastest and the leanest here: book it wherever "
            f"its {only['held MiB']:.2f} MiB per rank and its activations fit."
        )
    steps = [
        f"{row['held MiB']:.2f} MiB or more: **{row['configuration']}** ({row['samples/s']:.1f} samples/s, "
        f"{_ratio(row['samples/s'], front[0]['samples/s'])} the fastest's speed)"
        for row in front
    ]
    others = len(table) - len(front)
    rest = f" The other {others} are no faster than one that holds no more." if others else ""
    return (
        "- So, by the room per rank for model states and buffers (besides the activations): "
        + "; ".join(steps)
        + "."
        + rest
    )


def _ratio(a: float, b: float) -> str:
    """``a / b`` to three significant digits (a toy's ZeRO-3 bucket can dwarf its states 1000 to 1)."""
    return f"{a / b:.3g}x" if b else "n/a (none to compare)"
