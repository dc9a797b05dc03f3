"""Activation estimates against what autograd saves for Hugging Face's own models (one CPU process).

The estimator's per-family formulas (``kit.estimate.activations``) are compared with the bytes
of every distinct storage ``torch.autograd.graph.saved_tensors_hooks`` sees during a forward and
loss, parameters excluded. Left out by the formulas are O(s^2 + bs + bh) tensors (masks, norm
statistics, token ids, rotary tables): at most 1.4 % at these tiny sizes. GPT-2-style estimates
assume a fused GELU and no dropout (the estimate says so in its notes).
"""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from kit.estimate import estimate
from kit.models import from_hf_config
from kit.schema import Setup

TOLERANCE = 0.015
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def saved_bytes(model: torch.nn.Module, batch: int, seq: int, vocab: int) -> int:
    """What a Hugging Face causal LM's forward saves on random token ids (its own labels)."""
    ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))
    return saved_by(model, input_ids=ids, labels=ids)


def saved_by(model: torch.nn.Module, *args, **kwargs) -> int:
    """Bytes of the distinct storages autograd saves in ``model(*args, **kwargs)``, parameters excluded."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen.setdefault(storage.data_ptr(), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(*args, **kwargs)
    return sum(seen.values())


CONFIGS = {
    "llama-gqa": dict(
        model_type="llama", hidden_size=384, intermediate_size=1024, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, vocab_size=2048, attn_implementation="sdpa",
    ),
    "llama-mha": dict(
        model_type="llama", hidden_size=512, intermediate_size=1376, num_hidden_layers=3,
        num_attention_heads=8, num_key_value_heads=8, vocab_size=1000, attn_implementation="sdpa",
    ),
    "qwen2": dict(
        model_type="qwen2", hidden_size=256, intermediate_size=704, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True,
        attn_implementation="sdpa",
    ),
    "gpt2-fused-gelu-no-dropout": dict(
        model_type="gpt2", n_embd=256, n_layer=2, n_head=4, vocab_size=512, n_positions=128,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, activation_function="gelu_pytorch_tanh",
        attn_implementation="eager",
    ),
}  # fmt: skip


def config_and_setup(name: str, **zero):
    """The transformers config of ``CONFIGS[name]`` and the Setup that estimates it on one GPU with
    ``zero`` (micro batch 2 of 96 tokens)."""
    fields = dict(CONFIGS[name])
    implementation = fields.pop("attn_implementation")
    config = AutoConfig.for_model(**fields, max_position_embeddings=128)
    config._attn_implementation = implementation
    setup = Setup(
        model=from_hf_config(config.to_dict()),
        cluster={"nodes": 1, "gpus_per_node": 1},
        zero=zero,
        batch={"micro_batch": 2, "seq_len": 96},
    )
    return config, setup


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_activation_estimate_matches_saved_tensors(name, precision):
    config, setup = config_and_setup(name, precision=precision)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(DTYPES[precision]).train()
    measured = saved_bytes(model, 2, 96, config.vocab_size)
    predicted = estimate(setup).components["activations"]
    assert measured == pytest.approx(predicted, rel=TOLERANCE), (measured, predicted)


#: a model file whose forward branches on a value (issue 41, item 6 met it in DeBERTa-v2's padding check,
#: which the trace now runs for real: tests/test_heads_and_lengths.py)
GATED = """import torch


class Gated(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.linear(x)
        if y.sum() > 0:  # a branch on a value computed from floats: a fake tensor has none
            y = 2 * y
        return y.square().mean()


def model():
    return Gated()


def batch(micro_batch):
    return (torch.randn(micro_batch, 8),)
"""


def test_a_model_that_cannot_be_traced_is_refused_in_one_line_not_estimated_at_0(tmp_path, capsys):
    """A forward that branches on a value FakeTensorMode cannot know (here computed from a float input) stops
    the trace: its activations are unknown, so the estimate refuses (naming the model and the op) instead of
    counting 0 bytes, under which every micro batch would fit; the CLI exits 2 with that line."""
    from kit.cli import main
    from kit.models import resolve

    path = tmp_path / "gated.py"
    path.write_text(GATED)
    setup = Setup(model=resolve(str(path)), batch={"micro_batch": 100_000})
    with pytest.raises(ValueError) as refused:
        estimate(setup)
    line = str(refused.value)
    assert line.startswith("activations: gated could not be traced under FakeTensorMode (")
    assert "aten._local_scalar_dense" in line and line.endswith("zero-kit cannot estimate its memory")
    assert "\n" not in line
    assert main(["estimate", "--model", str(path), "--micro-batch", "8", "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "could not be traced under FakeTensorMode" in err
