"""zero-kit: estimate, compare and export DeepSpeed ZeRO settings before you book a cluster.

The one data flow (docs/architecture.md), each step one name here:

- build a ``Setup`` (``ModelSpec``, ``Cluster``, ``ZeroSettings``, ``Batch``; ``models`` makes the
  ModelSpec from a preset, a config.json, a model file or a count; ``decompositions`` lists the batch
  splits);
- estimate it: ``estimate.estimate(setup)`` (memory, the ``kit.estimate`` package; seconds per step in
  ``kit.steptime``);
  ``plan(setup, ...)``: every GPU type, cluster size and ZeRO variant that fits, timed and priced;
- export it: ``to_ds_config(setup)``; read an existing one back: ``explain_ds_config(path, model=...)``;
- run it for real: ``run_sweep([setups])``, read back as ``Results``; ``tune(setup, budget_bytes=...)``
  measures the candidates that fit and keeps the fastest;
- in a notebook: ``memory_panel``, ``comparison_panel``, ``plan_panel`` and ``monitor_panel``;
  ``monitor.heartbeat`` in any training loop feeds the last one.

The rooms (subpackages) behind these names:

- ``kit`` itself: the torch-free core (``schema``, ``batch``, ``models``, ``gpus``, ``ds_config``,
  ``rules``, ``components``, ``records``, ``units``, ``paths``, ``monitor``);
- ``kit.estimate``: memory model, activations, the peak per phase, checkpoint sizes (never imports torch);
- ``kit.steptime``: seconds per step on a GPU type; ``kit.planning``: the search and the booking;
- ``kit.review``: the review of a ds_config; ``kit.accuracy``: the kit beside real GPU runs;
- ``kit.run``: launcher, sweep runner, results, tuning (the parent side);
- ``kit.ranks``: what runs inside a launched rank;
- ``kit.scaleout``: hostfiles, launch commands, network presets, doctor, commtest, checkpoints;
- ``kit.lab``: the notebooks' panels, figures, teaching tables and smoke profile;
- ``kit.cli``: the ``zerokit`` command, one module per command group.

``import kit`` needs only pydantic: every name of ``_LAZY`` is loaded from its module on first use
(pandas, ipywidgets, DeepSpeed's parser come with the feature that needs them).
"""

from typing import Any

from kit.batch import BatchError, decompositions
from kit.schema import Batch, Cluster, ModelSpec, Setup, ZeroSettings

__version__ = "0.1.0"

#: the subpackages and modules named here, imported on first use (``zerokit estimate`` needs no monitor)
_MODULES = ("estimate", "models", "monitor")
#: name -> (module, attribute), loaded on first use so that ``import kit`` stays light
_LAZY = {
    "plan": ("kit.planning.plan", "search"),
    "to_ds_config": ("kit.ds_config", "to_ds_config"),
    "explain_ds_config": ("kit.review", "explain_ds_config"),
    "run_sweep": ("kit.run.sweep", "run_sweep"),
    "Results": ("kit.run.results", "Results"),
    "tune": ("kit.run.tune", "tune"),
    "memory_panel": ("kit.lab.memory_panel", "memory_panel"),
    "comparison_panel": ("kit.lab.comparison_panel", "comparison_panel"),
    "plan_panel": ("kit.lab.plan_panel", "plan_panel"),
    "monitor_panel": ("kit.lab.monitor_panel", "monitor_panel"),
}

__all__ = [
    "Batch",
    "BatchError",
    "Cluster",
    "ModelSpec",
    "Setup",
    "ZeroSettings",
    "decompositions",
    *_MODULES,
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    import importlib

    if name in _MODULES:
        return importlib.import_module(f"kit.{name}")
    if name in _LAZY:
        module, attribute = _LAZY[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'kit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_MODULES, *_LAZY})
