"""Which ops TVM's FuseOps puts into one kernel: the fused-kernel level of :class:`hetpart.graph.OpGraph`.

The grouping is TVM's own: hetpart's legalization (:func:`tvm_passes.legalize.legalize_ops`) and fusion passes
(:func:`tvm_passes.fusion.fusion_passes`) run on the module, and each fused function's members are mapped back to
the op bindings of ``main`` they came from. Two ways do that mapping:

by what each kernel computes (:func:`_groups_by_dataflow`, tried first)
  every value is described by where it comes from -- an op (its id), a model input, a constant (the object), an
  item of a tuple -- and every ``call_tir`` by its PrimFunc and its arguments' descriptions. The op
  bindings of the legalized ``main`` give each op's description; inside a fused function the parameters take the
  description of what ``main`` passes in, and each ``call_tir`` is looked up by its own. Names do not matter
  (FuseOps renames outputs, and constants and tuples of constants become parameters). The mapping is used only
  when it is exact: no two ops have one description, every kernel op is found exactly once. On a 600-step GRU
  (18,104 ops) the mapping takes about a second.
by private PrimFuncs (:func:`_groups_by_private_kernels`, the fallback)
  every op's ``call_tir`` is pointed at a private copy of its PrimFunc named ``hpop<id>__<name>`` before fusion, so
  each fused function names its members. Exact whatever FuseOps does, but it adds one PrimFunc per op to the module
  (18,104 on the GRU above: about 5 s of copying, de-duplication and per-function analysis).
"""
from __future__ import annotations

import functools
import logging
import re
from collections import Counter
from typing import Any

import tvm
from tvm import relax

from hetpart.graph import KernelGroup, OpNode
from tvm_passes.fusion import fusion_passes
from tvm_passes.legalize import legalize_ops

__all__ = ["fused_kernel_groups"]

log = logging.getLogger(__name__)

_OP_PREFIX = "hpop"
_OP_PREFIX_RE = re.compile(rf"^{_OP_PREFIX}(\d+)__(.*)$")


def _name(var) -> str:
    return str(var.name)


class _Describer:
    """Descriptions of the values of one Relax function (see the module docstring), ``known`` keyed by each var's
    object address (``__chandle__``: a dict keyed by the vars themselves compares each hit with ``Var.__eq__``)."""

    def __init__(self, known: dict[Any, Any]) -> None:
        self.known = known
        self.var_types = (relax.Var, relax.DataflowVar)
        self.global_var, self.constant = tvm.ir.GlobalVar, tvm.ir.GenericConst
        self.tuple, self.item, self.call, self.shape = relax.Tuple, relax.TupleGetItem, relax.Call, relax.ShapeExpr

    def of(self, expr) -> Any:
        kind = type(expr)
        if kind in self.var_types:
            return self.known.get(expr.__chandle__()) or ("unknown", _name(expr))
        if kind is self.call:
            op = expr.op
            callee = op.name_hint if type(op) is self.global_var else op.name
            return ("call", callee) + tuple(self.of(a) for a in expr.args[:])
        if kind is self.tuple:
            return ("tuple",) + tuple(self.of(f) for f in expr.fields[:])
        if kind is self.item:
            inner = self.of(expr.tuple_value)
            if inner[0] == "tuple":                  # an item of a literal tuple is that field
                return inner[1 + expr.index]
            return ("item", inner, expr.index)
        if kind is self.global_var:
            return ("function", expr.name_hint)
        if kind is self.constant:          # by identity: FuseOps passes the same object into a fused function
            return ("const", expr.__chandle__())
        if kind is self.shape:
            return ("shape",) + tuple(str(v) for v in expr.values[:])
        return ("other", kind.__name__)


def _group_name(ops: list[OpNode], ids: list[int]) -> str:
    return "fused_" + "_".join(ops[i].op.removeprefix("relax.").replace("nn.", "") for i in ids)


def _finish(groups: list[tuple[list[int], str]], ops: list[OpNode]) -> tuple[KernelGroup, ...]:
    grouped = {i for ids, _ in groups for i in ids}
    for node in ops:  # ops that were not legalized to a kernel (e.g. builtins) form their own group
        if node.id not in grouped:
            groups.append(([node.id], node.op.removeprefix("relax.")))
    groups.sort(key=lambda g: min(g[0]))
    return tuple(KernelGroup(k, name, tuple(sorted(ids))) for k, (ids, name) in enumerate(groups))


def _is_call_tir(value, call_tir) -> bool:
    return isinstance(value, relax.Call) and value.op.same_as(call_tir)


