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


def _conv_model(path, out_channels, kernel, height, width):
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((out_channels, IN_CHANNELS, *kernel)) * 0.3)
                                     .astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(out_channels).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=list(kernel)),
             helper.make_node("Relu", ["y"], ["z"])]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                            [1, IN_CHANNELS, height, width])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], inits)
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), path)


@pytest.mark.parametrize("kernel, height, width, slice_apart", [((5, 1), 64, 1, True), ((3, 3), 12, 12, False)])
def test_slice_kept_out_of_the_conv_kernel_on_one_column_maps(tmp_path, kernel, height, width, slice_apart):
    """Over a map one column wide the slice back to 100 channels is a kernel of its own, so the conv keeps the flat
    rule (fused, the kernel fell to one-lane column vectors, 3x slower); on wider maps it stays fused."""
    import tvm
    from tvm import relax

    from tvm_passes.frontend import import_model
    from tvm_passes.fusion import fusion_passes, is_padded_channel_slice
    from tvm_passes.schedules import RULE_ATTR, cpu_pipeline, default_cpu_target

    path = _conv_model(tmp_path / "m.onnx", 100, kernel, height, width)
    imported = import_model(path)
    legalized = relax.transform.LegalizeOps()(imported.mod)
    slices = [f for _, f in legalized.functions_items() if isinstance(f, tvm.tirx.PrimFunc)
              and is_padded_channel_slice(relax.transform.AnnotateTIROpPattern()(tvm.IRModule({"f": f}))["f"])]
    assert len(slices) == int(slice_apart)
    fused = tvm.transform.Sequential([*fusion_passes(), relax.transform.FuseTIR()])(legalized)
    kernels = [f for _, f in fused.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    conv_kernels = [f for f in kernels if "conv2d" in f.script()]
    assert len(conv_kernels) == 1 and ("T_strided_slice" in conv_kernels[0].script()) != slice_apart
    target = default_cpu_target()
    with target:
        scheduled = cpu_pipeline(target)(imported.mod)
    rules = {str(f.attrs[RULE_ATTR]) for _, f in scheduled.functions_items()
             if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and RULE_ATTR in f.attrs}
    if slice_apart:
        assert "conv2d_flat" in rules and "conv2d_nchw" not in rules, rules
    x = np.random.default_rng(1).standard_normal((1, IN_CHANNELS, height, width)).astype(np.float32)
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(_run_cpu_pipeline(imported.mod, x), expected, rtol=1e-5, atol=1e-5)
