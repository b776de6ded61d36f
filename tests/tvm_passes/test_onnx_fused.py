"""onnxruntime's fused ops as a model it optimized and saved carries them (``FusedConv``, ``FusedGemm``), through
hetpart's import and CPU pipeline against onnxruntime; and the NCHWc layout ops of ``ORT_ENABLE_ALL`` refused
with the fix named."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from hetpart.errors import UnsupportedOpError
from tests.tvm_passes.onnx_numerics import assert_matches_onnxruntime
from tvm_passes.frontend import import_model

pytestmark = pytest.mark.tvm

F = TensorProto.FLOAT
rng = np.random.default_rng(0)


def _save(tmp_path, name: str, nodes, inputs, inits) -> object:
    graph = helper.make_graph(nodes, name, inputs, [helper.make_tensor_value_info("y", F, None)], inits)
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("com.microsoft", 1)], ir_version=10),
              str(path))
    return path


ACTIVATION_CASES = [("Relu", []), ("Tanh", []), ("Sigmoid", []), ("LeakyRelu", [0.2]), ("Clip", [-0.5, 0.7]),
                    ("HardSigmoid", [0.3, 0.4])]


@pytest.mark.parametrize("activation,values", ACTIVATION_CASES, ids=[a for a, _ in ACTIVATION_CASES])
@pytest.mark.parametrize("with_sum", [False, True], ids=["conv", "conv_plus_z"])
def test_fused_conv_matches_onnxruntime(tmp_path, activation, values, with_sum):
    x = rng.standard_normal((1, 3, 9, 9)).astype(np.float32)
    inputs = ["x", "w", "b"] + (["z"] if with_sum else [])
    node = helper.make_node("FusedConv", inputs, ["y"], domain="com.microsoft", activation=activation,
                            kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2],
                            **({"activation_params": values} if values else {}))
    value_infos = [helper.make_tensor_value_info("x", F, [1, 3, 9, 9])]
    feeds = {"x": x}
    if with_sum:
        value_infos.append(helper.make_tensor_value_info("z", F, [1, 4, 5, 5]))
        feeds["z"] = rng.standard_normal((1, 4, 5, 5)).astype(np.float32)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")]
    assert_matches_onnxruntime(_save(tmp_path, f"fused_conv_{activation}", [node], value_infos, inits), feeds)


@pytest.mark.parametrize("activation", ["Relu", "LeakyRelu"])
def test_fused_gemm_matches_onnxruntime(tmp_path, activation):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    node = helper.make_node("FusedGemm", ["x", "w", "c"], ["y"], domain="com.microsoft", activation=activation,
                            activation_alpha=0.3, transB=1, alpha=0.7, beta=1.3)
    inits = [numpy_helper.from_array(rng.standard_normal((5, 6)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "c")]
    path = _save(tmp_path, f"fused_gemm_{activation}", [node], [helper.make_tensor_value_info("x", F, [4, 6])], inits)
    assert_matches_onnxruntime(path, {"x": x})


def test_unknown_activation_is_refused_naming_the_node(tmp_path):
    node = helper.make_node("FusedConv", ["x", "w"], ["y"], name="fc0", domain="com.microsoft", activation="Gelu",
                            kernel_shape=[1, 1])
    path = _save(tmp_path, "fused_gelu", [node], [helper.make_tensor_value_info("x", F, [1, 2, 3, 3])],
                 [numpy_helper.from_array(np.ones((2, 2, 1, 1), np.float32), "w")])
    with pytest.raises(UnsupportedOpError, match=r"FusedConv node 'fc0'.*activation must be one of.*'Gelu'"):
        import_model(path)


def _small_cnn(tmp_path) -> object:
    """Conv+Relu, Conv, a residual Add and Relu: what onnxruntime's optimizer turns into FusedConv nodes."""
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "w2", "b2"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "x"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    inits = [numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.2, n)
             for n in ("w1", "w2")]
    inits += [numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), n) for n in ("b1", "b2")]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", F, [1, 8, 12, 12])],
                              [helper.make_tensor_value_info("y", F, None)], inits)
    path = tmp_path / "cnn.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), str(path))
    return path


def _optimized(path, level) -> tuple[object, set[str]]:
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.optimized_model_filepath = str(path.with_name(f"{path.stem}_{int(level)}.onnx"))
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    saved = onnx.load(options.optimized_model_filepath)
    return options.optimized_model_filepath, {f"{n.domain}.{n.op_type}" if n.domain else n.op_type
                                              for n in saved.graph.node}


def test_a_model_onnxruntime_optimized_and_saved_compiles_and_matches(tmp_path):
    import hetpart

    saved, ops = _optimized(_small_cnn(tmp_path), ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED)
    assert "com.microsoft.FusedConv" in ops, ops
    x = rng.standard_normal((1, 8, 12, 12)).astype(np.float32)
    expected = ort.InferenceSession(saved, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    compiled = hetpart.compile(saved, devices="cpu,gpu=p2200")
    np.testing.assert_allclose(compiled(x=x)[0], expected, rtol=1e-4, atol=1e-5)


def test_nchwc_layout_ops_are_refused_with_the_fix(tmp_path):
    saved, ops = _optimized(_small_cnn(tmp_path), ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    if not any(op.startswith("com.microsoft.nchwc.") for op in ops):
        pytest.skip(f"onnxruntime made no NCHWc layout ops on this CPU (ops: {sorted(ops)})")
    with pytest.raises(UnsupportedOpError, match="NCHWc layout ops.*ORT_ENABLE_EXTENDED"):
        import_model(saved)
