"""Published step times beside the kit's: the throughput rows of ``data/published/throughput.jsonl``.

Each row's metric is converted to seconds per optimizer step the way its source measured it
(``measured_step_s``), and the kit's step time back to the row's metric (``Timing``):
- samples/s (DeepSpeed's timers, the autotuner's metric, or the HF Trainer's end to end): the global batch
  over the value;
- ms per iteration (Megatron's log): the value / 1000;
- TFLOP/s per GPU by Megatron's formula (with recomputation): 96 B s l h^2 (1 + s / 6h + V / 16 l h)
  FLOPs per iteration over the GPUs, over the value;
- tokens/s per GPU (torchtitan, Composer): micro batch x sequence x accumulation over the value.
The error is on the step time: predicted / measured - 1 (a step 10 % too slow is +10 %).

The fabric is read from the row (``FABRICS``: a figure of Gb/s per GPU or per node matched with
data/networks.csv); a multi-node row that names none is taken on its source's cluster where that is known
(``SOURCES``), else on its GPU's DGX fabric (``DGX``), said in its notes. Rows that compare stages on one
setup (``STAGE_SETS``: the same source, model, GPUs and batch) are checked for order: the kit ranks their
step times as the runs did.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from typing import Any

from kit.gpus import networks
from kit.schema import Setup
from kit.steptime.perf import hardware, step_time

#: a multi-node row's GPU (a piece of data/gpus.csv's name) -> the fabric of its DGX, where the row
#: names none
DGX = (("V100", "ib-edr-8x100"), ("A100", "ib-hdr-8x200"), ("H100", "ib-ndr-8x400"), ("H200", "ib-ndr-8x400"))
#: (pieces of a row's ``source``, the fabric, why) for rows whose page names no network but whose cluster
#: is known: DeepSpeed's ZeRO and ZeRO++ tutorials ran on the DeepSpeed team's V100-SXM3 cluster (16-GPU
#: nodes, hosts worker-N in both tutorials' logs), which the ZeRO++ blog measures at 4 x 100 Gb/s per node
#: (ZeRO++ 1.28-1.36x faster than ZeRO-3) and at 100 Gb/s (2-2.2x faster)
SOURCES = (
    (
        ("deepspeed.ai/tutorials/zeropp", "deepspeed.ai/tutorials/zero/"),
        "ib-edr-1x100",
        "the DeepSpeed team's V100-SXM3 cluster (16-GPU nodes, hosts worker-N in the ZeRO and ZeRO++ "
        "tutorials' logs) at 100 Gb/s per node, the one of the ZeRO++ blog's two settings where ZeRO++ is "
        "2-2.2x faster than ZeRO-3 (the ZeRO++ tutorial's runs: 2.7x; 4 x 100 Gb/s gave 1.3x)",
    ),
)
#: the row's columns that make rows one setup whose stages are compared (of ``source`` its first word,
#: the page)
SAME_SETUP = ("source", "model", "num_gpus", "micro_batch_per_gpu", "seq_len", "grad_accum", "metric")


def fabric(row: dict[str, Any], gpu: str, gpus_per_node: int, notes: list[str]) -> str | None:
    """The data/networks.csv fabric of a row: its text's Gb/s per GPU (x the node's GPUs) or per node
    matched by bandwidth, else its DGX's (noted); None for one node."""
    if (row.get("num_nodes") or 1) == 1:
        return None
    text = row.get("interconnect") or ""
    gbits = None
    if found := re.search(r"(\d+)\s*Gb(?:ps|/s)[^;]*?per GPU", text):
        gbits = int(found.group(1)) * gpus_per_node
    elif found := re.search(r"(\d+)\s*Gb(?:ps|/s)\s*node-node", text):
        gbits = int(found.group(1))
    if gbits:
        kind = "ethernet" if re.search(r"RoCE|Ethernet|RDMA", text) else "infiniband"
        named = [n for n, net in networks().items() if net.gbits_per_node == gbits]
        named.sort(key=lambda n: networks()[n].kind != kind)
        if named:
            return named[0]
        notes.append(f"fabric of {gbits} Gb/s per node is not in data/networks.csv")
        return None
    for pieces, name, why in SOURCES:
        if any(piece in row["source"] for piece in pieces):
            notes.append(f"inter-node network not stated: taken as {name}, {why}")
            return name
    chosen = next((name for piece, name in DGX if piece in gpu), None)
    if chosen:
        notes.append(f"inter-node network not stated: taken as the DGX's {chosen}")
    return chosen


