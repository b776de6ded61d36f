"""onnxruntime's com.microsoft MultiHeadAttention through hetpart's import and CPU pipeline, against onnxruntime:
self and cross attention, the projection bias, key lengths and 0/1 key masks, an attention bias, causal attention
with a past cache, keys already split into heads; packed QKV refused."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hetpart.errors import UnsupportedOpError
from tests.tvm_passes.onnx_numerics import assert_matches_onnxruntime
from tvm_passes.frontend import import_model

pytestmark = pytest.mark.tvm

F = TensorProto.FLOAT
rng = np.random.default_rng(0)
BATCH, SEQ, KV_SEQ, HEADS, SIZE = 2, 5, 7, 4, 8
HIDDEN = HEADS * SIZE


def _model(tmp_path, name, node, feeds: dict, inits=()) -> object:
    types = {np.dtype(np.float32): F, np.dtype(np.int32): TensorProto.INT32}
    inputs = [helper.make_tensor_value_info(k, types[v.dtype], list(v.shape)) for k, v in feeds.items()]
    outputs = [helper.make_tensor_value_info(o, F, None) for o in node.output if o]
    graph = helper.make_graph([node], name, inputs, outputs, list(inits))
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("com.microsoft", 1)], ir_version=10),
              str(path))
    return path


def _activations(length: int) -> np.ndarray:
    return rng.standard_normal((BATCH, length, HIDDEN)).astype(np.float32)


def test_cross_attention_with_projection_bias_and_key_lengths(tmp_path):
    feeds = {"q": _activations(SEQ), "k": _activations(KV_SEQ), "v": _activations(KV_SEQ),
             "lens": np.array([7, 3], np.int32)}
    node = helper.make_node("MultiHeadAttention", ["q", "k", "v", "b", "lens"], ["y"], domain="com.microsoft",
                            num_heads=HEADS)
    bias = numpy_helper.from_array(rng.standard_normal(3 * HIDDEN).astype(np.float32), "b")
    assert_matches_onnxruntime(_model(tmp_path, "cross", node, feeds, [bias]), feeds)


def test_key_mask_and_attention_bias_with_scale(tmp_path):
    mask = (rng.random((BATCH, KV_SEQ)) > 0.3).astype(np.int32)
    mask[:, 0] = 1
    feeds = {"q": _activations(SEQ), "k": _activations(KV_SEQ), "v": _activations(KV_SEQ), "m": mask,
             "ab": rng.standard_normal((1, HEADS, SEQ, KV_SEQ)).astype(np.float32)}
    node = helper.make_node("MultiHeadAttention", ["q", "k", "v", "", "m", "ab"], ["y"], domain="com.microsoft",
                            num_heads=HEADS, scale=0.2)
    assert_matches_onnxruntime(_model(tmp_path, "masked", node, feeds), feeds)


def test_causal_self_attention_with_a_past_cache_and_present_outputs(tmp_path):
    x = _activations(SEQ)
    feeds = {"q": x, "k": x, "v": x, "pk": rng.standard_normal((BATCH, HEADS, 3, SIZE)).astype(np.float32),
             "pv": rng.standard_normal((BATCH, HEADS, 3, SIZE)).astype(np.float32)}
    node = helper.make_node("MultiHeadAttention", ["q", "k", "v", "", "", "", "pk", "pv"], ["y", "present_k",
                            "present_v"], domain="com.microsoft", num_heads=HEADS, unidirectional=1)
    assert_matches_onnxruntime(_model(tmp_path, "causal_past", node, feeds), feeds)


def test_keys_and_values_already_split_into_heads(tmp_path):
    feeds = {"q": _activations(SEQ), "k": rng.standard_normal((BATCH, HEADS, KV_SEQ, SIZE)).astype(np.float32),
             "v": rng.standard_normal((BATCH, HEADS, KV_SEQ, SIZE)).astype(np.float32)}
    node = helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["y"], domain="com.microsoft", num_heads=HEADS)
    assert_matches_onnxruntime(_model(tmp_path, "bnsh", node, feeds), feeds)


def test_packed_qkv_is_refused_naming_the_form(tmp_path):
    packed = rng.standard_normal((BATCH, SEQ, HEADS, 3, SIZE)).astype(np.float32)
    node = helper.make_node("MultiHeadAttention", ["qkv"], ["y"], name="mha0", domain="com.microsoft",
                            num_heads=HEADS)
    path = _model(tmp_path, "packed", node, {"qkv": packed})
    with pytest.raises(UnsupportedOpError, match=r"MultiHeadAttention node 'mha0'.*packed"):
        import_model(path)
