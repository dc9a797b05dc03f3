"""Allocator traces of GPU runs beside the kit's replay (``data/reference/allocator-traces``).

Each run is rank 0 of a ZeRO run of ``ranks`` ranks on one GPU: torch's fake process group turns the
collectives into no-ops while every allocation of rank 0 happens as it would (partitions, gathers,
buckets and reductions sized for ``ranks``), and ``torch.cuda.memory._record_memory_history`` records
them (``tests/fixtures/allocator_trace.py``, ``make gpu-reference``). Two checks per run:

- ``replayed``: the trace's own allocations and frees through ``kit.estimate.allocator``, beside the
  device's ``max_memory_reserved`` / ``max_memory_allocated``: the caching allocator's rules alone;
- ``predicted``: the kit's estimate of the run's setup (the peak timeline and ``kit.estimate.reserved``
  with the run's torch optimizer path), beside the same: the step's sequence written from DeepSpeed's code.

What it cannot see: step times (no collective ran); a free a ``record_stream`` defers comes back in the
trace when the device got there (``free_completed``), so the replay follows the device's timing, the
estimate does not.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path

from kit.estimate.allocator import Alloc, EmptyCache, Event, Free, Replay, replay
from kit.estimate.peak import Implementation
from kit.paths import REFERENCE
from kit.schema import Setup
from kit.units import GIB

#: the runs' folder: ``runs.json`` and one gzipped trace per run
TRACES = REFERENCE / "allocator-traces"
#: what each run is checked on: torch.cuda's peaks (``Run`` and ``Replay`` name them alike)
QUANTITIES = ("max_allocated", "max_reserved")


@dataclass(frozen=True)
class Run:
    """One recorded run: what ran (``what``, ``setup`` of ``ranks`` ranks with its allocator,
    ``zero.expandable_segments``, the torch optimizer's ``implementation``), where, its steps and the
    device's peaks after them."""

    name: str
    what: str
    setup: Setup
    ranks: int
    implementation: Implementation
    device: str
    versions: str
    steps: int
    max_allocated: int
    max_reserved: int
    trace: Path

    def events(self) -> list[Event]:
        """The trace as the replay's events: an allocation and the free the device completed (a
        ``record_stream``'s comes when the other stream got there); a run of segments given back
        (``torch.cuda.empty_cache``) is one ``EmptyCache``."""
        with gzip.open(self.trace, "rt") as f:
            entries = json.load(f)
        out: list[Event] = []
        live: dict[int, int] = {}
        for index, (action, address, size, stream) in enumerate(entries):
            if action == "alloc":
                live[address] = index
                out.append(Alloc(index, size, stream))
            elif action == "free_completed":
                out.append(Free(live.pop(address)))
            elif action in ("segment_free", "segment_unmap") and not (
                out and isinstance(out[-1], EmptyCache)
            ):
                out.append(EmptyCache())
        return out

    @cached_property
    def replayed(self) -> Replay:
        """The allocator's replay of the trace (``kit.estimate.allocator``)."""
        return replay(self.events(), expandable_segments=self.setup.zero.expandable_segments)

    @cached_property
    def predicted(self) -> dict[str, int | None]:
        """The kit's estimate of the run (``on_path``: its torch optimizer path)."""
        return on_path(self.setup, self.implementation)

    def errors(self) -> dict[str, float | None]:
        """predicted / measured - 1, per quantity."""
        return {
            q: None if (ours := self.predicted[q]) is None else ours / getattr(self, q) - 1
            for q in QUANTITIES
        }

    def cell(self, quantity: str) -> str:
        """``quantity`` in GiB as "measured / replayed / estimated (error)", what the tables show."""
        ours, error = self.predicted[quantity], self.errors()[quantity]
        estimate = "-" if ours is None or error is None else f"{ours / GIB:.2f} ({100 * error:+.1f} %)"
        return (
            f"{getattr(self, quantity) / GIB:.2f} / {getattr(self.replayed, quantity) / GIB:.2f} / {estimate}"
        )

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "what": self.what,
            "ranks": self.ranks,
            "device": self.device,
            "versions": self.versions,
            "measured": {q: getattr(self, q) for q in QUANTITIES},
            "replayed": {q: getattr(self.replayed, q) for q in QUANTITIES},
            "predicted": self.predicted,
            "errors": self.errors(),
        }


def on_path(setup: Setup, implementation: Implementation) -> dict[str, int | None]:
    """The kit's estimate of ``setup`` stepped by the torch optimizer's ``implementation`` (a run's own
    path, where the estimate's default is a fused Adam), per quantity (``QUANTITIES``): max allocated
    since the start (the tensor peak, or ``Reserved.initialize`` where building the states holds more)
    and max reserved (``Estimate.reserved_bytes``' rule under the setup's allocator; None where the step
    is not replayed)."""
    from kit.estimate import estimate, memory

    peak = memory.peak_timeline(setup, implementation=implementation).peak_tensor_bytes
    replay_of = estimate(setup).replay
    r = replay_of(implementation=implementation) if replay_of else None
    if r is None:
        return {"max_allocated": peak, "max_reserved": None}
    return {"max_allocated": max(peak, r.initialize), "max_reserved": peak + r.cached}


def runs(root: str | Path = TRACES) -> list[Run]:
    """The recorded runs under ``root`` (none without a ``runs.json``), in its order; read once per
    process (each run's replay and estimate are kept with it)."""
    return list(_runs(Path(root)))


@cache
def _runs(root: Path) -> tuple[Run, ...]:
    path = root / "runs.json"
    if not path.exists():
        return ()
    return tuple(
        Run(
            name=r["name"],
            what=r["what"],
            setup=Setup.model_validate(r["setup"]).replace(
                zero={"expandable_segments": r["expandable_segments"]}
            ),
            ranks=r["ranks"],
            implementation=r["implementation"],
            device=r["device"],
            versions=f"torch {r['torch']}, DeepSpeed {r['deepspeed']}",
            steps=r["steps"],
            max_allocated=r["max_allocated"],
            max_reserved=r["max_reserved"],
            trace=root / r["trace"],
        )
        for r in json.loads(path.read_text())
    )
