"""Published measurements of real GPU runs beside the kit's predictions: the test set of its GPU-side
numbers (``data/published/``, copied unchanged from ``../shared/published/``; its README says how to read
a row).

``memory.jsonl`` rows are numbers (``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` per GPU)
or boundaries (a setting that fit, or ran out of memory). ``express`` turns a row into the Setup the kit
can describe, or into the one reason it cannot, a phrase a user understands ("tensor parallelism (TP=8)",
"torch.compile"): the kit never puts a number beside a run it cannot describe. ``compare`` estimates an
expressed row and sets the prediction beside the measurement:
- max allocated <- ``Estimate.peak_tensor_bytes`` (the step's largest phase of live device tensors);
- max reserved <- ``Estimate.reserved_bytes`` where the estimate has one, else ``peak_per_gpu_bytes`` (the
  peak plus the CUDA context, NCCL's buffers and the allocator's slack), and the row says which;
- fits / OOM at a micro batch <- ``kit.fit.estimate_fit`` on the row's GPU (the verdict's one rule), with
  the largest micro batch the kit finds fitting beside it ("fits at BS=N (max)" is checked as: fits at N).
A reading that is neither (nvidia-smi's memory in use, what PyTorch had allocated when it ran out) is
shown beside the verdict, never compared: the allocator's cache fills a card whatever the run needs.
``throughput.jsonl`` rows (``kind == "step_time"``) are expressed the same way (FSDP1 taken as FSDP2:
the same bytes in the same calls) and timed by ``kit.accuracy.published_steps`` (``Comparison.timings``).

How a row maps: DeepSpeed ZeRO stage N -> stage N ("ZeRO disabled": stage 0, DeepSpeed's fp16 optimizer);
PyTorch DDP -> engine ``ddp``; FSDP2 full shard -> ``fsdp`` (``kit.rules.BASELINES``); the GPU by type and
memory (``GPUS``: a V100-SXM3 32 GB has the V100-SXM2-32GB's memory); the model by name (``MODELS``: a
preset, or ``data/published/models/*.json`` for Megatron's GPTs, whose vocabulary Megatron pads to a
multiple of 128); bucket sizes, overlap and ZeRO++ from ``buckets``. Knobs a row does not give take the
kit's defaults, DeepSpeed 0.19's, though several runs used older versions.

Units: Megatron's ``report_memory`` prints "MB" of 1024 x 1024 bytes (MiB); nvidia-smi's MiB and PyTorch's
GiB are binary; "GB" with no tool named is taken as 1e9 bytes.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from functools import cache
from typing import Any

from pydantic import ValidationError

from kit import models
from kit.accuracy import published_steps
from kit.accuracy.published_reasons import feature_reason, fsdp1
from kit.accuracy.published_steps import Timing
from kit.estimate import trace
from kit.estimate.memory import estimate
from kit.fit import estimate_fit
from kit.paths import PUBLISHED
from kit.planning.plan import largest_micro_batch
from kit.rules import Offload
from kit.schema import ModelSpec, Setup, one_line_error
from kit.settings import ZERO_KEYS
from kit.units import GIB, MIB

TABLES = ("memory", "throughput")
#: what a row compares: a number of bytes, a fit / OOM boundary, a step time
KINDS = ("memory", "fit", "step_time")
#: the memory quantities a number row measures
QUANTITIES = ("max_allocated", "max_reserved")
#: each quantity as a reader names it
QUANTITY_TEXT = {"max_allocated": "max allocated", "max_reserved": "max reserved"}
#: the largest micro batch ``largest_micro_batch`` tries
MAX_MICRO_BATCH = 4096

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
#: (piece of a row's ``source``, why its sequence length is a maximum): the script pads each batch to its
#: longest sample, so the run's batches were at most that long (data padding: what a row cannot show)
LONGEST = (
    (
        "huggingface.co/blog/zero-deepspeed-fairscale",
        "the blog's finetune_trainer.py (transformers 4.2 examples/seq2seq) pads each batch to its longest "
        "sample (Seq2SeqDataCollator: padding='longest' off TPUs), so its batches were at most this long",
    ),
)
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
#: units of ``value`` (``_bytes`` reads Megatron's "MB")
UNITS = {"GiB": GIB, "MiB": MIB, "GB": 10**9}


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
    notes.extend(
        f"{seq} tokens is the script's maximum: {why}" for site, why in LONGEST if site in row["source"]
    )
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
    return Expressed(setup, None, tuple(notes))


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
    if source.endswith(".json") and "Megatron" in row["model"]:
        notes.append(f"vocabulary {row['vocab']:,} padded to {spec_of(source).vocab:,} as Megatron does")
    return spec_of(source)


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


def _bytes(row: dict[str, Any], value: float, unit: str) -> int:
    """``value`` in ``unit`` as bytes; Megatron's ``report_memory`` "MB" are MiB (it divides by 1024**2)."""
    if unit == "MB":
        return round(value * (MIB if "report_memory" in row["measured_what"] else 10**6))
    return round(value * UNITS[unit])


