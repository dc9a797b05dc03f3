"""The kit's toy models as the runs use them, in one place: their shapes, their bucket sizes and the Setups
the demo, the notebooks, the tests and the calibration run.

- ``TOY_ZERO``: the small buckets every toy run takes;
- ``toy_setup``: the default toy Setup (the tiny GPT-2 on one node); ``hpz_toy_setups``: the same GPT on 2
  simulated nodes, without and with hpZ;
- ``SMOKE_TOY``, ``REAL_TOY``: the notebooks' toy GPT shapes (``kit.lab.notebook.profile``);
- ``calibration_toy``: the model ``zerokit calibrate --measure`` measures without ``--model``.

What it cannot see: the toys' architecture, which is ``kit.models.toy_spec`` (beside ``from_hf_config``,
since ``kit.models.resolve`` takes the names ``toy`` and ``toy-dit``), and the modules themselves, which
``kit.workloads.toymodels`` builds with torch. Importing it loads no torch (``calibration_toy`` reads its
config with transformers when called).
"""

from __future__ import annotations

from kit.models import override, toy_spec
from kit.schema import ModelSpec, Setup

#: bucket sizes (elements) for runs of the toy models: DeepSpeed's 5e8-element defaults would make
#: stage 3 allocate a 1 GB bf16 reduce bucket per rank for a model of 0.14M parameters
TOY_ZERO = {"reduce_bucket_size": 500_000, "allgather_bucket_size": 500_000, "prefetch_bucket_size": 250_000}
#: the toy GPT's shape: tiny for CPU ranks, GPT-2 small's on GPUs (``kit.models.toy_spec``'s arguments)
SMOKE_TOY = {"layers": 2, "hidden": 64, "heads": 4, "vocab": 512, "seq_len": 64}
REAL_TOY = {"layers": 12, "hidden": 768, "heads": 12, "vocab": 50257, "seq_len": 1024}


def toy_setup(nprocs: int = 2) -> Setup:
    """The tiny GPT-2 (``kit.models.toy_spec``) on one node of ``nprocs`` ranks, micro batch 2, with the
    ``TOY_ZERO`` buckets: what the demo, the comparison panel and the checkpoint round trip run."""
    return Setup(
        model=toy_spec(),
        cluster={"nodes": 1, "gpus_per_node": nprocs},
        zero=TOY_ZERO,
        batch={"micro_batch": 2},
    )


def calibration_toy() -> ModelSpec:
    """What ``zerokit calibrate --measure`` measures without --model: a toy GPT of 4 blocks of width 256
    (``kit.models.override`` reads the config with transformers, so it is built on call, not on import)."""
    return override(toy_spec(), {"hidden": 256, "layers": 4, "ffn": 1024})


def hpz_toy_setups() -> dict[str, Setup]:
    """The toy GPT on 2 simulated nodes x 2 ranks at stage 3, without and with hpZ over each node: its
    biases and norms kept whole (persistence threshold 1,000), its matrices released and so given
    secondary partitions, and no prefetch or reuse, so that backward gathers again (from the secondary
    partition with hpZ). What notebooks 05 and 09 and ``tests/test_zeropp.py`` run
    (``kit.run.local_nodes.run_setups_on_local_nodes``)."""
    zero = {**TOY_ZERO, "stage": 3, "prefetch_bucket_size": 0, "max_live_parameters": 0}
    zero |= {"max_reuse_distance": 0, "param_persistence_threshold": 1000}
    base = Setup(
        model=toy_spec(), cluster={"nodes": 2, "gpus_per_node": 2}, zero=zero, batch={"micro_batch": 1}
    )
    return {"ZeRO-3": base, "hpZ": base.replace(zero={"hpz_partition_size": 2})}
