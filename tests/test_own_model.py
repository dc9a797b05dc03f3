"""Your own model: any Hugging Face architecture counted exactly, model files with clear errors, and
activations traced under FakeTensorMode checked against what autograd really saves on CPU."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers

from kit import hf_models, model_files, models, workloads
from kit.estimate import estimate, trace
from kit.paths import EXAMPLES
from kit.ranks.measure import SavedActivations
from kit.schema import Setup

REPO = Path(__file__).resolve().parent.parent
SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
#: small configs of architectures kit.models has no arithmetic for, and the class transformers builds
OTHERS = {
    "mixtral": (
        {**SMALL, "num_key_value_heads": 2, "vocab_size": 256, "num_local_experts": 4}, "MixtralForCausalLM"
    ),
    "qwen2_moe": (
        {**SMALL, "num_key_value_heads": 2, "vocab_size": 256, "num_experts": 4, "moe_intermediate_size": 32,
         "shared_expert_intermediate_size": 64},
        "Qwen2MoeForCausalLM",
    ),
    "gemma2": ({**SMALL, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256}, "Gemma2ForCausalLM"),
    "phi3": ({**SMALL, "vocab_size": 256, "pad_token_id": 0}, "Phi3ForCausalLM"),
    "t5": (
        {"d_model": 64, "d_ff": 128, "num_layers": 2, "num_heads": 4, "d_kv": 16, "vocab_size": 256,
         "decoder_start_token_id": 0, "pad_token_id": 0},
        "T5ForConditionalGeneration",
    ),
    "bart": (
        {"d_model": 64, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
         "decoder_attention_heads": 4, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "vocab_size": 256},
        "BartForConditionalGeneration",
    ),
    "vit": ({**SMALL, "image_size": 32, "patch_size": 8, "num_labels": 10}, "ViTForImageClassification"),
}  # fmt: skip
#: the hand-coded families at small sizes (their arithmetic and transformers' build must agree)
FAMILIES = {
    "llama": {**SMALL, "num_key_value_heads": 2, "vocab_size": 256},
    "mistral": {**SMALL, "num_key_value_heads": 2, "vocab_size": 256},
    "qwen2": {**SMALL, "num_key_value_heads": 2, "vocab_size": 256},
    "gpt_neox": {**SMALL, "vocab_size": 256},
    "gpt2": {"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 256, "n_positions": 64},
}
#: the trace equals what autograd saves to the byte, except for these (measured: bart +8.7 KB of 0.67 MB,
#: a causal mask per decoder layer transformers builds for a fake tensor), held to 3 %
NOT_EXACT = {"bart"}
TRACE_RTOL = 0.03


def meta_build(model_type: str, cfg: dict, cls: str):
    config = transformers.CONFIG_MAPPING[model_type](**cfg)
    with torch.device("meta"):
        return getattr(transformers, cls)(config)


def counts(module) -> tuple[int, int, list[int]]:
    params = [p.numel() for p in module.parameters()]
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in module.modules())
    return sum(params), largest, params


@pytest.mark.parametrize("model_type", list(OTHERS))
def test_any_hf_architecture_counts_like_transformers_on_meta(model_type):
    cfg, cls = OTHERS[model_type]
    spec = models.from_hf_config({"model_type": model_type, **cfg})
    params, largest, tensors = counts(meta_build(model_type, cfg, cls))
    assert (spec.params, spec.largest_layer_params, models.tensor_numels(spec)) == (params, largest, tensors)
    assert (
        spec.family == model_type
        and spec == Setup.model_validate({"model": spec.model_dump(), "batch": {}}).model
    )  # the arch travels in the spec's JSON


def test_full_size_mixtral_counts_every_expert():
    """Mixtral-8x7B: 46.7B parameters, all experts counted (ZeRO shards them all); its largest layer is
    one layer's experts module: 3-D gate/up and down projections of 8 experts (transformers 5)."""
    spec = models.from_hf_config({"model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2})
    assert spec.params == 46_702_792_704 and spec.largest_layer_params == 8 * 3 * 14336 * 4096
    assert hf_models.experts(hf_models.config(json.loads(spec.arch))) == (8, 2)
    setup = Setup(model=spec, cluster={"gpus_per_node": 8}, zero={"stage": 3}, batch={"seq_len": 256})
    assert "top-2 of 8 experts per token" in estimate(setup).terms["activations"].formula


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_arithmetic_and_transformers_agree_on_the_hand_coded_families(family):
    cfg = {"model_type": family, **FAMILIES[family]}
    fast = models.from_hf_config(cfg)
    built = hf_models.spec_fields(cfg)
    assert (fast.params, fast.largest_layer_params) == (built["params"], built["largest_layer_params"])
    # every tensor's shape too (FSDP shards along the first dimension): Conv1D for GPT-2, Linear elsewhere
    assert models.spec_shapes(fast) == hf_models.tensor_shapes(built["arch"])


@pytest.mark.parametrize("name", ["conv_net", "mlp"])
def test_model_files_count_like_the_module(name):
    path = EXAMPLES / f"{name}.py"
    spec = models.resolve(str(path))
    module = model_files.load(str(path)).model()
    assert (spec.params, spec.largest_layer_params, models.tensor_numels(spec)) == counts(module)
    assert spec.source == str(path) and spec.name == name
    loaded = model_files.load(str(path))
    assert models.from_module(loaded.model, loaded.batch) == spec
    assert models.from_module(loaded.model).params == spec.params  # counts only, no source


BAD_FILES = {
    "import": (
        "import no_such_package\n",
        "model: importing {p} raised ModuleNotFoundError: No module named",
    ),
    "contract": ("def model():\n    pass\n", "model: {p} defines no batch() (model() -> torch.nn.Module"),
    "model": (
        "def model():\n    raise RuntimeError('no weights here')\ndef batch(n):\n    return ()\n",
        "model: {p}:model() raised RuntimeError: no weights here (bad.py line 2, in model)",
    ),
    "batch": (
        "import torch\ndef model():\n    return torch.nn.Linear(4, 1)\ndef batch(n):\n    return 'x'\n",
        "model: {p}:batch(1) returned str, expected a tuple of tensors",
    ),
    "loss": (
        "import torch\ndef model():\n    return torch.nn.Linear(4, 2)\n"
        "def batch(n):\n    return (torch.randn(n, 4),)\n",
        "model: {p}: forward(*batch) returned (1, 2), expected a scalar loss tensor",
    ),
    "forward": (
        "import torch\nclass M(torch.nn.Linear):\n    def forward(self, x):\n        return x @ x\n"
        "def model():\n    return M(4, 2)\ndef batch(n):\n    return (torch.randn(n, 4),)\n",
        "model: {p}: forward(*batch(1)) raised RuntimeError: mat1 and mat2 shapes cannot be multiplied",
    ),
}


@pytest.mark.parametrize("kind", list(BAD_FILES))
def test_the_users_code_failing_is_one_line_naming_file_and_function(kind, tmp_path, capsys):
    from kit.cli import main

    code, message = BAD_FILES[kind]
    path = tmp_path / "bad.py"
    path.write_text(code)
    model_files._load.cache_clear()
    argv = ["estimate", "--model", str(path), "--gpus-per-node", "2", "--micro-batch", "1", "--json"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1
    assert message.format(p=path) in err, err


def test_from_module_with_batch_needs_a_model_file():
    with pytest.raises(ValueError, match=r"^model: with batch, give the model\(\) and batch\(\) functions"):
        models.from_module(lambda: torch.nn.Linear(2, 2), lambda n: (torch.randn(n, 2),))


def real_saved(spec, micro: int, seq: int, precision: str) -> int:
    """Bytes autograd saves for one real forward and backward on CPU (kit.ranks.measure's counter)."""
    dtype = getattr(torch, trace.DTYPES[precision])
    workload = workloads.for_model(spec)
    torch.manual_seed(0)
    model = workload.build().to(dtype)
    args, kwargs = workload.micro_batch(list(range(micro)), seq, 0)
    cast = lambda x: x.to(dtype) if x.is_floating_point() else x  # noqa: E731
    args, kwargs = [cast(x) for x in args], {k: cast(x) for k, x in kwargs.items()}
    counter = SavedActivations()
    with counter.watch(model):
        workload.loss(model(*args, **kwargs)).backward()
    return counter.bytes


CASES = {
    **{t: ({"model_type": t, **cfg}, "bf16") for t, (cfg, _) in OTHERS.items()},
    **{f: ({"model_type": f, **cfg}, "bf16") for f, cfg in FAMILIES.items() if f != "gpt2"},
    "llama-fp32": ({"model_type": "llama", **FAMILIES["llama"]}, "fp32"),
    "toy-gpt2": ("toy", "bf16"),
    "toy-dit": ("toy-dit", "bf16"),
    "conv_net": (str(EXAMPLES / "conv_net.py"), "bf16"),
    "mlp": (str(EXAMPLES / "mlp.py"), "fp32"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_traced_activations_equal_what_autograd_saves_on_cpu(case):
    source, precision = CASES[case]
    spec = models.from_hf_config(source) if isinstance(source, dict) else models.resolve(source)
    seq = 64 if spec.family == "dit" else 32
    traced = trace.trace(spec, 2, seq, precision)
    measured = real_saved(spec, 2, seq, precision)
    if case in NOT_EXACT:
        assert traced.saved_bytes == pytest.approx(measured, rel=TRACE_RTOL), (traced, measured)
    else:
        assert traced.saved_bytes == measured
    assert 0 < traced.checkpointed_bytes < traced.saved_bytes
    assert traced.peak_bytes >= traced.saved_bytes - measured * TRACE_RTOL


def test_trace_is_cached_and_the_formula_stands_beside_it():
    setup = Setup(model=models.preset("llama-2-7b"), batch={"micro_batch": 1, "seq_len": 512})
    first = estimate(setup, trace=True)
    again = estimate(setup.replace(zero={"stage": 3}), trace=True)
    assert again.trace is first.trace  # one trace per (model, micro batch, seq, precision)
    # the formula (Korthikanti, fitted to HF's Llama) and the trace agree within 1 %
    assert first.trace.saved_bytes == pytest.approx(first.components["activations"], rel=0.01)
    ckpt = estimate(setup.replace(zero={"activation_checkpointing": True}), trace=True)
    assert ckpt.trace.checkpointed_bytes == pytest.approx(ckpt.components["activations"], rel=0.01)
    assert estimate(setup).trace is None  # without --trace a formula family stays torch-free


@pytest.mark.parametrize(
    ("name", "seq", "target"),
    [("t5", 16, 8), ("bart", 16, None), ("mixtral", 16, None), ("conv_net.py", 0, None), ("mlp.py", 0, None)],
)
def test_a_large_micro_batch_is_drawn_through_2_3_and_4_as_traced_itself(name, seq, target, monkeypatch):
    """One micro batch above 4 alone is traced; from a second (a search) each is drawn through the traces at
    2, 3 and 4, and every figure at 7 samples so drawn equals the trace at 7 itself: an encoder-decoder with
    a shorter target, a mixture of experts (bf16: transformers' grouped_mm), model files; T5's and the conv
    net's peaks move to another moment from 2 samples to 4, each moment's live bytes on a line of their
    own."""
    monkeypatch.setattr(trace, "_ASKED", {})  # no micro batch asked before this test
    trace.trace.cache_clear()
    spec = (
        models.resolve(str(EXAMPLES / name))
        if name.endswith(".py")
        else models.from_hf_config({"model_type": name, **OTHERS[name][0]}, name=f"tiny-{name}")
    )
    precision = "bf16" if name == "mixtral" else "fp32"
    assert not trace.trace(spec, 6, seq, precision, (), target).line  # alone: traced itself
    drawn = trace.trace(spec, 7, seq, precision, (), target)
    itself = trace.traced_at(spec, 7, seq, precision, (), target)
    assert drawn.line and not itself.line
    assert {f: getattr(drawn, f) for f in trace.FIGURES} == {f: getattr(itself, f) for f in trace.FIGURES}
    peaks = [trace.trace(spec, b, seq, precision, (), target).peak_bytes for b in (*trace.LINE, 7)]
    assert name not in ("t5", "conv_net.py") or peaks[2] - peaks[1] != peaks[1] - peaks[0]


def test_cli_json_carries_trace_and_a_model_file_estimate():
    argv = [
        sys.executable,
        "-m",
        "kit",
        "estimate",
        "--model",
        str(EXAMPLES / "mlp.py"),
        "--micro-batch",
        "16",
    ]
    done = subprocess.run([*argv, "--json"], capture_output=True, text=True, check=True, cwd=REPO)
    out = json.loads(done.stdout)
    assert out["params"] == models.resolve(str(EXAMPLES / "mlp.py")).params
    assert out["components"]["activations"] == out["activations_trace"]["saved_bytes"] > 0
    assert out["setup"]["model"]["source"] == str(EXAMPLES / "mlp.py")


def test_overrides_shrink_a_preset_for_cpu_runs(capsys):
    from kit.cli import main

    small = models.override(
        models.preset("llama-3-8b"), {"layers": 2, "hidden": 64, "heads": 4, "vocab": 256}
    )
    assert small.name == "llama-3-8b-layers2-hidden64-heads4-vocab256"  # the preset and what changed
    cfg = json.loads(small.arch)
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_key_value_heads"], cfg["head_dim"]) == (
        2,
        64,
        4,
        16,
    )
    assert (
        small.params
        == counts(
            meta_build("llama", {k: v for k, v in cfg.items() if k != "model_type"}, "LlamaForCausalLM")
        )[0]
    )
    argv = [
        "estimate",
        "--model",
        "llama-3-8b",
        "--layers",
        "2",
        "--hidden",
        "64",
        "--heads",
        "4",
        "--vocab",
        "256",
    ]
    assert main([*argv, "--set", "intermediate_size=96", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["params"] == models.override(small, {"ffn": 96}).params
    assert main(["estimate", "--params", "7B", "--layers", "2"]) == 2
    assert "has no config to change" in capsys.readouterr().err


def test_a_declared_search_draws_its_first_large_micro_batch_through_2_3_and_4(monkeypatch):
    """Inside ``trace.searching()`` (a published row's checks and its largest micro batch) the first micro
    batch above 4 is drawn through the traces at 2, 3 and 4 at once, with the figures of its own trace."""
    monkeypatch.setattr(trace, "_ASKED", {})  # no micro batch asked before this test
    trace.trace.cache_clear()
    spec = models.resolve(str(EXAMPLES / "mlp.py"))
    with trace.searching():
        drawn = trace.trace(spec, 9, 0, "fp32")
    itself = trace.traced_at(spec, 9, 0, "fp32")
    assert drawn.line and not itself.line
    assert {f: getattr(drawn, f) for f in trace.FIGURES} == {f: getattr(itself, f) for f in trace.FIGURES}
    trace.trace.cache_clear()
    assert not trace.trace(spec, 9, 0, "fp32").line  # a second first ask outside a search: traced alone


def test_alone_traces_each_micro_batch_itself_even_where_a_search_would_draw_it(monkeypatch):
    """Inside ``trace.alone()`` (one micro batch at several lengths: ``boundary.longest_sequence``) a micro
    batch above 4 is traced itself though a second one was asked of the same lengths, and is not counted
    as asked: the next ask outside it is the first again."""
    monkeypatch.setattr(trace, "_ASKED", {})
    trace.trace.cache_clear()
    spec = models.resolve(str(EXAMPLES / "mlp.py"))
    assert not trace.trace(spec, 9, 0, "fp32").line  # the first ask: traced alone
    with trace.alone(), trace.searching():
        assert not trace.trace(spec, 10, 0, "fp32").line
    assert {(spec, 0, "fp32", (), None): {9}} == trace._ASKED
    assert trace.trace(spec, 11, 0, "fp32").line  # the second ask outside it: a search, drawn
