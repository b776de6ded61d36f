"""ONNX ops TVM 0.27's Relax importer has no converter for, found in exported inference models: ``STFT`` and
``DFT`` (audio front ends: torch's ``stft(..., return_complex=False)`` exports ``STFT``), ``ReverseSequence``
(tf2onnx's bidirectional recurrent layers reverse each sequence within its own length), ``Celu``,
``LpNormalization``, ``Col2Im`` (torch's ``nn.Fold``), ``Det`` (:mod:`tvm_passes.onnx_det`) and
``CenterCropPad`` (:mod:`tvm_passes.onnx_center_crop_pad`); the quantized ops of :mod:`tvm_passes.onnx_quantized`
and onnxruntime's transformer contrib ops of :mod:`tvm_passes.onnx_contrib` (``Attention``, the ONNX op and
the contrib op of that name: :mod:`tvm_passes.onnx_attention`; ``MultiHeadAttention``:
:mod:`tvm_passes.onnx_multihead`; ``GroupQueryAttention``: :mod:`tvm_passes.onnx_group_query`;
``RotaryEmbedding``, both ops: :mod:`tvm_passes.onnx_rotary`; ``DynamicQuantizeLSTM``:
:mod:`tvm_passes.rnn_quantized`; ``FusedConv`` and
``FusedGemm``: :mod:`tvm_passes.onnx_fused`). TVM's
``Resize`` is wrapped by :mod:`tvm_passes.onnx_resize`, ``MaxPool`` by :mod:`tvm_passes.onnx_pooling` and (like
``ConvTranspose``) by :mod:`tvm_passes.onnx_padding`, ``LayerNormalization`` by :mod:`tvm_passes.onnx_normalization`.

Shapes are static here (hetpart binds input shapes before import), so a transform is a matmul with a constant
matrix of cosines and sines (exact to float32 rounding, where onnxruntime runs an FFT), and ``ReverseSequence`` a
gather along the time axis with indices computed from the lengths. Every converter matches onnxruntime
(``tests/tvm_passes/test_onnx_converters.py``). :func:`install_onnx_converters` registers them by wrapping
``onnx_frontend._get_convert_map``, as :mod:`tvm_passes.rnn` registers the recurrent ones; anything a converter
cannot take (a frame step computed at run time, a complex signal made one-sided) raises
:class:`hetpart.errors.UnsupportedOpError` naming the node and what is supported.
"""
from __future__ import annotations

import functools
import logging
from typing import Any, Sequence

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _onnx_frontend

from hetpart.errors import UnsupportedOpError
from tvm_passes.onnx_attention import Attention
from tvm_passes.onnx_center_crop_pad import CenterCropPad
from tvm_passes.onnx_contrib import CONTRIB_CONVERTERS, OVERRIDDEN_OP_TYPES
from tvm_passes.onnx_det import Det
from tvm_passes.onnx_fused import fused_conv, fused_gemm
from tvm_passes.onnx_group_query import GroupQueryAttention
from tvm_passes.onnx_multihead import MultiHeadAttention
from tvm_passes.onnx_nodes import constant_value, wrap_convert_map, wrap_impls
from tvm_passes.onnx_nodes import node_label as _where
from tvm_passes.onnx_normalization import layer_norm_with_statistics
from tvm_passes.onnx_padding import conv_transpose_with_output_shape, pool_with_explicit_pads
from tvm_passes.onnx_resize import checked_resize
from tvm_passes.onnx_pooling import max_pool_with_indices
from tvm_passes.onnx_quantized import CONTRIB_OP_TYPES, QUANTIZED_CONVERTERS
from tvm_passes.onnx_rotary import RotaryEmbedding
from tvm_passes.rnn_quantized import DynamicQuantizeLSTM

logger = logging.getLogger(__name__)

__all__ = ["CONTRIB_OP_TYPES", "CONVERTED_OP_TYPES", "install_onnx_converters"]


