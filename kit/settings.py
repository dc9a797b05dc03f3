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

The ds_config's view of the same entries (``ZERO_KEYS``, ``ZEROPP_KEYS``, ``NVME_KEYS``, ``STAGE3_KEYS``,
``hf_auto``) is what the writer (``kit.ds_config.writer``), the reader (``kit.ds_config.reader``) and the
review (``kit.review``) walk: a setting's key, the other spelling DeepSpeed accepts and HF Trainer's
``"auto"`` rule live on its entry. ``tests/test_ds_keys.py`` checks the keys, spellings and defaults
against DeepSpeed's own config classes (the schema's defaults are DeepSpeed's, but for the stage) and the
``"auto"`` rules against transformers' ``HfTrainerDeepSpeedConfig``.

What it cannot see: the batch (``Batch``: micro batch, accumulation, sequence length) and the cluster
are not ZeRO settings and keep their own flags and controls (their ds_config keys: ``kit.ds_keys``); how a
setting is estimated is the estimate's.
"""

from __future__ import annotations

import enum
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from kit.ds_keys import STAGE3_UNMODELLED
from kit.rules import Offload
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
    #: the other spelling DeepSpeed accepts for its key (a pydantic alias: ``x`` for ``stage3_x``), or ""
    ds_alias: str = ""
    #: HF Trainer's ``"auto"``: (formula text, rule from the model's hidden size), None without one
    hf_auto: tuple[str, Callable[[int], int]] | None = None

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
    def key(self) -> str:
        """Its key inside its ds_config block (``stage3_prefetch_bucket_size``), "" for the script's."""
        return (self.ds_key or "").rpartition(".")[2]

    @property
    def spellings(self) -> tuple[str, ...]:
        return (self.key, self.ds_alias) if self.ds_alias else (self.key,)

    @property
    def off(self) -> Any:
        """The value that leaves a ZeRO++ feature off (DeepSpeed's default), None for any other setting."""
        return self.default if self.section == ZEROPP else None

    @property
    def default(self) -> Any:
        section, name = _owner(self.field)
        return section.model_fields[name].default

    @property
    def choices(self) -> tuple[Any, ...]:
        """The values a Literal or an enum field takes (an enum's as its values), () for any other."""
        section, name = _owner(self.field)
        annotation = typing.get_type_hints(section)[name]
        if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
            return tuple(member.value for member in annotation)
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


def _bucket(field: str, key: str, label: str, what: str, stages: tuple[int, ...], **more: Any) -> Setting:
    """One of zero_optimization's counts in elements (``key``: its ds_config spelling)."""
    widget = WIDGETS.get(field, "")
    return Setting(
        field, label, f"zero_optimization.{key}: {what}", BUCKETS, "elements", f"zero_optimization.{key}",
        stages, widget=widget, **more,
    )  # fmt: skip


def _buckets() -> tuple[Setting, ...]:
    s3 = "stage 3: "
    return (
        _bucket(
            "reduce_bucket_size", "reduce_bucket_size", "reduce bucket", "gradients reduced per bucket",
            ZERO, main=True, comparison="reduce_bucket", hf_auto=("hidden^2", lambda h: h * h),
        ),
        _bucket(
            "allgather_bucket_size", "allgather_bucket_size", "allgather bucket",
            "stages 1-2: parameters gathered per bucket", (1, 2), main=True,
        ),
        _bucket(
            "prefetch_bucket_size", "stage3_prefetch_bucket_size", "s3 prefetch",
            s3 + "parameters fetched ahead of use", STAGE3, main=True, comparison="prefetch_bucket",
            ds_alias="prefetch_bucket_size", hf_auto=("0.9 hidden^2", lambda h: int(0.9 * h * h)),
        ),
        _bucket(
            "max_live_parameters", "stage3_max_live_parameters", "s3 max live",
            s3 + "gathered parameters held at once", STAGE3, main=True, ds_alias="max_live_parameters",
        ),
        _bucket(
            "max_reuse_distance", "stage3_max_reuse_distance", "s3 reuse distance",
            s3 + "keep a gathered parameter reused this soon", STAGE3, ds_alias="max_reuse_distance",
        ),
        _bucket(
            "param_persistence_threshold", "stage3_param_persistence_threshold", "s3 persistence",
            s3 + "parameters this small stay whole", STAGE3, ds_alias="param_persistence_threshold",
            hf_auto=("10 hidden", lambda h: 10 * h),
        ),
    )  # fmt: skip


NVME = "NVMe offload (ZeRO-Infinity)"
ALLOCATOR = "PyTorch's caching allocator"
SEQUENCE = "sequence parallelism (Ulysses)"
ZEROPP = "ZeRO++ (stage 3)"
_Z, _PP, _T, _N = "ZeRO", ZEROPP, "what trains and its loss", NVME