def measured_step_s(row: dict[str, Any], setup: Setup) -> tuple[float, str]:
    """Seconds per optimizer step a row measured, and how its metric was converted."""
    unit, metric, value = row["unit"], row["metric"], float(row["value"])
    b = setup.batch
    if unit.startswith("ms/iteration"):
        return value / 1000, "ms per iteration / 1000"
    if unit.startswith("samples/s"):
        batch = row.get("global_batch") or b.train_batch
        return batch / value, f"global batch {batch} / samples per second"
    if unit.startswith("tokens/s/GPU"):
        tokens = b.micro_batch * b.seq_len * b.grad_accum
        return tokens / value, f"{tokens:,} tokens per GPU per step / tokens per second per GPU"
    if unit.startswith("TFLOPs/GPU") and "96*B*s*l*h^2" in metric:
        flops = megatron_flops(setup, row)
        return flops / (value * 1e12), "Megatron's 96 B s l h^2 (1 + s/6h + V/16lh) per GPU / TFLOP/s"
    raise ValueError(f"metric: {metric!r} in {unit!r} has no conversion to a step time")


def megatron_flops(setup: Setup, row: dict[str, Any]) -> float:
    """FLOPs per GPU per iteration by Megatron's formula (Narayanan et al. 2021, with recomputation)."""
    m, b = setup.model, setup.batch
    big_b, s, l_, h, v = b.train_batch, b.seq_len, m.layers, m.hidden, row.get("vocab") or m.vocab
    assert l_ is not None and h is not None and v is not None  # Megatron's rows: GPT shapes with a vocabulary
    return 96 * big_b * s * l_ * h * h * (1 + s / (6 * h) + v / (16 * l_ * h)) / setup.cluster.world_size


@dataclass(frozen=True)
class Timing:
    """One measured step time beside the kit's, both in seconds and in the row's own metric."""

    measured_s: float
    predicted_s: float
    conversion: str
    unit: str
    measured_value: float
    fabric: str | None
    parts: dict[str, float]

    @property
    def error(self) -> float:
        """predicted / measured step time - 1."""
        return self.predicted_s / self.measured_s - 1

    @property
    def predicted_value(self) -> float:
        """The kit's step time in the row's metric (a rate scales inversely with the time)."""
        if self.unit.startswith("ms/iteration"):
            return self.predicted_s * 1000
        return self.measured_value * self.measured_s / self.predicted_s

    def to_dict(self) -> dict[str, Any]:
        keys = ("measured_s", "predicted_s", "error", "unit", "measured_value", "predicted_value")
        return {k: getattr(self, k) for k in keys} | {
            "conversion": self.conversion, "fabric": self.fabric, "parts": self.parts,
        }  # fmt: skip


def timing(row: dict[str, Any], setup: Setup, notes: list[str]) -> Timing:
    """A throughput row's measured step time beside ``perf.step_time`` on its GPU and fabric."""
    c = setup.cluster
    net = fabric(row, c.gpu, c.gpus_per_node, notes)
    t = step_time(setup, hardware(setup, net))
    measured, how = measured_step_s(row, setup)
    parts = {"compute": t.compute.seconds, "exposed_comm": t.exposed_comm.seconds}
    parts |= {"optimizer": t.optimizer.seconds, "offload": t.offload.seconds}
    return Timing(measured, t.step_s, how, row["unit"], float(row["value"]), net, parts)


def stage_sets(comparisons) -> list[dict[str, Any]]:
    """Sets of compared rows that differ only in ZeRO stage or ZeRO++ (``SAME_SETUP``), each with the
    measured and the predicted order (fastest first) and whether they agree."""
    groups: dict[tuple, list] = {}
    for c in comparisons:
        if c.timings:
            key = tuple(str(c.row.get(k)) for k in SAME_SETUP)
            groups.setdefault((c.row["source"].split()[0], *key[1:]), []).append(c)
    out = []
    for members in groups.values():
        if len(members) < 2 or len({c.setup.label for c in members}) < 2:
            continue
        measured = [c.id for c in sorted(members, key=lambda c: c.timings[0].measured_s)]
        predicted = [c.id for c in sorted(members, key=lambda c: c.timings[0].predicted_s)]
        out.append({"ids": sorted(measured), "measured": measured, "predicted": predicted,
                    "agrees": measured == predicted})  # fmt: skip
    return out


def summary(comparisons) -> dict[str, Any] | None:
    """Median |error| and worst error of the step times compared, how many are within 25 % and 2x,
    and the stage-order sets."""
    found = [(c.id, t) for c in comparisons for t in c.timings]
    if not found:
        return None
    worst_id, worst = max(found, key=lambda item: abs(item[1].error))
    errors = [abs(t.error) for _, t in found]
    return {
        "rows": len(found),
        "median_abs_error": statistics.median(errors),
        "worst_error": worst.error,
        "worst_id": worst_id,
        "within_25": sum(e <= 0.25 for e in errors),
        "within_2x": sum(1 / 2 <= t.predicted_s / t.measured_s <= 2 for _, t in found),
        "stage_sets": stage_sets(comparisons),
    }
