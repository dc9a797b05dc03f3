"""Sequence parallelism as DeepSpeed runs it (Ulysses: ``sequence_parallel_size``), written once for the
schema, the estimate, the step time, the ranks and the ds_config.

Read from DeepSpeed 0.19.8 (``runtime/sequence_parallel/ulysses_sp.py``, ``parallel_state_sp.py``,
``runtime/config.py``, ``runtime/engine.py``):
- the world splits into groups of ``sp`` consecutive ranks; a group trains the same samples, each rank
  ``seq_len / sp`` consecutive tokens of each (``UlyssesSPDataLoaderAdapter`` shards on the sequence);
- the batch: ``train_batch_size = micro x (world / sp) x grad_accum`` (the config divides the world by
  ``sequence_parallel_size``): ``Setup.dp`` is ``world / sp``;
- ZeRO partitions and reduces over every rank (the engine's ``seq_data_parallel_group``):
  ``Setup.zero_dp`` is the world;
- each attention layer exchanges q, k and v from (its tokens, every head) to (every token, ``heads / sp``
  heads) and its output back (``UlyssesSPAttentionHF``): four all-to-alls forward and four backward per
  layer, on ``sp`` ranks; with fewer kv heads than ``sp`` each kv head is repeated ``sp / kv_heads``
  times first (one kv head per rank), so the exchanged k and v are ``max(kv_heads, sp)`` heads wide;
- gradients are reduced in fp32 (``COMMUNICATION_BYTES``); a Hugging Face decoder's KV cache, kept in
  training, is no longer what SDPA saves (``kit.estimate.micro_step.kv_cache``);
- it needs heads divisible by ``sp``, kv heads divisible by ``sp`` or ``sp`` by them, a sequence length
  divisible by ``sp``, and a Hugging Face model whose attention goes through transformers' registry
  (sdpa, flash or flex; eager is refused), or the kit's GPT: its explicit attention runs between the
  exchanges (``kit.workloads.ulysses``), so a rank holds the scores of ``heads / sp`` heads over the
  whole sequence and the causal mask of the whole sequence.

What it cannot see: DeepSpeed's other sequence-parallel paths (the older ``DistributedAttention`` for
Megatron-style models, FPDT's chunked attention, AutoSP), Arctic's tiled MLP and tiled logits
(``TiledMLP``, ``TiledFusedLogitsLoss``: the kit's chunked loss is its own), and sequence lengths that vary
between batches.
"""

from __future__ import annotations

from kit.families import SWIGLU

#: the family of the kit's GPT (``kit.workloads.toymodels.GPT``: the toy and the gpt2 presets), whose
#: explicit attention DeepSpeed's Ulysses attention wraps on the ranks (``kit.workloads.ulysses``)
KIT_GPT = "gpt2"
#: DeepSpeed's ``seq_parallel_communication_data_type`` default (runtime/constants.py): with ``sp`` > 1 the
#: engine takes it as its ``communication_data_type`` (engine.py), so ZeRO reduces gradients in fp32: stage
#: 3's ipg bucket and reduce-scatters are fp32, stages 1-2 upcast each bucket before reducing it
COMMUNICATION_BYTES = 4


def reduction_bytes(zero, p: int) -> int:
    """Bytes per element of a gradient reduction: ``p`` (the training precision's), fp32 under sequence
    parallelism."""
    return COMMUNICATION_BYTES if zero.sequence_parallel_size > 1 else p


def label(sp: int) -> str:
    """The label part: ``sp4`` for four ranks per sequence, ``""`` without sequence parallelism."""
    return f"sp{sp}" if sp > 1 else ""


def exchanged_kv_heads(kv_heads: int, sp: int) -> int:
    """The kv heads all-to-all'd (and held by attention, over ``sp`` ranks): repeated up to ``sp``."""
    return max(kv_heads, sp)


def problem(zero, model, world: int, batch) -> str | None:
    """Why ``zero``'s ``sequence_parallel_size`` cannot run on this model, world and batch (one line naming
    the field), or None."""
    sp = zero.sequence_parallel_size
    if sp == 1:
        return None
    field = "sequence_parallel_size"
    if zero.engine != "deepspeed":
        return f"{field}: Ulysses sequence parallelism is DeepSpeed's; engine {zero.engine!r} has none"
    if world % sp:
        return f"{field}: must divide the number of GPUs ({world}), got {sp}"
    hf_decoder = model.family in SWIGLU and model.arch
    if model.source or not (hf_decoder or model.family == KIT_GPT) or not model.heads:
        return (
            f"{field}: DeepSpeed's Ulysses attention is modelled for the Hugging Face decoders "
            f"{', '.join(SWIGLU)} and the kit's GPT; {model.name} ({model.family or 'no family'}) is not one"
        )
    heads, kv = model.heads, model.kv_heads or model.heads
    if heads % sp:
        return f"{field}: must divide the attention heads ({heads}), got {sp}"
    if kv % sp and sp % kv:
        return f"{field}: must divide the kv heads ({kv}) or be a multiple of them, got {sp}"
    if batch.seq_len % sp:
        return (
            f"{field}: must divide seq_len ({batch.seq_len}), got {sp}: each rank holds seq_len / {sp} tokens"
        )
    if zero.zeropp or zero.nvme:
        what = "ZeRO++ (hpZ, qwZ, qgZ)" if zero.zeropp else "NVMe offload"
        return f"{field}: {what} beside sequence parallelism is not modelled yet; CPU offload is"
    if batch.max_tokens is not None:
        return f"{field}: a token budget (batch.max_tokens) with sequence parallelism is not modelled yet"
    if any(change.micro_batch != batch.micro_batch for change in batch.schedule):
        return (
            f"{field}: DeepSpeed's Ulysses attention is built for one micro batch ({batch.micro_batch}); "
            "a batch schedule may change grad_accum only"
        )
    return None


def in_your_script(zero, model=None) -> str | None:
    """What the training script must do for sequence parallelism (DeepSpeed's Ulysses), or None; for the kit's
    GPT (``model``), how its attention is wrapped instead of transformers' kernel."""
    sp = zero.sequence_parallel_size
    if sp == 1:
        return None
    if model is not None and model.family == KIT_GPT and not model.source:
        return (
            "parallel_state_sp.initialize_sequence_parallel(sequence_parallel_size="
            f"{sp}), then one UlyssesSPAttentionHF(attn=<the attention between the exchanges>, batch_size="
            "micro_batch, attn_head_count=heads, attn_head_size=hidden // heads, kv_head_count=heads, "
            f"num_hidden_layers=layers, process_group=parallel_state_sp.get_sequence_parallel_group(), "
            f"local_seq_length=seq_len // {sp}, global_seq_length=seq_len) called by each block's attention "
            "with the rank's global position_ids (deepspeed.runtime.sequence_parallel.ulysses_sp; "
            "kit.workloads.ulysses does this for the kit's GPT); deepspeed.initialize(..., "
            "mpu=parallel_state_sp); each rank takes its seq_len / "
            f"{sp} consecutive tokens and their targets"
        )
    return (
        "mpu = UlyssesSPAttentionHF.register_with_transformers(model, 'sdpa', "
        f"{sp}, micro_batch, seq_length=seq_len, seq_length_is_variable=False) before "
        "deepspeed.initialize(..., mpu=mpu); wrap the data loader in UlyssesSPDataLoaderAdapter (it needs "
        "position_ids) and compute the loss from its shift_labels (deepspeed.runtime.sequence_parallel."
        "ulysses_sp); with HF Trainer, transformers' guide 'Ulysses sequence parallelism' (deepspeed_alst)"
    )
