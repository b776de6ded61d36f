"""Build a device-annotated Relax module (output of ``AnnotateDevicePlacement``) into one executable.

Steps (``build``): optionally map the GPU vdevice to a second CPU device (emulation, no CUDA here) ->
DecomposeOpsForInference -> LegalizeOps -> re-bind every PrimFunc to the target of its vdevice (TVM 0.27's
LegalizeOps leaves conv2d/relu/batch_norm PrimFuncs without one) -> FuseOps/FuseTIR -> re-bind -> check that
no kernel mixes devices -> GPU DLight default schedules (CUDA PrimFuncs) and hetpart's CPU schedules (CPU
PrimFuncs) -> hoist the weight copies to non-host devices into ``hetpart_upload_weights()`` -> ``tvm.compile``
with a lowering pipeline that skips ``StaticPlanBlockMemory`` when several devices are used (0.27 pools
device-1 tensors into device-0 storage) -> for CUDA builds, ``check_cuda_kernels`` -> optional
``export_library`` of ONE ``.so`` plus a JSON manifest.

Running: ``vm = relax.VirtualMachine(executable, manifest.runtime_devices())`` then
``manifest.main_caller(vm)(*inputs)`` (uploads the non-host weights once, then calls ``main``).

``check_cuda_kernels`` verifies that every CUDA-target PrimFunc became a ``__global__`` kernel (an unscheduled
GPU PrimFunc silently compiles as host code); ``compile_cuda_source_with_nvcc`` compiles the generated CUDA
source offline (nvcc is not run at build time on a machine without libcuda).
"""
from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.target import Target

from hetpart.devices import DeviceSet
from hetpart.errors import BuildError
from hetpart.plan import Plan
from tvm_passes.annotate import VDEVICE_NAMES_ATTR
from tvm_passes.artifact import WEIGHTS_FUNCTION, BuildManifest, BuildResult, export
from tvm_passes.kernel_targets import bind_kernel_targets, check_single_device_kernels, kernel_calls
from tvm_passes.fusion import fusion_passes
from tvm_passes.legalize import legalize_ops
from tvm_passes.vdevices import (host_device, make_vdevices, retarget_vdevices, runtime_device, tensor_vdevices,
                                vdevice_key, vdevice_order)

__all__ = ["build", "check_cuda_kernels", "compile_cuda_source_with_nvcc", "cuda_available", "cuda_kernel_names",
           "deployment_vdevices", "lift_weight_uploads"]

logger = logging.getLogger(__name__)

_TO_VDEVICE = tvm.ir.Op.get("relax.to_vdevice")


# ---------------------------------------------------------------------------------------------- vdevices
def _used_vdevices(mod: tvm.IRModule) -> set[tuple]:
    """The vdevices holding any tensor of ``main`` (parameters, bindings, copies)."""
    main = mod["main"]
    types = [p.ty for p in main.params] + [b.var.ty for block in main.body.blocks for b in block.bindings]
    return {vdevice_key(v) for t in types for v in tensor_vdevices(t) if v is not None}



# ---------------------------------------------------------------------------------------------- schedules
def _apply_gpu_schedules(mod: tvm.IRModule, gpu_targets: Sequence[Target]) -> tvm.IRModule:
    """DLight's GPU rules, after hetpart's rule for kernels whose full inlining would blow up
    (:mod:`tvm_passes.schedules.gpu_bounded_inline`)."""
    from tvm.s_tir import dlight as dl

    from tvm_passes.schedules.gpu_bounded_inline import BoundedInlineGpuRule

    for target in gpu_targets:
        with target:
            mod = dl.ApplyDefaultSchedule(BoundedInlineGpuRule(), dl.gpu.Matmul(), dl.gpu.GEMV(),
                                          dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback())(mod)
    return mod


def _host_target(cpu_target: Any, devices: DeviceSet) -> Target:
    """The CPU target: explicit ``cpu_target``, else a specific host DeviceSpec target, else the one the
    CPU schedules and the profiler use (``default_cpu_target``: this host's SIMD width and core count)."""
    if isinstance(cpu_target, Target):
        return cpu_target
    if cpu_target is not None:
        return Target(dict(cpu_target))
    spec_target = dict(host_device(devices).target)
    if spec_target != {"kind": "llvm"}:
        return Target(spec_target)
    from tvm_passes.schedules import default_cpu_target

    return default_cpu_target()


