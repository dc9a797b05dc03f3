"""A configuration's label (``Setup.label``: ``z3 opt-off bf16 mb8 gas16 ckpt hpz8``) and what its words mean.

``of`` spells a Setup's label; ``TOKENS`` declares each kind of token once, as a pattern and what it
means, in a label's order; ``parts`` splits a label (or a line that holds one, such as a plan's ``MI300X
1x8 z1 bf16 mb4``) into its tokens, each with its meaning ("" for a word that is no token: a GPU, a
cluster shape); ``Setup.label_parts`` is ``parts(label)`` and
``label_legend`` explains the tokens some labels use, for the panels and the notebooks. What is counted
per process says "rank" (a GPU, or a CPU process where the ranks run on CPU), so the same legend reads
true beside a plan's GPUs and beside a sweep on CPU ranks; the labels themselves do not change.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from kit import checkpointing, trainable
from kit import loss as losses
from kit import sequence_parallel as ulysses
from kit.rules import Offload, baseline_name


def of(setup: Any) -> str:
    """``setup``'s label (a ``kit.schema.Setup``), its tokens in ``TOKENS``' order."""
    z, b = setup.zero, setup.batch
    parts = [baseline_name(z.engine, z.stage) or f"z{z.stage}"]
    if z.offload_optimizer is not Offload.NONE:
        parts.append("opt-off" if z.offload_optimizer is Offload.CPU else "opt-nvme")
    if z.offload_param is not Offload.NONE:
        parts.append("param-off" if z.offload_param is Offload.CPU else "param-nvme")
    parts += z.zeropp_label.split()
    parts += [z.precision, f"mb{b.micro_batch}"]
    parts += [f"gas{b.grad_accum}"] if b.grad_accum > 1 else []
    parts += [f"tok{b.max_tokens}"] if b.max_tokens else []
    parts += [f"tgt{b.target_len}"] if b.target_len else []
    if b.schedule:
        last = b.schedule[-1]
        parts.append(f"-> mb{last.micro_batch} gas{last.grad_accum} @{last.step}")
    parts += [checkpointing.label(z)] if z.activation_checkpointing else []
    parts += [trainable.label(z)] if trainable.is_subset(z) else []
    parts += [losses.label(z.loss)] if z.loss != "plain" else []
    parts += [ulysses.label(z.sequence_parallel_size)] if z.sequence_parallel_size > 1 else []
    parts += ["xseg"] if z.expandable_segments else []
    return " ".join(parts)


def _lora(m: re.Match) -> str:
    where = "peft's default modules for the model type"
    if m[2] or m[4]:
        where = "every linear layer but the head" if m[2] else m[4].replace(",", ", ")
    dropout = f", dropout {m[3]} on each adapter's input" if m[3] else ""
    return f"LoRA adapters of rank {m[1]} (peft) on {where}{dropout}; the rest is frozen"


def _ckpt(m: re.Match) -> str:
    every, policy = int(m[4] or 1), "selective-op" if m[1] else "full"
    return "activation checkpointing: " + checkpointing.describe(every, policy, bool(m[3]), bool(m[2]))


#: each kind of label token, in a label's order: (pattern of the whole token, what a match means)
TOKENS: tuple[tuple[str, Callable[[re.Match], str]], ...] = (
    (r"z([0-3])", lambda m: f"ZeRO stage {m[1]}"),
    (r"ddp", lambda m: "PyTorch DDP: every rank holds every state (as ZeRO stage 0)"),
    (r"fsdp-grad-op", lambda m: "PyTorch FSDP2, parameters kept after forward (as ZeRO stage 2)"),
    (r"fsdp", lambda m: "PyTorch FSDP2 fully_shard: every state sharded (as ZeRO stage 3)"),
    (r"opt-off", lambda m: "optimizer states offloaded to the CPU"),
    (r"opt-nvme", lambda m: "optimizer states offloaded to NVMe (ZeRO-Infinity)"),
    (r"param-off", lambda m: "parameters offloaded to the CPU"),
    (r"param-nvme", lambda m: "parameters offloaded to NVMe (ZeRO-Infinity)"),
    (r"hpz(\d+)", lambda m: f"ZeRO++ hpZ over {m[1]} ranks: a second parameter copy gathered within them"),
    (r"qwz", lambda m: "ZeRO++ qwZ: weights all-gathered in int8"),
    (r"qgz", lambda m: "ZeRO++ qgZ: gradients reduced in int4"),
    (r"fp32", lambda m: "fp32 weights and compute"),
    (r"(bf16|fp16)", lambda m: f"{m[1]} mixed precision (an fp32 master copy)"),
    (r"mb(\d+)", lambda m: f"micro batch {m[1]} per rank (GPU or CPU process)"),
    (r"gas(\d+)", lambda m: f"{m[1]} gradient accumulation steps"),
    (r"tok(\d+)", lambda m: f"micro batches packed to at most {int(m[1]):,} tokens"),
    (r"tgt(\d+)", lambda m: f"{m[1]} decoder tokens per sample (an encoder-decoder model's targets)"),
    (
        r"-> mb(\d+) gas(\d+) @(\d+)",
        lambda m: f"batch schedule: micro batch {m[1]}, {m[2]} accumulation steps from step {m[3]}",
    ),
    (r"ckpt(-op)?(-part)?(-cpu)?(?:/(\d+))?", _ckpt),
    (r"lora(\d+)(-all)?(?:-d(\d*\.?\d+))?(?: (?!qlora|frz|flce|cce|sp\d|xseg)(\S+))?", _lora),
    (r"qlora", lambda m: "QLoRA: the frozen base weights in 4-bit NF4 (bitsandbytes), the adapters 16-bit"),
    (r"frz-emb", lambda m: "input embeddings frozen"),
    (r"frz(\d+)", lambda m: f"the first {m[1]} blocks frozen"),
    (r"flce", lambda m: "chunked loss: a fused linear cross-entropy (Liger's algorithm)"),
    (r"cce", lambda m: "Cut Cross-Entropy loss: no logits in memory (Apple's ml-cross-entropy)"),
    (r"sp(\d+)", lambda m: f"Ulysses sequence parallelism: each sequence split over {m[1]} ranks"),
    (r"xseg", lambda m: "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: the allocator grows its segments"),
)
_COMPILED = [(re.compile(pattern + r"(?=\s|$)"), meaning) for pattern, meaning in TOKENS]


def parts(label: str) -> list[tuple[str, str]]:
    """``label``'s tokens, each with what it means: ``[("z3", "ZeRO stage 3"), ("bf16", ...), ...]``; a
    word that is no token (a GPU's name) comes with ""; the tokens joined by spaces give ``label`` back."""
    return [(token, meaning) for _, token, meaning in _scan(label)]


def label_legend(items: Iterable[Any]) -> dict[str, str]:
    """What each token of some labels means, only those that appear: ``{"z3": "ZeRO stage 3", "mb8":
    "micro batch 8 per rank (GPU or CPU process)", ...}``, in ``TOKENS``' order (``mb2`` before
    ``mb16``). ``items``: labels (strings, a plan's rows too) or Setups. In a notebook:
    ``label_legend(panel.setups)``, ``label_legend(results.summary().label)``,
    ``label_legend(plan.table.label)``."""
    seen: dict[str, tuple[int, str]] = {}
    for item in items:
        for kind, token, meaning in _scan(item if isinstance(item, str) else item.label):
            if meaning:
                seen.setdefault(token, (kind, meaning))

    def order(token: str) -> tuple:
        numbers = [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", token)]
        return seen[token][0], numbers

    return {token: seen[token][1] for token in sorted(seen, key=order)}


def _scan(label: str) -> list[tuple[int, str, str]]:
    """(kind: its index in ``TOKENS``, -1 for a word that is no token; token; meaning) along ``label``."""
    out: list[tuple[int, str, str]] = []
    words = label.split()
    i = 0
    while i < len(words):
        rest = " ".join(words[i:])
        found = next(
            ((kind, m, meaning) for kind, (p, meaning) in enumerate(_COMPILED) if (m := p.match(rest))),
            None,
        )
        if found:
            kind, match, meaning = found
            out.append((kind, match[0], meaning(match)))
            i += len(match[0].split())
        else:
            out.append((-1, words[i], ""))
            i += 1
    return out
