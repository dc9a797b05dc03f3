"""QLoRA's 4-bit base weights in plain PyTorch: bitsandbytes' ``Linear4bit`` on CPU ranks. Imports torch.

bitsandbytes needs CUDA, so the kit models QLoRA from its algorithm (``kit.trainable.nf4_bytes``) and
measures it through this equivalent, read from bitsandbytes 0.50.1 (``functional.quantize_4bit``,
``quantize_blockwise``, ``dequantize_4bit``, ``autograd._functions.MatMul4Bit``, ``nn.Linear4bit``) and
written anew: NF4 codes of blocks of 64 elements scaled by their absmax, two per byte (the first in the
high nibble), the bytes viewed as bf16 (``bnb_4bit_quant_storage``); the absmax quantized again
(``compress_statistics``): less its mean (``offset``), to uint8 codes of bitsandbytes' dynamic map in
blocks of 256 with one fp32 absmax each. ``MatMul4Bit`` dequantizes the weight to the compute dtype in
forward and again in backward for the input's gradient, saving only the packed weight (never its input);
the weight gets no gradient.

``quantize(model)`` swaps every ``nn.Linear`` but the output head for a ``Linear4bit``, as transformers'
``replace_with_bnb_linear`` does (its ``get_keys_to_not_convert`` keeps the output embeddings 16-bit);
on the meta device it only lays out the tensors (``kit.workloads.adapters.listing``).

What it cannot see: bitsandbytes' CUDA kernels' own scratch (its fused ``gemm_4bit`` for at most 1,536
rows; past that, the dequantize + ``F.linear`` fallback this module follows), FP4, 8-bit LoRA, peft's
defensive ``result.clone()`` in its ``bnb.Linear4bit`` LoRA layer (this module sits under peft's plain
``lora.Linear``).
"""

from __future__ import annotations

from typing import Any, cast

import torch

from kit.trainable import DEQUANTIZE_CHUNK, NESTED_BLOCK, NF4_BLOCK

#: the 16 NF4 values: bitsandbytes ``functional.get_4bit_type("nf4")`` (``create_normal_map(offset=
#: 0.9677083, use_extra_value=True)``), the QLoRA paper's Appendix E (Dettmers et al., 2023,
#: arXiv:2305.14314)
NF4 = (
    -1.0,
    -0.6961928009986877,
    -0.5250730514526367,
    -0.39491748809814453,
    -0.28444138169288635,
    -0.18477343022823334,
    -0.09105003625154495,
    0.0,
    0.07958029955625534,
    0.16093020141124725,
    0.24611230194568634,
    0.33791524171829224,
    0.44070982933044434,
    0.5626170039176941,
    0.7229568362236023,
    1.0,
)


def dynamic_map() -> torch.Tensor:
    """bitsandbytes' signed 8-bit dynamic map (``create_dynamic_map(signed=True, max_exponent_bits=7)``):
    for exponent i of 0..6, 2^i fractions (the midpoints of ``linspace(0.1, 1, 2^i + 1)``) times 10^(i-6),
    each with its negative, then 0 and 1: 256 sorted fp32 values."""
    values: list[float] = [0.0, 1.0]
    for i in range(7):
        edges = torch.linspace(0.1, 1, 2**i + 1, dtype=torch.float32)
        means = ((10 ** (i - 6)) * ((edges[:-1] + edges[1:]) / 2.0)).tolist()
        values += means + [-m for m in means]
    return torch.tensor(sorted(values), dtype=torch.float32)


