"""Ulysses sequence parallelism on the ranks (``kit.sequence_parallel``), through DeepSpeed's own attention
and groups (``deepspeed.runtime.sequence_parallel.ulysses_sp``). Imports torch.

- ``register(model, setup)``: DeepSpeed's ``UlyssesSPAttentionHF`` around the model's attention, and the
  sequence-parallel groups; returns the ``mpu`` that ``deepspeed.initialize`` takes. A Hugging Face model:
  in place of its kernel in transformers' registry (``register_with_transformers``); the kit's GPT: one
  instance around its explicit attention (``toymodels.GPTAttention.exchange``), built as
  ``register_with_transformers`` builds it (DeepSpeed refuses transformers' eager kernel for its 4-D mask;
  the GPT's causal mask is made after the exchange, over the whole sequence);
- ``shard(args, kwargs, member, sp)``: one rank's part of a micro batch, as ``UlyssesSPDataLoaderAdapter``
  hands it: its ``seq_len / sp`` consecutive tokens and their global ``position_ids``; a Hugging Face
  model's labels shifted before the split (``shift_labels``: the group's last token has none), the kit's
  GPT's (the next tokens already) split as they are. The kit's synthetic samples depend only on their
  index, so each rank builds the whole micro batch and keeps its part instead of gathering it;
- ``unregister()``: transformers' own kernel back, the groups and DeepSpeed's ``groups.mpu`` forgotten, so
  that the next engine in the process starts clean.
"""

from __future__ import annotations

from typing import Any

#: transformers' attention kernels replaced by ``register``, by name
_REPLACED: dict[str, Any] = {}


def register(model, setup):
    """Ulysses for ``model`` (a Hugging Face model or the kit's GPT) under ``setup``; the mpu for
    ``deepspeed.initialize``."""
    from deepspeed.runtime.sequence_parallel import parallel_state_sp
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    from kit.workloads import toymodels

    b, sp = setup.batch, setup.zero.sequence_parallel_size
    if not isinstance(model, toymodels.GPT):
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        kernel = model.config._attn_implementation
        _REPLACED.setdefault(kernel, ALL_ATTENTION_FUNCTIONS[kernel])
        return UlyssesSPAttentionHF.register_with_transformers(
            model, kernel, sp, b.micro_batch, seq_length=b.seq_len, seq_length_is_variable=False
        )
    parallel_state_sp.initialize_sequence_parallel(sequence_parallel_size=sp)
    d = setup.model.dims
    exchange = UlyssesSPAttentionHF(
        attn=toymodels.core_attention,
        batch_size=b.micro_batch,
        attn_head_count=d.heads,
        attn_head_size=d.hidden // d.heads,
        kv_head_count=d.heads,
        num_hidden_layers=d.layers,
        process_group=parallel_state_sp.get_sequence_parallel_group(),
        seq_length_is_variable=False,
        local_seq_length=b.seq_len // sp,
        global_seq_length=b.seq_len,
    )
    for block in model.transformer.h:
        # not a submodule: ZeRO-3 would hook it, a state dict would list it
        object.__setattr__(block.attn, "exchange", exchange)
    return parallel_state_sp


def shard(args: tuple, kwargs: dict, member: int, sp: int) -> tuple[tuple, dict]:
    """Rank ``member`` of a sequence-parallel group's part of a micro batch: the kit's GPT's ``(input_ids,
    labels)``, or a Hugging Face model's ``input_ids`` and unshifted ``labels`` of the whole sequences."""
    import torch

    if args:  # the kit's GPT: its labels are the next tokens
        ids, labels = args
    else:
        ids, labels = kwargs["input_ids"], kwargs["labels"]
    samples, length = ids.shape
    part = slice(member * length // sp, (member + 1) * length // sp)
    positions = torch.arange(length).expand(samples, length)[:, part].contiguous()
    if args:
        return (ids[:, part].contiguous(), labels[:, part].contiguous()), {"position_ids": positions}
    shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:]
    mine = shifted[:, part].contiguous()
    # the model's loss takes ``shift_labels`` as they are (transformers' ForCausalLMLoss); ``labels`` only
    # has to be there for it to be computed
    return (), {
        "input_ids": ids[:, part].contiguous(),
        "position_ids": positions,
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
