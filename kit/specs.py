"""What the parent hands each rank script: its launch spec, one pydantic model per worker, written by the
parent (``Spec.write``) and read by every rank (``Spec.read``), so a spec that does not validate is one
line naming the file and the field before any engine is built, never a ``KeyError`` inside a rank.

- ``SweepSpec`` for ``kit.ranks.worker`` (written by ``kit.run.sweep``): the sweep, its records file, the
  steps and each configuration (``SweepConfig``: its id, label and Setup);
- ``CalibrateSpec`` for ``kit.ranks.calibrate_worker`` (``kit.run.calibrate``);
- ``RoundtripSpec`` for ``kit.ranks.checkpoint_worker`` (``kit.scaleout.checkpoints``);
- the collectives the calibration and ``zerokit commtest`` time (``TIMED``).

``kit.ranks.commtest_worker`` takes plain flags instead (its ranks may be started by hand on each node).
What the ranks hand back is ``kit.records``'.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kit.records import OPTIONAL_PROBES, PROBES, unknown_probes
from kit.schema import Setup

#: the collectives timed by the calibration and the commtest, in this order
TIMED = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
#: the test-only faults a sweep configuration may carry (``run_sweep(faults=...)``)
Fault = Literal["raise", "hang", "die", "die-last"]


class Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.model_dump_json(indent=1))
        return path

    @classmethod
    def read(cls, path: str | Path) -> Self:
        """The spec of a file, or ValueError in one line naming the file and the first wrong field."""
        try:
            return cls.model_validate_json(Path(path).read_text())
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "spec"
            raise ValueError(f"{path}: {where}: {first['msg']}") from None


class SweepConfig(Spec):
    config_id: str
    label: str
    setup: Setup
    fault: Fault | None = None


class SweepSpec(Spec):
    """One launch of ``kit.ranks.worker``: its configurations back to back."""

    sweep: str
    run_id: str
    records: str = Field(description="path of records.jsonl, which every rank appends to")
    steps: int = Field(ge=1, description="measured steps per configuration")
    warmup: int = Field(ge=0)
    seed: int
    instrument: bool = Field(True, description="false: time the bare loop only, with heartbeats")
    memory_timeline: bool = Field(
        False, description="on the CPU accelerator, profile each measured step's peak per phase"
    )
    probes: tuple[tuple[str, ...], ...] = Field(
        (), description="the bench's hook: the probes of each step in turn (kit.records.PROBES)"
    )
    configs: tuple[SweepConfig, ...]

    @field_validator("probes")
    @classmethod
    def _known(cls, probes: tuple[tuple[str, ...], ...]) -> tuple[tuple[str, ...], ...]:
        unknown = unknown_probes(p for chosen in probes for p in chosen)
        if unknown:
            raise ValueError(
                f"unknown probe {unknown[0]!r}; choose from {', '.join(PROBES + OPTIONAL_PROBES)}"
            )
        return probes


class EngineConfig(Spec):
    key: str
    setup: Setup


class CalibrateSpec(Spec):
    """One launch of ``kit.ranks.calibrate_worker``: the model alone, Adam, copies, collectives, engines."""

    setup: Setup
    engines: tuple[EngineConfig, ...] = ()
    micro_batches: tuple[int, ...] = ()
    adam_numel: int = Field(ge=1)
    copy_bytes: int = Field(ge=1)
    sizes: tuple[int, ...] = Field((), description="collective message sizes, bytes")
    iters: int = Field(ge=1)
    repeat: int = Field(ge=1)
    steps: int = Field(ge=1)
    warmup: int = Field(ge=0)
    seed: int = 0
    collectives_only: bool = False


class RoundtripConfig(Spec):
    name: str
    setup: Setup


class RoundtripSpec(Spec):
    """One launch of ``kit.ranks.checkpoint_worker``: train, save at ``save_step``, resume, compare."""

    dir: str
    out: str = Field(description="the JSON-lines file rank 0 appends one report per configuration to")
    steps: int = Field(ge=2)
    save_step: int = Field(ge=1)
    seed: int
    configs: tuple[RoundtripConfig, ...]