def _groups_by_dataflow(legal, fused, ops: list[OpNode]) -> list[tuple[list[int], str]] | None:
    """The grouping mapped back by descriptions (module docstring); None where that is not exact."""
    call_tir = tvm.ir.Op.get("relax.call_tir")
    id_of_name = {n.name: n.id for n in ops}
    op_of_call: dict[Any, int] = {}
    main = _Describer({p.__chandle__(): ("input", _name(p)) for p in legal["main"].params})
    for block in legal["main"].body.blocks:
        for b in block.bindings:
            described = main.of(b.value)
            op_id = id_of_name.get(_name(b.var))
            if op_id is not None and _is_call_tir(b.value, call_tir):
                if described in op_of_call:
                    log.debug("kernel groups: ops %d and %d compute the same; mapping through private PrimFuncs",
                              op_of_call[described], op_id)
                    return None
                op_of_call[described] = op_id
                described = ("op", op_id)
            main.known[b.var.__chandle__()] = described

    def members(func, args: list[Any]) -> tuple[list[int], Any]:
        inner = _Describer({p.__chandle__(): a for p, a in zip(func.params, args)})
        ids: list[int] = []
        for block in func.body.blocks:
            for b in block.bindings:
                described = inner.of(b.value)
                if _is_call_tir(b.value, call_tir) and described in op_of_call:
                    ids.append(op_of_call[described])
                    described = ("op", ids[-1])
                inner.known[b.var.__chandle__()] = described
        return ids, inner.of(func.body.body)

    groups: list[tuple[list[int], str]] = []
    outer = _Describer({p.__chandle__(): ("input", _name(p)) for p in fused["main"].params})
    for block in fused["main"].body.blocks:
        for b in block.bindings:
            value = b.value
            if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar) \
                    and isinstance(fused[value.op], relax.Function):
                ids, described = members(fused[value.op], [outer.of(a) for a in value.args])
                if ids:
                    groups.append((ids, _group_name(ops, ids)))
            else:
                described = outer.of(value)
                if _is_call_tir(value, call_tir) and described in op_of_call:
                    groups.append(([op_of_call[described]], value.args[0].name_hint))
                    described = ("op", op_of_call[described])
            outer.known[b.var.__chandle__()] = described
    found = Counter(i for ids, _ in groups for i in ids)
    if set(found) != set(op_of_call.values()) or any(count != 1 for count in found.values()):
        log.debug("kernel groups: the mapping by dataflow found %d of %d kernel ops (or some twice); mapping "
                  "through private PrimFuncs", len(found), len(op_of_call))
        return None
    return groups


@functools.lru_cache(maxsize=None)
def _rename_kernels_mutator() -> type:
    """The mutator that points every op's call_tir at a private copy of its PrimFunc named hpop<id>__<name>.

    Made once: TVM keeps every class its ``mutator`` decorator makes alive, with whatever its methods close over. A
    class made per call closed over the legalized module and leaked it, weights included: 555 MB per VGG-16
    extraction, which killed a three-pass ``hetpart profile`` at 24 GB.
    """
    call_tir = tvm.ir.Op.get("relax.call_tir")

    @relax.expr_functor.mutator
    class _RenameKernels(relax.PyExprMutator):
        def __init__(self, legal, id_of_name: dict[str, int]) -> None:
            super().__init__(legal)
            self.legal, self.id_of_name = legal, id_of_name

        def visit_var_binding_(self, binding):
            value, op_id = binding.value, self.id_of_name.get(binding.var.name)
            if op_id is not None and isinstance(value, relax.Call) and value.op.same_as(call_tir):
                new_gv = self.builder_.add_func(self.legal[value.args[0]].with_attr("hetpart.op_id", op_id),
                                                f"{_OP_PREFIX}{op_id}__{value.args[0].name_hint}")
                new_value = self.builder_.normalize(relax.Call(
                    value.op, [new_gv] + [self.visit_expr(a) for a in value.args[1:]], value.attrs, value.ty_args))
                self.builder_.emit_normalized(relax.VarBinding(binding.var, new_value))
                return
            super().visit_var_binding_(binding)

    return _RenameKernels


def _groups_by_private_kernels(legal, ops: list[OpNode]) -> list[tuple[list[int], str]]:
    """The grouping with every op's PrimFunc made private and named after the op first (module docstring)."""
    call_tir = tvm.ir.Op.get("relax.call_tir")
    mutator = _rename_kernels_mutator()(legal, {n.name: n.id for n in ops})
    mutator.builder_.update_func(legal.get_global_var("main"), mutator.visit_expr(legal["main"]))
    fused = tvm.transform.Sequential(fusion_passes())(mutator.builder_.get())

    def member_ids(f) -> list[int]:
        ids = []
        for block in f.body.blocks:
            for b in block.bindings:
                if isinstance(b.value, relax.Call) and b.value.op.same_as(call_tir):
                    m = _OP_PREFIX_RE.match(b.value.args[0].name_hint)
                    if m:
                        ids.append(int(m.group(1)))
        return ids

    groups: list[tuple[list[int], str]] = []
    for block in fused["main"].body.blocks:
        for b in block.bindings:
            value = b.value
            if not isinstance(value, relax.Call):
                continue
            if isinstance(value.op, tvm.ir.GlobalVar) and isinstance(fused[value.op], relax.Function):
                ids = member_ids(fused[value.op])
                if ids:
                    groups.append((ids, _group_name(ops, ids)))
            elif value.op.same_as(call_tir):
                m = _OP_PREFIX_RE.match(value.args[0].name_hint)
                if m:
                    groups.append(([int(m.group(1))], m.group(2)))
    return groups


def fused_kernel_groups(mod, ops: list[OpNode], *, by_dataflow: bool = True) -> tuple[KernelGroup, ...]:
    """Which ops TVM's FuseOps puts into one kernel (ops not legalized to a kernel stay single). ``by_dataflow``:
    try the mapping by what each kernel computes first (module docstring); False maps through private PrimFuncs
    only."""
    legal = legalize_ops()(mod)
    groups = None
    if by_dataflow:
        groups = _groups_by_dataflow(legal, tvm.transform.Sequential(fusion_passes())(legal), ops)
    if groups is None:
        groups = _groups_by_private_kernels(legal, ops)
    return _finish(groups, ops)
