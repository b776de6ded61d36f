"""ONNX ``Resize`` where TVM 0.27's converter gets it wrong or refuses it: scales that do not give whole output
lengths, opset 18's ``axes`` and ``keep_aspect_ratio_policy``, and ``antialias``.

TVM's ``resize2d`` takes output sizes, not scales, and maps output to input coordinates with ``in / out``. ONNX maps
them with the scale given (``x_in = (x_out + 0.5) / scale - 0.5`` for ``half_pixel``), and the output length is
``floor(in * scale)``: where ``in * scale`` is not whole (a 0.5 scale of 7 rows, a 1.5 scale of 7 columns) the two
differ, and TVM's result was silently off -- by up to 2.9 on N(0, 1) inputs, in every coordinate mode but
``align_corners``, for nearest, linear and cubic resizes alike (of 88 cases probed against onnxruntime, 41 with such
a scale were wrong; 16 more were refused: the opset-19 ``half_pixel_symmetric`` mode and the opset-18 ``axes`` and
``keep_aspect_ratio_policy``, computed here too). :func:`checked_resize` wraps TVM's converter: such a resize (or
one with ``axes``, an aspect-ratio policy or ``half_pixel_symmetric``) is computed here, axis by axis -- each output
position's source rows (nearest: one, linear: two, cubic: four) gathered with constant indices and weighed with
constant weights computed in numpy by ONNX's formulas -- and everything else is left to TVM.
A shrinking resize with ``antialias=1`` (torch's ``interpolate(..., antialias=True)``), which TVM computes without
its filter (a result 66% of its range from onnxruntime's), is refused with the fix.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from tvm import relax

from hetpart.errors import UnsupportedOpError
from tvm_passes.onnx_nodes import constant_value, wrap_impls
from tvm_passes.onnx_nodes import node_label as _where

__all__ = ["checked_resize", "source_weights"]

# coordinate modes computed here; TVM refuses half_pixel_symmetric (opset 19), so it is always computed here
SCALED_MODES = frozenset({"half_pixel", "pytorch_half_pixel", "asymmetric", "tf_half_pixel_for_nn", "align_corners",
                          "half_pixel_symmetric"})


def _attr(attr: dict, name: str, default: Any) -> Any:
    value = attr.get(name, default)
    return value.decode() if isinstance(value, bytes) else value


def source_coordinates(out_length: int, in_length: int, scale: float, mode: str) -> np.ndarray:
    """The input coordinate of each output position along one axis (ONNX Resize's coordinate_transformation_mode),
    in float32 as onnxruntime computes it."""
    x = np.arange(out_length, dtype=np.float32)
    scale = np.float32(scale)
    if mode == "align_corners":
        ratio = np.float32(0.0 if out_length == 1 else (in_length - 1) / (out_length - 1))
        return x * ratio
    if mode == "asymmetric":
        return x / scale
    if mode == "tf_half_pixel_for_nn":
        return (x + np.float32(0.5)) / scale
    if mode == "pytorch_half_pixel" and out_length == 1:
        return np.zeros(1, np.float32)
    if mode == "half_pixel_symmetric":     # half_pixel, shifted so the whole output stays centred on the input
        adjustment = np.float32(out_length) / (np.float32(in_length) * scale)
        offset = np.float32(in_length) / np.float32(2) * (np.float32(1) - adjustment)
        return offset + (x + np.float32(0.5)) / scale - np.float32(0.5)
    return (x + np.float32(0.5)) / scale - np.float32(0.5)


def _nearest(x: np.ndarray, rounding: str) -> np.ndarray:
    if rounding == "floor":
        return np.floor(x)
    if rounding == "ceil":
        return np.ceil(x)
    half = (x - np.floor(x)) == 0.5
    tie = np.floor(x) if rounding == "round_prefer_floor" else np.ceil(x)
    return np.where(half, tie, np.round(x))


def _cubic(t: np.ndarray, a: float) -> np.ndarray:
    t = np.abs(t)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def source_weights(out_length: int, in_length: int, scale: float, attr: dict) -> tuple[np.ndarray, np.ndarray]:
    """(indices [out, taps], weights [out, taps]): the input positions each output position reads along one axis
    and their weights, by ONNX's formulas for the node's mode (nearest: 1 tap, linear: 2, cubic: 4)."""
    mode = _attr(attr, "mode", "nearest")
    x = source_coordinates(out_length, in_length, scale, _attr(attr, "coordinate_transformation_mode", "half_pixel"))
    last = in_length - 1
    if mode == "nearest":
        index = np.clip(_nearest(x, _attr(attr, "nearest_mode", "round_prefer_floor")), 0, last)
        return index.astype(np.int64)[:, None], np.ones((out_length, 1), np.float64)
    if mode == "linear":
        x = np.clip(x, 0, last).astype(np.float64)
        low = np.floor(x)
        high = np.minimum(low + 1, last)
        frac = x - low
        return np.stack([low, high], 1).astype(np.int64), np.stack([1 - frac, frac], 1)
    if mode == "cubic":
        x = x.astype(np.float64)
        base = np.floor(x)
        taps = base[:, None] + np.arange(-1, 3)[None, :]
        weights = _cubic(x[:, None] - taps, float(_attr(attr, "cubic_coeff_a", -0.75)))
        if int(_attr(attr, "exclude_outside", 0)):
            weights = np.where((taps < 0) | (taps > last), 0.0, weights)
            weights = weights / weights.sum(1, keepdims=True)
        return np.clip(taps, 0, last).astype(np.int64), weights
    raise UnsupportedOpError(f"{_where('Resize', attr)}: mode must be nearest, linear or cubic; found {mode!r}")


def _resize_axis(bb: relax.BlockBuilder, x: relax.Expr, axis: int, out_length: int, scale: float,
                 attr: dict) -> relax.Expr:
    dims = [int(d) for d in x.ty.shape.values]
    index, weights = source_weights(out_length, dims[axis], scale, attr)
    dtype = str(x.ty.dtype)
    broadcast = [out_length] + [1] * (len(dims) - axis - 1)
    total = None
    for tap in range(index.shape[1]):
        rows = bb.emit(relax.op.take(x, relax.const(index[:, tap]), axis=axis))
        if index.shape[1] > 1:
            rows = bb.emit(relax.op.multiply(rows, relax.const(weights[:, tap].reshape(broadcast).astype(dtype))))
        total = rows if total is None else bb.emit(relax.op.add(total, rows))
    return total


def _plan_tvm_gets_wrong(inputs: Sequence[Any], attr: dict, params: Any) -> list[tuple[float, int]] | None:
    """Per axis (scale, output length) of a resize TVM would compute wrong or refuse, else None: constant scales
    whose ``in * scale`` is not whole on some axis, or (opset 18) scales or sizes given for some ``axes`` only, or
    sizes with a ``keep_aspect_ratio_policy`` (one scale for every axis: the smallest or largest size / in)."""
    if _attr(attr, "mode", "nearest") not in ("nearest", "linear", "cubic") \
            or _attr(attr, "coordinate_transformation_mode", "half_pixel") not in SCALED_MODES:
        return None
    scales, sizes = (constant_value(inputs[k], params) if len(inputs) > k and inputs[k] is not None else None
                     for k in (2, 3))
    scales = scales if scales is not None and scales.size else None
    sizes = sizes if sizes is not None and sizes.size else None
    try:
        dims = [int(d) for d in inputs[0].ty.shape.values]
    except (TypeError, ValueError, AttributeError):
        return None
    axes = [int(a) % len(dims) for a in attr.get("axes", range(len(dims)))]
    policy = _attr(attr, "keep_aspect_ratio_policy", "stretch")
    if (scales is None) == (sizes is None) or (scales if scales is not None else sizes).size != len(axes):
        return None
    plan = [(1.0, d) for d in dims]
    if scales is not None:
        for axis, scale in zip(axes, scales.astype(np.float32).reshape(-1)):
            plan[axis] = (float(scale), int(np.floor(np.float32(dims[axis]) * scale)))
        wrong = any(float(np.float32(dims[a]) * np.float32(plan[a][0])) != plan[a][1] for a in axes)
    else:
        wanted = [int(v) for v in sizes.reshape(-1)]
        ratios = [np.float32(n) / np.float32(dims[a]) for a, n in zip(axes, wanted)]
        if policy in ("not_larger", "not_smaller"):
            common = min(ratios) if policy == "not_larger" else max(ratios)
            for axis in axes:
                plan[axis] = (float(common), int(np.round(np.float32(dims[axis]) * common)))
        else:
            for axis, n, ratio in zip(axes, wanted, ratios):
                plan[axis] = (float(ratio), n)
        wrong = False
    symmetric = _attr(attr, "coordinate_transformation_mode", "half_pixel") == "half_pixel_symmetric"
    return plan if wrong or symmetric or "axes" in attr or policy != "stretch" else None


def checked_resize(resize: type) -> type:
    """TVM's Resize converter with the cases it gets wrong computed here or refused (see the module's doc)."""
    return wrap_impls(resize, _resize)


def _resize(parent_impl: Any, bb: relax.BlockBuilder, inputs: Sequence[Any], attr: dict, params: Any) -> Any:
    if int(attr.get("antialias", 0)) and _resize_may_shrink(inputs, params):
        raise UnsupportedOpError(
            f"{_where('Resize', attr)}: antialias=1 on a resize that shrinks an axis is not supported "
            "(TVM's resize has no antialiasing filter); export the model with antialias=False")
    plan = _plan_tvm_gets_wrong(inputs, attr, params)
    if plan is None:
        return parent_impl(bb, inputs, attr, params)
    x = inputs[0]
    dims = [int(d) for d in x.ty.shape.values]
    for axis, (length, (scale, out_length)) in enumerate(zip(dims, plan)):
        if out_length < 1:
            raise UnsupportedOpError(f"{_where('Resize', attr)}: scale {scale} leaves axis {axis} of length "
                                     f"{length} empty")
        if scale != 1 or out_length != length:
            x = _resize_axis(bb, x, axis, out_length, float(scale), attr)
    return x


def _resize_may_shrink(inputs: Sequence[Any], params: Any) -> bool:
    """Whether a Resize may make an axis shorter: a scale below 1 or a size below the input's (unknown: True)."""
    scales = constant_value(inputs[2], params) if len(inputs) > 2 and inputs[2] is not None else None
    sizes = constant_value(inputs[3], params) if len(inputs) > 3 and inputs[3] is not None else None
    if scales is not None and scales.size:
        return bool(np.any(scales < 1.0))
    if sizes is not None and sizes.size:
        try:
            dims = [int(d) for d in inputs[0].ty.shape.values]
        except (TypeError, ValueError):
            return True
        return bool(np.any(sizes.reshape(-1)[-len(dims):] < np.array(dims)[-sizes.size:]))
    return True
