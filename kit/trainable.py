"""What trains: every parameter, LoRA adapters on a frozen model, or all but frozen groups. Written once
for the estimate, the ranks, the CLI and the panels.

- ``lora_rank`` r > 0: LoRA with the ``peft`` library (``LoraConfig(r, target_modules)``, dropout 0, no
  bias): every base weight is frozen and each targeted linear layer gets two trainable matrices,
  A (r x in) and B (out x r). ``lora_targets`` are peft's ``target_modules`` (module names); none means
  peft's default for the model type (q_proj and v_proj for Llama), ``all-linear`` every linear layer but
  the output head. ``lora_alpha`` scales the update and changes no byte: it is left to the script.
- ``freeze_embeddings``: the input embeddings do not train (Hugging Face's ``--freeze_embeds``; a head
  tied to them is the same tensor, so it is frozen too).
- ``frozen_blocks`` k: the first k blocks do not train, the last ``layers - k`` do (LLaMA-Factory's
  ``freeze_trainable_layers``).

DeepSpeed builds optimizer states, fp32 master weights and gradients for the trainable parameters only
(every ZeRO optimizer keeps ``is_optimized_parameter``, i.e. ``requires_grad``); frozen 16-bit weights stay
module parameters, whole on every rank at stages 0-2 and partitioned like the others at stage 3. The
ranks build it with ``kit.workloads.adapters``; the estimate lists the same model on the meta device.

What it cannot see: LoRA dropout (its masks and the dropped copies of each targeted layer's input), DoRA,
QLoRA's 4-bit base weights (bitsandbytes needs CUDA), adapters on embeddings or convolutions; the kit's
own GPT-2 and DiT, GPT-NeoX and model files (``model_problem``).
"""

from __future__ import annotations

from kit.families import FORMULA, SWIGLU

#: the ZeroSettings fields of what trains
FIELDS = ("lora_rank", "lora_targets", "freeze_embeddings", "frozen_blocks")
#: peft's target that selects every linear layer but the output head
ALL_LINEAR = "all-linear"
#: families whose activations are followed op by op with a trainable subset (``kit.estimate.activations``)
FAMILIES = SWIGLU
#: what a panel offers: (label, the values of ``FIELDS``)
CHOICES: tuple[tuple[str, tuple[int, tuple[str, ...], bool, int]], ...] = (
    ("every parameter", (0, (), False, 0)),
    ("frozen embeddings", (0, (), True, 0)),
    ("LoRA r=16", (16, (), False, 0)),  # peft's default modules (q_proj, v_proj for Llama)
    ("LoRA r=16 all-linear", (16, (ALL_LINEAR,), False, 0)),
    ("LoRA r=64 all-linear", (64, (ALL_LINEAR,), False, 0)),
)


def choices(zero, model=None) -> list[tuple[str, tuple]]:
    """``CHOICES`` (those ``model``, a ``ModelSpec``, takes when given), and ``zero``'s own settings (a
    ``ZeroSettings``) where they are none of them."""
    offered = [
        (label, values)
        for label, values in CHOICES
        if model is None
        or not model_problem(zero.model_copy(update=dict(zip(FIELDS, values, strict=True))), model)
    ]
    own = key(zero)
    if own in dict(offered).values():
        return offered
    return [*offered, (describe(zero), own)]


def is_subset(zero) -> bool:
    """Whether ``zero`` (a ``ZeroSettings``) trains less than every parameter."""
    return bool(zero.lora_rank or zero.freeze_embeddings or zero.frozen_blocks)


def key(zero) -> tuple:
    """The settings that decide which tensors exist and which train (hashable, for caches)."""
    return tuple(getattr(zero, field) for field in FIELDS)


def label(zero) -> str:
    """The label part: ``lora16``, ``lora16-all``, ``lora8 q,k``, ``frz-emb``, ``frz10``; ``""`` for all."""
    parts = []
    if zero.lora_rank:
        targets = zero.lora_targets
        if targets == (ALL_LINEAR,):
            parts.append(f"lora{zero.lora_rank}-all")
        elif targets:
            short = ",".join(t.removesuffix("_proj") for t in targets)
            parts.append(f"lora{zero.lora_rank} {short}")
        else:
            parts.append(f"lora{zero.lora_rank}")
    if zero.freeze_embeddings:
        parts.append("frz-emb")
    if zero.frozen_blocks:
        parts.append(f"frz{zero.frozen_blocks}")
    return " ".join(parts)


