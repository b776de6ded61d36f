"""Convolutions with output channels not in whole vectors are padded at import: which, and numerics."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.onnx_builders import OPSET, save
from tests.tvm_passes.test_conv1d_as_conv2d import _run_cpu_pipeline

IN_CHANNELS = 16


def _model(path, out_channels, kernel=1, bias=True, activation="Relu", seed=0, stride=1, groups=1):
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((out_channels, IN_CHANNELS // groups, kernel, kernel))
                                      * 0.3).astype(np.float32), "w")]
    inputs = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(out_channels).astype(np.float32), "b"))
        inputs.append("b")
    nodes = [helper.make_node("Conv", inputs, ["y"], kernel_shape=[kernel, kernel], pads=[kernel // 2] * 4,
                              strides=[stride, stride], group=groups),
             helper.make_node(activation, ["y"], ["z"])]
    graph = helper.make_graph(nodes, "pointwise", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                 [1, IN_CHANNELS, 5, 7])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], inits)
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), path)


def _conv_weights(mod):
    from tvm import relax

    found = []

    @relax.expr_functor.visitor
    class _Convs(relax.PyExprVisitor):
        def visit_call_(self, call):
            if getattr(call.op, "name", "") == "relax.nn.conv2d":
                found.append(tuple(int(d) for d in call.args[1].ty.shape))
            super().visit_call_(call)

    _Convs().visit_expr(mod["main"])
    return found


@pytest.mark.parametrize("out_channels, kernel, stride, groups, bias, padded_to", [
    (36, 1, 1, 1, True, 48), (36, 1, 1, 1, False, 48), (300, 1, 1, 1, True, 304),   # not a multiple of 8: padded,
    (36, 3, 1, 1, True, 48), (100, 3, 2, 1, False, 112), (50, 5, 2, 1, True, 64),    # spatial and strided too
    (40, 3, 1, 1, True, None), (20, 1, 1, 1, True, None), (36, 3, 1, 4, True, None),  # half registers, too few,
])                                                                                    # grouped: as written
def test_padding_choice_and_numerics(tmp_path, out_channels, kernel, stride, groups, bias, padded_to):
    from tvm_passes.frontend import import_model

    path = _model(tmp_path / "m.onnx", out_channels, kernel, bias, stride=stride, groups=groups)
    imported = import_model(path)
    (weight,) = _conv_weights(imported.mod)
    assert weight[0] == (padded_to or out_channels)
    assert any("pad_conv_channels" in note for note in imported.notes) == (padded_to is not None)
    x = np.random.default_rng(1).standard_normal((1, IN_CHANNELS, 5, 7)).astype(np.float32)
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = _run_cpu_pipeline(imported.mod, x)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_pad_columns_false_keeps_the_channels(tmp_path):
    from tvm_passes.frontend import import_model

    imported = import_model(_model(tmp_path / "m.onnx", 36), pad_columns=False)
    assert _conv_weights(imported.mod)[0][0] == 36
