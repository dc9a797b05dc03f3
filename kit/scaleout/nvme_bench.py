"""Read and write GB/s of a folder's drive through DeepSpeed's own async_io op (what NVMe offload uses).

``measure(path)`` writes one pinned buffer to a file under ``path`` with the op's ``async_pwrite``, reads
it back with ``async_pread`` (the swappers' calls, ``deepspeed/runtime/swap_tensor/utils.py``) and times
both, with the ``aio`` block of a Setup; ``zerokit calibrate --nvme PATH`` prints it. DeepSpeed's
``ds_nvme_tune`` / ``ds_io`` sweep the aio settings for the best figure; this is one setting, one file.

What it cannot see: the page cache (the op opens files with O_DIRECT where the file system allows, but a
tmpfs or a network mount measures memory or the network, not a drive) and concurrent ranks sharing the
drive (the step-time model divides a node's bandwidth among its GPUs itself).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from kit.schema import AioSettings


def measure(path: str | Path, mib: int = 256, aio: AioSettings | None = None, repeats: int = 3) -> dict:
    """``{"read_gbps", "write_gbps", "bytes", "path", "aio"}``: the best of ``repeats`` transfers of ``mib``
    MiB (GB = 1e9 bytes). Needs the async_io op (libaio); ValueError naming the field otherwise."""
    import torch
    from deepspeed.ops.op_builder import AsyncIOBuilder

    folder = Path(path)
    if not folder.is_dir():
        raise ValueError(f"nvme: {folder} is not a folder")
    if mib < 1:
        raise ValueError(f"mib: must be >= 1, got {mib}")
    if not AsyncIOBuilder().is_compatible(verbose=False):
        raise ValueError("nvme: DeepSpeed's async_io op cannot be built here: install libaio-dev (apt)")
    aio = aio or AioSettings()
    # the venv's ninja, as the ranks use (kit.run.launcher.worker_env): another ninja rebuilds the op
    bin_dir = os.path.dirname(sys.executable)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join(p for p in (bin_dir, os.environ.get("PATH")) if p)
    handle = (
        AsyncIOBuilder()
        .load(verbose=False)
        .aio_handle(
            block_size=aio.block_size,
            queue_depth=aio.queue_depth,
            single_submit=aio.single_submit,
            overlap_events=aio.overlap_events,
            intra_op_parallelism=aio.intra_op_parallelism,
        )
    )
    numel = mib * 2**20
    buffer = handle.new_cpu_locked_tensor(numel, torch.empty(0, dtype=torch.uint8)).random_(0, 255)
    fd, name = tempfile.mkstemp(prefix="zerokit-nvme-", suffix=".swp", dir=folder)
    os.close(fd)
    try:
        writes, reads = [], []
        for _ in range(repeats):
            start = time.perf_counter()
            handle.async_pwrite(buffer, name, 0)
            handle.wait()
            writes.append(time.perf_counter() - start)
            start = time.perf_counter()
            handle.async_pread(buffer, name, 0)
            handle.wait()
            reads.append(time.perf_counter() - start)
    finally:
        os.unlink(name)
        handle.free_cpu_locked_tensor(buffer)
    return {
        "path": str(folder),
        "bytes": numel,
        "write_gbps": numel / min(writes) / 1e9,
        "read_gbps": numel / min(reads) / 1e9,
        "aio": aio.model_dump(),
    }
