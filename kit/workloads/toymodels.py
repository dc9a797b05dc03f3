"""The small models the runner trains on CPU (and the same code on a GPU), built from a ModelSpec.

``GPT`` has exactly Hugging Face GPT-2's parameter tensors (names and shapes: its state dict loads into
``GPT2LMHeadModel``) with explicit attention (matmul, causal mask, softmax; no SDPA/flash, no dropout),
so the tensors saved for backward follow the textbook activation formula. ``DiT`` is a Diffusion
Transformer (Peebles & Xie 2023, facebookresearch/DiT) with adaLN-Zero blocks. Both return the loss
when given a target, so an engine step is ``engine(*inputs, target).backward()``.
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from kit import models
from kit.schema import ModelSpec


class Conv1D(nn.Module):
    """HF GPT-2's projection: ``x @ weight + bias`` with ``weight`` stored (in, out), and transformers'
    ``Conv1D``'s attributes (``nf`` out, ``nx`` in): LoRA makes it that class (``kit.workloads.adapters``),
    which peft adapts; it is not imported here, as transformers costs each rank 0.6 s."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.nf, self.nx = n_out, n_in
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """Explicit scaled dot-product attention over (batch, heads, seq, head_dim) tensors."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        seq = q.shape[-2]
        mask = torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(mask, torch.finfo(scores.dtype).min)
    return scores.softmax(dim=-1) @ v


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(batch, seq, hidden) -> (batch, heads, seq, hidden / heads)."""
    b, s, h = x.shape
    return x.view(b, s, heads, h // heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(batch, heads, seq, head_dim) -> (batch, seq, heads * head_dim)."""
    b, n, s, d = x.shape
    return x.transpose(1, 2).reshape(b, s, n * d)


def core_attention(module: nn.Module, q, k, v, mask, **kwargs) -> tuple[torch.Tensor, None]:
    """``attention`` with a Hugging Face attention function's signature and output layout (batch, seq,
    heads, head_dim): what DeepSpeed's Ulysses attention runs between its exchanges (``exchange``)."""
    return attention(q, k, v, causal=True).transpose(1, 2), None


class GPTAttention(nn.Module):
    """GPT-2's attention. Under Ulysses sequence parallelism ``exchange`` is DeepSpeed's
    ``UlyssesSPAttentionHF`` (set by ``kit.workloads.ulysses.register``): it exchanges q, k and v for every
    token of a share of the heads, runs ``core_attention`` there and exchanges the output back."""

    exchange = None

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.c_attn = Conv1D(hidden, 3 * hidden)
        self.c_proj = Conv1D(hidden, hidden)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        q, k, v = (split_heads(t, self.heads) for t in self.c_attn(x).chunk(3, dim=-1))
        if self.exchange is None:
            return self.c_proj(merge_heads(attention(q, k, v, causal=True)))
        out, _ = self.exchange(self, q, k, v, None, position_ids=position_ids)
        return self.c_proj(out)


class GPTMLP(nn.Module):
    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.c_fc = Conv1D(hidden, ffn)
        self.c_proj = Conv1D(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the tanh approximation as one op (HF gelu_pytorch_tanh); GPT-2's gelu_new computes it in several
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class GPTBlock(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden)
        self.attn = GPTAttention(hidden, heads)
        self.ln_2 = nn.LayerNorm(hidden)
        self.mlp = GPTMLP(hidden, ffn)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), position_ids)
        return x + self.mlp(self.ln_2(x))


class Embedding(nn.Embedding):
    """``nn.Embedding`` drawn from N(0, std) in its own constructor: ``deepspeed.zero.Init`` partitions a
    module's parameters as its constructor returns, so an init done later by a parent would be lost."""

    def __init__(self, rows: int, dim: int, std: float):
        self.std = std
        super().__init__(rows, dim)

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, std=self.std)


class ZeroLinear(nn.Linear):
    """``nn.Linear`` starting at zero (adaLN-Zero), set in its own constructor (see ``Embedding``)."""

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.weight)
        nn.init.zeros_(self.bias)


