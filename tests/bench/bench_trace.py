"""Activation traces under FakeTensorMode (``kit.estimate.trace``): seconds to trace one micro-step of
Llama-2-7B at sequence 4096, micro batch 1 (target: under 5 s on 2 cores, so the panels stay live) and
of Llama-2-70B, the first (cold) trace and the median of warm ones, plus the trace over the formula.
"""

import statistics
import time

from kit import models
from kit.estimate import estimate, trace
from kit.schema import Setup


def seconds(spec, repeat: int) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        trace.traced_at(spec, 1, 4096, "bf16")  # past both caches: time the trace itself
        times.append(time.perf_counter() - start)
    return times[0], statistics.median(times[1:] or times)


def main() -> None:
    trace.trace(models.resolve("toy"), 1, 16, "bf16")  # imports (transformers, torch) before timing
    for name, repeat in (("llama-2-7b", 4), ("llama-2-70b", 2)):
        spec = models.preset(name)
        cold, warm = seconds(spec, repeat)
        key = name.replace("-", "")
        print(f"trace_{key}_seq4096_cold: {cold:.2f} s")
        print(f"trace_{key}_seq4096_warm_median: {warm:.2f} s")
        e = estimate(Setup(model=spec, batch={"micro_batch": 1, "seq_len": 4096}), trace=True)
        print(f"trace_over_formula_{key}: {e.trace.saved_bytes / e.components['activations']:.4f} ratio")
