"""Every ZeRO setting a user chooses, declared once: its ``ZeroSettings`` field, CLI flag, the panels'
control and label, the stages that read it, where it goes in a ds_config (or that it is the training
script's), and its help text. Defaults, choices and valid ranges are the schema's (``kit.schema``),
never restated here.

Derived from ``SETTINGS``: the CLI's ZeRO flags and their reading back (``kit.cli.args``), the flags that
reproduce a Setup (``argv``, for ``zerokit plan``'s launch-cmd line), which flags a ds_config may be
combined with (``script``: what the training script decides, applied beside a file; the rest must agree
with the file), the memory panel's controls (``kit.lab.ui.control``, every setting; its "More settings"
section holds those ``main`` leaves out) and the comparison panel's (``comparison``).
``tests/test_settings.py`` walks the registry against the CLI parsers, both panels and the ds_config
writer and reader.

What it cannot see: the batch (``Batch``: micro batch, accumulation, sequence length) and the cluster
are not ZeRO settings and keep their own flags and controls; how a setting is estimated is the estimate's.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from kit.schema import AioSettings, ZeroSettings

Control = Literal["toggle", "dropdown", "checkbox", "int", "float", "elements", "text", "composite"]
ALL, ZERO, STAGE3 = (0, 1, 2, 3), (1, 2, 3), (3,)


@dataclass(frozen=True)
class Setting:
    """One setting. ``field`` is a ZeroSettings field (``aio.block_size``: one of its ``aio`` block)."""

    field: str
    #: the panels' label and the CLI group's title
    label: str
    help: str
    section: str
    control: Control
    #: the ds_config key it is written as (``kit.ds_config``); None: the training script's choice
    ds_key: str | None
    #: the ZeRO stages that read it (the panels disable it elsewhere)
    stages: tuple[int, ...] = ALL
    #: the CLI flag; "" derives it from the field (``--reduce-bucket-size``)
    flag: str = ""
    #: older spellings the CLI also takes
    aliases: tuple[str, ...] = ()
    #: the composite panel control it is part of (``checkpointing``, ``trainable``), "" for its own
    group: str = ""
    #: the panels' name for its control when not the field's (``hpz``)
    widget: str = ""
    #: shown in the memory panel's main form (else under "More settings")
    main: bool = False
    #: the comparison panel's control for it (``stages`` there for ``stage``), "" when it is not offered
    comparison: str = ""

    @property
    def option(self) -> str:
        return self.flag or "--" + self.field.replace("aio.", "aio-").replace("_", "-")

    @property
    def dest(self) -> str:
        """The argparse attribute the flag fills."""
        return self.option.removeprefix("--").replace("-", "_")

    @property
    def name(self) -> str:
        """The panels' control: the composite's name, else the field (``aio.x``: ``aio_x``)."""
        return self.group or self.widget or self.field.replace(".", "_")

    @property
    def script(self) -> bool:
        """The training script's (no ds_config key): applied beside a ds_config, never read from one."""
        return self.ds_key is None

    @property
    def default(self) -> Any:
        section, name = _owner(self.field)
        return section.model_fields[name].default

    @property
    def choices(self) -> tuple[Any, ...]:
        """The values a Literal field takes, () for any other."""
        section, name = _owner(self.field)
        annotation = typing.get_type_hints(section)[name]
        return typing.get_args(annotation) if typing.get_origin(annotation) is Literal else ()

    @property
    def bounds(self) -> tuple[float | None, float | None]:
        """(lowest, highest) the schema accepts, None where it sets no bound (``gt`` / ``lt`` exclusive,
        given as the bound itself)."""
        section, name = _owner(self.field)
        low = high = None
        for rule in section.model_fields[name].metadata:  # annotated_types' Ge, Gt, Le, Lt
            low = getattr(rule, "ge", getattr(rule, "gt", low))
            high = getattr(rule, "le", getattr(rule, "lt", high))
        return low, high

    def value(self, zero: ZeroSettings) -> Any:
        section, name = _owner(self.field)
        return getattr(zero.aio if section is AioSettings else zero, name)


