"""RotaryEmbedding, the ONNX op (opset 23) and onnxruntime's com.microsoft op, through hetpart's import and CPU
pipeline against onnxruntime: 3-D and 4-D inputs, halves and interleaved pairs, partial rotation, position ids,
the contrib op's position offset."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hetpart.errors import UnsupportedOpError
from tests.tvm_passes.onnx_numerics import assert_matches_onnxruntime
from tvm_passes.frontend import import_model

pytestmark = pytest.mark.tvm

F, I64 = TensorProto.FLOAT, TensorProto.INT64
rng = np.random.default_rng(0)
BATCH, SEQ, HEADS, SIZE, MAX_POSITIONS = 2, 5, 3, 8, 16


def _caches(rotated: int) -> list:
    angles = rng.uniform(0, 3, (MAX_POSITIONS, rotated // 2))
    return [numpy_helper.from_array(np.cos(angles).astype(np.float32), "cos"),
            numpy_helper.from_array(np.sin(angles).astype(np.float32), "sin")]


def _save(tmp_path, name, node, feeds, inits, opsets) -> object:
    types = {np.dtype(np.float32): F, np.dtype(np.int64): I64}
    inputs = [helper.make_tensor_value_info(k, types[v.dtype], list(v.shape)) for k, v in feeds.items()]
    graph = helper.make_graph([node], name, inputs, [helper.make_tensor_value_info("y", F, None)], inits)
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets], ir_version=10),
              str(path))
    return path


POSITIONS = np.stack([np.arange(SEQ), np.arange(3, 3 + SEQ)]).astype(np.int64)


@pytest.mark.parametrize("rank", [3, 4])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rotated", [SIZE, 4])
def test_onnx_rotary_embedding_matches_onnxruntime(tmp_path, rank, interleaved, rotated):
    shape = (BATCH, SEQ, HEADS * SIZE) if rank == 3 else (BATCH, HEADS, SEQ, SIZE)
    feeds = {"x": rng.standard_normal(shape).astype(np.float32), "pos": POSITIONS}
    attrs = dict(interleaved=interleaved, rotary_embedding_dim=0 if rotated == SIZE else rotated)
    if rank == 3:
        attrs["num_heads"] = HEADS
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "pos"], ["y"], **attrs)
    path = _save(tmp_path, f"rope{rank}{interleaved}{rotated}", node, feeds, _caches(rotated), [("", 23)])
    assert_matches_onnxruntime(path, feeds)


@pytest.mark.parametrize("positions", ["ids", "offset"])
def test_contrib_rotary_embedding_matches_onnxruntime(tmp_path, positions):
    feeds = {"x": rng.standard_normal((BATCH, SEQ, HEADS * SIZE)).astype(np.float32),
             "pos": POSITIONS if positions == "ids" else np.array([4], np.int64)}
    node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain="com.microsoft",
                            interleaved=1, num_heads=HEADS)
    path = _save(tmp_path, f"contrib_rope_{positions}", node, feeds, _caches(SIZE), [("", 17), ("com.microsoft", 1)])
    assert_matches_onnxruntime(path, feeds)


def test_packed_batching_is_refused_naming_the_node(tmp_path):
    feeds = {"x": rng.standard_normal((BATCH, SEQ, HEADS * SIZE)).astype(np.float32), "pos": POSITIONS}
    node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], name="rope0", domain="com.microsoft",
                            num_heads=HEADS, is_packed_batching=1)
    path = _save(tmp_path, "packed_rope", node, feeds, _caches(SIZE), [("", 17), ("com.microsoft", 1)])
    with pytest.raises(UnsupportedOpError, match=r"RotaryEmbedding node 'rope0'.*is_packed_batching"):
        import_model(path, input_shapes={k: v.shape for k, v in feeds.items()})
