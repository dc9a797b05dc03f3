"""Setup -> ``ds_config.json``: the config DeepSpeed's parser accepts for a Setup.

A plain function over dicts (no torch or deepspeed import); every zero_optimization and NVMe key comes
from the settings registry (``kit.settings``), which the reader and the review walk too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kit.rules import Offload
from kit.schema import Setup, ZeroSettings
from kit.settings import CHECKPOINTING_KEYS, NVME_KEYS, TOP_KEYS, ZERO_KEYS

#: DeepSpeed's default is 10; every 100 steps keeps short runs quiet and long runs informative.
STEPS_PER_PRINT = 100
#: The common choice in DeepSpeed's and HF's example configs (HF Trainer's max_grad_norm default).
GRADIENT_CLIPPING = 1.0
#: the learning rate of the kit's runs (the PyTorch baselines use the same)
LEARNING_RATE = 1e-4

_OPTIMIZER_TYPES = {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD"}
#: the ``activation_checkpointing`` keys no setting declares, at DeepSpeed's defaults
_ACTIVATION_CHECKPOINTING = {
    "contiguous_memory_optimization": False,
    "synchronize_checkpoint_boundary": False,
}


def to_ds_config(setup: Setup, *, torch_adam: bool = False, lr: float = LEARNING_RATE) -> dict:
    """The ds_config dict for a Setup, valid for DeepSpeed's parser.

    ``torch_adam=True`` makes DeepSpeed use ``torch.optim.Adam(W)`` instead of JIT-building its fused
    or CPU Adam (the runner's choice on CPU machines). A PyTorch baseline (``zero.engine`` ddp/fsdp) has
    no ds_config: ValueError naming its DeepSpeed counterpart.
    """
    z, b = setup.zero, setup.batch
    if z.engine != "deepspeed":
        raise ValueError(
            f"zero.engine: {z.name!r} is PyTorch's own engine, not DeepSpeed: it has no "
            f"ds_config (its ZeRO counterpart is stage {z.stage}, engine 'deepspeed')"
        )
    config: dict[str, Any] = {
        "train_batch_size": b.train_batch,
        "train_micro_batch_size_per_gpu": b.micro_batch,
        "gradient_accumulation_steps": b.grad_accum,
        "steps_per_print": STEPS_PER_PRINT,
        "gradient_clipping": GRADIENT_CLIPPING,
        "optimizer": _optimizer_section(z, torch_adam, lr),
        "zero_optimization": _zero_section(z),
    }
    if z.mixed_precision:
        config[z.precision] = {"enabled": True}
    if z.optimizer == "sgd" and z.stage > 0:
        # ZeRO refuses optimizers outside deepspeed/runtime/zero/utils.py ZERO_SUPPORTED_OPTIMIZERS.
        config["zero_allow_untested_optimizer"] = True
    if z.activation_checkpointing:
        # read only by deepspeed.checkpointing.configure (kit.checkpointing): the script's own call
        own = {k.key: getattr(z, k.field) for k in CHECKPOINTING_KEYS}
        config["activation_checkpointing"] = {**own, **_ACTIVATION_CHECKPOINTING}
    for k in TOP_KEYS:  # sequence_parallel_size: read by deepspeed.initialize and the config's batch rule
        if getattr(z, k.field) != k.default:
            config[k.key] = getattr(z, k.field)
    if z.nvme:
        # the top-level block NVMe offload reads (deepspeed/runtime/swap_tensor/aio_config.py)
        config["aio"] = z.aio.model_dump()
    return config


def _optimizer_section(z: ZeroSettings, torch_adam: bool, lr: float) -> dict:
    params: dict[str, Any] = {"lr": lr}
    if z.optimizer == "sgd":
        params["momentum"] = z.momentum
    else:
        if z.optimizer == "adam":
            params["adam_w_mode"] = False  # DeepSpeed's "Adam" is AdamW unless this is false
        if torch_adam:
            params["torch_adam"] = True
    return {"type": _OPTIMIZER_TYPES[z.optimizer], "params": params}


def _zero_section(z: ZeroSettings) -> dict:
    """Each ``ZERO_KEYS`` key the stage reads; ZeRO++ keys only when on, ``overlap_comm`` only when set."""
    section: dict[str, Any] = {}
    for k in ZERO_KEYS:
        value = getattr(z, k.field)
        if z.stage in k.stages and value is not None and (k.off is None or value != k.off):
            section[k.key] = value
    for kind in ("offload_optimizer", "offload_param"):
        device = getattr(z, kind)
        if device is Offload.NONE:
            continue
        block = section[kind] = {"device": device, "pin_memory": z.pin_memory}
        if device is Offload.NVME:
            block["nvme_path"] = z.nvme_path
            block.update({k.key: getattr(z, k.field) for k in NVME_KEYS[kind]})
    return section


def write_ds_config(setup: Setup, path: str | Path, **options: Any) -> Path:
    """Write ``to_ds_config(setup, **options)`` as indented JSON; returns the path."""
    path = Path(path)
    path.write_text(json.dumps(to_ds_config(setup, **options), indent=2) + "\n")
    return path
