"""``ds_config.json`` -> Setup: what a user's DeepSpeed config describes, HF Trainer's ``"auto"`` resolved.

Reading follows what DeepSpeed itself does with a config (``deepspeed/runtime/config.py``,
``deepspeed/runtime/zero/config.py``) and resolves HF Trainer ``"auto"`` values the way
``transformers.integrations.deepspeed.HfTrainerDeepSpeedConfig`` does (``kit.settings.hf_auto``). Plain
functions over dicts: no torch or deepspeed import (``zerokit estimate --ds-config`` stays instant).
``load_ds_config``, ``read_or_repair`` and ``resolved_for_deepspeed`` are what the review of a config
(``kit.review``) builds on. A feature DeepSpeed runs but zero-kit does not model
(``UNMODELLED``: tensor, sequence, pipeline or expert parallelism, DeepCompile) is refused when on, with
one line naming the key (``unmodelled``), before anything else is read.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, TypedDict, Unpack

from kit.ds_keys import BATCH_KEYS
from kit.fit import supports
from kit.rules import Offload, offload_problem
from kit.schema import Cluster, ModelSpec, Setup, one_line_error
from kit.settings import CHECKPOINTING_KEYS, NVME_KEYS, TOP_KEYS, ZERO_KEYS, ZEROPP_KEYS

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
    (
        "activation_checkpointing",
        "contiguous_memory_optimization",
        False,
        "deepspeed.checkpointing's contiguous buffers (number_checkpoints inputs allocated up front)",
    ),
]


class BatchArgs(TypedDict, total=False):
    """The batch values a caller may give beside a ds_config (``read_ds_config``'s keywords)."""

    seq_len: int | None
    micro_batch: int | None
    grad_accum: int | None
    train_batch: int | None


class Unmodelled(NamedTuple):
    """A feature a ds_config turns on that zero-kit does not model, as DeepSpeed 0.19 reads it."""

    key: str  # dotted, in the ds_config
    name: str
    on: Callable[[Any], bool]  # of a value ``_checked`` accepted
    leaves_out: str  # what the estimate would miss; {n}: the value
    off: str  # the values that leave it off


def _above_one(value: Any) -> bool:
    return value != "auto" and value > 1


#: Each is refused only when on; its off values pass silently. DeepSpeed's pydantic config classes drop
#: an "auto" value (``DeepSpeedConfigModel.__init__``, config_utils.py), so "auto" is their default.
UNMODELLED = (
    # tensor_parallel/config.py ``TPTrainingConfig.autotp_size`` (0: off); engine.py shards the model
    # only ``if self.autotp_size() > 1`` (``_configure_tensor_parallel``).
    Unmodelled(
        "tensor_parallel.autotp_size", "tensor parallelism", _above_one,
        "the {n}-way split of the linear layers' weights, gradients, optimizer states and activations, "
        "and their all-reduces", "0 or 1",
    ),
    # runtime/config.py ``get_pipeline_config``: DeepSpeed itself never reads "stages" (a PipelineModule's
    # num_stages decides), but a whole number > 1 there says the run is pipelined.
    Unmodelled(
        "pipeline.stages", "pipeline parallelism", _above_one,
        "the layers' split over {n} stages and the activations of the micro-batches in flight",
        '"auto" or 1',
    ),
    # compile/config.py ``CompileConfig.deepcompile``: engine.compile() builds DeepCompile's backend
    # (``get_deepspeed_compile_backend``) only ``if self.is_deepcompile_enabled()``; every other compile
    # key is read by that backend, or only with AutoEP (``autoep_non_moe``).
    Unmodelled(
        "compile.deepcompile", "DeepCompile", lambda value: value is True,
        "the torch.compile graph's own schedule of parameter gathers, releases and offloads, which "
        "replaces ZeRO's hooks", "false",
    ),
    # module_inject/auto_ep_config.py ``parse_autoep_config`` reads "enabled" from the dict as it is;
    # engine.py ``_configure_expert_parallel`` replaces the MoE layers ``if autoep_config.enabled``.
    Unmodelled(
        "expert_parallel.enabled", "expert parallelism (AutoEP)", lambda value: value is True,
        "the experts' split over expert_parallel.autoep_size ranks, their all-to-alls and the experts' "
        "own data-parallel groups", "false",
    ),
)  # fmt: skip
#: ``UNMODELLED`` keys DeepSpeed reads as a switch
SWITCHES = ("compile.deepcompile", "expert_parallel.enabled")

#: ``get_pipeline_config``'s defaults (runtime/config.py): a "pipeline" section of these says nothing
_PIPELINE_DEFAULTS = {
    "stages": "auto", "partition": "best", "seed_layers": False, "activation_checkpoint_interval": 0,
    "pipe_partitioned": True, "grad_partitioned": True,
}  # fmt: skip


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
        config = read_json(Path(config))
    if not isinstance(config, dict):
        raise ValueError(f"ds_config: must be a JSON object, got {type(config).__name__}")
    cluster = cluster if isinstance(cluster, Cluster) else Cluster.model_validate(cluster or {})
    notes: list[str] = []
    for _, line in unmodelled(config):
        raise ValueError(line)
    _reject_unsupported(config)
    notes += _unmodelled_notes(config)
    flags = {"micro_batch": micro_batch, "grad_accum": grad_accum, "train_batch": train_batch}
    batch = {**_batch(config, flags, notes), "seq_len": seq_len}
    zero = {**_zero(config, model, notes), "zero_init": zero_init}
    zero["precision"] = _precision(config, cluster, notes)
    zero.update(_optimizer(config, notes))
    zero["activation_checkpointing"] = isinstance(config.get("activation_checkpointing"), dict)
    zero.update(_checkpointing(config))
    zero.update(_top_level(config))
    setup = Setup(model=model, cluster=cluster, zero=zero, batch=batch)
    for key, name in BATCH_KEYS.items():
        if config.get(key) == "auto" and batch[name] is None:
            notes.append(f"{key}: 'auto' -> {getattr(setup.batch, name)} (from the other batch values)")
    return setup, notes


def from_ds_config(config: dict | str | Path, **options: Any) -> Setup:
    """The Setup a ds_config (dict or path) describes; ``read_ds_config``'s options, without the notes."""
    return read_ds_config(config, **options)[0]


def read_json(path: Path) -> dict:
    """A JSON file, refusing duplicate keys; ValueError naming the file and line."""

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


def unmodelled(config: dict, *, quiet: bool = False) -> list[tuple[str, str]]:
    """``(key, line)`` of each feature ``config`` turns on that zero-kit does not model (``UNMODELLED``:
    tensor, sequence, pipeline or expert parallelism, DeepCompile); none for the values that leave it off.
    ValueError (one line) for a value DeepSpeed could not read as one, or with ``quiet`` no lines."""
    try:
        return _unmodelled(config)
    except ValueError:
        if quiet:
            return []
        raise


def _unmodelled(config: dict) -> list[tuple[str, str]]:
    found = []
    for feature in UNMODELLED:
        *path, leaf = feature.key.split(".")
        section = config
        for name in path:
            section = _section(section, name)
        if leaf not in section:
            continue
        value = _checked(feature.key, section[leaf])
        if feature.on(value):
            shown = json.dumps(value)
            found.append((
                feature.key,
                f"ds_config.{feature.key}: {feature.name} ({shown}) is not modelled by zero-kit: "
                f"its estimate would leave out "
                f"{feature.leaves_out.format(n=shown)}; {feature.off} leaves it off",
            ))  # fmt: skip
    return found


def _checked(key: str, value: Any) -> Any:
    """An ``UNMODELLED`` key's value as DeepSpeed reads it, or ValueError naming the key."""
    if key in SWITCHES:
        if isinstance(value, bool) or value == "auto":  # pydantic would take "true" or 1: say which
            return value is True
        raise ValueError(f"ds_config.{key}: must be true or false, got {value!r}")
    lowest = 0 if key == "tensor_parallel.autotp_size" else 1
    whole = isinstance(value, (int, float)) and not isinstance(value, bool) and float(value).is_integer()
    if value == "auto" or (whole and value >= lowest):
        return value if value == "auto" else int(value)
    raise ValueError(f'ds_config.{key}: must be a whole number >= {lowest} or "auto", got {value!r}')


def _checkpointing(config: dict) -> dict[str, bool]:
    """DeepSpeed's activation checkpointing options (``CHECKPOINTING_KEYS``, read by
    ``deepspeed.checkpointing.configure``: ``kit.checkpointing``), each true or false."""
    section = _section(config, "activation_checkpointing")
    out = {}
    for k in CHECKPOINTING_KEYS:
        value = section.get(k.key, k.default)
        if not isinstance(value, bool):
            raise ValueError(f"activation_checkpointing.{k.key}: must be true or false, got {value!r}")
        out[k.field] = value
    return out


def _unmodelled_notes(config: dict) -> list[str]:
    """What may be on in the training script although the ds_config does not say: a "pipeline" section
    (read only for a PipelineModule), an FP8 key (DeepSpeed has none)."""
    notes = []
    pipeline = _section(config, "pipeline")
    if any(_PIPELINE_DEFAULTS.get(k, _MISSING) != v for k, v in pipeline.items() if k != "stages"):
        notes.append(
            "pipeline: only DeepSpeed's PipelineEngine reads it (a PipelineModule model); zero-kit does not "
            "model pipeline parallelism, so this estimate is of a model that is not a PipelineModule"
        )
    for key, value in config.items():
        off = value in (False, None, 0, {}) or (isinstance(value, dict) and value.get("enabled") is False)
        if re.search("fp8|float8", key, re.IGNORECASE) and not off:
            notes.append(
                f"{key}: DeepSpeed has no FP8 setting and ignores this key; FP8 training (Transformer "
                "Engine, torchao) is the training script's, and zero-kit does not model it"
            )
    return notes


_MISSING = object()


def _reject_unsupported(config: dict) -> None:
    for section, key, unused, what in _UNSUPPORTED:
        value = (config if section is None else _section(config, section)).get(key, unused)
        if value not in (unused, "auto"):
            name = key if section is None else f"{section}.{key}"
            raise ValueError(f"{name}: {what} is not modelled by zero-kit (got {value!r}; use {unused!r})")
    zero = _section(config, "zero_optimization")
    for kind in ("offload_optimizer", "offload_param"):
        offload = _section(zero, kind)
        if offload.get("device", Offload.NONE) not in tuple(Offload):
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
    for key, name in BATCH_KEYS.items():
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


def _top_level(config: dict) -> dict:
    """The settings at the file's top level (``sequence_parallel_size``: deepspeed/__init__.py builds a
    data x sequence mesh from it, runtime/config.py divides the batch's world by it); a whole number."""
    zero = {}
    for k in TOP_KEYS:
        value = config.get(k.key)
        if value is None:
            continue
        whole = isinstance(value, (int, float)) and not isinstance(value, bool) and float(value).is_integer()
        if not whole or value < 1:
            raise ValueError(f"ds_config.{k.key}: must be a whole number >= 1, got {value!r}")
        zero[k.field] = int(value)
    return zero


def _zero(config: dict, model: ModelSpec, notes: list[str]) -> dict:
    section = _section(config, "zero_optimization")
    zero: dict[str, Any] = {}
    for k in ZERO_KEYS:
        if k.off is not None:  # ZeRO++: _zeropp
            continue
        for key in k.spellings:
            value = section.get(key)
            if value == "auto" and k.hf_auto and model.hidden:
                formula, rule = k.hf_auto
                value = rule(model.hidden)
                notes.append(
                    f"zero_optimization.{key}: 'auto' -> {formula} = {value:,} (hidden {model.hidden})"
                )
            elif value == "auto":
                notes.append(
                    f"zero_optimization.{key}: 'auto' -> DeepSpeed's default (the model has no hidden size)"
                )
                continue
            if value is not None:
                zero[k.field] = value
    # Deprecated spellings DeepSpeed still honours (deepspeed/runtime/zero/config.py).
    if section.get("cpu_offload"):
        zero["offload_optimizer"] = "cpu"
    if section.get("cpu_offload_param"):
        zero["offload_param"] = "cpu"
    for kind in ("offload_optimizer", "offload_param"):
        if _section(section, kind).get("device") in (Offload.CPU, Offload.NVME):
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


def _zeropp(section: dict, stage: int, notes: list[str]) -> dict:
    """hpZ, qwZ and qgZ from zero_optimization; below stage 3 DeepSpeed ignores them, and so does this."""
    out: dict[str, Any] = {}
    for k in ZEROPP_KEYS:
        key, field, off = k.key, k.field, k.off
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


def _nvme(config: dict, stage: int, zero: dict, notes: list[str]) -> dict:
    """ZeRO-Infinity settings: the offload blocks' NVMe keys and the top-level ``aio`` block.

    ``offload_optimizer.device: nvme`` below stage 3 is what DeepSpeed runs as CPU offload (stages 1-2
    have no swapper): it is read as ``cpu``, with a note."""
    section = _section(config, "zero_optimization")
    out: dict[str, Any] = {}
    if zero.get("offload_optimizer") == Offload.NVME and stage in (1, 2):
        notes.append(
            f"zero_optimization.offload_optimizer.device: 'nvme' at stage {stage} keeps the optimizer "
            "states in CPU RAM (stage_1_and_2.py has no NVMe swapper): read as 'cpu'"
        )
        zero["offload_optimizer"] = "cpu"
    paths, pins = set(), set()
    for kind, keys in NVME_KEYS.items():
        block = _section(section, kind)
        if "pin_memory" in block and zero.get(kind, Offload.NONE) != Offload.NONE:
            pins.add(bool(block["pin_memory"]))
        if zero.get(kind) != Offload.NVME:
            continue
        if block.get("nvme_path"):
            paths.add(str(block["nvme_path"]))
        for k in keys:
            if k.key in block:
                out[k.field] = block[k.key]
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
    has_bf16 = supports(cluster.gpu, "bf16")
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


#: the top-level keys that mark a dict as a DeepSpeed config when deepspeed is not installed
_FALLBACK_KEYS = (
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "zero_optimization",
    "bf16", "fp16", "optimizer", "scheduler", "gradient_clipping", "steps_per_print",
)  # fmt: skip


def load_ds_config(config: dict | str | Path) -> tuple[str, dict]:
    """``(name, dict)`` of a ds_config file or dict; ValueError naming the file when it is not JSON, not a
    JSON object, or has none of the keys DeepSpeed reads (``known_keys``; without deepspeed, the common
    ones)."""
    from kit.ds_config.parser import known_keys

    if isinstance(config, (str, Path)):
        name = str(config)
        data = read_json(Path(config))
    else:
        name, data = "ds_config", copy.deepcopy(config)
    if not isinstance(data, dict):
        raise ValueError(f"ds_config: {name}: not a JSON object (got a JSON {type(data).__name__})")
    try:
        known = known_keys("") or _FALLBACK_KEYS  # the top level is always checked key by key
    except ImportError:
        known = _FALLBACK_KEYS
    if not any(key in known for key in data):
        shown = ", ".join(list(data)[:4]) or "no keys"
        raise ValueError(
            f"ds_config: {name}: not a DeepSpeed config: none of its keys ({shown}) is one DeepSpeed reads, "
            "such as train_batch_size or zero_optimization"
        )
    return name, data


def read_or_repair(
    raw: dict, *, model: ModelSpec, cluster: Cluster, **batch: Unpack[BatchArgs]
) -> tuple[Setup | None, list[str], str | None]:
    """``(setup, notes, problem)``: ``read_ds_config``'s Setup and notes; where the kit cannot read the
    config as it is, the Setup of a copy with the refused value taken out (said in the notes), or None,
    and the reason (``problem``). A batch value given here that contradicts the file: ValueError."""
    try:
        setup, notes = read_ds_config(raw, model=model, cluster=cluster, **batch)
        return setup, notes, None
    except ValueError as error:
        problem = one_line_error(error)
    if "was given; set it to" in problem:  # a batch flag contradicts the file: the caller's input
        raise ValueError(problem)
    repaired, assumed = _repaired(raw)
    if assumed:
        try:
            setup, notes = read_ds_config(repaired, model=model, cluster=cluster, **batch)
            return setup, [*notes, f"the estimate assumes {assumed}, since {problem}"], problem
        except ValueError:
            pass
    key = next((key for key, line in unmodelled(raw, quiet=True) if line == problem), None)
    if key:  # the review's error finding says it in full
        return None, [f"no estimate: zero-kit does not model what {key} turns on (its error)"], problem
    return None, [f"no estimate: {problem}"], problem


def _repaired(raw: dict) -> tuple[dict, str]:
    """The config with what DeepSpeed refuses and the kit cannot read taken out, and what that assumes."""
    config, assumed = copy.deepcopy(raw), []
    bf16, fp16 = config.get("bf16") or config.get("bfloat16"), config.get("fp16")
    if (
        isinstance(bf16, dict)
        and isinstance(fp16, dict)
        and bf16.get("enabled") is True
        and fp16.get("enabled")
    ):
        fp16["enabled"] = False
        assumed.append("bf16 (fp16 off)")
    if isinstance(config.get("train_batch_size"), int) and (
        "train_micro_batch_size_per_gpu" in config or "gradient_accumulation_steps" in config
    ):
        del config["train_batch_size"]
        assumed.append("train_batch_size = micro x GPUs x grad_accum")
    return config, " and ".join(assumed)


def resolved_for_deepspeed(raw: dict, setup: Setup | None, batch: dict) -> dict:
    """The config as HF Trainer hands it to DeepSpeed: every ``"auto"`` the kit resolves, resolved (from
    ``setup``, or the given ``batch`` values where there is no Setup)."""
    config = copy.deepcopy(raw)
    for key, name in BATCH_KEYS.items():
        if config.get(key) == "auto":
            value = getattr(setup.batch, name) if setup else batch.get(name)
            if value is None:
                del config[key]
            else:
                config[key] = value
    if setup is not None:
        zero = config.get("zero_optimization")
        if isinstance(zero, dict):
            for k in ZERO_KEYS:
                for key in k.spellings if k.off is None else ():
                    if zero.get(key) == "auto":
                        zero[key] = getattr(setup.zero, k.field)
        for name in ("bf16", "bfloat16", "fp16"):
            section = config.get(name)
            if isinstance(section, dict) and section.get("enabled") == "auto":
                section["enabled"] = setup.zero.precision == ("fp16" if name == "fp16" else "bf16")
    if not any(key in config for key in BATCH_KEYS if key != "gradient_accumulation_steps"):
        config["train_micro_batch_size_per_gpu"] = setup.batch.micro_batch if setup else 1
    return config
