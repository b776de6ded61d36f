"""Architectures outside the zoo (random weights) that stress ONNX op forms third-party models carry: GroupNorm,
strided slices, recurrent nodes with states as inputs/outputs and non-default activations, reflection pads,
PReLU and L2 normalisation, integer outputs, dilated convs with align_corners resizes, masked attention,
LRN and ceil-mode pooling, and post-processing ops (ScatterND, CumSum, TopK, Where). See ``architectures.MODELS``."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class DiffusionBlock(nn.Module):
    """GroupNorm + SiLU res blocks with a timestep embedding input (two inputs)."""

    def __init__(self, c=32):
        super().__init__()
        self.inp = nn.Conv2d(3, c, 3, padding=1)
        self.n1 = nn.GroupNorm(8, c)
        self.c1 = nn.Conv2d(c, c, 3, padding=1)
        self.t = nn.Linear(16, c)
        self.n2 = nn.GroupNorm(8, c)
        self.c2 = nn.Conv2d(c, c, 3, padding=1)
        self.out = nn.Conv2d(c, 3, 3, padding=1)

    def forward(self, x, t):
        half = 8
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
        emb = t[:, None] * freqs[None]
        emb = torch.cat([emb.sin(), emb.cos()], 1)
        h = self.inp(x)
        r = self.c1(F.silu(self.n1(h))) + self.t(F.silu(emb))[:, :, None, None]
        h = h + self.c2(F.silu(self.n2(r)))
        return self.out(h)


class FocusDetector(nn.Module):
    """YOLOv5-style Focus (strided slices ::2), SiLU, nearest upsample, sigmoid decode with a grid."""

    def __init__(self, c=16, na=3, no=7):
        super().__init__()
        self.na, self.no = na, no
        self.focus = nn.Conv2d(12, c, 3, padding=1)
        self.down = nn.Conv2d(c, 2 * c, 3, 2, 1)
        self.lat = nn.Conv2d(2 * c, c, 1)
        self.head = nn.Conv2d(3 * c, na * no, 1)

    def forward(self, x):
        x = torch.cat([x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]], 1)
        a = F.silu(self.focus(x))
        b = F.silu(self.down(a))
        up = F.interpolate(self.lat(b), scale_factor=2.0, mode="nearest")
        p = self.head(torch.cat([F.max_pool2d(up + a, 2), b], 1))
        bs, _, ny, nx = p.shape
        p = p.view(bs, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2).sigmoid()
        yv, xv = torch.meshgrid(torch.arange(ny), torch.arange(nx), indexing="ij")
        grid = torch.stack((xv, yv), 2).view(1, 1, ny, nx, 2).float()
        xy = (p[..., :2] * 2 - 0.5 + grid) * 8
        return torch.cat([xy, p[..., 2:]], -1).view(bs, -1, self.no)


class StatefulLstm(nn.Module):
    """LSTM taking (h0, c0) as inputs and returning (y, hn, cn): streaming speech models."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(40, 64, num_layers=2, batch_first=True)
        self.fc = nn.Linear(64, 20)

    def forward(self, x, h0, c0):
        y, (h, c) = self.lstm(x, (h0, c0))
        return self.fc(y), h, c


class ReluRnn(nn.Module):
    """Two-layer Elman RNN with ReLU (ONNX RNN with activations=["Relu"]), batch-first, classifier on the last step."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.RNN(20, 48, num_layers=2, nonlinearity="relu", batch_first=True)
        self.fc = nn.Linear(48, 6)

    def forward(self, x):
        return self.fc(self.rnn(x)[0][:, -1])


class ReflectVocoder(nn.Module):
    """HiFi-GAN-like: reflection pad, LeakyReLU, transposed conv1d, dilated conv1d residuals, tanh."""

    def __init__(self, c=64):
        super().__init__()
        self.pre = nn.Conv1d(80, c, 7)
        self.up = nn.ConvTranspose1d(c, c // 2, 8, 4, padding=2)
        self.res = nn.ModuleList([nn.Conv1d(c // 2, c // 2, 3, dilation=d, padding=d) for d in (1, 3, 5)])
        self.post = nn.Conv1d(c // 2, 1, 7)

    def forward(self, x):
        x = self.pre(F.pad(x, (3, 3), mode="reflect"))
        x = self.up(F.leaky_relu(x, 0.1))
        for conv in self.res:
            x = x + conv(F.leaky_relu(x, 0.1))
        return torch.tanh(self.post(F.pad(F.leaky_relu(x), (3, 3), mode="reflect")))


class SpeakerNorm(nn.Module):
    """Speaker encoder tail: log-mel via conv STFT magnitude, PReLU, stats pooling, L2-normalised embedding."""

    def __init__(self):
        super().__init__()
        self.stft = nn.Conv1d(1, 2 * 65, 128, 64, bias=False)
        self.mel = nn.Linear(65, 40, bias=False)
        self.conv = nn.Conv1d(40, 64, 5, padding=2)
        self.act = nn.PReLU(64)
        self.fc = nn.Linear(128, 32)

    def forward(self, wav):
        s = self.stft(wav)
        re, im = s[:, :65], s[:, 65:]
        mag = torch.sqrt(re * re + im * im + 1e-6)
        mel = torch.log(torch.clamp(self.mel(mag.transpose(1, 2)), min=1e-5)).transpose(1, 2)
        h = self.act(self.conv(mel))
        stats = torch.cat([h.mean(-1), h.std(-1)], 1)
        return F.normalize(self.fc(stats), dim=1)


class CtcDecoderHead(nn.Module):
    """CRNN-style head with int outputs: log_softmax and argmax over classes, plus Mish/ELU/Softplus."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 16, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d((1, 25))
        self.gru = nn.GRU(16, 32, bidirectional=True, batch_first=True)
        self.fc = nn.Linear(64, 11)

    def forward(self, x):
        h = F.mish(self.conv(x)) + F.elu(x) + F.softplus(x)
        h = self.pool(h).squeeze(2).transpose(1, 2)
        y, _ = self.gru(h)
        logp = F.log_softmax(self.fc(y), -1)
        return logp, logp.argmax(-1)


