"""DeepSpeed's rules that the kit's numbers depend on, each written once (read from DeepSpeed 0.19).

Defaults are counts of elements, not bytes (``deepspeed/runtime/zero/config.py``). The byte widths and
optimizer states are those of DeepSpeed's ZeRO optimizers (``stage_1_and_2.py``, ``stage3.py``) and of
``torch.optim``; ``Offload`` names where ``offload_*`` puts states, ``offload_problem`` is the stage rule
DeepSpeed applies to it;
``BUS_FACTORS`` (ring factors) turn a collective's buffer, and ``wire_factor`` what DeepSpeed's comms logger
records, into bytes a rank puts on the wire.
"""

from __future__ import annotations

from enum import StrEnum

from kit.components import MODEL_STATES, Component
from kit.units import GIB

#: zero_optimization defaults (DeepSpeedZeroConfig)
DS_REDUCE_BUCKET = 500_000_000
DS_ALLGATHER_BUCKET = 500_000_000
DS_PREFETCH_BUCKET = 50_000_000
DS_MAX_LIVE_PARAMETERS = 1_000_000_000
DS_MAX_REUSE_DISTANCE = 1_000_000_000
DS_PERSISTENCE_THRESHOLD = 100_000
#: stage 0's all-reduce of ``.grad`` (``engine.allreduce_gradients``' ``MEMORY_OPT_ALLREDUCE_SIZE``): buckets
#: of this many elements, each flattened into one copy (``fallback_copies``)
DS_ALLREDUCE_FALLBACK_ELEMENTS = 500_000_000
#: ZeRO-3 ``sub_group_size``: elements the optimizer steps at a time
DS_SUB_GROUP_SIZE = 1_000_000_000
#: stages 1/2 pad the flat 16-bit buffer to a multiple of this x dp (``nccl_start_alignment_factor``)
NCCL_ALIGNMENT = 2
#: DeepSpeed's and torchrun's default rendezvous port
DEFAULT_MASTER_PORT = 29500


class Offload(StrEnum):
    """Where an ``offload_*`` block puts its states: DeepSpeed's ``OffloadDeviceEnum``
    (``deepspeed/runtime/zero/offload_config.py``). Members are the strings a ds_config, the CLI and the
    records hold; ``ZeroSettings`` fields hold the members."""

    NONE = "none"
    CPU = "cpu"
    NVME = "nvme"


#: NVMe offload (ZeRO-Infinity) defaults: ``deepspeed/runtime/zero/offload_config.py`` (offload_param
#: buffer_count 5, buffer_size 1e8 elements, max_in_cpu 1e9 elements; offload_optimizer buffer_count 4)
NVME_PARAM_BUFFER_COUNT = 5
NVME_PARAM_BUFFER_SIZE = 100_000_000
NVME_MAX_IN_CPU = 1_000_000_000
NVME_OPTIMIZER_BUFFER_COUNT = 4
#: the ``aio`` block's defaults (``deepspeed/runtime/swap_tensor/constants.py``)
AIO_BLOCK_SIZE = 1_048_576
AIO_QUEUE_DEPTH = 8
AIO_INTRA_OP_PARALLELISM = 1
#: swap tensors are read and written in pieces of at least this many bytes; smaller tensors stay in RAM
#: (``deepspeed/runtime/swap_tensor/utils.py`` MIN_AIO_BYTES; the swappers use max(it, block_size))
MIN_AIO_BYTES = 1024**2
#: each swap file's length is a multiple of this x intra_op_parallelism bytes (AIO_ALIGNED_BYTES)
AIO_ALIGNED_BYTES = 1024

#: bytes of one fp32 master weight, gradient copy or optimizer state element
FP32 = 4
#: fp32 optimizer state tensors per parameter (Adam: exp_avg and exp_avg_sq; SGD: a momentum buffer
#: only with momentum > 0)
OPTIMIZER_STATES = {"adamw": 2, "adam": 2, "sgd": 0}


#: the model states each stage partitions across data-parallel ranks (ZeRO paper, section 5)
SHARDED = {
    0: (),
    1: (Component.OPTIMIZER_STATES,),
    2: (Component.GRADIENTS, Component.OPTIMIZER_STATES),
    3: MODEL_STATES,
}


