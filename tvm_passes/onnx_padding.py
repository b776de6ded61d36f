"""Padding attributes TVM 0.27's ONNX converters compute wrong, made explicit before they see them.

- ``MaxPool`` with ``auto_pad="SAME_LOWER"``: TVM sizes the output ``floor(in / stride)`` where ONNX (and
  onnxruntime) make it ``ceil(in / stride)`` for both SAME modes, so a strided pool over an odd length lost its last
  output column (a [2, 3, 4, 5] input pooled 3x2 with stride 2 gave [2, 3, 2, 2] for onnxruntime's [2, 3, 2, 3]).
- ``ConvTranspose`` with ``output_shape``: TVM ignores the attribute, so the output kept its natural size (9 x 11
  where the node asked for 9 x 10).

:func:`pool_with_explicit_pads` and :func:`conv_transpose_with_output_shape` wrap those converters: they compute
the padding by the ONNX formulas from the input's static shape and hand the converter plain ``pads`` (and
``output_padding``) with ``auto_pad="NOTSET"``.
"""
from __future__ import annotations

import math
from typing import Any

from tvm_passes.onnx_nodes import wrap_impls

__all__ = ["conv_transpose_with_output_shape", "pool_with_explicit_pads"]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _spatial_dims(expr: Any) -> list[int] | None:
    try:
        return [int(d) for d in expr.ty.shape.values[2:]]
    except (TypeError, ValueError, AttributeError):
        return None


def same_pads(lengths: list[int], kernel: list[int], strides: list[int], dilations: list[int],
              lower: bool) -> list[int]:
    """ONNX's SAME padding (``pads`` layout: all begins, then all ends): outputs ``ceil(in / stride)``, the total
    padding split evenly with the odd one at the end (SAME_UPPER) or the beginning (SAME_LOWER)."""
    begins, ends = [], []
    for length, k, s, d in zip(lengths, kernel, strides, dilations):
        total = max((math.ceil(length / s) - 1) * s + (k - 1) * d + 1 - length, 0)
        small = total // 2
        begins.append(total - small if lower else small)
        ends.append(small if lower else total - small)
    return begins + ends


def _pool_attrs(inputs: list, attr: dict) -> dict:
    mode = _text(attr.get("auto_pad", "NOTSET"))
    lengths = _spatial_dims(inputs[0])
    if mode not in ("SAME_UPPER", "SAME_LOWER") or lengths is None:
        return attr
    n = len(lengths)
    kernel = [int(k) for k in attr["kernel_shape"]]
    strides = [int(s) for s in attr.get("strides", [1] * n)]
    dilations = [int(d) for d in attr.get("dilations", [1] * n)]
    return {**attr, "auto_pad": b"NOTSET",
            "pads": same_pads(lengths, kernel, strides, dilations, lower=mode == "SAME_LOWER")}


def pool_with_explicit_pads(pool: type) -> type:
    """A pool converter given explicit ``pads`` for ``auto_pad`` SAME_UPPER/SAME_LOWER (see the module's doc)."""
    return wrap_impls(pool, _pool)


def _pool(parent_impl: Any, bb: Any, inputs: list, attr: dict, params: Any) -> Any:
    return parent_impl(bb, inputs, _pool_attrs(inputs, attr), params)


def _conv_transpose_attrs(inputs: list, attr: dict) -> dict:
    lengths = _spatial_dims(inputs[0])
    if "output_shape" not in attr or lengths is None:
        return attr
    n = len(lengths)
    wanted = [int(v) for v in attr["output_shape"]][-n:]
    kernel = [int(k) for k in attr["kernel_shape"]] if "kernel_shape" in attr else \
        [int(k) for k in inputs[1].ty.shape.values[2:]]
    strides = [int(s) for s in attr.get("strides", [1] * n)]
    dilations = [int(d) for d in attr.get("dilations", [1] * n)]
    extra = [int(p) for p in attr.get("output_padding", [0] * n)]
    upper = _text(attr.get("auto_pad", "NOTSET")) == "SAME_UPPER"
    begins, ends, output_padding = [], [], []
    for length, k, s, d, e, out in zip(lengths, kernel, strides, dilations, extra, wanted):
        total = s * (length - 1) + e + (k - 1) * d + 1 - out
        grow = max(-total, 0)                  # an output longer than the natural one: padding at the end
        total = max(total, 0)
        begins.append(total // 2 if upper else total - total // 2)
        ends.append(total - begins[-1])
        output_padding.append(e + grow)
    rewritten = {k: v for k, v in attr.items() if k != "output_shape"}
    return {**rewritten, "auto_pad": b"NOTSET", "pads": begins + ends, "output_padding": output_padding}


def conv_transpose_with_output_shape(conv_transpose: type) -> type:
    """TVM's ConvTranspose converter honouring ``output_shape`` (see the module's doc)."""
    return wrap_impls(conv_transpose, _conv_transpose)


def _conv_transpose(parent_impl: Any, bb: Any, inputs: list, attr: dict, params: Any) -> Any:
    return parent_impl(bb, inputs, _conv_transpose_attrs(inputs, attr), params)