def _quantity(row: dict[str, Any]) -> str | None:
    what = row["measured_what"]
    if "max_memory_allocated" in what:
        return "max_allocated"
    if "reserved" in what:
        return "max_reserved"
    return None  # the tool is not stated: nothing to compare it with


def _secondary_reserved(row: dict[str, Any]) -> int | None:
    """The max reserved a row prints beside max allocated (``value_secondary``), in bytes."""
    found = re.search(r"max reserved\s+([\d.]+)\s*(MB|MiB|GiB|GB)", row.get("value_secondary") or "")
    return _bytes(row, float(found.group(1)), found.group(2)) if found else None


@dataclass(frozen=True)
class Value:
    """A measured number of bytes beside the prediction (``predicted_as``: the estimate's field)."""

    quantity: str
    measured_bytes: int
    predicted_bytes: int
    predicted_as: str

    @property
    def error(self) -> float:
        """predicted / measured - 1."""
        return self.predicted_bytes / self.measured_bytes - 1

    def to_dict(self) -> dict[str, Any]:
        keys = ("quantity", "measured_bytes", "predicted_bytes", "predicted_as", "error")
        return {k: getattr(self, k) for k in keys}


@dataclass(frozen=True)
class Check:
    """One fit / OOM boundary: the run at ``micro_batch`` ``measured`` (fits / OOM; ``largest``: the largest
    micro batch that fit, "fits at BS=N (max)"), and the kit's verdict (``kit.fit.estimate_fit``:
    ``predicted_bytes`` per GPU against ``capacity_bytes``, ``problem`` its reason; ``peak_tensor_bytes``
    the peak of live tensors in it)."""

    micro_batch: int
    measured: str
    predicted: str
    predicted_bytes: int
    capacity_bytes: int
    problem: str
    peak_tensor_bytes: int
    largest: bool = False

    @property
    def agrees(self) -> bool:
        return self.measured == self.predicted

    def to_dict(self) -> dict[str, Any]:
        keys: tuple[str, ...] = ("micro_batch", "largest", "measured", "predicted", "agrees")
        keys += ("predicted_bytes", "capacity_bytes", "problem", "peak_tensor_bytes")
        return {k: getattr(self, k) for k in keys}


