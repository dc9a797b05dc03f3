"""The hardware tables: GPUs (data/gpus.csv, vendor datasheets), inter-node networks (data/networks.csv),
NVMe drives per node (data/nvme.csv) and indicative prices (data/prices.csv); every row cites its source.

Units: memory in GiB; peak dense TFLOP/s per precision (``fp32_tflops`` without tensor cores' TF32);
``interconnect_gbps`` GB/s between GPUs of a node, both directions together (NVLink's datasheet figure;
one PCIe x16 link for PCIe cards); ``host_link_gbps`` GB/s to the host, one direction (theoretical);
``sms`` streaming multiprocessors (AMD: compute units), the slots a GEMM's output tiles fill in waves.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache

from kit.paths import DATA
from kit.units import GIB


@dataclass(frozen=True)
class Gpu:
    name: str
    vendor: str
    memory_gib: float
    bf16_dense_tflops: float
    fp16_dense_tflops: float
    fp32_tflops: float
    memory_bw_gbps: float
    sms: int
    interconnect: str
    interconnect_gbps: float
    host_link: str
    host_link_gbps: float
    source: str

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    def peak_tflops(self, precision: str) -> float:
        """Peak dense TFLOP/s at a training precision (0 where the GPU lacks it, e.g. bf16 on a V100)."""
        return {"bf16": self.bf16_dense_tflops, "fp16": self.fp16_dense_tflops}.get(
            precision, self.fp32_tflops
        )


@cache
def catalogue() -> dict[str, Gpu]:
    with open(DATA / "gpus.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    numeric = (
        "memory_gib", "bf16_dense_tflops", "fp16_dense_tflops", "fp32_tflops", "memory_bw_gbps",
        "interconnect_gbps", "host_link_gbps",
    )  # fmt: skip

    def value(key: str, text: str) -> float | int | str:
        return float(text) if key in numeric else int(text) if key == "sms" else text

    return {r["name"]: Gpu(**{k: value(k, v) for k, v in r.items()}) for r in rows}


def gpu_names() -> list[str]:
    return list(catalogue())


def gpu(name: str) -> Gpu:
    try:
        return catalogue()[name]
    except KeyError:
        raise ValueError(f"gpu: unknown GPU {name!r}; choose one of {', '.join(catalogue())}") from None


@dataclass(frozen=True)
class Network:
    """An inter-node fabric from data/networks.csv: bandwidth per node, all NICs together."""

    name: str
    kind: str
    gbits_per_node: float
    source: str

    @property
    def gbytes_per_node(self) -> float:
        return self.gbits_per_node / 8


#: the fabric the planner assumes for each ``Cluster.interconnect`` unless told otherwise
DEFAULT_NETWORK = {"infiniband": "ib-ndr-8x400", "efa": "efa-p5-3200", "ethernet": "ethernet-100g"}


@cache
def networks() -> dict[str, Network]:
    with open(DATA / "networks.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return {r["name"]: Network(**{**r, "gbits_per_node": float(r["gbits_per_node"])}) for r in rows}


def network(name: str) -> Network:
    """A fabric by name (``ib-ndr-8x400``...) or by kind (``infiniband``: its ``DEFAULT_NETWORK``)."""
    name = DEFAULT_NETWORK.get(name, name)
    try:
        return networks()[name]
    except KeyError:
        raise ValueError(
            f"network: unknown network {name!r}; choose one of {', '.join(networks())} "
            f"or a kind ({', '.join(DEFAULT_NETWORK)})"
        ) from None


@dataclass(frozen=True)
class NvmeDrives:
    """A node's NVMe drives from data/nvme.csv (ZeRO-Infinity's swap space): sequential GB/s, all drives."""

    name: str
    drives: int
    read_gbps: float
    write_gbps: float
    source: str


#: the drives the planner assumes on every node unless told otherwise
DEFAULT_NVME = "dgx-h100-8x-u2"


@cache
def nvme_drives() -> dict[str, NvmeDrives]:
    with open(DATA / "nvme.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return {
        r["name"]: NvmeDrives(
            r["name"],
            int(r["drives"]),
            int(r["drives"]) * float(r["read_gbps_per_drive"]),
            int(r["drives"]) * float(r["write_gbps_per_drive"]),
            r["source"],
        )
        for r in rows
    }


def nvme(name: str = DEFAULT_NVME) -> NvmeDrives:
    """A node's NVMe drives by name (data/nvme.csv)."""
    try:
        return nvme_drives()[name]
    except KeyError:
        raise ValueError(f"nvme: unknown drives {name!r}; choose one of {', '.join(nvme_drives())}") from None


@cache
def prices() -> dict[str, tuple[float, str]]:
    """Indicative on-demand USD per GPU-hour and its source, per GPU (data/prices.csv)."""
    with open(DATA / "prices.csv", newline="") as f:
        return {r["gpu"]: (float(r["usd_per_gpu_hour"]), r["source"]) for r in csv.DictReader(f)}
