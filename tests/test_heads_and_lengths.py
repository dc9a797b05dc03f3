"""Encoder-decoder models and heads (issue 41, item 5): the head a config's ``architectures`` names is the
one counted, fed and traced; an encoder-decoder's source and target lengths apart (``Batch.target_len``);
no position limit where a model has no table of positions; DeBERTa-v2 traced, equal to what autograd
saves in a real forward on CPU; the published rows this expresses."""

import json

import pytest
import torch
import transformers
from pydantic import ValidationError

from kit import hf_models, models, trainable, workloads
from kit.accuracy import published_rows as R
from kit.accuracy.published_reasons import feature_reason
from kit.cli import main
from kit.estimate import estimate, trace
from kit.fit import estimate_fit
from kit.paths import PUBLISHED
from kit.schema import Setup, one_line_error

#: a small DeBERTa-v2 MNLI-style classifier: relative attention in log buckets, 3 labels
DEBERTA = {
    "model_type": "deberta-v2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "intermediate_size": 128, "vocab_size": 1000, "max_position_embeddings": 128,
    "relative_attention": True, "position_buckets": 32, "pos_att_type": ["p2c", "c2p"],
    "share_att_key": True, "norm_rel_ebd": "layer_norm", "position_biased_input": False,
    "type_vocab_size": 0, "architectures": ["DebertaV2ForSequenceClassification"],
    "id2label": {"0": "CONTRADICTION", "1": "NEUTRAL", "2": "ENTAILMENT"},
}  # fmt: skip
BART = {
    "model_type": "bart", "d_model": 64, "encoder_layers": 2, "decoder_layers": 2,
    "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128, "vocab_size": 256,
    "max_position_embeddings": 128, "architectures": ["BartForConditionalGeneration"],
}  # fmt: skip
#: T5's relative-position buckets: its n_positions limits nothing
T5 = {
    "model_type": "t5", "d_model": 64, "d_ff": 128, "num_layers": 2, "num_heads": 4, "d_kv": 16,
    "vocab_size": 256, "n_positions": 512, "decoder_start_token_id": 0, "pad_token_id": 0,
}  # fmt: skip


def meta_params(cls: str, cfg: dict) -> tuple[int, int]:
    """(parameters, largest layer) of transformers' own ``cls`` built on meta: each tensor once (a tied
    weight once), the largest ``parameters(recurse=False)`` of one module, as the kit counts."""
    config = hf_models.config({k: v for k, v in cfg.items() if not k.startswith("_")})
    with torch.device("meta"):
        model = getattr(transformers, cls)(config)
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return sum(p.numel() for p in model.parameters()), largest


def real_saved(spec, micro: int, seq: int, target_len: int | None = None) -> int:
    """Bytes of every distinct storage ``saved_tensors_hooks`` sees in one real fp32 forward on CPU of the
    workload's own micro batch, parameters excluded (as tests/test_activations.py counts)."""
    workload = workloads.for_model(spec)
    torch.manual_seed(0)
    model = workload.build().train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params and t.numel():
            seen.setdefault(storage.data_ptr(), storage.nbytes())
        return t

    decoder = {"target_len": target_len} if target_len else {}
    args, kwargs = workload.micro_batch(list(range(micro)), seq, 0, **decoder)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        workload.loss(model(*args, **kwargs))
    return sum(seen.values())


def test_the_head_architectures_names_is_the_one_counted():
    spec = models.from_hf_config(DEBERTA, name="tiny-deberta")
    assert (spec.params, spec.largest_layer_params) == meta_params(
        "DebertaV2ForSequenceClassification", DEBERTA
    )
    assert hf_models.task(hf_models.config(json.loads(spec.arch))) == "sequence-classification"
    # without architectures (or naming a head the kit has no workload for) the model type decides, as before
    for named in ((), ("DebertaV2ForTokenClassification",)):
        plain = models.from_hf_config({**DEBERTA, "architectures": list(named)}, name="tiny-deberta")
        assert (plain.params, plain.largest_layer_params) == meta_params("DebertaV2ForMaskedLM", DEBERTA)
        assert "architectures" not in json.loads(plain.arch)
    # a head that the model type builds anyway leaves the arch (and so config ids) as it was
    bart = models.from_hf_config(BART, name="tiny-bart")
    assert bart.arch == models.from_hf_config({**BART, "architectures": None}, name="tiny-bart").arch
    assert bart.params == meta_params("BartForConditionalGeneration", BART)[0]
    # the published configs: DeBERTa-v2-xlarge-mnli's classifier and BlenderBot-400M-distill, counted as built
    for source, cls in (
        ("deberta-v2-xlarge-mnli.json", "DebertaV2ForSequenceClassification"),
        ("blenderbot-400m-distill.json", "BlenderbotForConditionalGeneration"),
    ):
        cfg = json.loads((PUBLISHED / "models" / source).read_text())
        spec = R.spec_of(source)
        assert (spec.params, spec.largest_layer_params) == meta_params(cls, cfg), source
    published = [
        R.spec_of(f"{name}.json").params for name in ("deberta-v2-xlarge-mnli", "blenderbot-400m-distill")
    ]
    assert published == [879_876_099, 364_802_560]  # the rows' "900M" and "365M"


