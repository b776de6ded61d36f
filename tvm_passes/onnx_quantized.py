"""Converters for the quantized ONNX ops TVM 0.27's importer lacks (registered by
:func:`tvm_passes.onnx_converters.install_onnx_converters`).

- ``ConvInteger``, which onnxruntime's dynamic quantization writes for CNNs (with ``DynamicQuantizeLinear``, which
  TVM converts): ``(x - x_zero_point) conv (w - w_zero_point)`` in int32, exact;
- ``QLinearConv`` and ``QLinearMatMul`` of its static quantization in QOperator format, and the com.microsoft
  QLinear ops it writes around them (QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu,
  QLinearGlobalAveragePool, QLinearConcat): computed as TVM computes the equivalent QDQ form -- inputs
  dequantized, the op in float, the result quantized -- so a result can differ from onnxruntime's integer kernels
  by one quantization step where a value falls on a rounding boundary (none did in the tests);
- ``MatMulIntegerToFloat`` and ``DynamicQuantizeMatMul``, onnxruntime's fusions of a dynamically quantized MatMul
  (a model it optimized and saved): the ONNX ops they fuse, composed from TVM's converters (int32 product).

Tests against onnxruntime: ``tests/tvm_passes/test_onnx_quantized.py``.
"""
from __future__ import annotations

from typing import Any, Sequence

from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _onnx_frontend

__all__ = ["CONTRIB_OP_TYPES", "QUANTIZED_CONVERTERS"]


def _widened(bb: relax.BlockBuilder, x: relax.Expr, zero_point: relax.Expr | None, channel_axis: int | None = None,
             rank: int = 0) -> relax.Expr:
    """``x - zero_point`` in int32; a per-channel zero point ([C]) is laid along ``channel_axis`` of a rank-``rank``
    tensor."""
    x = bb.emit(relax.op.astype(x, "int32"))
    if zero_point is None:
        return x
    zp = bb.emit(relax.op.astype(zero_point, "int32"))
    if channel_axis is not None and zp.ty.ndim == 1 and rank > 1:
        zp = bb.emit(relax.op.reshape(zp, [-1 if d == channel_axis else 1 for d in range(rank)]))
    return bb.emit(relax.op.subtract(x, zp))


class ConvInteger(_onnx_frontend.OnnxOpConverter):
    """ONNX ConvInteger (dynamically quantized CNNs): (x - x_zero_point) conv (w - w_zero_point) in int32."""

    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        x, w = inputs[0], inputs[1]
        x = _widened(bb, x, inputs[2] if len(inputs) > 2 else None)
        w = _widened(bb, w, inputs[3] if len(inputs) > 3 else None, 0, w.ty.ndim)
        return _onnx_frontend.Conv._impl_v11(bb, _onnx_frontend.onnx_input([x, w]), dict(attr), params)


def _dequantized(bb: relax.BlockBuilder, x: relax.Expr, scale: relax.Expr, zero_point: relax.Expr | None,
                 axis: int) -> relax.Expr:
    zero_point = zero_point if zero_point is not None else relax.const(0, str(x.ty.dtype))
    return bb.emit(relax.op.dequantize(x, scale, zero_point, axis=axis if scale.ty.ndim else -1,
                                       out_dtype="float32"))


def _quantized(bb: relax.BlockBuilder, y: relax.Expr, scale: relax.Expr, zero_point: relax.Expr | None,
               axis: int) -> relax.Expr:
    out_dtype = str(zero_point.ty.dtype) if zero_point is not None else "uint8"
    zero_point = zero_point if zero_point is not None else relax.const(0, out_dtype)
    return bb.emit(relax.op.quantize(y, scale, zero_point, axis=axis if scale.ty.ndim else -1, out_dtype=out_dtype))


class QLinearConv(_onnx_frontend.OnnxOpConverter):
    """ONNX QLinearConv (QOperator-format quantized CNNs) as TVM imports the QDQ form: inputs and weights
    dequantized, a float conv (the int32 bias scaled by x_scale * w_scale), the result quantized."""

    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp = inputs[:8]
        bias = inputs[8] if len(inputs) > 8 else None
        x_f = _dequantized(bb, x, x_scale, x_zp, 1)
        w_f = _dequantized(bb, w, w_scale, w_zp, 0)
        operands = [x_f, w_f]
        if bias is not None:
            operands.append(bb.emit(relax.op.multiply(bb.emit(relax.op.astype(bias, "float32")),
                                                      bb.emit(relax.op.multiply(x_scale, w_scale)))))
        y = bb.normalize(_onnx_frontend.Conv._impl_v11(bb, _onnx_frontend.onnx_input(operands), dict(attr),
                                                        params))
        return _quantized(bb, y, y_scale, y_zp, 1)


class QLinearMatMul(_onnx_frontend.OnnxOpConverter):
    """ONNX QLinearMatMul: dequantized operands, a float matmul, the result quantized (scales per tensor, or per
    row of ``a`` / column of ``b``)."""

    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = inputs[:8]
        a_f = _dequantized(bb, a, a_scale, a_zp, a.ty.ndim - 2)
        b_f = _dequantized(bb, b, b_scale, b_zp, b.ty.ndim - 1)
        y = bb.emit(relax.op.matmul(a_f, b_f))
        return _quantized(bb, y, y_scale, y_zp, y.ty.ndim - 1)


