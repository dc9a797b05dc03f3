"""A small conv net for zero-kit's model-file contract: ``model()`` and ``batch(micro_batch)``.

    zerokit estimate --model data/examples/conv_net.py --gpus-per-node 2 --stage 2
    zerokit run --model data/examples/conv_net.py --stages 0,1,2,3 --nprocs 2

The forward takes the batch's tensors and returns the loss (cross entropy over 10 classes). GroupNorm,
not BatchNorm: DeepSpeed's bf16 at stages 0-2 casts parameters but not buffers, and a BatchNorm's fp32
running statistics then meet bf16 activations (the CPU kernel refuses the mix).
"""

import torch
import torch.nn.functional as F
from torch import nn

CLASSES = 10
SIDE = 32  # 32 x 32 RGB images, as CIFAR-10


class ConvNet(nn.Module):
    def __init__(self, width: int = 32):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1), nn.GroupNorm(8, c_out), nn.ReLU(), nn.MaxPool2d(2))
            for c_in, c_out in ((3, width), (width, 2 * width), (2 * width, 4 * width))
        )
        self.head = nn.Linear(4 * width * (SIDE // 8) ** 2, CLASSES)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = images
        for block in self.blocks:
            x = block(x)
        return F.cross_entropy(self.head(x.flatten(1)).float(), labels)


def model() -> nn.Module:
    return ConvNet()


def batch(micro_batch: int) -> tuple:
    images = torch.randn(micro_batch, 3, SIDE, SIDE)
    labels = torch.randint(0, CLASSES, (micro_batch,))
    return images, labels
