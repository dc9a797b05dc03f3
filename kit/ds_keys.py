"""DeepSpeed's config keys the kit reads and writes, each once: the ds_config key, the other spelling
DeepSpeed accepts, the ``ZeroSettings`` field, DeepSpeed's default, the value that turns it off, the
stages that read it, and HF Trainer's ``"auto"`` rule.

The writer (``kit.ds_config.writer``), the reader (``kit.ds_config.reader``) and the review
(``kit.review``) all walk these tables. Defaults are DeepSpeed 0.19's
(``deepspeed/runtime/zero/config.py``, ``offload_config.py``; the numbers live in ``kit.rules``);
``tests/test_dsconfig.py`` checks them against DeepSpeed's own config classes, and the ``"auto"``
rules against transformers' ``HfTrainerDeepSpeedConfig``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kit.rules import (
    DS_ALLGATHER_BUCKET,
    DS_MAX_LIVE_PARAMETERS,
    DS_MAX_REUSE_DISTANCE,
    DS_PERSISTENCE_THRESHOLD,
    DS_PREFETCH_BUCKET,
    DS_REDUCE_BUCKET,
    NVME_MAX_IN_CPU,
    NVME_OPTIMIZER_BUFFER_COUNT,
    NVME_PARAM_BUFFER_COUNT,
    NVME_PARAM_BUFFER_SIZE,
)

ALL_STAGES = (0, 1, 2, 3)
ZERO_STAGES = (1, 2, 3)


@dataclass(frozen=True)
class DsKey:
    """One ds_config key and the ZeroSettings field it sets."""

    #: the spelling the kit writes
    key: str
    field: str
    #: DeepSpeed's default when the key is absent (None: it depends on other keys, e.g. overlap_comm)
    default: Any
    #: the other spelling DeepSpeed accepts (a pydantic alias: ``stage3_x`` for ``x``), or ""
    alias: str = ""
    #: the value that leaves a feature off (ZeRO++), None for a plain setting
    off: Any = None
    #: the ZeRO stages whose optimizer reads the key (written only for them)
    stages: tuple[int, ...] = ZERO_STAGES
    #: HF Trainer's ``"auto"``: (formula text, rule from the model's hidden size), None without one
    hf_auto: tuple[str, Callable[[int], int]] | None = None

    @property
    def spellings(self) -> tuple[str, ...]:
        return (self.key, self.alias) if self.alias else (self.key,)


#: ``zero_optimization``'s keys, in the order the writer writes them
ZERO_KEYS = (
    DsKey("stage", "stage", 0, stages=ALL_STAGES),
    DsKey(
        "reduce_bucket_size", "reduce_bucket_size", DS_REDUCE_BUCKET, hf_auto=("hidden^2", lambda h: h * h)
    ),
    DsKey("contiguous_gradients", "contiguous_gradients", True),
    # None: DeepSpeed's overlap_comm_valid makes it True at stage 3 only
    DsKey("overlap_comm", "overlap_comm", None),
    DsKey("allgather_bucket_size", "allgather_bucket_size", DS_ALLGATHER_BUCKET, stages=(1, 2)),
    DsKey(
        "stage3_prefetch_bucket_size",
        "prefetch_bucket_size",
        DS_PREFETCH_BUCKET,
        alias="prefetch_bucket_size",
        stages=(3,),
        hf_auto=("0.9 hidden^2", lambda h: int(0.9 * h * h)),
    ),
    DsKey(
        "stage3_max_live_parameters",
        "max_live_parameters",
        DS_MAX_LIVE_PARAMETERS,
        alias="max_live_parameters",
        stages=(3,),
    ),
    DsKey(
        "stage3_max_reuse_distance",
        "max_reuse_distance",
        DS_MAX_REUSE_DISTANCE,
        alias="max_reuse_distance",
        stages=(3,),
    ),
    DsKey(
        "stage3_param_persistence_threshold",
        "param_persistence_threshold",
        DS_PERSISTENCE_THRESHOLD,
        alias="param_persistence_threshold",
        stages=(3,),
        hf_auto=("10 hidden", lambda h: 10 * h),
    ),
    # ZeRO++ (stage 3; DeepSpeed 0.19 ignores them below): hpZ, qwZ, qgZ
    DsKey("zero_hpz_partition_size", "hpz_partition_size", 1, off=1, stages=(3,)),
    DsKey("zero_quantized_weights", "quantized_weights", False, off=False, stages=(3,)),
    DsKey("zero_quantized_gradients", "quantized_gradients", False, off=False, stages=(3,)),
)
#: ZeRO++'s keys (the ZERO_KEYS with an off value)
ZEROPP_KEYS = tuple(k for k in ZERO_KEYS if k.off is not None)
#: the ZeroSettings fields that turn ZeRO++ off (what a change to stages 0-2, DDP or FSDP must also set)
ZEROPP_OFF = {k.field: k.off for k in ZEROPP_KEYS}

#: NVMe offload's keys per offload block (``offload_param``, ``offload_optimizer``), beside ``device``,
#: ``pin_memory`` and ``nvme_path``
NVME_KEYS = {
    "offload_param": (
        DsKey("buffer_count", "buffer_count", NVME_PARAM_BUFFER_COUNT, stages=(3,)),
        DsKey("buffer_size", "buffer_size", NVME_PARAM_BUFFER_SIZE, stages=(3,)),
        DsKey("max_in_cpu", "max_in_cpu", NVME_MAX_IN_CPU, stages=(3,)),
    ),
    "offload_optimizer": (
        DsKey("buffer_count", "optimizer_buffer_count", NVME_OPTIMIZER_BUFFER_COUNT, stages=(3,)),
    ),
}
#: the folder examples, the panels and the plan suggest for NVMe swap files (a drive mounted per node)
EXAMPLE_NVME_PATH = "/local_nvme"

#: top-level batch keys -> Batch field
BATCH_KEYS = {
    "train_micro_batch_size_per_gpu": "micro_batch",
    "gradient_accumulation_steps": "grad_accum",
    "train_batch_size": "train_batch",
}

#: zero_optimization keys only stage 3 reads (``DeepSpeedZeroOptimizer_Stage3``, ``zero.Init``) that the
#: kit does not model, by their ``stage3_`` alias and by name; with the modelled ones in ``STAGE3_KEYS``
_STAGE3_UNMODELLED = (
    "stage3_model_persistence_threshold", "model_persistence_threshold",
    "stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save",
    "stage3_gather_fp16_weights_on_model_save", "stage3_module_granularity_threshold",
    "module_granularity_threshold", "stage3_use_all_reduce_for_fetch_params",
    "use_all_reduce_for_fetch_params", "stage3_allgather_sequential", "allgather_sequential",
    "sub_group_size",
)  # fmt: skip
#: every zero_optimization key only stage 3 reads; the stage 1-2 optimizer and stage 0 never look at them
STAGE3_KEYS = tuple(s for k in ZERO_KEYS if k.stages == (3,) for s in k.spellings) + _STAGE3_UNMODELLED


def zero_key(spelling: str) -> DsKey | None:
    """The ZERO_KEYS entry a zero_optimization key (either spelling) belongs to, or None."""
    return next((k for k in ZERO_KEYS if spelling in k.spellings), None)


def hf_auto(key: str, hidden: int) -> int:
    """What HF Trainer writes for ``"auto"`` in zero_optimization ``key`` for a model of ``hidden`` size
    (``HfTrainerDeepSpeedConfig.trainer_config_finalize``); KeyError for a key it does not size."""
    entry = zero_key(key)
    if entry is None or entry.hf_auto is None:
        raise KeyError(key)
    return entry.hf_auto[1](hidden)
