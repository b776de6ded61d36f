"""onnxruntime's com.microsoft ``GroupQueryAttention``: the attention of decoder language models exported by
onnxruntime's model builder and transformer optimizer (Llama, Mistral, Phi, Qwen, Gemma ...), which TVM 0.27's
importer lacks.

Converted as onnxruntime's CPU kernel computes it, with shapes static (hetpart binds input shapes before import):

- ``query`` ``[batch, seq, num_heads * head_size]`` with ``key`` and ``value`` ``[batch, seq, kv_num_heads *
  head_size]``, or Q, K and V packed in ``query`` (no key, no value);
- the caches: ``past_key``/``past_value`` ``[batch, kv_num_heads, past_buffer, head_size]``; ``seqlens_k[b]`` is the
  number of valid keys of sequence b minus one (a run-time input); ``total_sequence_length`` must be known at compile
  time (a constant, or computed from input shapes, as the model builder computes it). The present cache is
  ``[batch, kv_num_heads, max(total_sequence_length, past_buffer), head_size]``: each sequence's
  ``seqlens_k[b] + 1 - seq`` past keys, then the new ones, then zeros -- as onnxruntime writes it when the present
  cache is a separate buffer;
- the first prompt (``seq == total_sequence_length``) has no past; token generation (``seq == 1``) and a later prompt
  of batch 1 attend their sequence's past keys; query i attends keys up to its own position, the last
  ``local_window_size`` of them when that is set;
- ``do_rotary``: rotary embedding of Q and K (halves or ``rotary_interleaved`` pairs, the first ``2 *
  cos_cache.shape[1]`` channels of each head) at each token's position -- ``position_ids`` when given, else the
  past length plus the token's index;
- ``scale`` (0: 1/sqrt(head_size)), ``softcap``, ``attention_bias`` added to the scores, ``smooth_softmax`` (a zero
  logit in every softmax) and ``head_sink`` (one such logit per head).

Refused naming the node: quantized caches (``k_scale``/``v_scale``, ``kv_cache_bit_width``), Q/K norms
(``q_norm_weight``/``k_norm_weight``), ``output_qk``, non-causal attention, and a ``total_sequence_length`` known only
at run time. Rows of a first prompt beyond its sequence's length (right padding) are not specified by onnxruntime
(it reads keys past the sequence there) and hold the attention of their causal window here. Registered by
:func:`tvm_passes.onnx_converters.install_onnx_converters`; tested against onnxruntime in
``tests/tvm_passes/test_onnx_group_query.py``."""
from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _onnx_frontend

from hetpart.errors import UnsupportedOpError
from tvm_passes.onnx_attention import attend, heads_first
from tvm_passes.onnx_nodes import constant_value, node_label, static_dims
from tvm_passes.onnx_rotary import rotate

__all__ = ["GroupQueryAttention"]

_LOWEST = {name: float(np.finfo(name).min) for name in ("float16", "float32", "float64")}
# inputs beyond the nine of the first schema, by index: refused when given
_REFUSED_INPUTS = {12: "k_scale", 13: "v_scale", 14: "q_norm_weight", 15: "k_norm_weight"}


