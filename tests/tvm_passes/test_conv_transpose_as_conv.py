"""1-D transposed convolutions are imported as zero-inserted convolutions: numerics against onnxruntime."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.onnx_builders import OPSET, save
from tests.tvm_passes.test_conv1d_as_conv2d import _ops, _run_cpu_pipeline

IN_CHANNELS, LENGTH = 8, 12


def _model(path, *, out_per_group=6, kernel=4, stride=2, pads=(1, 1), output_padding=0, dilation=1, group=1,
           bias=True, seed=0):
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((IN_CHANNELS, out_per_group, kernel)) * 0.3)
                                     .astype(np.float32), "w")]
    inputs = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(out_per_group * group).astype(np.float32), "b"))
        inputs.append("b")
    attrs = dict(kernel_shape=[kernel], strides=[stride], pads=list(pads), dilations=[dilation], group=group)
    if output_padding:
        attrs["output_padding"] = [output_padding]
    nodes = [helper.make_node("ConvTranspose", inputs, ["y"], **attrs), helper.make_node("LeakyRelu", ["y"], ["z"],
                                                                                         alpha=0.1)]
    graph = helper.make_graph(nodes, "deconv1d", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                [1, IN_CHANNELS, LENGTH])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], inits)
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), path)


CASES = {
    "stride 2 k4 pad 1": dict(),
    "stride 4 k8 pad 2 (vocoder upsampling)": dict(kernel=8, stride=4, pads=(2, 2)),
    "stride 1 k3 no bias": dict(kernel=3, stride=1, pads=(1, 1), bias=False),
    "stride 3 asymmetric pads, output padding": dict(kernel=5, stride=3, pads=(2, 1), output_padding=1),
    "dilation 2": dict(kernel=3, stride=2, pads=(1, 1), dilation=2),
    "groups 2": dict(out_per_group=3, group=2),
    "depthwise": dict(out_per_group=1, group=IN_CHANNELS, kernel=4, stride=2, pads=(1, 1)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rewritten_transposed_conv_matches_onnxruntime(tmp_path, case):
    from tvm_passes.frontend import import_model

    path = _model(tmp_path / "m.onnx", **CASES[case])
    imported = import_model(path)
    ops = _ops(imported.mod)
    assert "relax.nn.conv1d_transpose" not in ops and "relax.nn.conv2d" in ops
    assert any("transposed" in note for note in imported.notes)
    x = np.random.default_rng(1).standard_normal((1, IN_CHANNELS, LENGTH)).astype(np.float32)
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(_run_cpu_pipeline(imported.mod, x), expected, rtol=1e-4, atol=1e-4)


def test_padding_beyond_the_kernel_reach_is_left_as_written(tmp_path):
    """pads > d (k - 1) would need a crop rather than a pad: the transposed convolution stays."""
    from tvm_passes.frontend import import_model

    path = _model(tmp_path / "m.onnx", kernel=3, stride=2, pads=(3, 3))
    imported = import_model(path)
    assert "relax.nn.conv1d_transpose" in _ops(imported.mod)
    x = np.random.default_rng(1).standard_normal((1, IN_CHANNELS, LENGTH)).astype(np.float32)
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(_run_cpu_pipeline(imported.mod, x), expected, rtol=1e-4, atol=1e-4)


def test_conv_weight_swaps_channels_per_group_and_flips_the_kernel():
    from tvm_passes.conv_transpose_as_conv import conv_weight

    weight = np.arange(4 * 3 * 2, dtype=np.float32).reshape(4, 3, 2)      # I=4, O/g=3, k=2, groups 2
    converted = conv_weight(weight, groups=2)
    assert converted.shape == (6, 2, 2)
    for group in range(2):
        for o in range(3):
            for i in range(2):
                np.testing.assert_array_equal(converted[group * 3 + o, i], weight[group * 2 + i, o, ::-1])
