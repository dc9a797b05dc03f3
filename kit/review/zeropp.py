"""The review's check of ZeRO++ (stage 3): hpZ, qwZ and qgZ, their bytes and their traffic inside and
across nodes."""

from __future__ import annotations

from kit.review.context import Context, Finding
from kit.settings import ZEROPP_KEYS
from kit.steptime.comm import comm_by_scope
from kit.units import size

#: what each ZeRO++ switch does (the keys and their off values: ``kit.settings.ZEROPP_KEYS``)
WHAT = {
    "hpz_partition_size": "hpZ: a secondary copy of the parameters partitioned over the node's GPUs; the "
    "backward all-gather reads it inside the node",
    "quantized_weights": "qwZ: every weight all-gather in int8",
    "quantized_gradients": "qgZ: gradients in int4 by a two-hop all-to-all (inside the node, then across "
    "nodes)",
}


def zeropp(x: Context) -> list[Finding]:
    """hpZ, qwZ, qgZ: their bytes per GPU and what they move inside and across nodes per step."""
    if x.stage != 3:
        return []  # stage.stage3_keys says they do nothing below stage 3
    found = []
    now = comm_by_scope(x.setup)
    for k in ZEROPP_KEYS:
        field, off, what = k.field, k.off, WHAT[k.field]
        key = x.setting(k.field)
        if not key or getattr(x.z, field) == off:
            continue
        without = x.setup.replace(zero={field: off})
        before = comm_by_scope(without)
        cost = x.delta(**{field: off})
        message = (
            f"{key} {getattr(x.z, field)}: {what}: {'+' if cost >= 0 else '-'}{size(abs(cost))} per GPU; "
            f"per GPU per step across nodes {size(before['inter'])} -> {size(now['inter'])}, inside the "
            f"node {size(before['intra'])} -> {size(now['intra'])} (kit.steptime.comm.collectives)"
        )
        if field != "hpz_partition_size":
            message += "; needs DeepSpeed's CUDA quantizer kernels (no CPU backend)"
        if x.setup.cluster.nodes == 1 and field == "hpz_partition_size":
            message += ": on one node every collective already stays inside the node"
            found.append(Finding(key, "warning", message, "remove it: it costs memory and saves no traffic"))
        else:
            found.append(Finding(key, "info", message, "keep it where the nodes' network is the bottleneck"))
    return found