#: bytes of one 16-bit (fp16 / bf16) parameter or gradient element
HALF = 2


def element_bytes(precision: str) -> int:
    """Bytes of a parameter or gradient element in the training precision (fp32: 4, fp16/bf16: 2)."""
    return FP32 if precision == "fp32" else HALF


def master_bytes(precision: str) -> int:
    """Bytes per parameter of the fp32 master copy mixed precision keeps (0 when training in fp32)."""
    return 0 if precision == "fp32" else FP32


def optimizer_states(optimizer: str, momentum: float = 0.0) -> int:
    """fp32 optimizer state tensors per parameter."""
    return 1 if optimizer == "sgd" and momentum else OPTIMIZER_STATES[optimizer]


def offload_problem(stage: int, offload_optimizer: str, offload_param: str) -> tuple[str, str] | None:
    """``(field, reason)`` when a stage cannot use the offload asked for, else None.

    Stage 0 has no partitioned optimizer to offload; only stage 3 partitions (and so offloads) parameters.
    NVMe: only stage 3 swaps optimizer states to files (``stage3.py`` ``_configure_tensor_swapping``);
    stages 1-2 accept ``device: nvme`` but keep the states in CPU RAM (``stage_1_and_2.py`` has no swapper).
    """
    if offload_optimizer == Offload.NVME and stage != 3:
        return "offload_optimizer", (
            f"'nvme' needs ZeRO stage 3 (got stage {stage}): stages 1-2 have no NVMe swapper and keep the "
            "states in CPU RAM; use 'cpu'"
        )
    if offload_optimizer != Offload.NONE and stage == 0:
        return (
            "offload_optimizer",
            "needs ZeRO stage 1, 2 or 3 (stage 0 keeps the whole optimizer on each GPU)",
        )
    if offload_param != Offload.NONE and stage != 3:
        return "offload_param", (
            f"needs ZeRO stage 3: only stage 3 partitions the parameters (got stage {stage}); "
            "use offload_optimizer for stages 1-2"
        )
    return None


#: ZeRO++ (Wang et al. 2023, arXiv 2306.10209): qwZ all-gathers weights as int8 (1 B per element, plus
#: one fp32 scale per quantization group of ~8,000 elements, CUDAQuantizer.target_group_size), qgZ moves
#: gradients as int4 (half a byte per element, plus fp32 scales) in a two-hop all-to-all
#: (``all_to_all_quant_reduce``: inside the node, then across nodes); hpZ all-gathers in backward from
#: the secondary partition inside the node. Per 16-bit model bytes M: ZeRO-3 moves M + M + M, ZeRO++
#: 0.5 M + 0 + 0.25 M across nodes.
QUANTIZED_WEIGHT_BYTES = 1.0
QUANTIZED_GRADIENT_BYTES = 0.5
#: the collectives of a ZeRO-3 micro-step, in the order the paper's table lists them
ZERO3_COLLECTIVES = ("forward all-gather", "backward all-gather", "gradient reduce-scatter")


def hpz_from_secondary(trains: bool, first_of_step: bool) -> bool:
    """Whether hpZ gathers a released tensor from its secondary partition, inside the node (the hpZ
    group of h ranks, ``zero_param_process_group``), rather than from its primary partition over every
    rank (DeepSpeed 0.19, ``partition_parameters.py`` ``all_gather_coalesced``: the secondary group when
    the tensor has a ``ds_secondary_tensor``).

    ``_post_step`` drops the secondary partitions of the optimizer's tensors after each step
    (``stage3.py`` ``invalidate_secondary_tensor``), so a trainable tensor's first gather of a step
    (forward's) is over every rank (but in the first step, which finds the secondary partitions
    ``zero.Init`` made). Releasing it after that module copies this rank's 1/h slice of the
    whole tensor, padded to N, into a new secondary partition (``_partition_param_sec``: a copy, no
    collective), and every later gather of the step (backward's, a tied weight's second module) comes
    from it. A frozen tensor is in no optimizer group: its secondary partition, made when it was first
    partitioned, never expires. The persistent tensors' gather after the step (``_post_step``) takes the
    primary partition over every rank (``_allgather_params_coalesced``)."""
    return not (trains and first_of_step)


