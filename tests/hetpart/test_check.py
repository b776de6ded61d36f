"""``hetpart run --check``'s pieces: allclose-style comparison, valid random inputs, the onnxruntime reference."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from hetpart.driver.check import (compare_outputs, index_input_bounds, integer_input_ranges, load_input_file,
                                  onnxruntime_reference, sample_inputs)
from hetpart.driver.inputs import check_inputs
from hetpart.errors import InputMismatchError, ModelLoadError
from hetpart.graph import Edge, OpGraph, OpNode, TensorSpec


def test_large_outputs_pass_at_float32_rounding_and_real_differences_fail():
    reference = [np.full((4, 85), 321.0, np.float32)]
    rounding = [reference[0] * np.float32(1 + 7e-7)]          # |diff| 2.2e-4 > atol 1e-4, relative 7e-7
    result = compare_outputs(rounding, reference)
    assert result.ok and result.max_abs_error > 1e-4 and result.max_rel_error < 1e-6
    wrong = [reference[0] + np.float32(0.5)]
    result = compare_outputs(wrong, reference)
    assert not result.ok and result.max_abs_error == pytest.approx(0.5)
    assert "FAILED" in result.describe() and "max relative" in result.describe()
    near_zero = [np.array([5e-5], np.float32)]
    assert compare_outputs(near_zero, [np.zeros(1, np.float32)]).ok                 # the absolute part
    with pytest.raises(InputMismatchError, match="outputs"):
        compare_outputs(rounding, reference * 2)


def _embedding_graph() -> OpGraph:
    """tokens (int64) -> wrap negative ids (add, where) -> take(table[1000, 16]); mask (int32) -> add."""
    nodes = (
        OpNode(0, "wrapped", "relax.add", (), ((8,), ()), ("int64", "int64"), ((8,),), ("int64",),
               graph_inputs=("tokens",)),
        OpNode(1, "emb", "relax.take", (0,), ((1000, 16), (8,)), ("float32", "int64"), ((8, 16),), ("float32",),
               attrs={"axis": 0}),
        OpNode(2, "masked", "relax.add", (), ((8,), ()), ("int32", "int32"), ((8,),), ("int32",),
               graph_inputs=("mask",)),
    )
    return OpGraph(nodes=nodes, edges=(Edge(0, 1, 64),),
                   inputs=(TensorSpec("tokens", (8,), "int64", consumers=(0,)),
                           TensorSpec("mask", (8,), "int32", consumers=(2,)),
                           TensorSpec("x", (2,), "float32", consumers=())),
                   outputs=(TensorSpec("y", (8, 16), "float32", producer=1),), name="emb").validate()


def test_integer_inputs_are_sampled_in_their_valid_range():
    graph = _embedding_graph()
    assert integer_input_ranges(graph) == {"tokens": (0, 1000), "mask": (0, 2)}
    specs = [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype} for t in graph.inputs]
    feeds = sample_inputs(specs, graph, seed=1)
    assert feeds["tokens"].dtype == np.int64 and 0 <= feeds["tokens"].min() and feeds["tokens"].max() < 1000
    assert feeds["tokens"].max() > 1, "token ids must not all be zero"
    assert set(np.unique(feeds["mask"])) <= {0, 1} and feeds["x"].dtype == np.float32
    assert all(np.array_equal(a, b) for a, b in zip(feeds.values(), sample_inputs(specs, graph, seed=1).values()))


def test_ids_outside_the_table_are_refused_before_the_unchecked_gather_reads_them():
    """ONNX Gather takes ids in [-n, n); the compiled take does not check them (it would read out of bounds)."""
    graph = _embedding_graph()
    bounds = index_input_bounds(graph)
    assert bounds == {"tokens": 1000}                              # the mask indexes nothing
    specs = [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype} for t in graph.inputs]
    mask, x = np.ones(8, np.int32), np.zeros(2, np.float32)
    for ok in (np.arange(8) * 100, np.full(8, -1000), np.full(8, 999)):
        arrays = check_inputs(specs, [ok, mask, x], {}, bounds)
        np.testing.assert_array_equal(arrays[0], ok)
    for bad, value in ((np.full(8, 1000), 1000), (np.full(8, -1001), -1001)):
        with pytest.raises(InputMismatchError, match=rf"'tokens' indexes a table of 1000 rows.*\[-1000, 1000\); "
                                                     rf"found {value} at \[0\] \(8 outside\)"):
            check_inputs(specs, [bad, mask, x], {}, bounds)
    check_inputs(specs, [np.full(8, 5000), np.full(8, 7, np.int32), x], {})     # no bounds given: not checked


def test_values_sorted_by_a_top_k_index_nothing():
    """pack_padded_sequence(enforce_sorted=False) exports lengths -> TopK, whose indices reorder the batch with a
    Gather of a table as long as the batch: the lengths themselves (up to the sequence length) index nothing."""
    nodes = (
        OpNode(0, "lens64", "relax.astype", (), ((3,),), ("int32",), ((3,),), ("int64",), graph_inputs=("lengths",)),
        OpNode(1, "sorted", "relax.topk", (0,), ((3,),), ("int64",), ((3,), (3,)), ("int64", "int64")),
        OpNode(2, "order", "relax.take", (1,), ((3, 8), (3,)), ("float32", "int64"), ((3, 8),), ("float32",),
               attrs={"axis": 0}),
        OpNode(3, "shifted", "relax.add", (0,), ((3,), ()), ("int64", "int64"), ((3,),), ("int64",)),
        OpNode(4, "rows", "relax.take", (3,), ((50, 8), (3,)), ("float32", "int64"), ((3, 8),), ("float32",),
               attrs={"axis": 0}),
    )
    graph = OpGraph(nodes=nodes, edges=(Edge(0, 1, 24), Edge(1, 2, 48), Edge(0, 3, 24), Edge(3, 4, 24)),
                    inputs=(TensorSpec("lengths", (3,), "int32", consumers=(0,)),),
                    outputs=(TensorSpec("y", (3, 8), "float32", producer=2),
                             TensorSpec("z", (3, 8), "float32", producer=4)), name="lens").validate()
    assert index_input_bounds(graph) == {"lengths": 50}     # through the cast and the add only, not the top-k
    graph = replace(graph, nodes=graph.nodes[:3], edges=graph.edges[:2], outputs=graph.outputs[:1]).validate()
    assert index_input_bounds(graph) == {}


def test_input_files_give_typed_errors(tmp_path):
    with pytest.raises(InputMismatchError, match="no file .*missing.npy"):
        load_input_file(f"input={tmp_path / 'missing.npy'}")
    with pytest.raises(InputMismatchError, match="NAME=FILE.npy"):
        load_input_file("input.npy")
    (tmp_path / "bad.npy").write_text("not an array")
    with pytest.raises(InputMismatchError, match="not a readable .npy"):
        load_input_file(f"x={tmp_path / 'bad.npy'}")
    np.save(tmp_path / "ok.npy", np.arange(3))
    assert load_input_file(f"x={tmp_path / 'ok.npy'}")[1].tolist() == [0, 1, 2]


def test_reference_runs_models_saved_with_a_newer_ir_version(tmp_path):
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 14
    path = tmp_path / "ir14.onnx"
    onnx.save(model, str(path))
    (out,) = onnxruntime_reference(path, {"x": np.array([-1.0, 0.0, 2.0], np.float32)})
    assert out.tolist() == [0.0, 0.0, 2.0]
    assert onnx.load(str(path)).ir_version == 14, "the user's file is not modified"
    (tmp_path / "garbage.onnx").write_bytes(b"\x00garbage")
    with pytest.raises(ModelLoadError, match="garbage.onnx"):
        onnxruntime_reference(tmp_path / "garbage.onnx", {})
