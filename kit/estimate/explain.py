"""What an existing ds_config does for one model and cluster, setting by setting (``zerokit explain``).

``explain_ds_config(config, model=..., cluster=...)`` reads a user's DeepSpeed config (HF Trainer
``"auto"`` values resolved as ``kit.ds_config.read_ds_config`` does), has DeepSpeed's own config classes
parse it (``kit.ds_config.deepspeed_refusals``: every refusal, not only the first, plus the checks
DeepSpeed makes only when the engine starts), and then explains each setting with the bytes the kit's
estimate (``kit.estimate.memory``) gives it for this model and cluster:

- ``error``: DeepSpeed refuses the config (an unknown key in a section, a value its parser or engine
  rejects); the suggestion names the fix (the nearest known key, an aligned size, a valid batch);
- ``warning``: a setting that does nothing although it looks like it should (an unknown top-level key,
  which DeepSpeed ignores silently; ``offload_param`` below stage 3), or that costs memory or
  communication for nothing (GB-sized buckets, a prefetch bucket many layers deep, stage 3 where
  stage 2 fits with room to spare);
- ``info``: what every other present setting does, with its number and formula.

Importing this module imports neither torch nor deepspeed; explaining imports deepspeed (its parser).
"""

from __future__ import annotations

import copy
import difflib
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kit import ds_config as dsc
from kit.batch import nearest_valid
from kit.estimate import perf
from kit.estimate.memory import estimate
from kit.gpus import gpu
from kit.rules import DS_REDUCE_BUCKET, NCCL_ALIGNMENT, SHARDED, element_bytes, optimizer_states
from kit.schema import Cluster, ModelSpec, Setup, explain
from kit.units import GIB, MIB

SEVERITIES = ("error", "warning", "info")
#: a buffer this large (per GPU) earns a warning when a smaller setting does the same job
BIG_BUFFER_BYTES = GIB // 2
#: stage 2 "fits with room to spare" when its estimate is at most this share of the GPU's memory
ROOM = 0.8
#: a stage-3 prefetch bucket this many times the largest layer gathers more than it needs
PREFETCH_LAYERS = 4
#: zero_optimization keys only stage 3 reads (``DeepSpeedZeroOptimizer_Stage3``, ``zero.Init``), by
#: their ``stage3_`` alias and by name; the stage 1-2 optimizer and the stage-0 engine never look at them
STAGE3_KEYS = (
    "stage3_prefetch_bucket_size", "prefetch_bucket_size", "stage3_max_live_parameters",
    "max_live_parameters", "stage3_max_reuse_distance", "max_reuse_distance",
    "stage3_param_persistence_threshold", "param_persistence_threshold",
    "stage3_model_persistence_threshold", "model_persistence_threshold",
    "stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save",
    "stage3_gather_fp16_weights_on_model_save", "stage3_module_granularity_threshold",
    "module_granularity_threshold", "stage3_use_all_reduce_for_fetch_params",
    "use_all_reduce_for_fetch_params", "stage3_allgather_sequential", "allgather_sequential",
    "sub_group_size", "zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_gradients",
)  # fmt: skip
#: the top-level keys that mark a dict as a DeepSpeed config when deepspeed is not installed
_FALLBACK_KEYS = (
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "zero_optimization",
    "bf16", "fp16", "optimizer", "scheduler", "gradient_clipping", "steps_per_print",
)  # fmt: skip


@dataclass(frozen=True)
class Finding:
    """One thing to know about one setting: what it does here, and what to change."""

    key: str
    severity: str  # "error" | "warning" | "info"
    message: str
    suggestion: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Explanation:
    """The findings for a ds_config (errors first), the notes (how "auto" was resolved, what the
    estimate assumes) and the Setup it describes (None where the kit cannot build one)."""

    setup: Setup | None
    findings: list[Finding]
    notes: list[str]
    #: why the kit could not read the config as written (its Setup is then of a repaired copy, or None)
    unread: str | None = None

    @property
    def valid(self) -> bool:
        """Whether DeepSpeed accepts the config (no ``error`` finding)."""
        return not self.errors

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    def to_dict(self) -> dict:
        """The ``zerokit explain --json`` object."""
        return {
            "findings": [f.to_dict() for f in self.findings],
            "notes": list(self.notes),
            "setup": self.setup.model_dump(mode="json") if self.setup else None,
            "valid": self.valid,
        }

    def frame(self):
        """The findings as a pandas DataFrame (key, severity, message, suggestion)."""
        import pandas as pd

        columns = ["key", "severity", "message", "suggestion"]
        return pd.DataFrame([f.to_dict() for f in self.findings], columns=columns)


def explain_ds_config(
    config: dict | str | Path,
    *,
    model: ModelSpec,
    cluster: Cluster | dict | None = None,
    seq_len: int | None = None,
    micro_batch: int | None = None,
    grad_accum: int | None = None,
    train_batch: int | None = None,
) -> Explanation:
    """Every problem of ``config`` for ``model`` on ``cluster``, then what each setting does.

    ValueError (one line naming the file) when ``config`` is not JSON, not a JSON object or not a
    DeepSpeed config at all; and when a batch value given here contradicts a number in the file.
    """
    flags = {
        "seq_len": seq_len,
        "micro_batch": micro_batch,
        "grad_accum": grad_accum,
        "train_batch": train_batch,
    }
    raw, cluster, setup, notes, unread = _prepare(config, model, cluster, flags)
    findings = _refusals(raw, setup, cluster, flags, notes)
    if setup is not None:
        taken = {f.key for f in findings}
        findings += [f for f in _settings(raw, setup) if f.key not in taken]
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return Explanation(setup, sorted(findings, key=lambda f: order[f.severity]), notes, unread)


