"""A residual MLP regressor for zero-kit's model-file contract: ``model()`` and ``batch(micro_batch)``.

    zerokit estimate --model data/examples/mlp.py --gpus-per-node 8 --stage 3
"""

import torch
import torch.nn.functional as F
from torch import nn

FEATURES = 256


class Residual(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class MLP(nn.Module):
    def __init__(self, width: int = FEATURES, depth: int = 4):
        super().__init__()
        self.layers = nn.ModuleList(Residual(width) for _ in range(depth))
        self.out = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return F.mse_loss(self.out(x).float(), y.float())


def model() -> nn.Module:
    return MLP()


def batch(micro_batch: int) -> tuple:
    x = torch.randn(micro_batch, FEATURES)
    return x, x.sum(dim=1, keepdim=True) / FEATURES
