"""Which bindings of a Relax function are ops: the one definition that op ids rest on.

Op id i is the i-th binding of ``main`` whose value calls a ``tvm.ir.Op``, walking the blocks in order.
:mod:`tvm_passes.extract` numbers the OpGraph's nodes by it and :mod:`tvm_passes.annotate` places them by it, so
both import it from here (analysis does not depend on the annotation pass).
"""
from __future__ import annotations

import tvm
from tvm import relax


def op_bindings(func: relax.Function) -> list[relax.VarBinding]:
    """The op bindings of ``func`` in op-id order: op id i is the i-th binding, walking the blocks in order,
    whose value is a ``relax.Call`` to a ``tvm.ir.Op``. This is the single definition of the contract."""
    found: list[relax.VarBinding] = []
    for block in func.body.blocks:
        for binding in block.bindings:
            if (isinstance(binding, relax.VarBinding) and isinstance(binding.value, relax.Call)
                    and isinstance(binding.value.op, tvm.ir.Op)):
                found.append(binding)
    return found


def _has_symbolic_dims(ty: relax.Type) -> bool:
    if isinstance(ty, relax.TupleType):
        return any(_has_symbolic_dims(field) for field in ty.fields)
    shape = getattr(ty, "shape", None)
    if not isinstance(ty, relax.TensorType) or shape is None:
        return isinstance(ty, relax.TensorType) and ty.ndim == -1       # a tensor of unknown rank
    return any(not isinstance(dim, tvm.tirx.IntImm) for dim in shape.values)


def first_data_dependent_binding(func: relax.Function) -> relax.VarBinding | None:
    """The first binding of ``func`` whose result has a symbolic or unknown shape while ``func``'s parameters are
    all static: its size depends on the input *values* (ONNX NonZero, NonMaxSuppression, Unique, ...); None if
    every shape is static (or a parameter is symbolic: then the input shapes are what is missing)."""
    if any(_has_symbolic_dims(p.ty) for p in func.params):
        return None
    for block in func.body.blocks:
        for binding in block.bindings:
            if _has_symbolic_dims(binding.var.ty):
                return binding
    return None
