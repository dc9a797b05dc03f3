"""The ZeRO paper's idealised model states (Rajbhandari et al. 2020, section 3 and Table 1).

``(2 + 2 + K) Psi`` bytes for mixed-precision Adam (K = 12: fp32 master, momentum and variance); in fp32
``(4 + 4 + K) Psi`` with K = 8 (no master copy). Each state is divided by ``Nd`` from the stage that
partitions it (``kit.rules.SHARDED``). No buffers,
activations or overhead: a teaching formula, not a prediction.
"""

from __future__ import annotations

from kit.components import COMPONENTS, HELD, MODEL_STATES
from kit.estimate.result import NONE, Estimate, Term
from kit.rules import FP32, SHARDED, element_bytes, master_bytes, optimizer_states
from kit.schema import Setup

NOT_IN_PAPER = Term(0, "not part of the ZeRO paper's model-state formula")


def zero_paper(setup: Setup) -> Estimate:
    z, n, psi = setup.zero, setup.zero_dp, setup.model.params
    p = element_bytes(z.precision)
    k = master_bytes(z.precision) + FP32 * optimizer_states(z.optimizer, z.momentum)
    terms: dict[str, Term] = dict.fromkeys(COMPONENTS, NOT_IN_PAPER)
    for name, b in zip(MODEL_STATES, (p, p, k), strict=True):
        d = n if name in SHARDED[z.stage] else 1
        terms[name] = Term(int(b * psi / d), f"{b} B x Psi / {d} = {b} x {psi:,} / {d}")
    host: dict[str, Term] = dict.fromkeys(HELD, NONE)
    note = (
        f"ZeRO paper: ({p} + {p} + K) Psi model states ({z.precision} parameters and gradients), K = {k}, "
        f"stage {z.stage} shards by Nd = {n}"
    )
    return Estimate(setup, "zero-paper", terms, host, NOT_IN_PAPER, (note,))
