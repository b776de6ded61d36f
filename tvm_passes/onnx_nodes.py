"""Small helpers shared by hetpart's ONNX converters (:mod:`tvm_passes.rnn`, :mod:`tvm_passes.onnx_converters`,
:mod:`tvm_passes.onnx_contrib`, :mod:`tvm_passes.onnx_quantized`, :mod:`tvm_passes.onnx_pooling`): how a node is
named in an error, the value of a constant input, registering converters with TVM's importer, and wrapping one of
TVM's converters."""
from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _onnx_frontend

__all__ = ["constant_value", "node_label", "wrap_convert_map", "wrap_impls"]


def static_dims(expr: relax.Expr) -> list[int]:
    """The static shape of a tensor expression (shapes are bound before import) as Python ints."""
    return [int(d) for d in expr.ty.shape.values]


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


# TVM's importer asks for the convert map once per node it converts, and the map's update wraps the converters
# again each time: one subclass per (converter, wrapper), made once, not one per node (178 us a node with six
# wrappers made anew).
@functools.lru_cache(maxsize=None)
def wrap_impls(converter: type, wrapper: Callable[..., Any]) -> type:
    """A subclass of TVM's ONNX converter class ``converter`` whose every ``_impl_v<N>`` calls
    ``wrapper(parent_impl, bb, inputs, attr, params)`` (``parent_impl``: that version of ``converter``), so
    ``get_converter`` still picks among the same versions. ``wrapper`` must be a module-level function (the class
    is cached by it)."""
    def wrapped(parent_impl: Any) -> Any:
        def impl(cls, bb, inputs, attr, params):
            return wrapper(parent_impl, bb, inputs, attr, params)
        return classmethod(impl)

    versions = {k: wrapped(getattr(converter, k)) for k in dir(converter) if k.startswith("_impl_v")}
    return type(converter.__name__, (converter,), {**versions, "__doc__": converter.__doc__})
