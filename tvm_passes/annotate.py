"""Apply a Plan to a Relax module: vdevices, per-binding placement, cross-device copies, issue order.

``AnnotateDevicePlacement(plan, devices)`` rewrites ``main`` of a (pre-legalization) Relax module so that:

- the module declares one vdevice per plan device (global info ``"vdevice"``): the host CPU first, then the
  other devices in ``DeviceSet`` order; the device names are recorded on ``main`` as attribute
  ``hetpart.vdevice_names`` (same order), so the build can map vdevices back to devices;
- model inputs arrive on the host CPU and model outputs are returned on the host CPU;
- every op binding (see :func:`op_bindings`) runs on ``plan.device_of[op_id]``: its tensor operands are on that
  device, and its output carries that vdevice;
- a tensor consumed on another device is copied there with ``R.to_vdevice`` exactly once per
  (tensor, destination device), right before its first consumer there; later consumers reuse the copy;
- op bindings are emitted in ``plan.order`` (so GPU kernels are launched before independent CPU work); the
  non-op bindings (TupleGetItem, Tuple, var aliases, ...) that an op needs are emitted just before it;
- constants are typed as living on the host (the TVM 0.27 VM loads every constant onto vdevice 0) and an op
  on another device reads a copy of them (``build`` hoists those copies out of ``main``);
- ``RealizeVDevice`` runs at the end. Output vdevices come from type inference on the placed operands; only an
  op without tensor operands (``R.ones``, ``R.arange``) needs an ``R.hint_on_device``, which RealizeVDevice
  turns into a computation on the host followed by a copy.

The input module is never modified; the pass returns a new module.

``retarget_vdevices`` re-maps the declared vdevices of an annotated module (the build uses it to compile a GPU
vdevice for a second CPU device when emulating, or to apply another CPU target).
"""
from __future__ import annotations

import logging
from typing import Any, Sequence, Union

import tvm
import tvm_ffi
from tvm import relax

from hetpart.devices import DeviceSet
from hetpart.errors import InvalidPlanError, UnknownDeviceError, UnsupportedOpError
from hetpart.plan import Plan
from tvm_passes.bindings import op_bindings
from tvm_passes.vdevices import (is_tensor_const, make_vdevices, runtime_device, tensor_vdevices, vdevice_key,
                                 vdevice_order)

__all__ = ["VDEVICE_NAMES_ATTR", "AnnotateDevicePlacement", "Placement", "annotate_module"]

logger = logging.getLogger(__name__)

# Errors raised inside a pass cross the TVM FFI; registering them keeps their hetpart type for the caller.
for _error in (InvalidPlanError, UnknownDeviceError, UnsupportedOpError):
    tvm_ffi.register_error(_error)

VDEVICE_NAMES_ATTR = "hetpart.vdevice_names"

# Where a value lives: a device name for a tensor, None for a value without device (shape, prim value),
# or a tuple of placements for a tuple.
Placement = Union[str, None, tuple]


def _has_tensor(ty: Any) -> bool:
    return bool(tensor_vdevices(ty))