def checked_setup(
    config: dict | str | Path,
    *,
    model: ModelSpec,
    cluster: Cluster | dict | None = None,
    seq_len: int | None = None,
    micro_batch: int | None = None,
    grad_accum: int | None = None,
    train_batch: int | None = None,
) -> tuple[Setup, list[str]]:
    """``read_ds_config``'s Setup and notes, refusing (ValueError) a config DeepSpeed would refuse with
    the message of ``explain_ds_config``'s first error finding (``zerokit estimate --ds-config``)."""
    explanation = explain_ds_config(
        config, model=model, cluster=cluster, seq_len=seq_len, micro_batch=micro_batch,
        grad_accum=grad_accum, train_batch=train_batch,
    )  # fmt: skip
    if explanation.errors:
        raise ValueError(explanation.errors[0].message)
    if explanation.unread or explanation.setup is None:
        raise ValueError(explanation.unread)
    return explanation.setup, explanation.notes


def load_ds_config(config: dict | str | Path) -> tuple[str, dict]:
    """``(name, dict)`` of a ds_config file or dict; ValueError naming the file when it is not JSON, not a
    JSON object, or has none of the keys DeepSpeed reads."""
    if isinstance(config, (str, Path)):
        name = str(config)
        data = dsc._read_json(Path(config))
    else:
        name, data = "ds_config", copy.deepcopy(config)
    if not isinstance(data, dict):
        raise ValueError(f"ds_config: {name}: not a JSON object (got a JSON {type(data).__name__})")
    known = _known("") or _FALLBACK_KEYS
    if not any(key in known for key in data):
        shown = ", ".join(list(data)[:4]) or "no keys"
        raise ValueError(
            f"ds_config: {name}: not a DeepSpeed config: none of its keys ({shown}) is one DeepSpeed reads, "
            "such as train_batch_size or zero_optimization"
        )
    return name, data


# ---------------------------------------------------------------------------------------------------
# reading the config: the Setup, and the config DeepSpeed sees (HF "auto" values resolved)


def _prepare(config, model, cluster, flags):
    _, raw = load_ds_config(config)
    cluster = cluster if isinstance(cluster, Cluster) else Cluster.model_validate(cluster or {})
    notes: list[str] = []
    setup, problem = _setup(raw, model, cluster, flags, notes)
    return raw, cluster, setup, notes, problem


def _setup(raw: dict, model, cluster, flags, notes) -> tuple[Setup | None, str | None]:
    """The Setup the config describes; where the kit cannot read it as it is, the Setup of the config
    with the refused value taken out (said in the notes), or None. Also the reason it could not."""
    try:
        setup, resolved = dsc.read_ds_config(raw, model=model, cluster=cluster, **flags)
        notes += resolved
        return setup, None
    except ValueError as error:
        problem = explain(error)
    if "was given; set it to" in problem:  # a batch flag contradicts the file: the caller's input
        raise ValueError(problem)
    repaired, assumed = _repaired(raw)
    if assumed:
        try:
            setup, resolved = dsc.read_ds_config(repaired, model=model, cluster=cluster, **flags)
            notes += resolved
            notes.append(f"the estimate assumes {assumed}, since {problem}")
            return setup, problem
        except ValueError:
            pass
    notes.append(f"no estimate: {problem}")
    return None, problem


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


def _resolved(raw: dict, setup: Setup | None, flags: dict) -> dict:
    """The config as HF Trainer hands it to DeepSpeed: every "auto" the kit resolves, resolved."""
    config = copy.deepcopy(raw)
    for key, name in dsc._BATCH_KEYS.items():
        if config.get(key) == "auto":
            value = getattr(setup.batch, name) if setup else flags.get(name)
            if value is None:
                del config[key]
            else:
                config[key] = value
    if setup is not None:
        zero = config.get("zero_optimization")
        if isinstance(zero, dict):
            for key, field in dsc._ZERO_KEYS.items():
                if zero.get(key) == "auto":
                    zero[key] = getattr(setup.zero, field)
        for name in ("bf16", "bfloat16", "fp16"):
            section = config.get(name)
            if isinstance(section, dict) and section.get("enabled") == "auto":
                section["enabled"] = setup.zero.precision == ("fp16" if name == "fp16" else "bf16")
    if not any(key in config for key in dsc._BATCH_KEYS if key != "gradient_accumulation_steps"):
        config["train_micro_batch_size_per_gpu"] = setup.batch.micro_batch if setup else 1
    return config


# ---------------------------------------------------------------------------------------------------
# what DeepSpeed refuses (errors) and ignores (unknown top-level keys)


def _refusals(
    raw: dict, setup: Setup | None, cluster: Cluster, flags: dict, notes: list[str]
) -> list[Finding]:
    world = cluster.world_size
    config = _resolved(raw, setup, flags)
    try:
        refused, warned = dsc.deepspeed_refusals(config, world)
    except ImportError:
        notes.append("DeepSpeed is not installed: its own parser did not check this config")
        return []
    findings = []
    for r in refused:
        if r.kind == "unknown":
            message = f"{r.message}: DeepSpeed does not know this key and refuses the config"
        elif r.kind == "engine":
            message = f"{r.message} (DeepSpeed asserts this when the engine starts)"
        else:
            message = f"{r.message} (DeepSpeed's config parser refuses it)"
        findings.append(Finding(r.key, "error", message, _fix(r, config, cluster)))
    for key in raw:
        if _known("") and key not in _known(""):
            findings.append(_ignored_top_level(key))
    for line in warned:
        findings.append(_deprecated(line, raw))
    return findings


