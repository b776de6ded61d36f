"""MobileNetV2 (width 1.0) with torchvision's layer configuration (3,504,872 parameters).

Sandler et al., "MobileNetV2: Inverted Residuals and Linear Bottlenecks", CVPR 2018.
"""
from __future__ import annotations

import torch
from torch import nn

# expansion t, output channels c, repeats n, first stride s
INVERTED_RESIDUAL_SETTING: tuple[tuple[int, int, int, int], ...] = (
    (1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


def _conv_bn_relu6(in_ch: int, out_ch: int, kernel: int = 3, stride: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_ch, out_ch, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(out_ch), nn.ReLU6(inplace=True))


class InvertedResidual(nn.Module):
    """1x1 expand (skipped when t == 1), 3x3 depthwise, linear 1x1 project; residual when shapes allow."""

    def __init__(self, in_ch: int, out_ch: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        hidden = int(round(in_ch * expand_ratio))
        self.use_residual = stride == 1 and in_ch == out_ch
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(_conv_bn_relu6(in_ch, hidden, kernel=1))
        layers += [_conv_bn_relu6(hidden, hidden, stride=stride, groups=hidden),
                   nn.Conv2d(hidden, out_ch, 1, 1, 0, bias=False), nn.BatchNorm2d(out_ch)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_residual else self.conv(x)


class MobileNetV2(nn.Module):
    """32-channel stem, 17 inverted-residual blocks, 1280-channel 1x1 conv, global pool, classifier."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        in_ch, last_ch = 32, 1280
        features: list[nn.Module] = [_conv_bn_relu6(3, in_ch, stride=2)]
        for t, c, n, s in INVERTED_RESIDUAL_SETTING:
            for i in range(n):
                features.append(InvertedResidual(in_ch, c, s if i == 0 else 1, t))
                in_ch = c
        features.append(_conv_bn_relu6(in_ch, last_ch, kernel=1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last_ch, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


def mobilenet_v2() -> MobileNetV2:
    """MobileNetV2 with width multiplier 1.0."""
    return MobileNetV2()
