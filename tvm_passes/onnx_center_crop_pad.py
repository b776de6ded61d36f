"""ONNX ``CenterCropPad`` (opset 18; image pre-processing folded into a model), which TVM 0.27's importer lacks.

Each axis named by ``axes`` (all axes by default) is brought to its length in ``shape``: a longer axis is cropped
around its centre, the first ``(length - target) // 2`` entries dropped; a shorter one is zero-padded around it,
``(target - length) // 2`` zeros before, the rest after -- onnxruntime's and the ONNX reference's rounding. Shapes are
static here, so the op is one strided slice and one constant pad. Registered by
:func:`tvm_passes.onnx_converters.install_onnx_converters`; tested against onnxruntime in
``tests/tvm_passes/test_onnx_op_forms.py``."""
from __future__ import annotations

from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _onnx_frontend

from hetpart.errors import UnsupportedOpError
from tvm_passes.onnx_nodes import constant_value, node_label

__all__ = ["CenterCropPad"]


class CenterCropPad(_onnx_frontend.OnnxOpConverter):
    """ONNX CenterCropPad: crop or zero-pad the named axes to ``shape`` around their centres."""

    @classmethod
    def _impl_v18(cls, bb, inputs, attr, params):
        where = node_label("CenterCropPad", attr)
        x = inputs[0]
        target = constant_value(inputs[1], params)
        try:
            lengths = [int(d) for d in x.ty.shape.values]
        except (TypeError, ValueError, AttributeError):
            lengths = None
        if target is None or lengths is None:
            raise UnsupportedOpError(f"{where}: the input's shape and the target shape must be known when the model "
                                     "is imported; found one computed at run time. Give the input shapes "
                                     "(--input-shape) and a constant target shape")
        rank = len(lengths)
        axes = [int(a) % rank for a in attr.get("axes", range(rank))]
        target = [int(v) for v in target.reshape(-1)]
        if len(target) != len(axes) or len(set(axes)) != len(axes) or min(target, default=0) < 0:
            raise UnsupportedOpError(f"{where}: shape must hold one non-negative length per axis of {axes}; found "
                                     f"{target}. Fix the node's shape input")
        begin, end = [0] * rank, list(lengths)
        pad_before, pad_after = [0] * rank, [0] * rank
        for axis, length in zip(axes, target):
            excess = lengths[axis] - length
            if excess > 0:
                begin[axis], end[axis] = excess // 2, excess // 2 + length
            elif excess < 0:
                pad_before[axis] = -excess // 2
                pad_after[axis] = -excess - pad_before[axis]
        if begin != [0] * rank or end != lengths:
            x = bb.emit(relax.op.strided_slice(x, axes=list(range(rank)), begin=begin, end=end))
        if any(pad_before) or any(pad_after):
            widths = [w for pair in zip(pad_before, pad_after) for w in pair]
            x = bb.emit(relax.op.nn.pad(x, widths, pad_mode="constant", pad_value=0.0))
        return x