def _fix(r, config: dict, cluster: Cluster) -> str:
    """What to change for one refusal."""
    *section, leaf = r.key.split(".")
    if r.kind == "unknown":
        known = _known(".".join(section)) or ()
        return _nearest(leaf, known, where=".".join(section))
    if r.key == "zero_optimization.allgather_bucket_size":
        value = config["zero_optimization"]["allgather_bucket_size"]
        lower = int(value) - int(value) % NCCL_ALIGNMENT
        return (
            f"set it to a multiple of nccl_start_alignment_factor {NCCL_ALIGNMENT}: "
            f"{lower + NCCL_ALIGNMENT:,} (or {lower:,}); stages 1-2 check it in "
            "DeepSpeedZeroOptimizer.__init__ (stage_1_and_2.py)"
        )
    if r.key == "optimizer.type":
        return 'add "zero_allow_untested_optimizer": true, or use Adam/AdamW, which ZeRO supports'
    if r.key == "bf16.enabled":
        has = gpu(cluster.gpu).bf16_dense_tflops > 0
        why = f"the {cluster.gpu} {'supports' if has else 'lacks'} bf16"
        return (
            f"enable one of them, {'bf16' if has else 'fp16'} ({why}), and set the other's enabled to false"
        )
    if r.key in dsc._BATCH_KEYS:
        train, micro = config.get("train_batch_size"), config.get("train_micro_batch_size_per_gpu")
        try:
            if isinstance(train, int) and train > 0:
                micro = micro if isinstance(micro, int) and micro > 0 else None
                return f"{nearest_valid(train, cluster.world_size, micro)} on {cluster.world_size} GPUs"
        except ValueError:
            pass
        return (
            "give train_micro_batch_size_per_gpu (and gradient_accumulation_steps), or a train_batch_size "
            f"that is micro x {cluster.world_size} GPUs x grad_accum"
        )
    if "removed" in r.message or "no longer supported" in r.message:
        return "remove it"
    return "use a value DeepSpeed accepts, or remove the key for DeepSpeed's default"


def _ignored_top_level(key: str) -> Finding:
    message = (
        f"{key}: not a key DeepSpeed reads; DeepSpeedConfig ignores unknown top-level keys silently, so this "
        "setting does nothing"
    )
    zero = _known("zero_optimization") or ()
    if key in zero:
        suggestion = "move it into zero_optimization (a zero_optimization key at the top level is ignored)"
    else:
        suggestion = _nearest(key, _known("") or (), where="")
    return Finding(key, "warning", message, suggestion)


def _deprecated(line: str, raw: dict) -> Finding:
    """A DeepSpeed warning logged while parsing (deprecated keys), keyed where the key is."""
    name = re.search(r"Config parameter (\w+) is deprecated", line)
    key = (
        _find_key(raw, name.group(1))
        if name
        else "zero_optimization"
        if "ZeRO optimization" in line
        else None
    )
    new = re.search(r"use (\S+) instead", line)
    suggestion = f"use {new.group(1)} instead" if new else "follow DeepSpeed's warning"
    return Finding(
        key or "ds_config", "warning", f"{key or 'ds_config'}: DeepSpeed warns: {line}", suggestion
    )


def _find_key(config: Any, name: str, prefix: str = "") -> str | None:
    if not isinstance(config, dict):
        return None
    if name in config:
        return prefix + name
    for key, value in config.items():
        found = _find_key(value, name, f"{prefix}{key}.")
        if found:
            return found
    return None


def _nearest(key: str, known, where: str) -> str:
    match = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    if match:
        return f"rename it to '{match[0]}', the nearest key DeepSpeed knows" + (
            f" in {where}" if where else ""
        )
    return f"remove it: DeepSpeed knows no key like it{' in ' + where if where else ''}"


def _known(section: str):
    try:
        return dsc.known_keys(section)
    except ImportError:
        return None


# ---------------------------------------------------------------------------------------------------
# what each setting does for this model and cluster


def _settings(raw: dict, setup: Setup) -> list[Finding]:
    x = _Context(raw, setup)
    found: list[Finding] = []
    for check in (
        _stage, _reduce_bucket, _overlap, _contiguous, _allgather, _stage3_keys, _offload_param,
        _offload_optimizer, _pin_memory, _prefetch, _max_live, _persistence, _precision, _batch,
        _checkpointing, _optimizer, _zeropp, _nvme,
    ):  # fmt: skip
        found += check(x)
    return found


class _Context:
    """The config, its Setup and estimate, and the helpers the checks share."""

    def __init__(self, raw: dict, setup: Setup):
        self.raw, self.setup = raw, setup
        zero = raw.get("zero_optimization")
        self.zero = zero if isinstance(zero, dict) else {}
        self.z, self.n, self.stage = setup.zero, setup.dp, setup.zero.stage
        self.p = element_bytes(setup.zero.precision)
        self.est = estimate(setup)
        self.gpu = gpu(setup.cluster.gpu)

    def key(self, *names: str) -> str | None:
        """The zero_optimization key as the file spells it (the first of ``names`` present), or None."""
        return next((f"zero_optimization.{n}" for n in names if n in self.zero), None)

    def allocated(self, setup: Setup | None = None) -> int:
        """Bytes per GPU the estimate allocates (everything but the overhead allowance)."""
        e = self.est if setup is None else estimate(setup)
        return e.per_gpu_bytes - e.components["overhead"]

    def delta(self, **zero: Any) -> int:
        """Bytes per GPU this setup allocates beyond the same setup with ``zero`` changed."""
        return self.allocated() - self.allocated(self.setup.replace(zero=zero))

    @property
    def hidden(self) -> int | None:
        return self.setup.model.hidden

    def bucket_count(self) -> int:
        """ipg buffers of reduce_bucket_size: stage 1-2 double them with overlap_comm (setup_buckets)."""
        return 2 if self.stage in (1, 2) and self.z.overlap else 1


