"""tvm_passes.extract: OpGraph features, edges, tuple outputs, constants, and TVM's fused kernels."""
from __future__ import annotations

import numpy as np
import pytest

from tests import onnx_builders
from tvm_passes.extract import ExtractOpFeatures, extract_op_graph, op_bindings, op_flops
from tvm_passes.frontend import import_model

pytestmark = pytest.mark.tvm


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    path = onnx_builders.small_cnn(tmp_path_factory.mktemp("m") / "cnn.onnx")
    return import_model(path, input_shapes={"x": (2, 3, 8, 8)})


@pytest.fixture(scope="module")
def graph(imported):
    return extract_op_graph(imported.mod, name="cnn", source_hash=imported.source_hash)


def by_op(graph, op):
    return [n for n in graph.nodes if n.op == op]


def test_ids_follow_op_bindings_and_are_topological(imported, graph):
    bindings = op_bindings(imported.mod["main"])
    assert [b.var.name for b in bindings] == [n.name for n in graph.nodes]
    graph.validate()
    assert all(src < n.id for n in graph.nodes for src in n.inputs)


def test_conv_features_by_hand(graph):
    conv1, conv2 = by_op(graph, "relax.nn.conv2d")
    assert conv1.flops == 2 * 2 * 8 * 8 * 8 * 3 * 3 * 3          # 2 * N*Co*Ho*Wo * Ci*Kh*Kw
    assert conv2.flops == 2 * 2 * 8 * 8 * 8 * 8 * 3 * 3
    assert conv1.attrs["strides"] == [1, 1] and conv1.attrs["padding"] == [1, 1, 1, 1]
    assert conv1.attrs["data_layout"] == "NCHW" and conv1.attrs["groups"] == 1
    assert conv1.param_bytes == 8 * 3 * 3 * 3 * 4                   # the weight is a constant
    assert conv1.bytes_read == 2 * 3 * 8 * 8 * 4 + conv1.param_bytes
    assert conv1.bytes_written == 2 * 8 * 8 * 8 * 4
    assert conv1.graph_inputs == ("x",) and conv1.inputs == ()


def test_matmul_and_pool_flops(graph):
    (mm,) = by_op(graph, "relax.matmul")
    assert mm.flops == 2 * 2 * 10 * 128                             # [2,128] x [128,10]
    (pool,) = by_op(graph, "relax.nn.max_pool2d")
    assert pool.flops == 2 * 8 * 4 * 4 * 4                          # one per window element
    assert op_flops("relax.reshape", [(2, 4)], [(8,)], {}) == 0


def test_tuple_output_edges_carry_item_bytes(graph):
    (split,) = by_op(graph, "relax.split")
    assert len(split.output_shapes) == 2 and split.output_shapes[0] == (2, 5)
    (sig,) = by_op(graph, "relax.sigmoid")
    edge = next(e for e in graph.edges if e.dst == sig.id)
    assert edge.src == split.id and edge.size_bytes == 2 * 5 * 4   # one item, not the whole tuple


def test_graph_inputs_and_outputs(graph):
    assert [t.name for t in graph.inputs] == ["x"] and graph.inputs[0].shape == (2, 3, 8, 8)
    assert graph.inputs[0].consumers == (0,)
    assert len(graph.outputs) == 2
    (split,) = by_op(graph, "relax.split")
    (sig,) = by_op(graph, "relax.sigmoid")
    assert {t.producer for t in graph.outputs} == {split.id, sig.id}


def test_dependency_matrix_sparse_and_dense_agree(graph):
    sparse = graph.dependency_matrix()
    dense = graph.dependency_matrix_dense()
    assert sparse.shape == (graph.num_ops, graph.num_ops)
    np.testing.assert_array_equal(sparse.toarray(), dense)
    assert dense.sum() == len(graph.edges)
    for e in graph.edges:
        assert dense[e.src, e.dst] == 1
    assert np.all(np.tril(dense) == 0)                               # topological ids: upper triangular


def test_kernel_groups_match_tvm_fuseops(imported, graph):
    import tvm
    from tvm import relax

    fused = relax.transform.FuseOps()(relax.transform.AnnotateTIROpPattern()(
        relax.transform.LegalizeOps()(imported.mod)))
    call_tir = tvm.ir.Op.get("relax.call_tir")
    tvm_sizes = sorted(
        sum(1 for blk in f.body.blocks for b in blk.bindings
            if isinstance(b.value, relax.Call) and b.value.op.same_as(call_tir))
        for f in fused.functions.values() if isinstance(f, relax.Function) and f.attrs and "Primitive" in f.attrs)
    ours = sorted(len(g.op_ids) for g in graph.kernel_groups if g.name.startswith("fused_"))
    assert ours == tvm_sizes and max(ours) >= 3
    covered = sorted(i for g in graph.kernel_groups for i in g.op_ids)
    assert covered == list(range(graph.num_ops))                     # every op in exactly one kernel
    conv1 = by_op(graph, "relax.nn.conv2d")[0]
    group = graph.kernel_groups[conv1.kernel_group]
    assert group.name.startswith("fused_conv2d") and len(group.op_ids) >= 2   # conv + bias add (+ ...)


