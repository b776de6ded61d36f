"""ONNX ``Attention`` of the default domain (opset 23 on: what torch's exporter makes of
``scaled_dot_product_attention`` at opset >= 23), which TVM 0.27's importer confuses with onnxruntime's
com.microsoft ``Attention`` of the same name: it failed on every such node ("too many values to unpack",
"KeyError: 'num_heads'"). :class:`Attention` tells them apart -- the contrib op always carries ``num_heads``, the
standard one never does -- and converts the standard one as the ONNX reference computes it:

- Q, K, V of rank 4 ``[batch, heads, seq, head_size]`` or rank 3 ``[batch, seq, heads * head_size]`` (with
  ``q_num_heads`` and ``kv_num_heads``); grouped-query attention repeats each K/V head for its group of query
  heads; a past key/value cache is concatenated before the new keys and values (``present_key``/``present_value``);
- ``scale`` (default 1/sqrt(head_size)), ``softcap``, ``is_causal`` (query i attends key j <= i + the past length),
  a boolean (True attends) or additive ``attn_mask`` broadcast to the scores and padded to the keys' length, and
  ``softmax_precision``; masked scores hold the lowest finite value (onnxruntime's; the reference's -inf), and a
  row with no key to attend gives zeros;
- the fourth output ``qk_matmul_output`` in each ``qk_matmul_output_mode``.

Refused with a one-line error: ``nonpad_kv_seqlen`` (an external cache) and sliding windows. Shapes are static
here. Tested against onnxruntime in ``tests/tvm_passes/test_onnx_attention.py``."""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from tvm import relax

from hetpart.errors import UnsupportedOpError
from tvm_passes.onnx_contrib import Attention as ContribAttention
from tvm_passes.onnx_nodes import node_label, static_dims

__all__ = ["Attended", "Attention", "attend", "heads_first"]

_ONNX_FLOAT_TYPES = {1: "float32", 10: "float16", 11: "float64", 16: "bfloat16"}
_LOWEST = {name: float(np.finfo(name).min) for name in ("float16", "float32", "float64")}   # bfloat16: float32's