def _size(nbytes: float) -> str:
    return f"{nbytes / GIB:.2f} GiB" if abs(nbytes) >= GIB else f"{nbytes / MIB:.2f} MiB"


def _stage(x: _Context) -> list[Finding]:
    s, e, n = x.setup, x.est, x.n
    key = x.key("stage") or "zero_optimization.stage"
    mem = x.gpu.memory_bytes
    comm, how = perf.comm_bytes(s)
    sharded = (
        " and ".join(SHARDED[x.stage]).replace("_", " ").replace("optimizer states and", "optimizer states,")
    )
    why = ""
    if x.stage == 3 and n > 1:
        # stage 2 has no NVMe swapper: compare with its CPU offload
        opt = "cpu" if s.zero.offload_optimizer == "nvme" else s.zero.offload_optimizer
        s2 = s.replace(
            zero={"stage": 2, "offload_param": "none", "offload_optimizer": opt, **perf.ZEROPP_OFF}
        )
        e2 = estimate(s2)
        if e2.per_gpu_bytes <= ROOM * mem and e2.fits[s.cluster.gpu]:
            comm2, how2 = perf.comm_bytes(s2)
            ratio = comm / comm2
            message = (
                f"{key}: stage 3 on {s.model.name} ({s.model.params:,} params) where stage 2 fits with room "
                f"to spare: stage 2 needs {_size(e2.per_gpu_bytes)} per GPU, {e2.per_gpu_bytes / mem:.0%} of "
                f"the {s.cluster.gpu}'s {_size(mem)} (kit.estimate; stage 3: {_size(e.per_gpu_bytes)}). "
                f"Stage 3 all-gathers the parameters in every forward and backward: {_size(comm)} per GPU "
                f"per step ({how}) against stage 2's {_size(comm2)} ({how2}): x{ratio:.2f} (x1.5 in the ZeRO "
                "paper, whose stage 2 reduce-scatters), in per-layer collectives on the critical path"
            )
            suggestion = (
                "use stage 2 (zero_optimization.stage 2, without the stage3_* keys and offload_param): "
                f"{_size(e2.per_gpu_bytes)} per GPU, {_size(comm2)} per GPU per step"
            )
            return [Finding(key, "warning", message, suggestion)]
        why = f"; stage 2 would need {_size(e2.per_gpu_bytes)} ({e2.per_gpu_bytes / mem:.0%} of the GPU)"
    c = e.components
    message = (
        f"{key}: ZeRO stage {x.stage} partitions {sharded or 'nothing'} over {n} GPU(s): model states "
        f"{_size(e.model_states_bytes)} per GPU (parameters {_size(c['parameters'])}, gradients "
        f"{_size(c['gradients'])}, optimizer states {_size(c['optimizer_states'])}), "
        f"{_size(e.per_gpu_bytes)} in all, {e.per_gpu_bytes / mem:.0%} of the {s.cluster.gpu}'s "
        f"{_size(mem)}{why}; communication {_size(comm)} per GPU per step ({how})"
    )
    if e.fits[s.cluster.gpu]:
        return [Finding(key, "info", message, "keep it")]
    where = "GPU" if e.per_gpu_bytes > mem else "node's CPU RAM"
    return [
        Finding(
            key,
            "warning",
            f"{message}: it does not fit the {where}",
            f"see `zerokit plan` for what fits; activations are {_size(c['activations'])} per GPU at micro "
            f"batch {s.batch.micro_batch} (a smaller micro batch or activation checkpointing cuts them)",
        )
    ]


def _noop(key: str, what: str, suggestion: str = "remove it") -> Finding:
    return Finding(key, "info", f"{key}: does nothing here: {what}", suggestion)


def _reduce_bucket(x: _Context) -> list[Finding]:
    key = x.key("reduce_bucket_size")
    if x.stage == 0:
        why = "stage 0 all-reduces gradients in the engine, in buckets of its own (MEMORY_OPT_ALLREDUCE_SIZE)"
        return [_noop(key, why)] if key else []
    rbs, p, count = x.z.reduce_bucket_size, x.p, x.bucket_count()
    cost = x.delta(contiguous_gradients=False)
    key = key or "zero_optimization.reduce_bucket_size"
    if not cost:
        return [
            Finding(
                key,
                "info",
                f"{key} {rbs:,}: gradients are reduced {rbs:,} elements at a time; no buffer of its own "
                "(contiguous_gradients is off)",
                "keep it",
            )
        ]
    where = (
        "the contiguous gradient buffer (ipg bucket) allocated every step"
        + (", doubled by overlap_comm" if count == 2 else "")
        if x.stage < 3
        else "the ipg bucket stage 3 allocates up front for contiguous_gradients"
    )
    said = f"{key} {rbs:,}" + (" (not set: DeepSpeed's default)" if key not in _present(x) else "")
    formula = f"{count} x {p} B x {rbs:,} = {_size(cost)} per GPU ({where}; kit.estimate 'buffers')"
    if x.hidden:
        better, how = x.hidden * x.hidden, f'hidden^2, HF\'s "auto" for hidden {x.hidden}'
    else:
        better, how = x.setup.model.largest_layer_params, "the largest layer"
    if cost >= BIG_BUFFER_BYTES and better < rbs:
        saved = x.delta(reduce_bucket_size=better)
        default = (
            f", DeepSpeed's default {DS_REDUCE_BUCKET:,}"
            if rbs == DS_REDUCE_BUCKET and "(not" not in said
            else ""
        )
        return [
            Finding(
                key,
                "warning",
                f"{said}: {formula}{default}",
                f"set it to {better:,} ({how}): {count} x {p} B x {better:,} = {_size(cost - saved)}, saving "
                f"{_size(saved)} per GPU; gradients then go in more, smaller reductions",
            )
        ]
    return [Finding(key, "info", f"{said}: {formula}", "keep it")]