def _prepack_cpu_conv_weights(mod: tvm.IRModule, cpu_target: Target) -> tvm.IRModule:
    """Constant conv weights in the layout the CPU conv rule vectorises (only CPU convs have constant weights
    here: a GPU op reads a copy of its weight, so GPU convs are left alone)."""
    from tvm_passes.schedules import prepack_conv_weights, vector_lanes

    return prepack_conv_weights(vector_lanes(cpu_target))(mod)


def _apply_tuning_database(mod: tvm.IRModule, cpu_target: Target, database_dir: str | Path | None) -> tvm.IRModule:
    if database_dir is None:
        return mod
    from tvm_passes.schedules.pipeline import tuning_database_passes

    for apply in tuning_database_passes(database_dir, cpu_target):
        mod = apply(mod)
    return mod


def _apply_cpu_schedules(mod: tvm.IRModule, cpu_target: Target) -> tuple[tvm.IRModule, str]:
    """hetpart's CPU schedules (tvm_passes.schedules); returns the module and "" or why they were skipped.

    The schedules only change speed, never results, so a missing or failing schedule package is reported
    (log warning + manifest note) and the CPU kernels stay unscheduled."""
    try:
        from tvm_passes.schedules import cpu_schedule_pass
    except ImportError as exc:
        reason = f"hetpart CPU schedules unavailable ({exc})"
    else:
        try:
            return cpu_schedule_pass(cpu_target)(mod), ""
        except Exception as exc:  # noqa: BLE001 (any failure of the optional schedule package)
            reason = f"hetpart CPU schedules failed ({type(exc).__name__}: {str(exc).strip()[:300]})"
    logger.warning("%s; CPU kernels stay unscheduled", reason)
    return mod, reason


def _lowering_pipeline(plan_memory: bool) -> tvm.transform.Pass:
    """TVM's Relax lowering after fusion; StaticPlanBlockMemory only when one device is used."""
    t = relax.transform
    passes = [t.RewriteDataflowReshape(), t.ToNonDataflow(), t.RemovePurityChecking(), t.CallTIRRewrite()]
    if plan_memory:
        passes.append(t.StaticPlanBlockMemory())
    passes += [t.LowerAllocTensor(), t.KillAfterLastUse(), t.LowerRuntimeBuiltin(), t.ComputePrimValue(),
               t.VMShapeLower(), t.AttachGlobalSymbol()]
    return tvm.transform.Sequential(passes, name="hetpart.MultiDeviceLowering")


# ---------------------------------------------------------------------------------------------- build
def _final_vdevices(names: Sequence[str], annotated: Sequence[relax.VDevice], devices: DeviceSet, emulate_gpu: bool,
                    cpu_target: Target) -> tuple[list[relax.VDevice], list[dict[str, Any]]]:
    next_cpu_index = sum(1 for n in names if devices.device(n).kind == "cpu")
    vdevices, described = [], []
    for name, old in zip(names, annotated):
        spec = devices.device(name)
        emulated = spec.kind == "gpu" and (emulate_gpu or spec.emulated)
        if spec.kind == "cpu":
            vd = relax.VDevice(cpu_target, int(old.vdevice_id), "global")
        elif emulated:
            vd = relax.VDevice(cpu_target, next_cpu_index, "global")
            next_cpu_index += 1
        else:
            vd = relax.VDevice(Target(dict(spec.target)), int(old.vdevice_id), "global")
        device = runtime_device(vd)
        vdevices.append(vd)
        described.append({"name": name, "kind": spec.kind, "target": dict(spec.target),
                          "compiled_target": str(vd.target.kind.name),
                          "runtime": "cpu" if device.dlpack_device_type() == 1 else "cuda",
                          "index": int(vd.vdevice_id), "emulated": emulated})
    return vdevices, described


def deployment_vdevices(plan: Plan, devices: DeviceSet, *, emulate_gpu: bool,
                        cpu_target: Any = None) -> list[relax.VDevice]:
    """The vdevices :func:`build` compiles ``plan``'s devices for (this host's CPU target; an emulated GPU as a
    further CPU device), in vdevice order. A module annotated with them (``annotate_module(..., vdevices=...)``)
    is built without re-targeting every type and copy of ``main`` (1.6 s on an 18k-op unrolled GRU)."""
    ordered = vdevice_order(plan, devices)
    vdevices, _ = _final_vdevices([d.name for d in ordered], make_vdevices(ordered), devices, emulate_gpu,
                                  _host_target(cpu_target, devices))
    return vdevices


