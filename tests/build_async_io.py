"""DeepSpeed's async_io op (NVMe offload's reads and writes) JIT-built ahead of tests/test_nvme.py.

``make test`` starts this in the background at ``nice 19`` once torch and DeepSpeed are installed, while
the kit installs and lint runs (the build is about 320 CPU-seconds of g++ on 2 cores; ``import kit`` needs
only pydantic, which DeepSpeed brings), then runs it again before the tests: the second waits on torch's
build lock until the first build ends, then loads the op. It builds in the ranks' environment (``worker_env``:
the venv's ninja first on PATH, the CPU accelerator without CUDA), so the ranks' ninja finds nothing to redo.
Prints one line: the seconds it took, or why nothing was built.
"""

from __future__ import annotations

import os
import sys
import time


def main() -> int:
    from kit.run.launcher import worker_env

    os.environ.update({k: v for k, v in worker_env(1).items() if k in ("PATH", "DS_ACCELERATOR")})
    from deepspeed.ops.op_builder import AsyncIOBuilder

    if not AsyncIOBuilder().is_compatible(verbose=False):
        print("async_io: not built, libaio is missing (make libaio)")
        return 1
    start = time.perf_counter()
    AsyncIOBuilder().load(verbose=False)
    where = os.environ.get("TORCH_EXTENSIONS_DIR", "~/.cache/torch_extensions")
    print(f"async_io: ready in {time.perf_counter() - start:.0f} s ({where})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
