"""Memoized legalization gives the module TVM's legalization gives, and reuses only pass-through results."""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.tvm

tvm = pytest.importorskip("tvm")
from tvm import relax  # noqa: E402

from tvm_passes.legalize import LEGALIZE_OVERRIDES, legalize_ops  # noqa: E402
from tvm_passes.legalize_cache import _Cache, memoized  # noqa: E402


def _repeated_cell_module(steps: int) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 32), "float32"))
    w = relax.const(np.random.default_rng(0).standard_normal((32, 32)).astype("float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for _ in range(steps):
                h = bb.emit(relax.op.tanh(relax.op.add(relax.op.matmul(h, w), h)))
            out = bb.emit_output(relax.op.reshape(h, (32,)))
        bb.emit_func_output(out)
    return bb.get()


def test_memoized_legalization_is_structurally_tvms():
    mod = _repeated_cell_module(20)
    plain = relax.transform.LegalizeOps(customize_legalize_map=dict(LEGALIZE_OVERRIDES))(mod)
    assert tvm.ir.structural_equal(legalize_ops()(mod), plain) if hasattr(tvm.ir, "structural_equal") else \
        __import__("tvm_ffi").structural_equal(legalize_ops()(mod), plain)


def test_each_distinct_call_is_legalized_once_and_results_that_read_values_are_not_reused():
    calls: list[str] = []
    default_add = tvm.ir.Op.get("relax.add").get_attr("FLegalize")

    def counting_add(bb, call):
        calls.append(call.op.name)
        return default_add(bb, call)

    cache = _Cache()
    mod = _repeated_cell_module(10)
    table = {"relax.add": memoized(counting_add, cache)}
    relax.transform.LegalizeOps(customize_legalize_map=table)(mod)
    assert len(calls) == 1                         # ten identical adds, legalized once
    relax.transform.LegalizeOps(customize_legalize_map=table)(mod)
    assert len(calls) == 2                         # a new module (a new builder) starts a new cache

    def baking_add(bb, call):                      # reads its second argument's value into the kernel
        calls.append("baked")
        return bb.call_te(lambda a: a + 1.0, call.args[0])

    calls.clear()
    relax.transform.LegalizeOps(customize_legalize_map={"relax.add": memoized(baking_add, _Cache())})(mod)
    assert len(calls) == 10                        # not a pass-through of every tensor argument: never reused