def _same_vdevices(old: Sequence[relax.VDevice], new: Sequence[relax.VDevice]) -> bool:
    return len(old) == len(new) and all(vdevice_key(a) == vdevice_key(b) and str(a.target) == str(b.target)
                                        for a, b in zip(old, new))


def _signature(func: relax.Function,
               output_names: Sequence[str] | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    def describe(name: str, ty: Any) -> dict[str, Any]:
        if not isinstance(ty, relax.TensorType) or ty.shape is None:
            raise BuildError(f"model input/output {name!r} must be a tensor of static shape; found {ty}")
        return {"name": name, "shape": [int(s) for s in ty.shape.values], "dtype": str(ty.dtype)}

    inputs = [describe(p.name, p.ty) for p in func.params]
    ret = func.ret_ty if hasattr(func, "ret_ty") else func.body.body.ty
    leaves = list(ret.fields) if isinstance(ret, relax.TupleType) else [ret]
    names = list(output_names) if output_names is not None else [f"output{i}" for i in range(len(leaves))]
    if len(names) != len(leaves):
        raise BuildError(f"output_names must name each of the {len(leaves)} outputs; found {names}")
    return inputs, [describe(name, t) for name, t in zip(names, leaves)]


def _is_constant_copy(binding: relax.Binding) -> bool:
    return _is_copy(binding) and isinstance(binding.value.args[0], tvm.ir.GenericConst)


def _is_copy(binding: relax.Binding) -> bool:
    v = binding.value
    return isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op) and v.op.same_as(_TO_VDEVICE)


def _count_main_bindings(mod: tvm.IRModule, predicate: Any) -> int:
    """How many bindings of ``main`` satisfy ``predicate`` (e.g. copies between devices)."""
    return sum(1 for block in mod["main"].body.blocks for b in block.bindings if predicate(b))


