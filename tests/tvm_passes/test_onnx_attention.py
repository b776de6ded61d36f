"""The ONNX standard ``Attention`` (opset 23) through hetpart's import and CPU pipeline, against onnxruntime: 4-D and
3-D inputs, grouped-query heads, causal masks with and without a past cache, boolean and additive masks (short
ones padded, fully masked rows), softcap, scale, the qk_matmul_output modes; and the com.microsoft op of the same
name still converted as before."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hetpart.errors import UnsupportedOpError
from tests.tvm_passes.onnx_numerics import assert_matches_onnxruntime, cpu_outputs, onnxruntime_outputs
from tvm_passes.frontend import import_model

pytestmark = pytest.mark.tvm

F = TensorProto.FLOAT


def _run(tmp_path, name: str, node: onnx.NodeProto, feeds: dict, extra_outputs: int = 0, opset: int = 23):
    inputs = [helper.make_tensor_value_info(k, TensorProto.BOOL if v.dtype == bool else F, list(v.shape))
              for k, v in feeds.items()]
    outputs = [helper.make_tensor_value_info(o, F, None) for o in node.output]
    path = tmp_path / f"{name}.onnx"
    graph = helper.make_graph([node], name, inputs, outputs)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10), str(path))
    got, expected = cpu_outputs(path, feeds), onnxruntime_outputs(path, feeds)
    assert len(got) == len(expected)
    return got, expected


rng = np.random.default_rng(0)


def _qkv(q_heads=4, kv_heads=4, q_len=6, kv_len=6, size=8, batch=2):
    return (rng.standard_normal((batch, q_heads, q_len, size)).astype(np.float32),
            rng.standard_normal((batch, kv_heads, kv_len, size)).astype(np.float32),
            rng.standard_normal((batch, kv_heads, kv_len, size)).astype(np.float32))


CASES = {
    "plain_4d": lambda: ({}, dict(zip("qkv", _qkv(q_len=6, kv_len=5))), ["y"]),
    "causal": lambda: ({"is_causal": 1}, dict(zip("qkv", _qkv())), ["y"]),
    "grouped_query_heads": lambda: ({"is_causal": 1}, dict(zip("qkv", _qkv(q_heads=6, kv_heads=2))), ["y"]),
    "scale_softcap": lambda: ({"scale": 0.3, "softcap": 2.0}, dict(zip("qkv", _qkv())), ["y"]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_attention_matches_onnxruntime(tmp_path, name):
    attrs, feeds, outputs = CASES[name]()
    node = helper.make_node("Attention", ["q", "k", "v"], outputs, **attrs)
    got, expected = _run(tmp_path, name, node, feeds)
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-4, atol=1e-5)


def test_three_dimensional_inputs_with_grouped_heads(tmp_path):
    q, k, v = _qkv(q_heads=4, kv_heads=2, q_len=5, kv_len=7)
    flat = {name: t.transpose(0, 2, 1, 3).reshape(t.shape[0], t.shape[2], -1) for name, t in zip("qkv", (q, k, v))}
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], q_num_heads=4, kv_num_heads=2)
    got, expected = _run(tmp_path, "three_d", node, flat)
    assert got[0].shape == (2, 5, 32)
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-4, atol=1e-5)


def test_boolean_mask_with_a_fully_masked_row_and_the_score_outputs(tmp_path):
    q, k, v = _qkv(q_len=4, kv_len=6)
    mask = rng.random((2, 1, 4, 6)) > 0.4
    mask[0, 0, 2] = False                         # query 2 of batch 0 attends nothing: zeros, not NaN
    mask[:, :, :, 0] |= np.arange(4)[None, None, :] != 2
    for mode in (0, 2, 3):
        node = helper.make_node("Attention", ["q", "k", "v", "m"], ["y", "pk", "pv", "qk"], qk_matmul_output_mode=mode)
        got, expected = _run(tmp_path, f"bool_mask_{mode}", node, {"q": q, "k": k, "v": v, "m": mask})
        for g, e in zip(got, expected):
            assert g.shape == e.shape
            finite = np.isfinite(e)
            assert (np.isfinite(g) == finite).all(), mode
            np.testing.assert_allclose(g[finite], e[finite], rtol=1e-4, atol=1e-5)
        assert not np.isnan(got[0]).any() and np.abs(got[0][0, :, 2]).max() == 0.0


def test_past_cache_shifts_the_causal_frontier(tmp_path):
    q, k, v = _qkv(q_len=3, kv_len=3)
    past_k, past_v = (rng.standard_normal((2, 4, 5, 8)).astype(np.float32) for _ in range(2))
    additive = rng.standard_normal((2, 1, 3, 8)).astype(np.float32)
    node = helper.make_node("Attention", ["q", "k", "v", "m", "past_k", "past_v"], ["y", "present_k", "present_v"],
                            is_causal=1)
    got, expected = _run(tmp_path, "past_cache", node, {"q": q, "k": k, "v": v, "m": additive, "past_k": past_k,
                                                        "past_v": past_v})
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)
    assert got[1].shape == (2, 4, 8, 8)


def test_contrib_attention_of_the_same_name_still_converts(tmp_path):
    """onnxruntime's com.microsoft Attention (input, weights, bias; ``num_heads``) is not mistaken for the ONNX op."""
    x = rng.standard_normal((1, 5, 16)).astype(np.float32)
    node = helper.make_node("Attention", ["x", "w", "b"], ["y"], domain="com.microsoft", num_heads=2)
    graph = helper.make_graph([node], "contrib", [helper.make_tensor_value_info("x", F, [1, 5, 16])],
                              [helper.make_tensor_value_info("y", F, None)],
                              [numpy_helper.from_array(rng.standard_normal((16, 48)).astype(np.float32) * 0.3, "w"),
                               numpy_helper.from_array(rng.standard_normal(48).astype(np.float32), "b")])
    path = tmp_path / "contrib.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("com.microsoft", 1)], ir_version=10),
              str(path))
    assert_matches_onnxruntime(path, {"x": x})


