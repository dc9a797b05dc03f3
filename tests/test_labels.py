"""Configuration labels and their legend (``kit.labels``): every token of a label says what it means, the
label itself stays as it was (records and sweeps name configurations by it)."""

from __future__ import annotations

import re

import pytest

from kit import models
from kit.lab import ui
from kit.labels import TOKENS, label_legend, parts
from kit.schema import Setup

LLAMA = models.preset("llama-2-7b")
#: an encoder-decoder model, for the labels with a decoder length of their own (``tgt64``)
BART = models.from_hf_config(
    {"model_type": "bart", "d_model": 64, "encoder_layers": 1, "decoder_layers": 1, "vocab_size": 256}
)
#: (ZeroSettings, batch) -> the label these settings had before the legend came: every kind of token
LABELS = [
    (
        {"stage": 3, "offload_optimizer": "nvme", "offload_param": "nvme", "nvme_path": "/nvme",
         "hpz_partition_size": 8, "quantized_weights": True, "quantized_gradients": True,
         "activation_checkpointing": True, "checkpoint_every": 2, "checkpoint_policy": "selective-op",
         "loss": "chunked"},
        {"micro_batch": 2, "grad_accum": 4, "schedule": "2=128"},
        "z3 opt-nvme param-nvme hpz8 qwz qgz bf16 mb2 gas4 -> mb2 gas8 @2 ckpt-op/2 flce",
    ),
    (
        {"stage": 1, "offload_optimizer": "cpu", "precision": "fp16", "lora_rank": 16,
         "lora_targets": ("all-linear",)},
        {"max_tokens": 8192, "seq_len": 4096, "grad_accum": 2},
        "z1 opt-off fp16 mb2 gas2 tok8192 lora16-all",
    ),
    (
        {"stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu", "precision": "fp32",
         "activation_checkpointing": True, "lora_rank": 4, "lora_targets": ("q_proj", "v_proj")},
        {},
        "z3 opt-off param-off fp32 mb1 ckpt lora4 q,v",
    ),
    (
        {"freeze_embeddings": True, "frozen_blocks": 2, "activation_checkpointing": True, "loss": "chunked"},
        {},
        "z2 bf16 mb1 ckpt frz-emb frz2 flce",
    ),
    ({"lora_rank": 8}, {}, "z2 bf16 mb1 lora8"),
    # LoRA's dropout inside its token, before its target modules
    ({"lora_rank": 16, "lora_targets": ("all-linear",), "lora_dropout": 0.05}, {},
     "z2 bf16 mb1 lora16-all-d0.05"),
    ({"lora_rank": 8, "lora_targets": ("q_proj", "k_proj"), "lora_dropout": 0.1}, {},
     "z2 bf16 mb1 lora8-d0.1 q,k"),
    ({"stage": 3, "lora_rank": 16, "lora_targets": ("q_proj", "v_proj"), "qlora": True}, {},
     "z3 bf16 mb1 lora16 q,v qlora"),
    # Cut Cross-Entropy after LoRA's rank (not read as its target modules)
    ({"lora_rank": 4, "loss": "cce"}, {}, "z2 bf16 mb1 lora4 cce"),
    # Ulysses after every other token, also after LoRA's target modules (not read as one of them)
    (
        {"stage": 3, "lora_rank": 4, "lora_targets": ("q_proj", "v_proj"), "sequence_parallel_size": 8},
        {"seq_len": 4096},
        "z3 bf16 mb1 lora4 q,v sp8",
    ),
    ({"stage": 3, "lora_rank": 4, "sequence_parallel_size": 4}, {"seq_len": 4096}, "z3 bf16 mb1 lora4 sp4"),
    # the run's allocator last, after LoRA's rank too (not read as its target modules)
    ({"lora_rank": 4, "expandable_segments": True}, {}, "z2 bf16 mb1 lora4 xseg"),
    ({"stage": 3, "sequence_parallel_size": 2, "expandable_segments": True}, {"seq_len": 4096},
     "z3 bf16 mb1 sp2 xseg"),
    ({"engine": "ddp", "stage": 0}, {}, "ddp bf16 mb1"),
    ({"engine": "fsdp", "stage": 3}, {}, "fsdp bf16 mb1"),
    ({"engine": "fsdp", "stage": 2, "activation_checkpointing": True}, {}, "fsdp-grad-op bf16 mb1 ckpt"),
    # an encoder-decoder's decoder tokens (BART: the only batch here with target_len)
    ({"precision": "fp16"}, {"micro_batch": 200, "seq_len": 128, "target_len": 64}, "z2 fp16 mb200 tgt64"),
]  # fmt: skip


@pytest.mark.parametrize(("zero", "batch", "label"), LABELS)
def test_labels_are_unchanged_and_every_token_is_explained(zero, batch, label):
    setup = Setup(model=BART if "target_len" in batch else LLAMA, zero=zero, batch=batch)
    assert setup.label == label  # byte for byte: records and resumed sweeps find configurations by it
    pairs = setup.label_parts()
    assert " ".join(token for token, _ in pairs) == label
    assert all(meaning for _, meaning in pairs), pairs


def test_every_kind_of_token_appears_in_some_label():
    tokens = [token for _, _, label in LABELS for token, _ in parts(label)]
    kinds = [pattern for pattern, _ in TOKENS if not any(re.fullmatch(pattern, t) for t in tokens)]
    assert kinds == []


