"""DeepSpeed's rules that the kit's numbers depend on, each written once (read from DeepSpeed 0.19).

Defaults are counts of elements, not bytes (``deepspeed/runtime/zero/config.py``). The byte widths and
optimizer states are those of DeepSpeed's ZeRO optimizers (``stage_1_and_2.py``, ``stage3.py``) and of
``torch.optim``; ``offload_problem`` is the stage rule DeepSpeed applies to ``offload_*``;
``WIRE_FACTORS`` turn what DeepSpeed's comms logger records into bytes a rank puts on the wire.
"""

from __future__ import annotations

from kit.components import MODEL_STATES

#: zero_optimization defaults (DeepSpeedZeroConfig)
DS_REDUCE_BUCKET = 500_000_000
DS_ALLGATHER_BUCKET = 500_000_000
DS_PREFETCH_BUCKET = 50_000_000
DS_MAX_LIVE_PARAMETERS = 1_000_000_000
DS_MAX_REUSE_DISTANCE = 1_000_000_000
DS_PERSISTENCE_THRESHOLD = 100_000
#: ZeRO-3 ``sub_group_size``: elements the optimizer steps at a time
DS_SUB_GROUP_SIZE = 1_000_000_000
#: stages 1/2 pad the flat 16-bit buffer to a multiple of this x dp (``nccl_start_alignment_factor``)
NCCL_ALIGNMENT = 2
#: DeepSpeed's and torchrun's default rendezvous port
DEFAULT_MASTER_PORT = 29500

#: bytes of one fp32 master weight, gradient copy or optimizer state element
FP32 = 4
#: fp32 optimizer state tensors per parameter (Adam: exp_avg and exp_avg_sq; SGD: a momentum buffer
#: only with momentum > 0)
OPTIMIZER_STATES = {"adamw": 2, "adam": 2, "sgd": 0}


#: the model states each stage partitions across data-parallel ranks (ZeRO paper, section 5)
SHARDED = {0: (), 1: ("optimizer_states",), 2: ("gradients", "optimizer_states"), 3: MODEL_STATES}


def element_bytes(precision: str) -> int:
    """Bytes of a parameter or gradient element in the training precision (fp32: 4, fp16/bf16: 2)."""
    return 4 if precision == "fp32" else 2


def master_bytes(precision: str) -> int:
    """Bytes per parameter of the fp32 master copy mixed precision keeps (0 when training in fp32)."""
    return 0 if precision == "fp32" else FP32


def optimizer_states(optimizer: str, momentum: float = 0.0) -> int:
    """fp32 optimizer state tensors per parameter."""
    return 1 if optimizer == "sgd" and momentum else OPTIMIZER_STATES[optimizer]


def offload_problem(stage: int, offload_optimizer: str, offload_param: str) -> tuple[str, str] | None:
    """``(field, reason)`` when a stage cannot use the offload asked for, else None.

    Stage 0 has no partitioned optimizer to offload; only stage 3 partitions (and so offloads) parameters.
    """
    if offload_optimizer != "none" and stage == 0:
        return (
            "offload_optimizer",
            "needs ZeRO stage 1, 2 or 3 (stage 0 keeps the whole optimizer on each GPU)",
        )
    if offload_param != "none" and stage != 3:
        return "offload_param", (
            f"needs ZeRO stage 3: only stage 3 partitions the parameters (got stage {stage}); "
            "use offload_optimizer for stages 1-2"
        )
    return None


#: bytes on the wire per rank, as a multiple of the size DeepSpeed's comms logger records for the op
#: (it logs the whole input for all-reduce / reduce-scatter / reduce and the shard for all-gather):
#: ring all-reduce 2(N-1)/N, reduce-scatter (N-1)/N, all-gather N-1, broadcast / reduce 1.
WIRE_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: n - 1,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}


def wire_factor(op: str, world: int) -> float:
    """Bytes on the wire per byte the comms logger records for ``op`` (``WIRE_FACTORS``; others once)."""
    return WIRE_FACTORS.get(op, lambda _: 1.0)(world)


def wire_bytes(comm: dict[str, int], world: int) -> int:
    """Bytes one rank sends for the logged collectives (``WIRE_FACTORS``; unknown ops count once).

    ``comm`` maps a collective (``all_reduce``...) to the bytes DeepSpeed's comms logger recorded.
    """
    if world < 2:
        return 0
    return round(sum(n * wire_factor(op, world) for op, n in comm.items()))
