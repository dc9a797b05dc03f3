"""A trainable subset applied to a built model: LoRA through peft, or frozen groups. Imports torch.

``apply(model, zero)`` is what a rank does to the model it built, before ``deepspeed.initialize``; the
estimate calls ``listing(spec, zero)``, which builds the same model on the meta device (nothing allocated)
and applies the same function, so both see the same tensors in the same order, and peft's own count
(``print_trainable_parameters``) is the listing's.

What it cannot see: a model whose blocks are neither the ``model.layers.N`` of Hugging Face's decoders nor the
``transformer.h.N`` of GPT-2's (``Listing.blocks`` is then empty and ``kit.trainable.model_problem`` refuses
the setting first).
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from functools import lru_cache
from typing import cast

from kit import trainable
from kit.schema import ModelSpec

#: a decoder block's projection or norm in a parameter's name: (block index, part)
_PART = re.compile(
    r"layers\.(\d+)\.(?:self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj|(input_layernorm|post_attention_layernorm))\."
)
_NORMS = {"input_layernorm": "norm1", "post_attention_layernorm": "norm2"}
#: the same in GPT-2's names (the kit's GPT): its fused c_attn is q, k and v, its MLP up and down
_GPT2_PART = re.compile(r"\bh\.(\d+)\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj|ln_1|ln_2)\.")
_GPT2_PARTS = {
    "attn.c_attn": ("q", "k", "v"), "attn.c_proj": ("o",), "mlp.c_fc": ("up",), "mlp.c_proj": ("down",),
    "ln_1": ("norm1",), "ln_2": ("norm2",),
}  # fmt: skip


def apply(model, zero):
    """``model`` with ``zero``'s subset (a ``ZeroSettings``): peft's LoRA model, or ``model`` with its frozen
    groups' ``requires_grad`` off. Every parameter trains when ``zero`` sets no subset."""
    if zero.lora_rank:
        from peft import LoraConfig, get_peft_model
        from peft.utils.error import NoMatchingPeftModuleError

        targets = zero.lora_targets
        modules = trainable.ALL_LINEAR if targets == (trainable.ALL_LINEAR,) else (list(targets) or None)
        exclude, gpt = None, _hf_projections(model)
        if gpt:  # the kit's GPT has no Hugging Face config: its model type's default targets, its head here
            from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

            modules = modules or DEFAULTS["gpt2"]
            exclude = ["lm_head"] if modules == trainable.ALL_LINEAR else None
        config = LoraConfig(
            r=zero.lora_rank,
            lora_alpha=2 * zero.lora_rank,
            target_modules=modules,
            exclude_modules=exclude,
            fan_in_fan_out=gpt,  # Conv1D's (in, out) weight
            lora_dropout=zero.lora_dropout,
            bias="none",
        )
        layers = _linear_names(model)
        # adapters in the model's dtype (peft would upcast 16-bit ones to fp32; DeepSpeed casts them back)
        try:
            with warnings.catch_warnings():  # peft reads transformers' deprecated flags
                warnings.simplefilter("ignore", FutureWarning)
                model = get_peft_model(model, config, autocast_adapter_dtype=False)
        except NoMatchingPeftModuleError as error:
            what = (
                f"{list(targets)} name no layer of the model"
                if targets
                else "peft found no default in the model"
            )
            raise ValueError(
                f"lora_targets: {what}; its linear layers: {', '.join(layers)} (or {trainable.ALL_LINEAR!r})"
            ) from error
        except ValueError as error:  # e.g. a mixture of experts' expert weights take no dropout in peft
            raise ValueError(f"lora_rank: peft cannot build these adapters on the model: {error}") from error
        if zero.lora_dropout:
            _native_dropout(model)
        if zero.qlora:  # the base weights in 4-bit NF4 (bitsandbytes' format in plain PyTorch)
            from kit.workloads import nf4

            nf4.quantize(model)
        return model
    from kit.workloads import blocks

    frozen = list(blocks(model)[: zero.frozen_blocks])
    if zero.freeze_embeddings:
        frozen.append(model.get_input_embeddings())
    for module in frozen:
        module.requires_grad_(False)
    return model


def _linear_names(model) -> list[str]:
    """The names peft's ``target_modules`` may give of ``model``'s linear layers (their last part), head
    included, in order."""
    import torch
    from transformers.pytorch_utils import Conv1D

    linear = [name for name, module in model.named_modules() if isinstance(module, (torch.nn.Linear, Conv1D))]
    return list(dict.fromkeys(name.rsplit(".", 1)[-1] for name in linear))


def _hf_projections(model) -> bool:
    """The ``Conv1D``s of the kit's GPT (``kit.workloads.toymodels``) made transformers' own class, which
    peft adapts (the same parameters, attributes and ``x @ W + b``); whether ``model`` is that GPT."""
    from transformers.pytorch_utils import Conv1D

    from kit.workloads import toymodels

    if not isinstance(model, toymodels.GPT):
        return False
    for module in model.modules():
        if isinstance(module, toymodels.Conv1D):
            module.__class__ = cast(type, Conv1D)  # a class of the same attributes: Python allows the swap
    return True


