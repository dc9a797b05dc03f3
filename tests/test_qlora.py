"""QLoRA (``ZeroSettings.qlora``): the 4-bit base weights' bytes against a hand calculation from
bitsandbytes' format, and against the storages of the plain-PyTorch equivalent (``kit.workloads.nf4``)
built in one process: bitsandbytes needs CUDA, so no rank runs it."""

from __future__ import annotations

import pytest

from kit import models, trainable
from kit.estimate import memory, partition
from kit.run.sweep import check
from kit.schema import Setup

SMALL_LLAMA = {"layers": 2, "hidden": 64, "heads": 4, "ffn": 128, "vocab": 256}


def _setup(stage: int, model=None, gpus: int = 8, **zero) -> Setup:
    zero = {"stage": stage, "lora_rank": 16, "lora_targets": ("all-linear",), "qlora": True, **zero}
    return Setup(
        model=model or models.preset("llama-2-7b"),
        cluster={"nodes": 1, "gpus_per_node": gpus},
        zero=zero,
        batch={"micro_batch": 1, "seq_len": 4096 if model is None else 32},
    )


def _state(n: int) -> int:
    """bitsandbytes' QuantState of an n-element weight (nf4, double quantization): one uint8 absmax per
    64-block, one fp32 scale per 256 of them, the fp32 offset, the 16-value NF4 table and the 256-value
    dynamic map (4 B each)."""
    blocks = -(-n // 64)
    return blocks + 4 * -(-blocks // 256) + 4 + 4 * 16 + 4 * 256


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_llama_2_7b_4bit_bytes_per_rank_follow_the_format(stage):
    """Llama-2-7B (L 32, h 4096, f 11008, v 32000) with LoRA r=16 on every linear layer, 8 ranks.
    Per block the 4-bit weights are 4 of h x h (q k v o) and 3 of h x f (gate up down), each stored as
    n / 2 bytes (n / 4 bf16 elements) beside its quant state ``_state(n)``; the embeddings, the head
    (v x h each) and the 2 L + 1 norms (h each) stay 2 B a parameter; the adapters are Psi = L x r x
    (4 x 2h + 3 (h + f)). Stages 0-2: 2 B x (Psi + 16-bit frozen) + packed + states, whole on every rank
    (Psi / 16 is whole: no padding). Stage 3: 2 B x (sum over tensors of numel / 8, every numel here a
    multiple of 8, + the tensors of at most 100,000 elements kept whole: the norms and the adapters of
    r x h or h x r, 11 a block) + the states, which are no parameter and stay whole."""
    L, h, f, v, r = 32, 4096, 11008, 32000, 16
    quantized = [h * h] * 4 + [h * f] * 3
    packed = L * sum(n // 2 for n in quantized)
    states = L * sum(_state(n) for n in quantized)
    bits16 = 2 * v * h + (2 * L + 1) * h
    psi = L * r * (4 * 2 * h + 3 * (h + f))
    setup = _setup(stage)
    got = memory.rank_states(setup)["device"]["parameters"]
    if stage < 3:
        assert got == 2 * (psi + bits16) + packed + states
    else:
        total = psi + bits16 + packed // 2  # elements: the packed weights in bf16
        kept = (2 * L + 1) * h + L * 11 * r * h
        assert got == 2 * (total // 8 + kept) + states
    assert partition.quant_state(setup) == (7 * L, states)
    assert partition.trainable_params(setup) == psi


def test_stage_3_partitions_the_packed_weights():
    """The 4-bit weights are a bf16 parameter that does not train: stage 3 divides them by the ranks."""
    whole, split = (memory.rank_states(_setup(s))["device"]["parameters"] for s in (2, 3))
    assert split < whole / 6


def test_the_settings_that_do_not_combine_are_one_line_each():
    with pytest.raises(ValueError, match="qlora: applies with lora_rank > 0"):
        _setup(0, lora_rank=0, lora_targets=())
    with pytest.raises(ValueError, match="qlora: modelled with bf16 compute"):
        _setup(0, precision="fp16")
    setup = _setup(2)
    assert "qlora" in setup.label.split()
    assert dict(setup.label_parts())["qlora"].startswith("QLoRA")
    assert "bnb_4bit_quant_storage=torch.bfloat16" in trainable.in_your_script(setup.zero)
    assert trainable.describe(setup.zero).startswith("QLoRA r=16")
    qlora = trainable.FIELDS.index("qlora")  # the panels offer QLoRA in bf16 only
    assert any(values[qlora] for _, values in trainable.choices(setup.zero))
    fp16 = setup.zero.model_copy(update={"qlora": False, "precision": "fp16"})
    assert not any(values[qlora] for _, values in trainable.choices(fp16))


def test_a_run_is_refused_before_launch():
    setup = _setup(2, model=models.override(models.preset("llama-2-7b"), SMALL_LLAMA), gpus=2)
    with pytest.raises(
        ValueError, match=r"^zero.qlora: estimate-only: bitsandbytes' 4-bit kernels need CUDA"
    ):
        check(setup)


def test_the_nf4_table_is_bitsandbytes_normal_map():
    """``create_normal_map(offset=0.9677083, use_extra_value=True)`` (bitsandbytes ``functional.py``; the
    QLoRA paper's Appendix E): 8 positive quantiles of N(0, 1) from ``linspace(offset, 0.5, 9)``, 7
    negative ones from ``linspace(offset, 0.5, 8)``, and 0, normalised by the largest."""
    import torch

    from kit.workloads import nf4

    offset = 0.9677083
    positive = torch.special.ndtri(torch.linspace(offset, 0.5, 9)[:-1].double())
    negative = -torch.special.ndtri(torch.linspace(offset, 0.5, 8)[:-1].double())
    values = torch.cat([positive, torch.zeros(1, dtype=torch.float64), negative]).sort().values
    assert torch.allclose(torch.tensor(nf4.NF4, dtype=torch.float64), values / values.max(), atol=1e-6)
    dynamic = nf4.dynamic_map()
    assert dynamic.numel() == 256 and bool((dynamic[1:] > dynamic[:-1]).all())
    assert dynamic.max().item() == 1.0 and 0.0 in dynamic.tolist()


def test_dequantized_weights_are_nf4_values_times_their_block_absmax():
    import torch

    from kit.workloads import nf4

    torch.manual_seed(0)
    linear = torch.nn.Linear(192, 80, bias=False).to(torch.bfloat16)
    layer = nf4.Linear4bit(linear)
    weight = nf4.dequantize(layer.weight, layer.state, torch.float32).reshape(-1, 64)
    scale = layer.state.block_absmax()
    table = torch.tensor(nf4.NF4)
    codes = (weight / scale[:, None])[..., None].sub(table).abs().argmin(dim=-1)
    assert torch.equal(weight, table[codes] * scale[:, None])  # every value is a table entry times its scale
    true = linear.weight.float().reshape(-1, 64)
    assert torch.allclose(scale, true.abs().amax(dim=1), rtol=0.02)  # the absmax, quantized to 8 bits
    gaps = (table[1:] - table[:-1]).max() / 2  # the nearest code: within half the widest gap
    assert bool(
        ((weight / scale[:, None] - true / true.abs().amax(dim=1)[:, None]).abs() <= gaps + 0.02).all()
    )


#: the models the one-process checks build: a shrunk Llama, and the kit's GPT (its ``Conv1D`` projections
#: quantized transposed, as transformers' bitsandbytes integration quantizes GPT-2's)
SMALL = {"llama": models.override(models.preset("llama-2-7b"), SMALL_LLAMA), "toy": models.toy_spec()}


@pytest.mark.parametrize("name", list(SMALL))
def test_the_built_4bit_weights_take_the_estimates_frozen_bytes(name):
    """A shrunk Llama and the toy GPT in bf16 with peft's LoRA and their linear layers swapped for the
    plain-PyTorch ``Linear4bit``: the storages of their frozen parameters and quant states (every byte,
    scalars too) are what the estimate holds beside the adapters at stage 0 (whole on every rank as at
    stages 0-2)."""
    import torch

    from kit import workloads
    from kit.rules import element_bytes
    from kit.workloads import adapters, nf4

    setup = _setup(0, model=SMALL[name], gpus=1)
    model = adapters.apply(workloads.for_model(setup.model).build().to(torch.bfloat16), setup.zero)
    # every block projection is 4-bit, the head (tied to the embeddings for the GPT) stays 16-bit
    quantized = [m for m in model.modules() if isinstance(m, nf4.Linear4bit)]
    assert len(quantized) == setup.model.layers * (7 if name == "llama" else 4)
    frozen = [p for p in model.parameters() if not p.requires_grad]
    states = [b for m in model.modules() if isinstance(m, nf4.Linear4bit) for b in m.state.buffers()]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in frozen + states}
    psi = partition.trainable_params(setup)
    estimated = memory.rank_states(setup)["device"]["parameters"] - element_bytes("bf16") * psi
    assert sum(storages.values()) == estimated
    quantized = partition.listing(setup).quantized
    assert sum(nf4.stored_bytes(model)) == sum(sum(trainable.nf4_bytes(n)) for n in quantized)


def _small(stage: int = 0, name: str = "llama", **batch) -> Setup:
    setup = _setup(stage, model=SMALL[name], gpus=1)
    return setup.replace(zero={"lora_rank": 4}, batch={"micro_batch": 2, "seq_len": 32, **batch})


def _live(tensors) -> dict[int, int]:
    return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}


@pytest.mark.parametrize(
    "name, down",
    [("llama", "model.layers.1.mlp.down_proj"), ("toy", "transformer.h.1.mlp.c_proj")],
)
def test_dequantizing_holds_the_weight_its_absmax_and_one_chunk(name, down):
    """``MatMul4Bit``'s transient, measured with torch's CPU memory accounting (``StepMemory``): the last
    block's down projection dequantized is the estimate's term for it (``_dequantized``: 2 B x f h + 4 B x
    f h / 64, and on CPU the equivalent's chunk, 9 B x min(f h, 1,024)), to the byte."""
    import torch

    from kit import workloads
    from kit.estimate.cpu_matmul import CpuMatmul
    from kit.estimate.micro_step import _dequantized
    from kit.ranks.memory_timeline import StepMemory
    from kit.workloads import adapters, nf4

    setup = _small(name=name)
    model = adapters.apply(workloads.for_model(setup.model).build().to(torch.bfloat16), setup.zero)
    down = model.get_submodule(f"base_model.model.{down}.base_layer")
    known = _live([down.weight, *down.state.buffers()])
    memory = StepMemory(device=known)
    with memory.recording(), memory.phase("forward"):
        weight = nf4.dequantize(down.weight, down.state, torch.bfloat16)
        assert weight.shape == (setup.model.dims.hidden, setup.model.ffn)
        del weight
    m = setup.model
    expected = _dequantized(setup, m.ffn * m.dims.hidden, CpuMatmul()).bytes
    assert memory.result()["phases"]["forward"] - sum(known.values()) == expected


@pytest.mark.parametrize("name", list(SMALL))
@pytest.mark.parametrize("targets", [("all-linear",), ()], ids=["all-linear", "peft's default"])
def test_a_step_on_4bit_weights_peaks_where_the_estimate_says(name, targets):
    """The shrunk Llama and the toy GPT with LoRA r=4 on every linear layer (or peft's default targets) over
    their 4-bit weights, micro batch 2 of 32 tokens, one forward and backward in one process on one thread:
    each phase's peak above the model's own tensors is within 3 % of the estimate's activations and working
    set at that phase's moment (stage 0: the states the estimate holds beside them, DeepSpeed's, are no part
    of this process)."""
    import torch

    from kit import workloads
    from kit.components import Component
    from kit.ranks.memory_timeline import StepMemory
    from kit.workloads import adapters

    setup = _small(name=name).replace(zero={"lora_targets": targets})
    workload = workloads.for_model(setup.model)
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the estimate's oneDNN scratch is one thread's (CpuMatmul())
    try:
        model = adapters.apply(workload.build().to(torch.bfloat16), setup.zero)
        args, kwargs = workload.micro_batch([0, 1], 32, 0)
        known = _live([*model.parameters(), *model.buffers()])
        memory = StepMemory(device=known)
        with memory.recording():
            with memory.phase("forward"):
                loss = workload.loss(model(*args, **kwargs))
            with memory.phase("backward"):
                loss.backward()
    finally:
        torch.set_num_threads(threads)
    measured = {k: v - sum(known.values()) for k, v in memory.result()["phases"].items()}
    timeline = memory_timeline(setup)
    for phase in ("forward", "backward"):
        terms = timeline.phases[phase]
        estimated = terms[Component.ACTIVATIONS].bytes + terms["temporaries"].bytes
        assert measured[phase] == pytest.approx(estimated, rel=0.03), (phase, timeline.moments[phase])


def memory_timeline(setup: Setup):
    return memory.peak_timeline(setup, 0, backend="gloo")


def test_at_stage_3_the_4bit_layers_save_no_input():
    """Under ``zero.Init`` a LoRA run's frozen nn.Linear layers save their input (DeepSpeed's
    ``LinearFunctionForZeroStage3``); QLoRA's 4-bit ones run bitsandbytes' ``MatMul4Bit``, which saves the
    packed weight only: with adapters on q and v, a block saves at stage 3 what it saves at stage 2 (the
    head's nn.Linear still keeps its input: not in the blocks)."""
    from kit.estimate.activations import _subset_saved

    def blocks(stage: int, qlora: bool) -> tuple[int, ...]:
        setup = _small(stage).replace(zero={"lora_targets": (), "qlora": qlora})
        return _subset_saved(setup).blocks

    assert blocks(3, qlora=True) == blocks(2, qlora=True) == blocks(2, qlora=False)
    assert blocks(3, qlora=False) > blocks(2, qlora=False)
