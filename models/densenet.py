"""DenseNet-121 with torchvision's layer configuration (7,978,856 parameters).

Huang et al., "Densely Connected Convolutional Networks", CVPR 2017; growth rate 32, blocks (6, 12, 24, 16),
64 initial features, bottleneck width 4 x growth, compression 0.5, as in ``torchvision.models.densenet121``.
"""
from __future__ import annotations

import torch
from torch import nn


class DenseLayer(nn.Module):
    """BN-ReLU-1x1 conv (4k channels), BN-ReLU-3x3 conv (k channels) on the concatenation of all earlier maps."""

    def __init__(self, in_ch: int, growth_rate: int, bn_size: int) -> None:
        super().__init__()
        self.norm1 = nn.BatchNorm2d(in_ch)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(in_ch, bn_size * growth_rate, kernel_size=1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth_rate)
        self.relu2 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(bn_size * growth_rate, growth_rate, kernel_size=3, padding=1, bias=False)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        x = torch.cat(features, 1)
        x = self.conv1(self.relu1(self.norm1(x)))
        return self.conv2(self.relu2(self.norm2(x)))


class DenseBlock(nn.Module):
    """``num_layers`` dense layers; the output concatenates the input and every layer's new maps."""

    def __init__(self, num_layers: int, in_ch: int, growth_rate: int, bn_size: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            DenseLayer(in_ch + i * growth_rate, growth_rate, bn_size) for i in range(num_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for layer in self.layers:
            features.append(layer(features))
        return torch.cat(features, 1)


class Transition(nn.Sequential):
    """BN-ReLU-1x1 conv halving the channels, then 2x2 average pool."""

    def __init__(self, in_ch: int, out_ch: int) -> None:
        super().__init__(nn.BatchNorm2d(in_ch), nn.ReLU(inplace=True),
                         nn.Conv2d(in_ch, out_ch, kernel_size=1, bias=False),
                         nn.AvgPool2d(kernel_size=2, stride=2))


class DenseNet(nn.Module):
    """7x7/2 stem and 3x3/2 max-pool, dense blocks joined by transitions, final BN-ReLU, global pool, linear."""

    def __init__(self, growth_rate: int = 32, block_config: tuple[int, ...] = (6, 12, 24, 16),
                 num_init_features: int = 64, bn_size: int = 4, num_classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [
            nn.Conv2d(3, num_init_features, kernel_size=7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(num_init_features), nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2, padding=1)]
        channels = num_init_features
        for i, num_layers in enumerate(block_config):
            layers.append(DenseBlock(num_layers, channels, growth_rate, bn_size))
            channels += num_layers * growth_rate
            if i != len(block_config) - 1:
                layers.append(Transition(channels, channels // 2))
                channels //= 2
        layers += [nn.BatchNorm2d(channels), nn.ReLU(inplace=True)]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


def densenet121() -> DenseNet:
    """DenseNet-121."""
    return DenseNet(32, (6, 12, 24, 16), 64)