def _owner(field: str) -> tuple[type[BaseModel], str]:
    section, _, name = field.rpartition(".")
    return (AioSettings, name) if section == "aio" else (ZeroSettings, field)


def _part(group: str, section: str, field: str, label: str, help: str) -> Setting:
    """One field of a composite control (``group``: checkpointing, what trains): the training script's,
    in the memory panel's form, offered by both panels."""
    return Setting(field, label, help, section, "composite", None, group=group, main=True, comparison=group)


#: the section of zero_optimization's counts in elements (``_buckets``)
BUCKETS = "buckets (elements)"
#: the panels' names of the bucket sliders
WIDGETS = {
    "reduce_bucket_size": "reduce_bucket",
    "allgather_bucket_size": "allgather_bucket",
    "prefetch_bucket_size": "prefetch_bucket",
}


def _buckets() -> tuple[Setting, ...]:
    """zero_optimization's counts in elements, from ``kit.ds_keys.ZERO_KEYS`` (key, stages, default)."""
    from kit.ds_keys import ZERO_KEYS

    text = {
        "reduce_bucket_size": ("reduce bucket", "gradients reduced per bucket", "reduce_bucket"),
        "allgather_bucket_size": ("allgather bucket", "stages 1-2: parameters gathered per bucket", ""),
        "prefetch_bucket_size": (
            "s3 prefetch",
            "stage 3: parameters fetched ahead of use",
            "prefetch_bucket",
        ),
        "max_live_parameters": ("s3 max live", "stage 3: gathered parameters held at once", ""),
        "max_reuse_distance": (
            "s3 reuse distance",
            "stage 3: keep a gathered parameter reused this soon",
            "",
        ),
        "param_persistence_threshold": ("s3 persistence", "stage 3: parameters this small stay whole", ""),
    }
    main = ("reduce_bucket_size", "allgather_bucket_size", "prefetch_bucket_size", "max_live_parameters")
    return tuple(
        Setting(
            k.field, text[k.field][0], f"zero_optimization.{k.key}: {text[k.field][1]}", BUCKETS,
            "elements", f"zero_optimization.{k.key}", k.stages, main=k.field in main,
            widget=WIDGETS.get(k.field, ""), comparison=text[k.field][2],
        )
        for k in ZERO_KEYS
        if k.field in text
    )  # fmt: skip


