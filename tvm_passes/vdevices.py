"""Virtual devices of an annotated module: the host, vdevice order and declaration, and remapping.

``vdevice_order`` puts the plan's devices in vdevice-index order (the host CPU first, see ``host_device``) and
``make_vdevices`` declares one vdevice per device; ``runtime_device`` maps a vdevice back to the runtime device
it stands for; ``single_vm_plan`` folds a plan's CPU core groups into the host for the one-VM executable;
``tensor_vdevices`` / ``map_type_vdevices`` read and rewrite the vdevices in a type, and ``retarget_vdevices``
re-maps the declared vdevices of an annotated module (the build uses it to compile a GPU vdevice for a second CPU
device when emulating, or to apply another CPU target).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import tvm
from tvm import relax
from tvm.target import Target

from hetpart.devices import DeviceSet, DeviceSpec
from hetpart.errors import InvalidPlanError
from hetpart.plan import Plan

_TO_VDEVICE = tvm.ir.Op.get("relax.to_vdevice")
_RUNTIME_DEVICE_OF_KIND = {"llvm": "cpu", "c": "cpu", "cuda": "cuda"}


def runtime_device(vdevice: relax.VDevice) -> tvm.runtime.Device:
    """The runtime device (``tvm.cpu(i)``, ``tvm.cuda(i)``) a vdevice stands for."""
    kind = str(vdevice.target.kind.name)
    if kind not in _RUNTIME_DEVICE_OF_KIND:
        raise InvalidPlanError(f"vdevice target kind must be one of {sorted(_RUNTIME_DEVICE_OF_KIND)}; found {kind!r}")
    return tvm.device(_RUNTIME_DEVICE_OF_KIND[kind], int(vdevice.vdevice_id))


def host_device(devices: DeviceSet) -> DeviceSpec:
    """The host: the first CPU device of the set (model inputs and outputs live there)."""
    for device in devices.devices:
        if device.kind == "cpu":
            return device
    raise InvalidPlanError(f"a device set needs a CPU device (the host); found kinds "
                           f"{[d.kind for d in devices.devices]}; add cpu_device() to the DeviceSet")


def vdevice_order(plan: Plan, devices: DeviceSet) -> list[DeviceSpec]:
    """The plan's devices in vdevice-index order: the host first, then the others in DeviceSet order."""
    host = host_device(devices)
    for name in plan.devices:
        devices.index(name)   # raises UnknownDeviceError for a name the DeviceSet does not know
    if host.name not in plan.devices:
        raise InvalidPlanError(f"plan devices {list(plan.devices)} must include the host CPU {host.name!r}, "
                               "where model inputs arrive and outputs are returned")
    return [host] + [d for d in devices.devices if d.name in plan.devices and d.name != host.name]


def single_vm_plan(plan: Plan, devices: DeviceSet) -> Plan:
    """``plan`` as one VM on one host thread runs it: the ops of every CPU device on the host CPU.

    CPU devices (core groups such as ``cpu:0,cpu:1``) share memory, and a single VM cannot keep them on separate
    cores: it issues every kernel from the calling thread. Kept as separate vdevices they would only cost speed:
    the weights of the non-host CPU ops become copies (so their convs lose the prepacked constant layout of the
    CPU rules), tensors crossing between them are copied, and StaticPlanBlockMemory, safe with one device only,
    is skipped. The task runtime (``segments=True``) is what runs core groups concurrently. GPU devices (real or
    emulated) keep their ops."""
    host = host_device(devices).name
    cpus = {d.name for d in devices.devices if d.kind == "cpu"}
    if not (cpus - {host}) & set(plan.devices):
        return plan
    merged = dict.fromkeys(host if name in cpus else name for name in plan.devices)
    return plan.with_devices([host if d in cpus else d for d in plan.device_of], devices=tuple(merged))


def make_vdevices(ordered: list[DeviceSpec]) -> list[relax.VDevice]:
    """One vdevice per device; vdevice_id counts devices of the same target kind (llvm:0, cuda:0, llvm:1)."""
    per_kind: dict[str, int] = {}
    vdevices = []
    for device in ordered:
        target = Target(dict(device.target))
        kind = str(target.kind.name)
        vdevices.append(relax.VDevice(target, per_kind.get(kind, 0), "global"))
        per_kind[kind] = per_kind.get(kind, 0) + 1
    return vdevices


