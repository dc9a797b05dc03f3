"""The estimator: ZeRO paper figures, DeepSpeed's own estimators, exact per-rank formulas."""

import pytest
import torch
from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

from kit import Setup
from kit.components import COMPONENTS
from kit.estimate import estimate, rank_states
from kit.estimate.memory import PROCESS_BASE_BYTES, peak_timeline
from kit.gpus import gpu
from kit.models import from_count, preset, tensor_numels, toy_spec
from kit.workloads import toymodels

GB = 1e9  # the ZeRO paper's GB

# ZeRO paper Table 1: 7.5B parameters, K = 12, GB per device for Nd = 1, 4, 16, 64, 256, 1024.
PAPER_ND = (1, 4, 16, 64, 256, 1024)
PAPER_TABLE_1 = {
    1: ("120", "52.5", "35.6", "31.4", "30.4", "30.1"),
    2: ("120", "41.3", "21.6", "16.6", "15.4", "15.1"),
    3: ("120", "30", "7.5", "1.88", "0.47", "0.12"),
}


def setup_for(spec, stage=2, nodes=1, gpus=8, **zero):
    return Setup(
        model=spec,
        cluster={"nodes": nodes, "gpus_per_node": gpus},
        zero={"stage": stage, **zero},
        batch={"micro_batch": 1},
    )


