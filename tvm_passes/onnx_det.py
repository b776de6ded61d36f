"""ONNX ``Det`` (determinants of a batch of square matrices; geometry heads, normalizing flows), which TVM 0.27's
importer lacks and Relax has no operator for.

The matrices' size is static here, so the determinant is Gaussian elimination with partial pivoting unrolled over
the columns, as onnxruntime's LU factorization computes it: at column k the row with the largest magnitude at or
below the diagonal is swapped to row k (a gather of rows; the sign flips when it moves), the pivot multiplies the
determinant, and the rows below lose their multiple of row k. A zero pivot (a singular matrix) makes the
determinant 0 and is replaced by 1 for the elimination, so no NaN appears. A float16 input is computed in float32.
Matrices above :data:`MAX_DET_SIZE` are refused: the unrolled elimination grows with the size. Registered by
:func:`tvm_passes.onnx_converters.install_onnx_converters`; tested against onnxruntime in
``tests/tvm_passes/test_onnx_op_forms.py``."""
from __future__ import annotations

import numpy as np
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _onnx_frontend

from hetpart.errors import UnsupportedOpError
from tvm_passes.onnx_nodes import node_label

__all__ = ["Det", "MAX_DET_SIZE"]

MAX_DET_SIZE = 64          # columns eliminated one by one: ~15 small ops each


class Det(_onnx_frontend.OnnxOpConverter):
    """ONNX Det: the determinant of each [M, M] matrix in the last two axes."""

    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        where = node_label("Det", attr)
        x = inputs[0]
        try:
            dims = [int(d) for d in x.ty.shape.values]
        except (TypeError, ValueError, AttributeError):
            dims = []
        if len(dims) < 2 or dims[-1] != dims[-2] or not 1 <= dims[-1] <= MAX_DET_SIZE:
            raise UnsupportedOpError(f"{where}: the input must be a static [..., M, M] batch of square matrices with "
                                     f"1 <= M <= {MAX_DET_SIZE}; found shape {dims or 'unknown'}. Give the input "
                                     "shapes (--input-shape) or compute larger determinants outside the model")
        dtype = str(x.ty.dtype)
        if dtype == "float16":
            x = bb.emit(relax.op.astype(x, "float32"))
        work = "float32" if dtype == "float16" else dtype
        size, batch_dims = dims[-1], dims[:-2]
        batch = int(np.prod(batch_dims, dtype=np.int64))
        matrix = bb.emit(relax.op.reshape(x, [batch, size, size]))
        det = _eliminate(bb, matrix, batch, size, work)
        det = bb.emit(relax.op.reshape(det, batch_dims))
        return bb.emit(relax.op.astype(det, dtype)) if work != dtype else det


def _eliminate(bb: relax.BlockBuilder, matrix: relax.Expr, batch: int, size: int, dtype: str) -> relax.Expr:
    """The determinants [batch] of ``matrix`` [batch, size, size] by elimination with partial pivoting."""
    rows = relax.const(np.arange(size, dtype=np.int64).reshape(1, size), "int64")   # (int32 without the dtype)
    one, zero = relax.const(1.0, dtype), relax.const(0.0, dtype)
    det = None
    for k in range(size):
        if k < size - 1:
            column = bb.emit(relax.op.strided_slice(matrix, axes=[1, 2], begin=[k, k], end=[size, k + 1]))
            offset = bb.emit(relax.op.astype(bb.emit(relax.op.argmax(bb.emit(relax.op.abs(column)), axis=1)),
                                             "int64"))                                         # [batch, 1]
            pivot_row = bb.emit(relax.op.add(offset, relax.const(k, "int64")))
            kk = relax.const(k, "int64")
            order = bb.emit(relax.op.where(relax.op.equal(rows, kk), pivot_row,
                                           relax.op.where(relax.op.equal(rows, pivot_row), kk, rows)))
            index = bb.emit(relax.op.broadcast_to(relax.op.reshape(order, [batch, size, 1]), [batch, size, size]))
            matrix = bb.emit(relax.op.gather_elements(matrix, index, axis=1))
            flip = bb.emit(relax.op.where(relax.op.equal(offset, relax.const(0, "int64")), one,
                                          relax.const(-1.0, dtype)))                           # [batch, 1]
        pivot = bb.emit(relax.op.strided_slice(matrix, axes=[1, 2], begin=[k, k], end=[k + 1, k + 1]))
        step = bb.emit(relax.op.reshape(pivot, [batch, 1]))
        if k < size - 1:
            step = bb.emit(relax.op.multiply(step, flip))
        det = step if det is None else bb.emit(relax.op.multiply(det, step))
        if k == size - 1:
            break
        safe = bb.emit(relax.op.where(relax.op.equal(pivot, zero), one, pivot))              # [batch, 1, 1]
        below = relax.const((np.arange(size) > k).astype(dtype).reshape(1, size, 1))
        factors = bb.emit(relax.op.multiply(bb.emit(relax.op.divide(
            bb.emit(relax.op.strided_slice(matrix, axes=[2], begin=[k], end=[k + 1])), safe)), below))
        pivot_rows = bb.emit(relax.op.strided_slice(matrix, axes=[1], begin=[k], end=[k + 1]))  # [batch, 1, size]
        matrix = bb.emit(relax.op.subtract(matrix, bb.emit(relax.op.multiply(factors, pivot_rows))))
    return bb.emit(relax.op.reshape(det, [batch]))
