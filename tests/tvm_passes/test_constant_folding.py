"""fold_constants gives TVM's FoldConstant's module and hands TVM only the calls with no runtime argument."""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.tvm

tvm = pytest.importorskip("tvm")
tvm_ffi = pytest.importorskip("tvm_ffi")
from tvm import relax  # noqa: E402

from tvm_passes import constant_folding  # noqa: E402
from tvm_passes.constant_folding import fold_constants  # noqa: E402


def _module(steps: int = 3) -> tvm.IRModule:
    """Constant chains of every kind the importer leaves (layout ops, shape_of/shape_to_tensor/take, split of a
    weight, arithmetic on weights) feeding runtime work on ``x``."""
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 8), "float32"))
    w = relax.const(rng.standard_normal((24, 8)).astype("float32"))
    bias = relax.const(rng.standard_normal((3, 8)).astype("float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            wt = bb.emit(relax.op.permute_dims(w))                                   # layout op on a weight
            gates = bb.emit(relax.op.split(wt, 3, axis=1))                           # tuple of constants
            b = bb.emit(relax.op.reshape(relax.op.sum(bias, axis=[0]), (1, 8)))      # arithmetic then layout
            rows = bb.emit(relax.op.take(relax.op.shape_to_tensor(relax.op.shape_of(x)),
                                         relax.const(0, "int64"), axis=0))           # shape chain on an input
            h = x
            for step in range(steps):
                h = bb.emit(relax.op.tanh(relax.op.add(relax.op.matmul(h, relax.TupleGetItem(gates, step % 3)), b)))
            out = bb.emit_output(relax.Tuple([h, rows]))
        bb.emit_func_output(out)
    return bb.get()


def test_same_module_as_tvms_fold_constant():
    mod = _module()
    expected = relax.transform.FoldConstant()(mod)
    got = fold_constants(mod)
    assert tvm_ffi.structural_equal(relax.transform.Normalize()(got), relax.transform.Normalize()(expected))
    text = got.script()
    for folded in ("permute_dims", "R.split", "R.sum", "shape_of", "shape_to_tensor"):
        assert folded not in text


def test_numerics_unchanged():
    mod = _module()
    x = np.random.default_rng(1).standard_normal((2, 8)).astype("float32")
    results = []
    for m in (mod, fold_constants(mod)):
        vm = relax.VirtualMachine(tvm.compile(m, target="llvm"), tvm.cpu())
        results.append([np.asarray(t.numpy()) for t in vm["main"](tvm.runtime.tensor(x))])
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


def test_only_calls_without_runtime_arguments_reach_tvm(monkeypatch):
    handed: list[str] = []
    original = constant_folding._tvm_fold

    def spy(call):
        handed.append(call.op.name)
        return original(call)

    monkeypatch.setattr(constant_folding, "_tvm_fold", spy)
    fold_constants(_module(steps=50))          # 150 runtime calls, a fixed number of constant ones
    assert sorted(handed) == ["relax.shape_to_tensor", "relax.split", "relax.sum", "relax.take"]