def describe(zero) -> str:
    """In words: ``LoRA r=16 on q_proj, v_proj (peft)``, ``every parameter``, ..."""
    if zero.lora_rank:
        targets = zero.lora_targets
        on = (
            "every linear layer but the head"
            if targets == (ALL_LINEAR,)
            else ", ".join(targets) or "peft's default modules for the model type"
        )
        return f"LoRA r={zero.lora_rank} on {on} (peft), every base weight frozen"
    parts = (["the embeddings"] if zero.freeze_embeddings else []) + (
        [f"the first {zero.frozen_blocks} blocks"] if zero.frozen_blocks else []
    )
    return f"every parameter but {' and '.join(parts)}" if parts else "every parameter"


def problem(zero) -> str | None:
    """Why ``zero``'s trainable settings cannot be combined as given (one line naming the field), or None."""
    if zero.lora_targets and not zero.lora_rank:
        return "lora_targets: applies with lora_rank > 0 (LoRA); lora_rank is 0"
    if ALL_LINEAR in zero.lora_targets and len(zero.lora_targets) > 1:
        return f"lora_targets: {ALL_LINEAR!r} stands alone (it selects every linear layer but the head)"
    if zero.lora_rank and (zero.freeze_embeddings or zero.frozen_blocks):
        field = "freeze_embeddings" if zero.freeze_embeddings else "frozen_blocks"
        return f"{field}: LoRA already freezes every base weight; drop it or lora_rank"
    if is_subset(zero) and zero.engine != "deepspeed":
        return f"engine: a trainable subset is modelled for DeepSpeed's ZeRO; engine {zero.engine!r} is not"
    if is_subset(zero) and zero.checkpoint_policy != "full":
        return (
            "checkpoint_policy: selective checkpointing with a trainable subset is not modelled yet; use full"
        )
    if is_subset(zero) and zero.nvme:
        return "offload: NVMe offload with a trainable subset is not modelled yet; use 'none' or 'cpu'"
    return None


def model_problem(zero, model) -> str | None:
    """Why ``model`` (a ``ModelSpec``) cannot train ``zero``'s subset in the kit, or None. The families of
    ``FAMILIES`` take every subset (their activations are followed op by op); any other Hugging Face
    architecture, whose activations are traced (``kit.estimate.trace``), takes frozen embeddings; the
    kit's other formula families (GPT-2, GPT-NeoX, DiT) and model files none yet."""
    if not is_subset(zero):
        return None
    field = next(f for f in FIELDS if getattr(zero, f))
    traced = model.arch and not model.source and model.family not in FORMULA
    if not traced and (model.family not in FAMILIES or model.source or not model.arch):
        return (
            f"{field}: a trainable subset is modelled for {', '.join(FAMILIES)} and traced Hugging Face "
            f"models (presets or config.json files); {model.name} ({model.family or 'no family'}) is not one"
        )
    if traced and (zero.frozen_blocks or zero.lora_rank):
        field = "frozen_blocks" if zero.frozen_blocks else "lora_rank"
        return (
            f"{field}: {model.name} is traced (kit.estimate.trace), which takes frozen embeddings only yet "
            "(peft's adapters are not built under FakeTensorMode; a traced model's blocks are not named)"
        )
    if model.layers and zero.frozen_blocks >= model.layers:
        return f"frozen_blocks: must be in [0, {model.layers - 1}] (the model's blocks, one left to train)"
    return None


def in_your_script(zero) -> str | None:
    """What the training script must do for ``zero``'s subset (no ds_config key says it), or None."""
    if zero.lora_rank:
        targets = zero.lora_targets
        modules = (
            repr(ALL_LINEAR) if targets == (ALL_LINEAR,) else (repr(list(targets)) if targets else "None")
        )
        return (
            f"LoRA: model = peft.get_peft_model(model, peft.LoraConfig(r={zero.lora_rank}, "
            f"lora_alpha={2 * zero.lora_rank}, target_modules={modules}, lora_dropout=0.0)) before "
            "deepspeed.initialize, and pass only the parameters that require grad to the optimizer "
            "(the HF Trainer does both with peft_config)"
        )
    if zero.freeze_embeddings or zero.frozen_blocks:
        what = describe(zero).removeprefix("every parameter but ")
        return (
            f"freeze {what}: p.requires_grad_(False) on their parameters before deepspeed.initialize; "
            "with gradient checkpointing call model.enable_input_require_grads()"
        )
    return None