def _blockwise(values: torch.Tensor, code: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``values`` (flat fp32) as the indices of their nearest ``code`` value (sorted) after dividing each
    block by its absmax, and the absmax per block."""
    blocks = -(-values.numel() // block)
    padded = torch.nn.functional.pad(values, (0, blocks * block - values.numel())).view(blocks, block)
    absmax = padded.abs().amax(dim=1)
    scaled = (padded / absmax.clamp(min=1e-38)[:, None]).clamp(-1, 1).reshape(-1)[: values.numel()]
    return torch.bucketize(scaled, (code[:-1] + code[1:]) / 2).to(torch.uint8), absmax


class QuantState(torch.nn.Module):
    """What bitsandbytes' ``QuantState`` holds for one weight (non-persistent buffers, so ``.to`` moves
    them and no state dict saves them): the uint8 absmax codes, their fp32 scales per 256, the offset, the
    NF4 table and the dynamic map (each weight its own, as bitsandbytes makes them)."""

    absmax: torch.Tensor
    scales: torch.Tensor
    offset: torch.Tensor
    code: torch.Tensor
    nested_code: torch.Tensor

    def __init__(self, shape: torch.Size, device=None):
        super().__init__()
        self.shape = shape
        blocks = -(-shape.numel() // NF4_BLOCK)
        tables: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
            "absmax": ((blocks,), torch.uint8),
            "scales": ((-(-blocks // NESTED_BLOCK),), torch.float32),
            "offset": ((), torch.float32),
            "code": ((len(NF4),), torch.float32),
            "nested_code": ((256,), torch.float32),
        }
        for name, (size, dtype) in tables.items():
            self.register_buffer(name, torch.empty(size, dtype=dtype, device=device), persistent=False)

    def fill(self, absmax: torch.Tensor) -> None:
        """Quantizes the fp32 ``absmax`` per 64-block into this state (``compress_statistics``)."""
        self.code.copy_(torch.tensor(NF4))
        self.nested_code.copy_(dynamic_map())
        self.offset.copy_(absmax.mean())
        codes, scales = _blockwise(absmax - self.offset, self.nested_code, NESTED_BLOCK)
        self.absmax.copy_(codes)
        self.scales.copy_(scales)

    def block_absmax(self) -> torch.Tensor:
        """The fp32 absmax per 64-block (``dequantize_blockwise`` + offset): a transient of the weight's
        blocks."""
        values = _scaled(self.nested_code, self.absmax, self.scales, NESTED_BLOCK)
        return values.add_(self.offset)


def _scaled(code: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, block: int) -> torch.Tensor:
    """fp32 ``code[codes]`` (``codes``: uint8), each block of ``block`` scaled by its ``scales`` entry, in
    place: beside ``codes`` at most 8 B an element live at once (the int32 indices and the values, then the
    values and their scales; ``index_select`` takes int32 indices as they are, ``code[codes]`` would copy
    them to int64)."""
    values = torch.index_select(code, 0, codes.to(torch.int32))
    return values.mul_(scales.repeat_interleave(block)[: values.numel()])


def dequantize(packed: torch.Tensor, state: QuantState, dtype: torch.dtype) -> torch.Tensor:
    """The weight in ``dtype`` from its packed bytes (``dequantize_4bit``), written ``DEQUANTIZE_CHUNK``
    elements at a time into it, as bitsandbytes' kernel writes its output: beside the weight and its
    block absmax the scratch is a chunk's uint8 codes and ``_scaled``'s 8 B an element, 9 B x the chunk."""
    n = state.shape.numel()
    scale = state.block_absmax()
    out = torch.empty(n, dtype=dtype, device=packed.device)
    nibbles = packed.view(torch.uint8).reshape(-1)
    for start in range(0, n, DEQUANTIZE_CHUNK):
        stop = min(n, start + DEQUANTIZE_CHUNK)
        pairs = nibbles[start // 2 : (stop + 1) // 2]
        codes = torch.stack((pairs >> 4, pairs & 0xF), dim=1).view(-1)[: stop - start]
        blocks = scale[start // NF4_BLOCK : -(-stop // NF4_BLOCK)]
        out[start:stop].copy_(_scaled(state.code, codes, blocks, NF4_BLOCK))
    return out.view(state.shape)


class MatMul4Bit(torch.autograd.Function):
    """``x @ W.T`` with ``W`` dequantized in forward and again in backward; saves the packed weight only."""

    @staticmethod
    def forward(ctx, x, packed, state, bias):
        ctx.state = state
        ctx.save_for_backward(packed)
        return torch.nn.functional.linear(x, dequantize(packed, state, x.dtype), bias)

    @staticmethod
    def backward(ctx, grad):
        (packed,) = ctx.saved_tensors
        grad_x = grad @ dequantize(packed, ctx.state, grad.dtype) if ctx.needs_input_grad[0] else None
        return grad_x, None, None, None


class Linear4bit(torch.nn.Module):
    """An ``nn.Linear``'s weight in NF4 (``packed``: a frozen bf16 parameter of ``(numel + 1) // 4``
    elements, shape ``(-1, 1)`` as bitsandbytes stores it) with its ``QuantState``; the bias stays. A GPT-2
    ``Conv1D`` (``nx`` in, ``nf`` out, its weight stored (in, out)) is quantized transposed, as transformers'
    bitsandbytes integration quantizes GPT-2's: the same ``x @ W + b``."""

    def __init__(self, linear: torch.nn.Module):
        super().__init__()
        stored = cast(torch.Tensor, linear.weight)
        weight, device = stored.detach(), stored.device
        if hasattr(linear, "nf"):  # a Conv1D
            weight = weight.t()
            self.in_features, self.out_features = linear.nx, linear.nf
        else:
            self.in_features, self.out_features = linear.in_features, linear.out_features
        storage = torch.empty(((weight.numel() + 1) // 4, 1), dtype=torch.bfloat16, device=device)
        self.state = QuantState(weight.shape, device)
        if device.type != "meta":
            codes, absmax = _blockwise(weight.float().reshape(-1), torch.tensor(NF4), NF4_BLOCK)
            codes = torch.nn.functional.pad(codes, (0, 4 * storage.numel() - codes.numel()))
            storage.view(torch.uint8).copy_(((codes[::2] << 4) | codes[1::2]).view(-1, 2))
            self.state.fill(absmax)
        self.weight = torch.nn.Parameter(storage, requires_grad=False)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return MatMul4Bit.apply(x, self.weight, self.state, self.bias)


def quantize(model: Any) -> Any:
    """``model`` with every ``nn.Linear`` (and GPT-2 ``Conv1D``) but its output head and peft's adapters
    (``lora_A``, ``lora_B``) replaced by a ``Linear4bit`` (in place); after ``get_peft_model``, each adapted
    layer's ``base_layer`` (transformers quantizes before peft wraps: the same modules in the same order).
    ``model``: a Hugging Face model or the kit's GPT, or peft's around one."""
    from transformers.pytorch_utils import Conv1D

    head = model.get_output_embeddings()
    for path, parent in list(model.named_modules()):
        if ".lora_" in f".{path}":
            continue
        for name, child in list(parent.named_children()):
            linear = isinstance(child, (torch.nn.Linear, Conv1D))
            if linear and child is not head and not name.startswith("lora_"):
                setattr(parent, name, Linear4bit(child))
    return model


def stored_bytes(model: torch.nn.Module) -> tuple[int, int]:
    """(packed, quant state) bytes of ``model``'s ``Linear4bit`` layers as built."""
    layers = [m for m in model.modules() if isinstance(m, Linear4bit)]
    packed = sum(m.weight.numel() * m.weight.element_size() for m in layers)
    state = sum(b.numel() * b.element_size() for m in layers for b in m.state.buffers())
    return packed, state