NVME = "NVMe offload (ZeRO-Infinity)"
_Z, _PP, _T, _N = "ZeRO", "ZeRO++ (stage 3)", "what trains and its loss", NVME
SETTINGS: tuple[Setting, ...] = (
    Setting(
        "stage",
        "ZeRO stage",
        "ZeRO stage 0-3, or a PyTorch baseline: ddp, fsdp, fsdp-grad-op",
        _Z,
        "toggle",
        "zero_optimization.stage",
        main=True,
        comparison="stages",
    ),
    Setting(
        "offload_optimizer",
        "offload optimizer",
        "optimizer states and the fp32 master to the CPU or NVMe (nvme: stage 3)",
        _Z,
        "toggle",
        "zero_optimization.offload_optimizer.device",
        ZERO,
        main=True,
        comparison="offload_optimizer",
    ),
    Setting(
        "offload_param",
        "offload params",
        "16-bit parameters to the CPU or NVMe (stage 3)",
        _Z,
        "toggle",
        "zero_optimization.offload_param.device",
        STAGE3,
        main=True,
        comparison="offload_param",
    ),
    Setting(
        "nvme_path",
        "NVMe path",
        "folder on the NVMe drive for the swap files (with an nvme offload)",
        _Z,
        "text",
        "zero_optimization.offload_*.nvme_path",
        STAGE3,
        main=True,
        comparison="nvme_path",
    ),
    Setting(
        "precision",
        "precision",
        "fp32, fp16 or bf16 (mixed precision keeps an fp32 master)",
        _Z,
        "toggle",
        "bf16.enabled / fp16.enabled",
        main=True,
        comparison="precision",
    ),
    Setting("optimizer", "optimizer", "adamw, adam or sgd", _Z, "dropdown", "optimizer.type", main=True),
    Setting(
        "momentum",
        "SGD momentum",
        "SGD momentum (> 0 keeps one state per parameter)",
        _Z,
        "float",
        "optimizer.params.momentum",
    ),
    _part(
        "checkpointing", _Z, "activation_checkpointing", "checkpointing", "recompute activations per block"
    ),
    _part(
        "checkpointing",
        _Z,
        "checkpoint_every",
        "checkpoint every",
        "checkpoint one block in N, the others keep everything (torchtitan's selective 'layer' N)",
    ),
    _part(
        "checkpointing",
        _Z,
        "checkpoint_policy",
        "checkpoint policy",
        "full: a block keeps its input; selective-op: also its matmul and attention outputs "
        "(torchtitan's 'op')",
    ),
    Setting(
        "overlap_comm",
        "overlap comm",
        "zero_optimization.overlap_comm: reduce and gather during backward "
        "(DeepSpeed's default: on at stage 3 only)",
        _Z,
        "dropdown",
        "zero_optimization.overlap_comm",
        ZERO,
    ),
    Setting(
        "contiguous_gradients",
        "contiguous grads",
        "zero_optimization.contiguous_gradients: copy gradients into one buffer as they are produced",
        _Z,
        "checkbox",
        "zero_optimization.contiguous_gradients",
        ZERO,
    ),
    Setting(
        "zero_init",
        "zero.Init",
        "stage 3: build the model partitioned (deepspeed.zero.Init)",
        _Z,
        "checkbox",
        None,
        STAGE3,
    ),
    Setting(
        "hpz_partition_size",
        "hpZ size",
        "ZeRO++ hpZ: zero_hpz_partition_size (divides GPUs per node)",
        _PP,
        "int",
        "zero_optimization.zero_hpz_partition_size",
        STAGE3,
        flag="--hpz",
        widget="hpz",
        main=True,
        comparison="hpz",
    ),
    Setting(
        "quantized_weights",
        "qwZ int8 weights",
        "ZeRO++ qwZ: int8 weight all-gathers",
        _PP,
        "checkbox",
        "zero_optimization.zero_quantized_weights",
        STAGE3,
        main=True,
        comparison="quantized_weights",
    ),
    Setting(
        "quantized_gradients",
        "qgZ int4 gradients",
        "ZeRO++ qgZ: int4 gradients",
        _PP,
        "checkbox",
        "zero_optimization.zero_quantized_gradients",
        STAGE3,
        main=True,
        comparison="quantized_gradients",
    ),
    _part("trainable", _T, "lora_rank", "LoRA rank", "LoRA rank through peft; 0: no LoRA"),
    _part(
        "trainable",
        _T,
        "lora_targets",
        "LoRA targets",
        "comma-separated peft target_modules, or all-linear (default: peft's for the model type)",
    ),
    _part("trainable", _T, "freeze_embeddings", "frozen embeddings", "the input embeddings do not train"),
    _part("trainable", _T, "frozen_blocks", "frozen blocks", "the first N blocks do not train"),
    Setting(
        "loss",
        "loss",
        "plain cross-entropy, or chunked: a fused linear cross-entropy (Liger's algorithm)",
        _T,
        "dropdown",
        None,
        main=True,
        comparison="loss",
    ),
    *_buckets(),
    Setting(
        "buffer_count",
        "param buffers",
        "offload_param.buffer_count: pinned swap buffers",
        _N,
        "int",
        "zero_optimization.offload_param.buffer_count",
        STAGE3,
        flag="--nvme-buffer-count",
    ),
    Setting(
        "buffer_size",
        "param buffer size",
        "offload_param.buffer_size: elements per swap buffer",
        _N,
        "elements",
        "zero_optimization.offload_param.buffer_size",
        STAGE3,
        flag="--nvme-buffer-size",
    ),
    Setting(
        "max_in_cpu",
        "params in RAM",
        "offload_param.max_in_cpu: elements kept in pinned RAM",
        _N,
        "elements",
        "zero_optimization.offload_param.max_in_cpu",
        STAGE3,
        flag="--nvme-max-in-cpu",
    ),
    Setting(
        "optimizer_buffer_count",
        "optimizer buffers",
        "offload_optimizer.buffer_count",
        _N,
        "int",
        "zero_optimization.offload_optimizer.buffer_count",
        STAGE3,
        flag="--nvme-optimizer-buffer-count",
    ),
    Setting(
        "pin_memory",
        "pinned RAM",
        "offload into page-locked RAM (both offload blocks)",
        _Z,
        "checkbox",
        "zero_optimization.offload_*.pin_memory",
        ZERO,
    ),
    Setting(
        "aio.block_size",
        "aio block",
        "aio.block_size: bytes per I/O request",
        _N,
        "elements",
        "aio.block_size",
        STAGE3,
    ),
    Setting("aio.queue_depth", "aio queue depth", "aio.queue_depth", _N, "int", "aio.queue_depth", STAGE3),
    Setting(
        "aio.intra_op_parallelism",
        "aio threads",
        "aio.intra_op_parallelism: I/O threads per request",
        _N,
        "int",
        "aio.intra_op_parallelism",
        STAGE3,
        aliases=("--aio-thread-count",),
    ),
    Setting(
        "aio.single_submit",
        "aio single submit",
        "aio.single_submit",
        _N,
        "checkbox",
        "aio.single_submit",
        STAGE3,
    ),
    Setting(
        "aio.overlap_events",
        "aio overlap events",
        "aio.overlap_events",
        _N,
        "checkbox",
        "aio.overlap_events",
        STAGE3,
    ),
)
BY_FIELD = {s.field: s for s in SETTINGS}
#: the ZeroSettings fields no Setting declares: ``engine`` (``--stage ddp`` and the stage toggle's
#: baselines set it) and ``aio`` (its fields are settings of their own)
NOT_SETTINGS = ("engine", "aio")


