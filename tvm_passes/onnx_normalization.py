"""ONNX ``LayerNormalization`` with its two statistics outputs. TVM 0.27's converter returns the normalized tensor
and two float32 scalar zeros for ``Mean`` and ``InvStdDev``, so a model that reads them (training exports, models
that re-use the statistics downstream) computed wrong values without a word. The wrapper keeps TVM's normalization
and computes the statistics as ONNX defines them: over the axes from ``axis`` on, kept as size-1 axes, in
``stash_type`` (float32 by default, whatever the input's type). A model that does not read them loses them to dead
code elimination, so its kernels are unchanged. Registered by
:func:`tvm_passes.onnx_converters.install_onnx_converters`; tests against onnxruntime in
``tests/tvm_passes/test_onnx_op_forms.py``."""
from __future__ import annotations

from typing import Any, Sequence

from tvm import relax

from hetpart.errors import UnsupportedOpError
from tvm_passes.onnx_nodes import node_label, wrap_impls

__all__ = ["layer_norm_with_statistics"]

# ONNX TensorProto codes of the stash types a LayerNormalization may name
_STASH_DTYPES = {1: "float32", 10: "float16", 11: "float64", 16: "bfloat16"}


def layer_norm_with_statistics(converter: type) -> type:
    """TVM's LayerNormalization converter class ``converter`` with real ``Mean`` and ``InvStdDev`` outputs."""
    return wrap_impls(converter, _with_statistics)


def _with_statistics(parent_impl: Any, bb: relax.BlockBuilder, inputs: Sequence[Any], attr: dict, params: Any) -> Any:
    normalized = bb.normalize(parent_impl(bb, inputs, attr, params))
    if not isinstance(normalized, relax.Tuple):                  # a TVM whose converter returns the output alone
        normalized = relax.Tuple([normalized])
    x = inputs[0]
    rank = x.ty.ndim
    axis = int(attr.get("axis", -1))
    stash = int(attr.get("stash_type", 1))
    if stash not in _STASH_DTYPES:
        raise UnsupportedOpError(f"{node_label('LayerNormalization', attr)}: stash_type must be one of "
                                 f"{sorted(_STASH_DTYPES)} (a float type); found {stash}. Re-export the model")
    dtype = _STASH_DTYPES[stash]
    axes = list(range(axis % rank, rank))
    wide = x if str(x.ty.dtype) == dtype else bb.emit(relax.op.astype(x, dtype))
    mean = bb.emit(relax.op.mean(wide, axis=axes, keepdims=True))
    centred = bb.emit(relax.op.subtract(wide, mean))
    variance = bb.emit(relax.op.mean(bb.emit(relax.op.multiply(centred, centred)), axis=axes, keepdims=True))
    epsilon = relax.const(float(attr.get("epsilon", 1e-5)), dtype)
    inverse_std = bb.emit(relax.op.rsqrt(bb.emit(relax.op.add(variance, epsilon))))
    return relax.Tuple([normalized.fields[0], mean, inverse_std])
