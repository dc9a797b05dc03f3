"""GPU catalogue from data/gpus.csv (vendor datasheet figures; the source column cites each row)."""

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
    memory_bw_gbps: float
    interconnect: str
    interconnect_gbps: float
    source: str

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)


@cache
def catalogue() -> dict[str, Gpu]:
    with open(DATA / "gpus.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    numeric = ("memory_gib", "bf16_dense_tflops", "fp16_dense_tflops", "memory_bw_gbps", "interconnect_gbps")
    return {r["name"]: Gpu(**{k: float(v) if k in numeric else v for k, v in r.items()}) for r in rows}


def gpu_names() -> list[str]:
    return list(catalogue())


def gpu(name: str) -> Gpu:
    try:
        return catalogue()[name]
    except KeyError:
        raise ValueError(f"gpu: unknown GPU {name!r}; choose one of {', '.join(catalogue())}") from None