def _aio(key: str, label: str, control: Control, what: str = "", aliases: tuple[str, ...] = ()) -> Setting:
    """One key of the ds_config's ``aio`` block (NVMe offload at stage 3), named as its field."""
    return Setting(
        f"aio.{key}", label, f"aio.{key}{what}", NVME, control, f"aio.{key}", STAGE3, aliases=aliases
    )


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
        "cpu_checkpointing",
        "CPU checkpoints",
        "activation_checkpointing.cpu_checkpointing: deepspeed.checkpointing keeps the checkpointed blocks' "
        "inputs in CPU RAM (on a GPU all but the newest 2; policy full, your script calls its configure)",
        _Z,
        "checkbox",
        "activation_checkpointing.cpu_checkpointing",
    ),
    Setting(
        "partition_activations",
        "partition ckpts",
        "activation_checkpointing.partition_activations: deepspeed.checkpointing splits each input over "
        "the model-parallel group (no tensor parallelism here: a whole copy; with CPU RAM, all of them)",
        _Z,
        "checkbox",
        "activation_checkpointing.partition_activations",
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
        "expandable_segments",
        "expandable segs.",
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: the caching allocator maps pages into growing "
        "segments instead of caching fixed ones (less reserved beyond the tensors); the kit's runs and "
        "launch files set it",
        ALLOCATOR,
        "checkbox",
        None,
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
    _part("trainable", _T, "qlora", "QLoRA", "LoRA on 4-bit NF4 base weights (bitsandbytes)"),
    _part(
        "trainable",
        _T,
        "lora_dropout",
        "LoRA dropout",
        "peft's lora_dropout: each adapter's input dropped with this probability (0: none)",
    ),
    Setting(
        "loss",
        "loss",
        "plain cross-entropy, chunked: a fused linear cross-entropy (Liger's algorithm), or cce: Cut "
        "Cross-Entropy (no logits in memory)",
        _T,
        "dropdown",
        None,
        main=True,
        comparison="loss",
    ),
    Setting(
        "sequence_parallel_size",
        "Ulysses SP",
        "DeepSpeed Ulysses: GPUs that split each sequence, attention exchanging tokens for heads "
        "(divides the GPUs, the heads and seq_len; 1: off)",
        SEQUENCE,
        "int",
        "sequence_parallel_size",
        flag="--sequence-parallel-size",
        aliases=("--sp",),
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
    _aio("block_size", "aio block", "elements", ": bytes per I/O request"),
    _aio("queue_depth", "aio queue depth", "int"),
    _aio("intra_op_parallelism", "aio threads", "int", ": I/O threads per request", ("--aio-thread-count",)),
    _aio("single_submit", "aio single submit", "checkbox"),
    _aio("overlap_events", "aio overlap events", "checkbox"),
)
BY_FIELD = {s.field: s for s in SETTINGS}

#: ``zero_optimization``'s own keys (not the offload blocks'), in the order the writer writes them
ZERO_KEYS = tuple(
    s for s in SETTINGS if s.ds_key and s.ds_key.count(".") == 1 and s.ds_key[:17] == "zero_optimization"
)
#: the settings written at the ds_config's top level (``sequence_parallel_size``)
TOP_KEYS = tuple(s for s in SETTINGS if s.ds_key and "." not in s.ds_key)
#: DeepSpeed's activation checkpointing options (``kit.checkpointing.DEEPSPEED_FIELDS``), written with
#: checkpointing on (``activation_checkpointing``: read by ``deepspeed.checkpointing.configure``)
CHECKPOINTING_KEYS = tuple(s for s in SETTINGS if (s.ds_key or "").startswith("activation_checkpointing."))
#: ZeRO++'s keys (the ones with an off value) and the ZeroSettings fields that turn it off (what a change
#: to stages 0-2, DDP or FSDP must also set)
ZEROPP_KEYS = tuple(s for s in ZERO_KEYS if s.off is not None)
ZEROPP_OFF = {s.field: s.off for s in ZEROPP_KEYS}
#: NVMe offload's keys per offload block, beside ``device``, ``pin_memory`` and ``nvme_path``
NVME_KEYS = {
    kind: tuple(
        s for s in SETTINGS if (s.ds_key or "").startswith(f"zero_optimization.{kind}.") and s.section == NVME
    )
    for kind in ("offload_param", "offload_optimizer")
}
#: every zero_optimization key only stage 3 reads; the stage 1-2 optimizer and stage 0 never look at them
STAGE3_KEYS = tuple(x for s in ZERO_KEYS if s.stages == STAGE3 for x in s.spellings) + STAGE3_UNMODELLED


def zero_key(spelling: str) -> Setting | None:
    """The ``ZERO_KEYS`` entry a zero_optimization key (either spelling) belongs to, or None."""
    return next((s for s in ZERO_KEYS if spelling in s.spellings), None)


def hf_auto(key: str, hidden: int) -> int:
    """What HF Trainer writes for ``"auto"`` in zero_optimization ``key`` for a model of ``hidden`` size
    (``HfTrainerDeepSpeedConfig.trainer_config_finalize``); KeyError for a key it does not size."""
    entry = zero_key(key)
    if entry is None or entry.hf_auto is None:
        raise KeyError(key)
    return entry.hf_auto[1](hidden)


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
        return Offload.NVME in offloads
    if s.field == "pin_memory":
        return offloads != (Offload.NONE, Offload.NONE)
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
