"""Memory per GPU and CPU RAM per node for a Setup, before anything is booked or launched.

``estimate(setup)`` returns an ``Estimate`` (bytes per component, each with its formula; fit per GPU
type); ``rank_states(setup, rank)`` the exact model-state bytes one rank holds, the prediction runs
measure. Importing this package never imports torch or deepspeed (tests/test_layout.py checks).

Modules: ``memory`` (the implementation-faithful formula), ``paper`` (the ZeRO paper's), ``activations``,
``peak`` (the peak per phase), ``reserved`` (the caching allocator's replay), ``partition`` (how DeepSpeed
splits tensors across ranks), ``checkpoint_size``, ``result`` (``Term`` and ``Estimate``). Seconds per
step are ``kit.steptime``'s, plans ``kit.planning``'s.
"""

from kit.estimate.memory import FORMULAS, estimate, rank_states
from kit.estimate.partition import partition_numel
from kit.estimate.result import Estimate, Term

__all__ = ["FORMULAS", "Estimate", "Term", "estimate", "partition_numel", "rank_states"]