def _shape(expr: relax.Expr, what: str, where: str) -> list[int]:
    dims = []
    for dim in expr.ty.shape.values:
        if not isinstance(dim, tvm.tirx.IntImm):
            raise UnsupportedOpError(f"{where}: {what} has symbolic shape {list(expr.ty.shape.values)}; bind the "
                                     "input shapes when importing (--input-shape NAME=DIMS)")
        dims.append(int(dim))
    return dims


def _constant_int(expr: relax.Expr | None, params: Any, what: str, where: str) -> int | None:
    """A scalar integer input that must be known at import (it sets an output shape); None when absent."""
    if expr is None:
        return None
    value = constant_value(expr, params)
    if value is None or value.size != 1:
        raise UnsupportedOpError(f"{where}: {what} must be a constant scalar (it sets the output's shape); found "
                                 f"{'a value computed at run time' if value is None else value.shape}")
    return int(value.reshape(()))


def _dft_matrix(length: int, bins: int, inverse: bool, complex_input: bool, dtype: str) -> relax.Constant:
    """[length * c, bins * 2] with c = 2 for a complex input (rows: the real parts, then the imaginary parts): a
    signal's row times it gives (re, im) of every bin, interleaved."""
    n = np.arange(length)[:, None]
    k = np.arange(bins)[None, :]
    angle = 2.0 * np.pi * ((n * k) % length) / length
    sign = 1.0 if inverse else -1.0
    cos, sin = np.cos(angle), sign * np.sin(angle)
    real_rows = np.stack([cos, sin], axis=-1).reshape(length, 2 * bins)           # x_re -> (re, im)
    rows = [real_rows]
    if complex_input:
        rows.append(np.stack([-sin, cos], axis=-1).reshape(length, 2 * bins))     # x_im -> (re, im)
    matrix = np.concatenate(rows, axis=0)
    if inverse:
        matrix = matrix / length
    return relax.const(matrix.astype(dtype))


def _transform_last_axis(bb: relax.BlockBuilder, x: relax.Expr, lead: list[int], length: int, channels: int,
                         bins: int, inverse: bool, dtype: str) -> relax.Expr:
    """``x`` [*lead, length, channels] (channels 1: real, 2: complex) -> [*lead, bins, 2]."""
    rows = int(np.prod(lead)) if lead else 1
    flat = bb.emit(relax.op.reshape(x, [rows, length, channels]))
    if channels == 2:            # [rows, 2 * length]: the real parts, then the imaginary parts
        flat = bb.emit(relax.op.permute_dims(flat, [0, 2, 1]))
    flat = bb.emit(relax.op.reshape(flat, [rows, length * channels]))
    spectrum = bb.emit(relax.op.matmul(flat, _dft_matrix(length, bins, inverse, channels == 2, dtype)))
    return bb.emit(relax.op.reshape(spectrum, [*lead, bins, 2]))


class Stft(_onnx_frontend.OnnxOpConverter):
    """ONNX STFT: frames of ``frame_length`` every ``frame_step`` samples, each times the window, transformed."""

    @classmethod
    def _impl_v17(cls, bb, inputs, attr, params):
        where = _where("STFT", attr)
        signal = inputs[0]
        dims = _shape(signal, "the signal", where)
        if len(dims) == 2:               # [batch, samples]: a real signal (torch exports it so; onnxruntime takes it)
            signal = bb.emit(relax.op.expand_dims(signal, 2))
            dims.append(1)
        if len(dims) != 3 or dims[2] not in (1, 2):
            raise UnsupportedOpError(f"{where}: the signal must be [batch, samples, 1] (real) or [batch, samples, 2] "
                                     f"(complex); found shape {dims}")
        batch, samples, channels = dims
        step = _constant_int(inputs[1], params, "frame_step", where)
        window = inputs[2] if len(inputs) > 2 else None
        frame_length = _constant_int(inputs[3] if len(inputs) > 3 else None, params, "frame_length", where)
        window_length = _shape(window, "the window", where)[0] if window is not None else None
        if frame_length is None and window_length is None:
            raise UnsupportedOpError(f"{where}: give a window or a frame_length (the ONNX STFT needs one)")
        length = frame_length if frame_length is not None else window_length
        if window_length is not None and window_length != length:
            raise UnsupportedOpError(f"{where}: the window has {window_length} samples, frame_length is {length}; "
                                     "they must be equal")
        onesided = bool(int(attr.get("onesided", 1)))
        if onesided and channels == 2:
            raise UnsupportedOpError(f"{where}: onesided=1 takes a real signal ([batch, samples, 1]); found a "
                                     "complex one. Set onesided=0")
        if step is None or step < 1 or length > samples:
            raise UnsupportedOpError(f"{where}: frame_step must be >= 1 and the frame ({length} samples) no longer "
                                     f"than the signal ({samples}); found frame_step={step}")
        frames = (samples - length) // step + 1
        index = relax.const(np.arange(frames)[:, None] * step + np.arange(length)[None, :], "int64")
        framed = bb.emit(relax.op.take(signal, index, axis=1))              # [batch, frames, length, channels]
        if window is not None:
            framed = bb.emit(relax.op.multiply(framed, bb.emit(relax.op.reshape(window, [1, 1, length, 1]))))
        bins = length // 2 + 1 if onesided else length
        return _transform_last_axis(bb, framed, [batch, frames], length, channels, bins, False,
                                    str(signal.ty.dtype))


