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
