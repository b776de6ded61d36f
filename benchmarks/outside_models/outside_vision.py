"""Image-model architectures outside the zoo (random weights): transformers, U-Nets, mobile blocks, upsamplers,
detector necks, point clouds, MLP mixers. See ``architectures.MODELS``."""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn


class ViT(nn.Module):
    """Vision transformer: patch-embedding conv, class token, pre-norm encoder with GELU, LayerNorm."""

    def __init__(self, img=64, patch=8, dim=128, depth=4, heads=4, classes=10):
        super().__init__()
        self.embed = nn.Conv2d(3, dim, patch, patch)
        n = (img // patch) ** 2
        self.cls = nn.Parameter(torch.randn(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, n + 1, dim))
        layer = nn.TransformerEncoderLayer(
            dim, heads, dim * 4, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.enc = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        return self.head(self.norm(self.enc(x))[:, 0])


def cbr(i, o):
    """UNet double conv block: two (3x3 Conv2d, BatchNorm2d, ReLU) stages."""
    return nn.Sequential(
        nn.Conv2d(i, o, 3, padding=1),
        nn.BatchNorm2d(o),
        nn.ReLU(inplace=True),
        nn.Conv2d(o, o, 3, padding=1),
        nn.BatchNorm2d(o),
        nn.ReLU(inplace=True),
    )


class UNet(nn.Module):
    """UNet segmenter: max-pool downsampling, ConvTranspose2d upsampling, skip-connection Concat."""

    def __init__(self, c=16):
        super().__init__()
        self.d1 = cbr(3, c)
        self.d2 = cbr(c, 2 * c)
        self.d3 = cbr(2 * c, 4 * c)
        self.u2 = nn.ConvTranspose2d(4 * c, 2 * c, 2, 2)
        self.c2 = cbr(4 * c, 2 * c)
        self.u1 = nn.ConvTranspose2d(2 * c, c, 2, 2)
        self.c1 = cbr(2 * c, c)
        self.out = nn.Conv2d(c, 2, 1)

    def forward(self, x):
        a = self.d1(x)
        b = self.d2(F.max_pool2d(a, 2))
        c = self.d3(F.max_pool2d(b, 2))
        b = self.c2(torch.cat([self.u2(c), b], 1))
        a = self.c1(torch.cat([self.u1(b), a], 1))
        return self.out(a)


class SE(nn.Module):
    """Squeeze-and-excitation (EfficientNet/MobileNet): global average pool, 1x1 convs, gating Mul."""

    def __init__(self, c, r=4, act=nn.SiLU, gate=nn.Sigmoid):
        super().__init__()
        self.f = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(c, c // r, 1), act(), nn.Conv2d(c // r, c, 1), gate())

    def forward(self, x):
        return x * self.f(x)


class MBConv(nn.Module):
    """EfficientNet inverted-residual block: 1x1 expand, depthwise (grouped) conv, SE, 1x1 project, residual Add."""

    def __init__(self, i, o, e, k, st, act=nn.SiLU, gate=nn.Sigmoid):
        super().__init__()
        m = i * e
        self.b = nn.Sequential(
            nn.Conv2d(i, m, 1, bias=False),
            nn.BatchNorm2d(m),
            act(),
            nn.Conv2d(m, m, k, st, k // 2, groups=m, bias=False),
            nn.BatchNorm2d(m),
            act(),
            SE(m, 4, act, gate),
            nn.Conv2d(m, o, 1, bias=False),
            nn.BatchNorm2d(o),
        )
        self.res = st == 1 and i == o

    def forward(self, x):
        return x + self.b(x) if self.res else self.b(x)


class EffNet(nn.Module):
    """EfficientNet-like classifier: strided stem, MBConv stages with SiLU/Sigmoid, global pool, Flatten, Gemm."""

    def __init__(self, act=nn.SiLU, gate=nn.Sigmoid):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), act())
        self.blocks = nn.Sequential(
            MBConv(16, 16, 1, 3, 1, act, gate),
            MBConv(16, 24, 4, 3, 2, act, gate),
            MBConv(24, 24, 4, 3, 1, act, gate),
            MBConv(24, 40, 4, 5, 2, act, gate),
            MBConv(40, 80, 4, 3, 2, act, gate),
            MBConv(80, 80, 4, 5, 1, act, gate),
        )
        self.head = nn.Sequential(
            nn.Conv2d(80, 320, 1), act(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2), nn.Linear(320, 100)
        )

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)))


def MobileV3():
    """MobileNetV3-like classifier: the EffNet layout with HardSwish activations and HardSigmoid SE gates."""
    return EffNet(nn.Hardswish, nn.Hardsigmoid)


