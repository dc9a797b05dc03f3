"""Model specs: exact parameter counts and shapes from presets, HF ``config.json`` files, modules or counts.

Counts come from the architecture's arithmetic (no torch): every parameter tensor of the family's
Hugging Face implementation (or of ``kit.workloads.toymodels.DiT``), in module order. The largest layer is the
largest ``sum(p.numel() for p in m.parameters(recurse=False))`` over modules, as DeepSpeed's ZeRO-3
estimator defines it (``deepspeed/runtime/zero/stage3.py: model_to_params``); a tied ``lm_head`` counts
there but not twice in the total. The tests build each preset on the meta device and compare.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from functools import cache, lru_cache
from pathlib import Path
from typing import Any, TypedDict

from pydantic import ValidationError

from kit import model_files
from kit.families import FORMULA
from kit.paths import MODELS
from kit.schema import ModelSpec, one_line_error

#: ``model_type`` values understood by :func:`from_hf_config` by arithmetic (``kit.families``)
FAMILIES = FORMULA


class _DitDefaults(TypedDict):
    patch_size: int
    in_channels: int
    learn_sigma: bool
    class_dropout_prob: float


#: DiT settings a ModelSpec does not record; :func:`config_of` and ``kit.workloads.toymodels.DiT``
#: assume these (those of DiT-XL/2 in facebookresearch/DiT). Sinusoidal timestep features: 256 channels.
DIT_DEFAULTS = _DitDefaults(patch_size=2, in_channels=4, learn_sigma=True, class_dropout_prob=0.1)
DIT_FREQUENCY_CHANNELS = 256

#: from_count's heuristic when the largest layer is unknown: a decoder whose 12·L·h² parameters have
#: h/L = 128 (Llama-2 7B/13B) and whose largest module is an untied vocabulary matrix of 128,256 rows
#: (Llama 3). See :func:`from_count`.
HEURISTIC_ASPECT = 128
HEURISTIC_VOCAB = 128_256

# A module's own parameter tensors (shapes, in registration order) and whether they are new
# (False for a tied lm_head, whose weight is the embedding's).
_Module = tuple[tuple[tuple[int, ...], ...], bool]


def preset_names() -> list[str]:
    """The preset keys users type (``--model llama-2-7b``): the files in ``data/models/``."""
    return sorted(p.stem for p in MODELS.glob("*.json"))


def preset(name: str) -> ModelSpec:
    """The ModelSpec of a shipped preset, e.g. ``preset("llama-2-7b")``."""
    if name not in preset_names():
        raise ValueError(f"model: unknown preset {name!r}; choose one of {', '.join(preset_names())}")
    return from_hf_config(MODELS / f"{name}.json", name=name)


#: names of the kit's tiny CPU models (``toy_spec``), accepted wherever a preset name is
TOYS = {"toy": "gpt2", "toy-dit": "dit"}


def resolve(text: str) -> ModelSpec:
    """A preset name, a toy (``toy``, ``toy-dit``), a path to an HF ``config.json`` (or its folder), or
    a model file / module with ``model()`` and ``batch()`` (``kit.model_files``)."""
    if text in TOYS:
        return toy_spec(TOYS[text])
    if text in preset_names():
        return preset(text)
    if model_files.is_source(text):
        return from_file(text)
    path = Path(text).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return from_hf_config(path)
    if path.suffix == ".json":
        raise ValueError(f"model: no such config file: {path}")
    raise ValueError(
        f"model: {text!r} is neither a preset ({', '.join(preset_names())}), a config.json file nor a "
        "model file (my_model.py with model() and batch())"
    )


def from_file(source: str) -> ModelSpec:
    """ModelSpec of a model file (``my_model.py``) or module (``pkg.module``) with ``model()`` and
    ``batch(micro_batch)``: counted on the meta device; activations are traced (``kit.estimate.trace``)."""
    return _spec(**model_files.spec_fields(source))


def from_hf_config(path_or_dict: str | Path | dict[str, Any], name: str | None = None) -> ModelSpec:
    """ModelSpec of an HF-style config (a dict or a ``config.json`` path).

    A family in ``FAMILIES`` is counted by arithmetic (no torch); any other ``model_type`` the installed
    transformers knows is built on the meta device and counted (``kit.hf_models``)."""
    if isinstance(path_or_dict, dict):
        cfg = path_or_dict
        name = name or cfg.get("_name_or_path") or cfg.get("model_type") or "custom"
    else:
        path = Path(path_or_dict)
        cfg = _read_json(path)
        name = name or (path.parent.name if path.name == "config.json" else path.stem) or "custom"
    if cfg.get("model_type") not in FAMILIES:
        from kit import hf_models

        return _spec(name=name, **hf_models.spec_fields(cfg))
    fields, modules = _architecture(cfg)
    return _spec(name=name, **fields, **_counts(modules))


def from_module(module_or_factory: Any, batch: Callable | None = None, name: str | None = None) -> ModelSpec:
    """ModelSpec of a ``torch.nn.Module``, or of a factory called under ``torch.device("meta")``.

    With ``batch`` (the contract's ``batch(micro_batch)``), the factory and it must be the ``model`` and
    ``batch`` functions of one model file, which the spec then names: ranks import it, the estimator
    traces it (``from_file``). Without, the spec has counts only.

    A factory allocates nothing. Parameters are counted once each (tied weights once) and the largest
    layer is DeepSpeed's (the largest ``parameters(recurse=False)`` sum of one module). The shape is
    taken from ``module.spec`` (kit.workloads.toymodels) or ``module.config`` (Hugging Face models).
    """
    import torch

    if batch is not None:
        return from_file(_source_of(module_or_factory, batch))
    if isinstance(module_or_factory, torch.nn.Module):
        module = module_or_factory
    elif callable(module_or_factory):
        with torch.device("meta"):
            module = module_or_factory()
    else:
        raise ValueError(
            f"model: expected a torch.nn.Module or a factory, got {type(module_or_factory).__name__}"
        )
    if not isinstance(module, torch.nn.Module):
        raise ValueError(f"model: the factory returned {type(module).__name__}, not a torch.nn.Module")
    from kit.hf_models import module_counts

    counts = module_counts(module)  # parameters() yields each tensor once
    fields: dict[str, Any] = {"name": type(module).__name__}
    spec = getattr(module, "spec", None)
    if isinstance(spec, ModelSpec):
        fields = spec.model_dump()
    elif (hf_config := getattr(module, "config", None)) is not None and hasattr(hf_config, "to_dict"):
        config = hf_config.to_dict()
        if config.get("model_type") in FAMILIES:
            fields = from_hf_config(config).model_dump()
    fields.update(counts)
    if name:
        fields["name"] = name
    return _spec(**fields)


#: ``override`` names -> the config attribute they set (transformers' attribute_map resolves aliases
#: such as GPT-2's n_layer); a name that is none of these is a config key itself
SHAPE_KEYS = {
    "layers": ("num_hidden_layers",),
    "hidden": ("hidden_size",),
    "heads": ("num_attention_heads",),
    "kv_heads": ("num_key_value_heads",),
    "ffn": ("intermediate_size", "n_inner", "d_ff", "ffn_dim"),
    "vocab": ("vocab_size",),
    "experts": ("num_local_experts", "num_experts", "n_routed_experts"),
}
#: the same for the kit's DiT, which has no transformers config
DIT_KEYS = {"layers": "depth", "hidden": "hidden_size", "heads": "num_heads", "vocab": "num_classes"}


def override(spec: ModelSpec, changes: dict[str, Any]) -> ModelSpec:
    """The spec with its architecture changed, e.g. ``override(spec, {"layers": 2, "hidden": 256})`` to
    shrink a 7B config for CPU runs (names of ``SHAPE_KEYS`` or any config key). A ``head_dim`` the
    config sets is kept equal to hidden / heads. Needs a spec read from a config (``spec.arch``)."""
    if not changes:
        return spec
    if not spec.arch:
        raise ValueError(
            f"model: {spec.name!r} has no config to change (only presets and config.json files do)"
        )
    cfg = json.loads(spec.arch)
    name = f"{spec.name}-" + "-".join(f"{k}{v}" for k, v in changes.items())
    if spec.family == "dit":
        cfg.update({DIT_KEYS.get(k, k): v for k, v in changes.items()})
        return from_hf_config(cfg, name=name)
    from kit import hf_models

    config = hf_models.config(cfg)
    for key, value in changes.items():
        names = SHAPE_KEYS.get(key, (key,))
        attr = next((n for n in names if hasattr(config, n)), None)
        if attr is None:
            raise ValueError(f"model: {spec.family} configs have no {key!r} ({' or '.join(names)})")
        setattr(config, attr, value)
    kv = getattr(config, "num_key_value_heads", None)
    if (
        "heads" in changes
        and "kv_heads" not in changes
        and kv
        and (kv > changes["heads"] or changes["heads"] % kv)
    ):
        config.num_key_value_heads = changes["heads"]  # fewer heads than kv heads: plain multi-head
    if getattr(config, "head_dim", None) and ("hidden" in changes or "heads" in changes):
        config.head_dim = config.hidden_size // config.num_attention_heads
    changed = {k: v for k, v in config.to_diff_dict().items() if k not in hf_models.NOT_ARCHITECTURE}
    return from_hf_config({**changed, "model_type": config.model_type}, name=name)


def _source_of(factory: Any, batch: Callable) -> str:
    """The model file that defines ``factory`` as ``model`` and ``batch`` as ``batch``."""
    import inspect

    files = {inspect.getsourcefile(f) if inspect.isfunction(f) else None for f in (factory, batch)}
    names = (getattr(factory, "__name__", None), getattr(batch, "__name__", None))
    (path,) = files if len(files) == 1 else (None,)
    if path is None or names != ("model", "batch") or factory.__module__ == "__main__":
        raise ValueError(
            "model: with batch, give the model() and batch() functions of one model file (ranks import "
            f"that file; {model_files.CONTRACT}); got {names[0]}() and {names[1]}()"
        )
    return path


def from_count(params: int, largest_layer: int | None = None, *, name: str = "custom") -> ModelSpec:
    """ModelSpec from a bare parameter count (no shape: no activation estimate, no tensor list).

    Without ``largest_layer`` it is estimated as for a modern decoder LM: width
    ``h = (128 * params / 12) ** (1/3)`` (12·L·h² parameters with h/L = 128, the Llama-2 7B/13B shape)
    and ``largest_layer = min(params, 128_256 * h)`` (an untied vocabulary matrix of Llama 3's 128,256
    rows). This errs on the large side for 32k/50k vocabularies; pass ``largest_layer`` for exact numbers.
    """
    if isinstance(params, bool) or not isinstance(params, int) or params < 1:
        raise ValueError(f"params: must be a positive integer count, got {params!r}")
    if largest_layer is None:
        width = round((HEURISTIC_ASPECT * params / 12) ** (1 / 3))
        largest_layer = min(params, HEURISTIC_VOCAB * width)
    elif isinstance(largest_layer, bool) or not isinstance(largest_layer, int) or largest_layer < 1:
        raise ValueError(f"largest_layer: must be a positive integer count, got {largest_layer!r}")
    return _spec(name=name, params=params, largest_layer_params=largest_layer)


def tensor_numels(spec: ModelSpec) -> list[int] | None:
    """The numel of every parameter tensor, in module order (tied weights once); None for bare counts.

    ZeRO-3 partitions (and pads) each tensor separately and keeps those below
    ``stage3_param_persistence_threshold`` whole on every rank. Exact for specs built from a config:
    ``spec.arch`` holds the resolved settings the count used, so a spec re-validated from JSON (in a
    rank, say) gives the same list. Without it the list is derived from the shape with the family's
    defaults; either is used only when it reproduces the spec's counts exactly, else None.
    """
    numels = spec_tensors(spec)
    return None if numels is None else list(numels)


@lru_cache(maxsize=512)
def spec_tensors(spec: ModelSpec) -> tuple[int, ...] | None:
    """``tensor_numels`` as a tuple, cached per spec (an estimate asks several times, a plan thousands)."""
    shapes = spec_shapes(spec)
    return None if shapes is None else tuple(math.prod(shape) for shape in shapes)


@lru_cache(maxsize=512)
def spec_shapes(spec: ModelSpec) -> tuple[tuple[int, ...], ...] | None:
    """The shape of every parameter tensor, in module order (tied weights once); None for bare counts.
    FSDP shards each tensor along its first dimension, so its bytes need the shapes, not just numels."""
    if spec.source:
        return model_files.tensor_shapes(spec.source)
    if spec.family not in FAMILIES and spec.arch:
        from kit import hf_models

        return hf_models.tensor_shapes(spec.arch)
    try:
        return _arch_tensors(json.dumps(config_of(spec), sort_keys=True))
    except ValueError:
        return None


def config_of(spec: ModelSpec) -> dict[str, Any]:
    """The HF-style config a spec describes: ``spec.arch`` when it has one, else the shape with the
    family's defaults for what a spec does not record. ValueError when it does not reproduce the counts."""
    cfg = json.loads(spec.arch) if spec.arch else _config_from_shape(spec)
    counts = _counts(_architecture(cfg)[1])
    if counts != {"params": spec.params, "largest_layer_params": spec.largest_layer_params}:
        raise ValueError(
            f"model: {spec.name!r}: its {'arch' if spec.arch else 'shape'} gives {counts['params']:,} "
            f"parameters (largest layer {counts['largest_layer_params']:,}), not {spec.params:,} "
            f"({spec.largest_layer_params:,})"
        )
    return cfg


def _config_from_shape(spec: ModelSpec) -> dict[str, Any]:
    missing = [
        f for f in ("layers", "hidden", "heads", "ffn", "vocab", "max_seq_len") if getattr(spec, f) is None
    ]
    if spec.family not in FAMILIES:
        raise ValueError(
            f"model: {spec.name!r} has family {spec.family!r}; known families: {', '.join(FAMILIES)}"
        )
    if missing:
        raise ValueError(f"model: {spec.name!r} ({spec.family}) lacks its shape: {', '.join(missing)}")
    if spec.family == "gpt2":
        return {
            "model_type": "gpt2",
            "n_embd": spec.hidden,
            "n_layer": spec.layers,
            "n_head": spec.heads,
            "n_inner": spec.ffn,
            "vocab_size": spec.vocab,
            "n_positions": spec.max_seq_len,
            "tie_word_embeddings": spec.tied_embeddings,
        }
    if spec.family == "dit":
        # none of them is missing
        assert spec.max_seq_len is not None and spec.hidden is not None and spec.ffn is not None
        side = math.isqrt(spec.max_seq_len)
        if side * side != spec.max_seq_len:
            raise ValueError(f"model: a DiT's max_seq_len (tokens) must be a square, got {spec.max_seq_len}")
        return {
            "model_type": "dit",
            "hidden_size": spec.hidden,
            "depth": spec.layers,
            "num_heads": spec.heads,
            "input_size": side * DIT_DEFAULTS["patch_size"],
            "num_classes": spec.vocab,
            "mlp_ratio": spec.ffn / spec.hidden,
            **DIT_DEFAULTS,
        }
    return {
        "model_type": spec.family,
        "hidden_size": spec.hidden,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "intermediate_size": spec.ffn,
        "vocab_size": spec.vocab,
        "max_position_embeddings": spec.max_seq_len,
        "tie_word_embeddings": spec.tied_embeddings,
    }


def _arch(**settings: Any) -> str:
    """``ModelSpec.arch``: the resolved settings a count used, as canonical JSON (a config again);
    settings the config left unset (None) stay unset."""
    return json.dumps({k: v for k, v in settings.items() if v is not None}, sort_keys=True)


@cache
def _arch_tensors(config: str) -> tuple[tuple[int, ...], ...]:
    """The tensor shapes of a config (canonical JSON, so that it can be cached)."""
    return _tensors(_architecture(json.loads(config))[1])


def _spec(**fields: Any) -> ModelSpec:
    try:
        return ModelSpec(**fields)
    except ValidationError as error:
        raise ValueError(one_line_error(error, prefix="model")) from None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ValueError(f"model: no such config file: {path}")
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"model: {path} is not valid JSON ({error.msg}, line {error.lineno})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"model: {path} must hold a JSON object (an HF config.json)")
    return cfg


def _counts(modules: list[_Module]) -> dict[str, int]:
    return {
        "params": sum(math.prod(shape) for shapes, new in modules if new for shape in shapes),
        "largest_layer_params": max(sum(math.prod(shape) for shape in shapes) for shapes, _ in modules),
    }


def _tensors(modules: list[_Module]) -> tuple[tuple[int, ...], ...]:
    return tuple(shape for shapes, new in modules if new for shape in shapes)


def _architecture(cfg: dict[str, Any]) -> tuple[dict[str, Any], list[_Module]]:
    """ModelSpec shape fields and the parameter modules (module order) of an HF-style config."""
    family = cfg.get("model_type")
    builders: dict[str, Callable[[dict[str, Any]], tuple[dict[str, Any], list[_Module]]]] = {
        "gpt2": _gpt2,
        "llama": _llama,
        "mistral": _llama,
        "qwen2": _llama,
        "gpt_neox": _gpt_neox,
        "dit": _dit,
    }
    if family not in builders:
        raise ValueError(
            f"model: unsupported model_type {family!r}; supported families: {', '.join(FAMILIES)}"
        )
    return builders[family](cfg)


def _require(cfg: dict[str, Any], *keys: str) -> list[int]:
    missing = [k for k in keys if not isinstance(cfg.get(k), int) or isinstance(cfg.get(k), bool)]
    if missing:
        raise ValueError(f"model: {cfg['model_type']} config needs integer {', '.join(missing)}")
    return [cfg[k] for k in keys]


def _linear(n_in: int, n_out: int, bias: bool = True, conv1d: bool = False) -> _Module:
    """``nn.Linear`` (weight ``(out, in)``) or HF's GPT-2 ``Conv1D`` (weight ``(in, out)``)."""
    weight = (n_in, n_out) if conv1d else (n_out, n_in)
    return ((weight, (n_out,)) if bias else (weight,)), True


def _norm(h: int, bias: bool) -> _Module:
    return (((h,), (h,)) if bias else ((h,),)), True


def _embedding(rows: int, h: int) -> _Module:
    return ((rows, h),), True


def _lm_head(h: int, vocab: int, tied: bool) -> _Module:
    return ((vocab, h),), not tied


def _gpt2(cfg: dict[str, Any]) -> tuple[dict[str, Any], list[_Module]]:
    """HF GPT2LMHeadModel: wte, wpe, blocks (ln_1, c_attn, c_proj, ln_2, c_fc, c_proj), ln_f, lm_head."""
    h, layers, heads, vocab = _require(cfg, "n_embd", "n_layer", "n_head", "vocab_size")
    positions = cfg.get("n_positions", 1024)
    ffn = cfg.get("n_inner") or 4 * h
    tied = cfg.get("tie_word_embeddings", True)
    block = [
        _norm(h, True),
        _linear(h, 3 * h, conv1d=True),
        _linear(h, h, conv1d=True),
        _norm(h, True),
        _linear(h, ffn, conv1d=True),
        _linear(ffn, h, conv1d=True),
    ]
    modules = [_embedding(vocab, h), _embedding(positions, h), *block * layers, _norm(h, True)]
    modules.append(_lm_head(h, vocab, tied))
    fields = {"family": "gpt2", "layers": layers, "hidden": h, "heads": heads, "kv_heads": heads}
    fields.update(ffn=ffn, vocab=vocab, max_seq_len=positions, tied_embeddings=tied)
    fields["arch"] = _arch(
        model_type="gpt2", n_embd=h, n_layer=layers, n_head=heads, vocab_size=vocab, n_positions=positions,
        n_inner=ffn, tie_word_embeddings=tied,
    )  # fmt: skip
    return fields, modules


def decoder_biases(cfg: dict[str, Any]) -> tuple[bool, bool, bool]:
    """Whether a Llama-style block's q/k/v, o and MLP projections have biases: Qwen2's q/k/v always do,
    Llama's follow ``attention_bias`` / ``mlp_bias`` (HF defaults False), Mistral's never."""
    family = cfg.get("model_type")
    attention = family == "llama" and bool(cfg.get("attention_bias", False))
    return family == "qwen2" or attention, attention, family == "llama" and bool(cfg.get("mlp_bias", False))


def _llama(cfg: dict[str, Any]) -> tuple[dict[str, Any], list[_Module]]:
    """HF Llama/Mistral/Qwen2: embed_tokens, blocks (q/k/v/o, gate/up/down, 2 RMSNorms), norm, lm_head
    (biases by ``decoder_biases``)."""
    family = cfg["model_type"]
    h, layers, heads, ffn, vocab = _require(
        cfg, "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"
    )
    kv = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or h // heads
    qkv_bias, o_bias, mlp_bias = decoder_biases(cfg)
    tied = cfg.get("tie_word_embeddings", False)
    attention = [
        _linear(h, heads * head_dim, qkv_bias),
        _linear(h, kv * head_dim, qkv_bias),
        _linear(h, kv * head_dim, qkv_bias),
        _linear(heads * head_dim, h, o_bias),
    ]
    mlp = [_linear(h, ffn, mlp_bias), _linear(h, ffn, mlp_bias), _linear(ffn, h, mlp_bias)]
    block = [*attention, *mlp, _norm(h, False), _norm(h, False)]
    modules = [_embedding(vocab, h), *block * layers, _norm(h, False), _lm_head(h, vocab, tied)]
    positions = cfg.get("max_position_embeddings")
    fields = {"family": family, "layers": layers, "hidden": h, "heads": heads, "kv_heads": kv, "ffn": ffn}
    fields.update(vocab=vocab, max_seq_len=positions, tied_embeddings=tied)
    biases = {"attention_bias": o_bias, "mlp_bias": mlp_bias} if family == "llama" else {}
    fields["arch"] = _arch(
        model_type=family, hidden_size=h, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv, head_dim=head_dim, intermediate_size=ffn, vocab_size=vocab,
        max_position_embeddings=positions, tie_word_embeddings=tied, **biases,
    )  # fmt: skip
    return fields, modules


def _gpt_neox(cfg: dict[str, Any]) -> tuple[dict[str, Any], list[_Module]]:
    """HF GPTNeoXForCausalLM: embed_in, blocks (2 LayerNorms, query_key_value, dense, MLP), norm, lm_head."""
    h, layers, heads, ffn, vocab = _require(
        cfg, "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"
    )
    bias = cfg.get("attention_bias", True)
    tied = cfg.get("tie_word_embeddings", False)
    block = [_norm(h, True), _norm(h, True), _linear(h, 3 * h, bias), _linear(h, h, bias)]
    block += [_linear(h, ffn), _linear(ffn, h)]
    modules = [_embedding(vocab, h), *block * layers, _norm(h, True), _lm_head(h, vocab, tied)]
    fields = {
        "family": "gpt_neox",
        "layers": layers,
        "hidden": h,
        "heads": heads,
        "kv_heads": heads,
        "ffn": ffn,
    }
    positions = cfg.get("max_position_embeddings")
    fields.update(vocab=vocab, max_seq_len=positions, tied_embeddings=tied)
    fields["arch"] = _arch(
        model_type="gpt_neox", hidden_size=h, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=ffn, vocab_size=vocab, max_position_embeddings=positions, attention_bias=bias,
        tie_word_embeddings=tied,
    )  # fmt: skip
    return fields, modules


def _dit(cfg: dict[str, Any]) -> tuple[dict[str, Any], list[_Module]]:
    """DiT (Peebles & Xie 2023) as kit.workloads.toymodels.DiT builds it: patch embed, timestep and label
    embedders, adaLN-Zero blocks (qkv, proj, fc1, fc2, adaLN modulation), final layer. The fixed sin-cos
    position table is a buffer, not a parameter (the reference code keeps it as a frozen Parameter).
    """
    h, layers, heads, input_size, classes = _require(
        cfg, "hidden_size", "depth", "num_heads", "input_size", "num_classes"
    )
    opts = {key: cfg.get(key, default) for key, default in DIT_DEFAULTS.items()}
    patch, channels = opts["patch_size"], opts["in_channels"]
    if input_size % patch:
        raise ValueError(f"model: dit input_size ({input_size}) must be a multiple of patch_size ({patch})")
    out_channels = 2 * channels if opts["learn_sigma"] else channels
    ffn = int(h * cfg.get("mlp_ratio", 4.0))
    label_rows = classes + (
        1 if opts["class_dropout_prob"] > 0 else 0
    )  # +1: the classifier-free "null" label
    patch_embed = (((h, channels, patch, patch), (h,)), True)
    embedders = [patch_embed, _linear(DIT_FREQUENCY_CHANNELS, h), _linear(h, h), _embedding(label_rows, h)]
    block = [_linear(h, 3 * h), _linear(h, h), _linear(h, ffn), _linear(ffn, h), _linear(h, 6 * h)]
    final = [_linear(h, patch * patch * out_channels), _linear(h, 2 * h)]
    modules = [*embedders, *block * layers, *final]
    fields = {"family": "dit", "layers": layers, "hidden": h, "heads": heads, "kv_heads": heads, "ffn": ffn}
    fields.update(vocab=classes, max_seq_len=(input_size // patch) ** 2)
    fields["arch"] = _arch(
        model_type="dit", hidden_size=h, depth=layers, num_heads=heads, input_size=input_size,
        num_classes=classes, mlp_ratio=ffn / h, **opts,
    )  # fmt: skip
    return fields, modules


def toy_spec(
    family: str = "gpt2",
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    vocab: int = 512,
    seq_len: int = 64,
) -> ModelSpec:
    """A tiny spec for CPU runs. For "dit", ``vocab`` is the class count and ``seq_len`` the token count
    (a square: 64 tokens = a 16x16x4 latent in 2x2 patches).
    """
    if family == "gpt2":
        cfg = {"model_type": "gpt2", "n_embd": hidden, "n_layer": layers, "n_head": heads}
        cfg.update(vocab_size=vocab, n_positions=seq_len)
    elif family == "dit":
        side = math.isqrt(seq_len)
        if side * side != seq_len:
            raise ValueError(f"seq_len: a DiT's token count must be a square (e.g. 64, 256), got {seq_len}")
        cfg = {"model_type": "dit", "hidden_size": hidden, "depth": layers, "num_heads": heads}
        cfg.update(input_size=side * DIT_DEFAULTS["patch_size"], num_classes=vocab)
    else:
        raise ValueError(f"family: toy models are gpt2 or dit, got {family!r}")
    return from_hf_config(cfg, name=f"toy-{family}-{layers}x{hidden}")
