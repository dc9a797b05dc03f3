"""Your own model: a Python file (or an importable module) that follows a two-function contract.

    # my_model.py
    def model() -> torch.nn.Module: ...        # forward(*batch) returns a scalar loss
    def batch(micro_batch: int) -> tuple: ...  # one micro batch of inputs (CPU tensors)

``zerokit estimate --model my_model.py`` (or ``--model pkg.module``) counts the model on the meta device
(nothing allocated), traces its activations (``kit.estimate.trace``) and ``zerokit run`` trains it on
real ranks (``kit.workloads``). Every problem in the user's code (the import, ``model()``, ``batch()``,
a forward that does not return a scalar) becomes one line naming the file and the function, before
anything launches. Initialise parameters in the modules' constructors (as ``reset_parameters`` does):
at ZeRO stage 3 the model is built partitioned under ``deepspeed.zero.Init``, where an initialisation
done later on the whole model would touch empty partitions.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import traceback
from functools import cache
from pathlib import Path
from types import ModuleType

CONTRACT = (
    "model() -> torch.nn.Module whose forward(*batch) returns a scalar loss; batch(micro_batch) -> tuple"
)


def is_source(text: str) -> bool:
    """Whether ``text`` names a model file (``*.py``) or an importable module with the contract."""
    if text.endswith(".py"):
        return True
    if not text.replace(".", "").replace("_", "").isalnum() or text[0].isdigit():
        return False
    try:
        return importlib.util.find_spec(text) is not None
    except (ImportError, ValueError):
        return False


def canonical(text: str) -> str:
    """The source as ranks will load it: a model file's absolute path, or the module name."""
    if text.endswith(".py"):
        path = Path(text).expanduser().resolve()
        if not path.is_file():
            raise ValueError(f"model: no such model file: {text}")
        return str(path)
    return text


def load(source: str) -> ModuleType:
    """The module of a model file or module name, imported once per process; errors name the file."""
    return _load(canonical(source))


@cache
def _load(source: str) -> ModuleType:
    try:
        if source.endswith(".py"):
            name = f"zerokit_model_{Path(source).stem}"
            spec = importlib.util.spec_from_file_location(name, source)
            assert spec is not None and spec.loader is not None  # a .py path: a SourceFileLoader's spec
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(source)
    except Exception as error:
        sys.modules.pop(f"zerokit_model_{Path(source).stem}", None)
        raise ValueError(f"model: importing {source} raised {where(error, source)}") from None
    missing = [f for f in ("model", "batch") if not callable(getattr(module, f, None))]
    if missing:
        raise ValueError(f"model: {source} defines no {' or '.join(f + '()' for f in missing)} ({CONTRACT})")
    return module


def build(source: str):
    """``model()`` of the source (on the caller's device, meta device or FakeTensorMode)."""
    import torch

    try:
        module = load(source).model()
    except Exception as error:
        raise ValueError(f"model: {source}:model() raised {where(error, source)}") from None
    if not isinstance(module, torch.nn.Module):
        raise ValueError(f"model: {source}:model() returned {type(module).__name__}, not a torch.nn.Module")
    return module


def make_batch(source: str, micro_batch: int) -> tuple:
    """``batch(micro_batch)`` of the source, checked: a tuple of tensors (or other forward arguments)."""
    import torch

    try:
        inputs = load(source).batch(micro_batch)
    except Exception as error:
        raise ValueError(f"model: {source}:batch({micro_batch}) raised {where(error, source)}") from None
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    if not isinstance(inputs, (tuple, list)) or not any(isinstance(x, torch.Tensor) for x in inputs):
        raise ValueError(
            f"model: {source}:batch({micro_batch}) returned {type(inputs).__name__}, "
            "expected a tuple of tensors (the forward's positional arguments)"
        )
    return tuple(inputs)


def check_loss(source: str, loss) -> None:
    """A forward must return one scalar tensor (the loss to backpropagate)."""
    import torch

    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        got = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ValueError(f"model: {source}: forward(*batch) returned {got}, expected a scalar loss tensor")


def spec_fields(source: str) -> dict:
    """ModelSpec fields of a model file: counts of ``model()`` built on the meta device, the source."""
    import torch

    from kit.hf_models import module_counts

    source = canonical(source)
    with torch.device("meta"):
        module = build(source)
    name = Path(source).stem if source.endswith(".py") else source.rpartition(".")[2]
    return {"name": name, "source": source, **module_counts(module)}


@cache
def tensor_shapes(source: str) -> tuple[tuple[int, ...], ...]:
    """Every parameter tensor's shape, in module order, of ``model()`` built on the meta device."""
    import torch

    with torch.device("meta"):
        return tuple(tuple(p.shape) for p in build(source).parameters())


def where(error: BaseException, source: str | None = None) -> str:
    """``ValueError: bad size (my_model.py line 12, in batch)``: the error and its deepest frame in
    the user's file ``source`` (the last frame when none is there, or no source is given)."""
    frames = traceback.extract_tb(error.__traceback__)
    mine = [
        f for f in frames if source and (f.filename == source or Path(f.filename).stem == Path(source).stem)
    ]
    candidates = mine or frames
    frame = candidates[-1] if candidates else None
    text = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
    if frame is None:
        return text
    return f"{text} ({Path(frame.filename).name} line {frame.lineno}, in {frame.name})"