def cluster_of(nd):
    return (1, nd) if nd <= 8 else (nd // 8, 8)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_paper_reproduces_table_1(stage):
    spec = from_count(7_500_000_000, 1)
    for nd, published in zip(PAPER_ND, PAPER_TABLE_1[stage], strict=True):
        nodes, gpus = cluster_of(nd)
        e = estimate(setup_for(spec, stage, nodes, gpus), formula="zero-paper")
        decimals = len(published.split(".")[1]) if "." in published else 0
        # the table rounds half up to its printed digits
        assert abs(e.model_states_bytes / GB - float(published)) <= 0.5 * 10**-decimals + 1e-12, (stage, nd)
        assert e.per_gpu_bytes == e.model_states_bytes  # the paper counts model states only


def test_paper_stage0_is_16_bytes_per_param():
    e = estimate(setup_for(from_count(1_000_000, 1), 0), formula="zero-paper")
    assert e.model_states_bytes == 16_000_000


# The example of DeepSpeed's memory-estimator docs (estimate_zero{2,3}_model_states_mem_needs_all_cold):
# 2851M parameters, largest layer 32M, one node of 8 GPUs.
PSI, LARGEST = 2_851_000_000, 32_000_000


def test_zero2_matches_deepspeed_estimator_without_offload():
    cpu_ds, gpu_ds = estimate_zero2_model_states_mem_needs(PSI, 8, 1, cpu_offload=False)
    s = setup_for(from_count(PSI, LARGEST), 2)
    r = rank_states(s, 0)["device"]
    part = PSI // 8  # PSI divides by 2 x 8: no alignment padding
    # DeepSpeed's 2P + 18P/N counts the fp32 gradient partition (4P/N) as resident; it exists only
    # inside step() (our "buffers", transient). Everything else is the same bytes.
    assert r["parameters"] + r["gradients"] + r["optimizer_states"] + 4 * part == gpu_ds
    assert gpu_ds == 12_116_750_000


def test_zero2_matches_deepspeed_estimator_with_optimizer_offload():
    _, gpu_ds = estimate_zero2_model_states_mem_needs(PSI, 8, 1, cpu_offload=True)
    r = rank_states(setup_for(from_count(PSI, LARGEST), 2, offload_optimizer="cpu"), 0)
    assert r["device"]["parameters"] + r["device"]["gradients"] + r["device"]["optimizer_states"] == gpu_ds
    # and where DeepSpeed writes P x max(4N, 16) x 1.5 for CPU, the host holds exactly
    # fp32 master 4 + Adam 8 + fp32 gradient 4 per partition element, plus 16-bit staging.
    part = PSI // 8
    assert r["host"]["optimizer_states"] == 12 * part and r["host"]["gradients"] == 4 * part


@pytest.mark.parametrize(
    "offload_optimizer, offload_param, device_states",
    [
        ("none", "none", lambda s: 16 * s),  # 2 params + 2 grads + 4 master + 8 Adam per element
        ("cpu", "none", lambda s: 2 * s),  # only the 16-bit parameter partition stays
        ("cpu", "cpu", lambda s: 0),
    ],
)
def test_zero3_against_deepspeed_estimator(offload_optimizer, offload_param, device_states):
    s = setup_for(
        from_count(PSI, LARGEST), 3, offload_optimizer=offload_optimizer, offload_param=offload_param
    )
    r = rank_states(s, 0)["device"]
    part = PSI // 8  # both tensors of the bare count divide by 8: S = PSI / 8
    assert r["parameters"] + r["gradients"] + r["optimizer_states"] == device_states(part)
    _, gpu_ds, largest_mem = estimate_zero3_model_states_mem_needs(
        PSI, LARGEST, 8, 1, cpu_offload=offload_optimizer == "cpu", cpu_offload_params=offload_param == "cpu"
    )
    # DeepSpeed: 4 x largest layer + {18, 2, 0} x S. Its 18 has the fp32 gradient (4, transient in
    # step for us) in place of the 16-bit gradient partition (2, which we measured resident), so
    # 18 = 16 + 4 - 2.
    ds_states = gpu_ds - largest_mem
    if offload_optimizer == "none":
        assert ds_states == device_states(part) + 4 * part - 2 * part
    else:
        assert ds_states == device_states(part)
    assert largest_mem == 4 * LARGEST


def test_zero3_buffers_include_the_reduce_bucket_deepspeed_ignores():
    s = setup_for(from_count(PSI, LARGEST), 3)
    assert rank_states(s)["device"]["buffers"] == 2 * 500_000_000  # bf16 ipg bucket at the default size
    small = s.replace(zero={"reduce_bucket_size": 1_000_000})
    assert rank_states(small)["device"]["buffers"] == 2_000_000


def test_stage1_and_2_padding_and_touched_partitions_are_exact():
    # toy GPT-2: tensors of many sizes; 3 ranks force alignment padding
    spec = toy_spec(layers=2, hidden=64, heads=4, vocab=512, seq_len=64)
    s = Setup(
        model=spec, cluster={"nodes": 1, "gpus_per_node": 3}, zero={"stage": 2}, batch={"micro_batch": 1}
    )
    flat = -(-spec.params // 6) * 6
    assert rank_states(s, 0)["device"]["parameters"] == 2 * flat
    grads = [rank_states(s, r)["device"]["gradients"] for r in range(3)]
    # DeepSpeed's params_in_partition: every tensor (module order, counted on meta) that overlaps a
    # rank's range [r P, (r+1) P) of the flat buffer; the last rank also holds the padding
    with torch.device("meta"):
        numels = [p.numel() for p in toymodels.build(spec).parameters()]
    part, starts = flat // 3, [sum(numels[:i]) for i in range(len(numels))]
    expected = [
        2 * sum(n for n, a in zip(numels, starts, strict=True) if a < (r + 1) * part and a + n > r * part)
        for r in range(3)
    ]
    expected[2] += 2 * (flat - spec.params)
    assert grads == expected and len(set(grads)) == 3  # ranks differ
    assert estimate(s).components["gradients"] == max(grads)


def test_measured_reference_numbers_for_linear_stack():
    # measured with DeepSpeed 0.19.8 on 2 CPU ranks (docs/architecture.md): 4 x Linear(1024, 1024), bias.
    import torch

    from kit.models import from_module

    spec = from_module(lambda: torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)]))
    assert spec.params == 4_198_400
    mb = 1e6

    def total(**zero):
        s = Setup(model=spec, cluster={"nodes": 1, "gpus_per_node": 2}, zero=zero, batch={"micro_batch": 1})
        r = rank_states(s)
        return sum(r["device"].values()) + sum(r["host"].values())

    assert round(total(stage=0, precision="fp32") / mb, 2) == 67.17
    assert round(total(stage=2) / mb, 2) == 37.79
    assert round(total(stage=2, offload_optimizer="cpu") / mb, 2) == 50.38


def test_components_and_fit_verdicts():
    s = setup_for(preset("llama-2-7b"), 3)
    e = estimate(s)
    assert set(e.components) == set(COMPONENTS)
    assert e.components_bytes == sum(e.components.values())
    assert e.screen_bytes == e.peak_tensor_bytes + e.peak_overhead.bytes
    assert e.per_gpu_bytes == e.reserved_bytes + e.peak_overhead.bytes > e.screen_bytes
    assert e.model_states_bytes == sum(
        e.components[k] for k in ("parameters", "gradients", "optimizer_states")
    )
    assert e.fits["H100-SXM-80GB"] and not e.fits["V100-SXM2-16GB"]
    assert all(e.formulas[k] for k in COMPONENTS)
    data = e.to_dict()
    assert data["setup"]["batch"]["train_batch"] == 8 and data["params"] == 6_738_415_616


