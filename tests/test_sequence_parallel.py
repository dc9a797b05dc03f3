"""DeepSpeed's Ulysses sequence parallelism (``kit.sequence_parallel``): the setting, its rules, the batch it
changes, the ds_config it is written to and read from, and what each rank's estimate holds. The measured
side (model states to the byte, the peak per phase within 3 % on 2 and 4 CPU ranks) is in test_peak.py."""

from __future__ import annotations

import pytest

from kit import models
from kit.ds_config import read_ds_config, to_ds_config
from kit.estimate import estimate
from kit.estimate.activations import activations
from kit.schema import Setup
from kit.toys import TOY_ZERO

SMALL = {"layers": 2, "hidden": 64, "heads": 4, "ffn": 128, "vocab": 256}
LLAMA = models.override(models.preset("llama-2-7b"), SMALL)


def _setup(gpus: int = 4, batch: dict | None = None, model=LLAMA, **zero) -> Setup:
    return Setup(
        model=model,
        cluster={"nodes": 1, "gpus_per_node": gpus},
        zero={**TOY_ZERO, "stage": 3, **zero},
        batch={"micro_batch": 2, "seq_len": 32, **(batch or {})},
    )


def test_groups_of_sp_ranks_are_one_data_parallel_rank_and_zero_shards_over_all():
    s = _setup(sequence_parallel_size=2, batch={"grad_accum": 3})
    assert (s.dp, s.zero_dp, s.rank_seq_len) == (2, 4, 16)
    assert s.batch.train_batch == 2 * 2 * 3  # micro x (world / sp) x grad_accum, as DeepSpeed's config
    assert s.label == "z3 bf16 mb2 gas3 sp2"
    assert s.dp_words == "sequence-parallel groups of 2 GPUs"
    plain = _setup()
    assert (plain.dp, plain.zero_dp, plain.rank_seq_len, plain.dp_words) == (4, 4, 32, "GPUs")


@pytest.mark.parametrize(
    "zero, other, message",
    [
        ({"sequence_parallel_size": 3}, {}, "must divide the number of GPUs (4), got 3"),
        ({"sequence_parallel_size": 4}, {"batch": {"seq_len": 30}}, "must divide seq_len (30), got 4"),
        (
            {"sequence_parallel_size": 4},
            {"model": models.override(models.preset("llama-2-7b"), {**SMALL, "heads": 2})},
            "must divide the attention heads (2), got 4",
        ),
        (
            {"sequence_parallel_size": 2},
            {"model": models.toy_spec("dit")},
            "DeepSpeed's Ulysses attention is modelled for the Hugging Face decoders llama, mistral, "
            "qwen2 and the kit's GPT; toy-dit-2x64 (dit) is not one",
        ),
        (
            {"sequence_parallel_size": 2, "offload_optimizer": "nvme", "nvme_path": "/nvme"},
            {},
            "NVMe offload beside sequence parallelism is not modelled yet",
        ),
        ({"sequence_parallel_size": 2, "hpz_partition_size": 2}, {}, "ZeRO++ (hpZ, qwZ, qgZ) beside"),
        (
            {"sequence_parallel_size": 2},
            {"batch": {"max_tokens": 64}},
            "a token budget (batch.max_tokens) with sequence parallelism is not modelled yet",
        ),
        (
            {"sequence_parallel_size": 2},
            {"batch": {"schedule": [{"step": 5, "micro_batch": 4, "grad_accum": 1}]}},
            "DeepSpeed's Ulysses attention is built for one micro batch (2)",
        ),
    ],
)
def test_what_ulysses_cannot_run_is_one_line_naming_the_field(zero, other, message):
    with pytest.raises(ValueError) as error:
        _setup(**other, **zero)
    line = str(error.value).splitlines()[1] if "validation error" in str(error.value) else str(error.value)
    assert "zero.sequence_parallel_size: " in line and message in line, line


