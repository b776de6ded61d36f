"""``RotaryEmbedding``: the ONNX op of opset 23 and onnxruntime's com.microsoft op of the same name (its optimizer's
and model builders' form for rotary position embeddings), neither of which TVM 0.27's importer converts.

The two differ in their inputs' order -- ONNX ``(input, cos_cache, sin_cache[, position_ids])``, com.microsoft
``(input, position_ids, cos_cache, sin_cache)`` -- which tells them apart here (TVM keys converters by op type only):
the second input is an integer position tensor only in the contrib form. Both rotate the first
``rotary_embedding_dim`` channels of each head (all by default) by the cached angles of each token's position, in
halves or ``interleaved`` pairs, as the ONNX reference computes it: input ``[batch, seq, heads * head_size]`` (with
``num_heads``) or ``[batch, heads, seq, head_size]``; positions from ``position_ids`` ``[batch, seq]`` (the contrib
op also takes one offset ``[1]`` for positions offset .. offset + seq - 1), or, for the ONNX op without them, caches
already ``[batch, seq, rotary_dim / 2]``. The contrib op's ``is_packed_batching`` and a ``scale`` other than 1 are
refused naming the node. Tested against onnxruntime in ``tests/tvm_passes/test_onnx_rotary.py``."""
from __future__ import annotations

import numpy as np
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _onnx_frontend

from hetpart.errors import UnsupportedOpError
from tvm_passes.onnx_nodes import node_label, static_dims

__all__ = ["RotaryEmbedding", "rotate"]


class RotaryEmbedding(_onnx_frontend.OnnxOpConverter):
    """ONNX RotaryEmbedding (opset 23) or com.microsoft RotaryEmbedding, by the type of the second input."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        where = node_label("RotaryEmbedding", attr)
        second = inputs[1]
        contrib = second is not None and "int" in str(second.ty.dtype)
        if contrib:
            if int(attr.get("is_packed_batching", 0)) or float(attr.get("scale", 1.0)) != 1.0:
                raise UnsupportedOpError(f"{where}: is_packed_batching and a scale other than 1 are not supported; "
                                         "found them set. Export the model without them")
            x, positions, cos, sin = inputs[0], inputs[1], inputs[2], inputs[3]
        else:
            x, cos, sin, positions = inputs[0], inputs[1], inputs[2], inputs[3]
        return rotate(bb, x, cos, sin, positions, attr, where)


def rotate(bb: relax.BlockBuilder, x: relax.Expr, cos: relax.Expr, sin: relax.Expr, positions: relax.Expr | None,
           attr: dict, where: str) -> relax.Expr:
    """``x`` rotated by the angles of ``positions`` (attributes ``num_heads`` for a 3-D ``x``,
    ``rotary_embedding_dim``, ``interleaved``); also the rotary step of :mod:`tvm_passes.onnx_group_query`."""
    rank = x.ty.ndim
    dims = static_dims(x)
    if rank == 4:                                             # [batch, heads, seq, size] -> [batch, seq, heads, size]
        tokens = bb.emit(relax.op.permute_dims(x, [0, 2, 1, 3]))
    elif rank == 3:
        heads = int(attr.get("num_heads", 0))
        if heads <= 0 or dims[2] % heads:
            raise UnsupportedOpError(f"{where}: a 3-D input needs num_heads dividing its hidden size {dims[2]}; "
                                     f"found num_heads={heads}")
        tokens = bb.emit(relax.op.reshape(x, [dims[0], dims[1], heads, dims[2] // heads]))
    else:
        raise UnsupportedOpError(f"{where}: the input must be 3-D or 4-D; found rank {rank}")
    batch, length, heads, size = static_dims(tokens)
    rotated = int(attr.get("rotary_embedding_dim", 0)) or size
    half = rotated // 2
    if positions is not None:
        if static_dims(positions) == [1]:                           # contrib: one offset, positions offset .. + seq - 1
            steps = relax.const(np.arange(length, dtype=np.int64).reshape(1, length), "int64")
            positions = bb.emit(relax.op.add(bb.emit(relax.op.astype(positions, "int64")), steps))
        cos = bb.emit(relax.op.take(cos, positions, axis=0))   # [batch or 1, seq, half]
        sin = bb.emit(relax.op.take(sin, positions, axis=0))
    if static_dims(cos)[-1] != half:
        raise UnsupportedOpError(f"{where}: the caches' last axis must be rotary_embedding_dim / 2 = {half}; found "
                                 f"{static_dims(cos)[-1]}")
    cos = bb.emit(relax.op.expand_dims(cos, 2))              # [batch, seq, 1, half]
    sin = bb.emit(relax.op.expand_dims(sin, 2))
    interleaved = int(attr.get("interleaved", 0))
    if interleaved:
        first = bb.emit(relax.op.strided_slice(tokens, axes=[3], begin=[0], end=[rotated], strides=[2]))
        second = bb.emit(relax.op.strided_slice(tokens, axes=[3], begin=[1], end=[rotated], strides=[2]))
    else:
        first = bb.emit(relax.op.strided_slice(tokens, axes=[3], begin=[0], end=[half]))
        second = bb.emit(relax.op.strided_slice(tokens, axes=[3], begin=[half], end=[rotated]))
    real = bb.emit(relax.op.subtract(bb.emit(relax.op.multiply(cos, first)), bb.emit(relax.op.multiply(sin, second))))
    imag = bb.emit(relax.op.add(bb.emit(relax.op.multiply(sin, first)), bb.emit(relax.op.multiply(cos, second))))
    if interleaved:
        pairs = bb.emit(relax.op.stack([real, imag], axis=4))
        turned = bb.emit(relax.op.reshape(pairs, [batch, length, heads, rotated]))
    else:
        turned = bb.emit(relax.op.concat([real, imag], axis=3))
    if rotated < size:
        rest = bb.emit(relax.op.strided_slice(tokens, axes=[3], begin=[rotated], end=[size]))
        turned = bb.emit(relax.op.concat([turned, rest], axis=3))
    if rank == 4:
        return bb.emit(relax.op.permute_dims(turned, [0, 2, 1, 3]))
    return bb.emit(relax.op.reshape(turned, dims))
