"""The fused losses (``kit.loss``): Liger's fused linear cross-entropy and Cut Cross-Entropy in plain
PyTorch (``kit.workloads.chunked_loss``) give the plain loss and its gradients, keep what the estimate says
they keep, and are refused in one line where the kit does not model them; Cut Cross-Entropy's working sets
alone as the estimate's. On CPU ranks (tests/test_peak.py): model states to the byte, the peak of each phase
within 3 %, at stages 0-3."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from kit import loss, models
from kit.cli import main
from kit.estimate import estimate
from kit.schema import Setup
from kit.workloads import adapters, chunked_loss
from tests.test_activations import DTYPES, TOLERANCE, config_and_setup, saved_by, saved_bytes


def test_chunk_size_follows_liger():
    # next_power_of_2(ceil(BT / ceil(V / H))): Llama-3-8B at 8K tokens, 128,256 / 4,096 -> 32 -> 256
    assert loss.chunk_tokens(8192, 128_256, 4096) == 256
    assert loss.chunk_tokens(62, 256, 64) == 16
    assert loss.chunk_tokens(3, 256, 64) == 1


@pytest.mark.parametrize(
    ("fused", "vocab", "scale"),
    [
        # the softmax is fp32, as Liger's kernel computes it
        (chunked_loss.FusedLinearCrossEntropy, 40, 2),
        # vocabulary blocks of 128, 128 and 44; the log-sum-exp and the softmax fp32, as CCE's kernels
        (chunked_loss.CutCrossEntropy, 300, 3),
    ],
)
def test_each_fused_loss_is_the_plain_loss_with_its_gradients(fused, vocab, scale):
    """The loss and both gradients of each fused loss's plain-PyTorch version equal the plain loss's, with
    ignored targets and a grad_output other than 1 (which scales the saved gradients)."""
    torch.manual_seed(0)
    hidden = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(vocab, 16, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, vocab, (50,))
    targets[::7] = chunked_loss.IGNORE
    loss = fused.apply(hidden, weight, targets)
    (scale * loss).backward()
    got = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    plain = torch.nn.functional.cross_entropy(hidden @ weight.t(), targets, ignore_index=chunked_loss.IGNORE)
    (scale * plain).backward()
    assert loss.item() == pytest.approx(plain.item(), rel=1e-6)
    assert torch.allclose(got[0], hidden.grad, atol=1e-6) and torch.allclose(got[1], weight.grad, atol=1e-6)


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("head", ["trains", "frozen"])
def test_cut_cross_entropys_working_sets_alone_are_the_estimates(precision, head):
    """Its forward and its backward on 64 tokens of the shrunk Llama's head (h = 64, v = 256: two blocks)
    under the ranks' recorder, less the inputs and what it saves (the estimate's activations), beside
    ``kit.estimate.micro_step.cce_working_sets`` on CPU: bf16 within the scalars' 16 B, fp32 within the
    block's target indices (at most 2 x 8 B x 64)."""
    from kit.estimate import micro_step
    from kit.ranks.memory_timeline import StepMemory, cpu_matmul
    from kit.rules import element_bytes

    setup = Setup(
        model=models.override(
            models.preset("llama-2-7b"), {"layers": 2, "hidden": 64, "ffn": 128, "vocab": 256}
        ),
        zero={"precision": precision, "loss": "cce", "lora_rank": 4 if head == "frozen" else 0},
        batch={"micro_batch": 2, "seq_len": 32},
    )
    cpu = cpu_matmul()
    forward, backward = micro_step.cce_working_sets(setup, cpu)
    tokens, h, v, p = 64, 64, 256, element_bytes(precision)
    memory = StepMemory()
    torch.manual_seed(0)
    with memory.recording():
        with memory.phase("forward"):
            hidden = torch.randn(tokens, h, dtype=DTYPES[precision], requires_grad=True)
            weight = torch.randn(v, h, dtype=DTYPES[precision], requires_grad=head == "trains")
            targets = torch.randint(0, v, (tokens,))
            loss = chunked_loss.CutCrossEntropy.apply(hidden, weight, targets)
        with memory.phase("backward"):
            loss.backward()
    phases = memory.result()["phases"]
    inputs = p * (tokens + v) * h + 8 * tokens + 4 * tokens  # hidden, weight, targets and the saved LSE
    slack = 16 if precision == "bf16" else 2 * 8 * tokens
    assert 0 <= phases["forward"] - inputs - forward.bytes <= slack
    assert 0 <= phases["backward"] - inputs - backward.bytes <= slack


CASES = [
    *(
        ("chunked", config, precision, zero)
        for precision in ("bf16", "fp32")
        for config in ("llama-gqa", "qwen2")
        for zero in ({}, {"lora_rank": 8})
    ),
    ("cce", "llama-gqa", "bf16", {}),
    ("cce", "qwen2", "fp32", {"lora_rank": 8}),
]


