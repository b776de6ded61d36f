"""A GE2E speaker encoder: a 3-layer LSTM over 40-channel mel frames, the last hidden state projected and normalised.

Wan, Wang, Papir & Lopez Moreno, "Generalized End-to-End Loss for Speaker Verification", ICASSP 2018: 40-channel
log-mel frames, 3 LSTM layers, a linear projection of the last frame's hidden state, L2-normalised to give the
embedding (d-vector). Sizes and details as in the widely used encoder of Jemine's Real-Time-Voice-Cloning
(``encoder/model.py``: LSTM hidden 256 instead of the paper's 768 with a 256 projection; Linear(256, 256), ReLU,
division by the norm + 1e-5), on 160-frame partial utterances.

The frames are laid out [T, N, 40] (sequence first), the layout of the ONNX LSTM, so the export has no transposes:
``forward(mels[T, N, 40]) -> embedding[N, 256]``. At T = 160, batch 1: 1,423,616 parameters and 0.2163 GMACs of LSTM
gate products plus 65,536 MACs of projection (computed by the zoo tests from the layer shapes); no published figure
exists for this configuration.
"""
from __future__ import annotations

import torch
from torch import nn

MEL_CHANNELS = 40
PARTIAL_FRAMES = 160
HIDDEN = 256
EMBEDDING = 256
__all__ = ["SpeakerEncoder", "lstm_speaker", "MEL_CHANNELS", "PARTIAL_FRAMES", "HIDDEN", "EMBEDDING"]


class SpeakerEncoder(nn.Module):
    """LSTM stack -> last layer's final hidden state -> Linear + ReLU -> L2 normalisation."""

    def __init__(self, mels: int = MEL_CHANNELS, hidden: int = HIDDEN, embedding: int = EMBEDDING,
                 layers: int = 3) -> None:
        super().__init__()
        self.lstm = nn.LSTM(mels, hidden, layers)
        self.linear = nn.Linear(hidden, embedding)
        self.relu = nn.ReLU()

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        _, (hidden, _) = self.lstm(mels)                       # hidden: [layers, N, hidden]
        raw = self.relu(self.linear(hidden[-1]))
        return raw / (torch.norm(raw, dim=1, keepdim=True) + 1e-5)


def lstm_speaker() -> SpeakerEncoder:
    """The zoo's GE2E speaker encoder (3-layer LSTM 256, 256-d embedding)."""
    return SpeakerEncoder()
