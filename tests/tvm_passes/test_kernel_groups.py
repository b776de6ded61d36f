"""tvm_passes.kernel_groups: fused kernels mapped back to ops by dataflow agree with the exact private-PrimFunc way."""
from __future__ import annotations

import onnx
import pytest

from tests import onnx_builders
from tvm_passes import kernel_groups
from tvm_passes.extract import extract_op_graph
from tvm_passes.frontend import import_model

from .rnn_models import build_rnn_model

pytestmark = pytest.mark.tvm


def _ops(mod):
    return list(extract_op_graph(mod, with_kernels=False).nodes)


def _both_ways(mod, monkeypatch):
    """The grouping by dataflow (failing the test if it fell back) and the one through private PrimFuncs."""
    ops = _ops(mod)
    exact = kernel_groups.fused_kernel_groups(mod, ops, by_dataflow=False)
    with monkeypatch.context() as patch:
        def no_fallback(*_args, **_kwargs):
            raise AssertionError("the mapping by dataflow fell back to private PrimFuncs")
        patch.setattr(kernel_groups, "_groups_by_private_kernels", no_fallback)
        fast = kernel_groups.fused_kernel_groups(mod, ops)
    return ops, fast, exact


def _two_branch_cnn(path):
    """Two convs with same-shaped weights reading one input (Inception-like branches), a split, a concat."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype("float32"), f"w{k}")
               for k in range(2)]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["x", "w1"], ["b"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["ar"]), helper.make_node("Relu", ["b"], ["br"]),
             helper.make_node("Concat", ["ar", "br"], ["c"], axis=1),
             helper.make_node("Split", ["c"], ["s0", "s1"], axis=1, num_outputs=2),
             helper.make_node("Add", ["s0", "s1"], ["y"])]
    graph = helper.make_graph(nodes, "branches", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], weights)
    return onnx_builders.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)


@pytest.mark.parametrize("case", ["small_cnn", "branches", "gru", "lstm_stacked"])
def test_dataflow_mapping_equals_private_kernels(case, tmp_path, monkeypatch):
    if case == "small_cnn":
        path, shapes = onnx_builders.small_cnn(tmp_path / "cnn.onnx"), {"x": (2, 3, 8, 8)}
    elif case == "branches":
        path, shapes = _two_branch_cnn(tmp_path / "branches.onnx"), None
    else:
        op_type, layers = ("GRU", 1) if case == "gru" else ("LSTM", 2)
        model, _ = build_rnn_model(op_type, seq=5, num_layers=layers)
        path, shapes = tmp_path / f"{case}.onnx", None
        onnx.save(model, path)
    mod = import_model(path, input_shapes=shapes).mod
    ops, fast, exact = _both_ways(mod, monkeypatch)
    assert fast == exact
    assert sorted(i for g in fast for i in g.op_ids) == [n.id for n in ops]        # every op in one kernel
    assert any(len(g.op_ids) >= 2 for g in fast)                                     # something was fused


def test_two_ops_computing_the_same_fall_back_to_private_kernels():
    import tvm
    from tvm.script import relax as R

    @tvm.script.ir_module
    class Twice:
        @R.function
        def main(x: R.Tensor((4, 8), "float32")):
            with R.dataflow():
                first = R.nn.relu(x)
                second = R.nn.relu(x)                  # the same computation: no description tells them apart
                total = R.add(first, second)
                R.output(total)
            return total

    from tvm_passes.fusion import fusion_passes
    from tvm_passes.legalize import legalize_ops

    ops = _ops(Twice)
    legal = legalize_ops()(Twice)
    assert kernel_groups._groups_by_dataflow(legal, tvm.transform.Sequential(fusion_passes())(legal), ops) is None
    groups = kernel_groups.fused_kernel_groups(Twice, ops)
    assert groups == kernel_groups.fused_kernel_groups(Twice, ops, by_dataflow=False)
    assert sorted(i for g in groups for i in g.op_ids) == [0, 1, 2]
