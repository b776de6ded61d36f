"""Wide concatenations legalized as one copy per input.

TOPI writes ``concat(x_0, ..., x_{K-1})`` and ``stack(...)`` as one loop nest whose value is a K-deep chain of
``if_then_else`` selects. For the few inputs of a CNN's concat the concat rule's loop partition removes the chain
(:mod:`tvm_passes.schedules.concat`); for the hundreds of an unrolled recurrence's ``stack`` of per-step outputs it
does not scale: every partition keeps the whole chain until lowering simplifies it. Measured with 120 stacked
(1, 256) inputs: 20 s to lower and 13 s to emit machine code (2.8 MB of LLVM IR), and with 300 inputs 150 s; the
elementwise rule instead evaluates the chain per element (42 s to compile, 1 MB of code).

With at least :data:`WIDE_CONCAT_MIN_INPUTS` inputs hetpart's legalization writes the concatenation as a tree of
copy kernels instead: groups of at most :data:`MAX_KERNEL_INPUTS` inputs are placed side by side by one kernel each
(block k copies input k into its place: a plain copy the CPU elementwise rule vectorises and a GPU schedule binds
to threads), then the groups' outputs likewise. The number of inputs per kernel is bounded because each buffer
argument adds checks to the kernel's entry and LLVM's time grows faster than linearly with them: one kernel of 300
copies took 31 s to emit (2 s with the checks disabled). A 300-way stack now lowers in 1.2 s and emits in 1.3 s;
the grouped kernels share one compiled function when their shapes agree. Narrower concatenations keep TVM's
legalization (and the concat rule's loop partition).
"""
from __future__ import annotations

from typing import Callable, Sequence

import tvm
from tvm import relax, tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T


__all__ = ["WIDE_CONCAT_MIN_INPUTS", "MAX_KERNEL_INPUTS", "copies_primfunc", "legalize_concat", "legalize_stack"]

WIDE_CONCAT_MIN_INPUTS = 32   # more inputs than any CNN concat in the zoo (DenseNet-121: 25), which keep TVM's form
MAX_KERNEL_INPUTS = 16        # inputs per copy kernel: each buffer argument adds checks to the kernel's entry

Placement = Callable[[int, Sequence[tvm.ir.Expr]], list[tvm.ir.Expr]]


def copies_primfunc(name: str, input_shapes: Sequence[Sequence[int]], output_shape: Sequence[int], dtype: str,
                    place: Placement) -> tirx.PrimFunc:
    """A PrimFunc ``name(x_0, ..., x_{K-1}, out)`` of K spatial blocks; block k stores ``x_k[v]`` at
    ``out[place(k, v)]``."""
    def extents(shape: Sequence[int]) -> list[tirx.IntImm]:
        return [tirx.IntImm("int64", int(e)) for e in shape]

    with IRBuilder() as builder:
        with T.prim_func(private=True, s_tir=True):
            T.func_name(name)
            T.func_attr({"tirx.noalias": True})
            inputs = [T.arg(f"x{k}", T.buffer(extents(shape), dtype)) for k, shape in enumerate(input_shapes)]
            output = T.arg("T_out", T.buffer(extents(output_shape), dtype))
            for k, (source, shape) in enumerate(zip(inputs, input_shapes)):
                with T.grid(*extents(shape)) as loops:
                    loops = [loops] if isinstance(loops, tvm.ir.Expr) else list(loops)
                    with T.sblock(f"T_copy{k}"):
                        axes = [T.axis.spatial(e, loop) for e, loop in zip(extents(shape), loops)]
                        where = place(k, axes)
                        T.reads(source[tuple(axes)])
                        T.writes(output[tuple(where)])
                        T.buffer_store(output, source[tuple(axes)], where)
    return builder.get()


