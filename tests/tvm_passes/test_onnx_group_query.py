"""onnxruntime's com.microsoft GroupQueryAttention through hetpart's import and CPU pipeline, against onnxruntime:
the first prompt, token generation against caches of different lengths per sequence, a later prompt, packed QKV,
rotary embedding (halves and interleaved), local windows, softcap and scale, smooth softmax and head sinks, an
attention bias, a total sequence length computed from an input's shape; the unsupported forms refused."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from hetpart.errors import ModelLoadError, UnsupportedOpError
from tests.tvm_passes.onnx_numerics import assert_matches_onnxruntime
from tvm_passes.frontend import import_model

pytestmark = pytest.mark.tvm

F = TensorProto.FLOAT
rng = np.random.default_rng(0)
HEADS, KV_HEADS, SIZE = 4, 2, 32     # onnxruntime's rotary needs head sizes of multiples of 16


def _model(tmp_path, name: str, feeds: dict, attrs: dict, inputs: list[str], outputs=3, inits=(), nodes=()):
    """One GroupQueryAttention node reading ``inputs`` ('' for an absent one) from ``feeds`` and ``inits``."""
    types = {np.dtype(np.float32): F, np.dtype(np.int32): TensorProto.INT32, np.dtype(np.int64): TensorProto.INT64}
    node = helper.make_node("GroupQueryAttention", inputs, ["y", "present_key", "present_value"][:outputs],
                            domain="com.microsoft", num_heads=HEADS, kv_num_heads=KV_HEADS, **attrs)
    graph_inputs = [helper.make_tensor_value_info(k, types[v.dtype], list(v.shape)) for k, v in feeds.items()]
    graph_outputs = [helper.make_tensor_value_info(o, F, None) for o in node.output]
    graph = helper.make_graph([*nodes, node], name, graph_inputs, graph_outputs,
                              [numpy_helper.from_array(v, k) for k, v in dict(inits).items()])
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("com.microsoft", 1)], ir_version=10),
              str(path))
    return path


def _tokens(batch: int, length: int, heads: int) -> np.ndarray:
    return rng.standard_normal((batch, length, heads * SIZE)).astype(np.float32)


def _caches(batch: int, length: int) -> dict[str, np.ndarray]:
    return {name: rng.standard_normal((batch, KV_HEADS, length, SIZE)).astype(np.float32)
            for name in ("past_key", "past_value")}


def _rotary_tables(positions: int, rotary_dim: int = SIZE) -> dict[str, np.ndarray]:
    angles = np.outer(np.arange(positions), 1.0 / 10000 ** (np.arange(0, rotary_dim, 2) / rotary_dim))
    return {"cos_cache": np.cos(angles).astype(np.float32), "sin_cache": np.sin(angles).astype(np.float32)}


def _total(length: int) -> dict[str, np.ndarray]:
    return {"total_sequence_length": np.array(length, np.int32)}


INPUTS = ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length"]


@pytest.mark.parametrize("window", [-1, 3])
def test_first_prompt_matches_onnxruntime(tmp_path, window):
    batch, length = 2, 6
    feeds = {"query": _tokens(batch, length, HEADS), "key": _tokens(batch, length, KV_HEADS),
             "value": _tokens(batch, length, KV_HEADS), "seqlens_k": np.full(batch, length - 1, np.int32)}
    path = _model(tmp_path, "prompt", feeds, {"local_window_size": window},
                  ["query", "key", "value", "", "", "seqlens_k", "total_sequence_length"], inits=_total(length))
    y, present_key, _ = assert_matches_onnxruntime(path, feeds)
    assert y.shape == (batch, length, HEADS * SIZE) and present_key.shape == (batch, KV_HEADS, length, SIZE)


def test_token_generation_with_caches_of_different_lengths(tmp_path):
    """Sequence 0 has 3 past keys in a 5-slot cache, sequence 1 has 5: each attends its own, and the present cache
    holds each sequence's past, its new key, then zeros."""
    batch, buffer = 2, 5
    feeds = {"query": _tokens(batch, 1, HEADS), "key": _tokens(batch, 1, KV_HEADS),
             "value": _tokens(batch, 1, KV_HEADS), **_caches(batch, buffer),
             "seqlens_k": np.array([3, 5], np.int32)}
    path = _model(tmp_path, "decode", feeds, {}, INPUTS, inits=_total(buffer + 1))
    _, present_key, _ = assert_matches_onnxruntime(path, feeds)
    np.testing.assert_array_equal(present_key[0, :, 3], feeds["key"].reshape(batch, KV_HEADS, SIZE)[0])
    assert not present_key[0, :, 4:].any()