def _present(x: _Context) -> set[str]:
    return {f"zero_optimization.{k}" for k in x.zero}


def _overlap(x: _Context) -> list[Finding]:
    key = x.key("overlap_comm")
    if not key:
        return []
    if x.stage == 0:
        return [_noop(key, "stage 0 has no ZeRO optimizer; the engine all-reduces after backward")]
    if x.stage == 3:
        return [
            Finding(
                key,
                "info",
                f"{key} {x.z.overlap}: stage 3 runs its reduce-scatters and prefetch all-gathers on a side "
                "stream"
                + ("" if x.z.overlap else " only when on (DeepSpeed's default at stage 3)")
                + "; no extra buffer (one ipg bucket)",
                "keep it on" if x.z.overlap else "turn it on: communication then hides behind compute",
            )
        ]
    rbs, p = x.z.reduce_bucket_size, x.p
    if not x.z.overlap:
        extra = -x.delta(overlap_comm=True)
        return [
            Finding(
                key,
                "info",
                f"{key} false: gradients are reduced after backward, not during it; turning it on adds a "
                f"second buffer of reduce_bucket_size: 1 x {p} B x {rbs:,} = {_size(extra)} per GPU",
                "turn it on if the bucket is small (hidden^2) and the step is communication-bound",
            )
        ]
    extra = x.delta(overlap_comm=False)
    message = (
        f"{key} true: reduces gradients while backward runs, with a second buffer of reduce_bucket_size "
        f"(double buffering, stage_1_and_2.py setup_buckets): + 1 x {p} B x {rbs:,} = {_size(extra)} per GPU"
    )
    if extra >= BIG_BUFFER_BYTES:
        better = x.hidden * x.hidden if x.hidden else x.setup.model.largest_layer_params
        if better < rbs:
            return [
                Finding(
                    key,
                    "warning",
                    f"{message}: it doubles the gradient buffers",
                    f"keep it on and shrink reduce_bucket_size to {better:,}: both buffers then cost 2 x {p} "
                    f"B x {better:,} = {_size(2 * p * better)}",
                )
            ]
    return [Finding(key, "info", message, "keep it")]


def _contiguous(x: _Context) -> list[Finding]:
    key = x.key("contiguous_gradients")
    if not key:
        return []
    if x.stage == 0:
        return [_noop(key, "stage 0 has no ZeRO gradient buckets")]
    cost = x.delta(contiguous_gradients=False)
    on = x.z.contiguous_gradients
    if on:
        message = (
            f"{key} true: copies each gradient into the reduce bucket as it is produced (less "
            f"fragmentation): {x.bucket_count()} x {x.p} B x reduce_bucket_size {x.z.reduce_bucket_size:,} = "
            f"{_size(cost)} per GPU"
        )
        return [Finding(key, "info", message, "keep it; size it with reduce_bucket_size")]
    forced = x.stage < 3 and x.z.offload_optimizer == "cpu"
    message = f"{key} false: no contiguous gradient buffer" + (
        "; DeepSpeed turns it on anyway with offload_optimizer (stage_1_and_2.py: contiguous_gradients or "
        "cpu_offload)"
        if forced
        else ", at the price of fragmentation in backward"
    )
    return [Finding(key, "info", message, "remove it" if forced else "keep it")]


def _allgather(x: _Context) -> list[Finding]:
    key = x.key("allgather_bucket_size")
    if not key:
        return []
    if x.stage == 3:
        return [_noop(key, "stage 3 gathers parameters by prefetch_bucket_size, not allgather_bucket_size")]
    value = x.z.allgather_bucket_size
    return [
        Finding(
            key,
            "info",
            f"{key} {value:,}: allocates nothing; after the step DeepSpeed all-gathers the updated "
            "partitions into the flat parameter buffer with all_gather_into_tensor when the backend has it "
            "(NCCL does), and only otherwise in shards of about this many elements (runtime/utils.py "
            "all_gather_dp_groups)"
            + (
                "; stage 0 partitions nothing (only the BF16 optimizer's fallback reads it)"
                if x.stage == 0
                else ""
            ),
            "keep it (a multiple of 2)",
        )
    ]


def _stage3_keys(x: _Context) -> list[Finding]:
    if x.stage == 3:
        return []
    return [
        _noop(
            f"zero_optimization.{name}",
            "only stage 3 reads it (DeepSpeedZeroOptimizer_Stage3, zero.Init); this config is stage "
            f"{x.stage}",
            "remove it, or use stage 3 if that was the intent",
        )
        for name in x.zero
        if name in STAGE3_KEYS
    ]


#: ZeRO++ keys of zero_optimization -> (ZeroSettings field, value that turns it off, what it does)
_ZEROPP = {
    "zero_hpz_partition_size": (
        "hpz_partition_size",
        1,
        "hpZ: a secondary copy of the parameters partitioned over the node's GPUs; the backward all-gather "
        "reads it inside the node",
    ),
    "zero_quantized_weights": ("quantized_weights", False, "qwZ: every weight all-gather in int8"),
    "zero_quantized_gradients": (
        "quantized_gradients",
        False,
        "qgZ: gradients in int4 by a two-hop all-to-all (inside the node, then across nodes)",
    ),
}


