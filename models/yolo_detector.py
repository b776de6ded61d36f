"""YOLOX-Nano: a CSP-Darknet backbone with a Focus stem, a PAN neck and decoupled heads; raw head outputs, no NMS.

Ge, Liu, Wang, Li & Sun, "YOLOX: Exceeding YOLO Series in 2021" (arXiv 2107.08430), in the configuration of the
authors' YOLOX-Nano (depth multiplier 0.33, width 0.25, depthwise-separable 3 x 3 convolutions, 80 classes, 416 x
416 input). Every conv is Conv - BatchNorm (eps 1e-3) - SiLU. Backbone: a Focus stem (space-to-depth, then a 3 x 3
conv to 16 channels), four stages of a stride-2 depthwise-separable conv and a CSP layer (1, 3, 3, 1 bottlenecks;
the last stage starts with SPP max-pools 5, 9, 13 and has no shortcuts), giving 64, 128 and 256 channels at strides
8, 16 and 32. Neck: top-down (1 x 1 conv, nearest upsampling, concat, CSP layer) then bottom-up (stride-2 conv,
concat, CSP layer). Head per level: a 1 x 1 stem to 64 channels, two depthwise-separable convs each for the class
and the box branches, 1 x 1 predictions of 80 class scores, 4 box values and 1 objectness.

``forward(images[N, 3, S, S]) -> predictions[N, A, 85]`` (S a multiple of 32; A = 3549 anchors at S = 416), each row
``[box x, y, w, h (raw), sigmoid(objectness), sigmoid(80 class scores)]``: the head's inference output before box
decoding, as YOLOX exports it for deployment (``decode_in_inference=False``), without NMS.

At 416 x 416, batch 1: 912,159 parameters and 0.5226 GMACs of convolutions (computed by the zoo tests from the layer
shapes). The YOLOX README lists YOLOX-Nano at 0.91M parameters and 1.08 GFLOPs; its ``get_model_info`` reports
2 x the operation count of ``thop``, which adds 2 operations per BatchNorm output element and 1 per conv-bias output
element to the multiply-accumulates: 2 x (522,553,408 + 2 x 8,382,400 + 301,665) = 1.079 G for this module, and
912,159 parameters round to 0.91M, so this module matches both published figures. Those are rounded and the GFLOPs
are not MACs, so ``published_params`` / ``published_gmacs`` stay None.
"""
from __future__ import annotations

import torch
from torch import nn

NUM_CLASSES = 80
BN_EPS = 1e-3
__all__ = ["YoloxNano", "yolo_detector", "NUM_CLASSES"]


