"""Model specs: counts equal the real architectures, built on the meta device (nothing allocated)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kit import models
from kit.paths import MODELS
from kit.workloads import toymodels

REPO = Path(__file__).resolve().parent.parent

REQUIRED_PRESETS = [
    "gpt2",
    "gpt2-medium",
    "gpt2-large",
    "gpt2-xl",
    "llama-2-7b",
    "llama-2-13b",
    "llama-2-70b",
    "llama-3-8b",
    "llama-3-70b",
    "mistral-7b",
    "qwen2.5-0.5b",
    "pythia-1b",
    "dit-1.5b",
]
HF_PRESETS = [name for name in REQUIRED_PRESETS if not name.startswith("dit")]


def hf_model(config: dict) -> torch.nn.Module:
    """The Hugging Face causal LM of a config dict, on the meta device (a 70B builds in ~0.1 s)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs = {k: v for k, v in config.items() if k != "model_type"}
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.for_model(config["model_type"], **kwargs))


def numels(module: torch.nn.Module) -> list[int]:
    return [p.numel() for p in module.parameters()]


def test_required_presets_are_shipped():
    assert set(REQUIRED_PRESETS) <= set(models.preset_names())


@pytest.mark.parametrize("name", HF_PRESETS)
def test_preset_counts_equal_the_hf_model(name):
    """Full-size models on meta: params, largest layer, every tensor (module order) and the shape."""
    spec = models.preset(name)
    model = hf_model(json.loads((MODELS / f"{name}.json").read_text()))
    counted = models.from_module(model, name=name)
    assert (spec.params, spec.largest_layer_params) == (counted.params, counted.largest_layer_params)
    assert models.tensor_numels(spec) == numels(model)
    assert counted == spec  # shape read back from model.config, counts from the module


def test_preset_counts_match_published_figures():
    """Exact totals commonly reported for the released checkpoints (tied embeddings once: gpt2, qwen2.5)."""
    published = {
        "gpt2": 124_439_808,
        "llama-2-7b": 6_738_415_616,
        "llama-3-8b": 8_030_261_248,
        "mistral-7b": 7_241_732_096,
        "qwen2.5-0.5b": 494_032_768,
        "pythia-1b": 1_011_781_632,
    }
    assert {name: models.preset(name).params for name in published} == published


def test_largest_layer_examples():
    # llama-2-7b: embed_tokens / lm_head 32,000 x 4,096; dit-1.5b: adaLN Linear(1536, 6*1536) + bias.
    assert models.preset("llama-2-7b").largest_layer_params == 32_000 * 4_096
    assert models.preset("dit-1.5b").largest_layer_params == 1536 * 9216 + 9216


def test_tied_embeddings_counted_once():
    tied, untied = models.preset("qwen2.5-0.5b"), models.preset("llama-2-7b")
    assert tied.tied_embeddings and not untied.tied_embeddings
    cfg = json.loads((MODELS / "qwen2.5-0.5b.json").read_text())
    unshared = models.from_hf_config({**cfg, "tie_word_embeddings": False})
    assert unshared.params - tied.params == 151_936 * 896
    assert unshared.largest_layer_params == tied.largest_layer_params == 151_936 * 896


def small(model_type: str, **changes) -> dict:
    """A 2-layer config of the family that builds in milliseconds."""
    if model_type == "gpt2":
        base = {"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 300, "n_positions": 128}
    else:
        base = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 160}
        base.update(vocab_size=300, max_position_embeddings=128)
    return {"model_type": model_type, **base, **changes}