def applies(s: Setting, stage: int, offloads: tuple[str, str], optimizer: str) -> bool:
    """Whether settings of this stage, (optimizer, parameter) offload and optimizer read ``s``: its stage is
    among ``s.stages``; NVMe's knobs with an NVMe offload, ``pin_memory`` with any offload, ``momentum``
    with SGD."""
    if stage not in s.stages:
        return False
    if s.section == NVME:
        return "nvme" in offloads
    if s.field == "pin_memory":
        return offloads != ("none", "none")
    return s.field != "momentum" or optimizer == "sgd"


def group(name: str) -> tuple[Setting, ...]:
    """The settings of one panel control, in its value's order (``checkpointing``: three fields)."""
    return tuple(s for s in SETTINGS if s.name == name)


def fields(zero: dict[str, Any]) -> dict[str, Any]:
    """``{field: value}`` (``aio.x`` keys among them) as ZeroSettings' nested shape (``{"aio": {...}}``)."""
    out: dict[str, Any] = {}
    for field, value in zero.items():
        section, _, name = field.rpartition(".")
        if section:
            out.setdefault(section, {})[name] = value
        else:
            out[field] = value
    return out


def text(value: Any) -> str:
    """A value as the CLI takes it (``1e9`` counts in full, tuples comma-separated)."""
    if isinstance(value, tuple):
        return ",".join(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def argv(zero: ZeroSettings, skip: tuple[str, ...] = ()) -> list[str]:
    """The flags that give ``zero`` (every setting away from its default; ``--stage`` always)."""
    from kit.rules import baseline_name

    out = ["--stage", baseline_name(zero.engine, zero.stage) or str(zero.stage)]
    for s in SETTINGS:
        value = s.value(zero)
        if s.field == "stage" or s.field in skip or value == s.default:
            continue
        if isinstance(s.default, bool):
            out.append(s.option if value else "--no-" + s.option.removeprefix("--"))
        elif s.field == "overlap_comm":
            out += [s.option, "on" if value else "off"]
        else:
            out += [s.option, text(value)]
    return out
