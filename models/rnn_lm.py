"""Word-level recurrent language models of PTB size (the "medium" model of Zaremba et al., 2014).

Embedding (vocab 10,000 x 650) -> 2-layer LSTM or GRU (hidden 650) -> Linear to the vocabulary, as in PyTorch's
``examples/word_language_model``. Tokens are laid out (seq_len, batch) like that example and like the ONNX
LSTM/GRU default layout 0, so the export needs no transposes. Initial states are zero. Dropout is a no-op in eval.
"""
from __future__ import annotations

import torch
from torch import nn

from .zoo import PTB_SEQ_LEN, PTB_VOCAB

PTB_HIDDEN = 650
PTB_LAYERS = 2
__all__ = ["RNNLanguageModel", "lstm_lm", "gru_lm", "PTB_VOCAB", "PTB_SEQ_LEN", "PTB_HIDDEN", "PTB_LAYERS"]


class RNNLanguageModel(nn.Module):
    """Embedding -> multi-layer LSTM/GRU -> decoder; ``forward(tokens[seq, batch]) -> logits[seq, batch, vocab]``."""

    def __init__(self, cell: str, vocab: int = PTB_VOCAB, hidden: int = PTB_HIDDEN, layers: int = PTB_LAYERS,
                 dropout: float = 0.5) -> None:
        super().__init__()
        rnn_types = {"lstm": nn.LSTM, "gru": nn.GRU}
        assert cell in rnn_types, f"cell must be one of {sorted(rnn_types)}, got {cell!r}"
        self.cell = cell
        self.encoder = nn.Embedding(vocab, hidden)
        self.drop = nn.Dropout(dropout)
        self.rnn = rnn_types[cell](hidden, hidden, layers, dropout=dropout)
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        output, _ = self.rnn(self.drop(self.encoder(tokens)))
        return self.decoder(self.drop(output))


def lstm_lm() -> RNNLanguageModel:
    """2-layer LSTM language model, vocab 10k, embedding/hidden 650."""
    return RNNLanguageModel("lstm")


def gru_lm() -> RNNLanguageModel:
    """2-layer GRU language model, vocab 10k, embedding/hidden 650."""
    return RNNLanguageModel("gru")
