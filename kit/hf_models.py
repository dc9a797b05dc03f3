"""Any Hugging Face architecture: built by transformers on the meta device (nothing allocated) to count it.

For a ``config.json`` whose ``model_type`` the installed transformers knows and ``kit.models`` has no
arithmetic for (mixtral, gemma2, phi3, qwen2_moe, t5, bart, vit, ...). The model is built with the
auto class that fits the config: the head its ``architectures`` names (``head``: a sequence classifier
such as ``DebertaV2ForSequenceClassification``, a seq-to-seq LM...), else by model type a causal LM,
seq-to-seq LM, masked LM, image classifier, else the bare model (``TASKS``). Counts are exact: every
parameter tensor in module order (tied weights once), and the largest layer as DeepSpeed defines it.
``ModelSpec.arch`` keeps the config (its ``to_diff_dict``), so a rank builds the same model for real
(``kit.ranks.workloads``) and the estimator traces it (``kit.estimate.trace``).

Blind spots: models that need remote code (``auto_map``) are refused; a model whose parameters are
created lazily at the first forward is counted as built. Importing this module is cheap; torch and
transformers are imported by the functions that need them.
"""

from __future__ import annotations

import json
import logging
from functools import cache
from typing import Any

#: (auto class, task) in the order a config is tried; the first whose mapping knows the config wins
TASKS = (
    ("AutoModelForCausalLM", "causal-lm"),
    ("AutoModelForSeq2SeqLM", "seq2seq-lm"),
    ("AutoModelForMaskedLM", "masked-lm"),
    ("AutoModelForImageClassification", "image-classification"),
    ("AutoModel", "base"),
)
#: heads a config's ``architectures`` may name beyond ``TASKS``' (``head``); never chosen by model type
#: alone, so a config without ``architectures`` builds what it built before
HEADS = (("AutoModelForSequenceClassification", "sequence-classification"),)
#: config keys that do not change the architecture (left out of ``ModelSpec.arch``)
NOT_ARCHITECTURE = ("transformers_version", "_name_or_path", "architectures", "torch_dtype", "dtype")
#: ModelSpec shape fields and the config attributes they are read from (transformers' attribute_map
#: resolves the aliases: d_model, n_embd, num_layers, ...), the first one present wins
SHAPE = {
    "layers": ("num_hidden_layers",),
    "hidden": ("hidden_size",),
    "heads": ("num_attention_heads",),
    "kv_heads": ("num_key_value_heads", "num_attention_heads"),
    "ffn": ("intermediate_size", "d_ff", "encoder_ffn_dim", "ffn_dim"),
    "vocab": ("vocab_size",),
    "max_seq_len": ("max_position_embeddings", "n_positions"),
}
#: config attributes naming the experts of a mixture of experts, and the experts each token is routed to
EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts")
ROUTED = ("num_experts_per_tok", "moe_topk")


def config(cfg: dict[str, Any]):
    """The transformers ``PretrainedConfig`` of an HF-style config dict (``model_type`` required)."""
    import transformers

    model_type = cfg.get("model_type")
    if cfg.get("auto_map"):
        raise ValueError(f"model: {model_type!r} needs remote code (auto_map), which zero-kit does not run")
    known = transformers.CONFIG_MAPPING
    if model_type is None or model_type not in known:
        raise ValueError(
            f"model: model_type {model_type!r} is unknown to transformers {transformers.__version__}; "
            "upgrade transformers or give --params"
        )
    values = {k: v for k, v in cfg.items() if k != "model_type"}
    logging.getLogger("transformers.configuration_utils").addFilter(_token_ids_outside_vocab)
    return known[model_type](**values)


def _token_ids_outside_vocab(record: logging.LogRecord) -> bool:
    """Drop transformers' "Model config: bos_token_id must be `None` or an integer within the vocabulary"
    warning (and eos/pad's): a shrunken config (the toy GPT's 512-token vocabulary, ``--vocab``) keeps the
    architecture's default special ids (GPT-2's 50256); kit builds such models to count, trace and train
    on random tokens, never to tokenize, so the ids are never looked up. Every other message passes."""
    message = record.getMessage()
    return not (message.startswith("Model config: ") and "_token_id must be `None` or an integer" in message)


def task(cfg) -> str:
    """The task (``TASKS``, ``HEADS``) whose auto class builds this ``PretrainedConfig``: the head its
    ``architectures`` names (``head``), else by model type (``by_type``)."""
    return head(cfg) or by_type(cfg)


def head(cfg) -> str | None:
    """The task of the head ``cfg.architectures`` names, where that task's auto class builds that very class
    for this config (``DebertaV2ForSequenceClassification``: ``sequence-classification``;
    ``BartForConditionalGeneration``: ``seq2seq-lm``); None without ``architectures``, for a bare model, or
    for a head the kit has no workload for (token classification, question answering...)."""
    import transformers

    names = set(getattr(cfg, "architectures", None) or ())
    for auto, name in (*TASKS, *HEADS) if names else ():
        mapping = getattr(transformers, auto)._model_mapping
        if name != "base" and type(cfg) in mapping:
            built = mapping[type(cfg)]
            if {c.__name__ for c in (built if isinstance(built, tuple | list) else (built,))} & names:
                return name
    return None


def by_type(cfg) -> str:
    """The task of the first auto class (``TASKS``' order) whose mapping knows this config's type; an
    encoder-decoder config (bart, t5) is a seq-to-seq LM first (bart also has a decoder-only causal LM)."""
    import transformers

    order = (
        sorted(TASKS, key=lambda t: t[1] != "seq2seq-lm")
        if getattr(cfg, "is_encoder_decoder", False)
        else TASKS
    )
    for auto, name in order:
        if type(cfg) in getattr(transformers, auto)._model_mapping:
            return name
    raise ValueError(f"model: no transformers auto class builds model_type {cfg.model_type!r}")


