"""Matmuls between two activations with ragged columns (attention scores over 65 tokens) are padded at import:
which, numerics against onnxruntime, and that the pad and the slice fuse into their neighbours."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.onnx_builders import OPSET, save

HEADS, HEAD_DIM = 4, 32


def _attention(path, tokens, constant_keys=False):
    """Scores Q @ K^T over ``tokens`` tokens, softmax, then @ V; Q, K and V are inputs (K a constant if asked)."""
    shape = [1, HEADS, tokens, HEAD_DIM]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("q", "v")]
    inits = []
    if constant_keys:
        inits.append(numpy_helper.from_array(np.random.default_rng(2).standard_normal(shape).astype(np.float32), "k"))
    else:
        inputs.append(helper.make_tensor_value_info("k", TensorProto.FLOAT, shape))
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["scores"]),
             helper.make_node("Softmax", ["scores"], ["weights"], axis=-1),
             helper.make_node("MatMul", ["weights", "v"], ["out"])]
    graph = helper.make_graph(nodes, "attention", inputs, [helper.make_tensor_value_info("out", TensorProto.FLOAT,
                                                                                         None)], inits)
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), path)


def _feeds(path, tokens):
    rng = np.random.default_rng(1)
    names = [i.name for i in ort.InferenceSession(str(path)).get_inputs()]
    return {n: rng.standard_normal((1, HEADS, tokens, HEAD_DIM)).astype(np.float32) for n in names}


def _matmul_widths(mod):
    from tvm_passes.bindings import op_bindings

    return [int(b.value.args[1].ty.shape[-1]) for b in op_bindings(mod["main"]) if b.value.op.name == "relax.matmul"]


def _run(mod, feeds):
    import tvm
    from tvm import relax

    from tvm_passes.schedules import cpu_pipeline, default_cpu_target

    target = default_cpu_target()
    vm = relax.VirtualMachine(tvm.compile(mod, target=target, relax_pipeline=cpu_pipeline(target)), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(feeds[p.name]) for p in mod["main"].params]).numpy()


@pytest.mark.parametrize("tokens, constant_keys, widths, noted", [
    (65, False, [80, 32], True),       # a ViT's 64 patches and a class token: padded to 80
    (197, False, [208, 32], True),     # ViT-B/16 at 224 x 224
    (64, False, [64, 32], False),      # whole vectors already
    (20, False, [20, 32], False),      # two vectors or fewer: one whole-extent tile
    (65, True, [65, 32], False),       # a constant right operand is not this pass's (pad_columns pads 2-D ones)
])
def test_padding_choice_and_numerics(tmp_path, tokens, constant_keys, widths, noted):
    from tvm_passes.frontend import import_model

    path = _attention(tmp_path / "a.onnx", tokens, constant_keys)
    imported = import_model(path)
    assert _matmul_widths(imported.mod) == widths
    assert any("between activations" in note for note in imported.notes) == noted
    feeds = _feeds(path, tokens)
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = _run(imported.mod, feeds)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_weights_kept_as_parameters_are_not_padded(tmp_path):
    """A right operand that is a parameter (weights kept as inputs) would be padded at every call: left alone."""
    from tvm_passes.frontend import import_model

    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "params",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [9, 512]),
                               helper.make_tensor_value_info("w", TensorProto.FLOAT, [512, 37])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    path = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), tmp_path / "p.onnx")
    imported = import_model(path)
    assert _matmul_widths(imported.mod) == [37] and imported.notes == ()


def test_pad_and_slice_fuse_into_their_neighbours(tmp_path):
    """The padded graph runs as many kernels as the unpadded one: the pad joins the transpose of K, the slice
    joins the softmax."""
    import tvm
    from tvm import relax

    from tvm_passes.frontend import import_model
    from tvm_passes.fusion import fusion_passes
    from tvm_passes.legalize import legalize_ops

    def kernels(mod):
        fused = tvm.transform.Sequential([legalize_ops(), *fusion_passes(), relax.transform.FuseTIR()])(mod)
        return sum(isinstance(f, tvm.tirx.PrimFunc) for _, f in fused.functions_items())

    path = _attention(tmp_path / "a.onnx", 65)
    assert kernels(import_model(path).mod) == kernels(import_model(path, pad_columns=False).mod)
