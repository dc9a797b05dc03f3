"""The review's checks of the batch: micro batch x GPUs x grad accum, activations and checkpointing."""

from __future__ import annotations

from kit.components import Component
from kit.ds_keys import BATCH_KEYS
from kit.review.context import Context, Finding
from kit.units import size


def batch(x: Context) -> list[Finding]:
    """The batch equation and the activations of the micro batch."""
    if not any(k in x.raw for k in BATCH_KEYS):
        return []
    key = "train_batch_size"
    b, act = x.setup.batch, x.est.components[Component.ACTIVATIONS]
    return [
        Finding(
            key,
            "info",
            f"batch: train_batch_size {b.train_batch} = micro {b.micro_batch} x {x.setup.dp} "
            f"{x.setup.dp_words} x grad_accum {b.grad_accum}; activations {size(act)} per GPU at micro "
            f"batch {b.micro_batch}, sequence {b.seq_len} ({x.est.terms['activations'].formula})",
            "keep it",
        )
    ]


def checkpointing(x: Context) -> list[Finding]:
    """activation_checkpointing: what it saves, where the model checkpoints its blocks."""
    if "activation_checkpointing" not in x.raw:
        return []
    key = "activation_checkpointing"
    off = x.setup.replace(zero=x.setup.zero.checkpointing(False))
    saved = x.allocated(off) - x.allocated()
    return [
        Finding(
            key,
            "info",
            f"{key}: configures deepspeed.checkpointing, which acts only where the model calls it (HF: "
            "--gradient_checkpointing); the estimate assumes checkpointed blocks: activations "
            f"{size(x.est.components['activations'])} per GPU, {size(saved)} less than without",
            "keep it if the model checkpoints its blocks",
        )
    ]
