"""Constant folding at import that costs time in proportion to the constant work, not to the graph.

TVM's ``FoldConstant`` legalizes *every* call in a dataflow block (TOPI ``call_te``, ``create_prim_func``) just to
find out whether its arguments are constant: on an unrolled 2-layer GRU of 18k ops that was most of the import
time, for a handful of constant ops. :func:`fold_constants` visits the graph once in Python and hands TVM's pass
only the calls that have no runtime argument, one small function each, so what is folded and how is TVM's own
``FoldConstant``. ``shape_of`` a tensor of static shape is that shape (TVM's normalizer does the same). The layout
ops of :data:`LAYOUT_OPS` on a constant are computed exactly with numpy instead of being compiled. Like
``FoldConstant``, it substitutes constants for the variables bound to them and shape expressions for call arguments
bound to a shape, then drops dead bindings.
"""
from __future__ import annotations

import logging

import numpy as np
import tvm
from tvm import relax

__all__ = ["LAYOUT_OPS", "fold_constants"]

log = logging.getLogger(__name__)

LAYOUT_OPS = frozenset({"relax.reshape", "relax.permute_dims", "relax.expand_dims", "relax.squeeze"})


def _layout_fold(call):
    """The constant ``call`` (a layout op on a constant) computed with numpy, or None."""
    out_ty = call.ty
    if not isinstance(out_ty, relax.TensorType) or out_ty.shape is None:
        return None
    try:
        value = call.args[0].value.numpy()
        if call.op.name == "relax.permute_dims":
            axes = call.attrs.axes
            value = np.transpose(value, None if axes is None else [int(a) for a in axes])
        target_shape = [int(s) for s in out_ty.shape.values]
    except (TypeError, ValueError, AttributeError):
        return None  # symbolic shape: leave it to TVM
    return relax.const(np.asarray(value.reshape(target_shape), order="C"), str(out_ty.dtype))   # 0-D stays 0-D


def _tvm_fold(call):
    """``call`` folded by TVM's FoldConstant in a function of its own: a Constant/ShapeExpr (or a tuple of them),
    or None."""
    bb = relax.BlockBuilder()
    with bb.function("main", []):
        with bb.dataflow():
            out = bb.emit_output(call)
        bb.emit_func_output(out)
    body = relax.transform.FoldConstant()(bb.get())["main"].body
    result = body.body if isinstance(body, relax.SeqExpr) else body
    if isinstance(result, relax.Var):   # FoldConstant substitutes constants for variables, not tuples of them
        bound = {b.var: b.value for block in body.blocks for b in block.bindings}
        result = bound.get(result, result)
    values = result.fields if isinstance(result, relax.Tuple) else [result]     # split() folds to a tuple
    return result if all(isinstance(v, (tvm.ir.Constant, relax.ShapeExpr)) for v in values) else None


def fold_constants(mod):
    """``mod`` with every call that depends on no runtime value replaced by its value (see the module doc)."""
    # TVM 0.27: tensor constants are tvm.ir.GenericConst, prim values IntImm/FloatImm -- all tvm.ir.Constant
    static_leaves = (tvm.ir.Constant, tvm.ir.StringImm, relax.ShapeExpr)
    counts = {"shape": 0, "numpy": 0, "tvm": 0, "kept": 0}

    def is_static(arg) -> bool:
        if isinstance(arg, relax.Tuple):
            return all(is_static(f) for f in arg.fields)
        return isinstance(arg, static_leaves)

    @relax.expr_functor.mutator
    class _Folder(relax.PyExprMutator):
        def visit_var_(self, var):
            bound = self.lookup_binding(var)
            return bound if isinstance(bound, tvm.ir.Constant) else var

        def visit_dataflow_var_(self, var):
            return self.visit_var_(var)

        def visit_call_(self, call):
            call = self.visit_expr_post_order(call)
            if not isinstance(call.op, tvm.ir.Op):
                return call
            if call.op.name == "relax.shape_of":    # a static shape is known without running anything
                shape = getattr(call.args[0].ty, "shape", None)
                if shape is not None and all(isinstance(v, tvm.ir.prim.IntImm) for v in shape.values):
                    counts["shape"] += 1
                    return relax.ShapeExpr(shape.values)
            args = []
            for arg in call.args:       # a shape bound to a variable, written into the call (as FoldConstant does)
                bound = self.lookup_binding(arg) if isinstance(arg, relax.Var) else None
                args.append(bound if isinstance(bound, relax.ShapeExpr) else arg)
            if any(not a.same_as(b) for a, b in zip(args, call.args)):
                call = relax.Call(call.op, args, call.attrs, call.ty_args, call.span)
            if not all(is_static(a) for a in call.args):
                return call
            if call.op.name in LAYOUT_OPS and isinstance(call.args[0], tvm.ir.GenericConst):
                folded = _layout_fold(self.builder_.normalize(call))
                if folded is not None:
                    counts["numpy"] += 1
                    return folded
            folded = _tvm_fold(call)
            counts["tvm" if folded is not None else "kept"] += 1
            return call if folded is None else folded

    folder = _Folder(mod)
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            folder.builder_.update_func(gv, folder.visit_expr(func))
    log.debug("constant folding: %d static shapes, %d layout ops with numpy, %d calls with FoldConstant, %d constant "
              "calls kept", counts["shape"], counts["numpy"], counts["tvm"], counts["kept"])
    return relax.transform.DeadCodeElimination()(folder.builder_.get())
