"""What every check of the review shares: ``Finding`` and ``Context`` (the config, its Setup and estimate)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kit.ds_keys import hf_auto, zero_key
from kit.estimate.memory import estimate
from kit.gpus import gpu
from kit.rules import element_bytes
from kit.schema import Setup

SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True)
class Finding:
    """One thing to know about one setting: what it does here, and what to change."""

    key: str
    severity: str  # "error" | "warning" | "info"
    message: str
    suggestion: str

    def to_dict(self) -> dict:
        return asdict(self)


class Context:
    """The config, its Setup and estimate, and the helpers the checks share."""

    def __init__(self, raw: dict, setup: Setup):
        self.raw, self.setup = raw, setup
        zero = raw.get("zero_optimization")
        self.zero = zero if isinstance(zero, dict) else {}
        self.z, self.n, self.stage = setup.zero, setup.dp, setup.zero.stage
        self.p = element_bytes(setup.zero.precision)
        self.est = estimate(setup)
        self.gpu = gpu(setup.cluster.gpu)

    def key(self, *names: str) -> str | None:
        """The zero_optimization key as the file spells it (the first of ``names`` present), or None."""
        return next((f"zero_optimization.{n}" for n in names if n in self.zero), None)

    def allocated(self, setup: Setup | None = None) -> int:
        """Bytes per GPU the estimate's components allocate (everything but the overhead allowance)."""
        e = self.est if setup is None else estimate(setup)
        return e.components_bytes - e.components["overhead"]

    def delta(self, **zero: Any) -> int:
        """Bytes per GPU this setup allocates beyond the same setup with ``zero`` changed."""
        return self.allocated() - self.allocated(self.setup.replace(zero=zero))

    @property
    def hidden(self) -> int | None:
        return self.setup.model.hidden

    def smaller(self, key: str) -> tuple[int, str]:
        """A smaller value for a zero_optimization bucket ``key``: HF's ``"auto"`` for the model's hidden
        size (``kit.ds_keys.hf_auto``), else the largest layer; and how it was chosen."""
        if self.hidden:
            entry = zero_key(key)
            assert entry is not None and entry.hf_auto is not None, key  # the callers pass keys HF sizes
            formula = entry.hf_auto[0]
            return hf_auto(key, self.hidden), f'{formula}, HF\'s "auto" for hidden {self.hidden}'
        return self.setup.model.largest_layer_params, "the largest layer"

    def present(self) -> set[str]:
        """The zero_optimization keys the file sets, dotted."""
        return {f"zero_optimization.{k}" for k in self.zero}

    def bucket_count(self) -> int:
        """ipg buffers of reduce_bucket_size: stage 1-2 double them with overlap_comm (setup_buckets)."""
        return 2 if self.stage in (1, 2) and self.z.overlap else 1


def noop(key: str, what: str, suggestion: str = "remove it") -> Finding:
    return Finding(key, "info", f"{key}: does nothing here: {what}", suggestion)


def offload_device(section: Any) -> str:
    return section.get("device", "none") if isinstance(section, dict) else "none"