def test_the_legend_explains_each_token_of_a_label():
    legend = label_legend(
        [
            "z3 opt-nvme param-nvme hpz8 qwz qgz bf16 mb8 gas16 tok8192 -> mb4 gas2 @3 ckpt-op/2 lora8 q,k "
            "frz-emb frz10 flce",
            "ddp fp32 mb1 lora16-all",
            "z2 bf16 mb1 ckpt-part-cpu/2 lora4-d0.1 q,v",
            "fsdp-grad-op fp16 mb1 ckpt/2",
            "fsdp bf16 mb1 ckpt",
            "z1 opt-off param-off bf16 mb1",
        ]
    )
    assert legend == {
        "z1": "ZeRO stage 1",
        "z3": "ZeRO stage 3",
        "ddp": "PyTorch DDP: every rank holds every state (as ZeRO stage 0)",
        "fsdp-grad-op": "PyTorch FSDP2, parameters kept after forward (as ZeRO stage 2)",
        "fsdp": "PyTorch FSDP2 fully_shard: every state sharded (as ZeRO stage 3)",
        "opt-off": "optimizer states offloaded to the CPU",
        "opt-nvme": "optimizer states offloaded to NVMe (ZeRO-Infinity)",
        "param-off": "parameters offloaded to the CPU",
        "param-nvme": "parameters offloaded to NVMe (ZeRO-Infinity)",
        "hpz8": "ZeRO++ hpZ over 8 ranks: a second parameter copy gathered within them",
        "qwz": "ZeRO++ qwZ: weights all-gathered in int8",
        "qgz": "ZeRO++ qgZ: gradients reduced in int4",
        "fp32": "fp32 weights and compute",
        "bf16": "bf16 mixed precision (an fp32 master copy)",
        "fp16": "fp16 mixed precision (an fp32 master copy)",
        "mb1": "micro batch 1 per rank (GPU or CPU process)",
        "mb8": "micro batch 8 per rank (GPU or CPU process)",
        "gas16": "16 gradient accumulation steps",
        "tok8192": "micro batches packed to at most 8,192 tokens",
        "-> mb4 gas2 @3": "batch schedule: micro batch 4, 2 accumulation steps from step 3",
        "ckpt": "activation checkpointing: every block, recomputed from its input",
        "ckpt-op/2": "activation checkpointing: one block in 2, selective: matmul and attention outputs kept "
        "(torchtitan's op policy)",
        "ckpt/2": "activation checkpointing: one block in 2, recomputed from its input",
        "lora8 q,k": "LoRA adapters of rank 8 (peft) on q, k; the rest is frozen",
        "lora16-all": "LoRA adapters of rank 16 (peft) on every linear layer but the head; the rest is "
        "frozen",
        "lora4-d0.1 q,v": "LoRA adapters of rank 4 (peft) on q, v, dropout 0.1 on each adapter's input; the "
        "rest is frozen",
        "ckpt-part-cpu/2": "activation checkpointing: one block in 2, recomputed from its input, its input "
        "partitioned over the model-parallel group (one GPU: a whole copy), the inputs in CPU RAM",
        "z2": "ZeRO stage 2",
        "frz-emb": "input embeddings frozen",
        "frz10": "the first 10 blocks frozen",
        "flce": "chunked loss: a fused linear cross-entropy (Liger's algorithm)",
    }


def test_the_legend_explains_only_what_appears_and_skips_other_words():
    setups = [
        Setup(model=LLAMA, zero={"stage": s}, batch={"micro_batch": m}) for s in (3, 0) for m in (16, 2)
    ]
    assert label_legend(setups) == {
        "z0": "ZeRO stage 0", "z3": "ZeRO stage 3", "bf16": "bf16 mixed precision (an fp32 master copy)",
        "mb2": "micro batch 2 per rank (GPU or CPU process)",
        "mb16": "micro batch 16 per rank (GPU or CPU process)",
    }  # fmt: skip
    # a plan's row: a GPU, its cluster and a flag before the label
    assert parts("! MI300X 1x8 z1 bf16 mb4")[:3] == [("!", ""), ("MI300X", ""), ("1x8", "")]
    assert list(label_legend(["MI300X 1x8 z1 bf16 mb4 gas32"])) == ["z1", "bf16", "mb4", "gas32"]
    assert label_legend([]) == {} and ui.legend_html([]) == ""
    shown = ui.legend_html(["z3 bf16 mb2"])
    assert "<code>z3</code> ZeRO stage 3 &middot; " in shown and "zk-legend" in shown


def test_the_legend_beside_cpu_ranks_never_says_gpu_for_what_a_rank_holds():
    """Issue 43: the comparison panel shows the legend beside results of CPU ranks: what is counted per
    process (micro batch, DDP's replicas, hpZ's group) says "rank", true on GPUs and CPU ranks alike;
    the labels themselves stay as they were, byte for byte."""
    labels = ["ddp fp32 mb2", "z3 hpz2 bf16 mb4", "z0 bf16 mb16"]
    legend = label_legend(labels)
    assert not [meaning for meaning in legend.values() if "GPU" in meaning.replace("GPU or CPU", "")]
    assert legend["mb2"] == "micro batch 2 per rank (GPU or CPU process)"
    assert legend["hpz2"].startswith("ZeRO++ hpZ over 2 ranks") and "every rank" in legend["ddp"]
    assert [" ".join(token for token, _ in parts(label)) for label in labels] == labels
    assert Setup(model=LLAMA, batch={"micro_batch": 2}).label == "z2 bf16 mb2"
