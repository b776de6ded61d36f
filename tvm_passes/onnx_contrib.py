"""Converters for onnxruntime's contrib ops (com.microsoft, and its ops in the default domain) that transformer
models carry once onnxruntime's transformer optimizer has fused them, where TVM 0.27 has none or a partial one:

- ``Attention`` (replaces TVM's, which drops a 1-D ``mask_index`` -- the sequence lengths EmbedLayerNormalization
  gives an optimized BERT -- and fails on a 2-D one): no mask, lengths ``[batch]`` (right padding), a raw mask
  ``[batch, seq]`` or ``[batch, seq, seq]``, ``unidirectional``, ``qkv_hidden_sizes``, ``scale`` and
  ``mask_filter_value``; a past state is refused;
- ``SkipLayerNormalization`` (replaces TVM's, which requires the optional beta and bias and lacks the sum output);
- ``QuickGelu`` (and the ONNX ``Swish`` of opset 24, the same function), ``BiasAdd``, ``FusedMatMul``
  (``transA``/``transB``/``alpha``), and the RMS norms ``SimplifiedLayerNormalization`` and
  ``SkipSimplifiedLayerNormalization``.

Registered by :func:`tvm_passes.onnx_converters.install_onnx_converters`; tests against onnxruntime in
``tests/tvm_passes/test_onnx_contrib.py``.
"""
from __future__ import annotations

import math

import numpy as np
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _onnx_frontend

from hetpart.errors import UnsupportedOpError
from tvm_passes.onnx_nodes import node_label as _where
from tvm_passes.onnx_nodes import static_dims

__all__ = ["CONTRIB_CONVERTERS", "OVERRIDDEN_OP_TYPES"]


class Attention(_onnx_frontend.OnnxOpConverter):
    """com.microsoft Attention: QKV = input @ weights + bias, multi-head scaled dot-product attention."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        where = _where("Attention", attr)
        if inputs[4] is not None or inputs[6] is not None:           # past, past_sequence_length
            raise UnsupportedOpError(f"{where}: a past key/value state (incremental decoding) is not supported; "
                                     "export the model without it")
        x, weight, bias, mask = inputs[0], inputs[1], inputs[2], inputs[3]
        extra_bias = inputs[5]                                       # attention_bias
        batch, seq, _ = static_dims(x)
        heads = int(attr["num_heads"])
        sizes = [int(s) for s in attr.get("qkv_hidden_sizes", [])] or [static_dims(weight)[1] // 3] * 3
        dtype = str(x.ty.dtype)
        qkv = bb.emit(relax.op.matmul(x, weight))
        if bias is not None:
            qkv = bb.emit(relax.op.add(qkv, bias))
        parts = bb.emit(relax.op.split(qkv, [sizes[0], sizes[0] + sizes[1]], axis=2))
        q, k, v = (bb.emit(relax.op.reshape(bb.emit(relax.TupleGetItem(parts, i)),
                                            [batch, seq, heads, sizes[i] // heads])) for i in range(3))
        logits_bias = None
        if mask is not None:
            logits_bias = cls._mask_bias(bb, mask, batch, seq, dtype, float(attr.get("mask_filter_value", -10000.0)),
                                         where)
        if extra_bias is not None:                       # attention_bias [batch or 1, heads or 1, seq, seq]
            logits_bias = extra_bias if logits_bias is None else bb.emit(relax.op.add(logits_bias, extra_bias))
        if logits_bias is not None:
            logits_bias = bb.emit(relax.op.broadcast_to(logits_bias, [batch, heads, seq, seq]))
        scale = float(attr.get("scale", 0.0)) or 1.0 / math.sqrt(sizes[0] // heads)
        causal = "TopLeft" if int(attr.get("unidirectional", 0)) else None
        out = bb.emit(relax.op.nn.attention(q, k, v, logits_bias, scale=scale, causal_mask=causal))
        return bb.emit(relax.op.reshape(out, [batch, seq, sizes[2]]))

    @staticmethod
    def _mask_bias(bb, mask, batch, seq, dtype, filter_value, where):
        """The additive logits bias [batch, 1, seq or 1, seq] of a mask_index: 0 where a key counts, the filter
        value where it is masked."""
        dims = static_dims(mask)
        keys = relax.const(np.arange(seq).reshape(1, seq), "int32")
        if dims == [batch]:                                            # valid lengths, right padding
            lens = bb.emit(relax.op.reshape(bb.emit(relax.op.astype(mask, "int32")), [batch, 1]))
            keep = bb.emit(relax.op.less(keys, lens))
            shape = [batch, 1, 1, seq]
        elif dims in ([batch, seq], [batch, seq, seq]):                # raw mask: 1 keeps, 0 masks
            keep = bb.emit(relax.op.not_equal(mask, relax.const(0, str(mask.ty.dtype))))
            shape = [batch, 1, 1, seq] if len(dims) == 2 else [batch, 1, seq, seq]
        else:
            raise UnsupportedOpError(f"{where}: mask_index of shape {dims} is not supported; supported: [{batch}] "
                                     f"(lengths), [{batch}, {seq}] or [{batch}, {seq}, {seq}]")
        bias = bb.emit(relax.op.where(keep, relax.const(0.0, dtype), relax.const(filter_value, dtype)))
        return bb.emit(relax.op.reshape(bias, shape))


class QuickGelu(_onnx_frontend.OnnxOpConverter):
    """com.microsoft QuickGelu: x * sigmoid(alpha * x)."""

    default_alpha = 1.702

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        x = inputs[0]
        alpha = relax.const(float(attr.get("alpha", cls.default_alpha)), str(x.ty.dtype))
        return bb.emit(relax.op.multiply(x, bb.emit(relax.op.sigmoid(bb.emit(relax.op.multiply(x, alpha))))))


class Swish(QuickGelu):
    """ONNX Swish (opset 24): QuickGelu's x * sigmoid(alpha * x), alpha 1 by default."""

    default_alpha = 1.0


