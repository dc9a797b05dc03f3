"""The ZeRO-Infinity paper's memory and bandwidth requirements (Rajbhandari et al. 2021, arXiv 2104.07857).

Section 3 sizes a GPT-like transformer of ``nl`` layers and hidden ``hd`` (``Psi = 12 nl hd^2``
parameters) for mixed-precision Adam:

- model states: 20 bytes per parameter, ``240 nl hd^2`` (16-bit parameter and gradient, fp32 parameter,
  momentum, variance and gradient: 2 + 2 + 4 x 4);
- activation checkpoints: ``2 bsz seq hd nl / ci`` bytes (one 16-bit layer input every ``ci`` layers);
- model-state working memory: the largest operator's 16-bit parameters and gradients, the ``hd x 4hd``
  linear: ``16 hd^2`` bytes per GPU;
- activation working memory: ``bsz seq ci (16 hd + 2 attn_heads seq)`` bytes per GPU, bsz the GPU's
  micro batch.

Section 4's bandwidth analysis: ``efficiency = ait x bw / (ait x bw + peak_tp)`` with arithmetic intensity
(FLOPs per byte moved) ``seq x bsz`` for parameters and gradients, ``seq x bsz / 4`` for optimizer states
and ``24 hd ci`` for activation checkpoints; solved for the bandwidth: ``bw = e / (1 - e) x peak_tp / ait``.
The paper's Figure 2a models (0.1T-100T parameters) are ``PAPER_MODELS``; its numbers use ``peak_tp``
70 TFLOP/s (achievable on a V100), sequence 1024, batch 32 for the checkpoints and a micro batch of 4
per GPU for the activation working memory (what reproduces its rows; ``tests/test_nvme.py``).

These are the paper's idealised numbers, for teaching; ``kit.estimate.nvme`` gives DeepSpeed's real swap
files.
"""

from __future__ import annotations

from dataclasses import dataclass

#: the paper's Figure 2a models: (layers, hidden, attention heads)
PAPER_MODELS = {
    "0.1T": (80, 10 * 1024, 128),
    "0.5T": (100, 20 * 1024, 160),
    "1T": (128, 25 * 1024, 256),
    "10T": (195, 64 * 1024, 512),
    "100T": (315, 160 * 1024, 1024),
}
#: achievable TFLOP/s per GPU the paper's bandwidth figures assume (V100)
PAPER_PEAK_TFLOPS = 70.0
PAPER_SEQ = 1024
PAPER_BATCH = 32
PAPER_GPU_BATCH = 4


@dataclass(frozen=True)
class InfinityMemory:
    """One row of the paper's memory table, in bytes."""

    params: int
    model_states: int
    activation_checkpoints: int
    model_state_working: int
    activation_working: int


def memory(
    layers: int,
    hidden: int,
    heads: int,
    *,
    batch: int = PAPER_BATCH,
    gpu_batch: int = PAPER_GPU_BATCH,
    seq: int = PAPER_SEQ,
    ci: int = 1,
) -> InfinityMemory:
    """The paper's section 3 memory requirements of one model (see the module docstring)."""
    for name, value in (
        ("layers", layers),
        ("hidden", hidden),
        ("heads", heads),
        ("batch", batch),
        ("gpu_batch", gpu_batch),
    ):
        if value < 1:
            raise ValueError(f"{name}: must be >= 1, got {value}")
    if ci < 1:
        raise ValueError(f"ci: the checkpoint interval must be >= 1 layer, got {ci}")
    return InfinityMemory(
        params=12 * layers * hidden**2,
        model_states=240 * layers * hidden**2,
        activation_checkpoints=2 * batch * seq * hidden * layers // ci,
        model_state_working=16 * hidden**2,
        activation_working=gpu_batch * seq * ci * (16 * hidden + 2 * heads * seq),
    )


def intensity(tier: str, *, seq: int = PAPER_SEQ, batch: int = 1, hidden: int = 2048, ci: int = 1) -> float:
    """FLOPs per byte moved for what a tier holds: ``params_grads``, ``optimizer_states`` or
    ``activation_checkpoints`` (section 4.1)."""
    if tier == "params_grads":
        return float(seq * batch)
    if tier == "optimizer_states":
        return seq * batch / 4
    if tier == "activation_checkpoints":
        return float(24 * hidden * ci)
    raise ValueError(f"tier: choose params_grads, optimizer_states or activation_checkpoints, got {tier!r}")


def efficiency(ait: float, gbps: float, peak_tflops: float = PAPER_PEAK_TFLOPS) -> float:
    """Share of peak compute left when every byte moves at ``gbps``: ait bw / (ait bw + peak_tp)."""
    bw = gbps * 1e9
    return ait * bw / (ait * bw + peak_tflops * 1e12)


def bandwidth_for(eff: float, ait: float, peak_tflops: float = PAPER_PEAK_TFLOPS) -> float:
    """GB/s a tier needs for efficiency ``eff`` (the inverse of ``efficiency``)."""
    if not 0 < eff < 1:
        raise ValueError(f"efficiency: must be in (0, 1), got {eff!r}")
    return eff / (1 - eff) * peak_tflops * 1e12 / ait / 1e9
