"""zero-kit: estimate, compare and export DeepSpeed ZeRO settings before you book a cluster.

The one data flow (docs/architecture.md): build a ``Setup`` (model, cluster, ZeRO settings, batch),
then estimate it (``kit.estimate.estimate``), export it (``kit.ds_config.to_ds_config``), or run it
for real (``run_sweep``, read back as ``Results``). The top level is the small API the notebooks and
README use; everything else lives in subpackages named for their room:

- ``kit`` itself: the torch-free core (``schema``, ``batch``, ``models``, ``gpus``, ``ds_config``,
  ``rules``, ``components``, ``records``, ``units``, ``paths``; ``monitor``: heartbeats of every rank,
  ``kit.monitor.heartbeat(engine_or_none, folder, ...)`` in a training loop, read back by ``read``);
- ``kit.estimate``: memory model, activations, planning, checkpoint sizes (never imports torch);
- ``kit.run``: launcher, sweep runner, results (the parent side);
- ``kit.ranks``: what runs inside a launched rank;
- ``kit.scaleout``: hostfiles, launch commands, network presets, doctor, commtest, checkpoints;
- ``kit.lab``: notebook panels, plots, teaching tables;
- ``kit.cli``: the ``zerokit`` command, one module per command group.

Heavy dependencies are imported where a feature needs them: ``import kit`` needs only pydantic;
``run_sweep``, ``Results`` and the panels are loaded on first use.
"""

from typing import Any

from kit import estimate, models, monitor
from kit.batch import BatchError, decompositions
from kit.schema import Batch, Cluster, ModelSpec, Setup, ZeroSettings

__all__ = [
    "Batch",
    "BatchError",
    "Cluster",
    "ModelSpec",
    "Results",
    "Setup",
    "ZeroSettings",
    "comparison_panel",
    "decompositions",
    "estimate",
    "memory_panel",
    "models",
    "monitor",
    "run_sweep",
]
__version__ = "0.1.0"

#: names loaded on first use, so that ``import kit`` stays light (pandas, ipywidgets)
_LAZY = {
    "run_sweep": "kit.run.sweep",
    "Results": "kit.run.results",
    "memory_panel": "kit.lab.widgets",
    "comparison_panel": "kit.lab.widgets",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'kit' has no attribute {name!r}")
