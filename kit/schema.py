"""The Setup: everything a user chooses, validated once and frozen.

Every consumer (estimator, ds_config exporter, runner, plots, widgets) takes a ``Setup`` and nothing
else. Validation errors name the field and the allowed range (``one_line_error`` makes them one line);
the batch is resolved here, once.
"""

from __future__ import annotations

import re
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kit import batch as batch_math
from kit import checkpointing, hf_models, labels, trainable
from kit import loss as losses
from kit import sequence_parallel as ulysses
from kit.checkpointing import Policy
from kit.ds_keys import EXAMPLE_NVME_PATH
from kit.loss import Loss
from kit.rules import (
    AIO_BLOCK_SIZE,
    AIO_INTRA_OP_PARALLELISM,
    AIO_QUEUE_DEPTH,
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
    Offload,
    baseline_name,
    baseline_problem,
    hpz_cluster_problem,
    offload_problem,
    zeropp_problem,
)

Precision = Literal["fp32", "fp16", "bf16"]
Optimizer = Literal["adamw", "adam", "sgd"]
#: the longest sequence a Setup accepts (tokens per sample)
MAX_SEQ_LEN = 1_048_576


class Dims(NamedTuple):
    """A transformer's shape with every field known (``ModelSpec.dims``): the defaults written once."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int  #: the heads when the config has no grouped-query attention
    ffn: int  #: 4 x hidden when the config does not say
    vocab: int  #: 0 when the model has no token embedding


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ModelSpec(_Frozen):
    """What is trained. Built by ``kit.models`` from a preset, an HF config, a module or a count."""

    name: str = "custom"
    params: int = Field(gt=0, description="exact trainable parameter count (tied weights once)")
    largest_layer_params: int = Field(
        gt=0, description="largest parameters(recurse=False) sum of one module (DeepSpeed's definition)"
    )
    family: str | None = Field(None, description="architecture family, e.g. gpt2, llama, dit")
    layers: int | None = Field(None, gt=0)
    hidden: int | None = Field(None, gt=0)
    heads: int | None = Field(None, gt=0)
    kv_heads: int | None = Field(None, gt=0)
    ffn: int | None = Field(None, gt=0)
    vocab: int | None = Field(None, gt=0)
    max_seq_len: int | None = Field(None, gt=0)
    tied_embeddings: bool = False
    #: the logits are the tied embeddings' weight times the output in the model's own forward, no head
    #: module (Megatron's GPTModel): an external parameter of the top module (partition.external_head)
    head_weight_external: bool = False
    #: canonical JSON of the config settings the counts were read from (exact tensors)
    arch: str | None = None
    #: a model file's absolute path or a module with model() and batch() (kit.model_files)
    source: str | None = None

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.largest_layer_params > self.params:
            raise ValueError(
                f"largest_layer_params: must be <= params ({self.params:,}), "
                f"got {self.largest_layer_params:,}"
            )
        if self.heads and self.hidden and self.hidden % self.heads:
            raise ValueError(f"heads: must divide hidden ({self.hidden}), got {self.heads}")
        if self.kv_heads and self.heads and self.heads % self.kv_heads:
            raise ValueError(f"kv_heads: must divide heads ({self.heads}), got {self.kv_heads}")
        return self

    @property
    def is_transformer(self) -> bool:
        return all(v is not None for v in (self.layers, self.hidden, self.heads))

    @property
    def dims(self) -> Dims:
        """The shape the activations and kernels are computed from; a ValueError for a count-only model."""
        if self.layers is None or self.hidden is None or self.heads is None:
            raise ValueError(
                f"model {self.name}: layers, hidden and heads are unknown (a parameter count only), "
                "so nothing shaped by them can be computed"
            )
        return Dims(
            self.layers, self.hidden, self.heads, self.kv_heads or self.heads, self.ffn or 4 * self.hidden,
            self.vocab or 0,
        )  # fmt: skip


class Cluster(_Frozen):
    """Where it runs: nodes x GPUs per node of one GPU type (a name in data/gpus.csv)."""

    nodes: int = Field(1, ge=1, le=4096)
    gpus_per_node: int = Field(8, ge=1, le=64)
    gpu: str = "H100-SXM-80GB"
    cpu_ram_per_node_bytes: int | None = Field(None, gt=0)
    interconnect: Literal["infiniband", "efa", "ethernet"] = "infiniband"

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, name: str) -> str:
        from kit.gpus import gpu_names

        names = gpu_names()
        if name not in names:
            raise ValueError(f"gpu: unknown GPU {name!r}; choose one of {', '.join(names)}")
        return name

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


class AioSettings(_Frozen):
    """The ds_config ``aio`` block: how DeepSpeed's async_io op reads and writes NVMe swap files
    (defaults of ``deepspeed/runtime/swap_tensor/constants.py``). ``intra_op_parallelism`` is the
    block older docs call ``thread_count``; it also sets the swap files' alignment (1024 B x it)."""

    block_size: int = Field(
        AIO_BLOCK_SIZE, ge=1, description="bytes per I/O request; tensors below max(1 MiB, it) stay in RAM"
    )
    queue_depth: int = Field(AIO_QUEUE_DEPTH, ge=1)
    intra_op_parallelism: int = Field(AIO_INTRA_OP_PARALLELISM, ge=1, description="I/O threads per request")
    single_submit: bool = False
    overlap_events: bool = True


