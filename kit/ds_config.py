"""Setup <-> DeepSpeed config (``ds_config.json``): export, import and validation.

Export and import are plain functions over dicts (no torch/deepspeed import, so ``zerokit estimate
--ds-config`` stays instant). ``validate_ds_config`` runs DeepSpeed's own parser on a config.
Import follows what DeepSpeed itself does with a config (``deepspeed/runtime/config.py``,
``deepspeed/runtime/zero/config.py``) and resolves HF Trainer ``"auto"`` values the way
``transformers.integrations.deepspeed.HfTrainerDeepSpeedConfig`` does.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import logging
import re
import sys
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

from kit.gpus import gpu
from kit.rules import offload_problem
from kit.schema import Cluster, ModelSpec, Setup, ZeroSettings

#: DeepSpeed's default is 10; every 100 steps keeps short runs quiet and long runs informative.
STEPS_PER_PRINT = 100
#: The common choice in DeepSpeed's and HF's example configs (HF Trainer's max_grad_norm default).
GRADIENT_CLIPPING = 1.0
#: the learning rate of the kit's runs (the PyTorch baselines use the same)
LEARNING_RATE = 1e-4

_OPTIMIZER_TYPES = {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD"}
_ACTIVATION_CHECKPOINTING = {
    "partition_activations": False,
    "cpu_checkpointing": False,
    "contiguous_memory_optimization": False,
    "synchronize_checkpoint_boundary": False,
}
_BATCH_KEYS = {
    "train_micro_batch_size_per_gpu": "micro_batch",
    "gradient_accumulation_steps": "grad_accum",
    "train_batch_size": "train_batch",
}
#: ds_config zero_optimization key -> ZeroSettings field (DeepSpeed accepts the stage3_ alias or the name).
_ZERO_KEYS = {
    "stage": "stage",
    "reduce_bucket_size": "reduce_bucket_size",
    "allgather_bucket_size": "allgather_bucket_size",
    "overlap_comm": "overlap_comm",
    "contiguous_gradients": "contiguous_gradients",
    "stage3_prefetch_bucket_size": "prefetch_bucket_size",
    "prefetch_bucket_size": "prefetch_bucket_size",
    "stage3_max_live_parameters": "max_live_parameters",
    "max_live_parameters": "max_live_parameters",
    "stage3_max_reuse_distance": "max_reuse_distance",
    "max_reuse_distance": "max_reuse_distance",
    "stage3_param_persistence_threshold": "param_persistence_threshold",
    "param_persistence_threshold": "param_persistence_threshold",
}
#: HF Trainer's "auto" for these keys, from the model's hidden size (HfTrainerDeepSpeedConfig).
_HIDDEN_AUTO = {
    "reduce_bucket_size": ("hidden^2", lambda h: h * h),
    "stage3_prefetch_bucket_size": ("0.9 hidden^2", lambda h: int(0.9 * h * h)),
    "prefetch_bucket_size": ("0.9 hidden^2", lambda h: int(0.9 * h * h)),
    "stage3_param_persistence_threshold": ("10 hidden", lambda h: 10 * h),
    "param_persistence_threshold": ("10 hidden", lambda h: 10 * h),
}
#: Settings that change what DeepSpeed allocates in ways zero-kit does not model:
#: (section, key, value meaning unused, what it is).
_UNSUPPORTED = [
    (
        "zero_optimization",
        "zero_quantized_nontrainable_weights",
        False,
        "ZeRO++ int8 storage of frozen weights",
    ),
    ("zero_optimization", "zenflow", None, "ZenFlow"),
    ("bf16", "bf16_master_weights_and_grads", False, "bf16 master weights"),
    ("bf16", "bf16_optimizer_states", False, "bf16 optimizer states"),
    ("fp16", "fp16_master_weights_and_grads", False, "fp16 master weights"),
    ("data_types", "grad_accum_dtype", None, "a custom gradient accumulation dtype"),
    ("torch_autocast", "enabled", False, "torch autocast"),
    ("tensor_parallel", "autotp_size", 0, "tensor parallelism"),
    (None, "sequence_parallel_size", 1, "sequence parallelism"),
]


def to_ds_config(setup: Setup, *, torch_adam: bool = False, lr: float = LEARNING_RATE) -> dict:
    """The ds_config dict for a Setup, valid for DeepSpeed's parser.

    ``torch_adam=True`` makes DeepSpeed use ``torch.optim.Adam(W)`` instead of JIT-building its fused
    or CPU Adam (the runner's choice on CPU machines). A PyTorch baseline (``zero.engine`` ddp/fsdp) has
    no ds_config: ValueError naming its DeepSpeed counterpart.
    """
    z, b = setup.zero, setup.batch
    if z.engine != "deepspeed":
        raise ValueError(
            f"zero.engine: {z.name!r} is PyTorch's own engine, not DeepSpeed: it has no "
            f"ds_config (its ZeRO counterpart is stage {z.stage}, engine 'deepspeed')"
        )
    config: dict[str, Any] = {
        "train_batch_size": b.train_batch,
        "train_micro_batch_size_per_gpu": b.micro_batch,
        "gradient_accumulation_steps": b.grad_accum,
        "steps_per_print": STEPS_PER_PRINT,
        "gradient_clipping": GRADIENT_CLIPPING,
        "optimizer": _optimizer_section(z, torch_adam, lr),
        "zero_optimization": _zero_section(z),
    }
    if z.mixed_precision:
        config[z.precision] = {"enabled": True}
    if z.optimizer == "sgd" and z.stage > 0:
        # ZeRO refuses optimizers outside deepspeed/runtime/zero/utils.py ZERO_SUPPORTED_OPTIMIZERS.
        config["zero_allow_untested_optimizer"] = True
    if z.activation_checkpointing:
        config["activation_checkpointing"] = dict(_ACTIVATION_CHECKPOINTING)
    if z.nvme:
        config["aio"] = _aio_section(z)
    return config


def _optimizer_section(z: ZeroSettings, torch_adam: bool, lr: float) -> dict:
    params: dict[str, Any] = {"lr": lr}
    if z.optimizer == "sgd":
        params["momentum"] = z.momentum
    else:
        if z.optimizer == "adam":
            params["adam_w_mode"] = False  # DeepSpeed's "Adam" is AdamW unless this is false
        if torch_adam:
            params["torch_adam"] = True
    return {"type": _OPTIMIZER_TYPES[z.optimizer], "params": params}


def _zero_section(z: ZeroSettings) -> dict:
    section: dict[str, Any] = {"stage": z.stage}
    if z.stage == 0:
        return section
    section["reduce_bucket_size"] = z.reduce_bucket_size
    section["contiguous_gradients"] = z.contiguous_gradients
    if z.overlap_comm is not None:
        section["overlap_comm"] = z.overlap_comm
    if z.stage < 3:
        section["allgather_bucket_size"] = z.allgather_bucket_size
    else:
        section["stage3_prefetch_bucket_size"] = z.prefetch_bucket_size
        section["stage3_max_live_parameters"] = z.max_live_parameters
        section["stage3_max_reuse_distance"] = z.max_reuse_distance
        section["stage3_param_persistence_threshold"] = z.param_persistence_threshold
        for key, (field, off) in _ZEROPP_KEYS.items():
            if getattr(z, field) != off:
                section[key] = getattr(z, field)
    if z.offload_optimizer != "none":
        section["offload_optimizer"] = {"device": z.offload_optimizer, "pin_memory": z.pin_memory}
        if z.offload_optimizer == "nvme":
            section["offload_optimizer"].update(nvme_path=z.nvme_path, buffer_count=z.optimizer_buffer_count)
    if z.offload_param != "none":
        section["offload_param"] = {"device": z.offload_param, "pin_memory": z.pin_memory}
        if z.offload_param == "nvme":
            section["offload_param"].update(
                nvme_path=z.nvme_path,
                buffer_count=z.buffer_count,
                buffer_size=z.buffer_size,
                max_in_cpu=z.max_in_cpu,
            )
    return section


def _aio_section(z: ZeroSettings) -> dict:
    """The top-level ``aio`` block NVMe offload reads (``deepspeed/runtime/swap_tensor/aio_config.py``)."""
    return z.aio.model_dump()


def write_ds_config(setup: Setup, path: str | Path, **options: Any) -> Path:
    """Write ``to_ds_config(setup, **options)`` as indented JSON; returns the path."""
    path = Path(path)
    path.write_text(json.dumps(to_ds_config(setup, **options), indent=2) + "\n")
    return path


#: DeepSpeed config class (pydantic model title) -> the ds_config section it parses.
_SECTIONS = {
    "DeepSpeedZeroConfig": "zero_optimization",
    "DeepSpeedBF16Config": "bf16",
    "DeepSpeedFP16Config": "fp16",
    "DeepSpeedCommsConfig": "comms_logger",
    "CommsLoggerConfig": "comms_logger",
    "DeepSpeedMonitorConfig": "",
    "CompileConfig": "compile",
}


def validate_ds_config(config: dict, world_size: int):
    """Parse ``config`` with DeepSpeed's own ``DeepSpeedConfig`` for ``world_size`` data-parallel ranks
    and return the parsed config. No process group is needed. Raises ValueError, one line naming the field.
    """
    _deepspeed_logger()
    from deepspeed.runtime.config import DeepSpeedConfigError
    from pydantic import ValidationError

    from kit.batch import resolve
    from kit.schema import explain

    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size: must be a whole number >= 1, got {world_size!r}")
    if not isinstance(config, dict):
        raise ValueError(f"ds_config: must be a JSON object, got {type(config).__name__}")
    batch = {name: config.get(key) for key, name in _BATCH_KEYS.items()}
    numbers = all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in batch.values())
    if numbers and (batch["micro_batch"] is not None or batch["train_batch"] is not None):
        resolve(world_size, **batch)  # DeepSpeed's equation, with valid alternatives
    try:
        return _sized_config_class()(copy.deepcopy(config), world_size)
    except ValidationError as error:
        raise ValueError(explain(error, prefix=_SECTIONS.get(error.title, error.title))) from None
    except (DeepSpeedConfigError, AssertionError, ValueError, TypeError, AttributeError, KeyError) as error:
        raise ValueError(f"ds_config: {_first_line(error)}") from None


@cache
def _sized_config_class() -> type:
    """DeepSpeedConfig with the data-parallel size given, not read from an initialised process group."""
    from deepspeed.runtime.config import DeepSpeedConfig

    class SizedDeepSpeedConfig(DeepSpeedConfig):
        def __init__(self, config: dict, world_size: int):
            self._data_parallel_size = world_size
            super().__init__(config)

        def _configure_train_batch_size(self) -> None:
            # DeepSpeedConfig.__init__ falls back to world_size = 1 without a process group.
            self.world_size = self._data_parallel_size
            super()._configure_train_batch_size()

    return SizedDeepSpeedConfig


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]


class Refusal(NamedTuple):
    """One thing DeepSpeed refuses in a ds_config: the dotted key, one line in DeepSpeed's words, and
    when: ``"unknown"`` (a key its config class does not know: pydantic's ``extra_forbidden``),
    ``"parse"`` (``DeepSpeedConfig`` refuses the value) or ``"engine"`` (asserted when the engine starts)."""

    key: str
    message: str
    kind: str = "parse"


#: DeepSpeedConfig's assertions and errors that name no field: (text in DeepSpeed's message, the key)
_ASSERTIONS = (
    ("bfloat16 and fp16 modes cannot be simultaneously enabled", "bf16.enabled"),
    ("train_batch_size is not equal to", "train_batch_size"),
    ("Either train_batch_size or train_micro_batch_size_per_gpu", "train_batch_size"),
    ("Train batch size", "train_batch_size"),
    ("Micro batch size per gpu", "train_micro_batch_size_per_gpu"),
    ("train_micro_batch_size_per_gpu is not defined", "train_micro_batch_size_per_gpu"),
    ("Gradient accumulation steps", "gradient_accumulation_steps"),
    ("gradient_accumulation_steps is not defined", "gradient_accumulation_steps"),
)
#: DeepSpeed's assertion in ``DeepSpeedZeroOptimizer.__init__`` (stage_1_and_2.py), at engine start
ALIGNMENT_MESSAGE = "allgather_bucket_size must be a multiple of nccl_start_alignment_factor, {factor}"
#: ``DeepSpeedEngine._do_optimizer_sanity_check`` (engine.py), at engine start
UNTESTED_OPTIMIZER_MESSAGE = (
    'You are using an untested ZeRO Optimizer. Please add <"zero_allow_untested_optimizer": true> in the '
    "configuration file to use it."
)


def deepspeed_refusals(config: dict, world_size: int) -> tuple[list[Refusal], list[str]]:
    """Everything DeepSpeed refuses in ``config`` for ``world_size`` ranks, not only the first, and the
    warnings its parser logs (deprecated keys).

    DeepSpeed's own ``DeepSpeedConfig`` parses the config; after each refusal the refused key is dropped
    (so DeepSpeed's default applies) and the parse repeated, until it passes or a refusal names no key.
    Then the checks DeepSpeed makes only when the engine starts, which the parser does not:
    ``allgather_bucket_size`` alignment (stages 1-2) and an optimizer ZeRO has not tested (SGD).
    Imports deepspeed (and torch); the parser's log lines are kept, not printed.
    """
    _deepspeed_logger()
    from deepspeed.runtime.config import DeepSpeedConfigError
    from pydantic import ValidationError

    work, refusals, parsed = copy.deepcopy(config), [], None
    with _deepspeed_logs() as logged:
        for _ in range(100):
            try:
                parsed = _sized_config_class()(copy.deepcopy(work), world_size)
                break
            except ValidationError as error:
                prefix = _SECTIONS.get(error.title, error.title)
                if prefix == "bf16" and "bf16" not in work and "bfloat16" in work:
                    prefix = "bfloat16"  # DeepSpeed's older name for the section
                dropped = True
                for e in error.errors():
                    loc = tuple(str(p) for p in ((prefix,) if prefix else ()) + tuple(e["loc"]))
                    key = ".".join(loc) or "ds_config"
                    message = e["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
                    kind = "unknown" if e["type"] == "extra_forbidden" else "parse"
                    refusals.append(Refusal(key, f"{key}: {message}", kind))
                    dropped = _drop(work, loc) and dropped
                if not dropped:
                    return refusals, _warnings(logged)
            except (
                DeepSpeedConfigError,
                AssertionError,
                ValueError,
                TypeError,
                AttributeError,
                KeyError,
            ) as error:
                line = _first_line(error)
                key = _assertion_key(line, work) or _malformed_key(work)
                refusals.append(Refusal(key or "ds_config", f"{key or 'ds_config'}: {line}"))
                if not _repair(work, key):
                    return refusals, _warnings(logged)
    if parsed is not None:
        refusals += _engine_start_refusals(parsed)
    return refusals, _warnings(logged)


def _engine_start_refusals(parsed) -> list[Refusal]:
    from kit.rules import NCCL_ALIGNMENT

    out = []
    z = parsed.zero_config
    if z.stage in (1, 2) and z.allgather_bucket_size % NCCL_ALIGNMENT:
        key = "zero_optimization.allgather_bucket_size"
        out.append(Refusal(key, f"{key}: " + ALIGNMENT_MESSAGE.format(factor=NCCL_ALIGNMENT), "engine"))
    if z.stage in (1, 2) and not z.compute_grad_norm:  # DeepSpeedZeroOptimizer.__init__
        key = "zero_optimization.compute_grad_norm"
        if (parsed.gradient_clipping or 0) > 0:
            out.append(Refusal(key, f"{key}: {key}=false requires gradient_clipping=0", "engine"))
        if z.offload_optimizer is not None and z.offload_optimizer.device != "none":
            out.append(Refusal(key, f"{key}: {key}=false does not support optimizer offload", "engine"))
    name = (parsed.optimizer_name or "").lower()
    if z.stage > 0 and name == "sgd" and not parsed.zero_allow_untested_optimizer:
        out.append(Refusal("optimizer.type", f"optimizer.type: {UNTESTED_OPTIMIZER_MESSAGE}", "engine"))
    return out


def _assertion_key(line: str, config: dict) -> str | None:
    """The key a DeepSpeed assertion without a field is about, or a quoted key it names."""
    for text, key in _ASSERTIONS:
        if text in line:
            return key
    for quoted in re.findall(r"'([\w.]+)'", line):
        if _lookup(config, quoted.split(".")) is not _MISSING:
            return quoted
    return None


def _malformed_key(config: dict) -> str | None:
    """A section that is not an object, or a batch size that is not a number: what DeepSpeed's parser
    trips over with a TypeError or AttributeError that names no key."""
    for name, value in config.items():
        deprecated_zero = name == "zero_optimization" and isinstance(value, bool)
        if name in _SECTION_CLASSES and not isinstance(value, dict) and not deprecated_zero:
            return name
    for key in _BATCH_KEYS:
        value = config.get(key)
        if key in config and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            return key
    return None


def _repair(config: dict, key: str | None) -> bool:
    """Take a refused setting out of ``config`` so the parse can go on; False when it cannot."""
    if key is None:
        return False
    if key == "bf16.enabled":
        fp16 = config.get("fp16")
        if isinstance(fp16, dict):
            fp16["enabled"] = False
            return True
        return False
    if key in _BATCH_KEYS:  # one batch error says it all: go on with a batch DeepSpeed accepts
        for k in _BATCH_KEYS:
            config.pop(k, None)
        config["train_micro_batch_size_per_gpu"] = 1
        return True
    return _drop(config, tuple(key.split(".")))


_MISSING = object()


def _lookup(config: Any, path: list[str]) -> Any:
    for part in path:
        if not isinstance(config, dict) or part not in config:
            return _MISSING
        config = config[part]
    return config


def _drop(config: dict, loc: tuple[str, ...]) -> bool:
    parent = _lookup(config, list(loc[:-1]))
    if isinstance(parent, dict) and loc and loc[-1] in parent:
        del parent[loc[-1]]
        return True
    return False


class _Stderr:
    """A stream that is whatever ``sys.stderr`` is when written to."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


@cache
def _deepspeed_logger() -> logging.Logger:
    """DeepSpeed's logger, writing to stderr: its handler binds ``sys.stdout`` when deepspeed is first
    imported, which would break ``--json``'s one object on stdout. Import-time lines (which accelerator)
    are dropped."""
    with contextlib.redirect_stdout(io.StringIO()):
        from deepspeed.utils import logger
    for handler in logger.handlers:
        # DeepSpeed's own console handler only: not a file, nor a capturing handler someone else attached
        if type(handler) is logging.StreamHandler:
            handler.setStream(_Stderr())
    return logger


@contextmanager
def _deepspeed_logs():
    """DeepSpeed's log records collected instead of printed, while parsing."""
    logger = _deepspeed_logger()
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    saved = logger.handlers[:]
    logger.handlers = [Keep(logging.WARNING)]
    try:
        yield records
    finally:
        logger.handlers = saved


def _warnings(records: list) -> list[str]:
    lines = [r.getMessage().splitlines()[0] for r in records if r.levelno >= logging.WARNING]
    return list(dict.fromkeys(line for line in lines if "Setting accelerator" not in line))


#: ds_config sections DeepSpeed parses with its pydantic config classes (module, class)
_SECTION_CLASSES = {
    "zero_optimization": ("deepspeed.runtime.zero.config", "DeepSpeedZeroConfig"),
    "bf16": ("deepspeed.runtime.precision_config", "DeepSpeedBF16Config"),
    "bfloat16": ("deepspeed.runtime.precision_config", "DeepSpeedBF16Config"),
    "fp16": ("deepspeed.runtime.precision_config", "DeepSpeedFP16Config"),
    "comms_logger": ("deepspeed.comm.config", "CommsLoggerConfig"),
    "compile": ("deepspeed.compile.config", "CompileConfig"),
    "tensorboard": ("deepspeed.monitor.config", "TensorBoardConfig"),
    "wandb": ("deepspeed.monitor.config", "WandbConfig"),
    "csv_monitor": ("deepspeed.monitor.config", "CSVConfig"),
    "comet": ("deepspeed.monitor.config", "CometConfig"),
}


@cache
def known_keys(section: str = "") -> tuple[str, ...] | None:
    """The keys DeepSpeed reads in a ds_config section (``""``: the top level; ``"zero_optimization"``,
    ``"zero_optimization.offload_param"``, ``"bf16"``...), or None for a section DeepSpeed does not
    check key by key.

    The top level: every key ``DeepSpeedConfig`` looks up while parsing (recorded on a config that
    watches its lookups), and ``sequence_parallel_size`` (read only under an initialised process group).
    DeepSpeed ignores any other top-level key silently. A section: the field names and aliases of the
    pydantic class DeepSpeed parses it with (which refuses any other key). Imports deepspeed.
    """
    import importlib

    if not section:
        return tuple(sorted(_top_level_keys() | {"sequence_parallel_size"}))
    first, *rest = section.split(".")
    if first not in _SECTION_CLASSES:
        return None
    module, name = _SECTION_CLASSES[first]
    _deepspeed_logger()
    cls = getattr(importlib.import_module(module), name)
    for part in rest:
        field = cls.model_fields.get(part)
        cls = _model_class(field.annotation) if field else None
        if cls is None:
            return None
    names = set()
    for field_name, field in cls.model_fields.items():
        names.add(field_name)
        if field.alias:
            names.add(field.alias)
    return tuple(sorted(names))


def _model_class(annotation: Any) -> type | None:
    """The pydantic class of a field (``Optional[X]`` included), else None."""
    from typing import get_args

    from pydantic import BaseModel

    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _top_level_keys() -> set[str]:
    seen: set[str] = set()

    class Keys:
        def __init__(self, d: dict):
            self.d = d

        def __contains__(self, key: object) -> bool:
            seen.add(key)
            return dict.__contains__(self.d, key)

        def __iter__(self):
            return iter(dict.keys(self.d))

        def __len__(self) -> int:
            return dict.__len__(self.d)

    class Watched(dict):
        def get(self, key, *default):
            seen.add(key)
            return super().get(key, *default)

        def __getitem__(self, key):
            seen.add(key)
            return super().__getitem__(key)

        def __contains__(self, key: object) -> bool:
            seen.add(key)
            return super().__contains__(key)

        def keys(self):
            return Keys(self)

        def __copy__(self):
            return self

    with _deepspeed_logs():
        _sized_config_class()(Watched({"train_batch_size": 1}), 1)
    return {k for k in seen if isinstance(k, str)}


def read_ds_config(
    config: dict | str | Path,
    *,
    model: ModelSpec,
    cluster: Cluster | dict | None = None,
    seq_len: int | None = None,
    micro_batch: int | None = None,
    grad_accum: int | None = None,
    train_batch: int | None = None,
    zero_init: bool = True,
) -> tuple[Setup, list[str]]:
    """The Setup a user's ds_config describes, and one note per value resolved or ignored on the way.

    ``"auto"`` values are resolved as HF Trainer does: batch sizes from the given ``micro_batch`` /
    ``grad_accum`` / ``train_batch``, bucket sizes from the model's hidden size. A batch value given
    here must agree with a number in the file (HF Trainer's rule). ``zero_init`` is not part of a
    ds_config (the training script decides whether to build the model under ``deepspeed.zero.Init``).
    """
    if isinstance(config, (str, Path)):
        config = _read_json(Path(config))
    if not isinstance(config, dict):
        raise ValueError(f"ds_config: must be a JSON object, got {type(config).__name__}")
    cluster = cluster if isinstance(cluster, Cluster) else Cluster.model_validate(cluster or {})
    notes: list[str] = []
    _reject_unsupported(config)
    flags = {"micro_batch": micro_batch, "grad_accum": grad_accum, "train_batch": train_batch}
    batch = {**_batch(config, flags, notes), "seq_len": seq_len}
    zero = {**_zero(config, model, notes), "zero_init": zero_init}
    zero["precision"] = _precision(config, cluster, notes)
    zero.update(_optimizer(config, notes))
    zero["activation_checkpointing"] = isinstance(config.get("activation_checkpointing"), dict)
    setup = Setup(model=model, cluster=cluster, zero=zero, batch=batch)
    for key, name in _BATCH_KEYS.items():
        if config.get(key) == "auto" and batch[name] is None:
            notes.append(f"{key}: 'auto' -> {getattr(setup.batch, name)} (from the other batch values)")
    return setup, notes


def from_ds_config(config: dict | str | Path, **options: Any) -> Setup:
    """The Setup a ds_config (dict or path) describes; ``read_ds_config``'s options, without the notes."""
    return read_ds_config(config, **options)[0]


def _read_json(path: Path) -> dict:
    def no_duplicates(pairs: list) -> dict:
        keys = [k for k, _ in pairs]
        for k in keys:
            if keys.count(k) > 1:
                raise ValueError(f"ds_config: {path}: duplicate key {k!r}")
        return dict(pairs)

    try:
        return json.loads(path.read_text(), object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as error:
        raise ValueError(f"ds_config: {path}: not valid JSON (line {error.lineno}: {error.msg})") from None


def _section(config: dict, name: str) -> dict:
    value = config.get(name, {})
    if not isinstance(value, dict):
        raise ValueError(f"{name}: must be a JSON object, got {value!r}")
    return value


def _reject_unsupported(config: dict) -> None:
    for section, key, unused, what in _UNSUPPORTED:
        value = (config if section is None else _section(config, section)).get(key, unused)
        if value not in (unused, "auto"):
            name = key if section is None else f"{section}.{key}"
            raise ValueError(f"{name}: {what} is not modelled by zero-kit (got {value!r}; use {unused!r})")
    zero = _section(config, "zero_optimization")
    for kind in ("offload_optimizer", "offload_param"):
        offload = _section(zero, kind)
        if offload.get("device", "none") not in ("none", "cpu", "nvme"):
            raise ValueError(
                f"zero_optimization.{kind}.device: must be 'none', 'cpu' or 'nvme', got {offload['device']!r}"
            )
        if offload.get("ratio", 1.0) != 1.0:
            raise ValueError(f"zero_optimization.{kind}.ratio: partial offload is not modelled; use 1.0")
        for key in ("pipeline_read", "pipeline_write", "super_offload"):
            if offload.get(key, False) not in (False, "auto"):
                raise ValueError(
                    f"zero_optimization.{kind}.{key}: the pipelined / superchip optimizer swapper is not "
                    f"modelled by zero-kit (got {offload[key]!r}; use false)"
                )
    if _section(config, "aio").get("use_gds", False) not in (False, "auto"):
        raise ValueError("aio.use_gds: GPUDirect Storage is not modelled by zero-kit (use false)")
    mics = sorted(k for k in zero if k.startswith("mics_"))
    if mics:
        raise ValueError(
            f"zero_optimization.{mics[0]}: MiCS was removed from DeepSpeed 0.19 (its config parser refuses "
            "the key); for a parameter partition inside each node use ZeRO++ hpZ, "
            '"zero_hpz_partition_size": <GPUs per node> (stage 3)'
        )


def _batch(config: dict, flags: dict, notes: list[str]) -> dict:
    """Batch values from the file, "auto" ones from the flags (None lets the Setup resolve them)."""
    batch = {}
    for key, name in _BATCH_KEYS.items():
        value, flag = config.get(key), flags[name]
        if value == "auto":
            if flag is not None:
                notes.append(f"{key}: 'auto' -> {flag} (given {name})")
            value = flag
        elif value is None:
            value = flag
        elif not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f'{key}: must be a whole number >= 1 or "auto", got {value!r}')
        elif flag is not None and flag != value:
            raise ValueError(f'{key}: ds_config has {value} but {name}={flag} was given; set it to "auto"')
        batch[name] = value
    return batch


def _zero(config: dict, model: ModelSpec, notes: list[str]) -> dict:
    section = _section(config, "zero_optimization")
    zero: dict[str, Any] = {}
    for key, field in _ZERO_KEYS.items():
        value = section.get(key)
        if value == "auto" and key in _HIDDEN_AUTO and model.hidden:
            formula, rule = _HIDDEN_AUTO[key]
            value = rule(model.hidden)
            notes.append(f"zero_optimization.{key}: 'auto' -> {formula} = {value:,} (hidden {model.hidden})")
        elif value == "auto":
            notes.append(
                f"zero_optimization.{key}: 'auto' -> DeepSpeed's default (the model has no hidden size)"
            )
            continue
        if value is not None:
            zero[field] = value
    # Deprecated spellings DeepSpeed still honours (deepspeed/runtime/zero/config.py).
    if section.get("cpu_offload"):
        zero["offload_optimizer"] = "cpu"
    if section.get("cpu_offload_param"):
        zero["offload_param"] = "cpu"
    for kind in ("offload_optimizer", "offload_param"):
        if _section(section, kind).get("device") in ("cpu", "nvme"):
            zero[kind] = _section(section, kind)["device"]
    stage = zero.setdefault("stage", 0)  # DeepSpeedZeroConfig's default, not ZeroSettings' 2
    zero.update(_zeropp(section, stage, notes))
    zero.update(_nvme(config, stage, zero, notes))
    # DeepSpeed ignores offload settings a stage cannot use; so does the import, and says so.
    for kind in ("offload_optimizer", "offload_param"):
        asked = {"offload_optimizer": "none", "offload_param": "none", kind: zero.get(kind, "none")}
        problem = offload_problem(stage, **asked)
        if problem:
            notes.append(f"zero_optimization.{kind}: ignored, it {problem[1]}")
            del zero[kind]
    return zero


#: ZeRO++ keys of zero_optimization -> ZeroSettings field, and the value that leaves it off
_ZEROPP_KEYS = {
    "zero_hpz_partition_size": ("hpz_partition_size", 1),
    "zero_quantized_weights": ("quantized_weights", False),
    "zero_quantized_gradients": ("quantized_gradients", False),
}


def _zeropp(section: dict, stage: int, notes: list[str]) -> dict:
    """hpZ, qwZ and qgZ from zero_optimization; below stage 3 DeepSpeed ignores them, and so does this."""
    out: dict[str, Any] = {}
    for key, (field, off) in _ZEROPP_KEYS.items():
        value = section.get(key, off)
        if value == "auto":
            notes.append(f"zero_optimization.{key}: 'auto' -> {off!r} (DeepSpeed's default)")
            continue
        if key == "zero_hpz_partition_size" and value == 0:
            value = 1  # DeepSpeed accepts 0 (ge=0) and builds no secondary group for it, as for 1
        if value == off:
            continue
        if stage != 3:
            notes.append(f"zero_optimization.{key}: ignored, ZeRO++ needs stage 3 (got stage {stage})")
            continue
        out[field] = value
    return out


#: offload block key -> ZeroSettings field, per offload block (NVMe offload)
_NVME_KEYS = {
    "offload_param": {
        "buffer_count": "buffer_count",
        "buffer_size": "buffer_size",
        "max_in_cpu": "max_in_cpu",
    },
    "offload_optimizer": {"buffer_count": "optimizer_buffer_count"},
}


def _nvme(config: dict, stage: int, zero: dict, notes: list[str]) -> dict:
    """ZeRO-Infinity settings: the offload blocks' NVMe keys and the top-level ``aio`` block.

    ``offload_optimizer.device: nvme`` below stage 3 is what DeepSpeed runs as CPU offload (stages 1-2
    have no swapper): it is read as ``cpu``, with a note."""
    section = _section(config, "zero_optimization")
    out: dict[str, Any] = {}
    if zero.get("offload_optimizer") == "nvme" and stage in (1, 2):
        notes.append(
            f"zero_optimization.offload_optimizer.device: 'nvme' at stage {stage} keeps the optimizer "
            "states in CPU RAM (stage_1_and_2.py has no NVMe swapper): read as 'cpu'"
        )
        zero["offload_optimizer"] = "cpu"
    paths, pins = set(), set()
    for kind, keys in _NVME_KEYS.items():
        block = _section(section, kind)
        if "pin_memory" in block and zero.get(kind, "none") != "none":
            pins.add(bool(block["pin_memory"]))
        if zero.get(kind) != "nvme":
            continue
        if block.get("nvme_path"):
            paths.add(str(block["nvme_path"]))
        for key, field in keys.items():
            if key in block:
                out[field] = block[key]
    if len(paths) > 1:
        raise ValueError(
            f"zero_optimization.offload_param.nvme_path: zero-kit models one NVMe folder for both offloads, "
            f"got {' and '.join(sorted(paths))}"
        )
    if len(pins) > 1:
        raise ValueError(
            "zero_optimization.offload_param.pin_memory: must equal offload_optimizer's in zero-kit"
        )
    if paths:
        out["nvme_path"] = paths.pop()
    if pins:
        out["pin_memory"] = pins.pop()
    aio = {k: v for k, v in _section(config, "aio").items() if k != "use_gds"}
    if "thread_count" in aio:
        notes.append(
            "aio.thread_count: DeepSpeed 0.19 ignores it (get_aio_config reads intra_op_parallelism)"
        )
        del aio["thread_count"]
    if aio:
        out["aio"] = aio
    return out


def _precision(config: dict, cluster: Cluster, notes: list[str]) -> str:
    bf16 = _section(config, "bf16") or _section(config, "bfloat16")
    enabled = {"bf16": bf16.get("enabled", False), "fp16": _section(config, "fp16").get("enabled", False)}
    for name, value in enabled.items():
        if value not in (True, False, "auto"):
            raise ValueError(f'{name}.enabled: must be true, false or "auto", got {value!r}')
    on = [name for name, value in enabled.items() if value is True]
    if len(on) == 2:
        raise ValueError("bf16.enabled: bf16 and fp16 cannot both be enabled (DeepSpeed asserts the same)")
    if on:
        return on[0]
    auto = [name for name, value in enabled.items() if value == "auto"]
    if not auto:
        return "fp32"
    has_bf16 = gpu(cluster.gpu).bf16_dense_tflops > 0
    choice = "bf16" if "bf16" in auto and has_bf16 else "fp16" if "fp16" in auto else "fp32"
    why = f"the {cluster.gpu} {'supports' if has_bf16 else 'lacks'} bf16"
    notes.append(f"{'/'.join(auto)}.enabled: 'auto' -> {choice} ({why}; HF Trainer reads --bf16/--fp16)")
    return choice


def _optimizer(config: dict, notes: list[str]) -> dict:
    section = _section(config, "optimizer")
    if not section:
        notes.append("optimizer: none in ds_config -> adamw (HF Trainer's default optimizer)")
        return {"optimizer": "adamw"}
    kind = section.get("type")
    params = _section(section, "params")
    if isinstance(kind, str) and kind.lower() in ("adam", "adamw"):
        # DeepSpeed runs "Adam" as AdamW unless adam_w_mode is false (engine._configure_basic_optimizer).
        adamw = kind.lower() == "adamw" or params.get("adam_w_mode", True) is not False
        return {"optimizer": "adamw" if adamw else "adam"}
    if kind == "SGD":
        return {"optimizer": "sgd", "momentum": params.get("momentum", 0.0)}
    raise ValueError(f"optimizer.type: zero-kit models Adam, AdamW and SGD, got {kind!r}")
