"""The review's checks of offload: optimizer and parameters to CPU or NVMe (ZeRO-Infinity), pinned
memory, the swap files, their buffers and the ``aio`` block."""

from __future__ import annotations

from kit.components import Component
from kit.estimate import nvme
from kit.review.context import Context, Finding, noop, offload_device
from kit.rules import AIO_ALIGNED_BYTES, Offload
from kit.units import size


def offload_param(x: Context) -> list[Finding]:
    """offload_param: ignored below stage 3; at stage 3 the parameters' bytes on the host."""
    section = x.zero.get("offload_param")
    asked = offload_device(section) != Offload.NONE or x.zero.get("cpu_offload_param")
    key = x.key("offload_param", "cpu_offload_param")
    if not asked or not key:
        return []
    if x.stage < 3:
        params = x.est.components[Component.PARAMETERS]
        if x.z.offload_optimizer is Offload.NONE and x.stage > 0:
            saving = x.delta(offload_optimizer="cpu")
            instead = f"use offload_optimizer (device cpu) at stage {x.stage}: saves {size(saving)} per GPU"
        else:
            instead = "use stage 3 to offload parameters"
        return [
            Finding(
                key,
                "warning",
                f"{key}: ignored at stage {x.stage}: DeepSpeed accepts it but only stage 3 partitions, and "
                "so offloads, parameters (the stage 1-2 optimizer never reads offload_param); the "
                f"parameters stay on the GPU: {size(params)} per GPU",
                instead + ", or stage 3 with offload_param",
            )
        ]
    saving = x.delta(offload_param="none") * -1
    host = x.est.host_terms[Component.PARAMETERS]
    return [
        Finding(
            key,
            "info",
            f"{key}: the 16-bit parameter partitions live in CPU RAM and are copied up for each all-gather: "
            f"{size(host.bytes)} per rank on the host ({host.formula}), saving {size(saving)} per GPU; "
            "every forward and backward crosses PCIe",
            "keep it only if stage 3 without it does not fit",
        )
    ]


def offload_optimizer(x: Context) -> list[Finding]:
    """offload_optimizer: ignored at stage 0; else what moves to the host and what it saves."""
    section = x.zero.get("offload_optimizer")
    asked = offload_device(section) != Offload.NONE or x.zero.get("cpu_offload")
    key = x.key("offload_optimizer", "cpu_offload")
    if not asked or not key:
        return []
    if x.stage == 0:
        return [
            Finding(
                key,
                "warning",
                f"{key}: ignored at stage 0: there is no ZeRO optimizer to offload (DeepSpeed accepts it)",
                "use stage 1 or 2 with offload_optimizer",
            )
        ]
    saving = -x.delta(offload_optimizer="none")
    host = sum(t.bytes for t in x.est.host_terms.values())
    where = "the CPU, their files to NVMe" if x.setup.zero.offload_optimizer is Offload.NVME else "the CPU"
    return [
        Finding(
            key,
            "info",
            f"{key}: optimizer states and the optimizer step move to {where}: saves {size(saving)} per GPU; "
            f"{size(host)} per rank in host memory ({x.setup.cluster.gpus_per_node} ranks per node: CPU RAM "
            f"per node {size(x.est.cpu_bytes_per_node)}, {x.est.cpu_term.formula}); gradients go down and "
            "parameters come up over PCIe every step",
            "keep it only if the GPU is too small without it",
        )
    ]


def pin_memory(x: Context) -> list[Finding]:
    """pin_memory: the page-locked bytes per rank and node, or nothing when nothing is offloaded."""
    found = []
    for kind in ("offload_optimizer", "offload_param"):
        section = x.zero.get(kind)
        if not isinstance(section, dict) or not section.get("pin_memory"):
            continue
        key = f"zero_optimization.{kind}.pin_memory"
        device = offload_device(section)
        used = device != Offload.NONE and (x.stage == 3 if kind == "offload_param" else x.stage > 0)
        if not used:
            why = (
                f"device is {device!r}" if device == Offload.NONE else f"{kind} is ignored at stage {x.stage}"
            )
            found.append(noop(key, f"nothing is offloaded ({why}), so nothing is pinned", "remove it"))
            continue
        held = x.est.host_terms
        part = held[Component.PARAMETERS].bytes if kind == "offload_param" else sum(
            held[c].bytes for c in (Component.GRADIENTS, Component.OPTIMIZER_STATES, Component.BUFFERS)
        )  # fmt: skip
        found.append(
            Finding(
                key,
                "info",
                f"{key}: the offloaded buffers are page-locked for faster PCIe copies: {size(part)} per "
                f"rank, {size(part * x.setup.cluster.gpus_per_node)} per node that the OS cannot swap",
                "keep it unless CPU RAM is short",
            )
        )
    if x.zero.get("cpu_offload_use_pin_memory") and not (
        x.zero.get("cpu_offload") or x.zero.get("cpu_offload_param")
    ):
        found.append(noop("zero_optimization.cpu_offload_use_pin_memory", "nothing is offloaded"))
    return found


