"""onnxruntime's com.microsoft ``DynamicQuantizeLSTM``, which ``onnxruntime.quantization.quantize_dynamic`` writes for
every LSTM with constant weights, and which TVM 0.27's importer lacks.

The node carries the LSTM's input and recurrent weights as int8, transposed to ``[directions, input, 4 * hidden]``,
with a scale and a zero point per output channel (``[directions, 4 * hidden]``) or per tensor. Converted as the
float LSTM of its dequantized weights, ``(w - zero_point) * scale``, by the unrolled LSTM of :mod:`tvm_passes.rnn`
(same attributes, biases, peepholes, sequence lengths and initial states). onnxruntime computes the two matrix
products in integers, quantizing the input and the hidden state to uint8 at each step, so its outputs differ from
the float LSTM by that rounding: a 16-hidden LSTM's outputs by 0.4-0.5% of their largest value, as far as
onnxruntime's own run of the float LSTM is from them (``tests/tvm_passes/test_rnn_quantized.py``); hetpart's equal
the float LSTM's to float32 rounding. Weights computed
at run time are refused naming the node."""
from __future__ import annotations

import numpy as np
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _onnx_frontend

from hetpart.errors import UnsupportedOpError
from tvm_passes.onnx_nodes import constant_value, node_label
from tvm_passes.rnn import convert_recurrent

__all__ = ["DynamicQuantizeLSTM"]


class DynamicQuantizeLSTM(_onnx_frontend.OnnxOpConverter):
    """com.microsoft DynamicQuantizeLSTM as the float LSTM of its dequantized weights."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        where = node_label("DynamicQuantizeLSTM", attr)
        inputs = list(inputs) + [None] * (12 - len(inputs))
        dtype = str(inputs[0].ty.dtype)
        weights = [_dequantized(inputs[index], inputs[scale], inputs[zero], params, what, where, dtype)
                   for index, scale, zero, what in ((1, 8, 9, "W"), (2, 10, 11, "R"))]
        return convert_recurrent("LSTM", bb, [inputs[0], *weights, *inputs[3:8]], attr, params)


def _dequantized(weight: relax.Expr, scale: relax.Expr, zero: relax.Expr | None, params, what: str, where: str,
                 dtype: str) -> relax.Expr:
    """The float weight ``[directions, 4 * hidden, input]`` (ONNX LSTM's layout) of an int8 ``[directions, input,
    4 * hidden]`` one and its per-channel or per-tensor scale and zero point."""
    values = [constant_value(v, params) if v is not None else None for v in (weight, scale, zero)]
    if values[0] is None or values[1] is None or (zero is not None and values[2] is None):
        raise UnsupportedOpError(f"{where}: {what}, its scale and zero point must be constants (initializers); found "
                                 "one computed at run time. Quantize a model whose LSTM weights are initializers")
    quantized, scales = values[0].astype(np.float64), values[1].astype(np.float64)
    zeros = np.zeros_like(scales) if values[2] is None else values[2].astype(np.float64)
    if quantized.ndim != 3:
        raise UnsupportedOpError(f"{where}: {what} must be [directions, input, 4 * hidden]; found shape "
                                 f"{list(quantized.shape)}")
    directions, _, channels = quantized.shape

    def per_channel(v: np.ndarray) -> np.ndarray:
        if v.size == 1:
            return v.reshape(1, 1, 1)
        if v.size == directions * channels:
            return v.reshape(directions, 1, channels)
        raise UnsupportedOpError(f"{where}: the scale and zero point of {what} must have one value or one per "
                                 f"output channel ({directions} x {channels}); found {v.size}")

    floats = (quantized - per_channel(zeros)) * per_channel(scales)
    return relax.const(np.ascontiguousarray(floats.transpose(0, 2, 1)).astype(dtype), dtype)
