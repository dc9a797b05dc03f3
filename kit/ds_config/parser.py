"""The harness around DeepSpeed's own config parser: validation, every refusal, the keys it reads.

``validate_ds_config`` parses a config with DeepSpeed's ``DeepSpeedConfig`` for a data-parallel size
(no process group needed); ``deepspeed_refusals`` collects every refusal, not only the first, plus the
checks DeepSpeed makes only when the engine starts; ``known_keys`` lists the keys DeepSpeed reads per
section. Importing this module imports neither torch nor deepspeed; calling these functions does.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import re
import sys
from contextlib import contextmanager
from functools import cache
from typing import Any, NamedTuple

from kit.ds_keys import BATCH_KEYS
from kit.rules import NCCL_ALIGNMENT, Offload
from kit.units import first_line

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
    from kit.schema import one_line_error

    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size: must be a whole number >= 1, got {world_size!r}")
    if not isinstance(config, dict):
        raise ValueError(f"ds_config: must be a JSON object, got {type(config).__name__}")
    batch = {name: config.get(key) for key, name in BATCH_KEYS.items()}
    numbers = all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in batch.values())
    if numbers and (batch["micro_batch"] is not None or batch["train_batch"] is not None):
        resolve(world_size, **batch)  # DeepSpeed's equation, with valid alternatives
    try:
        return _sized_config_class()(copy.deepcopy(config), world_size)
    except ValidationError as error:
        raise ValueError(one_line_error(error, prefix=_SECTIONS.get(error.title, error.title))) from None
    except (DeepSpeedConfigError, AssertionError, ValueError, TypeError, AttributeError, KeyError) as error:
        raise ValueError(f"ds_config: {first_line(error)}") from None


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
                line = first_line(error)
                culprit = _assertion_key(line, work) or _malformed_key(work)
                refusals.append(Refusal(culprit or "ds_config", f"{culprit or 'ds_config'}: {line}"))
                if not _repair(work, culprit):
                    return refusals, _warnings(logged)
    if parsed is not None:
        refusals += _engine_start_refusals(parsed)
    return refusals, _warnings(logged)


def _engine_start_refusals(parsed) -> list[Refusal]:
    out = []
    z = parsed.zero_config
    if z.stage in (1, 2) and z.allgather_bucket_size % NCCL_ALIGNMENT:
        key = "zero_optimization.allgather_bucket_size"
        out.append(Refusal(key, f"{key}: " + ALIGNMENT_MESSAGE.format(factor=NCCL_ALIGNMENT), "engine"))
    if z.stage in (1, 2) and not z.compute_grad_norm:  # DeepSpeedZeroOptimizer.__init__
        key = "zero_optimization.compute_grad_norm"
        if (parsed.gradient_clipping or 0) > 0:
            out.append(Refusal(key, f"{key}: {key}=false requires gradient_clipping=0", "engine"))
        if z.offload_optimizer is not None and z.offload_optimizer.device != Offload.NONE:
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
    for key in BATCH_KEYS:
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
    if key in BATCH_KEYS:  # one batch error says it all: go on with a batch DeepSpeed accepts
        for k in BATCH_KEYS:
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
    seen: set[object] = set()

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
