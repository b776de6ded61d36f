"""A convolutional-recurrent noise suppressor: 3 x 3 convs over a spectrogram, a 2-layer GRU, a per-bin gain mask.

The front end follows Deep Speech 2 (Amodei et al., "Deep Speech 2: End-to-End Speech Recognition in English and
Mandarin", ICML 2016): 2-D convolutions over a 161-bin spectrogram (20 ms windows at 16 kHz), striding in frequency
only, whose output is flattened per frame into a sequence read by GRU layers. Scaled down to 3 x 3 kernels and a
2-layer GRU with 256 hidden units; the head is a per-frame sigmoid gain for each of the 161 bins, the output of
recurrent noise suppressors such as RNNoise (Valin, "A Hybrid DSP/Deep Learning Approach to Real-Time Full-Band
Speech Enhancement", MMSP 2018).

=========  ==========================================================  ===================
layer      operation                                                   output (T frames)
=========  ==========================================================  ===================
conv1      Conv 3 x 3, pad 1, 16 maps, BatchNorm, ReLU                 16 x T x 161
conv2      Conv 3 x 3, stride (1, 2), pad 1, 32 maps, BatchNorm, ReLU  32 x T x 81
conv3      Conv 3 x 3, stride (1, 2), pad 1, 32 maps, BatchNorm, ReLU  32 x T x 41
sequence   [T, N, 32 x 41 = 1312] (frames as time)
gru        GRU(1312 -> 256), GRU(256 -> 256)                           T x N x 256
mask       Linear(256 -> 161), sigmoid                                 N x T x 161
=========  ==========================================================  ===================

``forward(spectrogram[N, 1, T, 161]) -> mask[N, T, 161]``. At T = 100, batch 1: 1,656,017 parameters; 0.0774
GMACs of convolutions, 0.1597 of GRU gate products and 0.0041 of the mask layer, 0.2413 GMACs in all (computed by
the zoo tests from the layer shapes); no published figure exists for this configuration.
"""
from __future__ import annotations

import torch
from torch import nn

FREQ_BINS = 161
RNN_HIDDEN = 256
__all__ = ["ConvGruSuppressor", "gru_audio", "FREQ_BINS", "RNN_HIDDEN"]


def _conv(in_ch: int, out_ch: int, stride: tuple[int, int]) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(out_ch),
                         nn.ReLU())


class ConvGruSuppressor(nn.Module):
    """Three convs, frames as a [T, N, features] sequence, 2-layer GRU, sigmoid mask (see the module docstring)."""

    def __init__(self, bins: int = FREQ_BINS, hidden: int = RNN_HIDDEN, channels: tuple[int, int, int] = (16, 32, 32),
                 layers: int = 2) -> None:
        super().__init__()
        self.convs = nn.Sequential(_conv(1, channels[0], (1, 1)), _conv(channels[0], channels[1], (1, 2)),
                                   _conv(channels[1], channels[2], (1, 2)))
        reduced_bins = (((bins - 1) // 2 + 1) - 1) // 2 + 1          # two stride-2 convs with padding 1
        self.rnn = nn.GRU(channels[2] * reduced_bins, hidden, layers)
        self.mask = nn.Linear(hidden, bins)

    def forward(self, spectrogram: torch.Tensor) -> torch.Tensor:
        x = self.convs(spectrogram)                            # [N, C, T, F']
        sequence = x.permute(2, 0, 1, 3).flatten(2)            # [T, N, C * F']
        output, _ = self.rnn(sequence)
        return torch.sigmoid(self.mask(output)).transpose(0, 1)


def gru_audio() -> ConvGruSuppressor:
    """The zoo's conv + GRU noise suppressor (161-bin spectrogram in, 161 gains per frame out)."""
    return ConvGruSuppressor()
