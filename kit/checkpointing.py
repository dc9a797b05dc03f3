"""Activation checkpointing as people configure it, written once for the estimate and the ranks.

- ``checkpoint_every`` k: blocks k, 2k, 3k, ... (counted from 1) are checkpointed and the others keep
  what autograd saves (torchtitan's ``selective_ac_option = "k"``); k = 1 is every block, what
  DeepSpeed's and Hugging Face's gradient checkpointing do.
- ``checkpoint_policy``: ``full`` recomputes a checkpointed block from its input in backward;
  ``selective-op`` is PyTorch's selective activation checkpointing (``torch.utils.checkpoint`` with a
  ``context_fn``) under torchtitan's op policy (``selective_ac_option = "op"``): a block keeps the outputs
  of its bias-free matmuls (``aten.mm``; every second one, counted per block, is recomputed) and of its
  attention kernel, and recomputes every other op.

The estimate (``kit.estimate.activations``) counts what this keeps from each family's op order; the ranks
(``kit.ranks.engine``) run it. What it cannot see: ops torchtitan's list leaves out are recomputed, so a
matmul with a bias (``aten.addmm``) and an attention that is not ``scaled_dot_product_attention`` (an
eager softmax) are never kept; PyTorch's CPU flash kernel stands in for the CUDA ones on CPU ranks.

DeepSpeed's own options (``activation_checkpointing`` in a ds_config, DeepSpeed 0.19.8's
``runtime/activation_checkpointing/checkpointing.py``) act only where the script checkpoints through
``deepspeed.checkpointing.checkpoint`` after ``deepspeed.checkpointing.configure`` (Megatron-DeepSpeed
does, and the kit's runs); Hugging Face's gradient checkpointing runs ``torch.utils.checkpoint``, which
reads neither.
- ``cpu_checkpointing``: each checkpointed block's floating-point positional inputs go to CPU RAM and come
  back one per recomputed block. On CUDA the async offload engine (``_ActivationOffloadEngine``,
  ``keep_last_count=1``, ``max_fwd_stash_count=2``) keeps the newest input on the GPU and the one before it
  until the next offload drops it: two stay, the others are pinned host copies (``RESIDENT``).
- ``partition_activations``: splits each input over the model-parallel group (``mp_size``); the kit has no
  tensor parallelism, so a whole contiguous clone replaces the input (the original's storage freed): the same
  bytes, one more input during that block's forward. With ``cpu_checkpointing`` the clone goes to CPU RAM by a
  blocking copy (no offload engine): the GPU keeps none, then the one input its recomputation restores.
- ``contiguous_memory_optimization`` (preallocated buffers of ``number_checkpoints`` inputs) is refused by the
  ds_config reader: how many it holds depends on a count the kit does not model.
On CPU ranks the copy to the CPU returns the input itself, so the checkpoints stay in rank memory; DeepSpeed
0.19.8 then empties that input before saving it, so ``cpu_checkpointing`` without ``partition_activations``
fails there (``cpu_ranks_problem``).
"""

from __future__ import annotations

from typing import Literal, get_args

#: what a checkpointed block keeps besides its input (``ZeroSettings.checkpoint_policy``)
Policy = Literal["full", "selective-op"]
POLICIES: tuple[str, ...] = get_args(Policy)
#: attention kernels whose outputs the op policy keeps: torchtitan's (December 2024) and PyTorch's CPU
#: flash kernel, the CPU ranks' stand-in
ATTENTION_OPS = (
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
)


#: DeepSpeed's checkpointing options: ZeroSettings fields, each its ``activation_checkpointing`` key's name
DEEPSPEED_FIELDS = ("cpu_checkpointing", "partition_activations")
#: under ``cpu_checkpointing`` alone, the block inputs a GPU keeps: the async offload engine's newest
#: (``keep_last_count=1``) and the one before it, its forward stash (``max_fwd_stash_count=2``)
RESIDENT = 2


#: the ZeroSettings fields of checkpointing, and the choices a panel offers as their values
FIELDS = ("activation_checkpointing", "checkpoint_every", "checkpoint_policy")
CHOICES: tuple[tuple[str, tuple[bool, int, str]], ...] = (
    ("off", (False, 1, "full")),
    ("every block", (True, 1, "full")),
    ("one block in 2", (True, 2, "full")),
    ("selective (op policy)", (True, 1, "selective-op")),
)


def choices(zero) -> list[tuple[str, tuple[bool, int, str]]]:
    """``CHOICES``, and ``zero``'s own settings (a ``ZeroSettings``) where they are none of them."""
    own = tuple(getattr(zero, field) for field in FIELDS)
    if own in dict(CHOICES).values():
        return list(CHOICES)
    return [*CHOICES, (describe(own[1], own[2]), own)]