def zeropp_problem(
    stage: int, hpz: int, quantized_weights: bool, quantized_gradients: bool
) -> tuple[str, str] | None:
    """``(field, reason)`` when a ZeRO++ setting cannot apply: DeepSpeed 0.19 reads hpZ, qwZ and qgZ only
    in stage 3 (``stage3.py``, ``partition_parameters.py``; lower stages ignore them silently)."""
    for field, on in (
        ("hpz_partition_size", hpz > 1),
        ("quantized_weights", quantized_weights),
        ("quantized_gradients", quantized_gradients),
    ):
        if on and stage != 3:
            return field, f"ZeRO++ needs ZeRO stage 3 (got stage {stage}); DeepSpeed ignores it below stage 3"
    return None


def hpz_cluster_problem(hpz: int, gpus_per_node: int, dp: int) -> tuple[str, str] | None:
    """``(field, reason)`` when hpZ's group does not fit the cluster: DeepSpeed builds groups of ``hpz``
    consecutive ranks (``groups._create_zero_param_parallel_group``), which stay inside a node only if
    ``hpz`` divides the GPUs per node, and ``dp / hpz`` groups only if it divides dp."""
    if hpz > 1 and (gpus_per_node % hpz or dp % hpz):
        return "hpz_partition_size", (
            f"must divide gpus_per_node ({gpus_per_node}) and the data-parallel size ({dp}), got {hpz}: "
            "the secondary partition lives inside one node"
        )
    return None


def zeropp_paper_volume(hpz: bool, quantized_weights: bool, quantized_gradients: bool) -> dict[str, float]:
    """Cross-node volume per ZeRO-3 collective in units of M (16-bit model bytes), as the ZeRO++ paper
    counts it: an fp16 all-gather or reduce-scatter moves M; qwZ halves every weight all-gather (int8; in
    DeepSpeed the backward one too), hpZ keeps the backward one inside the node (0 across), qgZ sends
    int4 gradients (0.25 M)."""
    weights = QUANTIZED_WEIGHT_BYTES / 2 if quantized_weights else 1.0
    grads = QUANTIZED_GRADIENT_BYTES / 2 if quantized_gradients else 1.0
    forward, backward, reduce = ZERO3_COLLECTIVES
    return {forward: weights, backward: 0.0 if hpz else weights, reduce: grads}


#: PyTorch's own data-parallel engines, run beside ZeRO as baselines: the name users type (``--stages``)
#: -> (``ZeroSettings.engine``, the ZeRO stage whose states it shards). DDP replicates everything
#: (stage 0); FSDP2 ``fully_shard`` shards parameters, gradients and optimizer states (stage 3), with
#: ``reshard_after_forward=False`` keeping the parameters gathered from forward to backward
#: (``fsdp-grad-op``, FSDP1's SHARD_GRAD_OP: stage 2's communication).
BASELINES = {"ddp": ("ddp", 0), "fsdp": ("fsdp", 3), "fsdp-grad-op": ("fsdp", 2)}
#: torch DDP's default gradient bucket cap (``DistributedDataParallel(bucket_cap_mb=25)``), in MiB
DDP_BUCKET_CAP_MB = 25


def baseline_name(engine: str, stage: int) -> str | None:
    """``"ddp"``, ``"fsdp"`` or ``"fsdp-grad-op"`` for a PyTorch engine, None for DeepSpeed."""
    return next((name for name, pair in BASELINES.items() if pair == (engine, stage)), None)


def baseline_problem(
    engine: str, stage: int, offload_optimizer: str, offload_param: str, precision: str
) -> tuple[str, str] | None:
    """``(field, reason)`` when a PyTorch baseline (engine ddp or fsdp) cannot run these settings."""
    if engine == "deepspeed":
        return None
    if baseline_name(engine, stage) is None:
        stages = " or ".join(str(s) for e, s in BASELINES.values() if e == engine)
        return "stage", f"engine {engine!r} stands for ZeRO stage {stages}, got stage {stage}"
    if offload_optimizer != Offload.NONE or offload_param != Offload.NONE:
        return "offload_optimizer", f"engine {engine!r}: offload is DeepSpeed's; use engine 'deepspeed'"
    if precision == "fp16":
        return "precision", f"engine {engine!r}: fp32 or bf16 (fp16 needs a loss scaler), got 'fp16'"
    return None


