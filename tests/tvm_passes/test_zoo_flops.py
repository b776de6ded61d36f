"""FLOPs from the analysis pass vs published figures (224x224, batch 1), within 3%, and vs an independent count.

Published GMACs count the multiply-adds of convolutions and fully-connected layers, so the check sums
conv2d + matmul FLOPs / 2 (hetpart counts a multiply-add as 2 FLOPs). Sources: torchvision model docs and
the original papers (ResNet: He et al. 2016; VGG: Simonyan & Zisserman 2015; MobileNetV2: Sandler et al.
2018; DenseNet: Huang et al. 2017).

The audio, OCR, detector and speaker models have no published figure for their configuration; their conv2d + matmul
FLOPs must equal what torch's ``FlopCounterMode`` counts for the same forward pass (convolutions and matrix
products as torch runs them), plus the gate products of LSTM layers, counted analytically because torch runs a CPU
LSTM as one ``aten.lstm`` kernel that ``FlopCounterMode`` does not see into.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import hetpart
import models

pytestmark = pytest.mark.tvm

PUBLISHED_GMACS = {"resnet50": 4.1, "resnet18": 1.8, "vgg16": 15.5, "mobilenetv2": 0.30, "densenet121": 2.9}
# small sizes keep the unrolled RNNs short: (size, conv2d ops, recurrent layers x directions x steps)
NEW_MODEL_SIZES = {"conv1d_audio": (1024, 7, 0), "crnn_ocr": (32, 7, 2 * 2 * 9), "yolo_detector": (64, 113, 0),
                   "gru_audio": (8, 3, 2 * 8), "lstm_speaker": (8, 0, 3 * 8)}


def conv_matmul_flops(graph) -> int:
    return sum(n.flops for n in graph.nodes if n.op in ("relax.nn.conv2d", "relax.matmul"))


def torch_flops(name: str, size: int) -> int:
    """FLOPs (multiply-add = 2) of one batch-1 forward pass, counted by torch plus the LSTM gate products."""
    module, (example,) = models.build_torch(name, batch=1, size=size)
    lstm_macs = 0

    def count_lstm(layer: nn.LSTM, inputs: tuple[torch.Tensor, ...]) -> None:
        nonlocal lstm_macs
        rows = inputs[0].shape[0] * inputs[0].shape[1]            # steps x batch (sequence-first layers)
        directions = 2 if layer.bidirectional else 1
        for index in range(layer.num_layers):
            width = layer.input_size if index == 0 else directions * layer.hidden_size
            lstm_macs += rows * directions * 4 * layer.hidden_size * (width + layer.hidden_size)

    for layer in module.modules():
        if isinstance(layer, nn.LSTM):
            assert not layer.batch_first, "the count assumes [steps, batch, features] inputs"
            layer.register_forward_pre_hook(count_lstm)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        module(example)
    return counter.get_total_flops() + 2 * lstm_macs


@pytest.mark.parametrize("name", sorted(PUBLISHED_GMACS))
def test_zoo_macs_match_published(name):
    graph = hetpart.analyze(name)
    gmacs = conv_matmul_flops(graph) / 2e9
    published = PUBLISHED_GMACS[name]
    assert abs(gmacs - published) / published <= 0.03, f"{name}: {gmacs:.3f} GMACs vs published {published}"
    assert graph.inputs[0].shape == (1, 3, 224, 224)          # weights are parameters, not model inputs
    assert graph.total_param_bytes > 1e6


@pytest.mark.parametrize("name", sorted(NEW_MODEL_SIZES))
def test_new_zoo_model_flops_match_torch(name):
    size, convs, recurrent_steps = NEW_MODEL_SIZES[name]
    graph = hetpart.analyze(name, size=size)
    assert graph.inputs[0].shape == models.ZOO[name].input_shape(1, size)
    assert sum(n.op == "relax.nn.conv2d" for n in graph.nodes) == convs
    # one hidden-state product per unrolled step of every layer and direction
    assert len({(n.tags["rnn_layer"], n.tags["rnn_direction"], n.tags["rnn_step"]) for n in graph.nodes
                if n.op == "relax.matmul" and n.tags.get("rnn_phase") == "step"}) == recurrent_steps
    assert conv_matmul_flops(graph) == torch_flops(name, size)
