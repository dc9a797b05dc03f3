"""What every check of the review shares: ``Finding`` and ``Context`` (the config, its Setup and estimate)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kit.components import Component
from kit.estimate.memory import estimate
from kit.gpus import gpu
from kit.rules import Offload, element_bytes
from kit.schema import Setup
from kit.settings import BY_FIELD

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
        self.z, self.n, self.stage = setup.zero, setup.zero_dp, setup.zero.stage
        self.p = element_bytes(setup.zero.precision)
        self.est = estimate(setup)
        self.gpu = gpu(setup.cluster.gpu)

    def key(self, *names: str) -> str | None:
        """The zero_optimization key as the file spells it (the first of ``names`` present), or None."""
        return next((f"zero_optimization.{n}" for n in names if n in self.zero), None)

    def setting(self, field: str) -> str | None:
        """The zero_optimization key of the setting ``field`` (``kit.settings``) as the file spells it (either
        spelling DeepSpeed accepts), or None when the file leaves it out."""
        return self.key(*BY_FIELD[field].spellings)

    def allocated(self, setup: Setup | None = None) -> int:
        """Bytes per GPU the estimate's components allocate (everything but the overhead allowance)."""
        e = self.est if setup is None else estimate(setup)
        return e.components_bytes - e.components[Component.OVERHEAD]

    def delta(self, **zero: Any) -> int:
        """Bytes per GPU this setup allocates beyond the same setup with ``zero`` changed."""
        return self.allocated() - self.allocated(self.setup.replace(zero=zero))

    @property
    def trainable(self) -> int:
        """The parameters that get a gradient (a trainable subset's, ``kit.trainable``)."""
        from kit.estimate import partition

        return partition.trainable_params(self.setup)

    @property
    def hidden(self) -> int | None:
        return self.setup.model.hidden

    def smaller(self, field: str) -> tuple[int, str]:
        """A smaller value for the bucket setting ``field``: HF's ``"auto"`` for the model's hidden size
        (its ``Setting.hf_auto``), else the largest layer; and how it was chosen."""
        if self.hidden:
            rule = BY_FIELD[field].hf_auto
            assert rule is not None, field  # the callers pass settings HF sizes
            return rule[1](self.hidden), f'{rule[0]}, HF\'s "auto" for hidden {self.hidden}'
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
    """An offload block's device as the file gives it ("none" without one)."""
    return section.get("device", Offload.NONE) if isinstance(section, dict) else Offload.NONE