class ZeroSettings(_Frozen):
    """The ZeRO knobs. Bucket sizes count elements, as in DeepSpeed's config.

    ``engine`` ``ddp`` / ``fsdp`` runs PyTorch's own engine as a baseline standing for the ZeRO stage whose
    states it shards (``kit.rules.BASELINES``), so the one ``stage`` field describes every engine.

    NVMe offload (ZeRO-Infinity, ``offload_* = "nvme"``): ``nvme_path`` (one folder for both swappers),
    the parameter swapper's ``buffer_count`` x ``buffer_size`` pinned buffers and ``max_in_cpu``
    (parameter elements kept in pinned RAM instead), the optimizer swapper's ``optimizer_buffer_count``,
    ``pin_memory`` (both offload blocks) and the ``aio`` block; defaults are DeepSpeed's
    (``deepspeed/runtime/zero/offload_config.py``).
    """

    stage: Literal[0, 1, 2, 3] = 2
    offload_optimizer: Offload = Offload.NONE
    offload_param: Offload = Offload.NONE
    precision: Precision = "bf16"
    optimizer: Optimizer = "adamw"
    momentum: float = Field(0.0, ge=0.0, lt=1.0, description="SGD momentum; > 0 keeps one state per param")
    reduce_bucket_size: int = Field(DS_REDUCE_BUCKET, gt=0)
    allgather_bucket_size: int = Field(DS_ALLGATHER_BUCKET, gt=0)
    prefetch_bucket_size: int = Field(DS_PREFETCH_BUCKET, ge=0)
    max_live_parameters: int = Field(DS_MAX_LIVE_PARAMETERS, ge=0)
    max_reuse_distance: int = Field(
        DS_MAX_REUSE_DISTANCE, ge=0, description="stage 3: keep a gathered parameter if reused this soon"
    )
    param_persistence_threshold: int = Field(DS_PERSISTENCE_THRESHOLD, ge=0)
    overlap_comm: bool | None = Field(None, description="None = DeepSpeed's default (True only for stage 3)")
    contiguous_gradients: bool = True
    activation_checkpointing: bool = False
    checkpoint_every: int = Field(
        1, ge=1, description="checkpoint every k-th block, the others keep everything (1: every block)"
    )
    checkpoint_policy: Policy = Field(
        "full",
        description="what a checkpointed block keeps: full (its input only) or selective-op (matmul and "
        "attention outputs too: PyTorch's selective checkpointing, torchtitan's op policy)",
    )
    cpu_checkpointing: bool = Field(False, description="deepspeed.checkpointing: block inputs in CPU RAM")
    partition_activations: bool = Field(False, description="deepspeed.checkpointing: inputs split over mp")
    zero_init: bool = Field(True, description="stage 3: build the model partitioned (deepspeed.zero.Init)")
    engine: Literal["deepspeed", "ddp", "fsdp"] = Field(
        "deepspeed",
        description="who trains: DeepSpeed ZeRO, or a PyTorch baseline with the same states as a stage "
        "(ddp: stage 0; fsdp: FSDP2 fully_shard, stage 3, or stage 2 for reshard_after_forward=False)",
    )
    expandable_segments: bool = Field(
        False, description="the run sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    )
    # ZeRO++ (stage 3): hpZ, qwZ, qgZ
    hpz_partition_size: int = Field(
        1, ge=1, description="ZeRO++ hpZ: GPUs of a node holding a secondary copy of the parameters"
    )
    quantized_weights: bool = Field(False, description="ZeRO++ qwZ: int8 weight all-gathers")
    quantized_gradients: bool = Field(
        False, description="ZeRO++ qgZ: int4 gradients, hierarchical all-to-all"
    )
    # ZeRO-Infinity (NVMe offload)
    nvme_path: str | None = Field(None, description="folder on the NVMe drive for the swap files")
    buffer_count: int = Field(NVME_PARAM_BUFFER_COUNT, ge=1, description="offload_param: pinned swap buffers")
    buffer_size: int = Field(
        NVME_PARAM_BUFFER_SIZE, ge=1, description="offload_param: elements per swap buffer"
    )
    max_in_cpu: int = Field(NVME_MAX_IN_CPU, ge=0, description="offload_param: elements kept in pinned RAM")
    optimizer_buffer_count: int = Field(
        NVME_OPTIMIZER_BUFFER_COUNT, ge=1, description="offload_optimizer buffers"
    )
    pin_memory: bool = Field(True, description="offload into page-locked RAM (both offload blocks)")
    aio: AioSettings = AioSettings()
    # what trains (kit.trainable)
    lora_rank: int = Field(0, ge=0, le=4096, description="LoRA rank r (peft); 0: no adapters")
    lora_targets: tuple[str, ...] = Field(
        (),
        description="peft's target_modules; () its default for the model type, ('all-linear',) every "
        "linear layer but the head",
    )
    lora_dropout: float = Field(
        0.0, ge=0.0, lt=1.0, description="peft's lora_dropout: each adapter's input dropped with this p"
    )
    freeze_embeddings: bool = Field(False, description="the input embeddings (and a tied head) do not train")
    frozen_blocks: int = Field(0, ge=0, description="the first k blocks do not train")
    qlora: bool = Field(False, description="QLoRA: LoRA on 4-bit NF4 base weights (bitsandbytes; bf16)")
    loss: Loss = Field(
        "plain",
        description="the LM loss: plain cross-entropy, chunked (Liger's fused linear cross-entropy) or cce "
        "(Cut Cross-Entropy: no logits in memory)",
    )
    # how each sequence is split (kit.sequence_parallel)
    sequence_parallel_size: int = Field(
        1, ge=1, le=1024, description="DeepSpeed Ulysses: ranks that split each sequence (1: off)"
    )

    @model_validator(mode="after")
    def _check(self) -> ZeroSettings:
        problem = offload_problem(self.stage, self.offload_optimizer, self.offload_param)
        problem = problem or baseline_problem(
            self.engine, self.stage, self.offload_optimizer, self.offload_param, self.precision
        )
        if problem:
            raise ValueError(": ".join(problem))
        if self.nvme and not self.nvme_path:
            raise ValueError(
                "nvme_path: required when offload_optimizer or offload_param is 'nvme' "
                f"(a folder on the NVMe drive, e.g. {EXAMPLE_NVME_PATH})"
            )
        for line in (checkpointing.problem(self), trainable.problem(self)):
            if line:
                raise ValueError(line)
        if self.momentum and self.optimizer != "sgd":
            raise ValueError(f"momentum: only applies to optimizer 'sgd', got optimizer {self.optimizer!r}")
        zeropp = zeropp_problem(
            self.stage, self.hpz_partition_size, self.quantized_weights, self.quantized_gradients
        )
        if zeropp:
            raise ValueError(": ".join(zeropp))
        if self.engine != "deepspeed" and self.zeropp:
            raise ValueError(
                f"engine: ZeRO++ (hpZ, qwZ, qgZ) is DeepSpeed's; engine {self.engine!r} has none"
            )
        return self

    @property
    def overlap(self) -> bool:
        """overlap_comm as DeepSpeed resolves it (ZeRO config validator ``overlap_comm_valid``); DDP's
        bucketed all-reduce and FSDP's prefetch always overlap backward."""
        if self.engine != "deepspeed":
            return True
        return self.stage == 3 if self.overlap_comm is None else self.overlap_comm

    @property
    def name(self) -> str:
        """``ZeRO stage 2``, or a PyTorch baseline's name (``ddp``, ``fsdp``, ``fsdp-grad-op``)."""
        return baseline_name(self.engine, self.stage) or f"ZeRO stage {self.stage}"

    @property
    def mixed_precision(self) -> bool:
        return self.precision != "fp32"

    @property
    def zeropp(self) -> bool:
        """Whether any of ZeRO++'s hpZ, qwZ, qgZ is on: a field away from its default, DeepSpeed's off value
        (``kit.settings.ZEROPP_OFF``, the registry's, is checked against these fields)."""
        fields = ("hpz_partition_size", "quantized_weights", "quantized_gradients")
        return any(getattr(self, f) != type(self).model_fields[f].default for f in fields)

    @property
    def zeropp_label(self) -> str:
        """The ZeRO++ part of a label: ``"hpz8 qwz qgz"``, ``""`` without ZeRO++."""
        parts = [f"hpz{self.hpz_partition_size}"] if self.hpz_partition_size > 1 else []
        on = (("qwz", self.quantized_weights), ("qgz", self.quantized_gradients))
        return " ".join(parts + [name for name, used in on if used])

    @property
    def offloaded(self) -> bool:
        """Whether anything is offloaded (optimizer states or parameters, to CPU or NVMe)."""
        return (self.offload_optimizer, self.offload_param) != (Offload.NONE, Offload.NONE)

    @property
    def nvme(self) -> bool:
        """Whether anything is offloaded to NVMe (ZeRO-Infinity)."""
        return Offload.NVME in (self.offload_optimizer, self.offload_param)

    def checkpointing(self, on: bool) -> dict[str, Any]:
        """The checkpointing fields with it turned on (keeping these settings' policy) or off, for
        ``Setup.replace`` or ``model_copy`` (a search toggles it)."""
        return checkpointing.fields(self, on)


class BatchChange(_Frozen):
    """From ``step`` on, the batch is this (resolved by ``kit.batch.schedule``)."""

    step: int = Field(ge=1)
    micro_batch: int = Field(ge=1)
    grad_accum: int = Field(ge=1)
    train_batch: int = Field(ge=1)


class Batch(_Frozen):
    """Resolved batch; build it through Setup (which fills the missing one of the three).

    ``micro_batch``, ``grad_accum`` and ``train_batch`` hold from step 0; ``schedule`` changes them at
    later steps (dynamic batch: DeepSpeed's ``set_train_batch_size`` / ``set_train_micro_batch_size``).
    ``max_tokens``: variable-length data (sequences of at most ``seq_len`` tokens) packed into micro
    batches of at most this many tokens (DeepSpeed's ``batch_by_seqlens``); the micro batch is then the
    nominal one, ``max_tokens // seq_len`` full-length sequences, and memory follows the tokens.
    ``target_len``: an encoder-decoder model's decoder tokens (``kit.hf_models.target_len``).
    """

    micro_batch: int = Field(ge=1)
    grad_accum: int = Field(ge=1)
    train_batch: int = Field(ge=1)
    seq_len: int = Field(ge=1, le=MAX_SEQ_LEN)
    schedule: tuple[BatchChange, ...] = ()
    max_tokens: int | None = Field(None, ge=1)
    target_len: int | None = Field(None, ge=1, le=MAX_SEQ_LEN, description="decoder tokens; None: seq_len")


class Setup(_Frozen):
    """One validated, immutable description of a training configuration."""

    model: ModelSpec
    cluster: Cluster = Cluster()
    zero: ZeroSettings = ZeroSettings()
    batch: Batch

    @model_validator(mode="before")
    @classmethod
    def _resolve_batch(cls, data: Any) -> Any:
        """Accept a partial batch (any two of micro/grad_accum/train) and fill in the rest."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        raw = data.get("batch") or {}
        raw = raw.model_dump() if isinstance(raw, BaseModel) else dict(raw)
        cluster = _section(Cluster, "cluster", data.get("cluster", Cluster()))
        model = _section(ModelSpec, "model", data.get("model"))
        seq_len = raw.get("seq_len")  # None: the model's maximum; 0 is refused, not taken as "unset"
        seq_len = ((model.max_seq_len if model is not None else None) or 2048) if seq_len is None else seq_len
        if not isinstance(seq_len, int) or isinstance(seq_len, bool) or not 1 <= seq_len <= MAX_SEQ_LEN:
            raise ValueError(f"seq_len: must be a whole number in [1, {MAX_SEQ_LEN:,}], got {seq_len!r}")
        if model is not None and model.max_seq_len and seq_len > model.max_seq_len:
            raise ValueError(
                f"seq_len: must be <= the model's max_seq_len ({model.max_seq_len}), got {seq_len}"
            )
        target_len = hf_models.target_len(model, raw.get("target_len"), MAX_SEQ_LEN)
        max_tokens = raw.get("max_tokens")
        if max_tokens is not None:
            if raw.get("schedule"):
                raise ValueError(
                    "batch.max_tokens: a token budget decides the batch; drop the batch schedule"
                )
            if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < seq_len:
                raise ValueError(
                    f"batch.max_tokens: must be a whole number >= seq_len ({seq_len}), got {max_tokens!r}: "
                    "DeepSpeed's batch_by_seqlens drops sequences longer than the budget"
                )
            raw["micro_batch"], raw["train_batch"] = max_tokens // seq_len, None
        if raw.get("micro_batch") is None and raw.get("train_batch") is None:
            raw["micro_batch"] = 1
        dp = _data_parallel(cluster, data.get("zero"))
        start = batch_math.resolve(dp, raw.get("micro_batch"), raw.get("grad_accum"), raw.get("train_batch"))
        changes = [
            BatchChange(step=step, **d._asdict())
            for step, d in batch_math.schedule(dp, start, raw.get("schedule") or ())
        ]
        sizes = {"seq_len": seq_len, "max_tokens": max_tokens, "target_len": target_len}
        data["batch"] = Batch(**start._asdict(), **sizes, schedule=tuple(changes))
        data["cluster"], data["model"] = cluster, model
        return data

    @model_validator(mode="after")
    def _check_checkpointing(self) -> Setup:
        """Every k-th block needs k blocks to count."""
        layers, every = self.model.layers, self.zero.checkpoint_every
        if layers and every > layers:
            raise ValueError(
                f"zero.checkpoint_every: must be in [1, {layers}] (the model's blocks), got {every}"
            )
        return self

    @model_validator(mode="after")
    def _check_trainable(self) -> Setup:
        """A trainable subset needs a model whose parts the kit can name (``kit.trainable``); a fused loss
        a language model whose head it can replace (``kit.loss``)."""
        problem = trainable.model_problem(self.zero, self.model) or losses.problem(self.zero, self.model)
        if problem:
            raise ValueError(f"zero.{problem}")
        return self

    @model_validator(mode="after")
    def _check_hpz(self) -> Setup:
        """hpZ's secondary partition lives inside a node: its size divides the GPUs per node and dp."""
        problem = hpz_cluster_problem(self.zero.hpz_partition_size, self.cluster.gpus_per_node, self.zero_dp)
        if problem:
            raise ValueError(": ".join(problem))
        return self

    @model_validator(mode="after")
    def _check_sequence_parallel(self) -> Setup:
        """Ulysses needs a world, heads and a sequence it divides (``kit.sequence_parallel``)."""
        problem = ulysses.problem(self.zero, self.model, self.cluster.world_size, self.batch)
        if problem:
            raise ValueError(f"zero.{problem}")
        return self

    @property
    def dp(self) -> int:
        """Data-parallel size, the batch formula's: every GPU, each group of ``sequence_parallel_size`` GPUs
        as one (they train the same samples; no tensor or pipeline parallelism)."""
        return self.cluster.world_size // self.zero.sequence_parallel_size

    @property
    def dp_words(self) -> str:
        """What ``dp`` counts, for the batch formula's text: ``GPUs``, or groups under sequence parallelism"""
        sp = self.zero.sequence_parallel_size
        return "GPUs" if sp == 1 else f"sequence-parallel groups of {sp} GPUs"

    @property
    def rank_seq_len(self) -> int:
        """Tokens of each sequence one rank holds outside attention: ``seq_len``, its ``1 / sp`` part under
        sequence parallelism (what the activations, the head and the loss of a rank are sized by)."""
        return self.batch.seq_len // self.zero.sequence_parallel_size

    @property
    def zero_dp(self) -> int:
        """The ranks ZeRO partitions the model states over and reduces gradients across: every GPU, those of
        one sequence included (DeepSpeed's ``seq_data_parallel_group``)."""
        return self.cluster.world_size

    @property
    def tokens_per_step(self) -> int:
        return self.batch.train_batch * self.batch.seq_len

    def at_step(self, step: int) -> Setup:
        """The Setup as it trains at ``step`` (its batch schedule applied; no schedule left)."""
        now = None
        for change in self.batch.schedule:
            if change.step <= step:
                now = change
        if now is None and not self.batch.schedule:
            return self
        batch = self.batch if now is None else now
        fields = {k: getattr(batch, k) for k in ("micro_batch", "grad_accum", "train_batch")}
        return self.model_copy(update={"batch": self.batch.model_copy(update={**fields, "schedule": ()})})

    def batch_states(self) -> list[tuple[int, Setup]]:
        """``(first step, Setup at that step)`` for step 0 and each change of the batch schedule."""
        return [(0, self.at_step(0))] + [(c.step, self.at_step(c.step)) for c in self.batch.schedule]

    def samples_before(self, step: int) -> int:
        """Global samples the steps before ``step`` consume (the data offset of ``step``)."""
        states = self.batch_states()
        ends = [first for first, _ in states[1:]] + [step]
        total = 0
        for (first, state), nxt in zip(states, ends, strict=True):
            if first >= step:
                break
            total += (min(nxt, step) - first) * state.batch.train_batch
        return total

    @property
    def label(self) -> str:
        """Short human name, e.g. ``z3 opt-off param-off bf16 mb4`` (``kit.labels.of``); its tokens'
        meanings: ``label_parts``."""
        return labels.of(self)

    def label_parts(self) -> list[tuple[str, str]]:
        """The label's tokens, each with what it means (``kit.labels``): ``[("z3", "ZeRO stage 3"), ("mb8",
        "micro batch 8 per rank (GPU or CPU process)"), ...]``; joined by spaces they are the label."""
        return labels.parts(self.label)

    def replace(self, **changes: Any) -> Setup:
        """A new Setup with some sections changed, e.g. ``s.replace(zero={"stage": 3})``.

        Nested sections are merged. The batch is re-resolved keeping micro batch and gradient
        accumulation (also those of a batch schedule), so ``train_batch`` follows a new cluster size;
        ``batch={"train_batch": 64}`` keeps the micro batch and derives gradient accumulation (or keeps
        whichever you pass); ``batch={"schedule": ()}`` drops a schedule.
        """
        data = self.model_dump()
        old = data["batch"]
        batch = {k: old[k] for k in ("micro_batch", "grad_accum", "seq_len", "max_tokens", "target_len")}
        # a schedule keeps its micro batches and grad accum; global batches follow the cluster
        kept = ("step", "micro_batch", "grad_accum")
        batch["schedule"] = [{k: c[k] for k in kept} for c in old["schedule"]]
        for section, value in changes.items():
            if section not in data:
                raise ValueError(f"{section}: not a Setup section; choose model, cluster, zero or batch")
            value = value.model_dump() if isinstance(value, BaseModel) else value
            if section == "batch":
                if value.get("train_batch") is not None:
                    batch.pop(
                        "grad_accum" if "micro_batch" in value or "grad_accum" not in value else "micro_batch"
                    )
                batch.update(value)
            elif isinstance(value, dict) and section != "model":
                data[section] = {**data[section], **value}
            else:
                data[section] = value
        data["batch"] = batch
        return Setup.model_validate(data)


def _data_parallel(cluster: Cluster, zero: Any) -> int:
    """``Setup.dp`` before the Setup exists (the batch is resolved from it): the world over the sequence
    parallel size, the world itself when that does not divide it (the Setup's check then says so)."""
    if isinstance(zero, ZeroSettings):
        zero = zero.model_dump()
    sp = (zero or {}).get("sequence_parallel_size") if isinstance(zero, dict | None) else 1
    sp = sp if isinstance(sp, int) and not isinstance(sp, bool) and sp >= 1 else 1
    return cluster.world_size // sp if cluster.world_size % sp == 0 else cluster.world_size


def _section(kind: type[BaseModel], name: str, value: Any) -> Any:
    """Validate a nested section early (the batch needs it), reporting errors under its name."""
    if not isinstance(value, dict):
        return value
    try:
        return kind.model_validate(value)
    except ValidationError as error:
        raise ValueError(one_line_error(error, prefix=name)) from None


def one_line_error(error: ValidationError | ValueError, prefix: str = "") -> str:
    """A validation error as one line naming the field(s) and what is allowed, for CLIs and widgets."""
    if not isinstance(error, ValidationError):
        return str(error)
    parts = []
    for e in error.errors():
        loc = ".".join(str(p) for p in ((prefix,) if prefix else ()) + tuple(e["loc"]))
        msg = e["msg"].removeprefix("Value error, ")
        field = re.match(r"(\w+): ", msg)
        if not loc:
            parts.append(msg)
        elif field and field.group(1) == loc.split(".")[-1]:
            parts.append(f"{loc}{msg[len(field.group(1)) :]}")
        elif field:
            parts.append(f"{loc}.{msg}")
        else:
            parts.append(f"{loc}: {msg}")
    return "; ".join(parts)
