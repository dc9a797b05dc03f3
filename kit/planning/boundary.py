"""Where a setup stops fitting: the largest micro batch per GPU, and the longest sequence at a micro batch.

Both are one search (``_largest``): the largest n whose estimate fits the GPU (``Estimate.fits``, the fit
rule's verdict), by lines rather than by doubling. Past the point where something else leads the peak,
the peak per GPU grows about linearly with the micro batch (the activations), and convexly with the
sequence (attention's s^2 terms), so the line through the last two estimates meets the GPU's memory near
the boundary; the search keeps a bracket (fits at ``low``, not at ``high``) and halves it instead when two
lines in a row did not narrow it. A handful of estimates (each a trace for a traced model) instead of a
doubling search's dozen, exact as long as more never needs less memory.

What it cannot see: a setting whose memory falls as it grows (none of the kit's models does).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from kit.gpus import gpu
from kit.schema import Setup

#: ``largest_micro_batch``'s first try after micro batch 1
FIRST_PROBE = 64


def largest_micro_batch(setup: Setup, limit: int = 65536) -> int:
    """The largest micro batch per GPU that ``kit.estimate`` says fits (0 if not even 1 does; ``limit``
    if that fits)."""

    def per_gpu(micro: int) -> tuple[bool, int]:
        return _fits(setup.replace(batch={"micro_batch": micro}))

    return _largest(per_gpu, setup, limit, first=(1, FIRST_PROBE))


def longest_sequence(setup: Setup, limit: int, step: int = 8) -> int:
    """The longest sequence, a multiple of ``step`` tokens below ``limit``, at which ``setup``'s micro
    batch fits its GPU (0 if not even ``step`` tokens do), where ``setup`` itself (at ``limit`` tokens)
    does not fit: the search starts from its estimate. An encoder-decoder's target keeps its own length
    where the setup gives one, else follows the source (``Batch.target_len``)."""
    if not 1 <= step < limit:
        raise ValueError(f"longest_sequence: step must be 1..{limit - 1} tokens (below limit), got {step}")
    from kit.estimate import trace

    with trace.alone():  # one micro batch at each length: each traced itself
        units = -(-limit // step)  # the first multiple of step at or above limit: known not to fit
        at_limit = _fits(setup.replace(batch={"seq_len": limit}))
        if at_limit[0]:
            raise ValueError(f"longest_sequence: {limit} tokens fit; ask for a longer limit")

        def per_gpu(n: int) -> tuple[bool, int]:
            return at_limit if n == units else _fits(setup.replace(batch={"seq_len": n * step}))

        return step * _largest(per_gpu, setup, units - 1, first=(units, units // 2))


def _fits(setup: Setup) -> tuple[bool, int]:
    """The fit rule's verdict on ``setup``'s GPU and the bytes per GPU it weighed."""
    from kit.estimate import estimate
    from kit.fit import estimate_fit, shown_bytes

    e = estimate(setup)
    verdict = estimate_fit(e)
    return verdict.ok, shown_bytes(e, verdict)


def _largest(
    per_gpu: Callable[[int], tuple[bool, int]], setup: Setup, limit: int, first: tuple[int, ...]
) -> int:
    """The largest n in 1..``limit`` for which ``per_gpu(n)`` fits (0: not even 1), by lines (see the
    module docstring); ``first``: the first tries (one above ``limit`` is known not to fit: it only
    anchors the first line)."""
    capacity = gpu(setup.cluster.gpu).memory_bytes
    peaks: dict[int, int] = {}
    tried: list[int] = []
    low, high, slow = 0, limit + 1, 0  # fits at low (0: none yet), not at high
    while high - low > 1:
        a, b = tried[-2:] if len(tried) > 1 else (0, 0)
        if len(tried) < len(first):
            guess = first[len(tried)]
            guess = guess if guess > limit else min(max(guess, low + 1), high - 1)
        elif slow < 2 and a and peaks[a] != peaks[b]:  # the last n the line fits, kept inside the bracket
            crossing = b + (capacity - peaks[b]) * (b - a) / (peaks[b] - peaks[a])
            guess = min(max(math.floor(crossing), low + 1), high - 1)
        else:  # no line, or a bracket lines did not narrow: halve it, or double
            guess, slow = ((low + high) // 2 if high <= limit else min(limit, 2 * low)), 0
        width = high - low
        ok, peaks[guess] = per_gpu(guess)
        tried.append(guess)
        if guess <= limit:
            low, high = (guess, high) if ok else (low, guess)
            slow = slow + 1 if high - low > width // 2 else 0
    return low