def test_the_peak_decides_fits_not_the_sum_of_components():
    """Issue 39: Llama-3-8B at stage 3 with CPU optimizer offload, 64K tokens a micro-step, checkpointing:
    every component at once is 70.49 GiB, but the loss's backward holds 62.6 GiB of fp32 logit gradients and
    the peak per GPU is past an H100's 79.65 GiB: it does not fit (nor, with the allocator replayed, on an
    H200's 139.80 GiB: its cache flushed, its segments still hold too much). The paper's formula, which has
    no peak, decides on its components' sum."""
    s = Setup(
        model=preset("llama-3-8b"),
        cluster={"gpus_per_node": 8, "gpu": "H100-SXM-80GB"},
        zero={"stage": 3, "offload_optimizer": "cpu", "precision": "bf16", "activation_checkpointing": True},
        batch={"micro_batch": 8, "seq_len": 8192},
    )
    e = estimate(s)
    capacity = gpu("H100-SXM-80GB").memory_bytes
    assert e.components_bytes < capacity < e.per_gpu_bytes and e.peak_phase == "backward"
    assert not e.fits["H100-SXM-80GB"] and e.fits["MI300X"]
    for name, ok in e.fits.items():  # every GPU's verdict is the peak's (flushed, near the memory)
        room = gpu(name).memory_bytes
        flushed = e.screen_bytes <= room and e.reserved.flushed(room - e.peak_overhead.bytes) is not None
        assert ok == ((e.per_gpu_bytes <= room or flushed) and gpu(name).peak_tflops("bf16") > 0), name
    paper = estimate(s, formula="zero-paper")
    assert paper.timeline is None and paper.per_gpu_bytes == paper.components_bytes


def test_stage_0_in_fp16_flattens_fp32_copies_of_every_gradient():
    """DeepSpeed's FP16_Optimizer (stage 0 in fp16 or bf16 with FusedAdam, a GPU's default): ``step``
    makes a list of every gradient's fp32 copy and flattens it while the 16-bit gradients are live: 16-bit
    parameters 2 + master and Adam 12 + 16-bit gradients 2 + the list 4 + its flat copy 4 = 24 B per
    parameter (torch's Adam on CPU ranks steps FP16_UnfusedOptimizer: 20). A 1.5B GPT-2 on a 32 GB V100
    so runs out of memory at micro batch 1, as the DeepSpeed ZeRO tutorial's run did (data/published,
    A22)."""
    s = Setup(model=preset("gpt2"), cluster={"gpus_per_node": 1}, zero={"stage": 0, "precision": "fp16"})
    psi = s.model.params
    e = estimate(s)
    assert e.timeline.moments["optimizer"] == "at the gradients' flattening"
    assert e.phases["optimizer"] == 24 * psi
    assert estimate(s.replace(zero={"precision": "bf16"})).phases["optimizer"] == 24 * psi
    cpu = peak_timeline(s, implementation="single", backend="gloo")  # FP16_UnfusedOptimizer, per tensor
    assert cpu.totals["optimizer"] == 20 * psi + 2 * 4 * max(tensor_numels(s.model))


