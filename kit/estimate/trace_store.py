"""Traces kept on disk between processes: ``kit.estimate.trace``'s figures, by what decides them.

A trace of a large model takes seconds to a minute (FakeTensorMode dispatches every op of a forward and a
backward), and the notebooks, ``zerokit published``, a search and a panel reopened the next day ask for the
same ones. Each trace is one JSON file under ``ZEROKIT_CACHE`` (default ``$XDG_CACHE_HOME/zerokit``, else
``~/.cache/zerokit``; ``off`` keeps nothing), named by a hash of everything that decides it: the model (its
settings; for a model file, the file's bytes), the micro batch, the lengths, the precision, the trainable
subset, the versions of torch, transformers and peft, and every source file of ``kit``: a change to any of
them traces afresh. A trace that fails is never kept (its error is raised again). The ranks of a run trace
where they run (``kit.ranks.worker`` turns the store off: a model file may behave otherwise there). Cannot
see: what a model file imports from elsewhere or reads from its environment, and a model given as a module
name rather than a file (not kept).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from functools import lru_cache
from pathlib import Path

from kit import paths
from kit.schema import ModelSpec

#: the environment variable naming the folder (``off``: keep nothing)
ENV = "ZEROKIT_CACHE"


def folder() -> Path | None:
    """Where traces are kept, or None when ``ZEROKIT_CACHE=off``."""
    chosen = os.environ.get(ENV, "")
    if chosen == "off":
        return None
    if chosen:
        return Path(chosen) / "traces"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "zerokit" / "traces"


@lru_cache(maxsize=1)
def _code() -> str:
    """A hash of the versions of torch, transformers and peft and of every source file of ``kit``."""
    from importlib.metadata import version

    digest = hashlib.sha256(" ".join(version(p) for p in ("torch", "transformers", "peft")).encode())
    for path in sorted(paths.PACKAGE.rglob("*.py")):
        digest.update(str(path.relative_to(paths.PACKAGE)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def key(spec: ModelSpec, *figures: object) -> str | None:
    """The file name of the trace of ``spec`` at ``figures`` (micro batch, lengths, precision, subset), or
    None where it cannot be told (a model given as a module name, a model file that cannot be read)."""
    model = spec.model_dump()
    if spec.source:
        try:
            model["source"] = hashlib.sha256(Path(spec.source).read_bytes()).hexdigest()
        except OSError:
            return None
    text = json.dumps([model, list(figures), _code()], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def load(name: str | None) -> dict | None:
    """The figures kept under ``name``, or None (nothing kept, unreadable, or the store is off)."""
    where = folder()
    if name is None or where is None:
        return None
    try:
        return json.loads((where / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None


def save(name: str | None, figures: dict) -> None:
    """Keep ``figures`` under ``name`` (written whole, then renamed: a reader never sees half a file); a
    folder that cannot be written keeps nothing."""
    where = folder()
    if name is None or where is None:
        return
    try:
        where.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=where, suffix=".tmp", delete=False) as out:
            json.dump(figures, out)
        os.replace(out.name, where / f"{name}.json")
    except OSError:
        return
