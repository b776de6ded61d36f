"""onnxruntime's transformer contrib ops (com.microsoft): hetpart's converters and TVM's own, checked against
onnxruntime one by one and on a BERT fused by onnxruntime's transformer optimizer, compiled for a CPU and an
emulated GPU."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import hetpart

pytestmark = pytest.mark.tvm

F32, I32 = TensorProto.FLOAT, TensorProto.INT32
RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 8, 16)).astype(np.float32)


def _weight(name, *shape):
    return numpy_helper.from_array((RNG.standard_normal(shape) * 0.5).astype(np.float32), name)


def _value(name, shape, dtype=F32):
    return helper.make_tensor_value_info(name, dtype, shape)


def _compile(tmp_path, name, nodes, inputs, outputs, initializers):
    graph = helper.make_graph(nodes, name, inputs, outputs, initializers)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    return path, hetpart.compile(str(path), devices="cpu")


def _ms(op_type, inputs, outputs, **attrs):
    return helper.make_node(op_type, inputs, outputs, domain="com.microsoft", **attrs)


CASES = {
    # TVM's converters, reachable now that the domain is accepted
    "fastgelu_gelu_biasgelu": ([_ms("FastGelu", ["x", "b"], ["g"]), _ms("Gelu", ["g"], ["h"]),
                                _ms("BiasGelu", ["h", "b"], ["y"])], [], [_weight("b", 16)], [_value("y", [2, 8, 16])]),
    "attention_plain": ([_ms("Attention", ["x", "w", "bw"], ["y"], num_heads=2)], [],
                        [_weight("w", 16, 48), _weight("bw", 48)], [_value("y", [2, 8, 16])]),
    # hetpart's
    "attention_lengths": ([_ms("Attention", ["x", "w", "bw", "mask"], ["y"], num_heads=4)],
                          [("mask", np.array([8, 5], np.int32))], [_weight("w", 16, 48), _weight("bw", 48)],
                          [_value("y", [2, 8, 16])]),
    "attention_raw_mask": ([_ms("Attention", ["x", "w", "bw", "mask"], ["y"], num_heads=4, mask_filter_value=-1e4)],
                           [("mask", np.array([[1] * 8, [1] * 5 + [0] * 3], np.int32))],
                           [_weight("w", 16, 48), _weight("bw", 48)], [_value("y", [2, 8, 16])]),
    "attention_3d_mask_causal": ([_ms("Attention", ["x", "w", "bw", "mask"], ["y"], num_heads=2, unidirectional=1)],
                                 [("mask", (RNG.random((2, 8, 8)) > 0.3).astype(np.int32))],
                                 [_weight("w", 16, 48), _weight("bw", 48)], [_value("y", [2, 8, 16])]),
    "attention_qkv_sizes_scale": ([_ms("Attention", ["x", "w", "bw"], ["y"], num_heads=2, qkv_hidden_sizes=[16, 16, 24],
                                       scale=0.3)], [], [_weight("w", 16, 56), _weight("bw", 56)],
                                  [_value("y", [2, 8, 24])]),
    "skip_layer_norm_without_beta_or_bias": ([_ms("SkipLayerNormalization", ["x", "s", "g"], ["y", "", "", "sum"],
                                                  epsilon=1e-5)], [("s", X[::-1].copy())], [_weight("g", 16)],
                                             [_value("y", [2, 8, 16]), _value("sum", [2, 8, 16])]),
    "quick_gelu": ([_ms("QuickGelu", ["x"], ["y"], alpha=1.5)], [], [], [_value("y", [2, 8, 16])]),
    "fused_matmul": ([_ms("FusedMatMul", ["x", "m"], ["y"], transB=1, alpha=0.5)], [], [_weight("m", 12, 16)],
                     [_value("y", [2, 8, 12])]),
    "rms_norms": ([helper.make_node("SimplifiedLayerNormalization", ["x", "g"], ["n"], epsilon=1e-6, axis=-1),
                   _ms("SkipSimplifiedLayerNormalization", ["n", "x", "g", "b"], ["y", "", "", "sum"], epsilon=1e-6)],
                  [], [_weight("g", 16), _weight("b", 16)], [_value("y", [2, 8, 16]), _value("sum", [2, 8, 16])]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_contrib_ops_match_onnxruntime(tmp_path, name):
    nodes, extra, initializers, outputs = CASES[name]
    feeds = {"x": X, **dict(extra)}
    inputs = [_value(k, list(v.shape), I32 if v.dtype == np.int32 else F32) for k, v in feeds.items()]
    path, compiled = _compile(tmp_path, name, nodes, inputs, outputs, initializers)
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = compiled(**feeds)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, atol=2e-5, rtol=1e-5)


def test_bias_add_is_input_plus_bias_plus_skip(tmp_path):
    """onnxruntime runs BiasAdd on CUDA only, so numpy is the reference."""
    bias, skip = RNG.standard_normal(16).astype(np.float32), RNG.standard_normal((2, 8, 16)).astype(np.float32)
    _, compiled = _compile(tmp_path, "bias_add", [_ms("BiasAdd", ["x", "b", "s"], ["y"])],
                           [_value("x", [2, 8, 16]), _value("s", [2, 8, 16])], [_value("y", [2, 8, 16])],
                           [numpy_helper.from_array(bias, "b")])
    np.testing.assert_allclose(compiled(X, skip)[0], X + bias + skip, atol=1e-6)


def test_attention_with_a_past_state_is_refused(tmp_path):
    from hetpart.errors import UnsupportedOpError

    with pytest.raises(UnsupportedOpError, match="past key/value state"):
        _compile(tmp_path, "past", [_ms("Attention", ["x", "w", "bw", "", "past"], ["y"], num_heads=2)],
                 [_value("x", [2, 8, 16]), _value("past", [2, 2, 2, 4, 8])], [_value("y", [2, 8, 16])],
                 [_weight("w", 16, 48), _weight("bw", 48)])


def test_bert_fused_by_the_onnxruntime_optimizer_matches_onnxruntime(tmp_path):
    """The zoo's BERT after onnxruntime.transformers' optimizer (Attention, SkipLayerNormalization, Gelu and
    LayerNormalization fused, in the com.microsoft domain) on a CPU and an emulated GPU."""
    optimizer = pytest.importorskip("onnxruntime.transformers.optimizer")
    from tvm_passes.sources import resolve_model_path

    path = tmp_path / "bert_fused.onnx"
    optimizer.optimize_model(str(resolve_model_path("bert_small", size=32)), model_type="bert", num_heads=0,
                             hidden_size=0).save_model_to_file(str(path))
    fused = {n.op_type for n in onnx.load(str(path)).graph.node if n.domain == "com.microsoft"}
    assert {"Attention", "SkipLayerNormalization"} <= fused
    compiled = hetpart.compile(str(path), devices="cpu,gpu=t4", method="all_gpu", pins={"op:relax.matmul": "cpu"})
    assert set(compiled.plan.device_of) == {"cpu", "gpu"}
    tokens = np.random.default_rng(3).integers(0, 100, (1, 32)).astype(np.int64)
    (expected,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"input_ids": tokens})
    np.testing.assert_allclose(compiled(tokens)[0], expected, atol=1e-4, rtol=1e-4)