def _qlinear_elementwise(name: str, float_op: Any, binary: bool, doc: str) -> type:
    """A com.microsoft QLinear element-wise op (onnxruntime's QOperator format): per-tensor quantized inputs
    dequantized, ``float_op`` in float, quantized to the output's scale and zero point."""

    def impl(cls, bb, inputs, attr, params):
        if binary:         # A, A_scale, A_zp, B, B_scale, B_zp, C_scale, C_zp
            a = _dequantized(bb, inputs[0], inputs[1], inputs[2], 1)
            b = _dequantized(bb, inputs[3], inputs[4], inputs[5], 1)
            y = bb.emit(float_op(a, b, attr))
            return _quantized(bb, y, inputs[6], inputs[7], 1)
        x = _dequantized(bb, inputs[0], inputs[1], inputs[2], 1)       # X, X_scale, X_zp, Y_scale, Y_zp
        return _quantized(bb, bb.emit(float_op(x, attr)), inputs[3], inputs[4], 1)

    return type(name, (_onnx_frontend.OnnxOpConverter,), {"_impl_v1": classmethod(impl), "__doc__": doc})


def _global_average(x: relax.Expr, attr: dict) -> relax.Expr:
    axes = list(range(1, x.ty.ndim - 1)) if int(attr.get("channels_last", 0)) else list(range(2, x.ty.ndim))
    return relax.op.mean(x, axis=axes, keepdims=True)


class QLinearConcat(_onnx_frontend.OnnxOpConverter):
    """com.microsoft QLinearConcat: Y_scale, Y_zp, then (tensor, scale, zero point) per input."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        parts = [_dequantized(bb, inputs[k], inputs[k + 1], inputs[k + 2], 1) for k in range(2, len(inputs), 3)]
        y = bb.emit(relax.op.concat(parts, axis=int(attr.get("axis", 0))))
        return _quantized(bb, y, inputs[0], inputs[1], 1)


_QLINEAR_CONTRIB = {
    "QLinearAdd": _qlinear_elementwise("QLinearAdd", lambda a, b, attr: relax.op.add(a, b), True, "A + B"),
    "QLinearMul": _qlinear_elementwise("QLinearMul", lambda a, b, attr: relax.op.multiply(a, b), True, "A * B"),
    "QLinearSigmoid": _qlinear_elementwise("QLinearSigmoid", lambda x, attr: relax.op.sigmoid(x), False, "sigmoid"),
    "QLinearLeakyRelu": _qlinear_elementwise(
        "QLinearLeakyRelu", lambda x, attr: relax.op.nn.leakyrelu(x, float(attr.get("alpha", 0.01))), False,
        "leaky relu"),
    "QLinearGlobalAveragePool": _qlinear_elementwise("QLinearGlobalAveragePool", _global_average, False,
                                                     "global average pool (NCHW or channels last)"),
    "QLinearConcat": QLinearConcat,
}


def _integer_matmul_to_float(bb: relax.BlockBuilder, a: relax.Expr, b: relax.Expr, a_scale: relax.Expr,
                             b_scale: relax.Expr, a_zero_point: Any, b_zero_point: Any, bias: Any,
                             params: Any) -> relax.Expr:
    """(a - a_zero_point) @ (b - b_zero_point) in int32 (TVM's MatMulInteger), times a_scale * b_scale, plus bias."""
    product = bb.normalize(_onnx_frontend.MatMulInteger._impl_v10(
        bb, _onnx_frontend.onnx_input([a, b, a_zero_point, b_zero_point]), {}, params))
    dtype = str(a_scale.ty.dtype)
    y = bb.emit(relax.op.multiply(bb.emit(relax.op.astype(product, dtype)),
                                  bb.emit(relax.op.multiply(a_scale, b_scale))))
    return y if bias is None else bb.emit(relax.op.add(y, bias))


class MatMulIntegerToFloat(_onnx_frontend.OnnxOpConverter):
    """com.microsoft MatMulIntegerToFloat (onnxruntime's fusion of a dynamically quantized MatMul):
    (A - a_zero_point) @ (B - b_zero_point) * a_scale * b_scale + bias, the product in int32."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        return _integer_matmul_to_float(bb, inputs[0], inputs[1], inputs[2], inputs[3], inputs[4], inputs[5],
                                        inputs[6], params)


class DynamicQuantizeMatMul(_onnx_frontend.OnnxOpConverter):
    """com.microsoft DynamicQuantizeMatMul: A quantized to uint8 as ONNX DynamicQuantizeLinear does (TVM's
    converter), then :class:`MatMulIntegerToFloat` with B's scale, zero point and the bias."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        quantized = bb.normalize(_onnx_frontend.DynamicQuantizeLinear._impl_v11(
            bb, _onnx_frontend.onnx_input([inputs[0]]), {}, params))
        a, a_scale, a_zero_point = (bb.emit(relax.TupleGetItem(quantized, k)) for k in range(3))
        return _integer_matmul_to_float(bb, a, inputs[1], a_scale, inputs[2], a_zero_point, inputs[3], inputs[4],
                                        params)


_DYNAMIC_CONTRIB = {"MatMulIntegerToFloat": MatMulIntegerToFloat, "DynamicQuantizeMatMul": DynamicQuantizeMatMul}
QUANTIZED_CONVERTERS = {"ConvInteger": ConvInteger, "QLinearConv": QLinearConv, "QLinearMatMul": QLinearMatMul,
                        **_QLINEAR_CONTRIB, **_DYNAMIC_CONTRIB}
# onnxruntime's contrib ops among them: TVM's importer looks converters up by op type whatever the node's domain
CONTRIB_OP_TYPES: Sequence[str] = tuple(f"com.microsoft.{op}" for op in (*_QLINEAR_CONTRIB, *_DYNAMIC_CONTRIB))