def test_kernel_graph_collapses_groups(graph):
    kernels = graph.kernel_graph().validate()
    assert kernels.level == "kernel" and kernels.num_ops == len(graph.kernel_groups)
    assert kernels.total_flops == graph.total_flops
    assert kernels.total_param_bytes == graph.total_param_bytes
    assert sorted(i for n in kernels.nodes for i in n.tags["op_ids"]) == list(range(graph.num_ops))


def test_analysis_pass_form_leaves_ir_alone(imported, graph):
    import tvm_ffi

    out = ExtractOpFeatures()(imported.mod)
    assert int(out["main"].attrs["hetpart.num_ops"]) == graph.num_ops
    assert int(out["main"].attrs["hetpart.total_flops"]) == graph.total_flops
    assert tvm_ffi.structural_equal(out["main"].body, imported.mod["main"].body)


def test_json_round_trip_of_extracted_graph(graph, tmp_path):
    from hetpart.graph import OpGraph

    graph.save(tmp_path / "g.json")
    assert OpGraph.load(tmp_path / "g.json") == graph


def test_call_tir_counts_only_its_constant_operands_as_parameters():
    """ONNX Clip/ReLU6 import as call_tir(maximum, (activation, constant)): the activation is not a parameter
    (an even split of the tuple's bytes once counted half of it, 2 MB per ReLU6 at 224 px in MobileNetV2)."""
    from tvm import relax, topi

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 8, 4, 4], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(np.ones((8, 8, 1, 1), "float32"))))
            z = bb.emit_output(bb.emit_te(topi.maximum, y, relax.const(0.0, "float32")))
        bb.emit_func_output(z)
    conv, clip = extract_op_graph(bb.get(), name="relu").nodes
    assert clip.op == "relax.call_tir" and clip.input_shapes == ((1, 8, 4, 4), ())
    assert clip.param_bytes == 4 and clip.inputs == (conv.id,)
    assert conv.param_bytes == 8 * 8 * 4


def test_slicing_ops_count_the_bytes_they_read():
    """An unrolled RNN step takes one row of the projection of all steps: it reads that row, not the projection
    (counted whole, a 4 KB read of the speaker LSTM was featured as 640 KB). The same for strided_slice."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([16, 32], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            proj = bb.emit(relax.op.matmul(x, relax.const(np.ones((32, 64), "float32"))))
            row = bb.emit(relax.op.take(proj, relax.const(3, "int64"), axis=0))
            window = bb.emit(relax.op.strided_slice(proj, axes=[1], begin=[0], end=[16]))
            whole = bb.emit_output(relax.op.add(relax.op.sum(window), relax.op.sum(row)))
        bb.emit_func_output(whole)
    graph = extract_op_graph(bb.get(), name="slices")
    (take,) = by_op(graph, "relax.take")
    (window,) = by_op(graph, "relax.strided_slice")
    assert take.bytes_written == 64 * 4 and take.bytes_read == 64 * 4 + 8      # the row + the int64 index
    assert window.bytes_written == 16 * 16 * 4 and window.bytes_read == window.bytes_written
    (matmul,) = by_op(graph, "relax.matmul")
    assert matmul.bytes_read == (16 * 32 + 32 * 64) * 4                           # other ops: every operand
    kernels = graph.kernel_graph()
    take_kernel = next(n for n in kernels.nodes if "take" in n.op)
    assert take_kernel.bytes_read == take.bytes_read
    assert kernels.edges and max(e.size_bytes for e in kernels.edges) == 16 * 64 * 4   # copies move it whole



def test_extraction_and_weight_prepacking_do_not_keep_the_weights_alive():
    """Both used to make a TVM mutator class per call; TVM keeps such classes alive, and with them what their
    methods closed over: the legalized module (extraction) or the rewritten convs (prepacking), weights included.
    A three-pass profile grew to 24 GB that way. A leak of either kind keeps >= 4 x 32 MB here (285 / 151 MB)."""
    from tests.memory import big_weight_module, growth_mb
    from tvm_passes.schedules.layout import prepack_conv_weights

    def step() -> None:
        mod = big_weight_module()
        extract_op_graph(mod, name="leak")
        prepack_conv_weights(16)(mod)

    kept_mb = growth_mb(step)
    assert kept_mb < 100, f"four extractions + prepackings of a 70 MB module kept {kept_mb:.0f} MB"
