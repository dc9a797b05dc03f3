"""One micro-step on a GPU (kit.steptime.kernels): the FLOPs are the model's, the roofline and the waves
behave as their mechanisms say, a small step waits on its host, and the op counts are Hugging Face's."""

from dataclasses import replace

import pytest

from kit import models
from kit.schema import Setup
from kit.steptime import kernels

H100 = {"peak_tflops": 989.0, "memory_gbps": 3350.0, "sms": 132}


def setup(model="llama-2-7b", micro_batch=2, seq_len=4096, **zero) -> Setup:
    return Setup(
        model=models.preset(model),
        cluster={"gpus_per_node": 8},
        zero={"stage": 2, **zero},
        batch={"micro_batch": micro_batch, "seq_len": seq_len},
    )


def seconds(s: Setup, **hw) -> float:
    return kernels.block_seconds(kernels.work(s), **{**H100, **hw}, efficiency=0.8)


def test_the_matmul_flops_are_six_per_parameter_and_token_less_the_embedding():
    s = setup()
    m, tokens = s.model, 2 * 4096
    w = kernels.work(s)
    block = sum(w.block_gemm_flops) * m.layers + sum(w.rest_gemm_flops)
    embedding = m.vocab * m.hidden  # a lookup: no matmul
    norms = (2 * m.layers + 1) * m.hidden  # elementwise
    assert block == pytest.approx(6 * tokens * (m.params - embedding - norms), rel=1e-12)
    # flash attention: the causal half of 4 b s^2 h per layer, forward and 2.5x in backward
    assert w.block_flash_flops == pytest.approx(0.5 * 4 * 2 * 4096**2 * m.hidden * 3.5)
    ckpt = kernels.work(setup(activation_checkpointing=True))  # one more forward of every block matmul
    assert sum(ckpt.block_gemm_flops) == pytest.approx(sum(w.block_gemm_flops) * 4 / 3)
    assert ckpt.block_flash_flops == pytest.approx(w.block_flash_flops * 4.5 / 3.5)


def test_a_fused_loss_moves_fewer_logit_bytes_and_cut_cross_entropy_computes_them_twice():
    """The head's matmuls and the loss's logit bytes per loss (``kit.loss``): the chunked loss runs the same
    three head matmuls with 6 B per logit instead of the plain loss's fp32 38; Cut Cross-Entropy moves none
    and recomputes the logits in its backward (a fourth head matmul)."""
    plain, chunked, cce = (
        kernels.work(setup("llama-3-8b", loss=loss)) for loss in ("plain", "chunked", "cce")
    )
    logits = 2 * 4096 * 128_256
    assert (plain.rest_memory_bytes, chunked.rest_memory_bytes, cce.rest_memory_bytes) == (
        38 * logits, 6 * logits, 0
    )  # fmt: skip
    assert chunked.rest_gemm_flops == plain.rest_gemm_flops
    assert sum(cce.rest_gemm_flops) == pytest.approx(sum(plain.rest_gemm_flops) * 4 / 3)
    assert chunked.block_gemm_flops == cce.block_gemm_flops == plain.block_gemm_flops
    assert "head and Cut Cross-Entropy loss (0 B per logit, the logits computed again" in cce.formula
    # on an H100 the chunked loss is the faster: the fp32 logits' traffic gone, nothing recomputed
    assert seconds(setup("llama-3-8b", loss="chunked")) < seconds(setup("llama-3-8b"))


def test_eager_attention_multiplies_the_full_scores_and_moves_them_through_memory():
    s = setup("gpt2-xl", micro_batch=1, seq_len=512)
    w = kernels.work(s)
    m = s.model
    linears = 6 * 512 * (4 * m.hidden**2 + 2 * m.hidden * m.ffn)
    scores = 3 * 2 * 2 * 512 * 512 * m.hidden  # q k^T and scores x v, each 2 b s^2 h, x 3 passes
    assert sum(w.block_gemm_flops) == pytest.approx(linears + scores)
    assert w.block_flash_flops == 0
    passes = kernels.EAGER_PASSES["forward"] + kernels.EAGER_PASSES["backward"]
    assert w.block_memory_bytes > passes * 2 * m.heads * 512 * 512


def test_a_large_step_is_bound_by_its_matmuls_and_a_small_one_by_its_host():
    big = setup()
    w = kernels.work(big)
    floor = big.model.layers * (
        sum(w.block_gemm_flops) / (989e12 * 0.8) + w.block_flash_flops / (989e12 * 0.45)
    )
    assert floor < seconds(big) < 1.3 * floor  # + the head, the loss's fp32 logits, the elementwise bytes
    assert seconds(big) > big.model.layers * w.block_host_s  # the GPU is the slower one
    small = setup("gpt2", micro_batch=1, seq_len=128)
    ws = kernels.work(small)
    rest = {"rest_gemm_flops": (0.0,) * 4, "rest_gemm_bytes": (0.0,) * 4, "rest_memory_bytes": 0.0}
    rest |= {"rest_host_s": 0.0}
    blocks = kernels.block_seconds(replace(ws, **rest), **H100, efficiency=0.8)
    assert blocks == pytest.approx(small.model.layers * ws.block_host_s)  # every block waits on the host
    # ZeRO-3's hooks add host time per parameter tensor: 5 events at stage 3, 2 at stage 2
    z3 = kernels.work(setup("gpt2", micro_batch=1, seq_len=128, stage=3))
    tensors = len(models.tensor_numels(small.model))  # GPT-2's 148 parameter tensors
    added = tensors * (5 * kernels.STAGE3_HOOK_US - 2 * kernels.HOOK_US) * 1e-6
    assert (z3.block_host_s - ws.block_host_s) * 12 == pytest.approx(added)


