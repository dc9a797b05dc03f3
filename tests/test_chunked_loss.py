"""The chunked loss (``kit.loss``): Liger's fused linear cross-entropy in plain PyTorch
(``kit.workloads.chunked_loss``) gives the plain loss and its gradients, keeps what the estimate says it
keeps, and is refused in one line where the kit does not model it. On CPU ranks (tests/test_peak.py): model
states to the byte, the peak of each phase within 3 %, at stages 0-3."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from kit import loss, models
from kit.cli import main
from kit.estimate import estimate
from kit.schema import Setup
from kit.workloads import adapters, chunked_loss
from tests.test_activations import DTYPES, TOLERANCE, config_and_setup


def test_chunk_size_follows_liger():
    # next_power_of_2(ceil(BT / ceil(V / H))): Llama-3-8B at 8K tokens, 128,256 / 4,096 -> 32 -> 256
    assert loss.chunk_tokens(8192, 128_256, 4096) == 256
    assert loss.chunk_tokens(62, 256, 64) == 16
    assert loss.chunk_tokens(3, 256, 64) == 1


def test_the_chunked_loss_is_the_plain_loss_with_its_gradients():
    torch.manual_seed(0)
    hidden = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(40, 16, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 40, (50,))
    targets[::7] = chunked_loss.IGNORE
    fused = chunked_loss.FusedLinearCrossEntropy.apply(hidden, weight, targets)
    (2 * fused).backward()  # a grad_output other than 1 scales the saved gradients
    got = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    plain = torch.nn.functional.cross_entropy(hidden @ weight.t(), targets, ignore_index=chunked_loss.IGNORE)
    (2 * plain).backward()
    # the softmax is fp32, as Liger's kernel computes it
    assert fused.item() == pytest.approx(plain.item(), rel=1e-6)
    assert torch.allclose(got[0], hidden.grad, atol=1e-6) and torch.allclose(got[1], weight.grad, atol=1e-6)


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("config", ["llama-gqa", "qwen2"])
@pytest.mark.parametrize("zero", [{}, {"lora_rank": 8}])
def test_what_the_chunked_loss_keeps_is_the_estimate(config, precision, zero):
    """What autograd saves for Hugging Face's decoder ending in the chunked loss, beside the estimate (its
    two gradients instead of the fp32 log-softmax and the head's input), as tests/test_activations.py
    checks the plain loss."""
    config, setup = config_and_setup(config, precision=precision, loss="chunked", **zero)
    torch.manual_seed(0)
    lm = adapters.apply(AutoModelForCausalLM.from_config(config), setup.zero).to(DTYPES[precision]).train()
    model = chunked_loss.wrap(lm, stage=0)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            seen.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        return t

    ids = torch.randint(0, config.vocab_size, (2, 96), generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, labels=ids)
    saved = sum(seen.values())
    assert saved == pytest.approx(estimate(setup).components["activations"], rel=TOLERANCE)


def test_chunked_loss_saves_the_logits_and_is_refused_where_it_is_not_modelled(capsys):
    m = models.preset("llama-3-8b")
    batch = {"micro_batch": 8, "seq_len": 8192}
    plain = estimate(Setup(model=m, zero={"stage": 3, "activation_checkpointing": True}, batch=batch))
    chunked = estimate(
        Setup(model=m, zero={"stage": 3, "activation_checkpointing": True, "loss": "chunked"}, batch=batch)
    )
    # 64K tokens x 128,256 fp32 logits (and their gradients) are gone from the peak
    assert chunked.per_gpu_bytes < plain.per_gpu_bytes / 2
    with pytest.raises(ValueError, match="zero.loss: the chunked loss is modelled for llama, mistral, qwen2"):
        Setup(model=models.preset("gpt2-xl"), zero={"loss": "chunked"})
    assert main(["estimate", "--model", "llama-3-8b", "--loss", "chunked", "--seq-len", "4096"]) == 0
    assert "chunked loss's saved gradients" in capsys.readouterr().out
    assert main(["launch-cmd", "--model", "llama-3-8b", "--stage", "3", "--loss", "chunked"]) == 0
    out = capsys.readouterr().out
    assert "# the loss is your script's" in out and "register_external_parameter" in out
