"""A calibration: this machine's rates and fixed costs as the step-time model needs them, as small JSON.

``zerokit calibrate --measure`` measures it in one launch (``kit.run.calibrate.measure``) and
``kit.steptime.perf.step_time(..., calibration=)`` predicts with it. Every number is measured, none is
fitted to the step times it is later compared with:

- ``tflops``, ``micro_fixed_s``: forward + backward of the calibration model alone, at two micro batches:
  seconds = ``micro_fixed_s`` + FLOPs / ``tflops`` (the FLOPs of ``perf.flops_per_token``);
- ``adam_s_per_param`` (on the device) and ``host_adam_s_per_param`` (the CPU, for optimizer offload);
- ``to_host_gbps``, ``to_device_gbps``: host-device copies (offload);
- ``collectives``: per collective, latency per call and bus bandwidth, a line through commtest's timings
  fitted on relative residuals (none from one rank, a single GPU: the datasheet's links then);
  ``collectives_at``: the same, measured in a launch of their own on other numbers of ranks (by rank
  count): a setup predicts with those measured nearest below its ranks (``links``);
- ``engines``: per engine (``engine_key``) the fixed seconds per optimizer step and per micro-step that
  the terms above leave unexplained in that engine's own measured micro-steps (DeepSpeed's bookkeeping,
  hooks, allocator calls), per parameter tensor of the calibration model (``tensors``);
- ``ranks``, ``cores``, ``threads_per_rank``: how it ran; on a CPU machine a setup with more ranks than
  cores shares them (``share``);
- ``busy``: per term, the share of its wall seconds a rank kept a core busy (process CPU seconds over wall
  seconds x threads, measured beside each time above): ``compute``, ``adam``, ``copy``, ``comm`` per
  collective, ``fixed`` per engine. Only that share (over the compute passes', whose share is the cores
  the launch had: ``cores_had``) is stretched on shared cores (``stretch``); a rank waiting in gloo leaves
  its core to the others. A file without it (older) stretches every term in full and says so.

A setup of another precision, model or engine than the calibration measured gets its rates and fixed
costs carried over; its step time says so (``carried_over``).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

from kit.rules import Offload

#: ``kind`` of a calibration file
KIND = "zerokit-calibration"
VERSION = 1
#: stdout tag of the measuring rank's lines (``kit.ranks.calibrate_worker``)
TAG = "ZEROKIT_CALIBRATION"


def model_text(model) -> str:
    """How a calibration names the model it measured (``model``: a ``kit.schema.ModelSpec``)."""
    return f"{model.family} {model.layers} x {model.hidden}, {model.params:,} parameters"


@dataclass(frozen=True)
class Link:
    """One collective's cost per call: ``latency_s`` + bytes sent per rank / ``bus_gbps``."""

    latency_s: float
    bus_gbps: float


@dataclass(frozen=True)
class EngineCost:
    """Fixed seconds of an engine per parameter tensor: per optimizer step and per micro-step."""

    step_s_per_tensor: float
    micro_step_s_per_tensor: float


