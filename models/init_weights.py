"""Deterministic random weights for the zoo models.

Every model is built under a fixed seed and then re-initialised here so that

* activations keep roughly unit scale through deep plain stacks (VGG has no normalisation), which keeps the
  torch-vs-onnxruntime comparisons meaningful;
* normalisation layers have non-trivial statistics (random running mean/var, scale and shift), so a model that
  drops or mis-converts BatchNormalization / LayerNormalization is caught by a numerics test;
* no two weight tensors hold identical values: the TorchScript ONNX exporter de-duplicates equal initializers
  into ``Identity`` nodes, which would make parameter names disappear from the exported graph.
"""
from __future__ import annotations

import math

import torch
from torch import nn

_NORM_TYPES = (nn.BatchNorm2d, nn.LayerNorm)
_HANDLED_TYPES = (nn.Conv2d, nn.Linear, nn.Embedding, nn.LSTM, nn.GRU) + _NORM_TYPES


@torch.no_grad()
def randomize_(module: nn.Module, generator: torch.Generator) -> nn.Module:
    """Re-initialise every parameter and normalisation buffer of ``module`` in place from ``generator``.

    Conv / Linear weights: normal with variance 2 / fan_in (He init, preserves ReLU activations).
    Biases: normal, std 0.01. BatchNorm / LayerNorm: scale U(0.5, 1.5), shift N(0, 0.1), running mean N(0, 0.1),
    running variance U(0.5, 1.5). Embeddings: N(0, 1). Recurrent layers keep torch's own uniform init,
    redrawn from ``generator``. Every parameter is overwritten, so ``module`` may come from uninitialised memory
    (``to_empty``); a module type with parameters not listed here is an internal error. Returns ``module``.
    """
    for sub in module.modules():
        if not isinstance(sub, _HANDLED_TYPES) and any(True for _ in sub.parameters(recurse=False)):
            raise AssertionError(f"randomize_ does not know how to initialise {type(sub).__name__}")
        if isinstance(sub, (nn.Conv2d, nn.Linear)):
            fan_in = sub.weight[0].numel()
            sub.weight.normal_(0.0, math.sqrt(2.0 / fan_in), generator=generator)
            if sub.bias is not None:
                sub.bias.normal_(0.0, 0.01, generator=generator)
        elif isinstance(sub, _NORM_TYPES):
            if sub.weight is not None:
                sub.weight.uniform_(0.5, 1.5, generator=generator)
                sub.bias.normal_(0.0, 0.1, generator=generator)
            if isinstance(sub, nn.BatchNorm2d):
                sub.running_mean.normal_(0.0, 0.1, generator=generator)
                sub.running_var.uniform_(0.5, 1.5, generator=generator)
        elif isinstance(sub, nn.Embedding):
            sub.weight.normal_(0.0, 1.0, generator=generator)
        elif isinstance(sub, (nn.LSTM, nn.GRU)):
            bound = 1.0 / math.sqrt(sub.hidden_size)
            for weight in sub.parameters():
                weight.uniform_(-bound, bound, generator=generator)
    return module
