"""The review's checks of the numbers per parameter: the training precision and the optimizer."""

from __future__ import annotations

from kit.components import Component
from kit.fit import supports
from kit.review.context import Context, Finding
from kit.rules import FP32, optimizer_states
from kit.units import size


def precision(x: Context) -> list[Finding]:
    """bf16 / fp16 / fp32: the bytes per parameter each costs."""
    names = [
        n for n in ("bf16", "bfloat16", "fp16") if isinstance(x.raw.get(n), dict) and "enabled" in x.raw[n]
    ]
    if not names:
        return []
    key = f"{'fp16' if x.z.precision == 'fp16' else names[0]}.enabled"
    e, p = x.est, x.p
    k = optimizer_states(x.z.optimizer, x.z.momentum)
    if x.z.precision == "fp32":
        message = (
            f"{key}: fp32 training: {p} B parameters and gradients per element, model states "
            f"{size(e.model_states_bytes)} per GPU"
        )
        return [
            Finding(key, "info", message, "bf16 halves parameter and gradient bytes where the GPU has it")
        ]
    message = (
        f"{key}: {x.z.precision} training: {p} B parameters and gradients, an fp32 master copy ({FP32} B) "
        f"and {k} fp32 optimizer states ({FP32 * k} B) per parameter: model states "
        f"{size(e.model_states_bytes)} per GPU"
        + ("; fp16 adds dynamic loss scaling" if x.z.precision == "fp16" else "")
    )
    name = x.setup.cluster.gpu
    if x.z.precision == "fp16" and supports(name, "bf16"):
        rate = x.gpu.peak_tflops("bf16")
        return [
            Finding(
                key,
                "warning",
                f"{message}; fp16 has 5 exponent bits: gradients over- or underflow without the scaler",
                f"bf16: the {name} computes in bf16 ({rate:g} TFLOP/s, fp16 {x.gpu.peak_tflops('fp16'):g}) "
                "with fp32's exponent range and no loss scaling, in the same bytes: set bf16.enabled true "
                "and fp16.enabled false",
            )
        ]
    why = f"keep it: the {name} has no bf16" if x.z.precision == "fp16" else "keep it"
    return [Finding(key, "info", message, why)]


def optimizer(x: Context) -> list[Finding]:
    """The optimizer: its fp32 states per parameter and where they live."""
    section = x.raw.get("optimizer")
    if not isinstance(section, dict) or "type" not in section:
        return []
    term = x.est.terms[Component.OPTIMIZER_STATES]
    where = x.est.host_terms[Component.OPTIMIZER_STATES]
    at = f"{size(where.bytes)} per rank in host memory" if where.bytes else f"{size(term.bytes)} per GPU"
    return [
        Finding(
            "optimizer.type",
            "info",
            f"optimizer.type {section['type']}: {x.z.optimizer}, "
            f"{optimizer_states(x.z.optimizer, x.z.momentum)} fp32 states per parameter: optimizer states "
            f"{at} ({(where if where.bytes else term).formula})",
            "keep it",
        )
    ]
