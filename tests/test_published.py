"""Published measurements of real GPU runs (data/published/) beside the kit's predictions
(``kit.accuracy.published``, ``zerokit published``): the rows load, each memory row becomes the Setup it
describes or the one reason the kit cannot express it, and the numbers set beside the measurements are
the estimate's own."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kit.accuracy import published as P
from kit.accuracy import published_rows as R
from kit.accuracy.published_reasons import feature_reason
from kit.cli import main
from kit.estimate import estimate
from kit.fit import estimate_fit
from kit.gpus import gpu
from kit.paths import PUBLISHED
from kit.units import GIB, MIB

REPO = Path(__file__).resolve().parent.parent
#: the fit rows whose scripts pad each batch to its longest sample (``published_rows.LONGEST``)
PADDED = ("A25", "A27", "A28", "A30")
MEMORY = {row["id"]: row for row in R.load("memory")}

#: every memory row: the reason the kit cannot express it, or None where it compares it
REASONS = {
    "A01": None,
    "A02": "torch.compile",
    "A03": None,
    "A04": "torch.compile",
    "A05": "Float8 linears",
    "A06": "Float8 linears",
    "A07": None,
    "A08": None,
    "A09": None,
    "A10": None,
    "A18": None,
    "A19": None,
    "A20": None,
    "A21": None,
    "A22": None,
    "A23": None,
    # --freeze_embeds is modelled (kit.trainable) for DeepSpeed's ZeRO; t5-large and t5-3b are configs
    # under data/published/models, the RTX 3090 in data/gpus.csv
    "A24": "one GPU without DDP (plain PyTorch: no DDP gradient buckets)",
    "A25": None,
    "A26": "zero.engine: a trainable subset is modelled for DeepSpeed's ZeRO; engine 'ddp' is not",
    "A27": None,
    "A28": None,
    # DeBERTa's classification head (its config's architectures) and BlenderBot's 128 / 64 tokens are
    # expressed; the DDP runs trained under fp16 autocast, which the kit's DDP does not model
    "A29": "fp16 mixed precision under PyTorch DDP (the kit's DDP is fp32 or bf16)",
    "A30": None,
    "A31": "fp16 mixed precision under PyTorch DDP (the kit's DDP is fp32 or bf16)",
    "A32": None,
    "A33": None,
    "A34": "FSDP1 flat parameters",
    "A35": "FSDP1 flat parameters",
    "A36": "FSDP1 flat parameters",
    "A37": "tensor parallelism (TP=8)",
    "A38": "tensor and pipeline parallelism (TP=8, PP=10)",
    "A39": "tensor and pipeline parallelism (TP=8, PP=10)",
}


@pytest.fixture
def report(published_report):  # every row, computed once per test run (tests/conftest.py)
    return published_report


def by_id(report) -> dict:
    return {c.id: c for c in report.comparisons}


def test_the_published_rows_load_with_their_ids_and_sources():
    assert sorted(p.name for p in PUBLISHED.iterdir()) == [
        "README.md",
        "memory.jsonl",
        "models",
        "throughput.jsonl",
    ]
    memory, throughput = R.load("memory"), R.load("throughput")
    assert (len(memory), len(throughput)) == (32, 36)  # as data/published/README.md says
    every = memory + throughput
    assert all(isinstance(r["id"], str) and r["id"] and r["source"] for r in every)
    assert len({r["id"] for r in every}) == 68
    assert {r["table"] for r in memory} == {"memory"} and {r["table"] for r in throughput} == {"throughput"}
    assert P.ids("memory") == list(REASONS) and P.ids() == list(REASONS) + [f"B{i:02}" for i in range(1, 37)]
    with pytest.raises(ValueError, match="^table: choose one of memory, throughput, got 'speed'"):
        R.load("speed")


def test_every_memory_row_is_expressed_or_says_why(report):
    found = {c.id: c.reason for c in report.comparisons if c.row["table"] == "memory"}
    assert found == REASONS
    for c in report.comparisons:
        assert c.expressed == (c.setup is not None) and (c.expressed or c.reason.strip())
        assert not c.expressed or (c.values or c.checks or c.timings)  # an expressed row is compared
    assert feature_reason(MEMORY["A05"]) == "Float8 linears"  # Float8 comes before torch.compile
    full = {**MEMORY["A01"], "activation_checkpointing": "full"}  # its extras: "no torch.compile, no Float8"
    assert feature_reason(full) is None
    assert feature_reason({**full, "extras": "torch.compile ON"}) == "torch.compile"


def test_a18_is_the_zeropp_tutorials_zero3_baseline():
    s = R.express(MEMORY["A18"]).setup
    z, c, b = s.zero, s.cluster, s.batch
    assert (z.engine, z.stage, z.precision, z.offload_optimizer, z.offload_param) == (
        "deepspeed", 3, "fp16", "none", "none"
    )  # fmt: skip
    assert (c.nodes, c.gpus_per_node, c.gpu) == (4, 16, "V100-SXM2-32GB")
    assert (b.micro_batch, b.grad_accum, b.train_batch, b.seq_len) == (1, 1, 64, 512)
    assert (z.reduce_bucket_size, z.activation_checkpointing, z.overlap_comm, z.contiguous_gradients) == (
        10**7, True, True, True
    )  # fmt: skip
    assert (z.hpz_partition_size, z.quantized_weights, z.quantized_gradients) == (1, False, False)
    m = s.model
    assert (m.name, m.layers, m.hidden, m.heads, m.ffn, m.vocab, m.tied_embeddings) == (
        "megatron-gpt-18b", 40, 6144, 32, 24576, 50304, True
    )  # fmt: skip
    assert m.params == 18_434_813_952  # "~18B"
    # Megatron's GPTModel multiplies by the word embeddings' weight in its own forward
    assert m.head_weight_external and not R.spec_of("megatron-gpt-18b.json").head_weight_external
    a19 = R.express(MEMORY["A19"]).setup  # the same run with ZeRO++'s three flags
    assert (a19.zero.hpz_partition_size, a19.zero.quantized_weights, a19.zero.quantized_gradients) == (
        16,
        True,
        True,
    )
    off = {"hpz_partition_size": 1, "quantized_weights": False, "quantized_gradients": False}
    assert a19.zero.overlap_comm is None and a19.zero.overlap  # not given in its row: stage 3's default, on
    assert a19.replace(zero={**off, "overlap_comm": True}) == s


def test_megatrons_head_weight_stays_gathered_for_the_whole_step():
    """A18's word embeddings, an external parameter of Megatron's top module at ZeRO-3
    (``partition.external_head``): the tensor peak's gathered parameters hold them beside the layers in
    turn; the replayed step gathers them once, with the top module's forward, and frees them in the
    update's ``_partition_all_parameters`` (a module never releases an external parameter). A tied head of
    its own module is released after the embeddings' forward, gathered again for the head (held to the
    head's backward, its reuse within ``stage3_max_reuse_distance``) and for the embeddings' backward, as
    the allocator's trace of the kit's GPT with A18's shape showed on an H100 (rank 0 of 64 ranks)."""
    from kit.estimate import partition
    from kit.estimate.allocator import Alloc, Free, Mark
    from kit.estimate.deepspeed_events import GATHER, Step
    from kit.estimate.memory import batch_activations, states
    from kit.estimate.peak import _gathered

    s = R.express(MEMORY["A18"]).setup
    plain = s.replace(model=s.model.model_copy(update={"head_weight_external": False}))
    head = 6144 * 50304
    assert partition.external_head(s) == head and partition.external_head(plain) == 0
    assert partition.external_head(s.replace(zero={"stage": 2})) == 0

    def lifetimes(setup):
        """Per gather of the embeddings in the second step, the phases that begin while it is held."""
        events = Step(setup, states(setup).device, batch_activations(setup)).events()
        marks = [(i, e.name) for i, e in enumerate(events) if isinstance(e, Mark)]
        second = marks[3][0]  # step 2's forward
        born = {e.key: i for i, e in enumerate(events) if isinstance(e, Alloc) and e.stream == GATHER
                and e.size == 2 * head and i > second}  # fmt: skip
        out = []
        for i, e in enumerate(events):
            if isinstance(e, Free) and e.key in born:
                phases = [name for j, name in marks if born[e.key] < j < i]
                out.append(phases)
        return out

    assert lifetimes(s) == [["backward", "optimizer"]]
    assert lifetimes(plain) == [[], ["backward"], []]
    # the tensor peak's gathered parameters: beside the held embeddings the largest other tensor (an MLP
    # matrix) is the one in use; at the loss the head itself, with the prefetch only
    kept, fc, prefetch = partition.gathered_padded(s)[1], 6144 * 24576, partition.prefetch_call(s)
    assert prefetch == 6144 * 6144 + 6144 * 24576  # a call past the 50M bucket: the projection, then fc
    assert _gathered(s).bytes == 2 * (head + kept + fc + prefetch)
    after = partition.prefetch_call(s, after_head=True)  # the last fc alone: past the bucket
    assert after == 6144 * 24576
    assert _gathered(s, at_head=True).bytes == 2 * (head + kept + after)
    assert _gathered(plain).bytes == 2 * (kept + head + prefetch)  # the embedding the largest in use