def test_later_prompt_after_a_past(tmp_path):
    buffer, length = 4, 3
    feeds = {"query": _tokens(1, length, HEADS), "key": _tokens(1, length, KV_HEADS),
             "value": _tokens(1, length, KV_HEADS), **_caches(1, buffer),
             "seqlens_k": np.array([buffer + length - 1], np.int32)}
    path = _model(tmp_path, "later_prompt", feeds, {}, INPUTS, inits=_total(buffer + length))
    assert_matches_onnxruntime(path, feeds)


@pytest.mark.parametrize("interleaved", [0, 1])
def test_packed_qkv_with_rotary_embedding_in_token_generation(tmp_path, interleaved):
    batch, buffer = 2, 6
    feeds = {"query": _tokens(batch, 1, HEADS + 2 * KV_HEADS), **_caches(batch, buffer),
             "seqlens_k": np.array([2, 6], np.int32)}
    path = _model(tmp_path, "packed_rotary", feeds, {"do_rotary": 1, "rotary_interleaved": interleaved},
                  ["query", "", "", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache",
                   "sin_cache"], inits={**_total(buffer + 1), **_rotary_tables(16)})
    assert_matches_onnxruntime(path, feeds)


def test_rotary_at_given_position_ids(tmp_path):
    batch, buffer = 2, 4
    feeds = {"query": _tokens(batch, 1, HEADS), "key": _tokens(batch, 1, KV_HEADS),
             "value": _tokens(batch, 1, KV_HEADS), **_caches(batch, buffer), "seqlens_k": np.array([2, 4], np.int32),
             "position_ids": np.array([[7], [3]], np.int64)}
    path = _model(tmp_path, "position_ids", feeds, {"do_rotary": 1},
                  INPUTS + ["cos_cache", "sin_cache", "position_ids"],
                  inits={**_total(buffer + 1), **_rotary_tables(16)})
    assert_matches_onnxruntime(path, feeds)


