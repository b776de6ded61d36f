"""ONNX MaxPool with its second output, the indices of the maxima (SegNet-style decoders feed them to MaxUnpool),
which TVM 0.27's MaxPool converter does not produce ("Missing outputs during conversion").

With indices asked for, a 2-D MaxPool is computed from the kernel's shifted strided views of the input padded with
-inf: the values are their maximum and the indices the position of the first maximum in the window (row-major over
the kernel, as onnxruntime picks among equals), flattened over the input as ``storage_order`` says. Without
indices, or for other ranks without them, TVM's converter runs unchanged. Tests against onnxruntime:
``tests/tvm_passes/test_onnx_converters.py``.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from tvm import relax

from hetpart.errors import UnsupportedOpError
from tvm_passes.onnx_nodes import node_label, wrap_impls

__all__ = ["max_pool_with_indices"]


def _output_length(length: int, kernel: int, stride: int, dilation: int, pad_begin: int, pad_end: int,
                   ceil_mode: bool) -> int:
    span = (kernel - 1) * dilation + 1
    count = (length + pad_begin + pad_end - span) / stride + 1
    out = math.ceil(count) if ceil_mode else math.floor(count)
    if ceil_mode and (out - 1) * stride >= length + pad_begin:      # a last window starting in the end padding
        out -= 1
    return out


def _pool_with_indices(bb: relax.BlockBuilder, x: relax.Expr, attr: dict) -> relax.Expr:
    where = node_label("MaxPool", attr)
    dims = [int(d) for d in x.ty.shape.values]
    if len(dims) != 4:
        raise UnsupportedOpError(f"{where}: MaxPool with indices is supported for 2-D pooling (NCHW); found rank "
                                 f"{len(dims)}")
    auto_pad = attr.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
    if auto_pad not in ("NOTSET", "VALID"):
        raise UnsupportedOpError(f"{where}: auto_pad={auto_pad} with indices is not supported; give explicit pads")
    n, c, h, w = dims
    kh, kw = (int(k) for k in attr["kernel_shape"])
    sh, sw = (int(s) for s in attr.get("strides", [1, 1]))
    dh, dw = (int(d) for d in attr.get("dilations", [1, 1]))
    pt, pl, pb, pr = (int(p) for p in attr.get("pads", [0, 0, 0, 0])) if auto_pad == "NOTSET" else (0, 0, 0, 0)
    ceil_mode = bool(int(attr.get("ceil_mode", 0)))
    oh = _output_length(h, kh, sh, dh, pt, pb, ceil_mode)
    ow = _output_length(w, kw, sw, dw, pl, pr, ceil_mode)
    # pad so that every window of the output lies inside (ceil mode may reach past the given end padding)
    extra_h = max(0, (oh - 1) * sh + (kh - 1) * dh + 1 - (h + pt + pb))
    extra_w = max(0, (ow - 1) * sw + (kw - 1) * dw + 1 - (w + pl + pr))
    padded = bb.emit(relax.op.nn.pad(x, [0, 0, 0, 0, pt, pb + extra_h, pl, pr + extra_w], pad_mode="constant",
                                     pad_value=float("-inf")))
    views = []
    for i in range(kh):
        for j in range(kw):
            views.append(bb.emit(relax.op.strided_slice(
                padded, axes=[2, 3], begin=[i * dh, j * dw],
                end=[i * dh + (oh - 1) * sh + 1, j * dw + (ow - 1) * sw + 1], strides=[sh, sw])))
    stacked = bb.emit(relax.op.stack(views, axis=4))                          # [n, c, oh, ow, kh * kw]
    values = bb.emit(relax.op.max(stacked, axis=[4]))
    offset = bb.emit(relax.op.astype(bb.emit(relax.op.argmax(stacked, axis=4)), "int64"))
    row = relax.const((np.arange(oh) * sh - pt).reshape(1, 1, oh, 1), "int64")
    col = relax.const((np.arange(ow) * sw - pl).reshape(1, 1, 1, ow), "int64")
    in_h = bb.emit(relax.op.add(row, bb.emit(relax.op.multiply(
        bb.emit(relax.op.floor_divide(offset, relax.const(kw, "int64"))), relax.const(dh, "int64")))))
    in_w = bb.emit(relax.op.add(col, bb.emit(relax.op.multiply(
        bb.emit(relax.op.floor_mod(offset, relax.const(kw, "int64"))), relax.const(dw, "int64")))))
    plane = relax.const((np.arange(n * c) * h * w).reshape(n, c, 1, 1), "int64")
    if int(attr.get("storage_order", 0)):              # column major: w before h within a plane
        within = bb.emit(relax.op.add(bb.emit(relax.op.multiply(in_w, relax.const(h, "int64"))), in_h))
    else:
        within = bb.emit(relax.op.add(bb.emit(relax.op.multiply(in_h, relax.const(w, "int64"))), in_w))
    indices = bb.emit(relax.op.add(plane, within))
    return relax.Tuple([values, indices])


def max_pool_with_indices(max_pool: type) -> type:
    """TVM's MaxPool converter class, extended with the indices output when the node asks for it."""
    return wrap_impls(max_pool, _with_indices)


def _with_indices(parent_impl: Any, bb: relax.BlockBuilder, inputs: Any, attr: dict, params: Any) -> Any:
    if int(attr.get("tvm_custom", {}).get("num_outputs", 1)) > 1:
        return _pool_with_indices(bb, inputs[0], attr)
    return parent_impl(bb, inputs, attr, params)
