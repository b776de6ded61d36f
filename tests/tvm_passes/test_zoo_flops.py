"""FLOPs from the analysis pass vs published figures (224x224, batch 1), within 3%.

Published GMACs count the multiply-adds of convolutions and fully-connected layers, so the check sums
conv2d + matmul FLOPs / 2 (hetpart counts a multiply-add as 2 FLOPs). Sources: torchvision model docs and
the original papers (ResNet: He et al. 2016; VGG: Simonyan & Zisserman 2015; MobileNetV2: Sandler et al.
2018; DenseNet: Huang et al. 2017).
"""
from __future__ import annotations

import pytest

import hetpart

pytestmark = pytest.mark.tvm

PUBLISHED_GMACS = {"resnet50": 4.1, "resnet18": 1.8, "vgg16": 15.5, "mobilenetv2": 0.30, "densenet121": 2.9}


@pytest.mark.parametrize("name", sorted(PUBLISHED_GMACS))
def test_zoo_macs_match_published(name):
    graph = hetpart.analyze(name)
    gmacs = sum(n.flops for n in graph.nodes if n.op in ("relax.nn.conv2d", "relax.matmul")) / 2e9
    published = PUBLISHED_GMACS[name]
    assert abs(gmacs - published) / published <= 0.03, f"{name}: {gmacs:.3f} GMACs vs published {published}"
    assert graph.inputs[0].shape == (1, 3, 224, 224)          # weights are parameters, not model inputs
    assert graph.total_param_bytes > 1e6
