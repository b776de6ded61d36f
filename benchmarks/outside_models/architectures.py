"""Small model architectures of the kinds real third-party models use, for testing the compiler outside its zoo.

They are built here with random weights and are not part of the zoo. Each class is named for the model family it
imitates, and its docstring lists the notable ONNX ops it exercises. ``MODELS`` maps a name to
``(constructor, example_inputs_factory)``, where the factory returns a list of example input tensors.
"""

from __future__ import annotations

import torch

from outside_sequence import (TCN, AudioDecoder, Conformer, EinsumAttn, GruAttn, LstmBatch, MaskedEncoder, Pool1dNet, Tagger,
                      TinyGPT, XVector)
from outside_formats import FORMAT_MODELS
from outside_ops import OP_FORM_MODELS
from outside_vision import ESPCN, FPN, UNet, ViT, Deconv2d, EffNet, Mixer, MobileV3, PointNet, StyleNet

MODELS = {
    "vit": (ViT, lambda: [torch.randn(1, 3, 64, 64)]),
    "unet": (UNet, lambda: [torch.randn(1, 3, 96, 96)]),
    "effnet": (EffNet, lambda: [torch.randn(1, 3, 128, 128)]),
    "mobilev3": (MobileV3, lambda: [torch.randn(1, 3, 128, 128)]),
    "tcn": (TCN, lambda: [torch.randn(1, 8, 200)]),
    "conformer": (Conformer, lambda: [torch.randn(1, 1, 100, 80)]),
    "tagger": (Tagger, lambda: [torch.randint(0, 1000, (1, 50))]),
    "gru_attn": (GruAttn, lambda: [torch.randn(1, 60, 40)]),
    "espcn": (ESPCN, lambda: [torch.randn(1, 1, 64, 64)]),
    "stylenet": (StyleNet, lambda: [torch.randn(1, 3, 96, 96)]),
    "fpn": (FPN, lambda: [torch.randn(1, 3, 128, 128)]),
    "tinygpt": (TinyGPT, lambda: [torch.randint(0, 500, (1, 32))]),
    "xvector": (XVector, lambda: [torch.randn(1, 30, 200)]),
    "pointnet": (PointNet, lambda: [torch.randn(1, 3, 1024)]),
    "mixer": (Mixer, lambda: [torch.randn(1, 3, 64, 64)]),
    "einsum_attn": (EinsumAttn, lambda: [torch.randn(2, 16, 64)]),
    "lstm_batch": (LstmBatch, lambda: [torch.randn(50, 4, 32)]),
    "audio_decoder": (AudioDecoder, lambda: [torch.randn(1, 80, 50)]),
    "pool1d": (Pool1dNet, lambda: [torch.randn(1, 1, 4000)]),
    "deconv2d": (Deconv2d, lambda: [torch.randn(1, 3, 64, 64)]),
    "masked_encoder": (
        MaskedEncoder,
        lambda: [
            torch.randint(0, 300, (2, 20)),
            torch.cat([torch.ones(2, 15, dtype=torch.long), torch.zeros(2, 5, dtype=torch.long)], 1),
        ],
    ),
}
MODELS.update(OP_FORM_MODELS)
MODELS.update(FORMAT_MODELS)
