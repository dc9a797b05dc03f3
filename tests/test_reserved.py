"""The caching allocator's replay of a predicted step (kit.estimate.reserved): the step's tensors are the
peak timeline's, each stream allocates from its own pool, and what is not replayed says so."""

import pytest

from kit import Setup, gpus
from kit.estimate import estimate, memory, partition, reserved
from kit.estimate.allocator import Alloc, EmptyCache, Free, Mark, replay
from kit.estimate.deepspeed_events import DEFAULT, GATHER, REDUCE, Step
from kit.estimate.partition import blocks
from kit.models import preset


def step(setup):
    held = memory.states(setup)
    return Step(setup, held.device, memory.batch_activations(setup)).events()


def test_a_model_is_its_embeddings_its_repeated_block_and_its_head():
    before, block, after, count = blocks(preset("gpt2"))
    assert before == (50257 * 768, 1024 * 768) and after == (768, 768) and count == 12
    # ln_1 weight and bias, c_attn, c_proj, ln_2, c_fc, c_proj: weights and biases
    assert block == (768, 768, 768 * 2304, 2304, 768 * 768, 768, 768, 768, 768 * 3072, 3072, 3072 * 768, 768)
    before, block, after, count = blocks(preset("llama-2-7b"))
    assert (before, after, count, len(block)) == ((32000 * 4096,), (4096, 32000 * 4096), 32, 9)
    assert sum(before) + count * sum(block) + sum(after) == preset("llama-2-7b").params


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("model", ["gpt2", "qwen2.5-0.5b"])
def test_the_replayed_step_holds_the_timelines_tensors(model, stage):
    """The replay's own tensor peak is the peak timeline's (kit.estimate.peak) to within its grain: the
    replay cuts a block's activations into tensors of s b h and s b f and holds the recomputed block
    whole, the timeline adds one layer; measured on 2 models x 4 stages x checkpointing x 2 batches,
    from 0 to +13.4 % (the timeline is what the fit and the published checks compare)."""
    for ckpt in (False, True):
        for micro, accum in ((1, 1), (4, 1), (2, 3)):
            s = Setup(
                model=preset(model),
                cluster={"gpus_per_node": 8},
                zero={"stage": stage, "activation_checkpointing": ckpt},
                batch={"micro_batch": micro, "grad_accum": accum, "seq_len": 1024},
            )
            e = estimate(s)
            ratio = e.reserved.allocated / e.peak_tensor_bytes - 1
            assert -0.02 <= ratio <= 0.14, (s.label, ratio)
            assert e.reserved.reserved >= e.reserved.allocated > 0
            assert e.reserved_bytes == e.peak_tensor_bytes + e.reserved.cached


def test_stage_3_gathers_on_its_own_stream_and_reduces_on_another():
    """Stage 3 (overlap_comm): every released tensor is gathered on the all-gather stream, padded to the
    ranks, twice a step (forward, backward) but for those kept to their backward; reduce-scatter copies on
    the reduction stream; activations and gradients on the default stream."""
    s = Setup(model=preset("gpt2"), cluster={"gpus_per_node": 8}, zero={"stage": 3}, batch={"micro_batch": 1})
    events = step(s)
    streams = {e.stream for e in events if isinstance(e, Alloc)}
    assert streams == {DEFAULT, GATHER, REDUCE}
    gathered = sorted(e.size for e in events if isinstance(e, Alloc) and e.stream == GATHER)
    released = [2 * partition.padded(t, 8) for t in partition.released(s)]
    assert set(gathered) >= set(released)  # each alone, or in a prefetch's flat buffer with its copy
    # one pool per stream: the same events on one stream reserve no more than on three
    one = [Alloc(e.key, e.size) if isinstance(e, Alloc) else e for e in events]
    assert replay(one).max_reserved <= replay(events).max_reserved
    marks = [e.name for e in events if isinstance(e, Mark)]
    assert set(marks) == {"forward", "backward", "optimizer"}
    assert sum(isinstance(e, EmptyCache) for e in events) == 1  # DeepSpeed's defragment, before the steps


