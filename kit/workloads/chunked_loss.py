"""The chunked loss (``kit.loss``) on the ranks: Liger-Kernel's fused linear cross-entropy algorithm in plain
PyTorch. Imports torch.

``FusedLinearCrossEntropy`` takes the last hidden states, the head's weight and the targets, goes through the
tokens in chunks of ``kit.loss.chunk_tokens``, computes each chunk's loss and both gradients in the forward
(as ``LigerFusedLinearCrossEntropyFunction`` does) and keeps only those gradients for backward. Liger's Triton
kernel turns a chunk's logits into their gradient in registers; here the chunk's softmax is an fp32 tensor
(the estimate counts it on CPU ranks). ``ChunkedLoss`` wraps a Hugging Face decoder so that its forward ends
in it; at ZeRO-3 the head's weight is registered on the wrapper (``register_external_parameter``), so
DeepSpeed gathers it for the wrapper's forward and backward although ``lm_head`` itself never runs.

What it cannot see: label smoothing, z-loss, a softcap on the logits and a head with a bias.
"""

from __future__ import annotations

import torch

from kit.loss import chunk_tokens

IGNORE = -100


class FusedLinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of ``hidden @ weight.T`` against ``targets`` (``IGNORE`` left out), by chunks."""

    @staticmethod
    def forward(ctx, hidden, weight, targets):
        tokens = hidden.shape[0]
        chunk = chunk_tokens(tokens, weight.shape[0], weight.shape[1])
        grad_input = torch.zeros_like(hidden)
        grad_weight = torch.zeros_like(weight) if weight.requires_grad else None
        count = (targets != IGNORE).sum().clamp(min=1)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, tokens, chunk):
            x, t = hidden[start : start + chunk], targets[start : start + chunk]
            keep = t != IGNORE
            rows = torch.arange(x.shape[0], device=x.device)
            probs = (x @ weight.t()).float()  # the chunk's logits, upcast: the fp32 softmax, in place
            probs.sub_(probs.amax(dim=-1, keepdim=True)).exp_()
            probs.div_(probs.sum(dim=-1, keepdim=True))
            picked = probs[rows, t.clamp(min=0)]
            total -= torch.where(keep, picked.clamp(min=1e-30).log(), 0.0).sum()
            probs[rows, t.clamp(min=0)] -= 1.0
            probs.mul_((keep / count).unsqueeze(1))  # d(mean loss) / d(logits); ignored rows 0
            grad = probs.to(x.dtype)
            del probs
            grad_input[start : start + chunk] = grad @ weight
            if grad_weight is not None:
                grad_weight.addmm_(grad.t(), x)
            del grad
        ctx.save_for_backward(grad_input, grad_weight)
        return total / count

    @staticmethod
    def backward(ctx, grad_output):
        grad_input, grad_weight = ctx.saved_tensors
        if not torch.equal(grad_output, torch.ones_like(grad_output)):  # Liger scales only then
            grad_input = grad_input * grad_output
            grad_weight = grad_weight * grad_output if grad_weight is not None else None
        return grad_input, grad_weight, None


class ChunkedLoss(torch.nn.Module):
    """A Hugging Face causal LM whose forward ends in ``FusedLinearCrossEntropy`` instead of its logits and
    ``cross_entropy`` (as Liger's ``lce_forward`` does): labels shifted by one (or ``shift_labels`` as
    given), the head never called."""

    def __init__(self, lm) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, input_ids, labels, shift_labels=None, **kwargs):
        from transformers.modeling_outputs import CausalLMOutput

        hidden = self.lm.get_decoder()(input_ids=input_ids, **kwargs).last_hidden_state
        if shift_labels is None:
            shifted = hidden[:, :-1, :].contiguous().view(-1, hidden.shape[-1])
            targets = labels[:, 1:].contiguous().view(-1)
        else:  # labels shifted before a sequence-parallel split (kit.workloads.ulysses): every token has one
            shifted, targets = hidden.view(-1, hidden.shape[-1]), shift_labels.reshape(-1)
        loss = FusedLinearCrossEntropy.apply(shifted, self.lm.get_output_embeddings().weight, targets)
        return CausalLMOutput(loss=loss)


def wrap(model, stage: int):
    """``model`` ending in the chunked loss; at ZeRO-3 with the head's weight registered on the wrapper."""
    wrapped = ChunkedLoss(model)
    if stage == 3:
        import deepspeed

        deepspeed.zero.register_external_parameter(wrapped, model.get_output_embeddings().weight)
    return wrapped
