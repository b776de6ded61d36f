"""Legalize each distinct op call once: an unrolled recurrence repeats the same few calls thousands of times.

``LegalizeOps`` calls an op's legalization (``call_te`` of a TOPI function, then ``create_prim_func`` and the
builder's structural de-duplication) at every call site, although two calls of one op with the same attributes and
argument types produce the same PrimFunc. A 300-step, 2-layer GRU has 13,500 legalized ops of a few dozen distinct
kinds; legalizing it took 15-20 s, twice per compile (kernel grouping and build). :func:`memoized` wraps a
legalization so that a call whose key -- op, attributes, type arguments, every argument's type (shape, dtype,
vdevice) and every non-tensor argument's value, and the result type -- was seen before in the same builder reuses
the PrimFunc of the first: the result is ``call_tir(same global var, this call's arguments)``. A legalization
result is reused only when it is a ``call_tir`` whose arguments are exactly the call's tensor arguments, each
passed through (so a legalization that reads a constant's value, or emits bindings of its own, is never cached).
"""
from __future__ import annotations

from typing import Any, Callable

import tvm
import tvm_ffi
from tvm import relax

__all__ = ["memoized", "memoized_legalize_map"]

Legalize = Callable[[relax.BlockBuilder, relax.Call], relax.Expr]
_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def _leaves(args: Any) -> list[relax.Expr]:
    out: list[relax.Expr] = []
    for a in args:
        if isinstance(a, relax.Tuple):
            out.extend(_leaves(a.fields))
        else:
            out.append(a)
    return out


def _key(call: relax.Call, leaves: list[relax.Expr]) -> Any | None:
    """Op, attributes, type arguments, each tensor argument's type and each other argument itself, and the result
    type, compared structurally (one FFI hash: ~4 us, against ~240 us for the same key built from strings)."""
    parts: list[Any] = []
    for leaf in leaves:
        ty = leaf.ty
        if isinstance(ty, relax.TensorType):
            if ty.shape is None:
                return None
            parts.append(ty)
        else:
            parts.append(leaf)      # a shape or prim value; a variable compares by identity (never wrongly equal)
    return tvm_ffi.StructuralKey([call.op, call.attrs, list(call.ty_args), parts, call.ty])


class _Cache:
    def __init__(self) -> None:
        self.builder: relax.BlockBuilder | None = None
        self.entries: dict[Any, tuple[Any, tuple[int, ...], Any] | None] = {}


def memoized(legalize: Legalize, cache: _Cache) -> Legalize:
    """``legalize`` with results reused per builder (see the module docstring)."""
    def wrapped(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        if cache.builder is None or not cache.builder.same_as(bb):
            cache.builder, cache.entries = bb, {}
        leaves = _leaves(call.args)
        key = _key(call, leaves)
        entry = cache.entries.get(key) if key is not None else None
        if entry is not None:
            gvar, positions, ty = entry
            return relax.call_tir(gvar, relax.Tuple([leaves[i] for i in positions]), ty)
        result = legalize(bb, call)
        if key is not None and key not in cache.entries:
            cache.entries[key] = _reusable(result, leaves)
        return result
    return wrapped


def _reusable(result: relax.Expr, leaves: list[relax.Expr]) -> tuple[Any, tuple[int, ...], Any] | None:
    """(global var, positions of the call's leaves in the call_tir's arguments, result type), or None."""
    if not (isinstance(result, relax.Call) and result.op.same_as(_CALL_TIR)) or len(result.args) != 2:
        return None
    args = result.args[1]
    if not isinstance(args, relax.Tuple) or len(result.ty_args) != 1:
        return None
    positions = []
    for field in args.fields:
        index = next((i for i, leaf in enumerate(leaves) if leaf.same_as(field)), None)
        if index is None:
            return None
        positions.append(index)
    tensor_leaves = {i for i, leaf in enumerate(leaves) if isinstance(leaf.ty, relax.TensorType)}
    if set(positions) != tensor_leaves:      # every tensor argument passed through, nothing else
        return None
    out = result.ty_args[0]
    return result.args[0], tuple(positions), list(out.fields) if isinstance(out, relax.TupleType) else out


def memoized_legalize_map(overrides: dict[str, Legalize]) -> dict[str, Legalize]:
    """Every op's legalization (``overrides`` first, else TVM's ``FLegalize``), memoized."""
    cache = _Cache()
    table: dict[str, Legalize] = {}
    for name in tvm.ir.Op.list_op_names():
        name = str(name)
        legalize = overrides.get(name) or tvm.ir.Op.get(name).get_attr("FLegalize")
        if legalize is not None:
            table[name] = memoized(legalize, cache)
    return table
