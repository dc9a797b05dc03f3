"""The memory components, in the order every table and plot shows them.

``Component`` names one (a ``StrEnum``: its members are the strings records, JSON files and table
columns hold, as PyTorch's ``mem_tracker._MemRefType``); the tuples group them:

- ``MODEL_STATES``: what the ZeRO paper partitions (parameters, gradients, optimizer states);
- ``HELD``: what a rank holds in DeepSpeed's structures: the model states plus DeepSpeed's buffers
  (``kit.estimate.rank_states`` predicts it, ``kit.ranks.state_walk`` measures it);
- ``MEASURED``: what a run measures per rank, ``HELD`` plus the activations saved for backward;
- ``COMPONENTS``: the estimate's bytes per GPU, ``MEASURED`` plus the runtime overhead.
"""

from enum import StrEnum


class Component(StrEnum):
    """One memory component, in the estimate's order (``COMPONENTS``)."""

    PARAMETERS = "parameters"
    GRADIENTS = "gradients"
    OPTIMIZER_STATES = "optimizer_states"
    ACTIVATIONS = "activations"
    BUFFERS = "buffers"
    OVERHEAD = "overhead"


MODEL_STATES = (Component.PARAMETERS, Component.GRADIENTS, Component.OPTIMIZER_STATES)
HELD = (*MODEL_STATES, Component.BUFFERS)
MEASURED = (*HELD, Component.ACTIVATIONS)
COMPONENTS = tuple(Component)