def lift_weight_uploads(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """Move the copies of constants off the host (``R.to_vdevice(const)``) out of ``main``.

    The TVM 0.27 VM loads every constant onto vdevice 0 (the host), so weights of ops on another device must
    be copied; done in ``main`` that copy would repeat at every call. Instead ``hetpart_upload_weights()``
    makes the copies and returns them as a tuple, which ``main`` takes as its last parameter: call the
    upload function once, then ``main(*inputs, weights)``. Returns the new module and the bytes uploaded."""
    main = mod["main"]
    copies = [b for block in main.body.blocks for b in block.bindings if _is_constant_copy(b)]
    if not copies:
        return mod, 0
    bb = relax.BlockBuilder()
    with bb.function(WEIGHTS_FUNCTION, [], attrs={"global_symbol": WEIGHTS_FUNCTION}):
        uploaded = [bb.emit(relax.op.to_vdevice(b.value.args[0], b.value.attrs.dst_vdevice)) for b in copies]
        bb.emit_func_output(relax.Tuple(uploaded))
    weights = relax.Var("hetpart_weights", relax.TupleType([b.var.ty for b in copies]))
    index = {b.var: i for i, b in enumerate(copies)}
    blocks = []
    for block in main.body.blocks:
        bindings = [relax.VarBinding(b.var, bb.normalize(relax.TupleGetItem(weights, index[b.var])))
                    if b.var in index else b for b in block.bindings]
        blocks.append(type(block)(bindings))
    new_main = relax.Function(list(main.params) + [weights], relax.SeqExpr(blocks, main.body.body), main.ret_ty,
                              main.is_pure, main.attrs)
    functions = {gv: (new_main if gv.name_hint == "main" else f) for gv, f in mod.functions_items()}
    out = tvm.IRModule(functions, mod.attrs, mod.global_infos)
    out[WEIGHTS_FUNCTION] = bb.get()[WEIGHTS_FUNCTION]
    total = sum(int(np.prod(b.value.args[0].value.shape)) * np.dtype(str(b.value.args[0].value.dtype)).itemsize
                for b in copies)
    return out, total


def _stage(name: str, fn: Any, *args: Any) -> Any:
    start = time.perf_counter()
    try:
        result = fn(*args)
        logger.debug("build stage %r: %.2f s", name, time.perf_counter() - start)
        return result
    except BuildError:
        raise
    except Exception as exc:  # TVM raises its own error types; wrap them with the stage that failed
        raise BuildError(f"build stage {name!r} failed: {type(exc).__name__}: {str(exc).strip()[:2000]}") from exc


def build(mod: tvm.IRModule, devices: DeviceSet, *, emulate_gpu: bool, cpu_target: Any = None,
          out_dir: str | Path | None = None, output_names: Sequence[str] | None = None,
          hoist_weight_uploads: bool = True, tuning_database: str | Path | None = None) -> BuildResult:
    """Compile an annotated module; export ``model.so`` + ``manifest.json`` into ``out_dir`` when given.

    With ``emulate_gpu=True`` (or a GPU DeviceSpec with ``emulated=True``) every GPU vdevice is compiled for
    the CPU as a second CPU device (``cpu(1)``), so the partitioned program, copies included, runs on a
    machine without CUDA; the manifest says so. With ``hoist_weight_uploads`` (default) the weights of
    non-host ops are uploaded once by ``hetpart_upload_weights()`` (see :func:`lift_weight_uploads`; run the
    result with ``manifest.main_caller(vm)``); without it they are copied inside ``main`` at every call.

    CPU kernels are compiled exactly as ``tvm_passes.schedules.cpu_pipeline`` compiles them for the profiler:
    the same host target (``default_cpu_target()`` unless ``cpu_target`` or a non-generic host DeviceSpec
    target is given), output-channel-innermost constant conv weights, records of ``tuning_database`` where
    they exist, and the rule schedules."""
    start = time.perf_counter()
    if "vdevice" not in mod.global_infos or mod["main"].attrs is None \
            or VDEVICE_NAMES_ATTR not in mod["main"].attrs:
        raise BuildError("build needs a module annotated by AnnotateDevicePlacement (vdevices and the "
                         f"{VDEVICE_NAMES_ATTR!r} attribute on main); apply the plan first")
    host_target = _host_target(cpu_target, devices)
    annotated = list(mod.global_infos["vdevice"])
    vdevices, described = _final_vdevices([str(n) for n in mod["main"].attrs[VDEVICE_NAMES_ATTR]], annotated,
                                          devices, emulate_gpu, host_target)
    if not _same_vdevices(annotated, vdevices):     # annotated with deployment_vdevices: nothing to re-target
        mod = _stage("retarget vdevices", retarget_vdevices, mod, vdevices)
    inputs, outputs = _signature(mod["main"], output_names)
    t = relax.transform
    mod = _stage("prepack CPU conv weights", _prepack_cpu_conv_weights, mod, host_target)
    mod = _stage("legalize", tvm.transform.Sequential([t.DecomposeOpsForInference(), legalize_ops()]), mod)
    mod = _stage("bind kernel targets", bind_kernel_targets, mod)
    mod = _stage("fuse", tvm.transform.Sequential([*fusion_passes(), t.FuseTIR()]), mod)
    mod = _stage("bind kernel targets after fusion", bind_kernel_targets, mod)
    check_single_device_kernels(mod)
    gpu_targets = {str(vd.target): vd.target for vd in vdevices if "gpu" in vd.target.keys}
    mod = _stage("GPU schedules", _apply_gpu_schedules, mod, list(gpu_targets.values()))
    mod = _stage("apply tuning database", _apply_tuning_database, mod, host_target, tuning_database)
    mod, cpu_schedule_problem = _apply_cpu_schedules(mod, host_target)
    used = _used_vdevices(mod)
    for entry, vd in zip(described, vdevices):
        entry["used"] = vdevice_key(vd) in used
    plan_memory = len(used) <= 1     # StaticPlanBlockMemory is only safe with one device (TVM 0.27)
    weight_upload_bytes = 0
    weight_uploads = _count_main_bindings(mod, _is_constant_copy) if hoist_weight_uploads else 0
    if hoist_weight_uploads:
        mod, weight_upload_bytes = _stage("lift weight uploads", lift_weight_uploads, mod)
    copies_per_call = _count_main_bindings(mod, _is_copy)
    executable = _stage("compile", lambda m: tvm.compile(m, relax_pipeline=_lowering_pipeline(plan_memory)), mod)
    if any(d["runtime"] == "cuda" and d["used"] for d in described):
        _stage("CUDA kernel check", check_cuda_kernels, BuildResult(executable, mod, None))
    notes = [f"{cpu_schedule_problem}: CPU kernels are unscheduled"] if cpu_schedule_problem else []
    if weight_upload_bytes:
        notes.append(f"{WEIGHTS_FUNCTION}() uploads {weight_upload_bytes} bytes of weights to the non-host devices; "
                     "call it once and pass its result as the last argument of main")
    emulated = any(d["emulated"] and d["used"] for d in described)
    if emulated:
        notes.append("EMULATED: the GPU vdevice was compiled for and runs on a second CPU device")
    manifest = BuildManifest(devices=described, inputs=inputs, outputs=outputs, emulated=emulated,
                             weights_function=WEIGHTS_FUNCTION if weight_upload_bytes else None,
                             build_time_s=round(time.perf_counter() - start, 3), notes=notes).validate()
    result = BuildResult(executable=executable, lowered=mod, manifest=manifest,
                         cpu_schedules_applied=not cpu_schedule_problem,
                         stats={"kernel_calls": len(kernel_calls(mod)), "plan_memory": plan_memory,
                                "weight_upload_bytes": weight_upload_bytes, "weight_uploads": weight_uploads,
                                "copies_per_call": copies_per_call})
    if out_dir is not None:
        result = export(result, out_dir)
    logger.info("built %d kernel calls for %s in %.2f s%s", result.stats["kernel_calls"],
                [d["name"] for d in described],
                manifest.build_time_s, " (GPU emulated on CPU)" if emulated else "")
    return result


# ---------------------------------------------------------------------------------------------- CUDA checks
def cuda_available() -> bool:
    """True when a CUDA device can actually run kernels here (driver + runtime present)."""
    try:
        return bool(tvm.cuda(0).exist)
    except Exception:  # no CUDA runtime registered (libcuda missing)
        return False


def cuda_kernel_names(result: BuildResult) -> list[str]:
    """Names of the PrimFuncs compiled for a CUDA target."""
    return sorted(gv.name_hint for gv, f in result.lowered.functions_items()
                  if isinstance(f, tirx.PrimFunc) and f.attrs is not None and "target" in f.attrs
                  and str(f.attrs["target"].kind.name) == "cuda")


def check_cuda_kernels(result: BuildResult) -> list[str]:
    """Check every CUDA-target PrimFunc became a ``__global__`` kernel; returns the kernel names found.

    Raises BuildError naming the PrimFuncs that would run as host code (no GPU schedule applied)."""
    names = cuda_kernel_names(result)
    source = result.cuda_source()
    kernels = re.findall(r"__global__\s+void\s+(?:__launch_bounds__\(\d+\)\s+)?(\w+)\s*\(", source)
    bad = sorted({n for n in names if not any(k.startswith(n + "_kernel") for k in kernels)}
                 | {n for n in names if not _is_gpu_scheduled(result.lowered[n])})
    if bad:
        raise BuildError(f"{len(bad)} of {len(names)} GPU PrimFuncs did not become CUDA kernels (no GPU schedule "
                         f"applied, so they would run as host code): {bad}; add a DLight rule that covers them")
    return sorted(set(kernels))


def _is_gpu_scheduled(func: tirx.PrimFunc) -> bool:
    """True when the PrimFunc binds loops to CUDA blocks/threads (the only way it becomes a GPU kernel)."""
    text = func.script()
    return "blockIdx." in text or "threadIdx." in text


def compile_cuda_source_with_nvcc(result: BuildResult, target_format: str = "fatbin") -> bytes:
    """Compile the build's CUDA source with nvcc (CUDA_PATH must point at the toolkit) for its arch."""
    from tvm.support import nvcc

    source = result.cuda_source()
    if not source:
        raise BuildError("the build has no CUDA module to compile; was any op placed on a (non-emulated) GPU?")
    archs = {str(d["target"].get("arch")) for d in result.manifest.devices if d["runtime"] == "cuda"}
    if len(archs) != 1 or "None" in archs:
        raise BuildError(f"CUDA targets need exactly one explicit 'arch' (e.g. sm_75); found {sorted(archs)}")
    arch = archs.pop()
    with Target({"kind": "cuda", "arch": arch}):   # nvcc.compile_cuda reads the arch of the current target
        return bytes(_stage("nvcc", nvcc.compile_cuda, source, target_format, arch, None, None, "nvcc"))