def test_the_workload_feeds_a_classifier_classes_and_a_seq2seq_its_target_length():
    classifier = workloads.for_model(models.from_hf_config(DEBERTA, name="tiny-deberta"))
    (), batch = classifier.micro_batch([0, 1, 2, 3], 16, seed=5)
    assert set(batch) == {"input_ids", "labels"}
    assert batch["input_ids"].shape == (4, 16) and batch["labels"].shape == (4,)
    assert batch["labels"].dtype == torch.int64 and 0 <= batch["labels"].min() <= batch["labels"].max() < 3
    (), again = classifier.micro_batch([2, 3], 16, seed=5)  # a sample's class depends on its index only
    assert torch.equal(again["labels"], batch["labels"][2:]) and torch.equal(
        again["input_ids"], batch["input_ids"][2:]
    )
    with pytest.raises(ValueError, match="^batch.target_len: only a seq-to-seq model"):
        classifier.micro_batch([0], 16, target_len=8)
    seq2seq = workloads.for_model(models.from_hf_config(BART, name="tiny-bart"))
    (), same = seq2seq.micro_batch([0, 1], 32)
    assert same["labels"] is same["input_ids"] and same["input_ids"].shape == (2, 32)  # as before
    for target in (8, 32, 48):
        (), split = seq2seq.micro_batch([0, 1], 32, target_len=target)
        assert split["input_ids"].shape == (2, 32) and split["labels"].shape == (2, target)
        assert torch.equal(split["input_ids"], same["input_ids"])  # the sample's stream, its first tokens
        shared = min(target, 32)
        assert torch.equal(split["labels"][:, :shared], same["input_ids"][:, :shared])


def test_only_an_encoder_decoder_takes_a_target_length():
    bart = models.from_hf_config(BART, name="tiny-bart")
    setup = Setup(model=bart, batch={"micro_batch": 4, "seq_len": 128, "target_len": 64})
    assert (setup.batch.seq_len, setup.batch.target_len, setup.label) == (128, 64, "z2 bf16 mb4 tgt64")
    assert setup.tokens_per_step == setup.batch.train_batch * 128  # source tokens, as for every model
    moved = setup.replace(zero={"stage": 3}, batch={"micro_batch": 2})
    assert (moved.batch.target_len, moved.label) == (64, "z3 bf16 mb2 tgt64")
    assert Setup(model=bart, batch={"seq_len": 64}).label == "z2 bf16 mb1"  # no target length: as before
    refusals = {
        (
            models.preset("llama-2-7b"),
            64,
        ): "batch.target_len: only an encoder-decoder model (t5, bart...) has "
        "decoder tokens of their own, not llama-2-7b (model_type llama): drop target_len",
        (bart, 129): "batch.target_len: must be <= the model's max_seq_len (128), got 129",
        (bart, 0): "batch.target_len: must be a whole number in [1, 1,048,576], got 0",
    }
    for (model, target), message in refusals.items():
        with pytest.raises(ValidationError) as refused:
            Setup(model=model, batch={"seq_len": 64, "target_len": target})
        assert one_line_error(refused.value) == message


def test_no_position_limit_where_the_model_has_no_table_of_positions():
    t5 = models.from_hf_config(T5, name="tiny-t5")
    assert t5.max_seq_len is None  # relative buckets: n_positions 512 limits nothing
    long = Setup(model=t5, batch={"micro_batch": 1, "seq_len": 1024, "target_len": 2048})
    assert (long.batch.seq_len, long.batch.target_len) == (1024, 2048)
    assert models.from_hf_config(BART, name="tiny-bart").max_seq_len == 128  # a learned table of 128 (+2)
    # DeBERTa-v2: its 2 x 32 relative buckets are no table of positions; position_biased_input adds one
    assert models.from_hf_config({**DEBERTA, "position_buckets": 64}, name="d").max_seq_len is None
    assert models.from_hf_config({**DEBERTA, "position_biased_input": True}, name="d").max_seq_len == 128
    with pytest.raises(
        ValidationError, match="seq_len: must be <= the model's max_seq_len \\(128\\), got 129"
    ):
        Setup(model=models.from_hf_config(BART, name="tiny-bart"), batch={"seq_len": 129})