def _static_tensors(call: relax.Call) -> tuple[list[list[int]], str] | None:
    """The inputs' static shapes and common dtype, or None (symbolic shapes, mixed dtypes, not a tuple)."""
    fields = call.args[0]
    ty = fields.ty if hasattr(fields, "ty") else None
    if not isinstance(ty, relax.TupleType):
        return None
    shapes, dtypes = [], set()
    for t in ty.fields:
        if not isinstance(t, relax.TensorType) or t.shape is None:
            return None
        values = t.shape.values
        if not all(isinstance(v, tirx.IntImm) for v in values):
            return None
        shapes.append([int(v.value) for v in values])
        dtypes.add(str(t.dtype))
    return (shapes, dtypes.pop()) if len(dtypes) == 1 else None


def _default(op_name: str) -> Callable[[relax.BlockBuilder, relax.Call], relax.Expr]:
    return tvm.ir.Op.get(op_name).get_attr("FLegalize")


def _fields(bb: relax.BlockBuilder, call: relax.Call) -> list[relax.Expr]:
    args = call.args[0]
    if isinstance(args, relax.Tuple):
        return list(args.fields)
    return [bb.emit(relax.TupleGetItem(args, i)) for i in range(len(args.ty.fields))]


def _copies(bb: relax.BlockBuilder, name: str, fields: Sequence[relax.Expr], shapes: Sequence[Sequence[int]],
            dtype: str, axis: int, stack: bool, out_ty: relax.TensorType) -> relax.Expr:
    """One kernel (at most :data:`MAX_KERNEL_INPUTS` inputs) placing ``fields`` along ``axis``."""
    offsets = [0]
    for shape in shapes:
        offsets.append(offsets[-1] + (1 if stack else shape[axis]))
    if stack:
        out_shape = list(shapes[0][:axis]) + [len(shapes)] + list(shapes[0][axis:])
    else:
        out_shape = list(shapes[0])
        out_shape[axis] = offsets[-1]

    def place(k: int, v: Sequence[tvm.ir.Expr]) -> list[tvm.ir.Expr]:
        at = tirx.IntImm("int64", offsets[k])
        if stack:
            return list(v[:axis]) + [at] + list(v[axis:])
        return [x + at if i == axis else x for i, x in enumerate(v)]

    gvar = bb.add_func(copies_primfunc(name, shapes, out_shape, dtype, place), name)
    ty = relax.TensorType([int(d) for d in out_shape], dtype, vdevice=out_ty.vdevice)
    return relax.call_tir(gvar, relax.Tuple(list(fields)), ty)


def _grouped(bb: relax.BlockBuilder, call: relax.Call, stack: bool) -> relax.Expr | None:
    """The wide concatenation as a tree of copy kernels, or None when TVM's legalization should handle it."""
    found = _static_tensors(call)
    if found is None or len(found[0]) < WIDE_CONCAT_MIN_INPUTS:
        return None
    shapes, dtype = found
    rank = len(shapes[0]) + (1 if stack else 0)
    if call.attrs.axis is None:
        return None
    axis = int(call.attrs.axis) % rank
    fields, name = _fields(bb, call), "stack" if stack else "concatenate"
    while len(fields) > MAX_KERNEL_INPUTS:      # each level places groups of MAX_KERNEL_INPUTS side by side
        groups = [range(i, min(i + MAX_KERNEL_INPUTS, len(fields))) for i in range(0, len(fields), MAX_KERNEL_INPUTS)]
        parts, part_shapes = [], []
        for group in groups:
            part = _copies(bb, name, [fields[i] for i in group], [shapes[i] for i in group], dtype, axis, stack,
                           call.ty)
            parts.append(bb.emit(part))
            part_shapes.append([int(d) for d in part.ty.shape.values])
        fields, shapes, stack, name = parts, part_shapes, False, "concatenate"
    return _copies(bb, name, fields, shapes, dtype, axis, stack, call.ty)


def legalize_concat(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """``relax.concat`` with many static inputs as a tree of copy kernels; otherwise TVM's legalization."""
    grouped = _grouped(bb, call, stack=False)
    return grouped if grouped is not None else _default("relax.concat")(bb, call)


def legalize_stack(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """``relax.stack`` with many static inputs as a tree of copy kernels; otherwise TVM's legalization."""
    grouped = _grouped(bb, call, stack=True)
    return grouped if grouped is not None else _default("relax.stack")(bb, call)
