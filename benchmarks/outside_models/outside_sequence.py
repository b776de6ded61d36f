"""Sequence- and audio-model architectures outside the zoo (random weights): TCNs, conformers, taggers, speaker
encoders, small GPTs, vocoder-style decoders. See ``architectures.MODELS``."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class TCN(nn.Module):
    """Temporal convolutional network: causal dilated Conv1d with end Slice, residual Add, last-step Gather."""

    def __init__(self, c=64, levels=5, k=3):
        super().__init__()
        self.inp = nn.Conv1d(8, c, 1)
        self.k = k
        self.convs = nn.ModuleList(
            [nn.Conv1d(c, c, k, dilation=2**i, padding=(k - 1) * 2**i) for i in range(levels)]
        )
        self.out = nn.Linear(c, 5)

    def forward(self, x):
        x = self.inp(x)
        T = x.shape[-1]
        for conv in self.convs:
            x = F.relu(conv(x)[..., :T]) + x
        return self.out(x[..., -1])


class Conformer(nn.Module):
    """Conformer speech encoder: conv subsampling, MHA, GLU, depthwise Conv1d, BatchNorm1d, LogSoftmax."""

    def __init__(self, d=96, heads=4):
        super().__init__()
        self.sub = nn.Sequential(nn.Conv2d(1, 32, 3, 2), nn.ReLU(), nn.Conv2d(32, 32, 3, 2), nn.ReLU())
        self.proj = nn.Linear(32 * 19, d)
        self.ln1 = nn.LayerNorm(d)
        self.att = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.pw1 = nn.Conv1d(d, 2 * d, 1)
        self.dw = nn.Conv1d(d, d, 15, padding=7, groups=d)
        self.bn = nn.BatchNorm1d(d)
        self.pw2 = nn.Conv1d(d, d, 1)
        self.ff = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.SiLU(), nn.Linear(4 * d, d))
        self.out = nn.Linear(d, 30)

    def forward(self, x):
        x = self.sub(x)
        b, c, t, f = x.shape
        x = self.proj(x.permute(0, 2, 1, 3).reshape(b, t, c * f))
        h = self.ln1(x)
        x = x + self.att(h, h, h, need_weights=False)[0]
        h = self.ln2(x).transpose(1, 2)
        h = F.glu(self.pw1(h), dim=1)
        h = self.pw2(F.silu(self.bn(self.dw(h))))
        x = x + h.transpose(1, 2)
        x = x + 0.5 * self.ff(x)
        return F.log_softmax(self.out(x), -1)


class Tagger(nn.Module):
    """BiLSTM sequence tagger: Embedding (Gather), 2-layer bidirectional LSTM, per-token Linear."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(1000, 64)
        self.lstm = nn.LSTM(64, 96, 2, batch_first=True, bidirectional=True)
        self.out = nn.Linear(192, 9)

    def forward(self, ids):
        return self.out(self.lstm(self.emb(ids))[0])


class GruAttn(nn.Module):
    """GRU with attention pooling (keyword spotting): bidirectional GRU, Softmax over time, weighted ReduceSum."""

    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(40, 128, 1, batch_first=True, bidirectional=True)
        self.att = nn.Linear(256, 1)
        self.out = nn.Linear(256, 12)

    def forward(self, x):
        h = self.gru(x)[0]
        w = torch.softmax(self.att(h), 1)
        return self.out((w * h).sum(1))