def _native_dropout(model) -> None:
    """Each adapter's dropout (peft's ``nn.Dropout``) run as ``torch.native_dropout``, the kernel
    ``F.dropout`` dispatches to on a GPU (ATen's ``dropout``: ``is_fused_kernel_acceptable``), which saves
    a bool mask for backward. On CPU ``F.dropout`` multiplies by a noise tensor of the input's dtype
    instead (a mask 2-4 times a GPU's): with this, CPU ranks run and measure what a GPU does."""
    import torch

    class NativeDropout(torch.nn.Dropout):
        def forward(self, x):
            return torch.native_dropout(x, self.p, True)[0] if self.training else x

    for module in list(model.modules()):
        dropouts = getattr(module, "lora_dropout", None)
        if isinstance(dropouts, torch.nn.ModuleDict):
            for name, dropout in dropouts.items():
                if isinstance(dropout, torch.nn.Dropout):
                    dropouts[name] = NativeDropout(dropout.p)


@dataclass(frozen=True)
class Block:
    """One decoder block's parts (``q k v o gate up down norm1 norm2``) whose base weights train, its
    projections with LoRA adapters, and its trainable elements."""

    trains: frozenset[str]
    adapted: frozenset[str]
    params: int


@dataclass(frozen=True)
class Listing:
    """Every parameter tensor of the model with its subset, in ``model.parameters()`` order (tied ones once):
    ``(numel, trains)``; each block's ``Block``; whether the input embeddings train; which of the head's
    ``norm`` and ``lm_head`` train; with QLoRA, the elements of each 4-bit weight (whose tensor in
    ``tensors`` is its packed storage, ``kit.workloads.nf4``)."""

    tensors: tuple[tuple[int, bool], ...]
    blocks: tuple[Block, ...]
    embeddings: bool
    head: frozenset[str]
    quantized: tuple[int, ...] = ()
    #: whether GPT-2's learned position embeddings train (they feed the residual stream: a gradient from the
    #: first block on); False for a model without them
    positions: bool = False

    @property
    def inputs_need_grad(self) -> bool:
        """Whether the blocks' input needs a gradient without checkpointing: an embedding trains (the input
        embeddings, or GPT-2's positions)."""
        return self.embeddings or self.positions

    @property
    def trainable(self) -> int:
        return sum(n for n, trains in self.tensors if trains)

    @property
    def total(self) -> int:
        return sum(n for n, _ in self.tensors)


def listing(spec: ModelSpec, zero) -> Listing:
    """The ``Listing`` of ``spec`` trained with ``zero``'s subset (cached per model and subset)."""
    return _listing(spec, trainable.key(zero), zero)


@lru_cache(maxsize=64)
def _listing(spec: ModelSpec, key: tuple, zero) -> Listing:
    import torch

    from kit import workloads
    from kit.workloads import nf4

    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' and peft's deprecation notices: not the user's
        model = apply(workloads.for_model(spec).build(), zero)
    layers = spec.layers or 0
    trains: list[set[str]] = [set() for _ in range(layers)]
    adapted: list[set[str]] = [set() for _ in range(layers)]
    counts = [0] * layers
    tensors, head, embeddings = [], set(), True
    embedding = {id(p) for p in model.get_input_embeddings().parameters()}
    output = model.get_output_embeddings()  # the head's weight, the embedding's own when they are tied
    if output is not None and output.weight.requires_grad:
        head.add("lm_head")
    positions = False
    for name, p in model.named_parameters():
        tensors.append((p.numel(), p.requires_grad))
        found, gpt2 = _PART.search(name), _GPT2_PART.search(name)
        parts: tuple[str, ...] = ()
        if found:
            part = next(g for g in found.groups()[1:] if g)
            block, parts = int(found.group(1)), (_NORMS.get(part, part),)
        elif gpt2:
            block, parts = int(gpt2.group(1)), _GPT2_PARTS[gpt2.group(2)]
        if parts:
            counts[block] += p.numel() if p.requires_grad else 0
            if ".lora_" in name:
                adapted[block].update(parts)
            elif p.requires_grad:
                trains[block].update(parts)
        elif id(p) in embedding:
            embeddings = p.requires_grad
        elif name.endswith("wpe.weight"):
            positions = p.requires_grad
        elif p.requires_grad and (output is None or p is not output.weight):
            head.add("norm")
    return Listing(
        tuple(tensors),
        tuple(Block(frozenset(t), frozenset(a), n) for t, a, n in zip(trains, adapted, counts, strict=True)),
        embeddings,
        frozenset(head),
        tuple(m.state.shape.numel() for m in model.modules() if isinstance(m, nf4.Linear4bit)),
        positions,
    )
