"""Size on disk of one DeepSpeed checkpoint tag, per file kind, before anything is saved.

Stages 0-2 write one model-states file (16-bit weights, written by rank 0) and, from stage 1, one
optimizer-states file per rank (its fp32 master partition and optimizer moments); stage 3 writes one
small model-states file per rank (the partitioned weights are placeholders there) and one optimizer-states
file per rank. ``kit.scaleout.checkpoints`` saves real ones and tests compare.
"""

from __future__ import annotations

import math

from kit.estimate import partition
from kit.rules import DS_SUB_GROUP_SIZE, element_bytes, master_bytes, optimizer_states
from kit.schema import Setup
from kit.trainable import is_subset

#: Non-tensor bytes of a file (torch.save's zip entries and the pickled metadata: ds_config, counters,
#: loss scaler, param_shapes), fitted to DeepSpeed 0.19.8 files within 2 KiB: a base per file, each
#: stored tensor's zip entry (headers and 64-byte alignment), and each parameter name in a model-states file.
MODEL_STATES_BASE = 6144
OPTIM_STATES_BASE = 3072
PER_STORED_TENSOR = 256
PER_PARAM_NAME = 48


def checkpoint_bytes(setup: Setup) -> dict:
    """Predicted size on disk of one checkpoint tag of ``setup``, per file kind.

    Returns ``{"model_states": {...}, "optim_states": {...}, "total_bytes": int}``; each kind has
    ``files`` (how many), ``tensor_bytes`` per file (exactly the tensors DeepSpeed writes), ``bytes``
    per file (tensors plus the metadata estimate, within 2 KiB) and ``formula``. Optimizer files are
    rank 0's (another rank's may hold less padding). Assumes one parameter group and no persistent
    buffers, as in the toy models (a buffer adds its bytes to the model-states file). Checked against
    files DeepSpeed 0.19.8 wrote for bf16 stages 0-3, fp32 stages 0 and 2, and SGD at stage 3; fp16 at
    stage 0 keeps its fp32 master copy as one flat tensor (a few bytes less than counted here).
    """
    z, n, psi = setup.zero, setup.zero_dp, setup.model.params
    if is_subset(z):
        raise ValueError(
            "checkpoint size: not modelled for a trainable subset yet (DeepSpeed saves the frozen weights "
            "apart, as fragments per rank at stages 2-3)"
        )
    count = len(partition.numels(setup)) if partition.is_exact(setup) else 1
    width = element_bytes(z.precision)
    # optimizer state tensors per parameter: Adam exp_avg + exp_avg_sq (+ a float32 "step" scalar)
    moments = optimizer_states(z.optimizer, z.momentum)
    step = int(z.optimizer != "sgd")
    names = PER_PARAM_NAME * count
    if z.stage == 0:
        master = master_bytes(z.precision)  # fp16/bf16 optimizers keep an fp32 copy of every tensor
        tensor_bytes = (width + master + 4 * moments) * psi + 4 * step * count
        stored = count * (1 + bool(master) + moments + step)
        model = _kind(1, tensor_bytes, MODEL_STATES_BASE + names + PER_STORED_TENSOR * stored)
        model["formula"] = f"({width} weights + {master} fp32 master + {4 * moments} optimizer) x {psi:,}"
        none = {
            "files": 0,
            "tensor_bytes": 0,
            "bytes": 0,
            "formula": "stage 0: the optimizer is in model states",
        }
        return {"model_states": model, "optim_states": none, "total_bytes": model["bytes"]}
    part = partition.partition_numel(setup)
    if z.stage == 3:
        groups = math.ceil(part / DS_SUB_GROUP_SIZE)
        model = _kind(n, 0, MODEL_STATES_BASE + names + PER_STORED_TENSOR * count)
        model["formula"] = "placeholders only: the partitioned weights are in the optimizer files"
        where = f"sum(ceil(numel_i / {n})) = {part:,}"
    else:
        flat, groups = part * n, 1
        model = _kind(1, width * flat, MODEL_STATES_BASE + names + PER_STORED_TENSOR)
        model["formula"] = f"{width} x {flat:,} (all weights in one flat buffer, a multiple of 2 x {n})"
        where = f"{part:,} (1/{n} of {flat:,})"
    optim_tensors = (4 + 4 * moments) * part + 4 * step * groups
    optim = _kind(n, optim_tensors, OPTIM_STATES_BASE + PER_STORED_TENSOR * groups * (1 + moments + step))
    optim["formula"] = f"(4 fp32 master + {4 * moments} optimizer) x {where}"
    total = model["files"] * model["bytes"] + optim["files"] * optim["bytes"]
    return {"model_states": model, "optim_states": optim, "total_bytes": total}


def _kind(files: int, tensor_bytes: int, meta: int) -> dict:
    return {"files": files, "tensor_bytes": tensor_bytes, "bytes": tensor_bytes + meta}