def test_rotary_on_part_of_each_head_in_a_prompt(tmp_path):
    length = 5
    feeds = {"query": _tokens(1, length, HEADS), "key": _tokens(1, length, KV_HEADS),
             "value": _tokens(1, length, KV_HEADS), "seqlens_k": np.array([length - 1], np.int32)}
    path = _model(tmp_path, "partial_rotary", feeds, {"do_rotary": 1},
                  ["query", "key", "value", "", "", "seqlens_k", "total_sequence_length", "cos_cache", "sin_cache"],
                  inits={**_total(length), **_rotary_tables(8, rotary_dim=SIZE // 2)})
    assert_matches_onnxruntime(path, feeds)


@pytest.mark.parametrize("attrs", [{"softcap": 2.0, "scale": 0.3}, {"smooth_softmax": 1}])
def test_scores_transforms_match_onnxruntime(tmp_path, attrs):
    batch, buffer = 2, 4
    feeds = {"query": _tokens(batch, 1, HEADS), "key": _tokens(batch, 1, KV_HEADS),
             "value": _tokens(batch, 1, KV_HEADS), **_caches(batch, buffer), "seqlens_k": np.array([1, 4], np.int32)}
    path = _model(tmp_path, "scores", feeds, attrs, INPUTS, inits=_total(buffer + 1))
    assert_matches_onnxruntime(path, feeds)


def test_head_sink_and_attention_bias(tmp_path):
    length = 4
    feeds = {"query": _tokens(1, length, HEADS), "key": _tokens(1, length, KV_HEADS),
             "value": _tokens(1, length, KV_HEADS), "seqlens_k": np.array([length - 1], np.int32),
             "attention_bias": rng.standard_normal((1, HEADS, length, length)).astype(np.float32),
             "head_sink": rng.standard_normal(HEADS).astype(np.float32)}
    path = _model(tmp_path, "sink", feeds, {}, ["query", "key", "value", "", "", "seqlens_k",
                                                "total_sequence_length", "", "", "", "attention_bias", "head_sink"],
                  inits=_total(length))
    assert_matches_onnxruntime(path, feeds)


def test_total_length_from_an_attention_mask_shape(tmp_path):
    """The model builder's form: seqlens_k from the mask's values, total_sequence_length from its shape."""
    batch, buffer = 2, 3
    mask = np.ones((batch, buffer + 1), np.int64)
    mask[0, 2:] = 0
    feeds = {"query": _tokens(batch, 1, HEADS), "key": _tokens(batch, 1, KV_HEADS),
             "value": _tokens(batch, 1, KV_HEADS), **_caches(batch, buffer), "attention_mask": mask}
    nodes = [helper.make_node("ReduceSum", ["attention_mask", "one"], ["lengths"], keepdims=0),
             helper.make_node("Sub", ["lengths", "one"], ["last"]),
             helper.make_node("Cast", ["last"], ["seqlens_k"], to=TensorProto.INT32),
             helper.make_node("Shape", ["attention_mask"], ["mask_shape"]),
             helper.make_node("Gather", ["mask_shape", "axis_one"], ["total_64"], axis=0),
             helper.make_node("Cast", ["total_64"], ["total_sequence_length"], to=TensorProto.INT32)]
    path = _model(tmp_path, "from_mask", feeds, {}, INPUTS, nodes=nodes,
                  inits={"one": np.array([1], np.int64), "axis_one": np.array(1, np.int64)})
    assert_matches_onnxruntime(path, feeds)


def test_unsupported_forms_are_refused_naming_the_node(tmp_path):
    feeds = {"query": _tokens(1, 2, HEADS), "key": _tokens(1, 2, KV_HEADS), "value": _tokens(1, 2, KV_HEADS),
             "seqlens_k": np.array([1], np.int32)}
    path = _model(tmp_path, "quantized", feeds, {},
                  INPUTS[:3] + ["", "", "seqlens_k", "total_sequence_length"] + [""] * 5 + ["k_scale"],
                  inits={**_total(2), "k_scale": np.ones(1, np.float32)})
    with pytest.raises((UnsupportedOpError, ModelLoadError), match="quantized caches"):
        import_model(path, input_shapes={k: v.shape for k, v in feeds.items()})
    feeds_total = {**feeds, "total_sequence_length": np.array(2, np.int32)}
    path = _model(tmp_path, "runtime_total", feeds_total, {},
                  INPUTS[:3] + ["", "", "seqlens_k", "total_sequence_length"])
    with pytest.raises((UnsupportedOpError, ModelLoadError), match="total_sequence_length must be known"):
        import_model(path, input_shapes={k: v.shape for k, v in feeds_total.items()})


def test_a_decoder_step_compiles_for_cpu_and_gpu_and_matches(tmp_path):
    """Projections, GroupQueryAttention with rotary embedding over caches, an output projection: one token
    generation step as the model builder exports it, through ``hetpart.compile`` for cpu+gpu."""
    import hetpart

    batch, buffer, hidden = 2, 6, HEADS * SIZE
    weights = {name: (rng.standard_normal((hidden, width)) / np.sqrt(hidden)).astype(np.float32)
               for name, width in (("wq", hidden), ("wk", KV_HEADS * SIZE), ("wv", KV_HEADS * SIZE), ("wo", hidden))}
    feeds = {"x": _tokens(batch, 1, HEADS), **_caches(batch, buffer), "seqlens_k": np.array([3, 6], np.int32)}
    nodes = [helper.make_node("MatMul", ["x", f"w{p}"], [name]) for p, name in (("q", "query"), ("k", "key"),
                                                                                  ("v", "value"))]
    nodes.append(helper.make_node("MatMul", ["y", "wo"], ["out"]))
    path = _model(tmp_path, "decoder_step", feeds, {"do_rotary": 1}, INPUTS + ["cos_cache", "sin_cache"],
                  inits={**weights, **_total(buffer + 1), **_rotary_tables(16)}, nodes=nodes[:3])
    model = onnx.load(str(path))
    model.graph.node.append(nodes[3])
    model.graph.output.insert(0, helper.make_tensor_value_info("out", F, None))
    onnx.save(model, str(path))
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    compiled = hetpart.compile(path, devices="cpu,gpu=p2200")
    for got, want in zip(compiled(**feeds), expected):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