# Variants the presets do not exercise.
VARIANTS = {
    "llama-biases-tied": small(
        "llama", num_key_value_heads=2, attention_bias=True, mlp_bias=True, tie_word_embeddings=True
    ),
    "mistral-head-dim": small("mistral", num_key_value_heads=2, head_dim=32),  # Mistral-NeMo style: != 64 / 4
    "qwen2-untied": small("qwen2", num_attention_heads=8, num_key_value_heads=2),
    "gpt_neox-no-attention-bias": small("gpt_neox", attention_bias=False),
    "gpt_neox-tied": small("gpt_neox", tie_word_embeddings=True),
    "gpt2-n-inner-untied": small("gpt2", n_inner=100, tie_word_embeddings=False),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_config_variants_equal_the_hf_model(variant):
    cfg = VARIANTS[variant]
    spec, model = models.from_hf_config(cfg), hf_model(cfg)
    counted = models.from_module(model)
    assert (spec.params, spec.largest_layer_params) == (counted.params, counted.largest_layer_params)
    assert models.tensor_numels(spec) == numels(model)


def test_tensor_numels_follow_the_spec_not_the_process():
    """A spec re-validated from JSON in a fresh process (as a rank does) gives the same tensor list;
    without ``arch``, presets and toy models derive theirs from the shape, while a model with biases a
    shape does not record gets None instead of a wrong list."""
    specs = [models.preset(name) for name in models.preset_names()]
    specs += [models.toy_spec("gpt2"), models.toy_spec("dit")]
    biased = models.from_hf_config(VARIANTS["llama-biases-tied"])
    code = (
        "import json, sys; from kit.models import tensor_numels; from kit.schema import ModelSpec; "
        "print(json.dumps([tensor_numels(ModelSpec.model_validate_json(s)) for s in json.load(sys.stdin)]))"
    )
    dumped = json.dumps([spec.model_dump_json() for spec in [*specs, biased]])
    fresh = subprocess.run(
        [sys.executable, "-c", code], input=dumped, capture_output=True, text=True, check=True, cwd=REPO
    )
    assert json.loads(fresh.stdout) == [models.tensor_numels(spec) for spec in [*specs, biased]]
    assert models.tensor_numels(biased) == numels(hf_model(VARIANTS["llama-biases-tied"]))
    shape_only = [spec.model_copy(update={"arch": None}) for spec in specs]
    assert [models.tensor_numels(spec) for spec in shape_only] == [models.tensor_numels(s) for s in specs]
    assert models.tensor_numels(biased.model_copy(update={"arch": None})) is None


def test_dit_preset_equals_the_toy_dit_on_meta():
    spec = models.preset("dit-1.5b")
    with torch.device("meta"):
        model = toymodels.build(spec)
    assert models.from_module(lambda: toymodels.build(spec)) == spec
    assert models.tensor_numels(spec) == numels(model)
    assert spec.params == 1_538_743_328  # the "~1.5B" DiT
    assert spec.max_seq_len == (32 // 2) ** 2


def test_dit_xl_2_matches_the_published_count():
    """DiT-XL/2 has 675,129,632 parameters (facebookresearch/DiT train.py log) including its frozen
    256 x 1152 sin-cos position table, which kit keeps as a buffer."""
    cfg = {"model_type": "dit", "hidden_size": 1152, "depth": 28, "num_heads": 16}
    spec = models.from_hf_config({**cfg, "input_size": 32, "num_classes": 1000})
    assert spec.params + 256 * 1152 == 675_129_632
    assert len(models.tensor_numels(spec)) + 1 == 292


@pytest.mark.parametrize("family", ["gpt2", "dit"])
def test_toy_spec_equals_the_module_counted_on_meta(family):
    spec = models.toy_spec(family, layers=3, hidden=32, heads=2, vocab=100, seq_len=16)
    assert models.from_module(lambda: toymodels.build(spec)) == spec
    assert models.tensor_numels(spec) == numels(toymodels.build(spec))
    assert (spec.layers, spec.hidden, spec.heads, spec.vocab, spec.max_seq_len) == (3, 32, 2, 100, 16)


def test_toy_gpt_is_hf_gpt2():
    """Same state dict keys and shapes as GPT2LMHeadModel, same logits and loss (eager attention)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    spec = models.toy_spec()
    toy = toymodels.build(spec)
    hf = GPT2LMHeadModel(GPT2Config(**models.config_of(spec), attn_implementation="eager")).eval()
    hf.load_state_dict(toy.state_dict(), strict=True)
    ids = torch.randint(0, spec.vocab, (2, spec.max_seq_len))
    torch.testing.assert_close(toy(ids), hf(ids).logits, atol=1e-5, rtol=1e-5)
    loss = toy(ids[:, :-1], ids[:, 1:])
    torch.testing.assert_close(loss, hf(ids, labels=ids).loss, atol=1e-5, rtol=1e-5)
    loss.backward()
    assert toy.lm_head.weight is toy.transformer.wte.weight and toy.lm_head.weight.grad is not None


def test_toy_dit_forward_and_loss():
    torch.manual_seed(0)
    spec = models.toy_spec("dit")  # 64 tokens: 16x16x4 latents in 2x2 patches, 512 classes
    model = toymodels.build(spec)
    x, t, y = torch.randn(2, 4, 16, 16), torch.tensor([3, 900]), torch.tensor([0, 511])
    out = model(x, t, y)
    assert out.shape == (2, 8, 16, 16)  # learn_sigma: mean and variance channels
    target = torch.randn_like(out)
    loss = model(x, t, y, target)
    torch.testing.assert_close(loss, ((out - target) ** 2).mean())
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_from_module_counts_shared_weights_once():
    tied = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    tied[1].weight = tied[0].weight
    spec = models.from_module(tied, name="tied")
    assert (spec.name, spec.params, spec.largest_layer_params, spec.family) == ("tied", 40, 40, None)
    assert models.tensor_numels(spec) is None


def test_from_count():
    assert models.from_count(1000, 300).model_dump(include={"params", "largest_layer_params"}) == {
        "params": 1000,
        "largest_layer_params": 300,
    }
    # Heuristic: h = round((128 * 7e9 / 12) ** (1/3)) = 4211, largest = 128,256 * 4211 = 540,086,016.
    assert models.from_count(7_000_000_000).largest_layer_params == 540_086_016
    assert models.from_count(1_000_000).largest_layer_params == 1_000_000  # capped at params
    assert models.tensor_numels(models.from_count(1000)) is None


def test_dims_fill_the_configs_defaults_once():
    assert tuple(models.resolve("llama-3-8b").dims) == (32, 4096, 32, 8, 14336, 128256)
    gpt2 = models.resolve("gpt2")  # no n_inner in GPT-2's config: 4 x hidden
    assert (gpt2.dims.kv_heads, gpt2.dims.ffn) == (12, 3072)
    with pytest.raises(ValueError, match="model custom: layers, hidden and heads are unknown"):
        _ = models.from_count(1000).dims


def test_resolve_preset_path_and_folder(tmp_path):
    assert models.resolve("mistral-7b") == models.preset("mistral-7b")
    folder = tmp_path / "my-llama"
    folder.mkdir()
    (folder / "config.json").write_text((MODELS / "llama-3-8b.json").read_text())
    by_file, by_folder = models.resolve(str(folder / "config.json")), models.resolve(str(folder))
    assert by_file == by_folder
    assert by_file.name == "my-llama"
    assert by_file.params == models.preset("llama-3-8b").params


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: models.preset("llama-9"), "model: unknown preset 'llama-9'; choose one of dit-1.5b, gpt2"),
        (lambda: models.resolve("nope"), "model: 'nope' is neither a preset (dit-1.5b"),
        (lambda: models.from_hf_config("/no/such/config.json"), "model: no such config file: /no/such"),
        (
            lambda: models.from_hf_config({"model_type": "no-such-arch", "hidden_size": 8}),
            "model: model_type 'no-such-arch' is unknown to transformers ",
        ),
        (
            lambda: models.from_hf_config({"model_type": "llama", "hidden_size": 64}),
            "model: llama config needs integer num_hidden_layers, num_attention_heads, intermediate_size",
        ),
        (lambda: models.from_count(0), "params: must be a positive integer count, got 0"),
        (lambda: models.from_count(100, 0), "largest_layer: must be a positive integer count, got 0"),
        (lambda: models.from_count(100, 200), "model.largest_layer_params: must be <= params (100), got 200"),
        (lambda: models.from_module(42), "model: expected a torch.nn.Module or a factory, got int"),
        (lambda: models.from_module(lambda: 42), "model: the factory returned int, not a torch.nn.Module"),
        (lambda: toymodels.build(models.preset("llama-2-7b")), "model: no toy model for family 'llama'"),
        (lambda: models.toy_spec("dit", seq_len=60), "seq_len: a DiT's token count must be a square"),
        (lambda: models.toy_spec("vit"), "family: toy models are gpt2 or dit, got 'vit'"),
    ],
)
def test_errors_are_one_line_naming_the_field(call, message):
    with pytest.raises(ValueError) as error:
        call()
    text = str(error.value)
    assert message in text and "\n" not in text


def test_invalid_json_is_reported(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=r"model: .*config.json is not valid JSON \(.*line 1\)"):
        models.resolve(str(bad))


def test_models_does_not_import_torch():
    code = "import sys, kit.models as m; m.preset('llama-3-70b'); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "False"


def test_a_sequence_limit_only_where_the_model_learned_its_positions():
    """T5's relative-position buckets, rotary and ALiBi models have no table of positions to run past, so
    their configs' n_positions / max_position_embeddings limit nothing; BART's learned table (+2 offset
    rows) does."""
    from kit.schema import Setup

    t5 = models.from_hf_config(
        {
            "model_type": "t5",
            "d_model": 64,
            "num_layers": 2,
            "num_heads": 4,
            "d_ff": 128,
            "d_kv": 16,
            "vocab_size": 100,
            "n_positions": 512,
        }  # fmt: skip
    )
    assert t5.max_seq_len is None
    assert Setup(model=t5, batch={"seq_len": 1024}).batch.seq_len == 1024  # no "must be <= 512"
    mpt = models.from_hf_config(MODELS.parent / "published" / "models" / "mpt-1b.json")  # ALiBi
    assert mpt.max_seq_len is None
    bart = models.from_hf_config(
        {
            "model_type": "bart",
            "d_model": 64,
            "encoder_layers": 2,
            "decoder_layers": 2,
            "vocab_size": 100,
            "encoder_attention_heads": 4,
            "decoder_attention_heads": 4,
            "encoder_ffn_dim": 128,
            "decoder_ffn_dim": 128,
            "max_position_embeddings": 128,
        }  # fmt: skip
    )
    assert bart.max_seq_len == 128
    with pytest.raises(ValueError, match="seq_len"):
        Setup(model=bart, batch={"seq_len": 256})