def ring_share(world: int) -> float:
    """(N-1)/N: the share of a buffer each rank sends (and receives) in one ring pass over N ranks."""
    return (world - 1) / world


#: nccl-tests' busbw / algbw per collective (``doc/PERFORMANCE.md``): bytes each rank's link carries per
#: byte of the full buffer (all_gather's output, reduce_scatter's input): a ring all-reduce is a
#: reduce-scatter then an all-gather, 2 (N-1)/N; broadcast and reduce send the buffer once.
BUS_FACTORS = {
    "all_reduce": lambda n: 2 * ring_share(n),
    "reduce_scatter": ring_share,
    "all_gather": ring_share,
    "all_to_all": ring_share,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}
#: collectives DeepSpeed's comms logger records by one rank's shard, not the whole buffer
LOGGED_BY_SHARD = ("all_gather",)


def bus_factor(op: str, world: int) -> float:
    """Bytes a rank's link carries per byte of the full buffer of ``op`` on ``world`` ranks (``BUS_FACTORS``);
    ValueError for a collective it does not know."""
    if op not in BUS_FACTORS:
        raise ValueError(f"op: choose one of {', '.join(BUS_FACTORS)}, got {op!r}")
    return BUS_FACTORS[op](world)


def wire_factor(op: str, world: int) -> float:
    """Bytes on the wire per byte the comms logger records for ``op``: ``bus_factor``, times N for the
    collectives it logs by the shard (all-gather: N-1); an unknown op counts once."""
    if op not in BUS_FACTORS:
        return 1.0
    return bus_factor(op, world) * (world if op in LOGGED_BY_SHARD else 1)


def wire_bytes(comm: dict[str, int], world: int) -> int:
    """Bytes one rank sends for the logged collectives (``wire_factor``; unknown ops count once).

    ``comm`` maps a collective (``all_reduce``...) to the bytes DeepSpeed's comms logger recorded.
    """
    if world < 2:
        return 0
    return round(sum(n * wire_factor(op, world) for op, n in comm.items()))


#: what stage 3 gathers at once, as ``stage3_gathered`` computes it (formula texts quote it)
STAGE3_GATHER_FORMULA = (
    "min(Psi, largest layer + a prefetch (tensors until past the bucket), max(largest layer, max live))"
)


def stage3_gathered(params: int, largest_layer: int, prefetch_call: int, max_live: int) -> int:
    """Parameters stage 3 holds gathered at once (``STAGE3_GATHER_FORMULA``): the layer in use plus what
    the prefetcher fetches ahead in one call (``kit.estimate.partition.prefetch_call``: tensors until they
    pass ``stage3_prefetch_bucket_size``), capped by ``stage3_max_live_parameters`` but never below one
    layer (a layer is gathered whole), and never more than the model."""
    return min(params, largest_layer + prefetch_call, max(largest_layer, max_live))


#: a buffer this large per GPU earns a note or warning when a smaller setting does the same job
BIG_BUFFER_BYTES = GIB // 2


def fallback_copies(numels) -> list[int]:
    """Elements of each flat copy stage 0's all-reduce makes of the gradients (``engine.py``
    ``allreduce_no_retain``: tensors in ``module.parameters()`` order join a bucket until it passes
    ``DS_ALLREDUCE_FALLBACK_ELEMENTS``; each bucket is flattened into one copy, a lone tensor reduced in
    place, 0)."""
    out, bucket = [], []
    for numel in numels:
        bucket.append(numel)
        if sum(bucket) > DS_ALLREDUCE_FALLBACK_ELEMENTS:
            out.append(sum(bucket) if len(bucket) > 1 else 0)
            bucket = []
    if bucket:
        out.append(sum(bucket) if len(bucket) > 1 else 0)
    return out
