"""onnxruntime's fused com.microsoft ops that a model saved by onnxruntime's graph optimizer carries
(``SessionOptions.optimized_model_filepath`` at ``ORT_ENABLE_EXTENDED``: a CNN's Conv + Relu becomes ``FusedConv``):
``FusedConv`` (a Conv, optionally plus the sum input ``Z``, then an activation) and ``FusedGemm`` (a Gemm, then an
activation). Each is TVM's own Conv or Gemm converter followed by the activation, so the kernels are those of the
model before onnxruntime fused it. The activations are MLAS's: Relu, Tanh, Sigmoid, LeakyRelu, Clip and
HardSigmoid; any other is refused naming the node. Registered by
:func:`tvm_passes.onnx_converters.install_onnx_converters`; tested against onnxruntime in
``tests/tvm_passes/test_onnx_fused.py``."""
from __future__ import annotations

from typing import Any, Sequence

from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _onnx_frontend

from hetpart.errors import UnsupportedOpError
from tvm_passes.onnx_nodes import node_label, wrap_impls

__all__ = ["ACTIVATIONS", "fused_conv", "fused_gemm"]

ACTIVATIONS = ("Relu", "Tanh", "Sigmoid", "LeakyRelu", "Clip", "HardSigmoid")
_FUSION_ATTRIBUTES = ("activation", "activation_params", "activation_alpha", "activation_beta", "activation_gamma")


def fused_conv(conv_converter: type) -> type:
    """``FusedConv`` from TVM's ``Conv`` converter class."""
    return wrap_impls(conv_converter, _conv_then_activation)


def fused_gemm(gemm_converter: type) -> type:
    """``FusedGemm`` from TVM's ``Gemm`` converter class."""
    return wrap_impls(gemm_converter, _gemm_then_activation)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _conv_then_activation(parent_impl: Any, bb: relax.BlockBuilder, inputs: Sequence[Any], attr: dict,
                          params: Any) -> relax.Expr:
    _check_activation("FusedConv", attr)
    plain = {k: v for k, v in attr.items() if k not in _FUSION_ATTRIBUTES}
    conv_inputs = _onnx_frontend.onnx_input(list(inputs)[:3])     # reads a missing bias as None
    y = bb.normalize(parent_impl(bb, conv_inputs, plain, params))
    z = inputs[3] if len(inputs) > 3 else None
    if z is not None:
        y = bb.emit(relax.op.add(y, z))
    return _activation(bb, y, attr, [float(p) for p in attr.get("activation_params", [])])


def _gemm_then_activation(parent_impl: Any, bb: relax.BlockBuilder, inputs: Sequence[Any], attr: dict,
                          params: Any) -> relax.Expr:
    _check_activation("FusedGemm", attr)
    plain = {k: v for k, v in attr.items() if k not in _FUSION_ATTRIBUTES}
    y = bb.normalize(parent_impl(bb, inputs, plain, params))
    values = [float(attr[k]) for k in ("activation_alpha", "activation_beta") if k in attr]
    return _activation(bb, y, attr, values)


def _check_activation(op_type: str, attr: dict) -> None:
    name = _text(attr.get("activation", ""))
    if name and name not in ACTIVATIONS:
        raise UnsupportedOpError(f"{node_label(op_type, attr)}: activation must be one of {list(ACTIVATIONS)}; "
                                 f"found {name!r}. Convert the original model, not onnxruntime's optimized one")


def _activation(bb: relax.BlockBuilder, y: relax.Expr, attr: dict, values: list[float]) -> relax.Expr:
    """``y`` through the node's activation; ``values``: its parameters in MLAS's order (alpha / min, beta / max)."""
    name = _text(attr.get("activation", ""))
    dtype = str(y.ty.dtype)

    def value(k: int, default: float) -> relax.Expr:
        return relax.const(values[k] if len(values) > k else default, dtype)

    if name == "Relu":
        return bb.emit(relax.op.nn.relu(y))
    if name == "Tanh":
        return bb.emit(relax.op.tanh(y))
    if name == "Sigmoid":
        return bb.emit(relax.op.sigmoid(y))
    if name == "LeakyRelu":
        return bb.emit(relax.op.where(relax.op.greater_equal(y, relax.const(0.0, dtype)), y,
                                      relax.op.multiply(y, value(0, 0.01))))
    if name == "Clip":
        return bb.emit(relax.op.minimum(relax.op.maximum(y, value(0, float("-inf"))), value(1, float("inf"))))
    if name == "HardSigmoid":
        line = relax.op.add(relax.op.multiply(y, value(0, 0.2)), value(1, 0.5))
        return bb.emit(relax.op.minimum(relax.op.maximum(line, relax.const(0.0, dtype)), relax.const(1.0, dtype)))
    assert not name, name               # _check_activation refused the others
    return y