class Dft(_onnx_frontend.OnnxOpConverter):
    """ONNX DFT along one signal axis (zero-padded or cut to ``dft_length``), forward or inverse, one-sided for a
    real signal; opset 17 takes the axis as an attribute, opset 20 as an input."""

    @classmethod
    def _convert(cls, bb, x, length_input, axis, attr, params):
        where = _where("DFT", attr)
        dims = _shape(x, "the input", where)
        channels, rank = dims[-1], len(dims) - 1             # the last axis holds (re) or (re, im)
        if channels not in (1, 2):
            raise UnsupportedOpError(f"{where}: the last axis must hold 1 (real) or 2 (complex) values; found "
                                     f"{channels}")
        axis = axis % (rank + 1)
        if axis >= rank:
            raise UnsupportedOpError(f"{where}: axis {axis} is the real/imaginary axis; choose a signal axis")
        inverse, onesided = bool(int(attr.get("inverse", 0))), bool(int(attr.get("onesided", 0)))
        if onesided and (inverse or channels == 2):
            raise UnsupportedOpError(f"{where}: onesided=1 is supported for a forward DFT of a real signal")
        length = _constant_int(length_input, params, "dft_length", where) or dims[axis]
        order = [d for d in range(rank) if d != axis] + [axis, rank]
        moved = bb.emit(relax.op.permute_dims(x, order))                   # [*rest, n, channels]
        n = dims[axis]
        if length < n:
            moved = bb.emit(relax.op.strided_slice(moved, axes=[rank - 1], begin=[0], end=[length]))
        elif length > n:
            pad = [0] * (2 * (rank + 1))
            pad[2 * (rank - 1) + 1] = length - n
            moved = bb.emit(relax.op.nn.pad(moved, pad))
        rest = [dims[d] for d in range(rank) if d != axis]
        bins = length // 2 + 1 if onesided else length
        out = _transform_last_axis(bb, moved, rest, length, channels, bins, inverse, str(x.ty.dtype))
        back = list(range(rank - 1))
        back.insert(axis, rank - 1)                                         # the bins return to the signal axis
        return bb.emit(relax.op.permute_dims(out, back + [rank]))

    @classmethod
    def _impl_v17(cls, bb, inputs, attr, params):
        return cls._convert(bb, inputs[0], inputs[1] if len(inputs) > 1 else None, int(attr.get("axis", 1)), attr,
                            params)

    @classmethod
    def _impl_v20(cls, bb, inputs, attr, params):
        axis = _constant_int(inputs[2] if len(inputs) > 2 else None, params, "axis", _where("DFT", attr))
        return cls._convert(bb, inputs[0], inputs[1] if len(inputs) > 1 else None, -2 if axis is None else axis,
                            attr, params)


