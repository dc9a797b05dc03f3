"""The grid of valid configurations: who trains (a ZeRO stage or a PyTorch baseline) x what is offloaded
where (none, CPU, NVMe; optimizer states, parameters) x ZeRO++ (hpZ, qwZ, qgZ) x precision.

One ``Variant`` is a point of the grid, ``problem`` the one reason DeepSpeed (or the baseline) refuses
it: the schema's own validation, which applies ``kit.rules``' ``offload_problem``, ``baseline_problem``
and ``zeropp_problem``, and on a cluster ``hpz_cluster_problem``, so the grid refuses exactly what a
``Setup`` refuses. Two ways through it, each returning a ``Grid`` (accepted variants, refused ones with
their reasons):

- ``grid``: the full product of per-field lists (``zerokit run --stages --offload-optimizer
  --offload-param --precision``);
- ``variants``: per stage, offload levels (``OFFLOAD_LEVELS``: nothing, the optimizer, optimizer and
  parameters, or the most the stage can) to one target, plus ZeRO++ variants of stage 3
  (``zerokit tune``, ``zerokit plan``, the comparison panel).

In both, ZeRO++ settings are variants of DeepSpeed's stage 3: stages below it and the baselines run
without them. Torch-free: only the schema and the rules.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace

from pydantic import ValidationError

from kit.ds_keys import EXAMPLE_NVME_PATH
from kit.rules import BASELINES, Offload, baseline_name, hpz_cluster_problem
from kit.schema import Cluster, ZeroSettings, one_line_error
from kit.settings import ZEROPP_OFF

#: what a user picks as "stage": a ZeRO stage or a PyTorch baseline (``kit.rules.BASELINES``)
STAGES = ("0", "1", "2", "3", *BASELINES)
#: how much a ``variants`` point offloads: nothing, the optimizer states, the optimizer states and the
#: parameters (stage 3), or the most the stage can (``all`` at stage 3, ``optimizer`` at stages 1-2)
OFFLOAD_LEVELS = ("none", "optimizer", "all", "most")
#: the ZeroSettings fields of ZeRO++ (``kit.settings.ZEROPP_OFF`` holds their off values)
ZEROPP_FIELDS = tuple(ZEROPP_OFF)


@dataclass(frozen=True)
class Variant:
    """One point of the grid: the ZeroSettings fields it sets (``zero``)."""

    engine: str = "deepspeed"
    stage: int = 2
    offload_optimizer: str = Offload.NONE
    offload_param: str = Offload.NONE
    precision: str | None = None  # None: the Setup's own
    hpz_partition_size: int = 1
    quantized_weights: bool = False
    quantized_gradients: bool = False

    @classmethod
    def of(cls, choice: str | int, **fields) -> Variant:
        """The variant of a stage choice (``"3"``, ``3``, ``"fsdp"``: ``STAGES``) with ``fields`` set."""
        engine, stage = pick(choice)
        return cls(engine=engine, stage=stage, **fields)

    @property
    def zero(self) -> dict:
        """The ZeroSettings fields (ZeRO++ off values included, so a base Setup's ZeRO++ never leaks in;
        no precision when it is None)."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    @property
    def choice(self) -> str:
        """The stage choice as a user types it (``"3"``, ``"fsdp-grad-op"``)."""
        return baseline_name(self.engine, self.stage) or str(self.stage)

    @property
    def zeropp(self) -> dict:
        return {name: getattr(self, name) for name in ZEROPP_FIELDS}


@dataclass(frozen=True)
class Refused:
    """A combination DeepSpeed (or the baseline) cannot run: the field at fault and why."""

    variant: Variant
    field: str
    reason: str

    def __str__(self) -> str:
        return f"{self.variant.choice} {self.variant.offload_optimizer}/{self.variant.offload_param}: " + (
            f"{self.field}: {self.reason}"
        )


@dataclass
class Grid:
    """``accepted`` variants in the order asked (no repeats) and the ``refused`` ones with their reason."""

    accepted: list[Variant] = field(default_factory=list)
    refused: list[Refused] = field(default_factory=list)

    def add(self, variant: Variant, cluster: Cluster | None = None) -> None:
        if variant in self.accepted or any(r.variant == variant for r in self.refused):
            return
        found = problem(variant, cluster)
        if found:
            self.refused.append(Refused(variant, *found))
        else:
            self.accepted.append(variant)

    @property
    def zero(self) -> list[dict]:
        """The accepted variants as ZeroSettings changes (``setup.replace(zero=...)``)."""
        return [v.zero for v in self.accepted]


def pick(choice: str | int) -> tuple[str, int]:
    """``(engine, stage)`` of a stage choice; ValueError naming ``stages`` and the valid choices."""
    if str(choice) in BASELINES:
        return BASELINES[str(choice)]
    if str(choice) not in STAGES or isinstance(choice, bool):
        raise ValueError(f"stages: choose from {', '.join(STAGES)}, got {choice!r}")
    return "deepspeed", int(choice)


