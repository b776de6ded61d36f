"""onnxruntime's com.microsoft ``MultiHeadAttention``, which its transformer optimizer writes for CLIP, ViT, T5/BART
and diffusion models (Q, K and V projected apart), and which TVM 0.27's importer lacks.

Converted as onnxruntime's CPU kernel computes it: query ``[batch, seq, hidden]``; key and value
``[batch, kv_seq, hidden]`` or already split into heads ``[batch, heads, kv_seq, head_size]``; the optional ``bias``
of the three projections added first; ``scale`` (default 1/sqrt(head_size)); ``key_padding_mask`` as key lengths
``[batch]`` (right padding) or a 0/1 mask ``[batch, kv_seq]`` (0 masks; masked scores get ``mask_filter_value``);
``attention_bias`` added to the scores; ``unidirectional`` (causal, shifted by a past cache); a past key/value cache
concatenated before the new keys (``present_key``/``present_value``). Packed QKV or KV inputs (rank 5) and the other
mask layouts are refused naming the form. Registered by :func:`tvm_passes.onnx_converters.install_onnx_converters`;
tested against onnxruntime in ``tests/tvm_passes/test_onnx_multihead.py``."""
from __future__ import annotations

import math

import numpy as np
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _onnx_frontend

from hetpart.errors import UnsupportedOpError
from tvm_passes.onnx_attention import attend, heads_first
from tvm_passes.onnx_nodes import node_label, static_dims

__all__ = ["MultiHeadAttention"]


class MultiHeadAttention(_onnx_frontend.OnnxOpConverter):
    """com.microsoft MultiHeadAttention (unpacked query, key and value)."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        where = node_label("MultiHeadAttention", attr)
        query, key, value, bias, padding, attention_bias, past_key, past_value = (inputs[k] for k in range(8))
        if key is None or value is None or query.ty.ndim != 3 or key.ty.ndim not in (3, 4):
            raise UnsupportedOpError(f"{where}: query must be [batch, seq, hidden] with separate key and value "
                                     "([batch, kv_seq, hidden] or [batch, heads, kv_seq, head_size]); found packed "
                                     "QKV or KV. Run onnxruntime's optimizer without packing them")
        if (past_key is None) != (past_value is None):
            raise UnsupportedOpError(f"{where}: past_key and past_value must be given together; found one of them")
        heads = int(attr["num_heads"])
        dtype = str(query.ty.dtype)
        hidden = static_dims(query)[2]
        if bias is not None:
            widths = [hidden, static_dims(key)[-1] * (heads if key.ty.ndim == 4 else 1), static_dims(value)[-1]]
            splits = [widths[0], widths[0] + widths[1]]
            parts = bb.emit(relax.op.split(bias, splits, axis=0))
            query = bb.emit(relax.op.add(query, bb.emit(relax.TupleGetItem(parts, 0))))
            if key.ty.ndim == 3:
                key = bb.emit(relax.op.add(key, bb.emit(relax.TupleGetItem(parts, 1))))
                value = bb.emit(relax.op.add(value, bb.emit(relax.TupleGetItem(parts, 2))))
        q = heads_first(bb, query, heads)
        k = heads_first(bb, key, heads) if key.ty.ndim == 3 else key
        v = heads_first(bb, value, heads) if value.ty.ndim == 3 else value
        past_length = 0
        if past_key is not None:
            past_length = static_dims(past_key)[2]
            k = bb.emit(relax.op.concat([past_key, k], axis=2))
            v = bb.emit(relax.op.concat([past_value, v], axis=2))
        batch, _, q_length, head_size = static_dims(q)
        kv_length = static_dims(k)[2]
        filler = float(attr.get("mask_filter_value", -10000.0))
        score_bias = _padding_bias(bb, padding, batch, kv_length, filler, dtype, where)
        if attention_bias is not None:
            score_bias = attention_bias if score_bias is None else bb.emit(relax.op.add(score_bias, attention_bias))
        if int(attr.get("unidirectional", 0)):
            allowed = np.arange(kv_length)[None, :] <= np.arange(q_length)[:, None] + past_length
            frontier = relax.const(np.where(allowed, 0.0, filler).astype(dtype), dtype)
            score_bias = frontier if score_bias is None else bb.emit(relax.op.add(score_bias, frontier))
        scale = attr.get("scale")
        scale = 1.0 / math.sqrt(head_size) if scale is None or float(scale) == 0.0 else float(scale)
        y = attend(bb, q, k, v, scale, score_bias, guard_empty_rows=False).y
        y = bb.emit(relax.op.reshape(bb.emit(relax.op.permute_dims(y, [0, 2, 1, 3])),
                                     [batch, q_length, heads * static_dims(v)[3]]))
        count = int(attr.get("tvm_custom", {}).get("num_outputs", 1))
        return y if count == 1 else relax.Tuple([y, k, v][:count])


def _padding_bias(bb: relax.BlockBuilder, padding: relax.Expr | None, batch: int, kv_length: int, filler: float,
                  dtype: str, where: str) -> relax.Expr | None:
    """``key_padding_mask`` as an additive bias [batch, 1, 1, kv_length] (0 attends, ``filler`` masks), or None."""
    if padding is None:
        return None
    dims = static_dims(padding)
    if dims == [batch]:                     # key lengths: keys from the length on are padding
        positions = relax.const(np.arange(kv_length, dtype=np.int32).reshape(1, kv_length), "int32")
        lengths = bb.emit(relax.op.reshape(bb.emit(relax.op.astype(padding, "int32")), [batch, 1]))
        keep = bb.emit(relax.op.less(positions, lengths))
    elif dims == [batch, kv_length]:        # 1 attends, 0 masks
        keep = bb.emit(relax.op.not_equal(padding, relax.const(0, str(padding.ty.dtype))))
    else:
        raise UnsupportedOpError(f"{where}: key_padding_mask must be [batch] key lengths or a [batch, kv_seq] "
                                 f"mask; found shape {dims}")
    bias = bb.emit(relax.op.where(keep, relax.const(0.0, dtype), relax.const(filler, dtype)))
    return bb.emit(relax.op.reshape(bias, [batch, 1, 1, kv_length]))
