"""Pad the columns of matmuls between two activations to a whole number of SIMD vectors.

``pad_columns`` pads a constant weight's columns once, at import. An attention score ``Q @ K^T`` has no constant
operand: its columns are the sequence length, which is ragged in most models (a ViT's 64 patches plus a class token,
65). hetpart's matmul rule tiles the columns with one SIMD vector per accumulator and a predicated last tile, which
TVM scalarises; the 4-head ViT's [65, 32] x [32, 65] score matmul ran at 7 GFLOP/s, 40% of the model's time.

This pass rewrites ``matmul(a, b)`` whose right operand is computed in the function (not a constant, and not a
parameter: weights kept as parameters would be copied at every call) and has ``N`` columns (at least 33, not a
multiple of 16) to ``matmul(a, pad(b))`` with ``b`` zero-padded along its last axis to the next multiple of 16,
followed by ``strided_slice`` back to ``N`` columns. The pad is injective and fuses into ``b``'s producer (the
transpose of K), the slice into the consumers (the softmax); results are bit-identical. The ViT of
``benchmarks/model_sweep.py`` went from 1.53x to 0.89x onnxruntime's time (two runs of
``TVM_NUM_THREADS=2 python benchmarks/model_sweep.py``, ``benchmarks/results/model_sweep/``); in one process, padded
against unpadded, 1.95 -> 1.22 ms.
"""
from __future__ import annotations

import functools
import logging
from typing import Any

from tvm_passes.import_rewrites import apply_rewriter
from tvm_passes.pad_columns import COLUMN_MULTIPLE, WIDE_SUFFIX, padded_columns

log = logging.getLogger(__name__)


def _ragged_activation_columns(value: Any, computed: set[Any]) -> tuple[int, int] | None:
    """(N, padded N) of a matmul call whose right operand is a tensor computed in the function (one of
    ``computed``, not a constant or a parameter: weights kept as parameters would be copied at every call) and
    has the ragged columns this pass pads, else None."""
    import tvm
    from tvm import relax

    if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name == "relax.matmul"):
        return None
    right = value.args[1]
    ty = right.ty
    if right not in computed or not isinstance(ty, relax.TensorType) or ty.shape is None \
            or ty.ndim < 2 or "float" not in str(ty.dtype):
        return None
    last = ty.shape.values[-1]
    if not isinstance(last, tvm.tirx.IntImm):
        return None
    n = int(last)
    wide = padded_columns(n, COLUMN_MULTIPLE)
    return None if wide == n else (n, wide)


def _has_ragged_matmul(mod: Any) -> bool:
    from tvm import relax

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            bindings = [b for block in func.body.blocks for b in block.bindings]
            computed = {b.var for b in bindings}
            if any(_ragged_activation_columns(b.value, computed) for b in bindings):
                return True
    return False


def pad_activation_columns(mod: Any) -> tuple[Any, int]:
    """(module with every ragged activation-by-activation matmul padded, number padded)."""
    if not _has_ragged_matmul(mod):     # most models have none: a scan costs half the rewrite's visit
        return mod, 0
    mod, count = apply_rewriter(mod, _padder_class()(mod))
    if count:
        log.info("padded the columns of %d activation matmul(s) to multiples of %d", count, COLUMN_MULTIPLE)
    return mod, count


@functools.lru_cache(maxsize=None)
def _padder_class() -> type:
    """The mutator class, made once (see ``tvm_passes.pad_columns._padder_class``)."""
    from tvm import relax

    @relax.expr_functor.mutator
    class _Padder(relax.PyExprMutator):
        def __init__(self, module: Any) -> None:
            super().__init__(module)
            self.count = 0
            self.computed: set[Any] = set()       # vars bound in the function being rewritten

        def plan(self, func: Any) -> None:
            self.computed = {b.var for block in func.body.blocks for b in block.bindings}

        def forget(self) -> None:
            self.computed = set()

        def visit_var_binding_(self, binding: Any) -> None:
            var, value = binding.var, binding.value
            columns = _ragged_activation_columns(value, self.computed)
            if columns is None:
                super().visit_var_binding_(binding)
                return
            n, wide = columns
            self.count += 1
            right = self.visit_expr(value.args[1])
            pad_width = [0] * (2 * right.ty.ndim)
            pad_width[-1] = wide - n
            padded = self.builder_.emit(relax.op.nn.pad(right, pad_width), name_hint=f"{var.name}_rhs{WIDE_SUFFIX}")
            product = self.builder_.emit(relax.op.matmul(self.visit_expr(value.args[0]), padded,
                                                         out_dtype=value.attrs.out_dtype),
                                         name_hint=f"{var.name}{WIDE_SUFFIX}")
            sliced = relax.op.strided_slice(product, axes=[-1], begin=[0], end=[n])
            self.builder_.emit_normalized(relax.VarBinding(var, self.builder_.normalize(sliced)))

    return _Padder