def test_a_batch_schedule_that_keeps_the_micro_batch_is_taken():
    s = _setup(sequence_parallel_size=2, batch={"schedule": [{"step": 5, "micro_batch": 2, "grad_accum": 4}]})
    assert s.at_step(5).batch.train_batch == 2 * 2 * 4


def test_the_ds_config_carries_it_at_the_top_level_and_reads_back():
    s = _setup(sequence_parallel_size=2)
    config = to_ds_config(s)
    assert (
        config["sequence_parallel_size"] == 2 and "sequence_parallel_size" not in config["zero_optimization"]
    )
    assert config["train_batch_size"] == 2 * 2  # what DeepSpeed's config checks against world / sp
    back, _ = read_ds_config(config, model=LLAMA, cluster=s.cluster, seq_len=32, zero_init=True)
    assert back.zero.sequence_parallel_size == 2 and back.batch == s.batch
    assert "sequence_parallel_size" not in to_ds_config(_setup())
    with pytest.raises(ValueError, match=r"^ds_config.sequence_parallel_size: must be a whole number >= 1"):
        read_ds_config({**config, "sequence_parallel_size": "2"}, model=LLAMA, cluster=s.cluster)


def test_a_rank_holds_the_activations_of_its_part_of_each_sequence():
    """Outside attention a rank is the model on seq_len / sp tokens; SDPA keeps the exchanged q, k, v and
    output, as many elements as the local ones while the kv heads divide sp; o_proj keeps its input, the
    exchange's output, where without the exchange it is SDPA's output itself (measured on 2 CPU ranks:
    one b x s/sp x h tensor per layer more)."""
    b, layers, h = 2, SMALL["layers"], SMALL["hidden"]
    sp2 = _setup(gpus=2, sequence_parallel_size=2)
    half = _setup(gpus=2, batch={"seq_len": 16})
    own = 2 * layers * b * 16 * h  # o_proj's input per layer, 16-bit
    assert activations(sp2).bytes - activations(half).bytes == own
    # fewer kv heads than sp: each is repeated to one per rank before the exchange (2 -> 4 heads of k, v)
    gqa = models.override(models.preset("llama-2-7b"), {**SMALL, "kv_heads": 2})
    sp4, local = _setup(model=gqa, sequence_parallel_size=4), _setup(model=gqa, batch={"seq_len": 8})
    s, head_dim = 8, 64 // 4
    repeated = 2 * layers * 2 * b * s * (4 - 2) * head_dim  # k and v, 16-bit, the 2 extra heads
    assert activations(sp4).bytes - activations(local).bytes == repeated + 2 * layers * b * s * h
    # a trainable subset follows the same ops: LoRA on q and v, o_proj frozen, keeps none at stage 2
    lora, plain = (_setup(gpus=2, stage=2, lora_rank=4, **z) for z in ({"sequence_parallel_size": 2}, {}))
    assert activations(lora).bytes == activations(plain.replace(batch={"seq_len": 16})).bytes