class TinyGPT(nn.Module):
    """GPT-style decoder: hand-written causal attention (MatMul, bool-mask Where, Softmax), tanh GELU, tied output."""

    def __init__(self, v=500, d=128, h=4, L=2, T=32):
        super().__init__()
        self.h = h
        self.emb = nn.Embedding(v, d)
        self.pos = nn.Parameter(torch.randn(T, d) * 0.02)
        self.ln = nn.ModuleList([nn.LayerNorm(d) for _ in range(2 * L)])
        self.qkv = nn.ModuleList([nn.Linear(d, 3 * d) for _ in range(L)])
        self.o = nn.ModuleList([nn.Linear(d, d) for _ in range(L)])
        self.mlp = nn.ModuleList(
            [nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d)) for _ in range(L)]
        )
        self.lnf = nn.LayerNorm(d)
        self.register_buffer("mask", torch.triu(torch.ones(T, T, dtype=torch.bool), 1))

    def forward(self, ids):
        B, T = ids.shape
        x = self.emb(ids) + self.pos[:T]
        d = x.shape[-1]
        for i in range(len(self.qkv)):
            q, k, v = self.qkv[i](self.ln[2 * i](x)).split(d, -1)
            q, k, v = [t.view(B, T, self.h, d // self.h).transpose(1, 2) for t in (q, k, v)]
            a = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.h)
            a = a.masked_fill(self.mask[:T, :T], float("-inf")).softmax(-1)
            x = x + self.o[i]((a @ v).transpose(1, 2).reshape(B, T, d))
            x = x + self.mlp[i](self.ln[2 * i + 1](x))
        return self.lnf(x) @ self.emb.weight.t()


class XVector(nn.Module):
    """x-vector speaker encoder: dilated 1-D convs, batch norm after ReLU, mean/std statistics pooling, L2 normalize."""

    def __init__(self):
        super().__init__()
        self.tdnn = nn.Sequential(
            nn.Conv1d(30, 128, 5, dilation=1),
            nn.ReLU(),
            nn.BatchNorm1d(128),
            nn.Conv1d(128, 128, 3, dilation=2),
            nn.ReLU(),
            nn.BatchNorm1d(128),
            nn.Conv1d(128, 128, 3, dilation=3),
            nn.ReLU(),
            nn.Conv1d(128, 300, 1),
            nn.ReLU(),
        )
        self.fc = nn.Linear(600, 128)

    def forward(self, x):
        h = self.tdnn(x)
        mu = h.mean(-1)
        sd = torch.sqrt(((h - mu.unsqueeze(-1)) ** 2).mean(-1) + 1e-5)
        return F.normalize(self.fc(torch.cat([mu, sd], 1)), dim=1)


class EinsumAttn(nn.Module):
    """Single-head attention written with torch.einsum (Einsum op), Softmax."""

    def __init__(self, d=64):
        super().__init__()
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)

    def forward(self, x):
        a = torch.einsum("bqd,bkd->bqk", self.q(x), self.k(x)).softmax(-1)
        return torch.einsum("bqk,bkd->bqd", a, self.v(x))


class LstmBatch(nn.Module):
    """Sequence-first LSTM classifier: time-major LSTM with batch > 1, last-step Gather, Linear."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(32, 128, 1)
        self.out = nn.Linear(128, 4)

    def forward(self, x):
        return self.out(self.lstm(x)[0][-1])


class AudioDecoder(nn.Module):
    """Vocoder-style audio decoder: ConvTranspose1d upsampling, reflection Pad 1-D, InstanceNorm1d, LeakyRelu, Tanh."""

    def __init__(self):
        super().__init__()
        self.pre = nn.Conv1d(80, 128, 7, padding=3)
        self.up1 = nn.ConvTranspose1d(128, 64, 8, stride=4, padding=2)
        self.n1 = nn.InstanceNorm1d(64, affine=True)
        self.up2 = nn.ConvTranspose1d(64, 32, 8, stride=4, padding=2)
        self.post = nn.Sequential(nn.ReflectionPad1d(3), nn.Conv1d(32, 1, 7), nn.Tanh())

    def forward(self, x):
        x = F.leaky_relu(self.pre(x), 0.1)
        x = F.leaky_relu(self.n1(self.up1(x)), 0.1)
        x = F.leaky_relu(self.up2(x), 0.1)
        return self.post(x)


class Pool1dNet(nn.Module):
    """1-D signal classifier: strided Conv1d, 1-D MaxPool/AveragePool, GroupNorm, GELU, linear Resize, global pool."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv1d(1, 32, 9, stride=2, padding=4)
        self.c2 = nn.Conv1d(32, 64, 5, padding=2)
        self.gn = nn.GroupNorm(4, 64)
        self.fc = nn.Linear(64, 6)

    def forward(self, x):
        x = F.max_pool1d(F.relu(self.c1(x)), 3, 2)
        x = F.avg_pool1d(F.gelu(self.gn(self.c2(x))), 2)
        x = F.interpolate(x, scale_factor=2, mode="linear", align_corners=False)
        return self.fc(F.adaptive_avg_pool1d(x, 1).squeeze(-1))


class MaskedEncoder(nn.Module):
    """BERT-style masked encoder: two inputs incl. integer attention mask, Where, Expand, masked Softmax, Clip."""

    def __init__(self, v=300, d=64):
        super().__init__()
        self.emb = nn.Embedding(v, d)
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.o = nn.Linear(d, 3)

    def forward(self, ids, mask):
        x = self.emb(ids)
        a = self.q(x) @ self.k(x).transpose(1, 2) / 8.0
        a = a.masked_fill(mask[:, None, :] == 0, -1e4).softmax(-1)
        pooled = (a @ x).sum(1) / mask.sum(1, keepdim=True).clamp(min=1).float()
        return self.o(pooled)
