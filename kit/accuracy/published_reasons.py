"""Why a published row cannot be expressed, read from its text alone (no Setup needed, so step-time rows
ask it too): the first thing its run does that the kit does not model (``feature_reason``).
"""

from __future__ import annotations

import re
from typing import Any

#: other parallelism a row names -> what it is called
PARALLELISM = {"TP": "tensor", "PP": "pipeline", "CP": "context", "SP": "sequence"}


def feature_reason(row: dict[str, Any]) -> str | None:
    """The first thing a row's run does that the kit does not model, read from its text alone (no Setup
    needed, so step-time rows ask it too): other parallelism, Float8, torch.compile, FSDP1, frozen parts
    other than the embeddings. A model's head (a sequence classifier's) and an encoder-decoder's source and
    target lengths are expressed (``kit.hf_models.head``, ``Batch.target_len``)."""
    other = row.get("other_parallelism") or ""
    degrees = {k: int(n) for k, n in re.findall(r"\b(TP|PP|CP|SP)\s*=\s*(\d+)", other) if int(n) > 1}
    if degrees:
        names = [PARALLELISM[k] for k in degrees]
        what = " and ".join(names) if len(names) < 3 else ", ".join(names[:-1]) + " and " + names[-1]
        return f"{what} parallelism ({', '.join(f'{k}={n}' for k, n in degrees.items())})"
    text = f"{row.get('precision') or ''}; {row.get('extras') or ''}"
    if _mentions(text, "float8", "fp8"):
        return "Float8 linears"
    if _mentions(row.get("extras"), "compile"):
        return "torch.compile"
    if row["table"] == "memory" and fsdp1(row):
        return "FSDP1 flat parameters"
    extras = row.get("extras") or ""
    others = ", ".join(p for p in re.split(r"[,;+]", extras) if "embed" not in p)  # embeddings: kit.trainable
    if _mentions(others, "frozen", "freeze"):
        return "frozen parameters"
    return None


def fsdp1(row: dict[str, Any]) -> bool:
    """Whether a row ran PyTorch's FSDP1 (flat parameters: its memory is not FSDP2's; its step sends the
    same bytes in the same per-unit calls, so step-time rows take it as FSDP2's)."""
    sharded = re.search(r"FULL_SHARD|SHARD_GRAD_OP|HYBRID_SHARD", row.get("sharding") or "")
    return "FSDP1" in row["framework"] or bool(sharded and "FSDP2" not in row["framework"])


def _mentions(text: str | None, *words: str) -> bool:
    """Whether ``text`` names one of ``words`` outside a negation ("no torch.compile, no Float8")."""
    for part in re.split(r"[,;+]", (text or "").lower()):
        part = part.strip()
        if not part.startswith(("no ", "without ")) and any(w in part for w in words):
            return True
    return False