def is_checkpointed(block: int, every: int) -> bool:
    """Whether block ``block`` (counted from 0) is checkpointed when every ``every``-th one is."""
    return (block + 1) % every == 0


def keeps_matmul(index: int) -> bool:
    """Whether the op policy keeps a block's ``index``-th bias-free matmul (counted from 1): it keeps the
    first, third, ... and recomputes every second one."""
    return index % 2 == 1


def label(zero) -> str:
    """The checkpointing part of a ``ZeroSettings``' label: ``ckpt``, ``ckpt/2``, ``ckpt-op``, ``ckpt-op/2``,
    with DeepSpeed's options ``ckpt-part``, ``ckpt-cpu``, ``ckpt-part-cpu/2``."""
    z = zero
    op = "-op" if z.checkpoint_policy == "selective-op" else ""
    more = "-part" * z.partition_activations + "-cpu" * z.cpu_checkpointing
    return f"ckpt{op}{more}" + (f"/{z.checkpoint_every}" if z.checkpoint_every > 1 else "")


def describe(every: int, policy: str, cpu: bool = False, partition: bool = False) -> str:
    """One phrase saying what is checkpointed, for estimates and panels."""
    which = "every block" if every == 1 else f"one block in {every}"
    if policy == "selective-op":
        return f"{which}, selective: matmul and attention outputs kept (torchtitan's op policy)"
    where = ""
    if partition:
        where += ", its input partitioned over the model-parallel group (one GPU: a whole copy)"
    if cpu:
        where += ", the inputs in CPU RAM" + (f" but the newest {RESIDENT}" if not partition else "")
    return f"{which}, recomputed from its input{where}"


def resident(zero, checkpoints: int) -> int:
    """Of ``checkpoints`` block inputs, how many a GPU holds at the backward's peak (a ``ZeroSettings``'
    options): all; under ``cpu_checkpointing`` ``RESIDENT``, or with ``partition_activations`` the one its
    recomputation restores."""
    if not zero.cpu_checkpointing:
        return checkpoints
    return min(checkpoints, 1 if zero.partition_activations else RESIDENT)


def on_the_host(zero, checkpoints: int) -> int:
    """Of ``checkpoints`` block inputs, how many one rank keeps in CPU RAM: none; under
    ``cpu_checkpointing`` all but the newest (the offload engine never copies it), with
    ``partition_activations`` all."""
    if not zero.cpu_checkpointing:
        return 0
    return checkpoints if zero.partition_activations else max(checkpoints - 1, 0)


def problem(zero) -> str | None:
    """Why a ``ZeroSettings``' checkpointing fields do not go together, or None: each needs checkpointing
    on, and DeepSpeed's options its checkpoint (policy ``full``)."""
    z = zero
    if not z.activation_checkpointing:
        offs = (("checkpoint_every", 1), ("checkpoint_policy", "full"))
        for field, off in (*offs, *((f, False) for f in DEEPSPEED_FIELDS)):
            if getattr(z, field) != off:
                return f"{field}: applies with activation_checkpointing on; it is off"
    elif z.checkpoint_policy != "full":
        for field in DEEPSPEED_FIELDS:
            if getattr(z, field):
                return (
                    f"{field}: deepspeed.checkpointing's option, and checkpoint_policy 'selective-op' runs "
                    "torch.utils.checkpoint, which never reads it; use checkpoint_policy 'full'"
                )
    return None


def fields(zero, on: bool) -> dict:
    """The checkpointing fields of a ``ZeroSettings`` with it turned on (keeping its policy and DeepSpeed's
    options) or off, for ``Setup.replace`` or ``model_copy`` (a search toggles it)."""
    names = (*FIELDS, *DEEPSPEED_FIELDS)
    if not on:
        return dict(zip(names, (False, 1, "full", False, False), strict=True))
    return {**{name: getattr(zero, name) for name in names}, "activation_checkpointing": True}


def choice(zero, value: tuple[bool, int, str]) -> dict:
    """The fields of a ``CHOICES`` value (the values of ``FIELDS``) applied to a ``ZeroSettings``: its
    DeepSpeed options kept where the choice runs DeepSpeed's checkpoint (on, policy ``full``), else off."""
    fields = dict(zip(FIELDS, value, strict=True))
    deepspeeds = fields["activation_checkpointing"] and fields["checkpoint_policy"] == "full"
    return fields | {name: deepspeeds and getattr(zero, name) for name in DEEPSPEED_FIELDS}


