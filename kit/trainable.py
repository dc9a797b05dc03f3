"""What trains: every parameter, LoRA adapters on a frozen model, or all but frozen groups. Written once
for the estimate, the ranks, the CLI and the panels.

- ``lora_rank`` r > 0: LoRA with the ``peft`` library (``LoraConfig(r, target_modules, lora_dropout)``, no
  bias): every base weight is frozen and each targeted linear layer gets two trainable matrices,
  A (r x in) and B (out x r). ``lora_targets`` are peft's ``target_modules`` (module names); none means
  peft's default for the model type (q_proj and v_proj for Llama), ``all-linear`` every linear layer but
  the output head. ``lora_alpha`` scales the update and changes no byte: it is left to the script.
  ``lora_dropout`` p > 0 drops each adapter's input (peft's ``nn.Dropout`` before ``lora_A``): each
  targeted layer's adapter saves its own dropped copy of the input and, where that input needs a
  gradient, the dropout's mask (``kit.estimate.activations``).
- ``qlora``: QLoRA, LoRA on base weights stored in 4 bits (bitsandbytes' NF4 through transformers'
  ``BitsAndBytesConfig``: ``nf4_bytes`` is its format); every linear layer but the output head is
  quantized, embeddings and norms stay 16-bit. bitsandbytes needs CUDA: estimate-only in the kit, modelled
  from its algorithm and measured on CPU through ``kit.workloads.nf4``, a plain-PyTorch equivalent.
- ``freeze_embeddings``: the input embeddings do not train (Hugging Face's ``--freeze_embeds``; a head
  tied to them is the same tensor, so it is frozen too).
- ``frozen_blocks`` k: the first k blocks do not train, the last ``layers - k`` do (LLaMA-Factory's
  ``freeze_trainable_layers``).

DeepSpeed builds optimizer states, fp32 master weights and gradients for the trainable parameters only
(every ZeRO optimizer keeps ``is_optimized_parameter``, i.e. ``requires_grad``); frozen 16-bit weights stay
module parameters, whole on every rank at stages 0-2 and partitioned like the others at stage 3. The
ranks build it with ``kit.workloads.adapters``; the estimate lists the same model on the meta device.

What it cannot see: DoRA, peft's ``prepare_model_for_kbit_training`` (it casts the 16-bit weights to
fp32; TRL skips it for sharded QLoRA), adapters on embeddings or convolutions; QLoRA on traced models;
the kit's DiT, GPT-NeoX and model files (``model_problem``).
"""

from __future__ import annotations

from kit.families import FORMULA, SWIGLU

#: the ZeroSettings fields of what trains
FIELDS = ("lora_rank", "lora_targets", "freeze_embeddings", "frozen_blocks", "qlora", "lora_dropout")
#: peft's target that selects every linear layer but the output head
ALL_LINEAR = "all-linear"
#: families whose activations are followed op by op with a trainable subset (``kit.estimate.activations``)
FAMILIES = SWIGLU
#: the kit's GPT (the toy and the gpt2 presets), followed op by op too, with LoRA on its ``Conv1D``s
GPT_FAMILIES = ("gpt2",)
#: what a panel offers: (label, the values of ``FIELDS``)
CHOICES: tuple[tuple[str, tuple[int, tuple[str, ...], bool, int, bool, float]], ...] = (
    ("every parameter", (0, (), False, 0, False, 0.0)),
    ("frozen embeddings", (0, (), True, 0, False, 0.0)),
    ("LoRA r=16", (16, (), False, 0, False, 0.0)),  # peft's default modules (q_proj, v_proj for Llama)
    ("LoRA r=16 all-linear", (16, (ALL_LINEAR,), False, 0, False, 0.0)),
    ("LoRA r=16 all-linear, dropout 0.05", (16, (ALL_LINEAR,), False, 0, False, 0.05)),
    ("LoRA r=64 all-linear", (64, (ALL_LINEAR,), False, 0, False, 0.0)),
    ("QLoRA r=16 all-linear", (16, (ALL_LINEAR,), False, 0, True, 0.0)),
)


