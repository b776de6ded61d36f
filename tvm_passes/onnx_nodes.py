"""Small helpers shared by hetpart's ONNX converters (:mod:`tvm_passes.rnn`, :mod:`tvm_passes.onnx_converters`,
:mod:`tvm_passes.onnx_contrib`, :mod:`tvm_passes.onnx_quantized`, :mod:`tvm_passes.onnx_pooling`): how a node is
named in an error, the value of a constant input, and registering converters with TVM's importer."""
from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _onnx_frontend

__all__ = ["constant_value", "node_label", "wrap_convert_map"]


def node_label(op_type: str, attrs: dict) -> str:
    """``"<op_type> node '<name>'"`` for an error message, from the node name TVM's importer passes in ``attrs``."""
    return f"{op_type} node '{attrs.get('tvm_custom', {}).get('name', '') or '<unnamed>'}'"


def constant_value(expr: relax.Expr | None, params: Any) -> np.ndarray | None:
    """The value of a constant or of a parameter kept as a function input, else None."""
    if isinstance(expr, tvm.ir.expr.Constant):
        return expr.value.numpy()
    if isinstance(expr, relax.Var) and params is not None and len(params) > 1:
        entry = params[1].get(expr.name)
        if entry is not None and entry[0].same_as(expr):
            return entry[1].numpy()
    return None


def wrap_convert_map(label: str, update: Any) -> bool:
    """Wrap ``onnx_frontend._get_convert_map`` so that ``update(convert_map)`` edits every map it returns, once per
    ``label`` however often it is called (the wrappers record the labels installed below them); True when it
    wrapped now."""
    current = _onnx_frontend._get_convert_map
    installed = frozenset(getattr(current, "_hetpart_installed", ()))
    if label in installed:
        return False

    def convert_map():
        found = dict(current())
        update(found)
        return found

    convert_map._hetpart_installed = installed | {label}
    _onnx_frontend._get_convert_map = convert_map
    return True
