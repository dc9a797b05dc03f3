"""What DeepSpeed refuses in a ds_config (errors, with the fix), and what it ignores or warns about.

DeepSpeed's own parser reads the config (``kit.ds_config.deepspeed_refusals``: every refusal, plus the
checks it makes only when the engine starts); unknown top-level keys, which DeepSpeed ignores silently,
and its deprecation warnings become warnings. A feature DeepSpeed runs but zero-kit does not model
(tensor, sequence or pipeline parallelism, DeepCompile: ``kit.ds_config.reader.unmodelled``) is an
error too, listed first: no estimate covers the config.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from kit.batch import nearest_valid
from kit.ds_config import deepspeed_refusals, known_keys
from kit.ds_config.reader import UNMODELLED, resolved_for_deepspeed, unmodelled
from kit.ds_keys import BATCH_KEYS
from kit.fit import supports
from kit.review.context import Finding
from kit.rules import NCCL_ALIGNMENT
from kit.schema import Cluster, Setup


def refusal_findings(
    raw: dict, setup: Setup | None, cluster: Cluster, flags: dict, notes: list[str]
) -> list[Finding]:
    world = cluster.world_size
    config = resolved_for_deepspeed(raw, setup, flags)
    findings = _unmodelled(raw)  # first: the line `zerokit estimate --ds-config` refuses with
    try:
        refused, warned = deepspeed_refusals(config, world)
    except ImportError:
        notes.append("DeepSpeed is not installed: its own parser did not check this config")
        return findings
    for r in refused:
        if r.kind == "unknown":
            message = f"{r.message}: DeepSpeed does not know this key and refuses the config"
        elif r.kind == "engine":
            message = f"{r.message} (DeepSpeed asserts this when the engine starts)"
        else:
            message = f"{r.message} (DeepSpeed's config parser refuses it)"
        findings.append(Finding(r.key, "error", message, _fix(r, config, cluster)))
    for key in raw:
        if _known("") and key not in _known(""):
            findings.append(_ignored_top_level(key))
    for line in warned:
        findings.append(_deprecated(line, raw))
    return findings


def _unmodelled(raw: dict) -> list[Finding]:
    """An error per feature the config turns on that zero-kit does not model (``reader.UNMODELLED``):
    DeepSpeed accepts it, but no estimate of the kit covers it."""
    found = unmodelled(raw, quiet=True)  # a value DeepSpeed cannot read: the reader's note says it
    off = {f.key: f.off for f in UNMODELLED}
    return [
        Finding(
            key, "error", line,
            f"zero-kit cannot estimate this run; with {key.split('.')[-1]} {off[key]} it estimates ZeRO's "
            "data parallelism alone",
        )
        for key, line in found
    ]  # fmt: skip


def _fix(r, config: dict, cluster: Cluster) -> str:
    """What to change for one refusal."""
    *section, leaf = r.key.split(".")
    if r.kind == "unknown":
        known = _known(".".join(section)) or ()
        return _nearest(leaf, known, where=".".join(section))
    if r.key == "zero_optimization.allgather_bucket_size":
        value = config["zero_optimization"]["allgather_bucket_size"]
        lower = int(value) - int(value) % NCCL_ALIGNMENT
        return (
            f"set it to a multiple of nccl_start_alignment_factor {NCCL_ALIGNMENT}: "
            f"{lower + NCCL_ALIGNMENT:,} (or {lower:,}); stages 1-2 check it in "
            "DeepSpeedZeroOptimizer.__init__ (stage_1_and_2.py)"
        )
    if r.key == "optimizer.type":
        return 'add "zero_allow_untested_optimizer": true, or use Adam/AdamW, which ZeRO supports'
    if r.key == "bf16.enabled":
        has = supports(cluster.gpu, "bf16")
        why = f"the {cluster.gpu} {'supports' if has else 'lacks'} bf16"
        return (
            f"enable one of them, {'bf16' if has else 'fp16'} ({why}), and set the other's enabled to false"
        )
    if r.key in BATCH_KEYS:
        train, micro = config.get("train_batch_size"), config.get("train_micro_batch_size_per_gpu")
        try:
            if isinstance(train, int) and train > 0:
                micro = micro if isinstance(micro, int) and micro > 0 else None
                return f"{nearest_valid(train, cluster.world_size, micro)} on {cluster.world_size} GPUs"
        except ValueError:
            pass
        return (
            "give train_micro_batch_size_per_gpu (and gradient_accumulation_steps), or a train_batch_size "
            f"that is micro x {cluster.world_size} GPUs x grad_accum"
        )
    if "removed" in r.message or "no longer supported" in r.message:
        return "remove it"
    return "use a value DeepSpeed accepts, or remove the key for DeepSpeed's default"


def _ignored_top_level(key: str) -> Finding:
    message = (
        f"{key}: not a key DeepSpeed reads; DeepSpeedConfig ignores unknown top-level keys silently, so this "
        "setting does nothing"
    )
    zero = _known("zero_optimization") or ()
    if key in zero:
        suggestion = "move it into zero_optimization (a zero_optimization key at the top level is ignored)"
    else:
        suggestion = _nearest(key, _known("") or (), where="")
    return Finding(key, "warning", message, suggestion)


def _deprecated(line: str, raw: dict) -> Finding:
    """A DeepSpeed warning logged while parsing (deprecated keys), keyed where the key is."""
    name = re.search(r"Config parameter (\w+) is deprecated", line)
    key = (
        _find_key(raw, name.group(1))
        if name
        else "zero_optimization"
        if "ZeRO optimization" in line
        else None
    )
    new = re.search(r"use (\S+) instead", line)
    suggestion = f"use {new.group(1)} instead" if new else "follow DeepSpeed's warning"
    return Finding(
        key or "ds_config", "warning", f"{key or 'ds_config'}: DeepSpeed warns: {line}", suggestion
    )


def _find_key(config: Any, name: str, prefix: str = "") -> str | None:
    if not isinstance(config, dict):
        return None
    if name in config:
        return prefix + name
    for key, value in config.items():
        found = _find_key(value, name, f"{prefix}{key}.")
        if found:
            return found
    return None


def _nearest(key: str, known, where: str) -> str:
    match = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    if match:
        return f"rename it to '{match[0]}', the nearest key DeepSpeed knows" + (
            f" in {where}" if where else ""
        )
    return f"remove it: DeepSpeed knows no key like it{' in ' + where if where else ''}"


def _known(section: str):
    try:
        return known_keys(section)
    except ImportError:
        return None