class GPTBody(nn.Module):
    """HF's ``GPT2Model`` parameters: wte, wpe, h (blocks), ln_f."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        # GPT checked the shape (models.config_of): these are set, so dims' defaults do not apply
        assert spec.vocab is not None and spec.ffn is not None and spec.max_seq_len is not None
        d = spec.dims
        self.wte = Embedding(d.vocab, d.hidden, std=0.02)
        self.wpe = Embedding(spec.max_seq_len, d.hidden, std=0.01)
        self.h = nn.ModuleList(GPTBlock(d.hidden, d.heads, d.ffn) for _ in range(d.layers))
        self.ln_f = nn.LayerNorm(d.hidden)


class GPT(nn.Module):
    """GPT-2 style decoder; ``forward(input_ids)`` -> logits, ``forward(input_ids, labels)`` -> loss.

    Labels are the next tokens (already shifted by the caller), shape (batch, seq).
    """

    #: Hugging Face's flag, off as in its models: the kit checkpoints blocks itself (``kit.checkpointing``).
    #: peft reads it, taking a model without it for checkpointed, whose embeddings' output it then makes
    #: need a gradient (saving every frozen block's input)
    is_gradient_checkpointing = False

    def __init__(self, spec: ModelSpec):
        super().__init__()
        if spec.family != "gpt2":
            raise ValueError(f"model: GPT needs a gpt2-family spec, got family {spec.family!r}")
        models.config_of(spec)  # a complete shape, or a clear error
        self.spec = spec
        self.transformer = GPTBody(spec)
        d = spec.dims  # vocab is set: GPTBody checked it
        self.lm_head = nn.Linear(d.hidden, d.vocab, bias=False)
        if spec.tied_embeddings:
            self.lm_head.weight = self.transformer.wte.weight

    def get_input_embeddings(self) -> nn.Embedding:  # Hugging Face's names: what a frozen group freezes
        return self.transformer.wte

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def enable_input_require_grads(self) -> None:
        """Hugging Face's: the input embeddings' output needs a gradient, so that a reentrant checkpoint
        gives the blocks' adapters theirs when every embedding is frozen (LoRA)."""
        self.transformer.wte.register_forward_hook(lambda module, args, output: output.requires_grad_(True))

    def hidden_states(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The final norm's output: what the head (or a fused loss, ``kit.workloads.chunked_loss``) takes.
        ``position_ids``: the tokens' places in their sequences (a sequence-parallel rank's part of them,
        which its attention needs), else 0, 1, ..."""
        body = self.transformer
        if position_ids is None:
            x = body.wte(input_ids) + body.wpe(torch.arange(input_ids.shape[1], device=input_ids.device))
        else:
            x = body.wte(input_ids) + body.wpe(position_ids)
        given = {} if position_ids is None else {"position_ids": position_ids}
        for block in body.h:
            x = block(x, **given)
        return body.ln_f(x)

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        logits = self.lm_head(self.hidden_states(input_ids, position_ids))
        if labels is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.reshape(-1))


class PatchEmbed(nn.Module):
    """Image (N, C, H, W) -> patch tokens (N, H*W/p², hidden), a strided convolution as in timm."""

    def __init__(self, patch: int, channels: int, hidden: int):
        super().__init__()
        self.proj = nn.Conv2d(channels, hidden, kernel_size=patch, stride=patch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class TimestepEmbedder(nn.Module):
    """Diffusion timestep -> vector: sinusoidal features, then Linear, SiLU, Linear."""

    def __init__(self, hidden: int):
        super().__init__()
        channels = models.DIT_FREQUENCY_CHANNELS
        self.mlp = nn.Sequential(nn.Linear(channels, hidden), nn.SiLU(), nn.Linear(hidden, hidden))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = models.DIT_FREQUENCY_CHANNELS // 2
        freqs = torch.exp(-math.log(10_000) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
        args = t.float()[:, None] * freqs[None]
        features = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        first = cast(nn.Linear, self.mlp[0])  # nn.Sequential's indexing is typed as any Module
        return self.mlp(features.to(first.weight.dtype))


class DiTAttention(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (split_heads(t, self.heads) for t in self.qkv(x).chunk(3, dim=-1))
        return self.proj(merge_heads(attention(q, k, v, causal=False)))


class DiTMLP(nn.Module):
    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale[:, None]) + shift[:, None]


class DiTBlock(nn.Module):
    """adaLN-Zero block: the condition sets shift, scale and gate of attention and MLP."""

    def __init__(self, hidden: int, heads: int, ffn: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.attn = DiTAttention(hidden, heads)
        self.norm2 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.mlp = DiTMLP(hidden, ffn)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), ZeroLinear(hidden, 6 * hidden))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift1, scale1, gate1, shift2, scale2, gate2 = self.adaLN_modulation(c).chunk(6, dim=-1)
        x = x + gate1[:, None] * self.attn(modulate(self.norm1(x), shift1, scale1))
        return x + gate2[:, None] * self.mlp(modulate(self.norm2(x), shift2, scale2))


class FinalLayer(nn.Module):
    def __init__(self, hidden: int, patch: int, out_channels: int):
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden, patch * patch * out_channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), ZeroLinear(hidden, 2 * hidden))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=-1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class DiT(nn.Module):
    """Class-conditional DiT over latents (N, C, H, W); ``forward(x, t, y)`` -> (N, C_out, H, W).

    ``forward(x, t, y, target)`` returns the mean squared error to ``target`` (same shape as the output).
    Patch size, channels and learn_sigma are ``kit.models.DIT_DEFAULTS`` (a ModelSpec does not record
    them); the classifier-free "null" label has its own embedding row but labels are never dropped here.
    """

    def __init__(self, spec: ModelSpec):
        super().__init__()
        if spec.family != "dit":
            raise ValueError(f"model: DiT needs a dit-family spec, got family {spec.family!r}")
        cfg = models.config_of(spec)
        # config_of checked the shape: these are set, so dims' defaults do not apply
        assert spec.vocab is not None and spec.ffn is not None
        d = spec.dims
        self.spec = spec
        self.patch, self.channels = cfg["patch_size"], cfg["in_channels"]
        self.out_channels = 2 * self.channels if cfg["learn_sigma"] else self.channels
        self.side = cfg["input_size"] // self.patch
        self.x_embedder = PatchEmbed(self.patch, self.channels, d.hidden)
        self.t_embedder = TimestepEmbedder(d.hidden)
        self.y_embedder = nn.Embedding(d.vocab + int(cfg["class_dropout_prob"] > 0), d.hidden)
        self.register_buffer("pos_embed", sincos_2d(d.hidden, self.side), persistent=False)
        self.blocks = nn.ModuleList(DiTBlock(d.hidden, d.heads, d.ffn) for _ in range(d.layers))
        self.final_layer = FinalLayer(d.hidden, self.patch, self.out_channels)

    def forward(
        self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None = None
    ) -> torch.Tensor:
        tokens = self.x_embedder(x) + self.pos_embed.to(x.dtype)
        c = self.t_embedder(t) + self.y_embedder(y)
        for block in self.blocks:
            tokens = block(tokens, c)
        out = self.unpatchify(self.final_layer(tokens, c))
        return out if target is None else F.mse_loss(out.float(), target.float())

    def unpatchify(self, tokens: torch.Tensor) -> torch.Tensor:
        """(N, side², p²·C_out) -> (N, C_out, side·p, side·p)."""
        n, p, s, c = tokens.shape[0], self.patch, self.side, self.out_channels
        x = tokens.view(n, s, s, p, p, c).permute(0, 5, 1, 3, 2, 4)
        return x.reshape(n, c, s * p, s * p)


def sincos_2d(hidden: int, side: int) -> torch.Tensor:
    """Fixed 2-D sin-cos position table (1, side², hidden) as in MAE/DiT; half the channels per axis."""
    quarter = hidden // 4
    omega = 1.0 / 10_000 ** (torch.arange(quarter, dtype=torch.float64) / quarter)
    grid = torch.arange(side, dtype=torch.float64)
    rows, cols = torch.meshgrid(grid, grid, indexing="ij")
    parts = []
    for axis in (cols, rows):
        angles = axis.reshape(-1, 1) * omega
        parts += [torch.sin(angles), torch.cos(angles)]
    table = torch.cat(parts, dim=1)
    return F.pad(table, (0, hidden - table.shape[1])).float()[None]


def build(spec: ModelSpec) -> nn.Module:
    """The toy model of ``spec.family``: "gpt2" -> GPT, "dit" -> DiT."""
    kinds = {"gpt2": GPT, "dit": DiT}
    if spec.family not in kinds:
        raise ValueError(
            f"model: no toy model for family {spec.family!r}; choose a spec of family gpt2 or dit"
        )
    return kinds[spec.family](spec)
