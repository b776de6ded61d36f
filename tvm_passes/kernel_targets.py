"""Kernels and their devices: bind every PrimFunc to the target of the vdevice it runs on, list the kernel
calls of ``main`` with the vdevices they touch, and check that no kernel (fused or not) mixes devices.
"""
from __future__ import annotations

from typing import Any, Sequence

import tvm
from tvm import relax
from tvm.target import Target

from hetpart.errors import BuildError
from tvm_passes.vdevices import map_type_vdevices, tensor_vdevices, vdevice_key

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def _first_vdevice(types: Sequence[Any]) -> relax.VDevice | None:
    return next((v for ty in types for v in tensor_vdevices(ty) if v is not None), None)


def _target_with_host(target: Target, host: Target) -> Target:
    if "gpu" in target.keys:
        return Target(target.export(), host=host)
    return target


@relax.expr_functor.mutator
class _KernelTargetBinder(relax.PyExprMutator):
    """Gives every ``call_tir`` a vdevice (from its output type, else its tensor arguments, else the host) and
    makes its PrimFunc carry that vdevice's target (cloned per target when one PrimFunc serves two devices)."""

    def __init__(self, mod: tvm.IRModule, host: relax.VDevice):
        super().__init__(mod)
        self.source = mod
        self.host = host
        self.clones: dict[tuple[str, str], tvm.ir.GlobalVar] = {}
        self.decided: dict[tuple[str, tuple], tvm.ir.GlobalVar] = {}

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: D102 (visitor hook)
        call = self.visit_expr_post_order(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.same_as(_CALL_TIR)):
            return call
        out_ty = call.ty_args[0]
        vd = _first_vdevice([out_ty]) or _first_vdevice([a.ty for a in call.args[1].fields]) or self.host
        gv = call.args[0]
        # an unrolled model calls a few PrimFuncs thousands of times: decide once per (kernel, vdevice), since
        # printing targets to compare them costs more than the rest of the visit
        key = vdevice_key(vd)
        decision = (gv.name_hint, key)
        new_gv = self.decided.get(decision)
        if new_gv is None:
            new_gv = self.decided[decision] = self._bound_kernel(gv, vd)
        if new_gv.same_as(gv) and all(v is not None and vdevice_key(v) == key for v in tensor_vdevices(out_ty)):
            return call           # already bound: the unchanged call is not rebuilt and re-normalised
        new_out_ty = map_type_vdevices(out_ty, lambda _: vd)
        return relax.Call(call.op, [new_gv] + list(call.args[1:]), call.attrs, [new_out_ty])

    def _bound_kernel(self, gv: tvm.ir.GlobalVar, vd: relax.VDevice) -> tvm.ir.GlobalVar:
        target = _target_with_host(vd.target, self.host.target)
        func = self.source[gv]
        current = func.attrs.get("target") if func.attrs else None
        if current is not None and str(current.kind.name) == str(target.kind.name) \
                and str(current) == str(target):
            return gv
        key = (gv.name_hint, str(target))
        if key not in self.clones:
            suffix = "" if gv.name_hint.endswith("_" + str(target.kind.name)) else "_" + str(target.kind.name)
            self.clones[key] = self.builder_.add_func(func.with_attr("target", target), gv.name_hint + suffix)
        return self.clones[key]


def bind_kernel_targets(mod: tvm.IRModule) -> tvm.IRModule:
    """Every PrimFunc called from a Relax function gets the target of the vdevice it runs on."""
    host = mod.global_infos["vdevice"][0]
    binder = _KernelTargetBinder(mod, host)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            binder.builder_.update_func(gv, binder.visit_expr(func))
    return relax.transform.DeadCodeElimination()(binder.builder_.get())


def kernel_calls(mod: tvm.IRModule) -> list[tuple[str, set[tuple]]]:
    """Every ``call_tir`` in ``main``: the kernel's name and the vdevices of its tensor arguments and output.

    (One CPU PrimFunc may legitimately serve two CPU vdevices; what must hold is one device per call.)"""
    found: list[tuple[str, set[tuple]]] = []
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            call = b.value
            if isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op) and call.op.same_as(_CALL_TIR):
                types = [a.ty for a in call.args[1].fields] + [b.var.ty]
                vds = {vdevice_key(v) for t in types for v in tensor_vdevices(t) if v is not None}
                found.append((call.args[0].name_hint, vds))
    return found


def check_single_device_kernels(mod: tvm.IRModule) -> None:
    """Raise BuildError if a kernel (fused or not) reads or writes tensors on two devices."""
    mixed = {name: sorted(vds) for name, vds in kernel_calls(mod) if len(vds) > 1}
    if mixed:
        raise BuildError(f"every kernel must run on one device, but {len(mixed)} kernels mix devices: {mixed}; "
                         "fusion crossed a device boundary (a copy is missing between the devices)")