class AsppSeg(nn.Module):
    """DeepLab ASPP: dilated 3x3 convs, image pooling branch, bilinear upsample with align_corners=True."""

    def __init__(self, c=32):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, 2, 1), nn.BatchNorm2d(c), nn.ReLU6())
        self.b = nn.ModuleList([nn.Conv2d(c, c, 3, padding=d, dilation=d) for d in (1, 6, 12)])
        self.img = nn.Conv2d(c, c, 1)
        self.proj = nn.Conv2d(4 * c, 5, 1)

    def forward(self, x):
        h = self.stem(x)
        pooled = F.interpolate(self.img(F.adaptive_avg_pool2d(h, 1)), size=h.shape[2:], mode="bilinear",
                               align_corners=False)
        y = self.proj(torch.cat([conv(h) for conv in self.b] + [pooled], 1))
        return F.interpolate(y, size=x.shape[2:], mode="bilinear", align_corners=True)


class MaskedAttention(nn.Module):
    """Causal attention with masked_fill(-inf), LayerNorm, erf GELU."""

    def __init__(self, d=64, heads=4, t=24):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.o = nn.Linear(d, d)
        self.ln = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.h = heads
        self.register_buffer("mask", torch.triu(torch.ones(t, t, dtype=torch.bool), 1))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln(x)).split(d, -1)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(d // self.h)
        s = s.masked_fill(self.mask[:t, :t], float("-inf"))
        a = (s.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.o(a)
        return x + self.ff(x)


class OldStyle(nn.Module):
    """AlexNet-era: LRN, ceil-mode max pool, grouped conv, Hardsigmoid gating, dropout, flatten."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 24, 5, 2, 2)
        self.lrn = nn.LocalResponseNorm(5)
        self.c2 = nn.Conv2d(24, 32, 3, padding=1, groups=4)
        self.fc = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x):
        h = F.max_pool2d(self.lrn(F.relu(self.c1(x))), 3, 2, ceil_mode=True)
        h = self.c2(h) * F.hardsigmoid(h.mean((2, 3), keepdim=True)).repeat(1, 32 // 24 + 1, 1, 1)[:, :32]
        h = F.max_pool2d(h, 4).flatten(1)
        return F.dropout(self.fc(h), 0.5, self.training)


class ScatterUpdate(nn.Module):
    """index_put / cumsum / where / topk: shape and index ops that appear in post-processing."""

    def forward(self, x):
        y = x.clone()
        y[:, 0] = x[:, -1] * 2
        c = torch.cumsum(y, 1)
        vals, idx = torch.topk(c, 5, dim=1)
        sel = torch.where(c > 0, c, torch.zeros_like(c))
        return vals, idx, sel


OP_FORM_MODELS = {
    "diffusion_block": (DiffusionBlock, lambda: [torch.randn(1, 3, 32, 32), torch.tensor([37.0])]),
    "focus_detector": (FocusDetector, lambda: [torch.randn(1, 3, 64, 64)]),
    "stateful_lstm": (StatefulLstm, lambda: [torch.randn(1, 30, 40), torch.randn(2, 1, 64), torch.randn(2, 1, 64)]),
    "relu_rnn": (ReluRnn, lambda: [torch.randn(1, 40, 20)]),
    "reflect_vocoder": (ReflectVocoder, lambda: [torch.randn(1, 80, 40)]),
    "speaker_norm": (SpeakerNorm, lambda: [torch.randn(1, 1, 8000)]),
    "ctc_head": (CtcDecoderHead, lambda: [torch.randn(1, 1, 32, 100)]),
    "aspp_seg": (AsppSeg, lambda: [torch.randn(1, 3, 65, 65)]),
    "masked_attention": (MaskedAttention, lambda: [torch.randn(1, 24, 64)]),
    "old_style": (OldStyle, lambda: [torch.randn(1, 3, 64, 64)]),
    "scatter_update": (ScatterUpdate, lambda: [torch.randn(2, 12)]),
}