def test_external_cache_lengths_are_refused_naming_the_input(tmp_path):
    q, k, v = _qkv()
    node = helper.make_node("Attention", ["q", "k", "v", "", "", "", "lens"], ["y"], name="attn0")
    inputs = [helper.make_tensor_value_info(n, F, list(t.shape)) for n, t in zip("qkv", (q, k, v))]
    inputs.append(helper.make_tensor_value_info("lens", TensorProto.INT64, [2]))
    path = tmp_path / "nonpad.onnx"
    onnx.save(helper.make_model(helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", F, None)]),
                                opset_imports=[helper.make_opsetid("", 24)], ir_version=10), str(path))
    with pytest.raises(UnsupportedOpError, match=r"Attention node 'attn0'.*nonpad_kv_seqlen"):
        import_model(path, input_shapes={"q": q.shape, "k": k.shape, "v": v.shape, "lens": (2,)})


def test_a_mask_shorter_than_the_keys_masks_the_rest_as_the_onnx_reference_does(tmp_path):
    """onnxruntime refuses a mask shorter than the keys; the ONNX reference pads it with masked keys."""
    from onnx.reference import ReferenceEvaluator

    q, k, v = _qkv(q_len=3, kv_len=7)
    short = rng.standard_normal((2, 1, 3, 5)).astype(np.float32)
    node = helper.make_node("Attention", ["q", "k", "v", "m"], ["y"])
    feeds = {"q": q, "k": k, "v": v, "m": short}
    inputs = [helper.make_tensor_value_info(n, F, list(t.shape)) for n, t in feeds.items()]
    model = helper.make_model(helper.make_graph([node], "short", inputs, [helper.make_tensor_value_info("y", F, None)]),
                              opset_imports=[helper.make_opsetid("", 23)], ir_version=10)
    path = tmp_path / "short.onnx"
    onnx.save(model, str(path))
    expected = ReferenceEvaluator(model).run(None, feeds)[0]
    np.testing.assert_allclose(cpu_outputs(path, feeds)[0], expected, rtol=1e-4, atol=1e-5)