def test_zero_init_partitions_are_freed_and_the_cache_emptied():
    """Stage 3: zero.Init builds each tensor whole on the device and partitions it at once; DeepSpeed's
    ``defragment`` then copies the partitions to the host, frees them, empties the cache and copies them
    back into one flat buffer: nothing of zero.Init stays reserved (measured on an H200: ZeRO-3's max
    reserved within 5 % of the replay's, data/reference)."""
    s = Setup(model=preset("gpt2"), cluster={"gpus_per_node": 8}, zero={"stage": 3}, batch={"micro_batch": 1})
    events = step(s)
    first = next(i for i, e in enumerate(events) if isinstance(e, Mark))
    init, numels = events[:first], partition.numels(s)
    built = init[: 3 * len(numels)]  # per tensor: whole, its partition, the whole freed
    assert [e.size for e in built[0::3]] == [2 * t for t in numels]
    assert [e.size for e in built[1::3]] == [2 * -(-t // 8) for t in numels]
    assert [e.key for e in built[2::3]] == [e.key for e in built[0::3]]
    parts = {e.key for e in built[1::3]}
    assert parts <= {e.key for e in init[3 * len(numels) :] if isinstance(e, Free)}  # all freed
    emptied = next(i for i, e in enumerate(init) if isinstance(e, EmptyCache))
    assert not any(isinstance(e, Alloc) and e.key in parts for e in init[emptied:])
    after = replay(init[: emptied + 2])  # the flat buffer: reserved is what it rounds up to, no more
    assert after.reserved - after.allocated < 20 * 2**20


def test_what_it_does_not_replay_says_none():
    base = Setup(model=preset("gpt2"), cluster={"gpus_per_node": 8}, batch={"micro_batch": 1})
    for zero in (
        {"engine": "ddp", "stage": 0},
        {"stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"},
    ):
        e = estimate(base.replace(zero=zero))
        assert e.reserved is None and e.reserved_bytes is None and e.to_dict()["reserved_bytes"] is None
    assert estimate(base, formula="zero-paper").reserved is None


@pytest.mark.parametrize("stage", [3, 2])  # fsdp, fsdp-grad-op (reshard_after_forward=False)
def test_fsdp2_gathers_each_unit_reduces_it_in_fp32_and_keeps_only_its_states(stage):
    """FSDP2 (kit.estimate.fsdp_events): each block's flat all-gather output (8 x its padded shards, bf16)
    on the copy-in stream, in forward and again in backward (``fsdp``: resharded after forward) or in forward
    only (``fsdp-grad-op``), the root's once a step; one fp32 reduce-scatter output per unit per step on the
    reduce-scatter stream; after the two steps only the fp32 shards and Adam's two moments of each are live;
    the replay's own tensor peak within its grain of the timeline's (the root's unsharded gradients held to
    the end of the backward and the fp32 reduce-scatter input are the replay's alone)."""
    from kit.estimate.fsdp_events import FsdpStep

    s = Setup(
        model=preset("gpt2"),
        cluster={"gpus_per_node": 8},
        zero={"engine": "fsdp", "stage": stage},
        batch={"micro_batch": 2},
    )
    held = memory.states(s)
    events = FsdpStep(s, held.device, memory.batch_activations(s)).events()
    before, block, after, count = blocks(s.model)
    flat = 2 * sum(partition.padded(t, 8) for t in block)
    gathers = [e for e in events if isinstance(e, Alloc) and e.stream == GATHER and e.size == flat]
    assert len(gathers) == 2 * count * (2 if stage == 3 else 1)  # two steps
    outputs = [e.size for e in events if isinstance(e, Alloc) and e.stream == REDUCE]
    root = 4 * sum(partition.padded(t, 8) for t in (*before, *after)) // 8
    assert outputs == 2 * ([4 * flat // 2 // 8] * count + [root])
    live: dict[int, int] = {}
    for e in events:
        if isinstance(e, Alloc):
            live[e.key] = e.size
        elif isinstance(e, Free):
            live.pop(e.key, None)
    shards = [4 * partition.padded(t, 8) // 8 for t in partition.numels(s)]
    workspace = gpus.gpu(s.cluster.gpu).blas_workspace_bytes  # the forward's and the backward's, for good
    assert sorted(live.values()) == sorted(shards * 3 + [workspace] * 2)  # the shards, exp_avg, exp_avg_sq
    e = estimate(s)
    # the replay's grain against the timeline's: +1.9 % (fsdp), +2.6 % (fsdp-grad-op)
    assert 0.015 <= e.reserved.allocated / e.peak_tensor_bytes - 1 <= 0.03
    assert e.reserved_bytes == e.peak_tensor_bytes + e.reserved.cached > e.peak_tensor_bytes


def test_the_cli_shows_fsdps_replayed_reserve_beside_its_peak(capsys):
    """``zerokit estimate`` on FSDP2 prints the replayed max reserved, and where the published runs stand."""
    from kit.cli import main

    argv = ["estimate", "--model", "gpt2", "--stage", "fsdp", "--micro-batch", "2", "--seq-len", "1024"]
    assert main(argv) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("max reserved"))
    e = estimate(
        Setup(
            model=preset("gpt2"),
            cluster={"gpus_per_node": 8},
            zero={"engine": "fsdp", "stage": 3},
            batch={"micro_batch": 2, "seq_len": 1024},
        )
    )
    assert f"{e.reserved_bytes / 2**30:9.2f}" in line
    assert line.endswith("how close it came on published runs: zerokit published")


def _optimizer_allocs(events, stream=None):
    """The allocations of the second step's optimizer phase (on ``stream``, or every stream)."""
    marks = [i for i, e in enumerate(events) if isinstance(e, Mark) and e.name == "optimizer"]
    return [e for e in events[marks[-1] :] if isinstance(e, Alloc) and (stream is None or e.stream == stream)]


def test_stage_3_in_fp16_checks_for_overflow_on_the_reduction_stream():
    """``has_overflow`` (stage 3, fp16): ``isinf`` of the flat gradient partition through its 16-bit
    ``abs``, then ``isnan``, on the reduction stream: 2 B x N, then two bool masks of N (the H100 trace of
    A18's shape: 549.4 and 274.7 MiB, the reduction stream's 0.83 GiB); bf16 has no loss scale to check."""
    base = Setup(
        model=preset("gpt2"), cluster={"gpus_per_node": 8}, zero={"stage": 3}, batch={"micro_batch": 1}
    )
    n = partition.partition_numel(base.replace(zero={"precision": "fp16"}))
    fp16 = _optimizer_allocs(step(base.replace(zero={"precision": "fp16"})), REDUCE)
    assert [e.size for e in fp16] == [2 * n, n, n]
    assert _optimizer_allocs(step(base.replace(zero={"precision": "bf16"})), REDUCE) == []


def test_the_torch_optimizers_path_gives_its_temporaries():
    """torch_adam's ``_multi_tensor_adam`` (foreach, CUDA's default) makes one ``_foreach_sqrt`` copy of
    the sub group's fp32 partition; DeepSpeed's FusedAdam (the estimate's default) none."""
    s = Setup(model=preset("gpt2"), cluster={"gpus_per_node": 8}, zero={"stage": 3}, batch={"micro_batch": 1})
    held, act = memory.states(s), memory.batch_activations(s)
    fused = [e.size for e in _optimizer_allocs(Step(s, held.device, act).events())]
    foreach = [e.size for e in _optimizer_allocs(Step(s, held.device, act, "foreach").events())]
    assert sorted(foreach) == sorted(fused + [4 * partition.partition_numel(s)])


def test_a_gradient_larger_than_the_bucket_waits_in_it_for_the_next_hook():
    """A tensor larger than ``reduce_bucket_size`` is never copied into the bucket: its own gradient waits
    there until the next hook reduces it, beside that hook's (stage 3's ``__add_grad_to_ipg_bucket``, as
    stages 1-2's ``extra_large_param_to_reduce``). The peak's reduce-scatter moments hold it; the replay
    frees it at that reduction, not at its own hook."""
    from kit.estimate.reductions import _scatter_sizes

    s = Setup(
        model=preset("gpt2"),
        cluster={"gpus_per_node": 8},
        zero={"stage": 3, "reduce_bucket_size": 1_000_000},
        batch={"micro_batch": 1, "seq_len": 64},  # short: the loss's backward is not the peak
    )
    flushes = _scatter_sizes(partition.numels(s), None, 8, 1_000_000, s.zero.param_persistence_threshold)
    waiting = {w for _, _, w in flushes}
    assert waiting == {0, 768 * 3072, 768 * 2304}  # the MLP matrices, c_attn (wte: the epilogue reduces it)
    events, mlp = step(s), 2 * 768 * 3072
    live, most = set(), 0
    for ev in events:
        if isinstance(ev, Alloc) and ev.stream == DEFAULT and ev.size == mlp:
            live.add(ev.key)
            most = max(most, len(live))
        elif isinstance(ev, Free):
            live.discard(ev.key)
    assert most == 2  # the MLP's two weight gradients, c_proj's waiting beside c_fc's


def _before_the_first_step(events) -> list[str]:
    """The allocations (``+B``) and frees (``-B``) of more than 1 MB before the first step."""
    sizes, out = {}, []
    for ev in events[: next(i for i, e in enumerate(events) if isinstance(e, Mark))]:
        if isinstance(ev, Alloc):
            sizes[ev.key] = ev.size
            out.append(f"+{ev.size}")
        elif isinstance(ev, Free):
            out.append(f"-{sizes[ev.key]}")
    return [e for e in out if abs(int(e)) > 10**6]


def test_the_fp32_master_comes_through_a_copy_and_the_zero_gradient_is_dropped():
    """At initialize (DeepSpeed 0.19, as the H100 traces show): stages 1-2 clone the 16-bit partition and
    convert the clone to fp32 (the clone dropped), stage 3 converts a sub group's partition and clones
    that (the conversion dropped); then ``initialize_optimizer_states``' zero fp32 gradient is made and
    dropped. A18's trace: +576,087,936 then +1,152,175,872 twice, one freed, +1,152,175,872 freed."""
    base = Setup(model=preset("gpt2-xl"), cluster={"gpus_per_node": 8}, batch={"micro_batch": 1})
    for stage, copy in ((2, 2), (3, 4)):
        s = base.replace(zero={"stage": stage})
        n = partition.partition_numel(s)
        seen = " ".join(_before_the_first_step(step(s)))
        assert f"+{copy * n} +{4 * n} -{copy * n} +{4 * n} -{4 * n}" in seen, (stage, seen)


def test_stages_1_2_flatten_on_the_device_only_beside_the_context_nccl_and_the_module():
    """``flatten_on_accelerator`` asks NVML's free memory, after the module's broadcast made NCCL's buffers:
    a card with room for the flat buffer beside the CUDA context and the module, but not beside NCCL's too,
    flattens through the host (the cache emptied first) on 8 ranks, on the device alone (no NCCL)."""
    from kit.estimate.allocator import allocation_size, round_size
    from kit.units import GIB, MIB

    s = Setup(model=preset("gpt2"), cluster={"gpus_per_node": 8}, zero={"stage": 2}, batch={"micro_batch": 1})
    made = Step(s, memory.states(s).device, memory.batch_activations(s))
    module = sum(allocation_size(round_size(made.p * t)) for _, t in made.tensors)
    room = gpus.CUDA_CONTEXT_BYTES + module + memory.states(s).device["parameters"].bytes
    try:
        for name, nccl in (("short", gpus.NCCL_BUFFER_BYTES - MIB), ("enough", gpus.NCCL_BUFFER_BYTES + MIB)):
            gpus.define_gpu(f"{name}:memory_gib={(room + nccl) / GIB!r},memory_gbps=1000,bf16_tflops=100")
        for name, ranks, through_host in (("short", 8, True), ("enough", 8, False), ("short", 1, False)):
            events = step(s.replace(cluster={"gpu": name, "gpus_per_node": ranks}))
            first = next(i for i, e in enumerate(events) if isinstance(e, Mark))
            assert any(isinstance(e, EmptyCache) for e in events[:first]) == through_host, (name, ranks)
    finally:
        gpus.DEFINED_GPUS.clear()


def test_overlap_comm_doubles_the_ipg_buffer_as_two_buffers():
    """``setup_buckets``: a ``reduce_bucket_size`` buffer, and overlap_comm's second, each its own
    allocation (the cache can serve each from a different free block)."""
    s = Setup(
        model=preset("gpt2"),
        cluster={"gpus_per_node": 8},
        zero={"stage": 2, "reduce_bucket_size": 3_000_000, "overlap_comm": True},
        batch={"micro_batch": 1},
    )
    buffers = [e for e in step(s) if isinstance(e, Alloc) and e.size == 2 * 3_000_000]
    assert len(buffers) == 2 * 2  # two a step, two steps
    off = [
        e
        for e in step(s.replace(zero={"overlap_comm": False}))
        if isinstance(e, Alloc) and e.size == 6_000_000
    ]
    assert len(off) == 2


def test_stages_1_2_copy_each_gradient_piece_to_fp64_for_the_norm():
    """``get_grad_norm_direct``: ``vector_norm`` of an fp64 copy of each gradient piece in the rank's
    partition, one at a time: the largest is the 8 B x piece the replay allocates (A23's trace: the
    embeddings', 1,648,361,472 B)."""
    s = Setup(
        model=preset("gpt2-xl"), cluster={"gpus_per_node": 8}, zero={"stage": 2}, batch={"micro_batch": 1}
    )
    piece = partition.largest_piece(s)
    assert piece == min(50257 * 1600, partition.partition_numel(s))  # wte, the first tensor of rank 0
    assert 8 * piece in [e.size for e in _optimizer_allocs(step(s))]
    assert partition.largest_piece(s, rank=7) < piece


def test_stage_0_with_a_torch_optimizer_keeps_tensor_by_tensor_fp32_states():
    """Stage 0 in 16 bits with ``torch_adam`` is DeepSpeed's FP16_UnfusedOptimizer: an fp32 clone of
    every tensor and, at initialize, one step over zero gradients (the moments, tensor by tensor); each
    step copies every gradient to fp32 and steps them with foreach's temporaries, no flat buffer. A fused
    Adam (FP16_Optimizer) flattens: one fp32 gradient of every parameter."""
    s = Setup(model=preset("gpt2"), cluster={"gpus_per_node": 1}, zero={"stage": 0}, batch={"micro_batch": 1})
    held, act = memory.states(s), memory.batch_activations(s)
    wte = 50257 * 768
    fused = Step(s, held.device, act).events()
    unfused = Step(s, held.device, act, "foreach").events()
    at_init = [int(e) for e in _before_the_first_step(unfused) if e.startswith("+")]
    assert at_init.count(4 * wte) == 5  # master, zero fp32 gradient, two moments, the sqrt
    assert 4 * s.model.params in [e.size for e in _optimizer_allocs(fused)]
    assert 4 * s.model.params not in [e.size for e in _optimizer_allocs(unfused)]
    assert [e.size for e in _optimizer_allocs(unfused)].count(4 * wte) == 2  # its fp32 gradient, its sqrt


@pytest.mark.parametrize(
    "zero",
    [{"stage": 1}, {"stage": 2, "offload_optimizer": "cpu"}, {"stage": 3}, {"engine": "fsdp", "stage": 3}],
)
def test_the_micro_steps_between_the_first_and_the_last_repeat_one_another(monkeypatch, zero):
    """A step replays its first micro-step, one of those between and the boundary one: seven replayed
    whole reserve and allocate what three do (each middle one leaves the pools as it found them)."""
    from kit.estimate import deepspeed_events

    s = Setup(
        model=preset("gpt2-medium"), zero=zero, batch={"micro_batch": 2, "grad_accum": 7, "seq_len": 512}
    )
    held, act = memory.states(s), memory.batch_activations(s)
    assert deepspeed_events.micro_steps(7) == [0, 1, 6] and deepspeed_events.micro_steps(1) == [0]
    three = reserved.reserved(s, held.device, act)
    monkeypatch.setattr(deepspeed_events, "micro_steps", lambda n: list(range(n)))
    reserved._replayed.cache_clear()  # replayed again, all seven
    seven = reserved.reserved(s, held.device, act)
    reserved._replayed.cache_clear()  # no later test reads the seven back
    assert seven.events > three.events
    assert (seven.allocated, seven.reserved) == (three.allocated, three.reserved)


def test_past_the_memory_the_allocator_flushes_its_cache_and_the_replay_decides():
    """Llama-2-7B at stage 3 on 8 GPUs reserves 46.34 GiB with room to spare: past an L40S's 44.4 GiB, but
    PyTorch frees its cached segments and retries before it gives up, and the same allocations replayed
    within the L40S never run out: it fits, flushing (slower steps), holding what the capped replay held.
    On an A100-40GB they run out even so; a GPU smaller than the tensors alone is not replayed at all."""
    from kit.fit import estimate_fit

    s = Setup(model=preset("llama-2-7b"), zero={"stage": 3}, batch={"micro_batch": 1, "seq_len": 4096})
    e = estimate(s)
    overhead = e.peak_overhead.bytes
    l40s = gpus.gpu("L40S").memory_bytes
    assert e.screen_bytes < l40s < e.per_gpu_bytes
    verdict = estimate_fit(e, "L40S")
    capped = replay(e.reserved.sequence, capacity=l40s - overhead)
    assert verdict.ok and verdict.flushes and capped.oom is None
    assert verdict.need == capped.max_reserved + overhead <= l40s < e.reserved.reserved + overhead
    a100 = gpus.gpu("A100-SXM-40GB").memory_bytes
    assert e.screen_bytes < a100 and replay(e.reserved.sequence, capacity=a100 - overhead).oom is not None
    assert estimate_fit(e, "A100-SXM-40GB")[:2] == ("gpu", e.per_gpu_bytes)
    fresh = estimate(s.replace(batch={"micro_batch": 4}))  # its tensors alone are past an L4's memory
    assert fresh.screen_bytes > gpus.gpu("L4").memory_bytes
    assert estimate_fit(fresh, "L4").problem == "gpu" and "reserved" not in fresh.__dict__  # no replay
    assert estimate_fit(e, "H100-SXM-80GB") == (  # room to spare: max reserved, no flush
        "",
        e.reserved_bytes + overhead,
        gpus.gpu("H100-SXM-80GB").memory_bytes,
        False,
    )


def test_a_run_with_expandable_segments_is_decided_on_their_replay(capsys):
    """``zero.expandable_segments`` (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True): the same allocations
    replayed on growing segments are the run's max reserved and the verdict's bytes; the plain allocator's
    stays beside it. Llama-2-7B at stage 3 needs the L40S's cache flushed with the plain allocator, not
    with expandable segments; the A100-40GB is past either, the capped replay on growing segments too."""
    from kit.cli import main
    from kit.fit import estimate_fit

    s = Setup(
        model=preset("llama-2-7b"),
        cluster={"gpu": "L40S"},
        zero={"stage": 3},
        batch={"micro_batch": 1, "seq_len": 4096},
    )
    plain, grown = estimate(s), estimate(s.replace(zero={"expandable_segments": True}))
    assert grown.reserved.expandable and not plain.reserved.expandable
    assert grown.reserved_bytes == grown.reserved_expandable_bytes == plain.reserved_expandable_bytes
    assert grown.reserved_plain_bytes == plain.reserved_bytes == plain.reserved_plain_bytes
    assert grown.reserved_bytes < plain.reserved_bytes - 5 * 2**30  # about 5.9 GiB less
    assert grown.per_gpu_bytes == grown.reserved_bytes + grown.peak_overhead.bytes
    assert estimate_fit(plain, "L40S").flushes
    assert estimate_fit(grown, "L40S")[:2] == ("", grown.per_gpu_bytes)  # within, nothing flushed
    a100 = gpus.gpu("A100-SXM-40GB").memory_bytes
    room = a100 - grown.peak_overhead.bytes
    assert grown.screen_bytes < a100 and grown.reserved.flushed(room) is None
    assert replay(grown.reserved.sequence, capacity=room, expandable_segments=True).oom is not None
    assert not estimate_fit(grown, "A100-SXM-40GB").ok
    argv = ["estimate", "--model", "llama-2-7b", "--stage", "3", "--seq-len", "4096", "--gpu", "L40S"]
    assert main([*argv, "--expandable-segments"]) == 0
    text = capsys.readouterr().out
    assert f"{grown.reserved_bytes / 2**30:.2f}  torch.cuda.max_memory_reserved" in text
    assert f"(with expandable segments; without them: {plain.reserved_bytes / 2**30:.2f})" in text
    assert "L40S yes," in text and "would reserve" not in text
    assert main(argv) == 0
    assert "L40S yes (flushing" in capsys.readouterr().out