def test_the_kit_gpts_rank_holds_its_heads_scores_over_the_whole_sequence():
    """The kit's GPT (explicit attention inside DeepSpeed's exchanges, ``kit.workloads.ulysses``): a rank's
    tensors of b x s/sp tokens as the model on s/sp tokens, but its scores those of a/sp heads over all s
    tokens and its causal mask the whole sequence's (measured on 2 CPU ranks, test_peak.py); in its step
    time the score matmuls are those of a/sp heads."""
    from kit.estimate.activations import eager_scores
    from kit.steptime.kernels import work

    toy = models.toy_spec(seq_len=32)
    sp2 = _setup(gpus=2, model=toy, sequence_parallel_size=2)
    half = _setup(gpus=2, model=toy, batch={"seq_len": 16})
    b, layers, heads = 2, 2, 4
    assert eager_scores(sp2) == (heads // 2 * 32 * 32 * b, 32 * 32)
    assert eager_scores(half) == (heads * 16 * 16 * b, 16 * 16)
    # per layer: the softmax's output (16-bit) and the bool mask; the rest as on 16 tokens
    more = layers * (2 * (heads // 2 * 32 * 32 - heads * 16 * 16) * b + (32 * 32 - 16 * 16))
    assert activations(sp2).bytes - activations(half).bytes == more
    one, two = work(_setup(gpus=2, model=toy)), work(sp2)
    assert sum(two.block_gemm_flops) == pytest.approx(sum(one.block_gemm_flops) / 2)
    assert two.block_memory_bytes == pytest.approx(one.block_memory_bytes / 2)
    assert "a/2 heads each" in two.formula


def test_gradients_are_reduced_in_fp32_under_sequence_parallelism():
    """DeepSpeed's seq_parallel_communication_data_type (fp32 by default) becomes the engine's
    communication type: stage 3's ipg bucket is fp32, 4 B x reduce_bucket_size."""
    on, off = estimate(_setup(sequence_parallel_size=2)), estimate(_setup())
    assert on.components["buffers"] - off.components["buffers"] == 2 * TOY_ZERO["reduce_bucket_size"]
    assert on.model_states_bytes == off.model_states_bytes  # ZeRO partitions over every rank either way


def test_a_rank_computes_its_tokens_and_its_heads_of_the_whole_sequence():
    """Outside attention a rank's matmuls are those of seq_len / sp tokens; attention runs over the whole
    sequence with heads / sp: at sp 2, half of each (``kit.steptime.kernels``)."""
    from kit.steptime.kernels import work

    one, two = work(_setup(gpus=2)), work(_setup(gpus=2, sequence_parallel_size=2))
    assert two.block_flash_flops == pytest.approx(one.block_flash_flops / 2)
    assert sum(two.block_gemm_flops) == pytest.approx(sum(one.block_gemm_flops) / 2)
    assert sum(two.rest_gemm_flops) == pytest.approx(sum(one.rest_gemm_flops) / 2)


def test_the_exchanges_are_counted_in_the_step_traffic():
    """4 exchanges per layer and pass of b x s/sp tokens, (sp-1)/sp of each sent; real ranks send exactly
    this (test_peak.py), here the formula's arithmetic on the shrunk Llama at sp 2: 2 layers, h = kv = 64."""
    from kit.steptime.comm import all_to_all, collectives, comm_bytes

    s = _setup(gpus=2, sequence_parallel_size=2)
    exchange = all_to_all(s)
    tokens = 2 * 16
    assert exchange is not None and exchange.scope == "intra"
    assert exchange.bytes == 0.5 * 2 * tokens * 2 * 2 * (64 + 64 + 64 + 64) + 1 * 2 * 8 * tokens
    sent, formula = comm_bytes(s)  # stage 3: its collectives, the exchanges among them
    parts = collectives(s)
    assert exchange in parts and sent == sum(c.bytes for c in parts) and "Ulysses" in formula
    assert all_to_all(_setup(gpus=2)) is None and not any(c.name == exchange.name for c in collectives(
        _setup(gpus=2)))  # fmt: skip


def test_notebook_07s_table_is_each_sizes_estimate():
    """``tables.sequence_parallel_choices``: Llama-3-8B's shape at 64K tokens (its context raised to Llama
    3.1's), ZeRO-3 with checkpointing and the chunked loss on 8 H100s: each row is its Setup's estimate."""
    from kit.components import Component
    from kit.fit import estimate_fit
    from kit.lab import tables
    from kit.steptime.comm import all_to_all
    from kit.units import GIB

    long = models.override(models.preset("llama-3-8b"), {"max_position_embeddings": 131_072})
    s = Setup(
        model=long,
        cluster={"nodes": 1, "gpus_per_node": 8, "gpu": "H100-SXM-80GB"},
        zero={"stage": 3, "activation_checkpointing": True, "loss": "chunked"},
        batch={"micro_batch": 1, "seq_len": 65_536},
    )
    table = tables.sequence_parallel_choices(s)
    assert list(table.index) == ["sp 1", "sp 2", "sp 4", "sp 8"]
    assert list(table["tokens per rank"]) == [65_536, 32_768, 16_384, 8_192]
    assert list(table["data-parallel groups"]) == [8, 4, 2, 1]
    assert table["peak / GPU GiB"].is_monotonic_decreasing and table["peak / GPU GiB"].is_unique
    assert list(table["grad accum"]) == [1, 2, 4, 8]  # the same global batch in every row
    exchanged = table["all-to-all MB per step"]  # a GPU sends (sp-1)/sp of its part, sp x as often
    assert exchanged["sp 1"] == 0 and exchanged.is_monotonic_increasing and exchanged.is_unique
    for sp in (1, 2, 4, 8):
        one = s.replace(zero={"sequence_parallel_size": sp}, batch={"train_batch": 8})
        e, exchange = estimate(one), all_to_all(one)
        expected = {
            "tokens per rank": 65_536 // sp,
            "data-parallel groups": 8 // sp,
            "grad accum": sp,
            "activations GiB": round(e.components[Component.ACTIVATIONS] / GIB, 2),
            "forward peak GiB": round(e.timeline.totals["forward"] / GIB, 2),
            "backward peak GiB": round(e.timeline.totals["backward"] / GIB, 2),
            "peak / GPU GiB": round(e.per_gpu_bytes / GIB, 2),
            "all-to-all MB per step": round(exchange.bytes / 1e6, 2) if exchange else 0,
            "fits": "yes" if estimate_fit(e).ok else "no",
        }
        assert table.loc[f"sp {sp}"].to_dict() == expected


def test_the_table_leaves_out_the_sizes_the_setup_refuses_unless_asked_for():
    """The shrunk Llama has 4 heads: on 8 GPUs sp 8 is refused, left out of the default sizes; a size asked
    for that the Setup refuses raises its reason."""
    from kit.lab import tables

    s = _setup(gpus=8)
    assert list(tables.sequence_parallel_choices(s).index) == ["sp 1", "sp 2", "sp 4"]
    assert list(tables.sequence_parallel_choices(s, sizes=[2]).index) == ["sp 2"]
    with pytest.raises(ValueError, match="must divide the attention heads"):
        tables.sequence_parallel_choices(s, sizes=[8])


def test_launch_cmd_says_what_the_script_does_beside_the_ds_config_key(capsys):
    """The ds_config carries sequence_parallel_size; the script wires DeepSpeed's Ulysses in itself:
    ``launch-cmd`` prints it, and its JSON carries it (null without sequence parallelism)."""
    import json

    from kit.cli import main

    argv = ["launch-cmd", "--model", "llama-2-7b", "--stage", "3", "--seq-len", "4096"]
    assert main([*argv, "--sequence-parallel-size", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ds_config"]["sequence_parallel_size"] == 4 and out["label"].endswith(" sp4")
    assert out["sequence_parallel"].startswith("mpu = UlyssesSPAttentionHF.register_with_transformers(")
    assert ", 4, micro_batch," in out["sequence_parallel"]
    assert main([*argv, "--sequence-parallel-size", "4"]) == 0
    text = capsys.readouterr().out
    assert (
        "# sequence parallelism: sequence_parallel_size is in the ds_config; your script also does:" in text
    )
    assert main([*argv, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["sequence_parallel"] is None and "sequence_parallel_size" not in plain["ds_config"]
    # the kit's GPT has no kernel in transformers' registry: one attention instance around its own
    gpt = ["launch-cmd", "--model", "gpt2-large", "--stage", "3", "--seq-len", "1024"]
    assert main([*gpt, "--sequence-parallel-size", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sequence_parallel"].startswith("parallel_state_sp.initialize_sequence_parallel(")
    assert "local_seq_length=seq_len // 4" in out["sequence_parallel"]