class ReverseSequence(_onnx_frontend.OnnxOpConverter):
    """ONNX ReverseSequence: each batch entry's first ``sequence_lens[b]`` steps reversed, the rest kept."""

    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        where = _where("ReverseSequence", attr)
        x, lens = inputs[0], inputs[1]
        dims = _shape(x, "the input", where)
        time_axis, batch_axis = int(attr.get("time_axis", 0)), int(attr.get("batch_axis", 1))
        if {time_axis, batch_axis} != {0, 1}:
            raise UnsupportedOpError(f"{where}: time_axis and batch_axis must be 0 and 1 (in either order); found "
                                     f"{time_axis} and {batch_axis}")
        steps, batch = dims[time_axis], dims[batch_axis]
        lens = bb.emit(relax.op.astype(lens, "int64"))
        time = relax.const(np.arange(steps).reshape([steps, 1] if time_axis == 0 else [1, steps]), "int64")
        lens = bb.emit(relax.op.reshape(lens, [1, batch] if time_axis == 0 else [batch, 1]))
        source = bb.emit(relax.op.where(bb.emit(relax.op.less(time, lens)),
                                        bb.emit(relax.op.subtract(bb.emit(relax.op.subtract(lens, time)),
                                                                  relax.const(1, "int64"))),
                                        bb.emit(relax.op.broadcast_to(time, [dims[0], dims[1]]))))
        rest = dims[2:]
        index = bb.emit(relax.op.reshape(source, [dims[0], dims[1]] + [1] * len(rest)))
        index = bb.emit(relax.op.broadcast_to(index, dims))
        return bb.emit(relax.op.gather_elements(x, index, axis=time_axis))


class Celu(_onnx_frontend.OnnxOpConverter):
    """ONNX Celu: max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""

    @classmethod
    def _impl_v12(cls, bb, inputs, attr, params):
        x = inputs[0]
        dtype = str(x.ty.dtype)
        alpha = relax.const(float(attr.get("alpha", 1.0)), dtype)
        zero = relax.const(0.0, dtype)
        negative = bb.emit(relax.op.multiply(alpha, bb.emit(relax.op.subtract(
            bb.emit(relax.op.exp(bb.emit(relax.op.divide(x, alpha)))), relax.const(1.0, dtype)))))
        return bb.emit(relax.op.add(bb.emit(relax.op.maximum(x, zero)), bb.emit(relax.op.minimum(negative, zero))))


class LpNormalization(_onnx_frontend.OnnxOpConverter):
    """ONNX LpNormalization (p 1 or 2) along one axis: x / ||x||_p, as onnxruntime computes it (no epsilon)."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        x = inputs[0]
        axis, p = int(attr.get("axis", -1)), int(attr.get("p", 2))
        if p not in (1, 2):
            raise UnsupportedOpError(f"{_where('LpNormalization', attr)}: p must be 1 or 2; found {p}")
        if p == 1:
            norm = bb.emit(relax.op.sum(bb.emit(relax.op.abs(x)), axis=[axis], keepdims=True))
        else:
            norm = bb.emit(relax.op.sqrt(bb.emit(relax.op.sum(bb.emit(relax.op.multiply(x, x)), axis=[axis],
                                                              keepdims=True))))
        return bb.emit(relax.op.divide(x, norm))