class _PlacementEmitter:
    """Re-emits ``main`` with placements; one instance per application of the pass."""

    def __init__(self, func: relax.Function, plan: Plan, names: list[str], vdevices: list[relax.VDevice]):
        self.func = func
        self.plan = plan
        self.vdevice_of = dict(zip(names, vdevices))
        self.host = names[0]
        self.bb = relax.BlockBuilder()
        self.new_var: dict[relax.Var, relax.Expr] = {}      # old var -> its value in the new function
        self.placement: dict[relax.Var, Placement] = {}
        self.copies: dict[tuple, relax.Var] = {}            # (canonical tensor key, device) -> copied var
        self.binding_of: dict[relax.Var, relax.VarBinding] = {}
        self.op_id_of: dict[relax.Var, int] = {}
        self.n_copies = 0
        self.n_constant_copies = 0
        self.host_consts: dict[tvm.ir.GenericConst, tvm.ir.GenericConst] = {}

    # ------------------------------------------------------------------ analysis
    def index_bindings(self) -> list[relax.VarBinding]:
        ops = op_bindings(self.func)
        if len(ops) != len(self.plan.device_of):
            raise InvalidPlanError(
                f"plan assigns {len(self.plan.device_of)} ops but main has {len(ops)} op bindings: this plan was "
                "made for another model (or another import of it); re-plan for this module")
        for op_id, binding in enumerate(ops):
            self.op_id_of[binding.var] = op_id
        for block in self.func.body.blocks:
            for binding in block.bindings:
                if not isinstance(binding, relax.VarBinding):
                    raise UnsupportedOpError(
                        f"AnnotateDevicePlacement handles plain var bindings only; found a "
                        f"{type(binding).__name__} for {binding.var.name!r} (a match_cast); bind shapes statically "
                        "before partitioning")
                value = binding.value
                if binding.var not in self.op_id_of and isinstance(value, (relax.Call, relax.If, relax.Function)):
                    raise UnsupportedOpError(
                        f"binding {binding.var.name!r} is a {type(value).__name__} that is not a call to a Relax "
                        "op; only op calls, TupleGetItem, Tuple, aliases and constants can be placed")
                self.binding_of[binding.var] = binding
        return ops

    # ------------------------------------------------------------------ placement queries
    def canonical(self, var: relax.Var) -> tuple:
        """A key naming the tensor (or tuple) a var holds, looking through aliases and TupleGetItem."""
        binding = self.binding_of.get(var)
        if binding is None or var in self.op_id_of:
            return (var,)
        value = binding.value
        if isinstance(value, relax.Var):
            return self.canonical(value)
        if isinstance(value, relax.TupleGetItem) and isinstance(value.tuple_value, relax.Var):
            inner = self.binding_of.get(value.tuple_value)
            if inner is not None and isinstance(inner.value, relax.Tuple) and value.tuple_value not in self.op_id_of:
                field = inner.value.fields[value.index]
                return self.canonical(field) if isinstance(field, relax.Var) else (var,)
            return self.canonical(value.tuple_value) + (int(value.index),)
        return (var,)

    def place_of_expr(self, expr: relax.Expr) -> Placement:
        if isinstance(expr, relax.Var):
            self.define(expr)
            return self.placement[expr]
        if isinstance(expr, relax.Tuple):
            return tuple(self.place_of_expr(f) for f in expr.fields)
        if isinstance(expr, relax.TupleGetItem):
            inner = self.place_of_expr(expr.tuple_value)
            return inner[expr.index] if isinstance(inner, tuple) else inner
        if isinstance(expr, tvm.ir.GenericConst) and isinstance(expr.ty, relax.TensorType):
            return self.host   # the VM loads constants onto vdevice 0
        return None   # shapes, prim values: no device of their own

    # ------------------------------------------------------------------ emission
    def define(self, var: relax.Var) -> None:
        """Emit the (non-op) binding of ``var`` if it has not been emitted yet; ops are emitted in plan order."""
        if var in self.new_var:
            return
        if var in self.op_id_of:
            raise InvalidPlanError(
                f"op {self.op_id_of[var]} ({var.name}) is used before it is issued: plan.order must be a "
                "topological order of the ops")
        binding = self.binding_of.get(var)
        if binding is None:
            raise InvalidPlanError(f"variable {var.name!r} is not defined in main")
        value = binding.value
        if isinstance(value, relax.Var):
            self.define(value)
            self.new_var[var] = self.new_var[value]
            self.placement[var] = self.placement[value]
            return
        placement = self.place_of_expr(value)
        new_value = self.rewrite_leaves(value)
        self.new_var[var] = self.bb.emit(new_value, name_hint=var.name)
        self.placement[var] = placement

    def rewrite_leaves(self, expr: relax.Expr) -> relax.Expr:
        """``expr`` with old vars replaced by their new values (no copies)."""
        if isinstance(expr, relax.Var):
            self.define(expr)
            return self.new_var[expr]
        if isinstance(expr, relax.Tuple):
            return relax.Tuple([self.rewrite_leaves(f) for f in expr.fields])
        if isinstance(expr, relax.TupleGetItem):
            return relax.TupleGetItem(self.rewrite_leaves(expr.tuple_value), expr.index)
        if is_tensor_const(expr):
            return self.host_const(expr)
        return expr

    def bound_constant(self, expr: relax.Expr) -> tvm.ir.GenericConst | None:
        """The tensor constant ``expr`` is bound to (through aliases), if any."""
        while isinstance(expr, relax.Var) and expr in self.binding_of and expr not in self.op_id_of:
            expr = self.binding_of[expr].value
        return expr if is_tensor_const(expr) else None

    def host_const(self, const: tvm.ir.GenericConst) -> tvm.ir.GenericConst:
        """The constant typed as living on the host vdevice (where the VM loads it), so ops reading only
        constants still get a vdevice by type inference."""
        if const not in self.host_consts:
            ty = relax.TensorType(const.ty.shape, const.ty.dtype, self.vdevice_of[self.host])
            self.host_consts[const] = tvm.ir.GenericConst(const.value, ty)
        return self.host_consts[const]

    def on_device(self, expr: relax.Expr, device: str) -> relax.Expr:
        """``expr`` (an operand) with every tensor in it on ``device``, copying where needed."""
        if isinstance(expr, relax.Tuple):
            return relax.Tuple([self.on_device(f, device) for f in expr.fields])
        const = expr if is_tensor_const(expr) else self.bound_constant(expr)
        if const is not None and device != self.host:
            # the VM loads every constant onto vdevice 0 (the host): other devices get an explicit copy
            # (of the constant itself, so that the build can hoist it out of main)
            return self._copy(("const", const), self.host_const(const), device)
        if not isinstance(expr, relax.Var):
            return self.rewrite_leaves(expr)
        self.define(expr)
        placement = self.placement[expr]
        if placement is None or placement == device:
            return self.new_var[expr]
        if isinstance(placement, tuple):
            if all(p is None or p == device for p in _flatten(placement)):
                return self.new_var[expr]
            binding = self.binding_of.get(expr)
            if binding is not None and expr not in self.op_id_of and isinstance(binding.value, relax.Tuple):
                return self.on_device(binding.value, device)   # copies keyed by the fields' own tensors
            return relax.Tuple([self._field_on_device(expr, (i,), p, device) for i, p in enumerate(placement)])
        return self._copy(self.canonical(expr), self.new_var[expr], device)

    def _field_on_device(self, var: relax.Var, path: tuple, placement: Placement, device: str) -> relax.Expr:
        getter: relax.Expr = self.new_var[var]
        for index in path:
            getter = relax.TupleGetItem(getter, index)
        if isinstance(placement, tuple):
            return relax.Tuple([self._field_on_device(var, path + (i,), p, device) for i, p in enumerate(placement)])
        if placement is None or placement == device:
            return getter
        return self._copy(self.canonical(var) + path, getter, device)

    def _copy(self, key: tuple, source: relax.Expr, device: str) -> relax.Var:
        if (key, device) not in self.copies:
            if isinstance(source, tvm.ir.GenericConst):
                name = f"const_to_{device}"
                self.n_constant_copies += 1
            else:
                source = source if isinstance(source, relax.Var) else self.bb.emit(source)
                name = f"{source.name}_to_{device}"
            self.copies[(key, device)] = self.bb.emit(relax.op.to_vdevice(source, self.vdevice_of[device]),
                                                      name_hint=name)
            self.n_copies += 1
        return self.copies[(key, device)]

    def emit_op(self, binding: relax.VarBinding, device: str) -> None:
        call = binding.value
        args = [self.on_device(arg, device) for arg in call.args]
        new_call = relax.Call(call.op, args, call.attrs, call.ty_args, call.span)
        out = self.bb.emit(new_call, name_hint=binding.var.name)
        wanted = self.vdevice_of[device]
        found = tensor_vdevices(out.ty)
        if isinstance(out.ty, relax.TensorType) and (found[0] is None or vdevice_key(found[0]) != vdevice_key(wanted)):
            # only an op without tensor operands (R.ones, R.arange) gets here; RealizeVDevice turns the hint
            # into a host computation plus a copy
            out = self.bb.emit(relax.op.hint_on_device(out, runtime_device(wanted)), name_hint=binding.var.name)
        elif isinstance(out.ty, relax.TupleType) and any(v is None for v in found):
            logger.warning("op %s returns a tuple whose type has no vdevice; RealizeVDevice decides its device",
                           binding.var.name)
        self.new_var[binding.var] = out
        self.placement[binding.var] = _placement_like(out.ty, device)

    def run(self) -> relax.Function:
        ops = self.index_bindings()
        host_vd = self.vdevice_of[self.host]
        params = []
        for param in self.func.params:
            ty = param.ty
            if isinstance(ty, relax.TensorType):
                new_param = relax.Var(param.name, relax.TensorType(ty.shape, ty.dtype, host_vd))
                self.placement[param] = self.host
            elif _has_tensor(ty):
                raise UnsupportedOpError(f"model input {param.name!r} is a {ty}; only tensor inputs are supported")
            else:
                new_param = relax.Var(param.name, ty)
                self.placement[param] = None
            self.new_var[param] = new_param
            params.append(new_param)
        dataflow = all(isinstance(b, relax.DataflowBlock) for b in self.func.body.blocks)
        attrs = dict(self.func.attrs) if self.func.attrs else {}
        with self.bb.function("main", params, attrs=attrs or None, pure=self.func.is_pure):
            if dataflow:
                with self.bb.dataflow():
                    result = self._emit_body(ops)
                    output = self.bb.emit_output(result)
            else:
                output = self._emit_body(ops)
            self.bb.emit_func_output(output)
        return self.bb.get()["main"]

    def _emit_body(self, ops: list[relax.VarBinding]) -> relax.Expr:
        for op_id in self.plan.order:
            self.emit_op(ops[op_id], self.plan.device_of[op_id])
        result = self.on_device(self.func.body.body, self.host)
        for var in self.binding_of:       # dead non-op bindings are kept, after everything else
            self.define(var)
        return result