class BiasAdd(_onnx_frontend.OnnxOpConverter):
    """com.microsoft BiasAdd: x + bias + skip."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        return bb.emit(relax.op.add(bb.emit(relax.op.add(inputs[0], inputs[1])), inputs[2]))


class FusedMatMul(_onnx_frontend.OnnxOpConverter):
    """com.microsoft FusedMatMul: alpha * op(A) @ op(B), op transposing the last two axes when asked."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        if int(attr.get("transBatchA", 0)) or int(attr.get("transBatchB", 0)):
            raise UnsupportedOpError(f"{_where('FusedMatMul', attr)}: transBatchA/transBatchB are not supported")

        def operand(x: relax.Expr, transpose: bool) -> relax.Expr:
            if not transpose:
                return x
            axes = list(range(x.ty.ndim))
            axes[-2:] = axes[-1], axes[-2]
            return bb.emit(relax.op.permute_dims(x, axes))

        y = bb.emit(relax.op.matmul(operand(inputs[0], int(attr.get("transA", 0))),
                                    operand(inputs[1], int(attr.get("transB", 0)))))
        alpha = float(attr.get("alpha", 1.0))
        return y if alpha == 1.0 else bb.emit(relax.op.multiply(y, relax.const(alpha, str(y.ty.dtype))))


def _rms_norm(bb, x, scale, axis: int, epsilon: float):
    dtype = str(x.ty.dtype)
    mean_square = bb.emit(relax.op.mean(bb.emit(relax.op.multiply(x, x)), axis=[axis], keepdims=True))
    inverse = bb.emit(relax.op.rsqrt(bb.emit(relax.op.add(mean_square, relax.const(epsilon, dtype)))))
    return bb.emit(relax.op.multiply(bb.emit(relax.op.multiply(x, inverse)), scale))


class SimplifiedLayerNormalization(_onnx_frontend.OnnxOpConverter):
    """RMS normalization: x / sqrt(mean(x^2) + epsilon) * scale (over the last axes from ``axis``; -1 here)."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        axis = int(attr.get("axis", -1))
        if axis not in (-1, inputs[0].ty.ndim - 1):
            raise UnsupportedOpError(f"{_where('SimplifiedLayerNormalization', attr)}: axis must be the last; "
                                     f"found {axis}")
        return _rms_norm(bb, inputs[0], inputs[1], -1, float(attr.get("epsilon", 1e-5)))


class SkipSimplifiedLayerNormalization(_onnx_frontend.OnnxOpConverter):
    """com.microsoft SkipSimplifiedLayerNormalization: RMS norm of input + skip (+ bias); outputs the norm, two
    statistics onnxruntime leaves empty (zeros here) and the sum."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        total = bb.emit(relax.op.add(inputs[0], inputs[1]))
        if len(inputs) > 3 and inputs[3] is not None:
            total = bb.emit(relax.op.add(total, inputs[3]))
        y = _rms_norm(bb, total, inputs[2], -1, float(attr.get("epsilon", 1e-5)))
        empty = relax.const(0.0, str(total.ty.dtype))
        return relax.Tuple([y, empty, empty, total])


class SkipLayerNormalization(_onnx_frontend.OnnxOpConverter):
    """com.microsoft SkipLayerNormalization: layer norm of input + skip (+ bias), beta optional (TVM's converter
    requires beta and bias); outputs the norm, two statistics onnxruntime leaves empty (zeros here) and the sum,
    which the optimizer wires into the next residual."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        total = bb.emit(relax.op.add(inputs[0], inputs[1]))
        if inputs[4] is not None:
            total = bb.emit(relax.op.add(total, inputs[4]))
        dtype = str(total.ty.dtype)
        beta = inputs[3] if inputs[3] is not None else relax.const(np.zeros(static_dims(inputs[2]), dtype))
        y = bb.emit(relax.op.nn.layer_norm(total, inputs[2], beta, axes=[-1],
                                           epsilon=float(attr.get("epsilon", 1e-12))))
        empty = relax.const(0.0, dtype)
        return relax.Tuple([y, empty, empty, total])


CONTRIB_CONVERTERS = {"Attention": Attention, "SkipLayerNormalization": SkipLayerNormalization, "QuickGelu": QuickGelu,
                      "Swish": Swish, "BiasAdd": BiasAdd, "FusedMatMul": FusedMatMul,
                      "SimplifiedLayerNormalization": SimplifiedLayerNormalization,
                      "SkipSimplifiedLayerNormalization": SkipSimplifiedLayerNormalization}
OVERRIDDEN_OP_TYPES = ("Attention", "SkipLayerNormalization")      # TVM has converters for these; ours replace them