def problem(variant: Variant, cluster: Cluster | None = None) -> tuple[str, str] | None:
    """``(field, reason)`` when the variant cannot run (on ``cluster``, when given: hpZ's group), else None.

    The schema's validation is the judge (it applies ``kit.rules``' offload, baseline and ZeRO++ rules),
    so the grid refuses exactly what ``ZeroSettings`` refuses, with the same words.
    """
    zero = variant.zero  # without a precision, the schema's default is checked
    if Offload.NVME in (variant.offload_optimizer, variant.offload_param):
        zero["nvme_path"] = EXAMPLE_NVME_PATH  # a check of the combination only
    try:
        ZeroSettings(**zero)
    except ValidationError as error:
        name, _, reason = one_line_error(error).partition(": ")
        return name, reason
    if cluster is not None:
        return hpz_cluster_problem(variant.hpz_partition_size, cluster.gpus_per_node, cluster.world_size)
    return None


def grid(
    stages: Iterable[str | int] = STAGES,
    *,
    offload_optimizer: Sequence[str] = (Offload.NONE,),
    offload_param: Sequence[str] = (Offload.NONE,),
    precision: Sequence[str | None] = (None,),
    zeropp: Sequence[dict] = (ZEROPP_OFF,),
    cluster: Cluster | None = None,
) -> Grid:
    """The product of the lists, each point accepted or refused with its reason; ``zeropp`` (dicts of
    ``ZEROPP_FIELDS``) applies to DeepSpeed's stage 3, the other points run without it."""
    out = Grid()
    for choice, opt, param, prec, extra in itertools.product(
        stages, offload_optimizer, offload_param, precision, zeropp
    ):
        v = Variant.of(choice, offload_optimizer=opt, offload_param=param, precision=prec)
        out.add(replace(v, **extra) if _takes_zeropp(v) else v, cluster)
    return out


def variants(
    stages: Iterable[str | int] = STAGES,
    *,
    offload: Sequence[str] = ("none",),
    to: str = Offload.CPU,
    zeropp: Sequence[dict] = (),
    precision: str | None = None,
    cluster: Cluster | None = None,
) -> Grid:
    """Per stage choice, one variant per offload level (``OFFLOAD_LEVELS``) to ``to`` (``cpu`` or
    ``nvme``; NVMe where the stage can swap to files, that is stage 3, CPU below it), then one ZeRO++
    variant of stage 3 per ``zeropp`` dict (nothing offloaded). A level the stage cannot run (offload at
    stage 0 or for a baseline, parameters below stage 3) is refused with its reason."""
    for level in offload:
        if level not in OFFLOAD_LEVELS:
            raise ValueError(f"offload: choose from {', '.join(OFFLOAD_LEVELS)}, got {level!r}")
    if to not in (Offload.CPU, Offload.NVME):
        raise ValueError(f"to: choose cpu or nvme, got {to!r}")
    out = Grid()
    for choice in stages:
        plain = Variant.of(choice, precision=precision)
        for level in offload:
            out.add(_offloaded(plain, level, to), cluster)
        if _takes_zeropp(plain):
            for extra in zeropp:
                out.add(replace(plain, **extra), cluster)
    return out


def _offloaded(plain: Variant, level: str, to: str) -> Variant:
    """``plain`` with ``level`` offloaded to ``to`` (CPU where ``to`` is NVMe and the stage cannot swap)."""
    if level == "none":
        return plain
    if level == "most":
        full = _offloaded(plain, "all", to)
        return full if problem(full) is None else _offloaded(plain, "optimizer", to)
    here = to if problem(replace(plain, offload_optimizer=to)) is None else Offload.CPU
    return replace(plain, offload_optimizer=here, offload_param=here if level == "all" else Offload.NONE)


def _takes_zeropp(v: Variant) -> bool:
    """Whether ZeRO++ applies: DeepSpeed at stage 3 (``kit.rules.zeropp_problem``)."""
    return problem(replace(v, hpz_partition_size=1, quantized_weights=True)) is None


def zeropp_variants(gpus_per_node: int) -> dict[str, dict]:
    """ZeRO-3 and its ZeRO++ variants as ZeroSettings changes: hpZ over the node, qwZ, qgZ, all three."""
    hpz = {"hpz_partition_size": gpus_per_node}
    qwz, qgz = {"quantized_weights": True}, {"quantized_gradients": True}
    return {
        "ZeRO-3": {},
        "hpZ": hpz,
        "qwZ": qwz,
        "qgZ": qgz,
        "ZeRO++ (hpZ + qwZ + qgZ)": {**hpz, **qwz, **qgz},
    }
