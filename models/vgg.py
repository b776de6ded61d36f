"""VGG-16 (configuration "D", no batch norm) with torchvision's layer sizes (138,357,544 parameters).

Simonyan & Zisserman, "Very Deep Convolutional Networks for Large-Scale Image Recognition", ICLR 2015.

torchvision resizes the last feature map to 7x7 with ``AdaptiveAvgPool2d((7, 7))``. At 224x224 input the map is
already 7x7 and the pool is the identity, so it is skipped (no op in the exported graph). At other input sizes the
pool is written as two matrix products with constant averaging matrices, ``P_h @ x @ P_w^T``, which computes exactly
the adaptive average pool and, unlike ``adaptive_avg_pool2d`` with a non-dividing size, exports to ONNX.
"""
from __future__ import annotations

import torch
from torch import nn

VGG16_CONFIG: tuple[int | str, ...] = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M",
                                       512, 512, 512, "M", 512, 512, 512, "M")
POOLED_SIZE = 7


def adaptive_pool_matrix(in_size: int, out_size: int) -> torch.Tensor:
    """Matrix ``P`` (out_size x in_size) with ``P @ v`` equal to 1-D adaptive average pooling of ``v``.

    Bin ``i`` averages ``v[floor(i*in/out) : ceil((i+1)*in/out)]``, as torch's adaptive pooling does.
    """
    matrix = torch.zeros(out_size, in_size)
    for i in range(out_size):
        start = (i * in_size) // out_size
        end = -((-(i + 1) * in_size) // out_size)
        matrix[i, start:end] = 1.0 / (end - start)
    return matrix


class VGG(nn.Module):
    """Plain conv/ReLU stack with max-pools, 7x7 adaptive average pool, three fully connected layers."""

    def __init__(self, config: tuple[int | str, ...] = VGG16_CONFIG, num_classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        in_ch = 3
        for item in config:
            if item == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                layers += [nn.Conv2d(in_ch, int(item), kernel_size=3, padding=1), nn.ReLU(inplace=True)]
                in_ch = int(item)
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Linear(512 * POOLED_SIZE * POOLED_SIZE, 4096), nn.ReLU(inplace=True), nn.Dropout(),
            nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Dropout(),
            nn.Linear(4096, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        height, width = int(x.shape[2]), int(x.shape[3])
        if height != POOLED_SIZE:
            x = torch.matmul(adaptive_pool_matrix(height, POOLED_SIZE), x)
        if width != POOLED_SIZE:
            x = torch.matmul(x, adaptive_pool_matrix(width, POOLED_SIZE).t())
        return self.classifier(torch.flatten(x, 1))


def vgg16() -> VGG:
    """VGG-16 (13 conv + 3 fully connected layers)."""
    return VGG(VGG16_CONFIG)