class ESPCN(nn.Module):
    """ESPCN super-resolution: Conv2d with Tanh, sub-pixel PixelShuffle (DepthToSpace), Sigmoid."""

    def __init__(self, r=3):
        super().__init__()
        self.c = nn.Sequential(
            nn.Conv2d(1, 64, 5, padding=2),
            nn.Tanh(),
            nn.Conv2d(64, 32, 3, padding=1),
            nn.Tanh(),
            nn.Conv2d(32, r * r, 3, padding=1),
        )
        self.ps = nn.PixelShuffle(r)

    def forward(self, x):
        return torch.sigmoid(self.ps(self.c(x)))


class StyleNet(nn.Module):
    """Fast style transfer net: reflection Pad, InstanceNormalization, residual Add, nearest Resize upsampling."""

    def __init__(self):
        super().__init__()

        def blk(i, o, k, st):
            """Reflection pad, Conv2d, affine InstanceNorm2d, ReLU."""
            return nn.Sequential(
                nn.ReflectionPad2d(k // 2), nn.Conv2d(i, o, k, st), nn.InstanceNorm2d(o, affine=True), nn.ReLU()
            )

        self.down = nn.Sequential(blk(3, 16, 9, 1), blk(16, 32, 3, 2), blk(32, 64, 3, 2))
        self.res = nn.Sequential(blk(64, 64, 3, 1), blk(64, 64, 3, 1))
        self.up = nn.Sequential(
            nn.Upsample(scale_factor=2, mode="nearest"),
            blk(64, 32, 3, 1),
            nn.Upsample(scale_factor=2, mode="nearest"),
            blk(32, 16, 3, 1),
            nn.ReflectionPad2d(4),
            nn.Conv2d(16, 3, 9),
        )

    def forward(self, x):
        y = self.down(x)
        return self.up(y + self.res(y))


class FPN(nn.Module):
    """Feature pyramid network: 1x1 lateral convs, bilinear Resize by scale and size (both align_corners), GroupNorm."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 32, 3, 2, 1)
        self.c2 = nn.Conv2d(32, 64, 3, 2, 1)
        self.c3 = nn.Conv2d(64, 128, 3, 2, 1)
        self.l1 = nn.Conv2d(32, 64, 1)
        self.l2 = nn.Conv2d(64, 64, 1)
        self.l3 = nn.Conv2d(128, 64, 1)
        self.gn = nn.GroupNorm(8, 64)
        self.head = nn.Conv2d(64, 4, 3, padding=1)

    def forward(self, x):
        a = F.relu(self.c1(x))
        b = F.relu(self.c2(a))
        c = F.relu(self.c3(b))
        p3 = self.l3(c)
        p2 = self.l2(b) + F.interpolate(p3, scale_factor=2.0, mode="bilinear", align_corners=False)
        p1 = self.l1(a) + F.interpolate(p2, size=a.shape[-2:], mode="bilinear", align_corners=True)
        return self.head(F.relu(self.gn(p1)))


class PointNet(nn.Module):
    """PointNet point-cloud classifier: shared 1x1 Conv1d MLP, BatchNorm1d, global max pool (ReduceMax)."""

    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(
            nn.Conv1d(3, 64, 1),
            nn.BatchNorm1d(64),
            nn.ReLU(),
            nn.Conv1d(64, 128, 1),
            nn.ReLU(),
            nn.Conv1d(128, 512, 1),
        )
        self.h = nn.Sequential(nn.Linear(512, 128), nn.ReLU(), nn.Linear(128, 10))

    def forward(self, x):
        return self.h(torch.max(self.f(x), 2)[0])


class Mixer(nn.Module):
    """MLP-Mixer: patch-embedding conv, token-mixing MLPs across Transposes, channel-mixing MLPs, GELU, mean pool."""

    def __init__(self, p=8, d=96, n=64, L=3):
        super().__init__()
        self.emb = nn.Conv2d(3, d, p, p)
        self.ln1 = nn.ModuleList([nn.LayerNorm(d) for _ in range(L)])
        self.tok = nn.ModuleList(
            [nn.Sequential(nn.Linear(n, 128), nn.GELU(), nn.Linear(128, n)) for _ in range(L)]
        )
        self.ln2 = nn.ModuleList([nn.LayerNorm(d) for _ in range(L)])
        self.ch = nn.ModuleList([nn.Sequential(nn.Linear(d, 256), nn.GELU(), nn.Linear(256, d)) for _ in range(L)])
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        x = self.emb(x).flatten(2).transpose(1, 2)
        for i in range(len(self.tok)):
            x = x + self.tok[i](self.ln1[i](x).transpose(1, 2)).transpose(1, 2)
            x = x + self.ch[i](self.ln2[i](x))
        return self.head(x.mean(1))


class Deconv2d(nn.Module):
    """Convolutional autoencoder decoder: strided Conv2d, ConvTranspose2d with stride 2 and stride 1, Sigmoid."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 32, 3, 2, 1)
        self.d1 = nn.ConvTranspose2d(32, 16, 4, 2, 1)
        self.d2 = nn.ConvTranspose2d(16, 3, 3, 1, 1)

    def forward(self, x):
        return torch.sigmoid(self.d2(F.relu(self.d1(F.relu(self.c(x))))))
