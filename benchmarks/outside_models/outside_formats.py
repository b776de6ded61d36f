"""Architectures outside the zoo (random weights) in export forms third-party packages ship: recurrent layers over
padded batches of different lengths (``pack_padded_sequence``: LSTM ``sequence_lens`` from an input, TopK and
ScatterElements around it), an audio front end computed in the graph (``torch.stft(return_complex=False)``: ONNX
STFT), a scripted recurrence (``torch.jit.script``: an ONNX Loop carrying a sequence of outputs) and a CELU MLP
(ONNX Celu). See ``architectures.MODELS``."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class PackedBiLstm(nn.Module):
    """A tagger over a padded batch: bidirectional 2-layer LSTM on packed sequences, a linear head per step."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(40, 64, num_layers=2, bidirectional=True)
        self.head = nn.Linear(128, 12)

    def forward(self, x, lengths):
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
        out, _ = self.rnn(packed)
        padded, _ = nn.utils.rnn.pad_packed_sequence(out, total_length=x.shape[0])
        return self.head(padded).log_softmax(-1)


class StftEncoder(nn.Module):
    """Log-power spectrogram by torch.stft in the graph, then a conv1d stack and mean pooling (a keyword spotter)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("window", torch.hann_window(400))
        self.convs = nn.Sequential(nn.Conv1d(201, 64, 5, padding=2), nn.ReLU(), nn.Conv1d(64, 64, 5, padding=2),
                                   nn.ReLU())
        self.head = nn.Linear(64, 10)

    def forward(self, wave):
        spec = torch.stft(wave, n_fft=400, hop_length=160, window=self.window, center=False, return_complex=False)
        power = torch.log(spec.pow(2).sum(-1) + 1e-6)
        return self.head(self.convs(power).mean(-1))


class _ScriptedRnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.rec = nn.Linear(32, 128), nn.Linear(128, 128)
        self.head = nn.Linear(128, 8)

    def forward(self, x):
        h = torch.zeros(x.size(1), 128)
        outs = []
        for t in range(x.size(0)):
            h = torch.tanh(self.inp(x[t]) + self.rec(h))
            outs.append(self.head(h))
        return torch.stack(outs)


def scripted_rnn() -> nn.Module:
    """An Elman recurrence written as a Python loop and scripted: the export keeps it as an ONNX Loop."""
    return torch.jit.script(_ScriptedRnn())


class CeluMlp(nn.Module):
    """MLP with CELU activations and LayerNorm (ONNX Celu)."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.norm = nn.Linear(64, 256), nn.Linear(256, 64), nn.LayerNorm(256)

    def forward(self, x):
        return self.b(F.celu(self.norm(F.celu(self.a(x), alpha=0.7))))


FORMAT_MODELS = {
    "packed_bilstm": (PackedBiLstm, lambda: [torch.randn(50, 4, 40), torch.tensor([50, 37, 20, 5])]),
    "stft_encoder": (StftEncoder, lambda: [torch.randn(1, 16000)]),
    "scripted_rnn": (scripted_rnn, lambda: [torch.randn(40, 2, 32)]),
    "celu_mlp": (CeluMlp, lambda: [torch.randn(8, 64)]),
}