def _zeropp(x: _Context) -> list[Finding]:
    """hpZ, qwZ, qgZ: their bytes per GPU and what they move inside and across nodes per step."""
    if x.stage != 3:
        return []  # _stage3_keys says they do nothing below stage 3
    found = []
    now = perf.comm_by_scope(x.setup)
    for name, (field, off, what) in _ZEROPP.items():
        key = x.key(name)
        if not key or getattr(x.z, field) == off:
            continue
        without = x.setup.replace(zero={field: off})
        before = perf.comm_by_scope(without)
        cost = x.delta(**{field: off})
        message = (
            f"{key} {getattr(x.z, field)}: {what}: {'+' if cost >= 0 else '-'}{_size(abs(cost))} per GPU; "
            f"per GPU per step across nodes {_size(before['inter'])} -> {_size(now['inter'])}, inside the "
            f"node {_size(before['intra'])} -> {_size(now['intra'])} (kit.estimate.perf.collectives)"
        )
        if field != "hpz_partition_size":
            message += "; needs DeepSpeed's CUDA quantizer kernels (no CPU backend)"
        if x.setup.cluster.nodes == 1 and field == "hpz_partition_size":
            message += ": on one node every collective already stays inside the node"
            found.append(Finding(key, "warning", message, "remove it: it costs memory and saves no traffic"))
        else:
            found.append(Finding(key, "info", message, "keep it where the nodes' network is the bottleneck"))
    return found


def _nvme(x: _Context) -> list[Finding]:
    """ZeRO-Infinity: where the swap files go and what they, the pinned buffers and the aio block cost."""
    from kit.estimate import nvme

    found: list[Finding] = []
    z, g = x.z, x.setup.cluster.gpus_per_node
    aio = x.raw.get("aio") if isinstance(x.raw.get("aio"), dict) else {}
    if not z.nvme:
        if aio:
            found.append(_noop("aio", "only NVMe offload reads it (no offload device is 'nvme')"))
        return found
    per_rank = x.est.host_terms
    disk = x.est.nvme_term
    for kind in ("offload_param", "offload_optimizer"):
        section = x.zero.get(kind)
        if _offload_device(section) != "nvme":
            continue
        found.append(
            Finding(
                f"zero_optimization.{kind}.nvme_path",
                "info",
                f"zero_optimization.{kind}.nvme_path {z.nvme_path}: swap files of {_size(disk.bytes)} per "
                f"node ({disk.formula}); use a local NVMe drive per node, not a network file system",
                "keep it; check its bandwidth with `zerokit calibrate --nvme PATH`",
            )
        )
    if z.offload_param == "nvme":
        largest = max(nvme.swapped_params(x.setup), default=0)
        pool = z.buffer_count * nvme.io_aligned(z.buffer_size, x.p, x.setup) * x.p
        found.append(
            Finding(
                "zero_optimization.offload_param.buffer_size",
                "info",
                f"zero_optimization.offload_param.buffer_count x buffer_size: {z.buffer_count} x "
                f"{z.buffer_size:,} elements = {_size(pool)} pinned per rank, {_size(pool * g)} per node; "
                f"each must hold the largest swapped partition ({largest:,})",
                "keep buffer_size just above the largest partition; more buffers prefetch further",
            )
        )
        held = x.est.host_terms["parameters"]
        found.append(
            Finding(
                "zero_optimization.offload_param.max_in_cpu",
                "info",
                f"zero_optimization.offload_param.max_in_cpu {z.max_in_cpu:,}: that many partition elements "
                f"stay in pinned CPU RAM instead of the drive: {_size(held.bytes)} per rank ({held.formula})",
                "lower it when CPU RAM is short (0 keeps every swappable partition on NVMe)",
            )
        )
    if z.offload_optimizer == "nvme":
        buffers = per_rank["buffers"]
        found.append(
            Finding(
                "zero_optimization.offload_optimizer.buffer_count",
                "info",
                f"zero_optimization.offload_optimizer.buffer_count {z.optimizer_buffer_count}: pinned "
                f"buffers of the largest sub group; host buffers {_size(buffers.bytes)} per rank "
                f"({buffers.formula})",
                "keep >= 1 + the optimizer's states (Adam: 3); lower sub_group_size to shrink each buffer",
            )
        )
    if "thread_count" in aio:
        found.append(
            Finding(
                "aio.thread_count",
                "warning",
                "aio.thread_count: DeepSpeed 0.19 ignores it (aio_config.py reads intra_op_parallelism)",
                "rename it to intra_op_parallelism",
            )
        )
    least = nvme.min_swap_bytes(x.setup)
    found.append(
        Finding(
            "aio",
            "info",
            f"aio: block_size {z.aio.block_size:,} B, queue_depth {z.aio.queue_depth}, intra_op_parallelism "
            f"{z.aio.intra_op_parallelism}: tensors under {least:,} B (max(1 MiB, block_size)) stay in RAM; "
            f"swap files are multiples of {1024 * z.aio.intra_op_parallelism:,} B",
            "tune them on the drive with DeepSpeed's ds_nvme_tune / ds_io",
        )
    )
    return found


def _offload_device(section: Any) -> str:
    return section.get("device", "none") if isinstance(section, dict) else "none"


