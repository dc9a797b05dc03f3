"""The names of memory components, in the order every table and plot shows them.

- ``MODEL_STATES``: what the ZeRO paper partitions (parameters, gradients, optimizer states);
- ``HELD``: what a rank holds in DeepSpeed's structures: the model states plus DeepSpeed's buffers
  (``kit.estimate.rank_states`` predicts it, ``kit.ranks.state_walk`` measures it);
- ``MEASURED``: what a run measures per rank, ``HELD`` plus the activations saved for backward;
- ``COMPONENTS``: the estimate's bytes per GPU, ``MEASURED`` plus the runtime overhead.
"""

MODEL_STATES = ("parameters", "gradients", "optimizer_states")
HELD = (*MODEL_STATES, "buffers")
MEASURED = (*HELD, "activations")
COMPONENTS = ("parameters", "gradients", "optimizer_states", "activations", "buffers", "overhead")