@pytest.mark.parametrize("loss,config,precision,zero", CASES)
def test_what_a_fused_loss_keeps_is_the_estimate(loss, config, precision, zero):
    """What autograd saves for Hugging Face's decoder ending in a fused loss, beside the estimate (the
    chunked loss's two gradients, or Cut Cross-Entropy's input, LSE and targets, instead of the fp32
    log-softmax and the head's input), as tests/test_activations.py checks the plain loss."""
    config, setup = config_and_setup(config, precision=precision, loss=loss, **zero)
    torch.manual_seed(0)
    lm = adapters.apply(AutoModelForCausalLM.from_config(config), setup.zero).to(DTYPES[precision]).train()
    saved = saved_bytes(chunked_loss.wrap(lm, stage=0, loss=loss), 2, 96, config.vocab_size)
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
    with pytest.raises(
        ValueError, match="zero.loss: the chunked loss is modelled for llama, mistral, qwen2, gpt2"
    ):
        Setup(model=models.preset("pythia-1b"), zero={"loss": "chunked"})
    assert main(["estimate", "--model", "llama-3-8b", "--loss", "chunked", "--seq-len", "4096"]) == 0
    assert "chunked loss's saved gradients" in capsys.readouterr().out
    assert main(["launch-cmd", "--model", "llama-3-8b", "--stage", "3", "--loss", "chunked"]) == 0
    out = capsys.readouterr().out
    assert "# the loss is your script's" in out and "register_external_parameter" in out


def test_cut_cross_entropy_keeps_no_logits_and_says_what_the_script_calls(capsys):
    m = models.preset("llama-3-8b")
    zero = {"stage": 3, "activation_checkpointing": True}
    batch = {"micro_batch": 8, "seq_len": 8192}
    chunked, cce = (
        estimate(Setup(model=m, zero={**zero, "loss": x}, batch=batch)) for x in ("chunked", "cce")
    )
    # 64K tokens: CCE keeps the norm's 16-bit output, an fp32 LSE and the int64 targets per token where the
    # chunked loss keeps the input's 16-bit gradient, and the head weight's in backward instead of forward
    tokens = 8 * 8192
    head = cce.components["activations"] - chunked.components["activations"]
    assert head == 12 * tokens - 2 * 128_256 * 4096
    with pytest.raises(ValueError, match="zero.loss: the Cut Cross-Entropy loss is modelled for llama"):
        Setup(model=models.preset("pythia-1b"), zero={"loss": "cce"})
    assert main(["estimate", "--model", "llama-3-8b", "--loss", "cce", "--seq-len", "4096"]) == 0
    out = capsys.readouterr().out
    assert "Cut Cross-Entropy (Triton)" in out and "Cut Cross-Entropy's fp32 LSE" in out
    lora = estimate(Setup(model=m, zero={"loss": "cce", "lora_rank": 16}, batch=batch))  # the subset's text
    says = lora.terms["activations"].formula
    assert "head: what the final norm and the Cut Cross-Entropy loss save" in says
    assert main(["launch-cmd", "--model", "llama-3-8b", "--stage", "3", "--loss", "cce"]) == 0
    out = capsys.readouterr().out
    assert "linear_cross_entropy" in out and "register_external_parameter" in out and "cce_patch" in out


@pytest.mark.parametrize("fused", ["chunked", "cce"])
def test_the_toy_gpt_ends_in_each_fused_loss_with_the_plain_loss_and_gradients(fused, capsys):
    """The kit's GPT (GPT-2's tensors, a tied head; its labels the next tokens already) wrapped as the ranks
    wrap it: the plain loss and every parameter's gradient (float64); what it saves is the estimate's; the
    script is told to call the loss itself (Liger's and CCE's patches do not cover GPT-2)."""
    from kit.workloads.toymodels import GPT

    spec = models.resolve("toy")
    torch.manual_seed(0)
    model = GPT(spec).double()
    ids, labels = (
        torch.randint(0, spec.vocab, (2, 16), generator=torch.Generator().manual_seed(i)) for i in (0, 1)
    )
    plain = model(ids, labels)
    plain.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    wrapped = chunked_loss.wrap(model, stage=2, loss=fused)
    got = wrapped(ids, labels)
    got.backward()
    assert got.item() == pytest.approx(plain.item(), rel=1e-6)
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, grads[name], atol=1e-8), name
    setup = Setup(
        model=spec, zero={"precision": "fp32", "loss": fused}, batch={"micro_batch": 2, "seq_len": 16}
    )
    saved = saved_by(chunked_loss.wrap(model.float(), stage=2, loss=fused), ids, labels)
    kept = saved - 8 * ids.numel() * (fused == "cce")  # CCE keeps the batch's labels
    assert kept == pytest.approx(estimate(setup).components["activations"], rel=TOLERANCE)
    assert main(["launch-cmd", "--model", "toy", "--stage", "3", "--loss", fused]) == 0
    out = capsys.readouterr().out
    assert "in your loop" in out and "register_external_parameter" in out
    assert "cce_patch" not in out and "apply_liger_kernel_to_llama" not in out