class Col2Im(_onnx_frontend.OnnxOpConverter):
    """ONNX Col2Im (torch's ``nn.Fold`` exports it): the blocks of ``input`` [N, C * kh * kw, L] summed into an
    [N, C, H, W] image. Each of the C groups of kh * kw input channels holds one offset of the block per channel, so
    the op is a transposed convolution of the [N, C * kh * kw, out_h, out_w] view with C groups and one-hot
    kernels (channel k of a group puts its value at offset k of the block): the strides, padding and dilation are
    the transposed convolution's, and overlapping blocks add up as Col2Im's do."""

    @classmethod
    def _impl_v18(cls, bb, inputs, attr, params):
        where = _where("Col2Im", attr)
        image, block = (constant_value(inputs[k], params) for k in (1, 2))
        if image is None or block is None or image.size != 2 or block.size != 2:
            raise UnsupportedOpError(f"{where}: image_shape and block_shape must be constant pairs (2-D images); "
                                     "found other. Fold a 2-D image, or compute the op outside the model")
        (height, width), (kh, kw) = (int(v) for v in image.reshape(-1)), (int(v) for v in block.reshape(-1))
        dilation = [int(v) for v in attr.get("dilations", [1, 1])]
        stride = [int(v) for v in attr.get("strides", [1, 1])]
        pads = [int(v) for v in attr.get("pads", [0, 0, 0, 0])]
        batch, channels_blocks, positions = _shape(inputs[0], "the input", where)
        spans = [dilation[0] * (kh - 1) + 1, dilation[1] * (kw - 1) + 1]
        out = [(size + pads[a] + pads[a + 2] - spans[a]) // stride[a] + 1 for a, size in enumerate((height, width))]
        if channels_blocks % (kh * kw) or out[0] * out[1] != positions or min(out) < 1:
            raise UnsupportedOpError(f"{where}: the input must be [N, C * {kh * kw}, {max(out[0], 0) * max(out[1], 0)}]"
                                     f" for a {height}x{width} image of {kh}x{kw} blocks; found "
                                     f"{[batch, channels_blocks, positions]}")
        channels, dtype = channels_blocks // (kh * kw), str(inputs[0].ty.dtype)
        one_hot = np.zeros((channels_blocks, 1, kh, kw), dtype)
        offsets = np.arange(channels_blocks) % (kh * kw)
        one_hot[np.arange(channels_blocks), 0, offsets // kw, offsets % kw] = 1
        # what the transposed convolution covers short of the image (a last partial stride) is output padding
        covered = [(out[a] - 1) * stride[a] + spans[a] - pads[a] - pads[a + 2] for a in range(2)]
        grid = bb.emit(relax.op.reshape(inputs[0], [batch, channels_blocks, out[0], out[1]]))
        return bb.emit(relax.op.nn.conv2d_transpose(
            grid, relax.const(one_hot), strides=stride, padding=pads, dilation=dilation, groups=channels,
            output_padding=[height - covered[0], width - covered[1]], kernel_layout="IOHW"))


@functools.lru_cache(maxsize=None)      # one subclass per TVM class, not one per node converted (wrap_impls)
def _is_inf_by_sign(is_inf: type) -> type:
    """TVM's IsInf converter ignores ``detect_positive``/``detect_negative`` (an IsInf(detect_positive=0) flagged
    +inf too): only the infinities of the signs asked for count."""

    class IsInfBySign(is_inf):
        @classmethod
        def _impl_v10(cls, bb, inputs, attr, params):
            found = bb.emit(relax.op.isinf(inputs[0]))
            positive, negative = int(attr.get("detect_positive", 1)), int(attr.get("detect_negative", 1))
            if positive and negative:
                return found
            zero = relax.const(0, str(inputs[0].ty.dtype))
            if not (positive or negative):
                return bb.emit(relax.op.logical_and(found, relax.op.logical_not(found)))
            sign = relax.op.greater(inputs[0], zero) if positive else relax.op.less(inputs[0], zero)
            return bb.emit(relax.op.logical_and(found, bb.emit(sign)))

    return IsInfBySign


# TVM converters that build float32 constants whatever the input's dtype, so a float16 input failed ("Binary
# operators must have the same datatype")
FLOAT32_CONSTANT_OP_TYPES = ("Elu", "Selu", "LRN")


def _half_through_float32(converter: type) -> type:
    """``converter`` applied to a float16 input in float32 (cast in, result cast back), as onnxruntime's CPU
    kernels compute float16 ops; other dtypes pass as they are."""
    return wrap_impls(converter, _in_float32)


def _in_float32(parent_impl: Any, bb: relax.BlockBuilder, inputs: Sequence[Any], attr: dict, params: Any) -> Any:
    if str(getattr(getattr(inputs[0], "ty", None), "dtype", "")) != "float16":
        return parent_impl(bb, inputs, attr, params)
    wide = [bb.emit(relax.op.astype(inputs[0], "float32")), *inputs[1:]]
    return bb.emit(relax.op.astype(bb.normalize(parent_impl(bb, wide, attr, params)), "float16"))


@functools.lru_cache(maxsize=None)
def _pow_of_any_exponent_type(pow_converter: type) -> type:
    """ONNX Pow takes an exponent of another numeric type than the base (``x ** 3`` with an int64 3); TVM's
    converter requires one dtype: the exponent is cast to the base's type (onnxruntime computes it so)."""

    class PowOfAnyExponentType(pow_converter):
        @classmethod
        def _impl_v7(cls, bb, inputs, attr, params):
            base, exponent = inputs[0], inputs[1]
            base_type, exponent_type = (getattr(getattr(v, "ty", None), "dtype", None) for v in (base, exponent))
            if base_type is not None and exponent_type is not None and str(base_type) != str(exponent_type):
                inputs = [base, bb.emit(relax.op.astype(exponent, str(base_type)))]
            return super()._impl_v7(bb, inputs, attr, params)

    return PowOfAnyExponentType


_CONVERTERS = {"STFT": Stft, "DFT": Dft, "ReverseSequence": ReverseSequence, "Celu": Celu,
               "LpNormalization": LpNormalization, "Col2Im": Col2Im, "Det": Det, "CenterCropPad": CenterCropPad,
               "MultiHeadAttention": MultiHeadAttention, "GroupQueryAttention": GroupQueryAttention,
               "RotaryEmbedding": RotaryEmbedding, "DynamicQuantizeLSTM": DynamicQuantizeLSTM,
               **QUANTIZED_CONVERTERS}
CONVERTED_OP_TYPES: Sequence[str] = (*_CONVERTERS, *CONTRIB_CONVERTERS)



@functools.lru_cache(maxsize=None)       # one subclass per TVM class, not one per node converted
def install_onnx_converters() -> None:
    """Register this module's converters with the Relax ONNX frontend (idempotent); TVM's own, where it has one,
    stays in use."""
    def add_ours(convert_map: dict) -> None:
        for op_type, converter in _CONVERTERS.items():
            convert_map.setdefault(op_type, converter)
        for op_type, converter in CONTRIB_CONVERTERS.items():
            if op_type in OVERRIDDEN_OP_TYPES:
                convert_map[op_type] = converter
            else:
                convert_map.setdefault(op_type, converter)
        convert_map["Attention"] = Attention      # the ONNX op of opset 23 on, or onnxruntime's contrib op
        if "Conv" in convert_map:                 # onnxruntime's fusions, as a model it optimized saves them
            convert_map.setdefault("FusedConv", fused_conv(convert_map["Conv"]))
        if "Gemm" in convert_map:
            convert_map.setdefault("FusedGemm", fused_gemm(convert_map["Gemm"]))
        if "Resize" in convert_map:
            convert_map["Resize"] = checked_resize(convert_map["Resize"])
        if "MaxPool" in convert_map:
            convert_map["MaxPool"] = pool_with_explicit_pads(max_pool_with_indices(convert_map["MaxPool"]))
        for op_type in FLOAT32_CONSTANT_OP_TYPES:
            if op_type in convert_map:
                convert_map[op_type] = _half_through_float32(convert_map[op_type])
        if "IsInf" in convert_map:
            convert_map["IsInf"] = _is_inf_by_sign(convert_map["IsInf"])
        if "Pow" in convert_map:
            convert_map["Pow"] = _pow_of_any_exponent_type(convert_map["Pow"])
        if "LayerNormalization" in convert_map:
            convert_map["LayerNormalization"] = layer_norm_with_statistics(convert_map["LayerNormalization"])
        if "ConvTranspose" in convert_map:
            convert_map["ConvTranspose"] = conv_transpose_with_output_shape(convert_map["ConvTranspose"])

    if wrap_convert_map("converters", add_ours):
        logger.debug("registered ONNX converters for %s", ", ".join(_CONVERTERS))
