"""JupyterLab as ``make lab`` starts it, and as ``make e2e`` tests it: one environment, one command line.

Its kernels get the ranks' accelerator rule (``kit.run.launcher.on_this_accelerator``): without a GPU,
``DS_ACCELERATOR=cpu``, so a notebook that imports DeepSpeed in its kernel (06's checkpoints) shows no
warning about the accelerator it falls back to. Run ``python -m kit.lab.server [FOLDER] [jupyter lab
options]`` (``make lab``: ``notebooks``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment JupyterLab and its kernels run in: ``base`` (this process's) with the accelerator
    DeepSpeed would otherwise warn about choosing."""
    from kit.run.launcher import on_this_accelerator

    return on_this_accelerator(dict(os.environ if base is None else base))


def command(folder: str | os.PathLike, *options: str) -> list[str]:
    """``jupyter lab`` on ``folder`` from this Python's environment, with ``options``."""
    root = ["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    return [str(Path(sys.executable).parent / "jupyter"), "lab", str(folder), *root, *options]


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    folder, options = (args[0], args[1:]) if args and not args[0].startswith("-") else ("notebooks", args)
    argv = command(folder, *options)
    os.execve(argv[0], argv, environment())


if __name__ == "__main__":
    main()