@dataclass(frozen=True)
class Comparison:
    """One published row beside the kit's prediction, or the reason there is none."""

    row: dict[str, Any]
    kind: str
    setup: Setup | None = None
    reason: str | None = None
    notes: tuple[str, ...] = ()
    values: tuple[Value, ...] = ()
    checks: tuple[Check, ...] = ()
    #: a step-time row's measured step beside the kit's (``kit.accuracy.published_steps``)
    timings: tuple[Timing, ...] = ()
    #: a reading shown beside a fit / OOM verdict, not compared (nvidia-smi's, or allocated at the OOM)
    measured_bytes: int | None = None
    #: the largest micro batch the kit finds fitting (fit rows; 0: none)
    largest_micro_batch: int | None = None

    @property
    def id(self) -> str:
        return self.row["id"]

    @property
    def expressed(self) -> bool:
        return self.reason is None

    @property
    def agrees(self) -> bool | None:
        """Whether every fit / OOM boundary agrees (None for a row without one)."""
        return all(c.agrees for c in self.checks) if self.checks else None

    @property
    def label(self) -> str | None:
        """``megatron-gpt-18b: z3 fp16 mb1 ckpt on 4 x 16 V100-SXM2-32GB``."""
        s = self.setup
        if s is None:
            return None
        c = s.cluster
        return f"{s.model.name}: {s.label} on {c.nodes} x {c.gpus_per_node} {c.gpu}"

    def to_dict(self) -> dict[str, Any]:
        r = self.row
        return {
            "id": r["id"],
            "table": r["table"],
            "kind": self.kind,
            "model": r["model"],
            "framework": r["framework"],
            "label": self.label,
            "measured_what": r["measured_what"],
            "outcome": None if self.kind == "memory" else r.get("outcome"),
            "values": [v.to_dict() for v in self.values],
            "checks": [c.to_dict() for c in self.checks],
            "timings": [t.to_dict() for t in self.timings],
            "agrees": self.agrees,
            "measured_bytes": self.measured_bytes,
            "largest_micro_batch": self.largest_micro_batch,
            "confidence": r["confidence"],
            "reason": self.reason,
            "notes": list(self.notes),
            "source": r["source"],
            "setup": self.setup.model_dump(mode="json") if self.setup else None,
        }


def compare(row: dict[str, Any]) -> Comparison:
    """A row beside the kit's prediction (see the module docstring), or with the reason it has none."""
    what = kind(row)
    expressed = express(row)
    if expressed.setup is None:
        return Comparison(row, what, reason=expressed.reason)
    setup, notes = expressed.setup, list(expressed.notes)
    if what == "step_time":
        try:
            timed = published_steps.timing(row, setup, notes)
        except ValueError as error:
            return Comparison(row, what, reason=str(error))
        return Comparison(row, what, setup, notes=tuple(notes), timings=(timed,))
    if what == "memory":
        est = estimate(setup)
        readings: dict[str | None, int | None] = {_quantity(row): _bytes(row, row["value"], row["unit"])}
        readings.setdefault("max_reserved", _secondary_reserved(row))
        values = tuple(
            Value(quantity, nbytes, *_predicted(est, quantity))
            for quantity, nbytes in readings.items()
            if quantity in QUANTITIES and nbytes is not None
        )
        if not values:
            notes.append(f"not compared: the kit predicts no {row['measured_what']!r}")
        return Comparison(row, what, setup, notes=tuple(notes), values=values)
    with trace.searching():  # the row's micro batches, then the largest that fits: one search
        return _checked(row, what, setup, notes)


def _checked(row: dict[str, Any], what: str, setup: Setup, notes: list[str]) -> Comparison:
    """A fit row's checks at its micro batches, and the largest micro batch the kit says fits."""
    checks = []
    for micro_batch, fits, largest in _boundaries(row, notes):
        est = estimate(setup.replace(batch={"micro_batch": micro_batch}))
        assert est.peak_tensor_bytes is not None  # the deepspeed formula's estimate has a timeline
        verdict = estimate_fit(est)
        measured, predicted = ("fits" if ok else "OOM" for ok in (fits, verdict.ok))
        checks.append(
            Check(micro_batch, measured, predicted, verdict.need, verdict.capacity, verdict.problem,
                  est.peak_tensor_bytes, largest)
        )  # fmt: skip
    reading = _bytes(row, row["value"], row["unit"]) if row.get("value") is not None else None
    largest_fitting = largest_micro_batch(setup, limit=MAX_MICRO_BATCH)
    return Comparison(row, what, setup, notes=tuple(notes), checks=tuple(checks), measured_bytes=reading,
                      largest_micro_batch=largest_fitting)  # fmt: skip


