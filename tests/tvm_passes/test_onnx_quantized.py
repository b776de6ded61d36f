"""Quantized ONNX models as onnxruntime's quantizer writes them -- static QOperator (QLinearConv, QLinearMatMul and
the com.microsoft QLinear ops around them), static QDQ, and dynamic (ConvInteger, MatMulInteger) -- compiled for a
CPU and an emulated GPU and checked against onnxruntime running the same quantized file."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import hetpart

pytestmark = pytest.mark.tvm

quantization = pytest.importorskip("onnxruntime.quantization")


def _float_model(path):
    """Conv+ReLU, a residual Add, Mul, Sigmoid, LeakyRelu, Concat, global average pool and a MatMul head."""
    rng = np.random.default_rng(0)
    weights = {"w1": rng.standard_normal((8, 3, 3, 3)) * 0.4, "b1": rng.standard_normal(8) * 0.1,
               "w2": rng.standard_normal((8, 8, 3, 3)) * 0.2, "b2": rng.standard_normal(8) * 0.1,
               "head": rng.standard_normal((16, 10)) * 0.3}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "r1"], ["res"]),
             helper.make_node("Sigmoid", ["res"], ["gate"]),
             helper.make_node("Mul", ["res", "gate"], ["silu"]),
             helper.make_node("LeakyRelu", ["res"], ["leaky"], alpha=0.1),
             helper.make_node("Concat", ["silu", "leaky"], ["both"], axis=1),
             helper.make_node("GlobalAveragePool", ["both"], ["pooled"]),
             helper.make_node("Flatten", ["pooled"], ["flat"]),
             helper.make_node("MatMul", ["flat", "head"], ["y"])]
    graph = helper.make_graph(nodes, "float", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), str(path))
    return path


class _Calibration:
    def __init__(self):
        rng = np.random.default_rng(1)
        self._feeds = iter([{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(8)])

    def get_next(self):
        return next(self._feeds, None)


@pytest.mark.parametrize("how", ["static_qoperator", "static_qoperator_per_channel", "static_qdq", "dynamic",
                                 "dynamic_saved_by_onnxruntime"])
def test_quantized_models_match_onnxruntime(tmp_path, how):
    source = _float_model(tmp_path / "float.onnx")
    path = tmp_path / f"{how}.onnx"
    if how == "dynamic":
        quantization.quantize_dynamic(str(source), str(path), weight_type=quantization.QuantType.QInt8)
        expected_ops = {"ConvInteger", "MatMulInteger", "DynamicQuantizeLinear"}
    elif how == "dynamic_saved_by_onnxruntime":         # its optimizer fuses the MatMul: DynamicQuantizeMatMul
        quantization.quantize_dynamic(str(source), str(tmp_path / "dynamic.onnx"),
                                      weight_type=quantization.QuantType.QInt8)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(path)
        ort.InferenceSession(str(tmp_path / "dynamic.onnx"), options, providers=["CPUExecutionProvider"])
        expected_ops = {"ConvInteger", "DynamicQuantizeMatMul"}
    else:
        quantization.quantize_static(
            str(source), str(path), _Calibration(),
            quant_format=quantization.QuantFormat.QDQ if how == "static_qdq" else quantization.QuantFormat.QOperator,
            per_channel=how.endswith("per_channel"), activation_type=quantization.QuantType.QUInt8,
            weight_type=quantization.QuantType.QInt8)
        expected_ops = {"QuantizeLinear", "DequantizeLinear"} if how == "static_qdq" else {
            "QLinearConv", "QLinearMatMul", "QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu",
            "QLinearConcat", "QLinearGlobalAveragePool"}
    assert expected_ops <= {n.op_type for n in onnx.load(str(path)).graph.node}
    compiled = hetpart.compile(str(path), devices="cpu,gpu=t4", method="all_gpu",
                               pins={"op:relax.nn.conv2d": "cpu"})
    assert set(compiled.plan.device_of) == {"cpu", "gpu"}
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(2)
    for _ in range(3):
        x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
        (expected,) = session.run(None, {"x": x})
        (got,) = compiled(x)
        # the last op's output is quantized: one step of its scale is the most a rounding boundary can move it
        step = float(np.min(np.abs(np.diff(np.unique(expected))))) if np.unique(expected).size > 1 else 1e-6
        assert float(np.abs(got - expected).max()) <= max(step, 1e-5) * 1.01, how


def test_an_unconverted_quantized_op_gets_the_qdq_route(tmp_path):
    from hetpart.errors import UnsupportedOpError
    from tvm_passes.frontend import import_model

    node = helper.make_node("QLinearAveragePool", ["x", "s", "z", "s", "z"], ["y"], domain="com.microsoft",
                            kernel_shape=[2, 2])
    graph = helper.make_graph([node], "q", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 2, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 2, 2, 2])],
                              [numpy_helper.from_array(np.array(0.1, np.float32), "s"),
                               numpy_helper.from_array(np.array(3, np.uint8), "z")])
    path = tmp_path / "pool.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("com.microsoft", 1)], ir_version=10),
              str(path))
    with pytest.raises(UnsupportedOpError, match=r"com.microsoft.QLinearAveragePool x1\. Quantize the float model "
                                                 r"in QDQ format instead"):
        import_model(path)


def test_matmul_integer_to_float_matches_onnxruntime(tmp_path):
    """onnxruntime's MatMulIntegerToFloat: per-column weight scales and zero points, and a bias."""
    from tests.tvm_passes.onnx_numerics import assert_matches_onnxruntime

    rng = np.random.default_rng(3)
    a = rng.integers(0, 255, (3, 6)).astype(np.uint8)
    node = helper.make_node("MatMulIntegerToFloat", ["a", "b", "sa", "sb", "za", "zb", "bias"], ["y"],
                            domain="com.microsoft")
    inits = [numpy_helper.from_array(rng.integers(-128, 127, (6, 4)).astype(np.int8), "b"),
             numpy_helper.from_array(np.array(0.02, np.float32), "sa"),
             numpy_helper.from_array(rng.uniform(0.01, 0.05, 4).astype(np.float32), "sb"),
             numpy_helper.from_array(np.array(131, np.uint8), "za"),
             numpy_helper.from_array(rng.integers(-3, 3, 4).astype(np.int8), "zb"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "bias")]
    graph = helper.make_graph([node], "mitf", [helper.make_tensor_value_info("a", TensorProto.UINT8, [3, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    path = tmp_path / "mitf.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("com.microsoft", 1)], ir_version=10),
              str(path))
    assert_matches_onnxruntime(path, {"a": a})
