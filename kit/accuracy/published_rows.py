"""A published row as the kit describes it (``express``): the Setup of its run, or the one reason the kit
cannot describe it, a phrase a user understands ("tensor parallelism (TP=8)", "torch.compile"), so the kit
never puts a number beside a run it cannot describe (``kit.accuracy.published`` compares what it can).

How a row maps: DeepSpeed ZeRO stage N -> stage N ("ZeRO disabled": stage 0, DeepSpeed's fp16 optimizer);
PyTorch DDP -> engine ``ddp``; FSDP2 full shard -> ``fsdp`` (``kit.rules.BASELINES``); the GPU by type and
memory (``GPUS``: a V100-SXM3 32 GB has the V100-SXM2-32GB's memory); the model by name (``MODELS``: a
preset, or ``data/published/models/*.json`` for Megatron's GPTs, whose vocabulary Megatron pads to a
multiple of 128); bucket sizes, overlap and ZeRO++ from ``buckets``; a run whose script pads each batch to
its longest sample (``LONGEST``) has only a maximum length (``Expressed.padded``). Knobs a row does not
give take the kit's defaults, DeepSpeed 0.19's, though several runs used older versions.

What it cannot see: the lengths of a padded run's batches, library versions beyond those a row names.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from typing import Any

from pydantic import ValidationError

from kit import models
from kit.accuracy.published_reasons import feature_reason, fsdp1
from kit.paths import PUBLISHED
from kit.rules import Offload
from kit.schema import ModelSpec, Setup, one_line_error
from kit.settings import ZERO_KEYS

#: the tables of data/published
TABLES = ("memory", "throughput")
#: a row's model (a piece of its ``model`` text, first match wins) -> a preset, or a config file under
#: data/published/models/ (its ``_source`` says where each number comes from)
MODELS = (
    ("Megatron-DeepSpeed GPT 18B", "megatron-gpt-18b.json"),
    ("GPT-style 175B", "megatron-gpt-175b.json"),
    ("GPT-style 1T", "megatron-gpt-1t.json"),
    ("GPT-style 2T", "megatron-gpt-2t.json"),
    ("Megatron GPT-2 10B", "megatron-gpt2-10b.json"),
    ("Megatron GPT-2 1.5B", "megatron-gpt2-1.5b.json"),
    ("gpt2-large", "gpt2-large"),
    ("gpt2-xl", "gpt2-xl"),
    ("Llama 2 70B", "llama-2-70b"),
    ("Llama 2 13B", "llama-2-13b"),
    ("Llama 3 70B", "llama-3-70b"),
    *((f"MPT-{size}", f"mpt-{size}.json") for size in ("1b", "7b", "13b", "30b", "70b")),
    ("Llama 3.1 8B", "llama-3-8b"),  # Llama 3's tensors; 3.1 changes only the rotary scaling
    ("Llama 3 8B", "llama-3-8b"),
    ("DeBERTa-v2-xlarge-mnli", "deberta-v2-xlarge-mnli.json"),  # its MNLI classifier (``architectures``)
    ("BlenderBot-400M-distill", "blenderbot-400m-distill.json"),
    ("t5-large", "t5-large.json"),
    ("t5-3b", "t5-3b.json"),
)
#: (piece of a row's ``source``, piece of its ``model``, why its sequence length is a maximum): the script
#: pads each batch to its longest sample, so the run's batches were at most that long (data padding: what a
#: row cannot show); a fit there is checked against the longest sequence the kit fits (``PADDED_STEP``)
LONGEST = (
    (
        "huggingface.co/blog/zero-deepspeed-fairscale",
        "t5",
        "the blog's finetune_trainer.py (transformers 4.2 examples/seq2seq) pads each batch to its longest "
        "sample (Seq2SeqDataCollator: padding='longest' off TPUs), so its batches were at most this long",
    ),
    (
        "huggingface.co/blog/accelerate-deepspeed",
        "DeBERTa",
        "the blog's run_cls_no_trainer.py (pacman100/accelerate-deepspeed-test) pads each batch to its "
        "longest sample, to a multiple of 8 in fp16 (DataCollatorWithPadding: no --pad_to_max_length), so "
        "its batches were at most this long",
    ),
)
#: the granularity, in tokens, of the longest sequence a padded row's micro batch fits (run_cls_no_trainer's
#: pad_to_multiple_of in fp16)
PADDED_STEP = 8
#: (piece of the row's ``gpu_type``, its ``gpu_mem_gb``) -> the GPU in data/gpus.csv with that memory
GPUS = (
    ("V100", 32, "V100-SXM2-32GB"),
    ("V100", 16, "V100-SXM2-16GB"),
    ("A100", 80, "A100-SXM-80GB"),
    ("A100", 40, "A100-SXM-40GB"),
    ("H200", 141, "H200-SXM-141GB"),
    ("H100", 80, "H100-SXM-80GB"),
    ("TITAN RTX", 24, "TITAN-RTX"),
    ("RTX 3090", 24, "RTX-3090"),
)


def load(table: str) -> list[dict[str, Any]]:
    """The rows of ``data/published/<table>.jsonl`` as they are, in file order."""
    if table not in TABLES:
        raise ValueError(f"table: choose one of {', '.join(TABLES)}, got {table!r}")
    with open(PUBLISHED / f"{table}.jsonl") as f:
        return [json.loads(line) for line in f if line.strip()]


def rows(table: str = "all") -> list[dict[str, Any]]:
    """Every row of one table (``memory``, ``throughput``) or of both (``all``)."""
    return [row for name in (TABLES if table == "all" else (table,)) for row in load(name)]


def kind(row: dict[str, Any]) -> str:
    """``memory`` (bytes measured), ``fit`` (a fit / OOM boundary) or ``step_time`` (a throughput row)."""
    if row["table"] == "throughput":
        return "step_time"
    return "memory" if row["outcome"] == "measured" else "fit"


@dataclass(frozen=True)
class Expressed:
    """A row as the kit describes it: its ``setup``, or the one ``reason`` it cannot; ``notes`` are the
    assumptions the mapping made (a GPU taken by its memory, a sequence length read from a guess...)."""

    setup: Setup | None
    reason: str | None
    notes: tuple[str, ...] = ()
    #: the run padded each batch to its longest sample: ``seq_len`` is only the script's maximum
    padded: bool = False


def express(row: dict[str, Any]) -> Expressed:
    """The Setup of a memory row, or the first reason the kit cannot express it (``reason``)."""
    reason = feature_reason(row)
    if reason:
        return Expressed(None, reason)
    notes: list[str] = []
    zero = _engine(row)
    if isinstance(zero, str):
        return Expressed(None, zero)
    if fsdp1(row):
        notes.append("FSDP1 taken as FSDP2 (the same bytes in the same per-unit calls)")
    precision = _precision(row["precision"])
    if zero["engine"] != "deepspeed" and precision == "fp16":
        name = zero["engine"].upper()
        return Expressed(
            None, f"fp16 mixed precision under PyTorch {name} (the kit's {name} is fp32 or bf16)"
        )
    gpu = _gpu(row, notes)
    if gpu is None:
        return Expressed(None, f"GPU {row['gpu_type']} {row['gpu_mem_gb']} GB is not in data/gpus.csv")
    spec = _model(row, notes)
    if spec is None:
        return Expressed(None, f"model {row['model']} is not a preset or in data/published/models")
    seq, why = _seq_len(row["seq_len"])
    if seq is None:
        return Expressed(None, why)
    if why:
        notes.append(why)
    padded = [why for site, model, why in LONGEST if site in row["source"] and model in row["model"]]
    notes.extend(f"{seq} tokens is the script's maximum: {why}" for why in padded)
    lengths = _SOURCE_TARGET.match(str(row["seq_len"]))
    target = int(lengths.group(2)) if lengths and lengths.group(1) != lengths.group(2) else None
    nodes, gpus = row["num_nodes"] or 1, row["num_gpus"]
    if gpus % nodes:
        return Expressed(None, f"{gpus} GPUs do not split evenly over {nodes} nodes")
    if "--freeze_embeds" in (row.get("extras") or ""):  # HF's finetune_trainer: the shared embeddings
        zero["freeze_embeddings"] = True
    zero.update(
        precision=precision,
        optimizer=_optimizer(row["optimizer"]),
        offload_optimizer=_offload(row["offload_optimizer"]),
        offload_param=_offload(row["offload_param"]),
        **_checkpointing(row["activation_checkpointing"], notes),
        **_buckets(row["buckets"]),
    )
    try:
        setup = Setup(
            model=spec,
            cluster={"nodes": nodes, "gpus_per_node": gpus // nodes, "gpu": gpu},
            zero=zero,
            batch={
                "micro_batch": row["micro_batch_per_gpu"],
                "grad_accum": row["grad_accum"] or 1,
                "seq_len": seq,
                "target_len": target,
            },
        )
    except (ValidationError, ValueError) as error:
        return Expressed(None, one_line_error(error))
    if row.get("global_batch") not in (None, setup.batch.train_batch):
        notes.append(f"global batch {row['global_batch']} given, {setup.batch.train_batch} from the setup")
    return Expressed(setup, None, tuple(notes), padded=bool(padded))


def _engine(row: dict[str, Any]) -> dict[str, Any] | str:
    """``ZeroSettings``' engine and stage for a row's framework, or why the kit has none for it."""
    text = f"{row['framework']} {row.get('sharding') or ''}"
    if "FSDP2" in text or fsdp1(row):
        flat = "reshard_after_forward=False" in text or "SHARD_GRAD_OP" in text
        return {"engine": "fsdp", "stage": 2 if flat else 3}
    if re.search(r"\bDDP\b", text):
        return {"engine": "ddp", "stage": 0}
    if "no DeepSpeed" in text:
        return "one GPU without DDP (plain PyTorch: no DDP gradient buckets)"
    if "DeepSpeed" in row["framework"] and isinstance(row.get("zero_stage"), int):
        return {"engine": "deepspeed", "stage": row["zero_stage"]}
    return f"framework {row['framework']}"


def _precision(text: str | None) -> str:
    t = (text or "").lower()
    return "bf16" if "bf16" in t else "fp16" if "fp16" in t else "fp32"


def _optimizer(text: str | None) -> str:
    t = (text or "").lower()
    return "sgd" if "sgd" in t else "adamw" if "adamw" in t else "adam" if "adam" in t else "adamw"


def _offload(text: str | None) -> Offload:
    t = (text or "none").lower()
    return Offload.CPU if t.startswith("cpu") else Offload.NVME if t.startswith("nvme") else Offload.NONE


def _checkpointing(text: str | None, notes: list[str]) -> dict[str, Any]:
    """ZeroSettings' checkpointing fields for a row's text: off, on (full), or torchtitan's selective
    options: ``(op)`` is its op policy, ``(layer)`` every k-th block (its configs' k = 2 unless given)."""
    t = (text or "off").lower()
    if t.startswith("off"):
        return {"activation_checkpointing": False}
    if "likely" in t or "assumed" in t:
        notes.append(f"activation checkpointing taken as on (the row says {text!r})")
    if not t.startswith("selective"):
        return {"activation_checkpointing": True}
    if "op" in t:
        return {"activation_checkpointing": True, "checkpoint_policy": "selective-op"}
    every = re.search(r"\d+", t)
    if every is None:
        notes.append(f"activation checkpointing {text!r} taken as every 2nd block (torchtitan's default '2')")
    return {"activation_checkpointing": True, "checkpoint_every": int(every.group()) if every else 2}


def _buckets(text: str | None) -> dict[str, Any]:
    """ZeroSettings fields a row's ``buckets`` text sets, read by DeepSpeed's key names
    (``kit.settings.ZERO_KEYS``): ``key=number`` or ``key number``, ``key=true|false``, or a bare key (on)."""
    out: dict[str, Any] = {}
    for k in ZERO_KEYS:
        if k.field == "stage":  # the row's own zero_stage says it
            continue
        for spelling in k.spellings:
            found = re.search(rf"\b{spelling}\b(?:\s*=?\s*(\d[\d.e+]*|true|false)\b)?", text or "")
            if found:
                value = found.group(1)
                out[k.field] = value != "false" if value in (None, "true", "false") else int(float(value))
    return out


def _gpu(row: dict[str, Any], notes: list[str]) -> str | None:
    kind_, memory = row.get("gpu_type") or "", row.get("gpu_mem_gb")
    name = next((n for piece, gb, n in GPUS if piece in kind_ and memory == gb), None)
    if name is None and memory is None and row["table"] == "throughput":  # a step time needs no memory
        name = next((n for piece, _, n in GPUS if piece in kind_), None)
        if name:
            notes.append(f"{kind_} of unstated memory taken as the {name} (the step time does not use it)")
    elif name and "SXM3" in kind_:
        notes.append(f"{kind_} {memory} GB taken as the {name} (the same memory)")
    elif name is None and "H100" in kind_ and "HBM2e" in kind_ and row["table"] == "memory":
        # Meta's Grand Teton H100 (96 GB HBM2e, 500 W) has no datasheet: what a run reserves does not
        # depend on the card, its step time does (so its step-time rows stay out)
        name = "H100-SXM-80GB"
        notes.append(f"{kind_} {memory} GB taken as the {name} for its tensors (the card's size is not used)")
    return name


def _model(row: dict[str, Any], notes: list[str]) -> ModelSpec | None:
    source = next((s for piece, s in MODELS if piece in row["model"]), None)
    if source is None:
        return None
    spec = spec_of(source)
    if source.endswith(".json") and "Megatron" in row["model"]:
        notes.append(f"vocabulary {row['vocab']:,} padded to {spec.vocab:,} as Megatron does")
    if "Megatron" in row["framework"] and spec.tied_embeddings:
        # GPTModel.forward: parallel_lm_logits(lm_output, self.word_embeddings_weight(), ...)
        spec = spec.model_copy(update={"head_weight_external": True})
        if row["zero_stage"] == 3:
            notes.append(
                "Megatron's GPTModel multiplies by the word embeddings' weight in its own forward: under "
                "ZeRO-3 an external parameter of the top module, gathered for the whole step"
            )
    return spec


@cache
def spec_of(source: str) -> ModelSpec:
    """The ModelSpec of a ``MODELS`` source: a config file under data/published/models, or a preset."""
    if source.endswith(".json"):
        return models.from_hf_config(PUBLISHED / "models" / source)
    return models.preset(source)


#: an encoder-decoder row's lengths: "128 src / 64 tgt (padded)"
_SOURCE_TARGET = re.compile(r"\s*(\d+)\s*src\s*/\s*(\d+)\s*tgt")


def _seq_len(value: Any) -> tuple[int | None, str | None]:
    """``(tokens, note)``, or ``(None, reason)`` for a length the kit cannot take as one number; an
    encoder-decoder row's source length (its target length, where it differs, is ``Batch.target_len``)."""
    if isinstance(value, int):
        return value, None
    text = str(value)
    both = _SOURCE_TARGET.match(text)
    if both:
        source, target = both.group(1), both.group(2)
        same = source == target
        return int(source), f"source and target both {source} tokens" if same else (
            f"source {source} tokens (seq_len), target {target} (target_len)"
        )
    first = re.match(r"\s*(\d+)", text)
    if first is None:
        return None, f"sequence length {text!r}"
    return int(first.group(1)), f"sequence length taken as {first.group(1)} (the row says {text!r})"