def build(cfg):
    """The model of a ``PretrainedConfig`` (on the current default device; ``torch.device("meta")``
    to count). Mixtures of experts use transformers' ``grouped_mm`` experts, whose shapes follow the
    routed tokens (what a trace can see) instead of the eager per-expert loop."""
    import transformers

    auto = dict((name, a) for a, name in (*TASKS, *HEADS))[task(cfg)]
    options = {"experts_implementation": "grouped_mm"} if experts(cfg) else {}
    return getattr(transformers, auto).from_config(cfg, **options)


def arch(cfg) -> str:
    """``ModelSpec.arch``: the config's non-default settings as canonical JSON; ``architectures`` only where
    the head it names is not what the model type builds (a rank and the trace then build that head too)."""
    diff = {k: v for k, v in cfg.to_diff_dict().items() if k not in NOT_ARCHITECTURE}
    if head(cfg) not in (None, by_type(cfg)):
        diff["architectures"] = list(cfg.architectures)
    return json.dumps({**diff, "model_type": cfg.model_type}, sort_keys=True)


def spec_fields(cfg_dict: dict[str, Any]) -> dict[str, Any]:
    """ModelSpec fields of an HF config of any model_type: counts from the model built on meta, the shape
    from the config (fields a config lacks stay None), ``family`` = the model_type."""
    import torch

    cfg = config(cfg_dict)
    with torch.device("meta"):
        model = build(cfg)
    counts = module_counts(model)
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    fields: dict[str, Any] = {"family": cfg.model_type, "arch": arch(cfg), **counts}
    for field, names in SHAPE.items():
        value = next((getattr(text, n) for n in names if isinstance(getattr(text, n, None), int)), None)
        fields[field] = value if value and value > 0 else None
    if fields["hidden"] and fields["heads"] and fields["hidden"] % fields["heads"]:
        fields["heads"] = fields["kv_heads"] = (
            None  # head_dim set apart from hidden (gemma): no shape formula
        )
    if fields["heads"] and fields["kv_heads"] and fields["heads"] % fields["kv_heads"]:
        fields["kv_heads"] = None
    fields["tied_embeddings"] = bool(getattr(text, "tie_word_embeddings", False))
    if fields["max_seq_len"] and not learned_positions(model, fields["max_seq_len"]):
        fields["max_seq_len"] = None  # relative (T5), rotary or ALiBi positions: no table to run past
    return fields


def learned_positions(model, length: int) -> bool:
    """Whether a model holds a learned table of absolute positions for ``length`` tokens: an embedding of
    ``length`` rows (BART's and OPT's add 2 for their offset). T5's relative-position buckets, rotary and
    ALiBi models have none, so a config's ``n_positions`` / ``max_position_embeddings`` limits nothing; nor
    does a table of relative distances (DeBERTa-v2's ``rel_embeddings``, 2 x its log buckets rows)."""
    import torch

    return any(
        isinstance(m, torch.nn.Embedding)
        and m.num_embeddings in (length, length + 2)
        and not name.endswith("rel_embeddings")
        for name, m in model.named_modules()
    )


def target_len(model, value: Any, limit: int) -> int | None:
    """``Batch.target_len`` checked against ``model`` (a ``ModelSpec``; None: not known yet): the decoder's
    tokens per sample (its labels, from which transformers builds the decoder's inputs; the encoder reads
    ``seq_len``), which only an encoder-decoder model takes (its ``arch`` says ``is_encoder_decoder``: t5,
    bart, blenderbot...), at most the rows of its learned position table where it has one (``max_seq_len``).
    A ValueError of one line naming the field; None (the decoder reads ``seq_len`` tokens) stays None."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= limit:
        raise ValueError(f"batch.target_len: must be a whole number in [1, {limit:,}], got {value!r}")
    if model is not None and not json.loads(model.arch or "{}").get("is_encoder_decoder"):
        raise ValueError(
            "batch.target_len: only an encoder-decoder model (t5, bart...) has decoder tokens of their own, "
            f"not {model.name} (model_type {model.family or 'unknown'}): drop target_len"
        )
    if model is not None and model.max_seq_len and value > model.max_seq_len:
        raise ValueError(
            f"batch.target_len: must be <= the model's max_seq_len ({model.max_seq_len}), got {value}"
        )
    return value


def module_counts(module) -> dict[str, int]:
    """Parameters (each tensor once), the largest layer (DeepSpeed's: the largest
    ``parameters(recurse=False)`` sum of one module) of a ``torch.nn.Module``."""
    return {
        "params": sum(p.numel() for p in module.parameters()),
        "largest_layer_params": max(
            sum(p.numel() for p in m.parameters(recurse=False)) for m in module.modules()
        ),
    }


@cache
def tensor_shapes(arch_json: str) -> tuple[tuple[int, ...], ...]:
    """Every parameter tensor's shape, in module order, of the model an ``arch`` describes (built on meta)."""
    import torch

    with torch.device("meta"):
        model = build(config(json.loads(arch_json)))
    return tuple(tuple(p.shape) for p in model.parameters())


def experts(cfg) -> tuple[int, int] | None:
    """``(experts, routed per token)`` of a mixture-of-experts config, else None."""
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    total = next((getattr(text, n) for n in EXPERTS if isinstance(getattr(text, n, None), int)), None)
    routed = next((getattr(text, n) for n in ROUTED if isinstance(getattr(text, n, None), int)), None)
    return (total, routed) if total and routed else None