class GroupQueryAttention(_onnx_frontend.OnnxOpConverter):
    """com.microsoft GroupQueryAttention (float caches, causal)."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        where = node_label("GroupQueryAttention", attr)
        inputs = list(inputs) + [None] * (16 - len(inputs))
        query, key, value, past_key, past_value, seqlens, total = inputs[:7]
        cos, sin, positions, attention_bias, head_sink = inputs[7:12]
        _refuse_unsupported(inputs, attr, where)
        heads, kv_heads = int(attr["num_heads"]), int(attr["kv_num_heads"])
        if heads % kv_heads:
            raise UnsupportedOpError(f"{where}: num_heads ({heads}) must be a multiple of kv_num_heads ({kv_heads})")
        if (key is None) != (value is None) or (past_key is None) != (past_value is None):
            raise UnsupportedOpError(f"{where}: key and value (and past_key and past_value) must be given together; "
                                     "found one of a pair")
        dtype = str(query.ty.dtype)
        batch, length, width = static_dims(query)
        if key is None:                                       # packed [q | k | v] along the hidden axis
            size = width // (heads + 2 * kv_heads)
            parts = bb.emit(relax.op.split(query, [heads * size, (heads + kv_heads) * size], axis=2))
            query, key, value = (bb.emit(relax.TupleGetItem(parts, i)) for i in range(3))
        size = static_dims(query)[2] // heads
        total_length = _total_length(total, params, where)
        past_buffer = static_dims(past_key)[2] if past_key is not None else 0
        present_length = max(total_length, past_buffer)
        first_prompt = length == total_length
        if not first_prompt and length > 1 and batch != 1:
            raise UnsupportedOpError(f"{where}: a prompt after a past (seq {length} != total_sequence_length "
                                     f"{total_length}) must have batch 1, as onnxruntime requires; found {batch}")
        # past keys of each sequence, [batch] int32: none in a first prompt
        past = relax.const(np.zeros(batch, np.int32), "int32") if first_prompt else bb.emit(relax.op.subtract(
            bb.emit(relax.op.astype(seqlens, "int32")), relax.const(length - 1, "int32")))
        if int(attr.get("do_rotary", 0)):
            if cos is None or sin is None:
                raise UnsupportedOpError(f"{where}: do_rotary needs cos_cache and sin_cache; found them missing")
            if positions is None:
                steps = relax.const(np.arange(length, dtype=np.int64).reshape(1, length), "int64")
                positions = bb.emit(relax.op.add(bb.emit(relax.op.reshape(bb.emit(relax.op.astype(past, "int64")),
                                                                          [batch, 1])), steps))
            rotary = {"interleaved": int(attr.get("rotary_interleaved", 0)),
                      "rotary_embedding_dim": 2 * static_dims(cos)[1]}
            query = rotate(bb, query, cos, sin, positions, {**rotary, "num_heads": heads}, where)
            key = rotate(bb, key, cos, sin, positions, {**rotary, "num_heads": kv_heads}, where)
        q = heads_first(bb, query, heads)
        k_new, v_new = heads_first(bb, key, kv_heads), heads_first(bb, value, kv_heads)
        present_key = _present(bb, past_key, k_new, past, present_length)
        present_value = _present(bb, past_value, v_new, past, present_length)
        k, v = present_key, present_value
        if heads != kv_heads:                                 # query head h reads key/value head h // group
            k = bb.emit(relax.op.repeat(k, heads // kv_heads, axis=1))
            v = bb.emit(relax.op.repeat(v, heads // kv_heads, axis=1))
        lowest = _LOWEST.get(dtype, _LOWEST["float32"])
        bias = _causal_bias(bb, past, batch, length, present_length, int(attr.get("local_window_size", -1)),
                            dtype, lowest)
        if attention_bias is not None:
            short = present_length - static_dims(attention_bias)[-1]
            if short > 0:
                widths = [0, 0] * (attention_bias.ty.ndim - 1) + [0, short]
                attention_bias = bb.emit(relax.op.nn.pad(attention_bias, widths, pad_mode="constant", pad_value=0.0))
            bias = bb.emit(relax.op.add(bias, bb.emit(relax.op.astype(attention_bias, dtype))))
        scale = float(attr.get("scale", 0.0)) or 1.0 / math.sqrt(size)
        softcap = float(attr.get("softcap", 0.0))
        sink = None                                           # a head sink, or smooth softmax's zero logit
        if head_sink is not None:
            sink = bb.emit(relax.op.reshape(bb.emit(relax.op.astype(head_sink, dtype)), [1, heads, 1, 1]))
        elif int(attr.get("smooth_softmax", 0)):
            sink = relax.const(np.zeros((1, heads, 1, 1), dtype), dtype)
        y = attend(bb, q, k, v, scale, bias, guard_empty_rows=False, softcap=softcap, sink=sink).y
        y = bb.emit(relax.op.reshape(bb.emit(relax.op.permute_dims(y, [0, 2, 1, 3])), [batch, length, heads * size]))
        count = int(attr.get("tvm_custom", {}).get("num_outputs", 1))
        return y if count == 1 else relax.Tuple([y, present_key, present_value][:count])


def _refuse_unsupported(inputs: list, attr: dict, where: str) -> None:
    given = [name for index, name in _REFUSED_INPUTS.items() if inputs[index] is not None]
    if given or int(attr.get("kv_cache_bit_width", 0)) not in (0, 16, 32):
        raise UnsupportedOpError(f"{where}: quantized caches and Q/K norms are not supported; found "
                                 f"{', '.join(given) or 'kv_cache_bit_width'}. Export the model with float caches")
    if int(attr.get("tvm_custom", {}).get("num_outputs", 1)) > 3 or int(attr.get("qk_output", 0)):
        raise UnsupportedOpError(f"{where}: output_qk is not supported; export the model without it")
    if not int(attr.get("causal", 1)):
        raise UnsupportedOpError(f"{where}: non-causal GroupQueryAttention (causal=0) is not supported; found it "
                                 "set. Use MultiHeadAttention for bidirectional attention")
    if int(attr.get("sliding_window_cache", 0)):
        raise UnsupportedOpError(f"{where}: sliding_window_cache is not supported; export a full cache")


def _total_length(total: relax.Expr, params, where: str) -> int:
    """``total_sequence_length`` as a Python int: a constant, a parameter, or a value computed from shapes."""
    value = constant_value(total, params)
    if value is None and isinstance(total, relax.ShapeExpr) and len(total.values) == 1 \
            and isinstance(total.values[0], tvm.tirx.IntImm):
        value = np.array(int(total.values[0]))
    if value is None or np.size(value) != 1:
        raise UnsupportedOpError(f"{where}: total_sequence_length must be known when compiling (a constant or "
                                 "computed from input shapes); found a value computed at run time. Bind the input "
                                 "shapes (--input-shape NAME=DIMS) so it folds to a constant")
    return int(np.asarray(value).reshape(-1)[0])


def _present(bb: relax.BlockBuilder, past: relax.Expr | None, new: relax.Expr, past_lengths: relax.Expr,
             present_length: int) -> relax.Expr:
    """The present cache [batch, kv_heads, present_length, size]: sequence b's ``past_lengths[b]`` past entries,
    then ``new``'s, then zeros."""
    batch, kv_heads, length, size = static_dims(new)
    if past is None and present_length == length:          # a first prompt without a cache: the new entries
        return new
    past_buffer = static_dims(past)[2] if past is not None else 0
    both = new if past is None else bb.emit(relax.op.concat([past, new], axis=2))   # [b, kv, past_buffer + seq, s]
    rows = past_buffer + length
    slots = relax.const(np.arange(present_length, dtype=np.int32).reshape(1, present_length), "int32")
    lengths = bb.emit(relax.op.reshape(past_lengths, [batch, 1]))
    from_new = bb.emit(relax.op.greater_equal(slots, lengths))
    row = bb.emit(relax.op.where(from_new, bb.emit(relax.op.add(bb.emit(relax.op.subtract(slots, lengths)),
                                                                 relax.const(past_buffer, "int32"))), slots))
    row = bb.emit(relax.op.clip(row, 0, rows - 1))
    offsets = relax.const((np.arange(batch, dtype=np.int32) * rows).reshape(batch, 1), "int32")
    flat_rows = bb.emit(relax.op.reshape(bb.emit(relax.op.add(row, offsets)), [batch * present_length]))
    table = bb.emit(relax.op.reshape(bb.emit(relax.op.permute_dims(both, [0, 2, 1, 3])),
                                     [batch * rows, kv_heads * size]))
    gathered = bb.emit(relax.op.reshape(bb.emit(relax.op.take(table, flat_rows, axis=0)),
                                        [batch, present_length, kv_heads, size]))
    written = bb.emit(relax.op.less(slots, bb.emit(relax.op.add(lengths, relax.const(length, "int32")))))
    written = bb.emit(relax.op.reshape(written, [batch, present_length, 1, 1]))
    dtype = str(new.ty.dtype)
    kept = bb.emit(relax.op.where(written, gathered, relax.const(0.0, dtype)))
    return bb.emit(relax.op.permute_dims(kept, [0, 2, 1, 3]))


def _causal_bias(bb: relax.BlockBuilder, past_lengths: relax.Expr, batch: int, length: int, present_length: int,
                 window: int, dtype: str, masked: float) -> relax.Expr:
    """[batch, 1, seq, present_length]: 0 where query i of sequence b may attend key t (``t <= past[b] + i``, and
    with a window the last ``window`` such keys: ``t > past[b] + i - window``, as onnxruntime 1.31 counts it),
    ``masked`` elsewhere."""
    keys = relax.const(np.arange(present_length, dtype=np.int32).reshape(1, 1, 1, present_length), "int32")
    own = bb.emit(relax.op.add(bb.emit(relax.op.reshape(past_lengths, [batch, 1, 1, 1])),
                               relax.const(np.arange(length, dtype=np.int32).reshape(1, 1, length, 1), "int32")))
    allowed = bb.emit(relax.op.less_equal(keys, own))
    if window > 0:
        recent = bb.emit(relax.op.greater(keys, bb.emit(relax.op.subtract(own, relax.const(window, "int32")))))
        allowed = bb.emit(relax.op.logical_and(allowed, recent))
    return bb.emit(relax.op.where(allowed, relax.const(0.0, dtype), relax.const(masked, dtype)))