class ConvBnSiLU(nn.Sequential):
    """Conv ("same" padding, no bias) - BatchNorm - SiLU."""

    def __init__(self, in_ch: int, out_ch: int, kernel: int = 1, stride: int = 1, groups: int = 1) -> None:
        super().__init__(nn.Conv2d(in_ch, out_ch, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(out_ch, eps=BN_EPS), nn.SiLU())


class SeparableConv(nn.Sequential):
    """Depthwise ``kernel`` x ``kernel`` conv then a pointwise 1 x 1 conv, each with BatchNorm and SiLU."""

    def __init__(self, in_ch: int, out_ch: int, kernel: int = 3, stride: int = 1) -> None:
        super().__init__(ConvBnSiLU(in_ch, in_ch, kernel, stride, groups=in_ch), ConvBnSiLU(in_ch, out_ch))


class Bottleneck(nn.Module):
    """1 x 1 conv, depthwise-separable 3 x 3 conv, plus the input when ``shortcut``."""

    def __init__(self, channels: int, shortcut: bool) -> None:
        super().__init__()
        self.conv1 = ConvBnSiLU(channels, channels)
        self.conv2 = SeparableConv(channels, channels)
        self.shortcut = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv2(self.conv1(x))
        return x + y if self.shortcut else y


class CSPLayer(nn.Module):
    """Cross-stage partial layer: two 1 x 1 halves, ``depth`` bottlenecks on one, concat, 1 x 1 conv."""

    def __init__(self, in_ch: int, out_ch: int, depth: int, shortcut: bool = True) -> None:
        super().__init__()
        hidden = out_ch // 2
        self.conv1 = ConvBnSiLU(in_ch, hidden)
        self.conv2 = ConvBnSiLU(in_ch, hidden)
        self.blocks = nn.Sequential(*(Bottleneck(hidden, shortcut) for _ in range(depth)))
        self.conv3 = ConvBnSiLU(2 * hidden, out_ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv3(torch.cat([self.blocks(self.conv1(x)), self.conv2(x)], 1))


class SPP(nn.Module):
    """Spatial pyramid pooling: 1 x 1 conv to half, max-pools 5, 9, 13 (stride 1) concatenated, 1 x 1 conv."""

    def __init__(self, in_ch: int, out_ch: int, kernels: tuple[int, ...] = (5, 9, 13)) -> None:
        super().__init__()
        hidden = in_ch // 2
        self.conv1 = ConvBnSiLU(in_ch, hidden)
        self.pools = nn.ModuleList(nn.MaxPool2d(k, 1, k // 2) for k in kernels)
        self.conv2 = ConvBnSiLU(hidden * (len(kernels) + 1), out_ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        return self.conv2(torch.cat([x] + [pool(x) for pool in self.pools], 1))


class Focus(nn.Module):
    """Space-to-depth (the four 2 x 2 phases stacked on channels), then a 3 x 3 conv."""

    def __init__(self, in_ch: int, out_ch: int) -> None:
        super().__init__()
        self.conv = ConvBnSiLU(4 * in_ch, out_ch, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        phases = [x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]]
        return self.conv(torch.cat(phases, 1))


class Head(nn.Module):
    """Decoupled head of one level: stem, class branch and box branch (two separable convs each), predictions."""

    def __init__(self, in_ch: int, width: int, classes: int) -> None:
        super().__init__()
        self.stem = ConvBnSiLU(in_ch, width)
        self.cls_convs = nn.Sequential(SeparableConv(width, width), SeparableConv(width, width))
        self.reg_convs = nn.Sequential(SeparableConv(width, width), SeparableConv(width, width))
        self.cls_pred = nn.Conv2d(width, classes, 1)
        self.reg_pred = nn.Conv2d(width, 4, 1)
        self.obj_pred = nn.Conv2d(width, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        cls, reg = self.cls_convs(x), self.reg_convs(x)
        out = torch.cat([self.reg_pred(reg), torch.sigmoid(self.obj_pred(reg)), torch.sigmoid(self.cls_pred(cls))], 1)
        return out.flatten(2)                                  # [N, 5 + classes, H * W]


class YoloxNano(nn.Module):
    """YOLOX-Nano (see the module docstring); ``forward(images) -> [N, anchors, 5 + classes]``."""

    def __init__(self, classes: int = NUM_CLASSES, base: int = 16, depth: int = 1) -> None:
        super().__init__()
        c3, c4, c5 = 4 * base, 8 * base, 16 * base            # 64, 128, 256 channels at strides 8, 16, 32
        self.stem = Focus(3, base)
        self.dark2 = nn.Sequential(SeparableConv(base, 2 * base, 3, 2), CSPLayer(2 * base, 2 * base, depth))
        self.dark3 = nn.Sequential(SeparableConv(2 * base, c3, 3, 2), CSPLayer(c3, c3, 3 * depth))
        self.dark4 = nn.Sequential(SeparableConv(c3, c4, 3, 2), CSPLayer(c4, c4, 3 * depth))
        self.dark5 = nn.Sequential(SeparableConv(c4, c5, 3, 2), SPP(c5, c5), CSPLayer(c5, c5, depth, False))
        self.upsample = nn.Upsample(scale_factor=2, mode="nearest")
        self.lateral_conv0 = ConvBnSiLU(c5, c4)
        self.c3_p4 = CSPLayer(2 * c4, c4, depth, False)
        self.reduce_conv1 = ConvBnSiLU(c4, c3)
        self.c3_p3 = CSPLayer(2 * c3, c3, depth, False)
        self.bu_conv2 = SeparableConv(c3, c3, 3, 2)
        self.c3_n3 = CSPLayer(2 * c3, c4, depth, False)
        self.bu_conv1 = SeparableConv(c4, c4, 3, 2)
        self.c3_n4 = CSPLayer(2 * c4, c5, depth, False)
        self.heads = nn.ModuleList(Head(c, c3, classes) for c in (c3, c4, c5))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x3 = self.dark3(self.dark2(self.stem(images)))
        x4 = self.dark4(x3)
        x5 = self.dark5(x4)
        fpn_out0 = self.lateral_conv0(x5)                                        # stride 32
        f_out0 = self.c3_p4(torch.cat([self.upsample(fpn_out0), x4], 1))        # stride 16
        fpn_out1 = self.reduce_conv1(f_out0)
        pan_out2 = self.c3_p3(torch.cat([self.upsample(fpn_out1), x3], 1))      # stride 8
        pan_out1 = self.c3_n3(torch.cat([self.bu_conv2(pan_out2), fpn_out1], 1))  # stride 16
        pan_out0 = self.c3_n4(torch.cat([self.bu_conv1(pan_out1), fpn_out0], 1))  # stride 32
        levels = [head(x) for head, x in zip(self.heads, (pan_out2, pan_out1, pan_out0))]
        return torch.cat(levels, 2).transpose(1, 2)


def yolo_detector() -> YoloxNano:
    """The zoo's YOLOX-Nano detector (80 classes; raw head predictions)."""
    return YoloxNano()