def _flatten(placement: Placement) -> list:
    if isinstance(placement, tuple):
        return [leaf for p in placement for leaf in _flatten(p)]
    return [placement]


def _placement_like(ty: Any, device: str) -> Placement:
    if isinstance(ty, relax.TensorType):
        return device
    if isinstance(ty, relax.TupleType):
        return tuple(_placement_like(f, device) for f in ty.fields)
    return None


def annotate_module(mod: tvm.IRModule, plan: Plan, devices: DeviceSet,
                    vdevices: Sequence[relax.VDevice] | None = None) -> tvm.IRModule:
    """Apply ``plan`` to ``mod["main"]`` and return a new module (see the module docstring). ``vdevices``: the
    vdevice of each device in :func:`tvm_passes.vdevices.vdevice_order` (default: each device's own target,
    :func:`tvm_passes.vdevices.make_vdevices`); ``tvm_passes.build.deployment_vdevices`` gives the ones the build
    compiles for."""
    plan.validate()
    devices.validate()
    if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
        raise InvalidPlanError("the module has no 'main' function; AnnotateDevicePlacement places main's bindings")
    if "vdevice" in mod.global_infos:
        raise InvalidPlanError("the module already declares vdevices; apply AnnotateDevicePlacement to the "
                               "frontend's module, once")
    ordered = vdevice_order(plan, devices)
    vdevices = make_vdevices(ordered) if vdevices is None else list(vdevices)
    if len(vdevices) != len(ordered):
        raise InvalidPlanError(f"annotate_module needs one vdevice per device of the plan ({[d.name for d in ordered]}); "
                               f"found {len(vdevices)}")
    names = [d.name for d in ordered]
    emitter = _PlacementEmitter(mod["main"], plan, names, vdevices)
    new_main = emitter.run().with_attr(VDEVICE_NAMES_ATTR, names)
    functions = {gv: (new_main if gv.name_hint == "main" else func) for gv, func in mod.functions_items()}
    global_infos = dict(mod.global_infos)
    global_infos["vdevice"] = vdevices
    out = tvm.IRModule(functions, mod.attrs, global_infos)
    out = relax.transform.RealizeVDevice()(out)
    logger.info("placed %d ops on %s with %d copies (%d of constants)", len(plan.device_of), names,
                emitter.n_copies, emitter.n_constant_copies)
    return out


def AnnotateDevicePlacement(plan: Plan, devices: DeviceSet) -> tvm.transform.Pass:  # noqa: N802 (TVM pass style)
    """A Relax module pass applying ``plan`` (op level) with the targets of ``devices``."""
    if plan.level != "op":
        raise InvalidPlanError(f"AnnotateDevicePlacement needs an op-level plan; found level={plan.level!r} "
                               "(expand a kernel-level plan to its member ops first)")

    def _transform(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return annotate_module(mod, plan, devices)

    return tvm.transform.module_pass(_transform, opt_level=0, name="hetpart.AnnotateDevicePlacement")
