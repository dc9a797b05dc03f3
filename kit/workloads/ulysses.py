"""Ulysses sequence parallelism on the ranks (``kit.sequence_parallel``), through DeepSpeed's own attention
and groups (``deepspeed.runtime.sequence_parallel.ulysses_sp``). Imports torch.

- ``register(model, setup)``: DeepSpeed's ``UlyssesSPAttentionHF`` in place of the model's attention
  kernel in transformers' registry, and the sequence-parallel groups; returns the ``mpu`` that
  ``deepspeed.initialize`` takes;
- ``shard(kwargs, member, sp)``: one rank's part of a micro batch, as ``UlyssesSPDataLoaderAdapter`` hands
  it: its ``seq_len / sp`` consecutive tokens, their global ``position_ids`` and the labels shifted before
  the split (``shift_labels``: the group's last token has none). The kit's synthetic samples depend only
  on their index, so each rank builds the whole micro batch and keeps its part instead of gathering it;
- ``unregister()``: transformers' own kernel back, the groups and DeepSpeed's ``groups.mpu`` forgotten, so
  that the next engine in the process starts clean.
"""

from __future__ import annotations

from typing import Any

#: transformers' attention kernels replaced by ``register``, by name
_REPLACED: dict[str, Any] = {}


def register(model, setup):
    """Ulysses for ``model`` (a Hugging Face model) under ``setup``; the mpu for ``deepspeed.initialize``."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    kernel = model.config._attn_implementation
    _REPLACED.setdefault(kernel, ALL_ATTENTION_FUNCTIONS[kernel])
    b = setup.batch
    return UlyssesSPAttentionHF.register_with_transformers(
        model,
        kernel,
        setup.zero.sequence_parallel_size,
        b.micro_batch,
        seq_length=b.seq_len,
        seq_length_is_variable=False,
    )


def shard(kwargs: dict, member: int, sp: int) -> dict:
    """Rank ``member`` of a sequence-parallel group's part of a Hugging Face micro batch (``input_ids`` and
    unshifted ``labels`` of the whole sequences)."""
    import torch

    ids, labels = kwargs["input_ids"], kwargs["labels"]
    samples, length = ids.shape
    part = slice(member * length // sp, (member + 1) * length // sp)
    shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:]
    positions = torch.arange(length).expand(samples, length)
    mine = shifted[:, part].contiguous()
    # the model's loss takes ``shift_labels`` as they are (transformers' ForCausalLMLoss); ``labels`` only
    # has to be there for it to be computed
    return {
        "input_ids": ids[:, part].contiguous(),
        "position_ids": positions[:, part].contiguous(),
        "labels": mine,
        "shift_labels": mine,
    }


def unregister() -> None:
    """Undo ``register`` (no-op when nothing is registered)."""
    from deepspeed.runtime.sequence_parallel import parallel_state_sp
    from deepspeed.utils import groups
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    for kernel, function in _REPLACED.items():
        ALL_ATTENTION_FUNCTIONS[kernel] = function
    _REPLACED.clear()
    parallel_state_sp._release_sequence_parallel_groups()
    groups.mpu = None
