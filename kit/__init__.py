"""zero-kit: estimate, compare and export DeepSpeed ZeRO settings before you book a cluster.

The one data flow: build a ``Setup`` (model, cluster, ZeRO settings, batch), then ``estimate`` it,
export it (``to_ds_config``), or ``run_sweep`` it for real. Heavy dependencies (torch, deepspeed)
are imported only by the features that need them.
"""

from kit.batch import BatchError, decompositions
from kit.setup import Batch, Cluster, ModelSpec, Setup, ZeroSettings

__all__ = ["Batch", "BatchError", "Cluster", "ModelSpec", "Setup", "ZeroSettings", "decompositions"]
__version__ = "0.1.0"