class Attention(ContribAttention):
    """``Attention``: onnxruntime's com.microsoft op (it has ``num_heads``) or the ONNX standard op."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        if "num_heads" in attr:
            return super()._impl_v1(bb, inputs, attr, params)
        return _standard_attention(bb, list(inputs) + [None] * (7 - len(inputs)), attr)


def _standard_attention(bb: relax.BlockBuilder, inputs: list, attr: dict) -> relax.Expr:
    where = node_label("Attention", attr)
    q, k, v, mask, past_key, past_value, nonpad = inputs[:7]
    if nonpad is not None:
        raise UnsupportedOpError(f"{where}: nonpad_kv_seqlen (an external key/value cache) is not supported; "
                                 "export the model without a static cache")
    if any(int(attr.get(side, -1)) != -1 for side in ("left_window_size", "right_window_size")):
        raise UnsupportedOpError(f"{where}: sliding-window attention (left/right_window_size) is not supported; "
                                 "export the model with full attention or compute the window outside the model")
    if (past_key is None) != (past_value is None):
        raise UnsupportedOpError(f"{where}: past_key and past_value must be given together; found one of them")
    rank = q.ty.ndim
    dtype = str(q.ty.dtype)
    if rank == 3:
        if "q_num_heads" not in attr or "kv_num_heads" not in attr:
            raise UnsupportedOpError(f"{where}: 3-D Q, K, V need the q_num_heads and kv_num_heads attributes; "
                                     "found them missing. Fix the node or export 4-D inputs")
        q = heads_first(bb, q, int(attr["q_num_heads"]))
        k = heads_first(bb, k, int(attr["kv_num_heads"]))
        v = heads_first(bb, v, int(attr["kv_num_heads"]))
    elif rank != 4:
        raise UnsupportedOpError(f"{where}: Q, K and V must be 3-D or 4-D; found rank {rank}")
    past_length = 0
    if past_key is not None:
        past_length = static_dims(past_key)[2]
        k = bb.emit(relax.op.concat([past_key, k], axis=2))
        v = bb.emit(relax.op.concat([past_value, v], axis=2))
    present_key, present_value = k, v
    batch, q_heads, q_length, head_size = static_dims(q)
    kv_heads, kv_length = static_dims(k)[1], static_dims(k)[2]
    if q_heads != kv_heads:
        if q_heads % kv_heads:
            raise UnsupportedOpError(f"{where}: the query heads ({q_heads}) must be a multiple of the key/value "
                                     f"heads ({kv_heads})")
        k = bb.emit(relax.op.repeat(k, q_heads // kv_heads, axis=1))       # [h0, h0, h1, h1, ...]
        v = bb.emit(relax.op.repeat(v, q_heads // kv_heads, axis=1))
    scale = attr.get("scale")
    scale = 1.0 / math.sqrt(head_size) if scale is None else float(scale)
    bias = _bias(bb, mask, int(attr.get("is_causal", 0)), q_length, kv_length, past_length, dtype,
                 _LOWEST.get(dtype, _LOWEST["float32"]))
    precision = attr.get("softmax_precision")
    attended = attend(bb, q, k, v, scale, bias, guard_empty_rows=mask is not None,
                      softcap=float(attr.get("softcap", 0.0)),
                      softmax_dtype=_ONNX_FLOAT_TYPES.get(int(precision), dtype) if precision is not None else dtype)
    y = attended.y
    if rank == 3:
        y = bb.emit(relax.op.reshape(bb.emit(relax.op.permute_dims(y, [0, 2, 1, 3])),
                                     [batch, q_length, q_heads * static_dims(v)[3]]))
    outputs = [y, present_key, present_value]
    count = int(attr.get("tvm_custom", {}).get("num_outputs", 1))
    if count > 3:
        mode = int(attr.get("qk_matmul_output_mode", 0))
        outputs.append({2: attended.biased, 3: attended.probs}.get(mode, attended.scores))
    return outputs[0] if count == 1 else relax.Tuple(outputs[:count])


class Attended(NamedTuple):
    """What :func:`attend` computed: the output and the scores at each stage (``qk_matmul_output``'s modes)."""

    y: relax.Expr          # [batch, heads, q_length, v_size]
    scores: relax.Expr     # scaled (and soft-capped) Q K^T
    biased: relax.Expr     # plus the bias
    probs: relax.Expr      # after the softmax


def attend(bb: relax.BlockBuilder, q: relax.Expr, k: relax.Expr, v: relax.Expr, scale: float,
           bias: relax.Expr | None, guard_empty_rows: bool, softcap: float = 0.0,
           softmax_dtype: str | None = None, sink: relax.Expr | None = None) -> Attended:
    """softmax(scale * Q K^T (soft-capped) + bias) V over [batch, heads, seq, size] operands. ``guard_empty_rows``:
    a row whose every score is masked (the lowest finite value or -inf) gives zeros, not NaN. ``sink``
    ([1, heads, 1, 1]): one more logit per head in every row's denominator (smooth softmax, attention sinks)."""
    dtype = str(q.ty.dtype)
    scores = bb.emit(relax.op.matmul(q, bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))))
    scores = bb.emit(relax.op.multiply(scores, relax.const(scale, dtype)))
    if softcap > 0:
        cap = relax.const(softcap, dtype)
        scores = bb.emit(relax.op.multiply(bb.emit(relax.op.tanh(bb.emit(relax.op.divide(scores, cap)))), cap))
    capped = scores
    if bias is not None:
        scores = bb.emit(relax.op.add(scores, bias))
    biased = scores
    soft_dtype = softmax_dtype or dtype
    if soft_dtype != dtype:
        scores = bb.emit(relax.op.astype(scores, soft_dtype))
    if sink is not None:
        sink = sink if str(sink.ty.dtype) == soft_dtype else bb.emit(relax.op.astype(sink, soft_dtype))
        top = bb.emit(relax.op.maximum(bb.emit(relax.op.max(scores, axis=-1, keepdims=True)), sink))
        weights = bb.emit(relax.op.exp(bb.emit(relax.op.subtract(scores, top))))
        denominator = bb.emit(relax.op.add(bb.emit(relax.op.sum(weights, axis=-1, keepdims=True)),
                                           bb.emit(relax.op.exp(bb.emit(relax.op.subtract(sink, top))))))
        probs = bb.emit(relax.op.divide(weights, denominator))
    elif guard_empty_rows:
        # a fully masked row holds the lowest finite value (or -inf) only: its maximum is the lowest
        lowest = relax.const(_LOWEST.get(soft_dtype, _LOWEST["float32"]), soft_dtype)
        dead = bb.emit(relax.op.less_equal(bb.emit(relax.op.max(scores, axis=-1, keepdims=True)), lowest))
        zero = relax.const(0.0, soft_dtype)
        probs = bb.emit(relax.op.nn.softmax(bb.emit(relax.op.where(dead, zero, scores)), axis=-1))
        probs = bb.emit(relax.op.where(dead, zero, probs))
    else:
        probs = bb.emit(relax.op.nn.softmax(scores, axis=-1))
    if soft_dtype != dtype:
        probs = bb.emit(relax.op.astype(probs, dtype))
    return Attended(bb.emit(relax.op.matmul(probs, v)), capped, biased, probs)


def heads_first(bb: relax.BlockBuilder, x: relax.Expr, heads: int) -> relax.Expr:
    """[batch, seq, heads * size] -> [batch, heads, seq, size]."""
    batch, length, hidden = static_dims(x)
    return bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(x, [batch, length, heads, hidden // heads])),
                                         [0, 2, 1, 3]))


def _bias(bb: relax.BlockBuilder, mask: relax.Expr | None, causal: int, q_length: int, kv_length: int,
          past_length: int, dtype: str, masked: float) -> relax.Expr | None:
    """The additive bias of the scores (0 attends, ``masked`` -- the lowest finite value, as onnxruntime fills
    masked scores -- masks), or None: the mask (a boolean one as 0/``masked``, padded to ``kv_length`` with masked
    keys), plus the causal frontier key j <= query i + ``past_length``."""
    bias = None
    if mask is not None:
        if str(mask.ty.dtype) == "bool":
            mask = bb.emit(relax.op.where(mask, relax.const(0.0, dtype), relax.const(masked, dtype)))
        elif str(mask.ty.dtype) != dtype:
            mask = bb.emit(relax.op.astype(mask, dtype))
        short = kv_length - static_dims(mask)[-1]
        if short > 0:
            widths = [0, 0] * (mask.ty.ndim - 1) + [0, short]
            mask = bb.emit(relax.op.nn.pad(mask, widths, pad_mode="constant", pad_value=masked))
        bias = mask
    if causal:
        allowed = np.arange(kv_length)[None, :] <= np.arange(q_length)[:, None] + past_length
        frontier = relax.const(np.where(allowed, 0.0, masked).astype(dtype), dtype)
        bias = frontier if bias is None else bb.emit(relax.op.add(bias, frontier))
    return bias