def test_waves_cost_a_whole_wave_and_a_cpu_has_none():
    zeros = (0.0,) * kernels.GEMMS
    flops = 2.0 * 128 * 11008 * 4096  # one matmul of 128 x 11008 outputs: 86 tiles of 128 x 128

    def alone(sms: int) -> float:
        w = kernels.Work(0, zeros, zeros, zeros, 0.0, 0.0, 0.0, (flops, 0.0, 0.0), (0.0,) * 3,
                         (86.0, 0.0, 0.0), 0.0, 0.0, "")  # fmt: skip
        return kernels.block_seconds(w, 989.0, 3350.0, sms, 0.8)

    full = flops / (989e12 * 0.8)
    assert alone(86) == pytest.approx(full)  # one wave, every SM busy
    assert alone(132) == pytest.approx(full * 132 / 86)  # one wave on 86 of 132 SMs: the rest idle
    assert alone(85) == pytest.approx(full * 170 / 86)  # one tile spills into a second, whole wave
    assert alone(0) == pytest.approx(full)  # no SMs known (a CPU): no waves


def test_the_op_counts_are_hugging_faces():
    """OPS_PER_BLOCK: the aten ops one block dispatches, recounted on Hugging Face's GPT-2 and Llama."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += 1
            return func(*args, **(kwargs or {}))

    def ops(model) -> tuple[int, int]:
        x = torch.randint(0, 100, (1, 16))
        forward, backward = Count(), Count()
        with forward:
            loss = model(x, labels=x).loss
        with backward:
            loss.backward()
        return forward.n, backward.n

    configs = {
        "gpt2": lambda n: GPT2LMHeadModel(GPT2Config(n_layer=n, n_embd=64, n_head=4, vocab_size=100)),
        "swiglu": lambda n: LlamaForCausalLM(
            LlamaConfig(
                num_hidden_layers=n,
                hidden_size=64,
                num_attention_heads=4,
                num_key_value_heads=2,
                intermediate_size=128,
                vocab_size=100,
            )  # fmt: skip
        ),
    }
    for style, build in configs.items():
        torch.manual_seed(0)
        two, four = ops(build(2)), ops(build(4))
        per_block = tuple((b - a) // 2 for a, b in zip(two, four, strict=True))
        outside = tuple(a - 2 * p for a, p in zip(two, per_block, strict=True))
        assert per_block == kernels.OPS_PER_BLOCK[style] and outside == kernels.OPS_OUTSIDE[style], style


def test_the_step_op_counts_are_deepspeeds():
    """STEP_OPS_PER_TENSOR: recounted on DeepSpeed's engines and PyTorch's baselines, one CPU rank in a
    process of its own (``tests/fixtures/count_step_ops.py``), per tensor between two depths."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from kit.run.launcher import free_port

    script = Path(__file__).parent / "fixtures" / "count_step_ops.py"
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "MASTER_PORT": str(free_port())}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    counted = json.loads(done.stdout.strip().splitlines()[-1])
    expected = {
        f"{stage},{offloaded}": n
        for (stage, offloaded), n in kernels.STEP_OPS_PER_TENSOR["deepspeed"].items()
    }
    assert counted["deepspeed"] == expected
    assert (counted["ddp"], counted["fsdp"]) == (
        kernels.STEP_OPS_PER_TENSOR["ddp"],
        kernels.STEP_OPS_PER_TENSOR["fsdp"],
    )


def test_qlora_dequantizes_every_block_weight_before_each_matmul_and_lora_dropout_copies_each_input():
    """QLoRA (bitsandbytes' ``MatMul4Bit``): 0.5 B read and 2 B written per weight element before the
    forward's and the input gradient's matmul, and the recomputed forward's; LoRA's dropout: each adapted
    projection's own dropped copy of its input (peft), its mask, and its backward."""
    lora = {"lora_rank": 16, "lora_targets": ("all-linear",)}
    plain = kernels.work(setup("llama-2-7b", **lora))
    qlora = kernels.work(setup("llama-2-7b", qlora=True, **lora))
    m = models.preset("llama-2-7b")
    weights = 4 * m.hidden**2 + 3 * m.hidden * m.ffn  # q k v o, gate up down (no GQA)
    assert qlora.block_memory_bytes - plain.block_memory_bytes == pytest.approx(2.5 * weights * 2)
    ckpt = kernels.work(setup("llama-2-7b", qlora=True, activation_checkpointing=True, **lora))
    plain_ckpt = kernels.work(setup("llama-2-7b", activation_checkpointing=True, **lora))
    assert ckpt.block_memory_bytes - plain_ckpt.block_memory_bytes == pytest.approx(2.5 * weights * 3)
    assert "4-bit weights dequantized before each matmul" in qlora.formula
    dropout = kernels.work(setup("llama-2-7b", lora_dropout=0.1, **lora))
    tokens, dropped = 2 * 4096, 6 * m.hidden + m.ffn  # q k v o gate up read h wide, down f wide
    assert dropout.block_memory_bytes - plain.block_memory_bytes == pytest.approx(dropped * tokens * (5 + 4))
    assert seconds(setup("llama-2-7b", lora_dropout=0.1, **lora)) > seconds(setup("llama-2-7b", **lora))