@dataclass(frozen=True)
class Calibration:
    """This machine measured (see the module's doc for each field); ``save`` / ``load`` as JSON."""

    device: str
    accelerator: str  # "cuda" or "cpu"
    backend: str  # "nccl" or "gloo"
    ranks: int
    cores: int
    threads_per_rank: int
    model: str
    layers: int
    tensors: int
    precision: str
    tflops: float
    micro_fixed_s: float
    adam_s_per_param: float
    host_adam_s_per_param: float
    to_host_gbps: float
    to_device_gbps: float
    collectives: dict[str, Link]
    engines: dict[str, EngineCost]
    created: str
    host: str
    versions: dict[str, str]
    busy: dict | None = None  # {compute, adam, copy: share, comm: {op: share}, fixed: {engine: share}}
    collectives_at: dict[str, dict[str, Link]] = field(default_factory=dict)  # {ranks: {op: Link}}
    seconds: float = 0.0  # the launch's wall time
    measured: dict = field(default_factory=dict)  # the raw medians the fields came from

    def __post_init__(self) -> None:
        for name in ("tflops", "adam_s_per_param", "host_adam_s_per_param", "to_host_gbps", "to_device_gbps"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: a measured rate must be > 0, got {getattr(self, name)!r}")
        if self.ranks < 1 or self.cores < 1 or self.threads_per_rank < 1:
            raise ValueError(f"ranks: must be >= 1 (ranks, cores, threads_per_rank), got {self.ranks}")
        for name, share in _shares(self.busy or {}):
            if not 0 <= share <= 1:
                raise ValueError(f"busy.{name}: a busy share must be in [0, 1], got {share!r}")
        for n in self.collectives_at:
            if not (n.isdigit() and int(n) >= 2):
                raise ValueError(f"collectives_at: keys are the rank counts measured (>= 2), got {n!r}")
        if self.busy is not None and not self.busy.get("compute", 0) > 0:
            raise ValueError(f"busy.compute: must be a measured share > 0, got {self.busy.get('compute')!r}")

    @property
    def label(self) -> str:
        """How a step time predicted from it is named; a CPU calibration says that it predicts CPU runs:
        its rates do not carry to a GPU (the counts do: ``kit.steptime.calibrated``)."""
        ranks = f"{self.ranks} rank{'s' if self.ranks > 1 else ''}"
        label = f"calibrated on {self.device} ({ranks}, {self.backend}, {self.created[:16]})"
        if self.accelerator == "cpu":
            label += ": CPU rates, for CPU runs; for a GPU leave --calibration out (the datasheet model)"
        return label

    @property
    def cores_had(self) -> float:
        """The cores the calibration's ranks had: a launch's ranks share the cores their session gets
        (Linux's autogroups; the launcher starts them in a session of their own), which the compute passes'
        busy share measures: ranks x threads x that share, at most the cores (all of them when not
        measured)."""
        if self.busy is None:
            return float(self.cores)
        return min(float(self.cores), self.ranks * self.threads_per_rank * self.busy["compute"])

    def share(self, gpus_per_node: int, against: int | None = None) -> tuple[float, float]:
        """(compute, other) slowdown of a rank on a node of ``gpus_per_node`` ranks against one of
        ``against`` ranks (the calibration's own by default): on a CPU machine each rank gets
        ``max(1, cores // ranks)`` threads (the launcher's OMP_NUM_THREADS) and ranks x threads beyond the
        cores it had (``cores_had``) share them; a GPU is its own."""
        if self.accelerator != "cpu":
            return 1.0, 1.0
        cores = self.cores_had

        def threads_and_share(n: int) -> tuple[int, float]:
            threads = max(1, self.cores // n)
            return threads, max(1.0, n * threads / cores)

        t0, s0 = threads_and_share(against or self.ranks)
        t, s = threads_and_share(gpus_per_node)
        return (s / s0) * (t0 / t), s / s0

    def busy_share(self, term: str, key: str | None = None) -> float | None:
        """The measured busy share of ``term`` (``compute``, ``adam``, ``copy``; ``comm`` of collective
        ``key``, all_reduce's for one not measured; ``fixed`` of engine ``key``); None when not measured."""
        if self.busy is None:
            return None
        share = self.busy.get(term)
        if isinstance(share, dict):
            share = share.get(key, share.get("all_reduce") if term == "comm" else None)
        return share

    def stretch(
        self, gpus_per_node: int, term: str, key: str | None = None, against: int | None = None
    ) -> tuple[float, str]:
        """The factor on ``term``'s seconds (``busy_share``'s names) for a rank of a node of
        ``gpus_per_node`` ranks, and its formula: of the term's seconds at the calibration's rates the
        share b that ran on a core needs one and runs s times slower on shared cores (``share``; compute's
        s also counts its threads), the rest waited (a peer, a socket) and stays: 1 - b + b x s. A rank of
        the calibration ran at most the compute passes' busy share of the time (``cores_had``), so b is the
        term's busy share over theirs (1 for compute). Not measured: all of it, x s. ``against``: the
        ranks the term's rate was measured on, when not the calibration's (``links``)."""
        s_compute, s = self.share(gpus_per_node, against)
        s = s_compute if term == "compute" else s
        share = self.busy_share(term, key)
        if s == 1:
            if against and against != self.ranks:
                return 1.0, f"x 1 (measured on {against} ranks)"
            return 1.0, "x 1 (no shared cores)"
        if share is None:
            return s, f"x {s:g} (shared cores; busy share not measured: all of it stretched)"
        assert self.busy is not None  # a measured share comes from it (busy_share)
        ran = self.busy["compute"]
        b = min(1.0, share / ran)
        factor = 1 - b + b * s
        busy = "b = 1" if term == "compute" else f"b = {share:.2f} busy / compute's {ran:.2f} = {b:.2f}"
        cores = f"{self.cores_had:.2g} of {self.cores} cores had"
        return factor, f"x {factor:.3g} (shared cores: 1 - b + b x s, {busy}, s = {s:.3g} on {cores})"

    def carried_over(self, setup) -> list[str]:
        """What of ``setup`` (a ``kit.schema.Setup``) this calibration did not measure, so that its rates
        and fixed costs are carried over: another precision (compute, Adam and the engines' costs are a
        precision's), another model (compute at other shapes, fixed costs per tensor of another model's),
        an engine not measured (``engine``). Micro batch, sequence and ranks are modelled, not listed."""
        z, out = setup.zero, []
        if z.precision != self.precision:
            out.append(f"precision {z.precision} (the calibration measured {self.precision})")
        if model_text(setup.model) != self.model:
            out.append(f"model {model_text(setup.model)} (the calibration measured {self.model})")
        key = engine_key(z.stage, z.engine, z.offload_optimizer, z.offload_param)
        which = self.engine(key)[1]
        if which != key:
            out.append(f"engine {key} ({'no fixed costs' if which == 'none' else which + ' measured'})")
        return out

    def label_for(self, *setups, across_nodes: bool = False) -> str:
        """``label`` with what of ``setups`` it did not measure (``carried_over``, each item once) and
        the parts their step times take from datasheets, a calibration having measured one node's ranks
        (``kit.steptime.calibrated``): bytes across nodes (on several nodes, or ``across_nodes``) and
        NVMe offload's swap. The words a step time predicted from it is shown with."""
        missing = list(dict.fromkeys(item for setup in setups for item in self.carried_over(setup)))
        datasheet = []
        if across_nodes or any(setup.cluster.nodes > 1 for setup in setups):
            datasheet.append("bandwidth across nodes (the network's figure)")
        if any(setup.zero.nvme for setup in setups):
            datasheet.append("NVMe swap (the drives' figures)")
        return (
            self.label
            + ("; carried over, not measured: " + "; ".join(missing) if missing else "")
            + ("; from datasheets: " + ", ".join(datasheet) if datasheet else "")
        )

    def links(self, ranks: int) -> tuple[int, dict[str, Link]]:
        """The collectives measured on the most ranks at most ``ranks`` (the calibration's own when none
        of ``collectives_at`` is), and that rank count."""
        at = {self.ranks: self.collectives} | {int(n): links for n, links in self.collectives_at.items()}
        n = max((n for n in at if n <= ranks), default=self.ranks)
        return n, at[n]

    def link(self, op: str, ranks: int | None = None) -> Link | None:
        """``op``'s measured cost, on ``ranks`` ranks (``links``; the calibration's own by default):
        all_reduce's for a collective not measured; None when one rank measured none (the datasheet's
        links then)."""
        links = self.links(ranks)[1] if ranks else self.collectives
        return links.get(op) or links.get("all_reduce")

    def engine(self, key: str) -> tuple[EngineCost, str]:
        """The fixed costs of engine ``key``, and which measured engine they are: the engine itself, the
        same stage without offload, or none (zero costs)."""
        if key in self.engines:
            return self.engines[key], key
        base = key.split("+")[0]
        if base in self.engines:
            return self.engines[base], base
        return EngineCost(0.0, 0.0), "none"

    def gpus(self, names) -> list[str]:
        """Those of ``names`` (data/gpus.csv) this calibration's device is: the name's first part (``H200``
        of ``H200-SXM-141GB``) in the device's (``NVIDIA H200``)."""
        words = self.device.upper().replace("-", " ").split()
        return [n for n in names if n.split("-")[0].upper() in words]

    def to_dict(self) -> dict:
        return {"kind": KIND, "version": VERSION, **asdict(self)}

    def save(self, path: str | os.PathLike) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)
            f.write("\n")

    @classmethod
    def from_dict(cls, data: dict) -> Calibration:
        if data.get("kind") != KIND:
            raise ValueError(f"kind: not a zerokit calibration (expected {KIND!r}, got {data.get('kind')!r})")
        if data.get("version") != VERSION:
            raise ValueError(
                f"version: this kit reads calibration version {VERSION}, got {data.get('version')!r}"
            )
        data = {k: v for k, v in data.items() if k not in ("kind", "version")}
        data["collectives"] = {op: Link(**v) for op, v in data["collectives"].items()}
        data["collectives_at"] = {
            n: {op: Link(**v) for op, v in links.items()}
            for n, links in data.get("collectives_at", {}).items()
        }
        data["engines"] = {k: EngineCost(**v) for k, v in data["engines"].items()}
        try:
            return cls(**data)
        except TypeError as error:
            raise ValueError(f"calibration: {error}") from error

    @classmethod
    def load(cls, path: str | os.PathLike) -> Calibration:
        """A calibration file; ValueError with one line when it is not one."""
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"calibration: cannot read {path}: {error}") from error
        if not isinstance(data, dict):
            raise ValueError(f"calibration: {path} is not a JSON object")
        return cls.from_dict(data)


def _shares(busy: dict, prefix: str = ""):
    """(dotted name, share) of every number in ``busy``, nested ones included."""
    for name, value in busy.items():
        if isinstance(value, dict):
            yield from _shares(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", value


def engine_key(stage: int, engine: str, offload_optimizer: str, offload_param: str) -> str:
    """The name engines are calibrated under: ``ddp``, ``fsdp``, ``fsdp-grad-op`` or ``z<stage>``, with
    ``+offload`` when the optimizer (or the parameters) live on the host."""
    if engine != "deepspeed":
        return engine if engine == "ddp" or stage == 3 else "fsdp-grad-op"
    offload = offload_optimizer != Offload.NONE or offload_param != Offload.NONE
    return f"z{stage}" + ("+offload" if offload else "")