def test_offload_moves_bytes_from_gpu_to_cpu():
    s = setup_for(preset("llama-2-7b"), 3)
    off = estimate(s.replace(zero={"offload_optimizer": "cpu", "offload_param": "cpu"}))
    # on the GPU stay only the 65 RMSNorm weights (4096 <= persistence threshold), kept whole
    assert off.model_states_bytes == 65 * 2 * 4096
    # per rank in CPU RAM: 16-bit params 2S, 16-bit + fp32 gradients 6S, master + Adam 12S
    part = sum(-(-t // 8) for t in tensor_numels(s.model))
    host = {"parameters": 2 * part, "gradients": 6 * part, "optimizer_states": 12 * part, "buffers": 0}
    assert off.host == host
    assert off.cpu_bytes_per_node == 8 * (PROCESS_BASE_BYTES + 20 * part)


def gpt2_activation_terms(micro, seq):
    """GPT-2 small: per-layer 16sbh + 2as^2b + 4sbf (eager attention, no dropout) and its bool causal mask
    s^2, head 4sbh + 4sbv."""
    sb, h, a, f, v = seq * micro, 768, 12, 3072, 50257
    return 16 * sb * h + 2 * a * seq * sb + 4 * sb * f + seq * seq, 2 * sb * h, 4 * sb * h + 4 * sb * v


def test_gpt2_activation_formula_exact():
    s = Setup(model=preset("gpt2"), cluster={"nodes": 1, "gpus_per_node": 1}, batch={"micro_batch": 2})
    per_layer, _, logits = gpt2_activation_terms(2, 1024)
    assert estimate(s).components["activations"] == 12 * per_layer + logits
    double = s.replace(batch={"micro_batch": 4})
    masks = 12 * 1024 * 1024  # one per layer whatever the micro batch
    assert estimate(double).components["activations"] == 2 * (12 * per_layer + logits) - masks


def test_activation_checkpointing_keeps_layer_inputs_and_one_layer():
    s = Setup(model=preset("gpt2"), cluster={"nodes": 1, "gpus_per_node": 1}, batch={"micro_batch": 2})
    per_layer, layer_input, logits = gpt2_activation_terms(2, 1024)
    ckpt = estimate(s.replace(zero={"activation_checkpointing": True}))
    assert ckpt.components["activations"] == 12 * layer_input + per_layer + logits


def test_stage1_with_grad_accum_holds_full_gradients():
    s = setup_for(preset("gpt2"), 1)
    one, two = estimate(s), estimate(s.replace(batch={"grad_accum": 2}))
    assert two.components["gradients"] - one.components["gradients"] == 2 * s.model.params


def test_unknown_formula_is_rejected():
    with pytest.raises(ValueError, match="formula: must be one of deepspeed, zero-paper"):
        estimate(setup_for(preset("gpt2")), formula="guess")


def test_peak_timeline_in_the_estimate_and_its_json():
    from kit.estimate.memory import ALLOCATOR_FRAGMENTATION
    from kit.estimate.peak import PHASES
    from kit.gpus import CUDA_CONTEXT_BYTES, NCCL_BUFFER_BYTES

    e = estimate(setup_for(preset("llama-2-7b"), 3))
    data = e.to_dict()
    assert list(data["phases"]) == list(PHASES)
    assert data["peak_tensor_bytes"] == max(data["phases"].values()) == data["phases"][data["peak_phase"]]
    overhead = CUDA_CONTEXT_BYTES + NCCL_BUFFER_BYTES  # the allocator's share is replayed
    assert data["screen_bytes"] == e.peak_tensor_bytes + overhead
    assert data["peak_per_gpu_bytes"] == data["reserved_bytes"] + overhead
    assert data["per_gpu_bytes"] == data["peak_per_gpu_bytes"]  # the verdict's number is the peak's
    unreplayed = estimate(setup_for(preset("llama-2-7b"), 3).replace(zero={"offload_param": "cpu"}))
    slack = int(unreplayed.peak_tensor_bytes * ALLOCATOR_FRAGMENTATION)  # stands for the allocator there
    assert (
        unreplayed.reserved is None
        and "not replayed: parameters offloaded" in unreplayed.peak_overhead.formula
    )
    assert (
        unreplayed.per_gpu_bytes == unreplayed.screen_bytes == unreplayed.peak_tensor_bytes + overhead + slack
    )
    assert data["components_bytes"] == sum(e.components.values())  # the component list keeps its meaning
    assert all(data["formulas"][f"phase.{p}"] for p in PHASES)
    paper = estimate(setup_for(preset("llama-2-7b"), 3), formula="zero-paper").to_dict()
    assert paper["peak_tensor_bytes"] is None and paper["phases"] is None


def test_cpu_ranks_hold_no_gpu_overheads():
    """Issue 43: the toy GPT on 2 CPU ranks showed 771 MiB per rank, a GPU's CUDA context and NCCL
    buffers. ``on_accelerator("cpu")`` keeps every tensor and the GPU estimate, and drops them: the peak
    per rank is its tensors, the overhead 0 with why, no caching allocator to replay."""
    from kit.components import Component
    from kit.gpus import CUDA_CONTEXT_BYTES, NCCL_BUFFER_BYTES
    from kit.toys import SMOKE_TOY, TOY_ZERO

    s = Setup(
        model=toy_spec(**SMOKE_TOY), cluster={"gpus_per_node": 2}, zero=TOY_ZERO, batch={"micro_batch": 2}
    )
    gpu_ranks = estimate(s)
    cpu = gpu_ranks.on_accelerator("cpu")
    assert gpu_ranks.per_gpu_bytes > CUDA_CONTEXT_BYTES + NCCL_BUFFER_BYTES  # the GPU estimate keeps them
    assert gpu_ranks.on_accelerator("cuda") is gpu_ranks and gpu_ranks.accelerator == "cuda"
    assert cpu.accelerator == "cpu" and cpu.device == "rank" and gpu_ranks.device == "GPU"
    assert cpu.per_gpu_bytes == cpu.peak_tensor_bytes == gpu_ranks.peak_tensor_bytes < 4 * 2**20
    assert cpu.peak_overhead.bytes == cpu.components[Component.OVERHEAD] == 0
    assert cpu.formulas["peak_overhead"].startswith("not applicable on 2 CPU ranks: no CUDA context")
    assert cpu.reserved is None and cpu.reserved_bytes is None and gpu_ranks.reserved_bytes is not None
    assert {k: v for k, v in cpu.components.items() if k != Component.OVERHEAD} == {
        k: v for k, v in gpu_ranks.components.items() if k != Component.OVERHEAD
    }
    assert cpu.cpu_bytes_per_node == gpu_ranks.cpu_bytes_per_node  # the processes' own RAM is there
    table = cpu.table()
    assert "peak per rank" in table.index and "peak per GPU" not in table.index
    assert table.loc["peak per rank", "bytes"] == cpu.per_gpu_bytes
    assert "peak per GPU" in gpu_ranks.table().index
    paper = estimate(s, formula="zero-paper").on_accelerator("cpu")
    assert paper.per_gpu_bytes == estimate(s, formula="zero-paper").per_gpu_bytes  # it counts no overhead
    with pytest.raises(ValueError, match=r"^accelerator: choose one of cuda, cpu, got 'tpu'$"):
        gpu_ranks.on_accelerator("tpu")
    with pytest.raises(ValueError, match=r"^accelerator: back to cuda from cpu: call estimate"):
        cpu.on_accelerator("cuda")


def test_peak_optimizer_temporaries_follow_the_torch_implementation():
    from kit.estimate import partition
    from kit.estimate.memory import peak_timeline as timeline

    s = setup_for(preset("llama-2-7b"), 3)
    sub = partition.partition_numel(s)  # one sub group (sub_group_size 1e9 > S)
    fused, foreach, single = (
        timeline(s, implementation=i).totals["optimizer"] for i in ("fused", "foreach", "single")
    )
    assert foreach - fused == 4 * sub  # _foreach_sqrt: one fp32 copy of the sub group
    assert single - fused == 2 * 4 * sub  # sqrt and its quotient of the one flat tensor


def test_peak_checkpointing_and_buckets_move_the_phase_they_belong_to():
    from kit.estimate.activations import _head_activations
    from kit.estimate.memory import peak_timeline as timeline

    s = Setup(model=toy_spec(), cluster={"gpus_per_node": 2}, batch={"micro_batch": 2})
    ckpt = timeline(s.replace(zero={"activation_checkpointing": True}))
    m, b = s.model, s.batch
    # bf16: in forward only the blocks' inputs (2 B x s b h each) and the head's saved tensors are live;
    # the block recomputed in backward is not
    inputs = m.layers * 2 * b.seq_len * b.micro_batch * m.hidden
    assert ckpt.phases["forward"]["activations"].bytes == inputs + _head_activations(s, 1).bytes
    # stage 2: overlap_comm's second ipg bucket is live in the last block's backward, not in forward
    one, two = timeline(s), timeline(s.replace(zero={"overlap_comm": True}))
    assert one.moments["backward"] == "in the last block's backward"
    assert two.totals["backward"] - one.totals["backward"] == 2 * s.zero.reduce_bucket_size
    assert two.totals["forward"] == one.totals["forward"]


def test_a_stage_2_flush_holds_a_tensor_larger_than_the_bucket_beside_the_next_modules_gradients():
    """Stage 2 never copies a tensor larger than ``reduce_bucket_size`` into its bucket
    (``extra_large_param_to_reduce``): its gradient waits until the next hook reduces it, and that hook's
    module has computed its weight's and bias's gradients together (``partition.computed_with``). A toy GPT
    256 wide (MLP matrices of 262,144 elements) on 2 ranks, bucket 100,000: rank 1's largest flush, after
    its partition buffer exists, holds c_fc's weight and bias beside c_proj's weight, whose slices are both
    ranks' (a flat copy too). Measured (2 CPU ranks, bf16): the backward 5.9 % (rank 0) and 6.9 % (rank 1)
    above the estimate before, 2.4 % and 3.6 % now; the rest is the activations still live at a flush, which
    the estimate counts at the end's states."""
    from kit.estimate import partition
    from kit.estimate.reductions import _flush_sizes

    s = Setup(
        model=toy_spec(hidden=256, vocab=128, seq_len=32),
        cluster={"nodes": 1, "gpus_per_node": 2},
        zero={"stage": 2, "reduce_bucket_size": 100_000},
        batch={"micro_batch": 2, "seq_len": 32},
    )
    numels, siblings = partition.trainable(s), partition.computed_with(s)
    block = slice(2, 14)  # ln_1, c_attn, attn.c_proj, ln_2, c_fc, mlp.c_proj: each weight then bias
    assert numels[block] == (256, 256, 196_608, 768, 65_536, 256, 256, 256, 262_144, 1024, 262_144, 256)
    # c_attn's and c_fc's biases with their weights; a norm's weight after the position embeddings is no
    # bias, and the projections' biases, followed by a norm, are missed (counted alone)
    assert siblings[block] == (0, 0, 0, 196_608, 0, 0, 0, 0, 0, 262_144, 0, 0)
    assert siblings[:2] == (0, 0)  # the embeddings: 2-D, alone
    part = partition.partition_numel(s)
    before, after, _ = _flush_sizes(numels, siblings, part, 1, 100_000)
    assert after == (262_144 + 1024, 262_144, 2)
    line = peak_timeline(s, 1, backend="gloo")
    assert line.moments["backward"] == "at a bucket flush"
    assert (
        "a tensor larger than the bucket: its own gradient" in line.phases["backward"]["temporaries"].formula
    )


def test_a_fused_losss_head_is_held_all_step_at_stage_3_and_counted_once():
    """The fused losses read the head's weight in the top module's forward: at ZeRO-3 an external
    parameter of it, gathered all step (``partition.external_head``; measured on 2 CPU ranks with every
    tensor released, tests/test_peak.py). Llama-3-8B's untied head (128,256 x 4,096) is the last tensor,
    which ``max_reuse_distance`` keeps to its backward anyway: it is counted once, beside the largest other
    tensor in use (its input embeddings, as large: the first forward gathers them with the head already
    held) and the prefetch; at the loss the head itself is in use, the prefetch beside it."""
    from kit.estimate import partition
    from kit.estimate.peak import _gathered

    plain = Setup(model=preset("llama-3-8b"), zero={"stage": 3}, batch={"micro_batch": 1, "seq_len": 8192})
    fused = plain.replace(zero={"loss": "chunked"})
    head, n = 128_256 * 4_096, plain.zero_dp
    assert partition.external_head(fused) == head and partition.external_head(plain) == 0
    assert partition.gathered_padded(fused)[1] == partition.padded(head, n)  # kept to backward: the head
    # a prefetch call: q, k, v, o (42M) and gate, past the 50M bucket
    embeddings, prefetch = 128_256 * 4_096, partition.prefetch_call(fused)
    assert prefetch == 2 * 4_096 * 4_096 + 2 * 4_096 * 1_024 + 4_096 * 14_336
    # the held head counts among stage3_max_live_parameters (1e9): beside it and the embeddings in use no
    # room is left to prefetch
    assert _gathered(fused).bytes == 2 * (partition.padded(head, n) + embeddings)
    # at the loss the head's fetch prefetches the backward's first tensors: the last down projection
    after = partition.prefetch_call(fused, after_head=True)
    assert after == 4_096 * 14_336
    assert _gathered(fused, at_head=True).bytes == 2 * (partition.padded(head, n) + after)
    # without the fused loss: the head kept, the embeddings in use and the prefetch
    assert _gathered(plain).bytes == 2 * (partition.padded(head, n) + embeddings + prefetch)
