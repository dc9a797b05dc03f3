"""The kit's own runs on a GPU (``make gpu-reference``: ``data/reference/<sweep>/records.jsonl``) beside
its estimate for the GPU they ran on: per configuration, ``torch.cuda.max_memory_allocated`` against the
predicted tensor peak, ``max_memory_reserved`` against the replayed reserved bytes (``kit.estimate.reserved``)
and the median measured step against ``kit.steptime.perf.step_time`` (datasheet figures, no calibration).

Unlike the published rows (``kit.accuracy.published``) these runs are the kit's own runner, so their setup
is exact: the same model code, ds_config and DeepSpeed version the estimate reads, and they are predicted
on the runner's torch optimizer path (``torch_adam``: foreach on a GPU; at stage 0 DeepSpeed's
FP16_UnfusedOptimizer), not the estimate's fused default. Their peaks are per step (the runner resets the
peaks before each measured step). What it cannot see: runs on a device missing
from ``data/gpus.csv`` (no datasheet: the step time is not predicted), and the step time of optimizer offload
(the runner steps torch's AdamW on the host to avoid a JIT build; users' runs step DeepSpeed's CPU Adam,
which the estimate models), both said in ``Configuration.unpredicted``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from kit import gpus
from kit.paths import REFERENCE
from kit.records import load_records
from kit.rules import Offload
from kit.schema import Setup

#: quantities compared, as ``zerokit published`` names them
QUANTITIES = ("max_allocated", "max_reserved", "step_time")


@dataclass(frozen=True)
class Configuration:
    """One configuration of a reference sweep: what ran, on which device, measured and predicted."""

    sweep: str
    label: str
    device: str  # as torch names it ("NVIDIA H200")
    gpu: str | None  # its entry in data/gpus.csv
    steps: int
    setup: Setup
    measured: dict[str, float]  # QUANTITIES: bytes, bytes, seconds (the median step)
    predicted: dict[str, float | None]
    versions: str  # torch and DeepSpeed of the run
    unpredicted: str | None = None  # why a quantity is not predicted

    def error(self, quantity: str) -> float | None:
        """predicted / measured - 1, or None where nothing is predicted."""
        p = self.predicted.get(quantity)
        return None if p is None else p / self.measured[quantity] - 1

    def to_dict(self) -> dict:
        return {
            "sweep": self.sweep,
            "label": self.label,
            "device": self.device,
            "gpu": self.gpu,
            "steps": self.steps,
            "versions": self.versions,
            "measured": self.measured,
            "predicted": self.predicted,
            "error": {q: self.error(q) for q in QUANTITIES},
            "unpredicted": self.unpredicted,
        }


def gpu_of(device: str) -> str | None:
    """The data/gpus.csv entry of a device as torch names it ("NVIDIA H200" -> "H200-SXM-141GB",
        "NVIDIA A100-SXM4-80GB" -> "A100-SXM-80GB"): the entries of its model (the name's first part), of
        several the one whose memory ("80GB") the device's name says; None if no single one (a PCIe card is
    not its SXM entry)."""
    named = device.upper()
    for vendor in ("NVIDIA ", "TESLA ", "GEFORCE ", "AMD INSTINCT "):
        named = named.replace(vendor, "")
    if not named.split():
        return None
    model = named.split()[0].split("-")[0]
    found = [name for name in gpus.gpu_names() if name.split("-")[0].upper() == model]
    if "PCIE" in named:  # a PCIe card is not its SXM part (other clocks, power and links)
        found = [name for name in found if "SXM" not in name]
    if len(found) > 1:
        found = [name for name in found if name.split("-")[-1].upper() in device.upper()]
    return found[0] if len(found) == 1 else None


def configurations(root: str | Path = REFERENCE) -> list[Configuration]:
    """Every successful configuration of every sweep under ``root``, in sweep and run order."""
    out = []
    for path in sorted(Path(root).glob("*/records.jsonl")):
        by_config: dict[str, list[dict]] = {}
        for record in load_records(path):
            if record.get("status") == "ok" and record.get("peak_allocated_bytes") is not None:
                by_config.setdefault(record["config_id"], []).append(record)
        out += [_configuration(records) for records in by_config.values()]
    return out


def _configuration(records: list[dict]) -> Configuration:
    from kit.accuracy.traces import on_path
    from kit.estimate import memory
    from kit.estimate.peak import runner_path
    from kit.steptime import perf

    last = records[-1]
    gpu = gpu_of(last["device"])
    setup = Setup.model_validate(last["setup"])
    if gpu is not None:
        setup = setup.replace(cluster={"gpu": gpu})
    measured = {
        "max_allocated": max(r["peak_allocated_bytes"] for r in records),
        "max_reserved": max(r["peak_reserved_bytes"] for r in records),
        "step_time": statistics.median(r["step_time_s"] for r in records),
    }
    why = None
    if gpu is None:
        why = f"step time: {last['device']!r} is not in data/gpus.csv"
    elif setup.zero.offload_optimizer is not Offload.NONE:
        why = (
            "step time: the runner steps torch's AdamW on the host (torch_adam, no JIT build), the estimate "
            "DeepSpeed's CPU Adam"
        )
    # the runner's torch optimizer path (torch_adam: foreach on a GPU), where the estimate's default is a
    # fused Adam; its peaks are per step: the tensor peak, not building the states
    implementation = runner_path(last["device"])[0]
    predicted = {
        "max_allocated": memory.peak_timeline(setup, implementation=implementation).peak_tensor_bytes,
        "max_reserved": on_path(setup, implementation)["max_reserved"],
        "step_time": None if why else perf.step_time(setup).step_s,
    }
    return Configuration(
        sweep=last["sweep"],
        label=last["label"],
        device=last["device"],
        gpu=gpu,
        steps=len(records),
        setup=setup,
        measured=measured,
        predicted=predicted,
        versions=f"torch {last['torch']}, DeepSpeed {last['deepspeed']}",
        unpredicted=why,
    )


def summary(configs: list[Configuration]) -> dict:
    """Per quantity: configurations compared, median |error|, the worst error and its label."""
    out = {}
    for quantity in QUANTITIES:
        found = [(c, e) for c in configs if (e := c.error(quantity)) is not None]
        if not found:
            continue
        worst, error = max(found, key=lambda item: abs(item[1]))
        out[quantity] = {
            "configurations": len(found),
            "median_abs_error": statistics.median(abs(e) for _, e in found),
            "worst_error": error,
            "worst": f"{worst.sweep} {worst.label}",
        }
    return out