def _offload_param(x: _Context) -> list[Finding]:
    section = x.zero.get("offload_param")
    asked = _offload_device(section) != "none" or x.zero.get("cpu_offload_param")
    key = x.key("offload_param", "cpu_offload_param")
    if not asked or not key:
        return []
    if x.stage < 3:
        params = x.est.components["parameters"]
        if x.z.offload_optimizer == "none" and x.stage > 0:
            saving = x.delta(offload_optimizer="cpu")
            instead = f"use offload_optimizer (device cpu) at stage {x.stage}: saves {_size(saving)} per GPU"
        else:
            instead = "use stage 3 to offload parameters"
        return [
            Finding(
                key,
                "warning",
                f"{key}: ignored at stage {x.stage}: DeepSpeed accepts it but only stage 3 partitions, and "
                "so offloads, parameters (the stage 1-2 optimizer never reads offload_param); the "
                f"parameters stay on the GPU: {_size(params)} per GPU",
                instead + ", or stage 3 with offload_param",
            )
        ]
    saving = x.delta(offload_param="none") * -1
    host = x.est.host_terms["parameters"]
    return [
        Finding(
            key,
            "info",
            f"{key}: the 16-bit parameter partitions live in CPU RAM and are copied up for each all-gather: "
            f"{_size(host.bytes)} per rank on the host ({host.formula}), saving {_size(saving)} per GPU; "
            "every forward and backward crosses PCIe",
            "keep it only if stage 3 without it does not fit",
        )
    ]


def _offload_optimizer(x: _Context) -> list[Finding]:
    section = x.zero.get("offload_optimizer")
    asked = _offload_device(section) != "none" or x.zero.get("cpu_offload")
    key = x.key("offload_optimizer", "cpu_offload")
    if not asked or not key:
        return []
    if x.stage == 0:
        return [
            Finding(
                key,
                "warning",
                f"{key}: ignored at stage 0: there is no ZeRO optimizer to offload (DeepSpeed accepts it)",
                "use stage 1 or 2 with offload_optimizer",
            )
        ]
    saving = -x.delta(offload_optimizer="none")
    host = sum(t.bytes for t in x.est.host_terms.values())
    where = "the CPU, their files to NVMe" if x.setup.zero.offload_optimizer == "nvme" else "the CPU"
    return [
        Finding(
            key,
            "info",
            f"{key}: optimizer states and the optimizer step move to {where}: saves {_size(saving)} per GPU; "
            f"{_size(host)} per rank in host memory ({x.setup.cluster.gpus_per_node} ranks per node: CPU RAM "
            f"per node {_size(x.est.cpu_bytes_per_node)}, {x.est.cpu_term.formula}); gradients go down and "
            "parameters come up over PCIe every step",
            "keep it only if the GPU is too small without it",
        )
    ]


def _pin_memory(x: _Context) -> list[Finding]:
    found = []
    for kind in ("offload_optimizer", "offload_param"):
        section = x.zero.get(kind)
        if not isinstance(section, dict) or not section.get("pin_memory"):
            continue
        key = f"zero_optimization.{kind}.pin_memory"
        device = _offload_device(section)
        used = device != "none" and (x.stage == 3 if kind == "offload_param" else x.stage > 0)
        if not used:
            why = f"device is {device!r}" if device == "none" else f"{kind} is ignored at stage {x.stage}"
            found.append(_noop(key, f"nothing is offloaded ({why}), so nothing is pinned", "remove it"))
            continue
        held = x.est.host_terms
        part = held["parameters"].bytes if kind == "offload_param" else sum(
            held[c].bytes for c in ("gradients", "optimizer_states", "buffers")
        )  # fmt: skip
        found.append(
            Finding(
                key,
                "info",
                f"{key}: the offloaded buffers are page-locked for faster PCIe copies: {_size(part)} per "
                f"rank, {_size(part * x.setup.cluster.gpus_per_node)} per node that the OS cannot swap",
                "keep it unless CPU RAM is short",
            )
        )
    if x.zero.get("cpu_offload_use_pin_memory") and not (
        x.zero.get("cpu_offload") or x.zero.get("cpu_offload_param")
    ):
        found.append(_noop("zero_optimization.cpu_offload_use_pin_memory", "nothing is offloaded"))
    return found


def _prefetch(x: _Context) -> list[Finding]:
    key = x.key("stage3_prefetch_bucket_size", "prefetch_bucket_size")
    if x.stage != 3:
        return []
    value, largest, p = x.z.prefetch_bucket_size, x.setup.model.largest_layer_params, x.p
    psi, live = x.setup.model.params, x.z.max_live_parameters
    fetch = min(psi, largest + value, max(largest, live))
    shown = key or "zero_optimization.stage3_prefetch_bucket_size"
    said = f"{shown} {value:,}" + ("" if key else " (not set: DeepSpeed's default)")
    formula = (
        f"up to min(Psi, largest layer + prefetch, max(largest layer, max live)) = {fetch:,} parameters "
        f"gathered at once: {p} B x {fetch:,} = {_size(p * fetch)} per GPU (kit.estimate 'buffers')"
    )
    better = int(0.9 * x.hidden * x.hidden) if x.hidden else largest
    if value >= PREFETCH_LAYERS * largest and better < value:
        cost = x.delta(prefetch_bucket_size=better)
        if cost > 0:
            how = f'0.9 hidden^2, HF\'s "auto" for hidden {x.hidden}' if x.hidden else "the largest layer"
            return [
                Finding(
                    shown,
                    "warning",
                    f"{said} is {value / largest:.0f}x the largest layer ({largest:,} params): {formula}",
                    f"set it to {better:,} ({how}), saving {_size(cost)} per GPU",
                )
            ]
    return [Finding(shown, "info", f"{said}: {formula}", "keep it")] if key else []