def test_frameworks_gpus_and_batches_map_faithfully():
    setups = {i: R.express(MEMORY[i]) for i, reason in REASONS.items() if reason is None}
    zero = {i: (e.setup.zero.engine, e.setup.zero.stage, e.setup.zero.precision) for i, e in setups.items()}
    assert zero == {
        **dict.fromkeys(("A01", "A03", "A07", "A08", "A09"), ("fsdp", 3, "bf16")),  # torchtitan, FSDP2
        "A10": ("fsdp", 3, "bf16"),  # FSDP2 full shard
        "A18": ("deepspeed", 3, "fp16"),
        "A19": ("deepspeed", 3, "fp16"),
        "A20": ("deepspeed", 2, "fp16"),
        "A21": ("deepspeed", 1, "fp16"),
        "A22": ("deepspeed", 0, "fp16"),  # DeepSpeed with ZeRO disabled: its fp16 optimizer, stage 0
        "A23": ("deepspeed", 2, "fp16"),
        "A25": ("deepspeed", 2, "fp16"),  # HF Trainer --deepspeed, ZeRO-2 with CPU offload, one GPU
        "A27": ("deepspeed", 2, "fp16"),  # HF Trainer --deepspeed (finetune_trainer.py)
        "A28": ("deepspeed", 2, "fp16"),
        "A30": ("deepspeed", 2, "fp16"),  # Accelerate's DeepSpeed plugin
        "A32": ("deepspeed", 2, "fp16"),
        "A33": ("ddp", 0, "fp32"),  # PyTorch DDP, mixed_precision 'no'
    }
    a20 = setups["A20"].setup
    assert (a20.zero.offload_optimizer, a20.cluster.world_size, a20.batch.micro_batch, a20.batch.seq_len) == (
        "cpu", 1, 10, 1024
    )  # fmt: skip
    a23 = setups["A23"].setup
    assert (a23.zero.reduce_bucket_size, a23.zero.allgather_bucket_size, a23.zero.overlap_comm) == (
        5 * 10**8, 5 * 10**8, True
    )  # fmt: skip
    a10 = setups["A10"].setup
    assert (a10.model.name, a10.cluster.nodes, a10.cluster.gpus_per_node, a10.cluster.gpu) == (
        "llama-2-70b", 8, 8, "A100-SXM-80GB"
    )  # fmt: skip
    assert a10.zero.activation_checkpointing and a10.batch.seq_len == 4096
    a33 = setups["A33"]
    assert (a33.setup.model.name, a33.setup.cluster.gpu, a33.setup.batch.seq_len) == (
        "gpt2-large",
        "TITAN-RTX",
        128,
    )
    assert a33.notes == (
        "sequence length taken as 128 (the row says \"128? (blog text shows '--block_size 12')\")",
    )
    assert "V100-SXM3 32 GB taken as the V100-SXM2-32GB (the same memory)" in setups["A21"].notes
    # "128 src / 64 tgt (padded)": the encoder reads 128 tokens, the decoder learns 64 (Batch.target_len)
    a32 = setups["A32"]
    b32 = a32.setup.batch
    assert (b32.seq_len, b32.target_len, a32.setup.label) == (128, 64, "z2 fp16 mb200 tgt64")
    assert a32.notes == ("source 128 tokens (seq_len), target 64 (target_len)",)
    a25 = setups["A25"].setup  # t5-3b, frozen embeddings, ZeRO-2 offloading its optimizer on one RTX 3090
    assert (a25.model.name, a25.cluster.gpu, a25.zero.offload_optimizer, a25.zero.freeze_embeddings) == (
        "t5-3b", "RTX-3090", "cpu", True
    )  # fmt: skip
    a27 = setups["A27"]  # T5 with frozen shared embeddings; 128 tokens is finetune_trainer.py's maximum
    assert (a27.setup.model.name, a27.setup.zero.freeze_embeddings, a27.setup.batch.target_len) == (
        "t5-large", True, None
    )  # fmt: skip
    assert a27.notes[1].startswith("128 tokens is the script's maximum: the blog's finetune_trainer.py")
    assert "padding='longest'" in a27.notes[1] and setups["A28"].notes == a27.notes
    a30 = setups["A30"].setup  # the MNLI classifier: 128 tokens, one class of 3 per sample, no target length
    assert (a30.model.name, a30.batch.seq_len, a30.batch.target_len, a30.cluster.gpu) == (
        "deberta-v2-xlarge-mnli", 128, None, "TITAN-RTX"
    )  # fmt: skip
    why = setups["A30"].notes[-1]  # Accelerate's classification script: dynamic padding
    assert "run_cls_no_trainer.py" in why and "pad_to_max_length" in why
    # the scripts that pad each batch to its longest sample: their runs' lengths are only a maximum (the
    # same blog's seq2seq runs, A31 and A32, padded to the maximum)
    assert sorted(i for i, e in setups.items() if e.padded) == list(PADDED)
    # torchtitan's selective checkpointing: its op policy, or (A07) its layer option's default of 2
    policies = {i: (setups[i].setup.zero.checkpoint_policy, setups[i].setup.zero.checkpoint_every) for i in
                ("A01", "A03", "A07", "A08", "A09")}  # fmt: skip
    assert policies == {
        **dict.fromkeys(("A01", "A03", "A08", "A09"), ("selective-op", 1)),
        "A07": ("full", 2),
    }
    assert "activation checkpointing 'selective (layer)' taken as every 2nd block" in setups["A07"].notes[0]
    # Meta's 96 GB H100 (HBM2e, 500 W) has no datasheet: its max-reserved rows do not use the card's size
    for i in ("A01", "A03"):
        assert (
            setups[i].setup.cluster.gpu == "H100-SXM-80GB"
            and "the card's size is not used" in setups[i].notes[0]
        )
    for i, e in setups.items():  # the GPU named has the row's memory (GB as marketed, GiB in the table)
        if i in ("A01", "A03"):
            continue
        assert gpu(e.setup.cluster.gpu).memory_gib == pytest.approx(MEMORY[i]["gpu_mem_gb"], rel=0.02), i
        assert e.setup.batch.train_batch == MEMORY[i]["global_batch"], i


