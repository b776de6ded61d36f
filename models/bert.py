"""A small BERT-style encoder (the BERT-Mini shape of Turc et al., 2019: 4 layers, hidden 256, 4 heads, FFN 1024).

Written with only the operations TVM 0.27's ONNX importer handles when exported at opset 17: Gather (embeddings),
MatMul/Gemm + Add, Reshape/Transpose with static shapes, Softmax, LayerNormalization, and exact GELU (which the
TorchScript exporter writes as ``x * 0.5 * (1 + erf(x / sqrt 2))``). No attention mask (every token attends to
every token), no token-type embedding and no pooler: the output is the last hidden state.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .zoo import BERT_MAX_POSITIONS, BERT_VOCAB


class SelfAttention(nn.Module):
    """Multi-head scaled dot-product self-attention followed by the output projection."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        assert hidden % heads == 0, f"hidden ({hidden}) must be divisible by heads ({heads})"
        self.heads = heads
        self.head_dim = hidden // heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.output = nn.Linear(hidden, hidden)

    def _split_heads(self, x: torch.Tensor, batch: int, seq: int) -> torch.Tensor:
        return x.reshape(batch, seq, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = (int(d) for d in x.shape)
        q = self._split_heads(self.query(x), batch, seq)
        k = self._split_heads(self.key(x), batch, seq)
        v = self._split_heads(self.value(x), batch, seq)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim)
        context = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.output(context.transpose(1, 2).reshape(batch, seq, hidden))


class EncoderLayer(nn.Module):
    """Post-LN transformer layer: x = LN(x + attn(x)); x = LN(x + FFN(x)) with a GELU FFN."""

    def __init__(self, hidden: int, heads: int, ffn: int, eps: float = 1e-12) -> None:
        super().__init__()
        self.attention = SelfAttention(hidden, heads)
        self.attention_norm = nn.LayerNorm(hidden, eps=eps)
        self.intermediate = nn.Linear(hidden, ffn)
        self.activation = nn.GELU()
        self.ffn_output = nn.Linear(ffn, hidden)
        self.output_norm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attention_norm(x + self.attention(x))
        return self.output_norm(x + self.ffn_output(self.activation(self.intermediate(x))))


class BertEncoder(nn.Module):
    """Token + learned position embeddings, LayerNorm, ``layers`` encoder layers.

    ``forward(input_ids[batch, seq]) -> last_hidden_state[batch, seq, hidden]``; seq <= 512.
    """

    def __init__(self, layers: int = 4, hidden: int = 256, heads: int = 4, ffn: int = 1024,
                 vocab: int = BERT_VOCAB, max_positions: int = BERT_MAX_POSITIONS) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(max_positions, hidden)
        self.embedding_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.layers = nn.ModuleList(EncoderLayer(hidden, heads, ffn) for _ in range(layers))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        seq = int(input_ids.shape[1])
        x = self.word_embeddings(input_ids) + self.position_embeddings.weight[:seq]
        x = self.embedding_norm(x)
        for layer in self.layers:
            x = layer(x)
        return x


def bert_small() -> BertEncoder:
    """BERT-Mini-shaped encoder: 4 layers, hidden 256, 4 heads, FFN 1024, vocab 30,522."""
    return BertEncoder()