def in_your_script(zero) -> str | None:
    """What a training script does to checkpoint as ``zero`` (a ``ZeroSettings``) says, or None without
    checkpointing: no ds_config key turns it on (``activation_checkpointing`` there only configures
    ``deepspeed.checkpointing`` for a model that calls it)."""
    z = zero
    if not z.activation_checkpointing:
        return None
    titan = "torchtitan: --activation_checkpoint.mode "
    if z.checkpoint_policy == "selective-op":
        how = (
            "wrap each block in torch.utils.checkpoint.checkpoint(..., use_reentrant=False, "
            "context_fn=kit.checkpointing.selective_contexts) (HF: model.gradient_checkpointing_enable("
            "gradient_checkpointing_kwargs={'use_reentrant': False, 'context_fn': selective_contexts}); "
            f"{titan}selective --activation_checkpoint.selective_ac_option op)"
        )
        k = z.checkpoint_every
        return how if k == 1 else f"{how}, on blocks {k}, {2 * k}, ..."
    if z.checkpoint_every > 1:
        return (
            f"checkpoint blocks {z.checkpoint_every}, {2 * z.checkpoint_every}, ... (counted from 1) and "
            f"leave the others ({titan}selective --activation_checkpoint.selective_ac_option "
            f"{z.checkpoint_every})"
        )
    if z.cpu_checkpointing or z.partition_activations:
        return (
            "call deepspeed.checkpointing.configure(None, deepspeed_config=ds_config) before training and "
            "wrap each block in deepspeed.checkpointing.checkpoint (Megatron-DeepSpeed does): its "
            "activation_checkpointing options act there only (HF's gradient checkpointing runs "
            "torch.utils.checkpoint, which reads none of them)"
        )
    return (
        "checkpoint every block (HF Trainer: --gradient_checkpointing; your own loop: "
        f"deepspeed.checkpointing.checkpoint or torch.utils.checkpoint around each block; {titan}full)"
    )


def engine_problem(zero) -> str | None:
    """Why a run cannot checkpoint this way, or None: the op policy needs PyTorch's non-reentrant
    checkpoint, and under DeepSpeed 0.19's ZeRO-3 a parameter its recomputation reads (a norm's weight)
    is partitioned again by then (PyTorch's metadata check or a shape mismatch fails the backward;
    transformers#47254, trl#2514); measured on CPU ranks here."""
    z = zero  # kit.schema.ZeroSettings
    stage3 = z.engine == "deepspeed" and z.stage == 3
    if z.activation_checkpointing and z.checkpoint_policy == "selective-op" and stage3:
        return (
            "zero.checkpoint_policy: 'selective-op' needs a non-reentrant checkpoint, which DeepSpeed 0.19's "
            "ZeRO-3 fails (its parameters are partitioned again when a block is recomputed); "
            "estimate it, run it at stages 0-2"
        )
    return None


def cpu_ranks_problem(cpu: bool, partition: bool) -> str | None:
    """Why a run on CPU ranks cannot checkpoint with DeepSpeed's options ``cpu`` (``cpu_checkpointing``) and
    ``partition`` (``partition_activations``), or None: DeepSpeed 0.19.8's CPU checkpointing alone copies
    each input to the CPU (there: the input itself), empties the input and then saves the copy, now empty
    (measured: the recomputation gets a 0-d tensor)."""
    if cpu and not partition:
        return (
            "zero.cpu_checkpointing: DeepSpeed 0.19.8's CPU checkpointing fails on CPU ranks without "
            "partition_activations (its copy to the CPU is the input itself, emptied before it is saved); "
            "estimate it, run it on a GPU or with partition_activations"
        )
    return None


class OpPolicy:
    """The op policy's decisions for one call of a block: ``keeps(func, recompute)`` counts the block's
    matmuls apart in the forward and in its recomputation, so both decide alike."""

    def __init__(self) -> None:
        import torch

        aten = torch.ops.aten
        self.mm = aten.mm.default
        self.attention = {getattr(aten, name).default for name in ATTENTION_OPS if hasattr(aten, name)}
        self.matmuls = {False: 0, True: 0}

    def keeps(self, func, recompute: bool = False) -> bool:
        if func is self.mm:
            self.matmuls[recompute] += 1
            return keeps_matmul(self.matmuls[recompute])
        return func in self.attention


def selective_contexts():
    """The forward and recompute contexts of the op policy, for ``torch.utils.checkpoint``'s
    ``context_fn`` (called once per block call: each call counts its own matmuls)."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    rule = OpPolicy()

    def policy(ctx, func, *args, **kwargs):
        keep = rule.keeps(func, ctx.is_recompute)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)
