"""A CREPE-style pitch tracker whose 1-D convolutions are Conv2d with (k, 1) kernels on N x C x T x 1 tensors.

Kim, Salamon, Li & Bello, "CREPE: A Convolutional Representation for Pitch Estimation", ICASSP 2018: a frame of
1024 raw audio samples, a (512, 1) convolution, five (64, 1) convolutions each followed by BatchNorm and a (2, 1)
max-pool, and a sigmoid over 360 pitch bins. Exported speech and pitch models (CREPE's Keras model, torchcrepe)
write these 1-D convolutions as Conv2d on an N x C x T x 1 tensor, which is what this module does. Scaled down from
CREPE "full" (1024 filters in the first layer) so one forward pass takes tens of milliseconds on one core, with a
conv-stack block inserted after the first layer (a Conv (5, 1), 512 filters, BatchNorm, ReLU, as in the encoder
of Tacotron 2, Shen et al. 2018) on the 1 x 256 x 512 x 1 tensor that layer produces:

=========  ===========================================  =============  ========================
layer      operation                                    output         MACs at T = 1024
=========  ===========================================  =============  ========================
conv1      Conv (512, 1) stride (2, 1) pad 255, ReLU,   256 x 512 x 1  256 x 512 x 512
           BatchNorm (CREPE's order: BN after ReLU)
stack      Conv (5, 1) pad 2, 512 filters, BN, ReLU,    512 x 128 x 1  512 x 512 x 256 x 5
           max-pool (4, 1)
conv2..5   zero-pad (31, 32), Conv (64, 1), ReLU, BN,   32, 32, 32,    32 x 128 x 512 x 64, ...
           max-pool (2, 1)  (CREPE's "same" padding)    64 channels
classify   Conv (8, 1) over the last 8 steps (CREPE's   360 x 1 x 1    360 x 64 x 8
           flatten + dense), sigmoid
=========  ===========================================  =============  ========================

The first layer has stride 2 (CREPE: 4) so that it produces the 512-step sequence of the conv-stack block. The
classifier is CREPE's dense layer over the flattened 64 x 8 features written as a (8, 1) convolution, so a longer
input gives one 360-bin activation vector per window of 1024 samples hopped by 128: ``forward(audio[N, 1, T, 1])
-> [N, (T // 128) - 7, 360]`` for any T >= 1024.

At T = 1024, batch 1: 2,284,104 parameters and 0.5454 GMACs of convolutions (computed by the zoo tests from the
layer shapes); no published figure exists for this configuration.
"""
from __future__ import annotations

from itertools import pairwise

import torch
from torch import nn

PITCH_BINS = 360
__all__ = ["Conv1dAudio", "conv1d_audio", "PITCH_BINS"]


def _crepe_layer(in_ch: int, out_ch: int) -> nn.Sequential:
    """One of CREPE's layers 2-6: "same" zero padding (31, 32), Conv (64, 1), ReLU, BatchNorm, max-pool (2, 1)."""
    return nn.Sequential(nn.ZeroPad2d((0, 0, 31, 32)), nn.Conv2d(in_ch, out_ch, (64, 1)), nn.ReLU(),
                         nn.BatchNorm2d(out_ch), nn.MaxPool2d((2, 1), (2, 1)))


class Conv1dAudio(nn.Module):
    """CREPE-style pitch tracker on raw audio laid out N x 1 x T x 1 (see the module docstring)."""

    def __init__(self, first_filters: int = 256, stack_filters: int = 512,
                 crepe_filters: tuple[int, int, int, int] = (32, 32, 32, 64), bins: int = PITCH_BINS) -> None:
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv2d(1, first_filters, (512, 1), stride=(2, 1), padding=(255, 0)),
                                   nn.ReLU(), nn.BatchNorm2d(first_filters))
        self.stack = nn.Sequential(nn.Conv2d(first_filters, stack_filters, (5, 1), padding=(2, 0), bias=False),
                                   nn.BatchNorm2d(stack_filters), nn.ReLU(), nn.MaxPool2d((4, 1), (4, 1)))
        channels = (stack_filters, *crepe_filters)
        self.crepe = nn.Sequential(*(_crepe_layer(a, b) for a, b in pairwise(channels)))
        self.classifier = nn.Conv2d(channels[-1], bins, (8, 1))

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        x = self.crepe(self.stack(self.conv1(audio)))
        # flatten(2), not squeeze(3): exported without constant folding, squeeze(dim) becomes Shape/Equal/If, and
        # TVM 0.27's ONNX importer has no If converter
        return torch.sigmoid(self.classifier(x)).flatten(2).transpose(1, 2)


def conv1d_audio() -> Conv1dAudio:
    """The zoo's CREPE-style pitch tracker (conv1d written as Conv2d with (k, 1) kernels)."""
    return Conv1dAudio()
