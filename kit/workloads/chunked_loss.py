"""The fused losses (``kit.loss``) on the ranks: Liger-Kernel's fused linear cross-entropy and Cut
Cross-Entropy's algorithms in plain PyTorch. Imports torch.

``FusedLinearCrossEntropy`` takes the last hidden states, the head's weight and the targets, goes through the
tokens in chunks of ``kit.loss.chunk_tokens``, computes each chunk's loss and both gradients in the forward
(as ``LigerFusedLinearCrossEntropyFunction`` does) and keeps only those gradients for backward. Liger's Triton
kernel turns a chunk's logits into their gradient in registers; here the chunk's softmax is an fp32 tensor
(the estimate counts it on CPU ranks).

``CutCrossEntropy`` follows ``ml-cross-entropy``'s ``LinearCrossEntropyFunction``: its forward goes through
the vocabulary in blocks of ``kit.loss.CCE_BLOCK_V`` entries (every token at once), folding each block's
log-sum-exp into a running one and picking each token's target logit from the block holding it, and
saves the input, the targets and the fp32 LSE; its backward recomputes each block's logits, turns them
into their gradient (``exp(logit - lse)`` less one at the target) and adds that block's share to the
input's gradient and writes the weight's rows. The Triton kernels keep a block in on-chip tiles; here a
block's logits and their fp32 upcast are tensors (the estimate counts them on CPU ranks), and no block is
skipped (CCE's gradient filter, a speed matter, changes no byte).

``ChunkedLoss`` wraps a Hugging Face decoder or the kit's GPT so that its forward ends in either; at ZeRO-3
the head's weight is registered on the wrapper (``register_external_parameter``), so DeepSpeed gathers it
for the wrapper's forward and backward although ``lm_head`` itself never runs.

What it cannot see: label smoothing, z-loss, a softcap on the logits and a head with a bias.
"""

from __future__ import annotations

import torch

from kit.loss import CCE_BLOCK_V, chunk_tokens
from kit.workloads.toymodels import GPT

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


def _in_block(targets, start: int, width: int):
    """The tokens whose target is in the vocabulary block ``[start, start + width)`` and their columns in it
    (``IGNORE`` is in none)."""
    rows = ((targets >= start) & (targets < start + width)).nonzero()[:, 0]
    return rows, targets[rows] - start


class CutCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of ``hidden @ weight.T`` against ``targets`` (``IGNORE`` left out), by vocabulary
    blocks: the logits are never whole, in the forward nor in the backward."""

    @staticmethod
    def forward(ctx, hidden, weight, targets):
        tokens, vocab = hidden.shape[0], weight.shape[0]
        lse = torch.full((tokens,), float("-inf"), dtype=torch.float32, device=hidden.device)
        picked = torch.zeros(tokens, dtype=torch.float32, device=hidden.device)  # each token's target logit
        for start in range(0, vocab, CCE_BLOCK_V):
            logits = (hidden @ weight[start : start + CCE_BLOCK_V].t()).float()
            rows, columns = _in_block(targets, start, logits.shape[1])
            picked[rows] = logits[rows, columns]
            del rows, columns
            top = logits.amax(dim=1)
            block_lse = logits.sub_(top[:, None]).exp_().sum(dim=1).log_().add_(top)
            del logits, top
            lse = torch.logaddexp(lse, block_lse)
            del block_lse
        keep = targets != IGNORE
        ctx.save_for_backward(hidden, weight, targets, lse)
        return torch.where(keep, lse - picked, 0.0).sum() / keep.sum().clamp(min=1)

    @staticmethod
    def backward(ctx, grad_output):
        hidden, weight, targets, lse = ctx.saved_tensors
        count = (targets != IGNORE).sum().clamp(min=1)
        scale = (targets != IGNORE) * (grad_output / count)  # d(loss) / d(a token's logits' softmax)
        grad_input = torch.zeros_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        for start in range(0, weight.shape[0], CCE_BLOCK_V):
            block = weight[start : start + CCE_BLOCK_V]
            probs = (hidden @ block.t()).float()  # the block's logits again, upcast: their softmax in place
            probs.sub_(lse[:, None]).exp_()
            rows, columns = _in_block(targets, start, probs.shape[1])
            probs[rows, columns] -= 1.0
            del rows, columns
            probs.mul_(scale[:, None])
            grad = probs.to(hidden.dtype)
            del probs
            if grad_input is not None:
                grad_input.addmm_(grad, block)
            if grad_weight is not None:
                grad_weight[start : start + CCE_BLOCK_V].addmm_(grad.t(), hidden)
            del grad
        return grad_input, grad_weight, None


#: the function each fused loss runs (``kit.loss``)
FUNCTIONS = {"chunked": FusedLinearCrossEntropy, "cce": CutCrossEntropy}


class ChunkedLoss(torch.nn.Module):
    """A causal LM whose forward ends in a fused loss (``FUNCTIONS``) instead of its logits and
    ``cross_entropy``, the head never called. A Hugging Face decoder's: the chunked loss takes the decoder's
    output less each sequence's last token and the labels shifted by one (as Liger's ``lce_forward`` does);
    Cut Cross-Entropy the decoder's output itself and the shifted labels, each sequence's last token without
    one (as ``linear_cross_entropy(..., shift=1)``: no shifted copy of the output). ``shift_labels`` (a
    sequence-parallel split's) give every token its target as they are, as do the kit's GPT's labels (the
    next tokens already: ``kit.workloads.toymodels.GPT``), whose loss is returned as its forward's is."""

    def __init__(self, lm, loss: str = "chunked") -> None:
        super().__init__()
        self.lm, self.function = lm, FUNCTIONS[loss]

    def forward(self, input_ids, labels, shift_labels=None, **kwargs):
        if isinstance(self.lm, GPT):  # labels are the next tokens: every token has its target
            hidden = self.lm.hidden_states(input_ids, kwargs.get("position_ids"))
            return self.function.apply(hidden.view(-1, hidden.shape[-1]), head(self.lm), labels.reshape(-1))
        from transformers.modeling_outputs import CausalLMOutput

        hidden = self.lm.get_decoder()(input_ids=input_ids, **kwargs).last_hidden_state
        if shift_labels is not None:  # shifted before a sequence-parallel split (kit.workloads.ulysses)
            shifted, targets = hidden.view(-1, hidden.shape[-1]), shift_labels.reshape(-1)
        elif self.function is CutCrossEntropy:  # each token's next one, the last token's IGNORE
            shifted, targets = hidden.view(-1, hidden.shape[-1]), torch.full_like(labels, IGNORE)
            targets[:, :-1] = labels[:, 1:]
            targets = targets.view(-1)
        else:
            shifted = hidden[:, :-1, :].contiguous().view(-1, hidden.shape[-1])
            targets = labels[:, 1:].contiguous().view(-1)
        loss = self.function.apply(shifted, head(self.lm), targets)
        return CausalLMOutput(loss=loss)


def head(lm) -> torch.Tensor:
    """The head's weight of ``lm`` (the kit's GPT or a Hugging Face causal LM)."""
    return lm.lm_head.weight if isinstance(lm, GPT) else lm.get_output_embeddings().weight


def wrap(model, stage: int, loss: str = "chunked"):
    """``model`` ending in ``loss`` (a fused one); at ZeRO-3 with the head's weight registered on the
    wrapper."""
    wrapped = ChunkedLoss(model, loss)
    if stage == 3:
        import deepspeed

        deepspeed.zero.register_external_parameter(wrapped, head(model))
    return wrapped