def _max_live(x: _Context) -> list[Finding]:
    found = []
    key = x.key("stage3_max_live_parameters", "max_live_parameters")
    if x.stage == 3 and key:
        cost = x.delta(max_live_parameters=0)
        found.append(
            Finding(
                key,
                "info",
                f"{key} {x.z.max_live_parameters:,}: caps the parameters gathered at once (at least the "
                f"largest layer): {_size(cost)} per GPU more than the smallest cap (kit.estimate 'buffers')",
                "keep it; lower it only if the gathered parameters do not fit",
            )
        )
    key = x.key("stage3_max_reuse_distance", "max_reuse_distance")
    if x.stage == 3 and key:
        found.append(
            Finding(
                key,
                "info",
                f"{key} {x.z.max_reuse_distance:,}: a gathered parameter reused within this many elements is "
                "kept instead of released and gathered again (fewer all-gathers; bounded by "
                "max_live_parameters)",
                "keep it",
            )
        )
    return found


def _persistence(x: _Context) -> list[Finding]:
    key = x.key("stage3_param_persistence_threshold", "param_persistence_threshold")
    if x.stage != 3 or not key:
        return []
    cost = x.delta(param_persistence_threshold=0)
    return [
        Finding(
            key,
            "info",
            f"{key} {x.z.param_persistence_threshold:,}: tensors of at most this many elements stay whole on "
            f"every GPU (no all-gather for them): + {_size(cost)} per GPU over partitioning them all "
            "(kit.estimate 'parameters')",
            "keep it",
        )
    ]


def _precision(x: _Context) -> list[Finding]:
    names = [
        n for n in ("bf16", "bfloat16", "fp16") if isinstance(x.raw.get(n), dict) and "enabled" in x.raw[n]
    ]
    if not names:
        return []
    key = f"{'fp16' if x.z.precision == 'fp16' else names[0]}.enabled"
    e, p = x.est, x.p
    k = optimizer_states(x.z.optimizer, x.z.momentum)
    if x.z.precision == "fp32":
        message = (
            f"{key}: fp32 training: {p} B parameters and gradients per element, model states "
            f"{_size(e.model_states_bytes)} per GPU"
        )
        return [
            Finding(key, "info", message, "bf16 halves parameter and gradient bytes where the GPU has it")
        ]
    message = (
        f"{key}: {x.z.precision} training: {p} B parameters and gradients, an fp32 master copy (4 B) and {k} "
        f"fp32 optimizer states ({4 * k} B) per parameter: model states {_size(e.model_states_bytes)} per GPU"
        + ("; fp16 adds dynamic loss scaling" if x.z.precision == "fp16" else "")
    )
    return [Finding(key, "info", message, "keep it")]


def _batch(x: _Context) -> list[Finding]:
    if not any(k in x.raw for k in dsc._BATCH_KEYS):
        return []
    key = "train_batch_size"
    b, act = x.setup.batch, x.est.components["activations"]
    return [
        Finding(
            key,
            "info",
            f"batch: train_batch_size {b.train_batch} = micro {b.micro_batch} x {x.n} GPUs x grad_accum "
            f"{b.grad_accum}; activations {_size(act)} per GPU at micro batch {b.micro_batch}, sequence "
            f"{b.seq_len} ({x.est.terms['activations'].formula})",
            "keep it",
        )
    ]


def _checkpointing(x: _Context) -> list[Finding]:
    if "activation_checkpointing" not in x.raw:
        return []
    key = "activation_checkpointing"
    off = x.setup.replace(zero={"activation_checkpointing": False})
    saved = x.allocated(off) - x.allocated()
    return [
        Finding(
            key,
            "info",
            f"{key}: configures deepspeed.checkpointing, which acts only where the model calls it (HF: "
            "--gradient_checkpointing); the estimate assumes checkpointed blocks: activations "
            f"{_size(x.est.components['activations'])} per GPU, {_size(saved)} less than without",
            "keep it if the model checkpoints its blocks",
        )
    ]


def _optimizer(x: _Context) -> list[Finding]:
    section = x.raw.get("optimizer")
    if not isinstance(section, dict) or "type" not in section:
        return []
    term = x.est.terms["optimizer_states"]
    where = x.est.host_terms["optimizer_states"]
    at = f"{_size(where.bytes)} per rank in host memory" if where.bytes else f"{_size(term.bytes)} per GPU"
    return [
        Finding(
            "optimizer.type",
            "info",
            f"optimizer.type {section['type']}: {x.z.optimizer}, "
            f"{optimizer_states(x.z.optimizer, x.z.momentum)} fp32 states per parameter: optimizer states "
            f"{at} ({(where if where.bytes else term).formula})",
            "keep it",
        )
    ]


def report(explanation: Explanation, title: str = "") -> str:
    """The readable report: findings grouped by severity, errors first, then the notes."""
    counts = {s: sum(f.severity == s for f in explanation.findings) for s in SEVERITIES}
    lines = [title] if title else []
    s = explanation.setup
    if s is not None:
        z, b, c = s.zero, s.batch, s.cluster
        lines.append(
            f"{s.model.name} ({s.model.params:,} params) on {c.nodes} x {c.gpus_per_node} {c.gpu}: ZeRO "
            f"stage {z.stage}, {z.precision}, offload optimizer={z.offload_optimizer} "
            f"param={z.offload_param}, batch {b.train_batch} = {b.micro_batch} x {s.dp} x {b.grad_accum}"
        )
    verdict = "DeepSpeed accepts this config" if explanation.valid else "DeepSpeed refuses this config"
    lines.append(
        f"{verdict}: {counts['error']} error(s), {counts['warning']} warning(s), {counts['info']} info"
    )
    for severity in SEVERITIES:
        group = [f for f in explanation.findings if f.severity == severity]
        if not group:
            continue
        lines += ["", f"{severity.upper()}S" if severity != "info" else "INFO"]
        for f in group:
            lines += [f"  {f.key}", f"    {f.message}", f"    -> {f.suggestion}"]
    if explanation.notes:
        lines += [""] + [f"note: {n}" for n in explanation.notes]
    return "\n".join(lines)
