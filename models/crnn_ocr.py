"""CRNN text recogniser: a VGG-style conv stack, the feature columns as a sequence, a bidirectional LSTM, CTC logits.

Shi, Bai & Yao, "An End-to-End Trainable Neural Network for Image-based Sequence Recognition and Its Application
to Scene Text Recognition", TPAMI 2017 (arXiv 2015), Table 1: a W x 32 grey image; convolutions of 64, 128, 256,
256, 512, 512 maps (3 x 3, stride 1, pad 1) and 512 maps (2 x 2, pad 0); 2 x 2 max-pools after the first two, and
"1 x 2" pools (2 x 2 windows, stride 2 in height and 1 in width, padding 1 in width, as in the authors' Torch code)
after the fourth and sixth; BatchNorm after the fifth and sixth. The 1-pixel-high feature map's columns are the
sequence (width as time), read by a 2-layer bidirectional LSTM with 256 hidden units per direction, then a linear
layer to 37 classes (10 digits, 26 letters, the CTC blank).

``forward(image[N, 1, 32, W]) -> logits[N, T, 37]`` with T = W // 4 + 1 (33 at W = 128). Internally the sequence is
laid out [T, N, 512] like the ONNX LSTM (no transposes around it).

At W = 128, batch 1: 8,723,749 parameters; 0.8061 GMACs of convolutions, 0.1038 of LSTM gate products and 0.0006
of the classifier, 0.9105 GMACs in all (computed by the zoo tests from the layer shapes). The paper reports 8.3M
parameters for its configuration (W = 100, its own class set); no published figure applies to this one.
"""
from __future__ import annotations

import torch
from torch import nn

IMAGE_HEIGHT = 32
NUM_CLASSES = 37  # 10 digits + 26 letters + CTC blank
RNN_HIDDEN = 256
__all__ = ["CRNN", "crnn_ocr", "IMAGE_HEIGHT", "NUM_CLASSES", "RNN_HIDDEN"]


def _conv(in_ch: int, out_ch: int, kernel: int = 3, padding: int = 1, batch_norm: bool = False) -> list[nn.Module]:
    layers: list[nn.Module] = [nn.Conv2d(in_ch, out_ch, kernel, padding=padding)]
    if batch_norm:
        layers.append(nn.BatchNorm2d(out_ch))
    return layers + [nn.ReLU()]


def _pool_height_only() -> nn.MaxPool2d:
    """The paper's "1 x 2" pooling: halves the height, keeps (one more than) the width."""
    return nn.MaxPool2d((2, 2), stride=(2, 1), padding=(0, 1))


class CRNN(nn.Module):
    """Conv stack -> [T, N, 512] sequence -> 2-layer bidirectional LSTM -> Linear to ``classes``."""

    def __init__(self, classes: int = NUM_CLASSES, hidden: int = RNN_HIDDEN) -> None:
        super().__init__()
        self.cnn = nn.Sequential(
            *_conv(1, 64), nn.MaxPool2d(2, 2),
            *_conv(64, 128), nn.MaxPool2d(2, 2),
            *_conv(128, 256), *_conv(256, 256), _pool_height_only(),
            *_conv(256, 512, batch_norm=True), *_conv(512, 512, batch_norm=True), _pool_height_only(),
            *_conv(512, 512, kernel=2, padding=0))
        self.rnn = nn.LSTM(512, hidden, num_layers=2, bidirectional=True)
        self.classifier = nn.Linear(2 * hidden, classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        features = self.cnn(image)                            # [N, 512, 1, T]
        sequence = features.squeeze(2).permute(2, 0, 1)       # [T, N, 512]
        output, _ = self.rnn(sequence)                        # [T, N, 2 * hidden]
        return self.classifier(output).transpose(0, 1)       # [N, T, classes]


def crnn_ocr() -> CRNN:
    """The zoo's CRNN text recogniser (Shi et al.), 37 classes."""
    return CRNN()