def tensor_vdevices(ty: Any) -> list[Any]:
    """The vdevice (or None) of every tensor in a type, tuples flattened."""
    if isinstance(ty, relax.TensorType):
        return [ty.vdevice]
    if isinstance(ty, relax.TupleType):
        return [v for field in ty.fields for v in tensor_vdevices(field)]
    return []


def is_tensor_const(expr: relax.Expr) -> bool:
    return isinstance(expr, tvm.ir.GenericConst) and isinstance(expr.ty, relax.TensorType)


# ------------------------------------------------------------------ remapping vdevices (used by the build)
def vdevice_key(vdevice: relax.VDevice) -> tuple[str, int, str]:
    return (str(vdevice.target.kind.name), int(vdevice.vdevice_id), str(vdevice.memory_scope))


def map_type_vdevices(ty: Any, new_vdevice: Callable[[Any], Any]) -> Any:
    """``ty`` with the vdevice of every tensor replaced by ``new_vdevice(old vdevice)``."""
    if isinstance(ty, relax.TensorType):
        return relax.TensorType(ty.shape, ty.dtype, new_vdevice(ty.vdevice))
    if isinstance(ty, relax.TupleType):
        return relax.TupleType([map_type_vdevices(f, new_vdevice) for f in ty.fields])
    return ty


def retarget_vdevices(mod: tvm.IRModule, new_vdevices: Sequence[relax.VDevice]) -> tvm.IRModule:
    """A new module whose vdevice i is ``new_vdevices[i]`` everywhere in ``main`` (types, copies, declarations).

    Written as a replay with a BlockBuilder, because ``relax.transform.UpdateVDevice`` mutates its input in
    0.27 and leaves the ``dst_vdevice`` of ``R.to_vdevice`` unchanged."""
    old = list(mod.global_infos["vdevice"])
    mapping = {vdevice_key(o): n for o, n in zip(old, new_vdevices)}

    def remap(vd: Any) -> Any:
        return mapping.get(vdevice_key(vd), vd) if vd is not None else None

    func = mod["main"]
    bb = relax.BlockBuilder()
    var_map: dict[relax.Var, relax.Var] = {}
    consts: dict[tvm.ir.GenericConst, tvm.ir.GenericConst] = {}

    def expr(e: relax.Expr) -> relax.Expr:
        if isinstance(e, relax.Var):
            return var_map.get(e, e)
        if isinstance(e, relax.Tuple):
            return relax.Tuple([expr(f) for f in e.fields])
        if isinstance(e, relax.TupleGetItem):
            return relax.TupleGetItem(expr(e.tuple_value), e.index)
        if isinstance(e, relax.Call):
            args = [expr(a) for a in e.args]
            if isinstance(e.op, tvm.ir.Op) and e.op.same_as(_TO_VDEVICE):
                return relax.op.to_vdevice(args[0], mapping[vdevice_key(e.attrs.dst_vdevice)])
            return relax.Call(e.op, args, e.attrs, [map_type_vdevices(t, remap) for t in e.ty_args], e.span)
        if is_tensor_const(e):
            if e not in consts:
                consts[e] = tvm.ir.GenericConst(e.value, map_type_vdevices(e.ty, remap))
            return consts[e]
        return e

    params = []
    for p in func.params:
        var_map[p] = relax.Var(p.name, map_type_vdevices(p.ty, remap))
        params.append(var_map[p])
    with bb.function("main", params, attrs=dict(func.attrs) if func.attrs else None, pure=func.is_pure):
        def replay(block: relax.BindingBlock) -> None:
            for b in block.bindings:
                value = bb.normalize(expr(b.value))
                var_cls = relax.DataflowVar if isinstance(b.var, relax.DataflowVar) else relax.Var
                new_var = var_cls(b.var.name, map_type_vdevices(b.var.ty, remap))
                bb.emit_normalized(relax.VarBinding(new_var, value))
                var_map[b.var] = new_var

        for block in func.body.blocks:
            if isinstance(block, relax.DataflowBlock):
                with bb.dataflow():
                    replay(block)
            else:
                replay(block)
        bb.emit_func_output(expr(func.body.body))
    new_main = bb.get()["main"]
    functions = {gv: (new_main if gv.name_hint == "main" else f) for gv, f in mod.functions_items()}
    infos = dict(mod.global_infos)
    infos["vdevice"] = list(new_vdevices)
    return tvm.IRModule(functions, mod.attrs, infos)
