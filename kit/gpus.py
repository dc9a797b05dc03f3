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
from typing import Any

from kit.paths import DATA
from kit.units import GIB, MIB

#: CUDA context + cuBLAS/cuDNN workspaces of a PyTorch process on an H100: ~500 MiB in nvidia-smi
#: beyond what torch.cuda.memory_reserved() reports.
CUDA_CONTEXT_BYTES = 512 * MIB
#: NCCL communicator buffers: NCCL_BUFFSIZE (4 MiB) x channels (up to 32 on NVLink) x 2 directions, made at
#: a group's first collective (DeepSpeed's broadcast of the module, before its optimizer is built).
NCCL_BUFFER_BYTES = 256 * MIB


def nccl_bytes(ranks: int) -> int:
    """NCCL's buffers on each GPU of a group of ``ranks`` ranks (none for one)."""
    return NCCL_BUFFER_BYTES if ranks > 1 else 0


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
    #: the architecture torch reads from the device: ``sm_90`` (compute capability 9.0), ``gfx942``
    #: (ROCm); "" for a GPU defined on the command line
    arch: str = ""

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    @property
    def blas_workspace_bytes(self) -> int:
        """The workspace torch gives each cuBLAS handle and stream from the caching allocator, never freed
        (``CublasHandlePool.cpp``'s ``parseChosenWorkspaceSize`` without ``CUBLAS_WORKSPACE_CONFIG``):
        32 MiB from Hopper on (compute capability 9 to 12) and on ROCm (128 MiB on gfx942, gfx950,
        gfx1250), else ``:4096:2:16:8`` (8 MiB + 128 KiB); a defined GPU's architecture is unknown: 32."""
        if self.arch.startswith("gfx"):
            return (128 if self.arch[:6] in ("gfx942", "gfx950") or self.arch == "gfx1250" else 32) * MIB
        major = int(self.arch[3:-1]) if self.arch.startswith("sm_") else 9
        return 32 * MIB if 9 <= major <= 12 else (4096 * 2 + 16 * 8) * 1024

    def peak_tflops(self, precision: str) -> float:
        """Peak dense TFLOP/s at a training precision (0 where the GPU lacks it, e.g. bf16 on a V100)."""
        return {"bf16": self.bf16_dense_tflops, "fp16": self.fp16_dense_tflops}.get(
            precision, self.fp32_tflops
        )


@cache
def _listed() -> dict[str, Gpu]:
    with open(DATA / "gpus.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    numeric = (
        "memory_gib", "bf16_dense_tflops", "fp16_dense_tflops", "fp32_tflops", "memory_bw_gbps",
        "interconnect_gbps", "host_link_gbps",
    )  # fmt: skip

    def value(key: str, text: str) -> float | int | str:
        return float(text) if key in numeric else int(text) if key == "sms" else text

    def row(r: dict[str, str]) -> Gpu:
        fields: dict[str, Any] = {k: value(k, v) for k, v in r.items()}  # each column's type by its name
        return Gpu(**fields)

    return {r["name"]: row(r) for r in rows}


def catalogue() -> dict[str, Gpu]:
    """Every GPU: data/gpus.csv's rows, then those defined by their figures in this process."""
    return {**_listed(), **DEFINED_GPUS}


#: GPUs and fabrics defined by their figures in this process (``define_gpu``, ``define_network``; the
#: CLI's ``--define-gpu`` / ``--define-network``), beside the CSV files' rows
DEFINED_GPUS: dict[str, Gpu] = {}
DEFINED_NETWORKS: dict[str, Network] = {}
#: the figures ``define_gpu`` takes: key -> (``Gpu`` field, what it is); the first three are required
GPU_FIGURES = {
    "memory_gib": ("memory_gib", "GiB of memory a process can use"),
    "memory_gbps": ("memory_bw_gbps", "GB/s of memory bandwidth"),
    "bf16_tflops": ("bf16_dense_tflops", "dense bf16 TFLOP/s (0: none)"),
    "fp16_tflops": ("fp16_dense_tflops", "dense fp16 TFLOP/s (default: bf16's)"),
    "fp32_tflops": ("fp32_tflops", "fp32 TFLOP/s (default 0: no fp32 training)"),
    "sms": ("sms", "streaming multiprocessors (default 0: no wave quantization)"),
    "nvlink_gbps": ("interconnect_gbps", "GB/s between the GPUs of a node, both directions (default 64)"),
    "host_gbps": ("host_link_gbps", "GB/s to the host, one direction (default 32)"),
}