def nvme_offload(x: Context) -> list[Finding]:
    """ZeRO-Infinity: where the swap files go and what they, the pinned buffers and the aio block cost."""

    found: list[Finding] = []
    z, g = x.z, x.setup.cluster.gpus_per_node
    raw_aio = x.raw.get("aio")
    aio = raw_aio if isinstance(raw_aio, dict) else {}
    if not z.nvme:
        if aio:
            found.append(noop("aio", "only NVMe offload reads it (no offload device is 'nvme')"))
        return found
    per_rank = x.est.host_terms
    disk = x.est.nvme_term
    for kind in ("offload_param", "offload_optimizer"):
        section = x.zero.get(kind)
        if offload_device(section) != Offload.NVME:
            continue
        found.append(
            Finding(
                f"zero_optimization.{kind}.nvme_path",
                "info",
                f"zero_optimization.{kind}.nvme_path {z.nvme_path}: swap files of {size(disk.bytes)} per "
                f"node ({disk.formula}); use a local NVMe drive per node, not a network file system",
                "keep it; check its bandwidth with `zerokit calibrate --nvme PATH`",
            )
        )
    if z.offload_param is Offload.NVME:
        largest = max(nvme.swapped_params(x.setup), default=0)
        pool = z.buffer_count * nvme.io_aligned(z.buffer_size, x.p, x.setup) * x.p
        found.append(
            Finding(
                "zero_optimization.offload_param.buffer_size",
                "info",
                f"zero_optimization.offload_param.buffer_count x buffer_size: {z.buffer_count} x "
                f"{z.buffer_size:,} elements = {size(pool)} pinned per rank, {size(pool * g)} per node; "
                f"each must hold the largest swapped partition ({largest:,})",
                "keep buffer_size just above the largest partition; more buffers prefetch further",
            )
        )
        held = x.est.host_terms[Component.PARAMETERS]
        found.append(
            Finding(
                "zero_optimization.offload_param.max_in_cpu",
                "info",
                f"zero_optimization.offload_param.max_in_cpu {z.max_in_cpu:,}: that many partition elements "
                f"stay in pinned CPU RAM instead of the drive: {size(held.bytes)} per rank ({held.formula})",
                "lower it when CPU RAM is short (0 keeps every swappable partition on NVMe)",
            )
        )
    if z.offload_optimizer is Offload.NVME:
        buffers = per_rank[Component.BUFFERS]
        found.append(
            Finding(
                "zero_optimization.offload_optimizer.buffer_count",
                "info",
                f"zero_optimization.offload_optimizer.buffer_count {z.optimizer_buffer_count}: pinned "
                f"buffers of the largest sub group; host buffers {size(buffers.bytes)} per rank "
                f"({buffers.formula})",
                "keep >= 1 + the optimizer's states (Adam: 3); lower sub_group_size to shrink each buffer",
            )
        )
    if "thread_count" in aio:
        found.append(
            Finding(
                "aio.thread_count",
                "warning",
                "aio.thread_count: DeepSpeed 0.19 ignores it (aio_config.py reads intra_op_parallelism)",
                "rename it to intra_op_parallelism",
            )
        )
    least = nvme.min_swap_bytes(x.setup)
    found.append(
        Finding(
            "aio",
            "info",
            f"aio: block_size {z.aio.block_size:,} B, queue_depth {z.aio.queue_depth}, intra_op_parallelism "
            f"{z.aio.intra_op_parallelism}: tensors under {least:,} B (max(1 MiB, block_size)) stay in RAM; "
            f"swap files are multiples of {AIO_ALIGNED_BYTES * z.aio.intra_op_parallelism:,} B",
            "tune them on the drive with DeepSpeed's ds_nvme_tune / ds_io",
        )
    )
    return found