def test_the_trace_follows_the_target_length_and_equals_a_real_forward():
    bart = models.from_hf_config(BART, name="tiny-bart")
    saved = {
        t: trace.traced(
            Setup(model=bart, batch={"micro_batch": 2, "seq_len": 64, "target_len": t})
        ).saved_bytes
        for t in (16, 64, 128)
    }
    assert saved[16] < saved[64] < saved[128]
    setup = Setup(model=bart, batch={"micro_batch": 2, "seq_len": 64, "target_len": 16})
    assert trace.traced(setup) is trace.trace(bart, 2, 64, "bf16", trainable.key(setup.zero), 16)  # cached
    assert "b=2, s=64, target 16" in estimate(setup).terms["activations"].formula
    # T5 (relative positions, no masks): the trace is what autograd saves, to the byte, either way
    t5 = models.from_hf_config(T5, name="tiny-t5")
    for target in (None, 16, 48):
        assert trace.trace(t5, 3, 32, "fp32", (), target).saved_bytes == real_saved(t5, 3, 32, target), target


def test_deberta_v2_traces_and_equals_what_autograd_saves():
    """DeBERTa-v2 looks at its token ids (transformers' padding check) and its classifier at its labels
    (``(labels >= 0).nonzero()``): ops on real ids run for real in the trace, so both run as they would."""
    spec = models.from_hf_config(DEBERTA, name="tiny-deberta")
    for micro, seq in ((2, 64), (3, 96)):
        traced = trace.trace(spec, micro, seq, "fp32")
        assert 0 < traced.checkpointed_bytes < traced.saved_bytes == real_saved(spec, micro, seq)
    setup = Setup(model=spec, batch={"micro_batch": 8, "seq_len": 128})
    assert estimate(setup).components["activations"] == trace.traced(setup).saved_bytes > 0


def test_the_cli_takes_a_target_length(tmp_path, capsys):
    path = tmp_path / "bart.json"
    path.write_text(json.dumps(BART))
    argv = ["estimate", "--model", str(path), "--seq-len", "64", "--target-len", "16", "--gpus-per-node", "1"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["setup"]["batch"]["seq_len"], out["setup"]["batch"]["target_len"]) == (64, 16)
    assert main(argv) == 0 and "seq 64   target 16   " in capsys.readouterr().out
    assert main(["estimate", "--model", "llama-2-7b", "--target-len", "16", "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "batch.target_len: only an encoder-decoder model" in err
    # plan's launch-cmd line gives the same lengths back
    plan = ["plan", "--model", str(path), "--seq-len", "64", "--target-len", "16", "--gpus", "A10G"]
    assert main(plan) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "--seq-len 64 --target-len 16" in next(x for x in lines if x.startswith("ds_config: zerokit"))


def test_the_published_deberta_and_blenderbot_rows_are_expressed():
    """Their head and their lengths no longer keep them out (A29 and A31 trained under PyTorch DDP with fp16
    autocast, which the kit's DDP does not model: tests/test_published.py); "fits at BS=N (max)" is checked
    as the fit rule at N on the row's 24 GB TITAN RTX."""
    rows = {r["id"]: r for r in R.load("memory")}
    assert [feature_reason(rows[i]) for i in ("A29", "A30", "A31", "A32")] == [None] * 4
    a30, a32 = R.express(rows["A30"]).setup, R.express(rows["A32"]).setup
    assert (a30.model.name, a30.batch.micro_batch, a30.batch.seq_len, a30.batch.target_len) == (
        "deberta-v2-xlarge-mnli", 40, 128, None
    )  # fmt: skip
    assert (a32.model.name, a32.batch.micro_batch, a32.batch.seq_len, a32.batch.target_len) == (
        "blenderbot-400m-distill", 200, 128, 64
    )  # fmt: skip
    for setup in (a30, a32):
        assert setup.cluster.gpu == "TITAN-RTX" and estimate_fit(estimate(setup)).capacity > 20 * 2**30
        assert estimate(setup).components["activations"] == trace.traced(setup).saved_bytes > 0