def choices(zero, model=None) -> list[tuple[str, tuple]]:
    """``CHOICES`` (those ``model``, a ``ModelSpec``, takes when given, and ``zero``'s precision: QLoRA's
    is bf16), and ``zero``'s own settings (a ``ZeroSettings``) where they are none of them. A traced model
    is offered no LoRA: the choices' targets are peft's defaults and all-linear, which peft may not build
    on it (a mixture of experts' experts take no dropout); its own targets go through the settings."""
    offered = [
        (label, values)
        for label, values in CHOICES
        if not (values[FIELDS.index("qlora")] and zero.precision != "bf16")
        and (
            model is None
            or not model_problem(zero.model_copy(update=dict(zip(FIELDS, values, strict=True))), model)
            and not (_traced(model) and values[FIELDS.index("lora_rank")])
        )
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
    """The label part: ``lora16``, ``lora16-all qlora``, ``lora8 q,k``, ``lora16-all-d0.05`` (dropout 0.05),
    ``frz-emb``, ``frz10``; ``""`` for all."""
    parts = []
    if zero.lora_rank:
        targets = zero.lora_targets
        token = f"lora{zero.lora_rank}" + ("-all" if targets == (ALL_LINEAR,) else "")
        token += f"-d{zero.lora_dropout:g}" if zero.lora_dropout else ""
        if targets and targets != (ALL_LINEAR,):
            token += " " + ",".join(t.removesuffix("_proj") for t in targets)
        parts.append(token)
    if zero.qlora:
        parts.append("qlora")
    if zero.freeze_embeddings:
        parts.append("frz-emb")
    if zero.frozen_blocks:
        parts.append(f"frz{zero.frozen_blocks}")
    return " ".join(parts)


def describe(zero) -> str:
    """In words: ``LoRA r=16 on q_proj, v_proj (peft), every base weight frozen``, ``every parameter``, ...
    (LoRA's dropout, when set: ``..., dropout 0.05, every base ...``)."""
    if zero.lora_rank:
        targets = zero.lora_targets
        on = (
            "every linear layer but the head"
            if targets == (ALL_LINEAR,)
            else ", ".join(targets) or "peft's default modules for the model type"
        )
        base = "4-bit NF4 (bitsandbytes)" if zero.qlora else "frozen"
        dropout = f", dropout {zero.lora_dropout:g}" if zero.lora_dropout else ""
        lora = f"{'Q' if zero.qlora else ''}LoRA r={zero.lora_rank}"
        return f"{lora} on {on} (peft){dropout}, every base weight {base}"
    parts = (["the embeddings"] if zero.freeze_embeddings else []) + (
        [f"the first {zero.frozen_blocks} blocks"] if zero.frozen_blocks else []
    )
    return f"every parameter but {' and '.join(parts)}" if parts else "every parameter"


def problem(zero) -> str | None:
    """Why ``zero``'s trainable settings cannot be combined as given (one line naming the field), or None."""
    if zero.lora_targets and not zero.lora_rank:
        return "lora_targets: applies with lora_rank > 0 (LoRA); lora_rank is 0"
    if zero.lora_dropout and not zero.lora_rank:
        return "lora_dropout: applies with lora_rank > 0 (LoRA's adapters); lora_rank is 0"
    if zero.qlora and not zero.lora_rank:
        return "qlora: applies with lora_rank > 0 (LoRA on 4-bit base weights); lora_rank is 0"
    if zero.qlora and zero.precision != "bf16":
        return f"qlora: modelled with bf16 compute and 4-bit storage in bf16; precision is {zero.precision!r}"
    if ALL_LINEAR in zero.lora_targets and len(zero.lora_targets) > 1:
        return f"lora_targets: {ALL_LINEAR!r} stands alone (it selects every linear layer but the head)"
    if zero.lora_rank and (zero.freeze_embeddings or zero.frozen_blocks):
        field = "freeze_embeddings" if zero.freeze_embeddings else "frozen_blocks"
        return f"{field}: LoRA already freezes every base weight; drop it or lora_rank"
    if is_subset(zero) and zero.engine != "deepspeed":
        return f"engine: a trainable subset is modelled for DeepSpeed's ZeRO; engine {zero.engine!r} is not"
    if zero.qlora and zero.checkpoint_policy != "full":
        return (
            "checkpoint_policy: selective checkpointing with QLoRA is not modelled yet (the 4-bit layers' "
            "matmuls are not counted by the op policy's rule here); use full"
        )
    if is_subset(zero) and zero.nvme:
        return "offload: NVMe offload with a trainable subset is not modelled yet; use 'none' or 'cpu'"
    return None


def model_problem(zero, model) -> str | None:
    """Why ``model`` (a ``ModelSpec``) cannot train ``zero``'s subset in the kit, or None. The families of
    ``FAMILIES`` take every subset (their activations are followed op by op); any other Hugging Face
    architecture, whose activations are traced (``kit.estimate.trace``), takes frozen embeddings and LoRA;
    the kit's GPT (``GPT_FAMILIES``) every subset too; GPT-NeoX, DiT and model files none yet."""
    if not is_subset(zero):
        return None
    field, traced = next(f for f in FIELDS if getattr(zero, f)), _traced(model)
    gpt = model.family in GPT_FAMILIES and not model.source
    if traced and zero.qlora:
        return (
            f"qlora: 4-bit base weights are modelled for {', '.join(FAMILIES)} and the kit's GPT; "
            f"{model.name}'s traced layers are not yet"
        )
    if not traced and not gpt and (model.family not in FAMILIES or model.source or not model.arch):
        return (
            f"{field}: a trainable subset is modelled for {', '.join(FAMILIES)} and traced Hugging Face "
            f"models (presets or config.json files); {model.name} ({model.family or 'no family'}) is not one"
        )
    if traced and zero.frozen_blocks:
        return (
            f"frozen_blocks: {model.name} is traced (kit.estimate.trace), which takes frozen embeddings and "
            "LoRA only yet (a traced model's blocks are not named)"
        )
    if model.layers and zero.frozen_blocks >= model.layers:
        return f"frozen_blocks: must be in [0, {model.layers - 1}] (the model's blocks, one left to train)"
    return None


def _traced(model) -> bool:
    """Whether ``model``'s activations are traced (``kit.estimate.trace``): a Hugging Face architecture
    without a formula."""
    return bool(model.arch and not model.source and model.family not in FORMULA)


def run_problem(zero) -> str | None:
    """Why a run of ``zero`` cannot start (one line, before launch), or None: QLoRA is estimate-only."""
    if zero.qlora:
        return (
            "zero.qlora: estimate-only: bitsandbytes' 4-bit kernels need CUDA and the kit's ranks do not "
            "load them; its bytes are modelled from bitsandbytes' algorithm and measured in one process "
            "through a plain-PyTorch equivalent (kit.workloads.nf4)"
        )
    return None


_BNB = (
    "; QLoRA: from_pretrained(..., quantization_config=transformers.BitsAndBytesConfig(load_in_4bit=True, "
    "bnb_4bit_quant_type='nf4', bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16, "
    "bnb_4bit_quant_storage=torch.bfloat16)) (the bf16 storage lets ZeRO-3 partition the 4-bit weights), "
    "without peft.prepare_model_for_kbit_training (it casts the 16-bit weights to fp32)"
)


def in_your_script(zero) -> str | None:
    """What the training script must do for ``zero``'s subset (no ds_config key says it), or None."""
    if zero.lora_rank:
        targets = zero.lora_targets
        modules = (
            repr(ALL_LINEAR) if targets == (ALL_LINEAR,) else (repr(list(targets)) if targets else "None")
        )
        return (
            f"LoRA: model = peft.get_peft_model(model, peft.LoraConfig(r={zero.lora_rank}, "
            f"lora_alpha={2 * zero.lora_rank}, target_modules={modules}, lora_dropout={zero.lora_dropout})) "
            "before deepspeed.initialize, and pass only the parameters that require grad to the optimizer "
            "(the HF Trainer does both with peft_config)" + (_BNB if zero.qlora else "")
        )
    if zero.freeze_embeddings or zero.frozen_blocks:
        what = describe(zero).removeprefix("every parameter but ")
        return (
            f"freeze {what}: p.requires_grad_(False) on their parameters before deepspeed.initialize; "
            "with gradient checkpointing call model.enable_input_require_grads()"
        )
    return None


#: bitsandbytes' 4-bit format as QLoRA runs it (``functional.quantize_4bit``, quant_type nf4,
#: compress_statistics: double quantization): one absmax per block of ``NF4_BLOCK`` elements, quantized
#: itself to uint8 by ``quantize_blockwise`` in blocks of ``NESTED_BLOCK`` with one fp32 scale each
NF4_BLOCK, NESTED_BLOCK = 64, 256
#: elements the CPU equivalent (``kit.workloads.nf4``) dequantizes at a time, a multiple of ``NF4_BLOCK``
DEQUANTIZE_CHUNK = 1024
#: its scratch per element of a chunk: the uint8 code, the int32 index and the fp32 value (or scale)
DEQUANTIZE_SCRATCH = 1 + 4 + 4
#: per quantized weight, the fp32 tables its QuantState holds: the 16 NF4 values (``get_4bit_type``, made
#: per call) and the nested state's 256-value dynamic map (``code.to(device, copy=True)``), and the offset
TABLES = 4 * 16 + 4 * 256 + 4


def nf4_bytes(numel: int) -> tuple[int, int]:
    """(packed, quant state) bytes of one weight of ``numel`` elements in bitsandbytes' NF4 with double
    quantization, stored in bf16 (``bnb_4bit_quant_storage``): two 4-bit codes per byte, in
    ``(numel + 1) // 4`` bf16 elements (the CUDA kernel's ``out``); one uint8 absmax per 64-block, one
    fp32 scale per 256 of those, and ``TABLES``."""
    blocks = -(-numel // NF4_BLOCK)
    return 2 * ((numel + 1) // 4), blocks + 4 * -(-blocks // NESTED_BLOCK) + TABLES