def _predicted(est, quantity: str) -> tuple[int, str]:
    """``(bytes, the estimate's field)`` predicting ``quantity`` (one of ``QUANTITIES``): max allocated is
    the peak of live tensors; max reserved is ``reserved_bytes`` where the Estimate has it, else the peak
    per GPU (its CUDA context and NCCL buffers are not reserved by the allocator: it over-predicts)."""
    if quantity == "max_allocated":
        return est.peak_tensor_bytes, "peak_tensor_bytes"
    reserved = getattr(est, "reserved_bytes", None)
    if reserved is not None:
        return reserved, "reserved_bytes"
    return est.peak_per_gpu_bytes, "peak_per_gpu_bytes"


def _boundaries(row: dict[str, Any], notes: list[str]) -> list[tuple[int, bool, bool]]:
    """``(micro batch, fits, the largest that fit)`` of each clause of a row's ``outcome`` ("fits", "OOM",
    "fits at BS=8 (max)", "fits (BS=20); OOM (BS=30)"); a clause about another setup ("DDP OOM at BS=1") is
    left out, and noted."""
    out = []
    for clause in row["outcome"].split(";"):
        found = re.match(r"\s*(fits|OOM)\b(?:.*?BS=(\d+))?", clause)
        if found is None:
            notes.append(f"not checked: {clause.strip()!r} (another setup)")
            continue
        micro_batch = int(found.group(2)) if found.group(2) else row["micro_batch_per_gpu"]
        out.append((micro_batch, found.group(1) == "fits", "(max)" in clause))
    return out


@dataclass(frozen=True)
class Report:
    """Comparisons of a selection of rows and their summary."""

    comparisons: tuple[Comparison, ...]

    def summary(self) -> dict[str, Any]:
        """Per table the rows and those expressed; the step times' summary (``published_steps.summary``);
        per quantity the median |error| and the worst error; how many fit / OOM rows agree."""
        tables = {}
        for table in TABLES:
            mine = [c for c in self.comparisons if c.row["table"] == table]
            if mine:
                tables[table] = {"rows": len(mine), "expressed": sum(c.expressed for c in mine)}
        quantities = {}
        for quantity in QUANTITIES:
            found = [(c.id, v) for c in self.comparisons for v in c.values if v.quantity == quantity]
            if not found:
                continue
            worst_id, worst = max(found, key=lambda item: abs(item[1].error))
            quantities[quantity] = {
                "rows": len(found),
                "median_abs_error": statistics.median(abs(v.error) for _, v in found),
                "worst_error": worst.error,
                "worst_id": worst_id,
                "predicted_as": sorted({v.predicted_as for _, v in found}),
            }
        checked = [c for c in self.comparisons if c.checks]
        return {
            "tables": tables,
            "quantities": quantities,
            "step_time": published_steps.summary(self.comparisons),
            "fit": {
                "rows": len(checked),
                "agree": sum(bool(c.agrees) for c in checked),
                "disagree": [c.id for c in checked if not c.agrees],
            },
        }

    def to_dict(self) -> dict[str, Any]:
        return {"rows": [c.to_dict() for c in self.comparisons], "summary": self.summary()}


def ids(table: str = "all") -> list[str]:
    """The ids of a table's rows (``A01``...), in file order."""
    return [row["id"] for row in rows(table)]


def report(table: str = "all", only: list[str] | tuple[str, ...] = ()) -> Report:
    """Every row of ``table`` (``memory``, ``throughput``, ``all``), or only the ids in ``only``, compared."""
    if table != "all" and table not in TABLES:
        raise ValueError(f"table: choose one of {', '.join(TABLES)} or all, got {table!r}")
    chosen = rows(table)
    unknown = sorted(set(only) - {row["id"] for row in chosen})
    if unknown:
        raise ValueError(f"id: no row {', '.join(unknown)} in {table}")
    return Report(tuple(compare(row) for row in chosen if not only or row["id"] in only))