def _figures(spec: str, what: str, keys) -> tuple[str, dict[str, float]]:
    """``NAME:key=value,...`` as (name, {key: value}); ValueError naming the field otherwise."""
    name, sep, rest = spec.partition(":")
    if not sep or not name.strip():
        raise ValueError(f"{what}: give NAME:key=value,... (keys {', '.join(keys)}), got {spec!r}")
    values = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, text = item.partition("=")
        if key not in keys or not eq:
            raise ValueError(f"{what}: {item!r} is not key=value with a key of {', '.join(keys)}")
        try:
            values[key] = float(text)
        except ValueError:
            raise ValueError(f"{what}: {key} must be a number, got {text!r}") from None
        if values[key] < 0:
            raise ValueError(f"{what}: {key} must be >= 0, got {text}")
    return name.strip(), values


def define_gpu(spec: str, field: str = "--define-gpu") -> Gpu:
    """A GPU by its figures (``GPU_FIGURES``), ``NAME:memory_gib=96,memory_gbps=4000,bf16_tflops=800``,
    added to ``catalogue`` for this process; ValueError in one line naming the ``field`` it came from."""
    name, values = _figures(spec, field, GPU_FIGURES)
    if name in _listed():
        raise ValueError(f"{field}: {name} is a row of data/gpus.csv; give yours another name")
    missing = [k for k in ("memory_gib", "memory_gbps") if not values.get(k)]
    if missing or not (values.get("bf16_tflops") or values.get("fp16_tflops")):
        need = missing + ([] if values.get("bf16_tflops") or values.get("fp16_tflops") else ["bf16_tflops"])
        raise ValueError(f"{field}: {name} needs {', '.join(need)} > 0")
    values.setdefault("fp16_tflops", values.get("bf16_tflops", 0.0))
    fields = {GPU_FIGURES[k][0]: v for k, v in values.items()}
    sms = int(fields.pop("sms", 0))
    defaults = {"bf16_dense_tflops": 0.0, "fp32_tflops": 0.0, "interconnect_gbps": 64.0,
                "host_link_gbps": 32.0}  # fmt: skip
    fields = {**defaults, **fields}
    made = Gpu(name=name, vendor="defined", interconnect="given", host_link="given",
               source=f"defined on the command line: {spec}", sms=sms, arch="", **fields)  # fmt: skip
    DEFINED_GPUS[name] = made
    return made


def define_network(spec: str) -> Network:
    """A fabric by its bandwidth, ``NAME:gbits_per_node=1600`` (all the node's NICs together), added to
    ``networks`` for this process; ValueError in one line naming the field."""
    name, values = _figures(spec, "--define-network", ("gbits_per_node",))
    if not values.get("gbits_per_node"):
        raise ValueError(f"--define-network: {name} needs gbits_per_node > 0")
    made = Network(name, "given", values["gbits_per_node"], f"defined on the command line: {spec}")
    DEFINED_NETWORKS[name] = made
    return made


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
def _fabrics() -> dict[str, Network]:
    with open(DATA / "networks.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return {
        r["name"]: Network(
            **{k: v for k, v in r.items() if k != "gbits_per_node"}, gbits_per_node=float(r["gbits_per_node"])
        )
        for r in rows
    }


def networks() -> dict[str, Network]:
    """Every fabric: data/networks.csv's rows, then those defined by their figures in this process."""
    return {**_fabrics(), **DEFINED_NETWORKS}


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