def test_model_files_are_the_rows_shapes_megatrons_with_the_vocabulary_padded():
    every = [*MEMORY.values(), *R.load("throughput")]
    for piece, source in R.MODELS:
        if not source.endswith(".json"):
            continue
        spec = R.spec_of(source)
        assert "_source" in json.loads((PUBLISHED / "models" / source).read_text())
        rows = [r for r in every if piece in r["model"]]
        assert rows, piece
        config = json.loads((PUBLISHED / "models" / source).read_text())
        for r in rows:
            layers = spec.layers  # an encoder-decoder row says "2 enc + 12 dec"
            if isinstance(r["layers"], str):
                names = (
                    ("num_layers", "num_decoder_layers")
                    if "num_layers" in config
                    else ("encoder_layers", "decoder_layers")
                )  # T5's names, else BART's
                layers = "{} enc + {} dec".format(*(config[k] for k in names))
            assert (layers, spec.hidden, spec.heads, spec.ffn or 4 * spec.hidden) == (
                r["layers"],
                r["hidden"],
                r["heads"],
                r["ffn"],
            )
            padded = -(-r["vocab"] // 128) * 128 if source.startswith("megatron") else r["vocab"]
            assert spec.vocab == padded and spec.tied_embeddings  # Megatron pads; MPT's vocab is padded


def test_numbers_are_the_estimates_own_beside_the_measured_bytes(report):
    a18 = by_id(report)["A18"]
    est = estimate(a18.setup)
    reserved = getattr(est, "reserved_bytes", None)
    allocated, max_reserved = a18.values
    # Megatron's report_memory prints MB of 1024 x 1024 bytes: 8284.7 max allocated, 18838.0 max reserved
    assert (allocated.quantity, allocated.measured_bytes) == ("max_allocated", round(8284.7 * MIB))
    assert (max_reserved.quantity, max_reserved.measured_bytes) == ("max_reserved", round(18838.0 * MIB))
    assert (allocated.predicted_bytes, allocated.predicted_as) == (est.peak_tensor_bytes, "peak_tensor_bytes")
    assert (max_reserved.predicted_bytes, max_reserved.predicted_as) == (
        (reserved, "reserved_bytes")
        if reserved is not None
        else (est.peak_per_gpu_bytes, "peak_per_gpu_bytes")
    )
    assert allocated.error == est.peak_tensor_bytes / round(8284.7 * MIB) - 1


def test_fit_rows_ask_the_fit_rule_at_the_published_micro_batch(report):
    comparisons = by_id(report)
    checked = {i: c for i, c in comparisons.items() if c.checks}
    assert sorted(checked) == [
        "A07",
        "A08",
        "A09",
        "A10",
        "A20",
        "A21",
        "A22",
        "A23",
        "A25",
        "A27",
        "A28",
        "A30",
        "A32",
        "A33",
    ]
    expected = {"A10": "fits", "A20": "fits", "A21": "fits", "A22": "OOM", "A23": "fits", "A33": "fits"}
    expected |= {"A30": "fits", "A32": "fits"}  # Accelerate's largest micro batches (DeBERTa, BlenderBot)
    expected |= {"A27": "fits", "A28": "fits"}  # finetune_trainer.py's largest (t5-large, frozen embeddings)
    expected |= {"A07": "OOM", "A08": "OOM", "A09": "fits"}  # torchtitan's selective checkpointing
    expected |= {"A25": ("fits", "OOM")}  # t5-3b on one RTX 3090: fits at 20, OOM at 30
    for i, c in checked.items():
        outcomes = expected[i] if isinstance(expected[i], tuple) else (expected[i],)
        assert len(c.checks) == len(outcomes), i
        for check, outcome in zip(c.checks, outcomes, strict=True):
            est = estimate(c.setup.replace(batch={"micro_batch": check.micro_batch}))
            verdict = estimate_fit(est)
            assert (check.measured, check.predicted) == (outcome, "fits" if verdict.ok else "OOM"), i
            need = verdict.need if verdict.ok else est.per_gpu_bytes  # within the memory, flushes counted
            assert (check.predicted_bytes, check.capacity_bytes) == (need, verdict.capacity)
        if i in PADDED:  # the lengths the run saw are not published: the kit's longest instead
            assert c.largest_micro_batch is None
            continue
        assert c.agrees == all(check.measured == check.predicted for check in c.checks)
        largest = c.largest_micro_batch  # it fits (0: none does), one more does not
        assert largest == 0 or estimate_fit(estimate(c.setup.replace(batch={"micro_batch": largest}))).ok
        assert not estimate_fit(estimate(c.setup.replace(batch={"micro_batch": largest + 1}))).ok
    # DeepSpeed stage 0 in fp16 (FP16_Optimizer): the step's fp32 copies do not fit a V100 at micro batch 1
    assert checked["A22"].largest_micro_batch == 0 and checked["A22"].agrees
    assert checked["A33"].checks[0].largest and not checked["A10"].checks[0].largest  # "fits at BS=7 (max)"
    # a reading shown, not compared: nvidia-smi's MiB, PyTorch's GiB at the OOM
    assert checked["A20"].measured_bytes == 32290 * MIB and checked["A22"].measured_bytes == round(
        29.09 * GIB
    )


def test_a_padded_run_is_checked_against_the_longest_sequence_the_kit_fits(report):
    """A run that padded each batch to its longest sample saw batches of at most its script's maximum: where
    it fit and the kit says OOM there, the check is open, with the longest sequence (a multiple of 8) at
    which the kit fits its micro batch; one that ran out of memory where the kit says OOM at the maximum
    agrees. The lengths the runs saw are not published, so an open check is neither."""
    comparisons = by_id(report)
    assert report.summary()["fit"]["open"] == list(PADDED) and report.summary()["fit"]["disagree"] == []
    bounds = {}
    for i in PADDED:
        c = comparisons[i]
        assert c.verdict == "open" and c.agrees is None and c.largest_micro_batch is None
        for k in c.checks:
            at = c.setup.replace(batch={"micro_batch": k.micro_batch})
            if k.measured == "OOM":  # A25 at 30: OOM at the maximum, as the run ran out of memory
                assert (k.predicted, k.verdict, k.agrees, k.longest_fitting) == ("OOM", "agrees", True, None)
                continue
            assert (k.predicted, k.verdict, k.agrees) == ("OOM", "open", None)
            n = k.longest_fitting
            assert n % 8 == 0 and 0 < n < 128
            assert estimate_fit(estimate(at.replace(batch={"seq_len": n}))).ok
            assert not estimate_fit(estimate(at.replace(batch={"seq_len": n + 8}))).ok
            note = f"micro batch {k.micro_batch}: the kit fits it up to {n} tokens, not at 128"
            assert note in " ".join(c.notes)
            bounds[i, k.micro_batch] = n
    assert bounds == {("A25", 20): 64, ("A27", 40): 80, ("A28", 50): 80, ("A30", 40): 96}
    # a fit row of known lengths: agrees or not, never open
    assert {comparisons[i].verdict for i in ("A07", "A10", "A22", "A32", "A33")} == {"agrees"}


def test_step_time_rows_are_converted_as_their_source_measured_them(report):
    rows = {c.id: c for c in report.comparisons if c.row["table"] == "throughput"}
    assert {c.kind for c in rows.values()} == {"step_time"}
    timed = {i: c.timings[0] for i, c in rows.items() if c.timings}
    assert len(timed) == 27 and all(len(c.timings) == 1 for c in rows.values() if c.expressed)
    # samples/s of the whole job: the global batch over the value (B04: 16 / 40.1749)
    assert timed["B04"].measured_s == pytest.approx(16 / 40.1749)
    assert timed["B09"].measured_s == pytest.approx(9.9559)  # ms per iteration
    assert timed["B17"].measured_s == pytest.approx(6 * 2048 * 2 / 4641)  # tokens/s per GPU
    b14 = rows["B14"]  # Megatron's TFLOP/s: 96 B s l h^2 (1 + s/6h + V/16lh) over the GPUs, / the value
    flops = 96 * 32 * 256 * 512 * 96 * 12288**2 * (1 + 512 / (6 * 12288) + 50257 / (16 * 96 * 12288)) / 256
    assert timed["B14"].measured_s == pytest.approx(flops / 204.49e12)
    assert b14.setup.zero.param_persistence_threshold == 100_000 and b14.setup.zero.reduce_bucket_size == 9e7
    for t in timed.values():  # the prediction in the row's own metric: a rate scales inversely
        assert t.predicted_value / t.measured_value == pytest.approx(
            t.predicted_s / t.measured_s if t.unit.startswith("ms") else t.measured_s / t.predicted_s
        )
        assert t.error == pytest.approx(t.predicted_s / t.measured_s - 1)
    # the fabric from the row's text, or its DGX's, said in its notes
    assert timed["B14"].fabric == "ib-hdr-8x200" and timed["B22"].fabric == "roce-8x200"
    assert timed["B26"].fabric == "ib-ndr-8x400"  # no network named: its DGX's
    assert "inter-node network not stated: taken as the DGX's ib-ndr-8x400" in rows["B26"].notes
    # the ZeRO and ZeRO++ tutorials' cluster (the DeepSpeed team's V100-SXM3s, at 100 Gb/s per node)
    assert timed["B09"].fabric == timed["B10"].fabric == timed["B13"].fabric == "ib-edr-1x100"
    for i in ("B09", "B13"):
        assert any(
            n.startswith("inter-node network not stated: taken as ib-edr-1x100, the DeepSpeed team's")
            for n in rows[i].notes
        )
    assert timed["B04"].fabric is None and rows["B05"].setup.zero.stage == 2
    assert rows["B07"].reason == "tensor and pipeline parallelism (TP=4, PP=12)"
    assert (rows["B28"].reason, rows["B31"].reason) == ("torch.compile", "Float8 linears")
    assert rows["B17"].expressed and any("FSDP1 taken as FSDP2" in n for n in rows["B17"].notes)
    # torchtitan's op policy (B32); on Meta's 500 W H100 a step time would rest on figures nobody published
    assert rows["B32"].setup.zero.checkpoint_policy == "selective-op"
    assert rows["B27"].reason == "GPU H100 SXM (HBM2e, 500W) 96 GB is not in data/gpus.csv"


def test_step_time_summary_and_stage_order(report):
    step = report.summary()["step_time"]
    errors = sorted(abs(t.error) for c in report.comparisons for t in c.timings)
    assert step["rows"] == len(errors) == 27
    assert step["median_abs_error"] == pytest.approx(errors[13])
    assert step["within_2x"] == sum(
        0.5 <= t.predicted_s / t.measured_s <= 2 for c in report.comparisons for t in c.timings
    )
    sets = {tuple(g["ids"]): g for g in step["stage_sets"]}
    assert set(sets) == {("B04", "B05", "B06"), ("B09", "B10")}
    assert sets[("B04", "B05", "B06")]["measured"] == ["B04", "B05", "B06"]  # ZeRO-3 slowest
    assert sets[("B09", "B10")]["measured"] == ["B10", "B09"]  # ZeRO++ faster than ZeRO-3
    assert all(g["agrees"] == (g["measured"] == g["predicted"]) for g in sets.values())


def test_cli_json_is_one_object_whose_counts_add_up(capsys):
    assert main(["published", "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    data = json.loads(out)
    assert set(data) == {"rows", "summary", "reference"} and len(data["rows"]) == 68
    rows, summary = data["rows"], data["summary"]
    for table, n in (("memory", 32), ("throughput", 36)):
        mine = [r for r in rows if r["table"] == table]
        assert summary["tables"][table] == {"rows": n, "expressed": sum(r["reason"] is None for r in mine)}
    assert summary["tables"]["memory"]["expressed"] == 18
    for quantity, q in summary["quantities"].items():
        values = [v for r in rows for v in r["values"] if v["quantity"] == quantity]
        assert q["rows"] == len(values) == {"max_allocated": 2, "max_reserved": 4}[quantity]
        assert max(abs(v["error"]) for v in values) == abs(q["worst_error"])
    checked = [r for r in rows if r["checks"]]
    assert summary["fit"] == {
        "rows": 14,
        "agree": sum(r["verdict"] == "agrees" for r in checked),
        "disagree": [r["id"] for r in checked if r["verdict"] == "disagrees"],
        "open": [r["id"] for r in checked if r["verdict"] == "open"],
    }
    assert all(r["agrees"] is None for r in checked if r["verdict"] == "open")
    a18 = next(r for r in rows if r["id"] == "A18")
    assert a18["setup"]["zero"]["stage"] == 3 and a18["label"].startswith(
        "megatron-gpt-18b: z3 fp16 mb1 ckpt"
    )
    assert next(r for r in rows if r["id"] == "A37")["setup"] is None


def test_cli_selects_rows_and_prints_the_table_and_summary(capsys):
    assert main(["published", "--table", "memory", "--id", "A18", "A37", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in data["rows"]] == ["A18", "A37"]
    assert data["summary"]["tables"] == {"memory": {"rows": 2, "expressed": 1}}
    assert main(["published", "--table", "memory"]) == 0
    out = capsys.readouterr().out
    a18 = next(c for c in P.report("memory", ["A18"]).comparisons)
    error = f"{100 * a18.values[0].error:+.1f} %"
    assert f"{a18.values[0].measured_bytes / GIB:.2f} GiB" in out and error in out
    assert "\nsummary:\n  memory: 18 of 32 rows expressed\n" in out
    assert "  max allocated: 2 row(s), median |error| " in out and "fit / OOM: " in out
    assert "\ncannot express yet:\n  A02  torch.compile\n" in out
    assert "  A37  tensor parallelism (TP=8)\n" in out and "B01" not in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--id", "A18", "Z99"], "--id: no row Z99 in table all; choose from A01-A10, A18-A39, B01-B36"),
        (
            ["--table", "memory", "--id", "B01"],
            "--id: no row B01 in table memory; choose from A01-A10, A18-A39",
        ),
        (["--table", "speed"], "--table: choose one of all, memory, throughput, reference, got 'speed'"),
    ],
)
def test_cli_refuses_bad_input_in_one_line(capsys, argv, message):
    assert main(["published", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"zerokit published: {message}\n"


def test_published_memory_rows_import_no_torch():
    """Estimation only; the throughput rows' MPT models, and the memory rows of DeBERTa, BlenderBot and T5
    (A25-A28, A30, A32) are counted by transformers on the meta device and traced: the others need no
    torch."""
    code = (
        "import sys; from kit.accuracy import published; T5 = ('A25', 'A26', 'A27', 'A28'); "
        "published.report('memory', [i for i in published.ids('memory') if i not in T5 + ('A30', 'A32')]); "
        "print(sorted(m for m in ('torch', 'deepspeed', 'transformers') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert done.stdout.strip() == "[]"
