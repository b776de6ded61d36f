"""The fused kernels of a model's deployment pipeline, outlined one by one into stand-alone Relax modules.

:func:`deployment_pipeline` is the Relax pipeline and target hetpart deploys with on the CPU
(:func:`tvm_passes.schedules.cpu_pipeline`). :func:`fuse_for_deployment` runs it on a model and returns the module
as it was after fusion and scheduling, before lowering; :func:`outline_kernels` wraps every distinct ``call_tir``
of that module's ``main`` into a module whose ``main`` calls only that kernel (:class:`OutlinedKernel`), which the
profiler (:mod:`predictors.profiling`) compiles and times.
"""
from __future__ import annotations

import importlib
import logging
import re
from dataclasses import dataclass
from typing import Any

import tvm
import tvm_ffi
from tvm import relax

from hetpart.errors import BuildError, PredictorError

logger = logging.getLogger(__name__)

_LOWERING_PASSES = ("RewriteDataflowReshape", "ToNonDataflow", "RemovePurityChecking", "CallTIRRewrite")
_DIGIT_ENDING_OPS = ("log2", "log10", "atan2", "expm1")

Shape = tuple[int, ...]


def deployment_pipeline(target: tvm.target.Target | None = None,
                        database_dir: str | None = None) -> tuple[Any, tvm.target.Target]:
    """(Relax pipeline, target) exactly as hetpart compiles for deployment on the CPU (or on ``target``).

    ``database_dir``: a tuning database the CPU pipeline applies (as tvm_passes.schedules.cpu_pipeline does).
    """
    try:
        schedules = importlib.import_module("tvm_passes.schedules")
        default_target, cpu_pipeline = schedules.default_cpu_target, schedules.cpu_pipeline
    except (ImportError, AttributeError):
        logger.warning("tvm_passes.schedules.cpu_pipeline/default_cpu_target are missing: profiling with TVM's "
                       "default pipeline and a generic llvm target, which is not what hetpart deploys")
        default_target, cpu_pipeline = None, None
    if target is None:
        target = default_target() if default_target is not None else tvm.target.Target({"kind": "llvm"})
    target = tvm.target.Target(target) if not isinstance(target, tvm.target.Target) else target
    if target.kind.name == "llvm" and cpu_pipeline is not None:
        return cpu_pipeline(target, database_dir=database_dir), target
    return relax.get_default_pipeline(target), target


def kernel_kind(name: str) -> str:
    """Strip TVM's numeric uniquifiers from every part: 'fused_conv2d1_add2_relu1' -> 'fused_conv2d_add_relu'."""
    parts = [p if p.endswith(_DIGIT_ENDING_OPS) else re.sub(r"(?<=[A-Za-z])\d+$", "", p) for p in name.split("_")]
    return "_".join(parts)


def fuse_for_deployment(mod: tvm.IRModule, target: tvm.target.Target, pipeline: Any) -> tvm.IRModule:
    """Run the deployment pipeline and return the module as it was after fusion + schedules, before lowering."""
    snapshots: dict[str, tvm.IRModule] = {}

    @tvm.instrument.pass_instrument
    class _Snapshot:
        def run_before_pass(self, m: tvm.IRModule, info: Any) -> None:
            if info.name in _LOWERING_PASSES and "pre_lower" not in snapshots:
                snapshots["pre_lower"] = m

        def run_after_pass(self, m: tvm.IRModule, info: Any) -> None:
            if info.name == "FuseTIR":
                snapshots["fuse_tir"] = m

    with tvm.transform.PassContext(opt_level=3, instruments=[_Snapshot()]):
        pipeline(mod)
    fused = snapshots.get("pre_lower", snapshots.get("fuse_tir"))
    # The instrument outlives this call (TVM's side keeps it alive), and with it this dict: without the clear, every
    # call leaked the snapshots and their weight constants (615 MB per VGG-16 extraction).
    snapshots.clear()
    if fused is None:
        raise BuildError("the deployment pipeline ran no FuseTIR pass, so fused kernels cannot be profiled; "
                         "the pipeline must contain FuseOps + FuseTIR (TVM's default CPU pipeline does)")
    return fused


def flatten_tensor_types(types: Any) -> list[Any]:
    """call_tir output types with tuple outputs (e.g. a fused split) flattened to their tensor fields."""
    out: list[Any] = []
    for ty in types:
        out.extend(flatten_tensor_types(ty.fields) if isinstance(ty, relax.TupleType) else [ty])
    return out


def _tensor_type(ty: Any, what: str) -> tuple[Shape, str]:
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        raise PredictorError(f"{what}: only tensors with static shapes can be profiled; found {ty}")
    try:
        return tuple(int(d) for d in ty.shape.values), str(ty.dtype)
    except (TypeError, ValueError):
        raise PredictorError(f"{what}: shape {ty.shape} is symbolic; bind input shapes first") from None


@dataclass(frozen=True)
class OutlinedKernel:
    """One distinct fused kernel of a model, outlined: ``mod``'s ``main`` calls ``func`` (named ``name``) once.

    ``instance_names``: every PrimFunc name of the model that is this kernel (same structural hash), in call order;
    ``inputs`` / ``outputs``: (shape, dtype) of each argument and result; ``constant_inputs``: whether each argument
    is a constant of the model (a weight) rather than a variable."""

    name: str
    kind: str
    func: tvm.tirx.PrimFunc
    structural_hash: int
    instance_names: tuple[str, ...]
    inputs: tuple[tuple[Shape, str], ...]
    outputs: tuple[tuple[Shape, str], ...]
    constant_inputs: tuple[bool, ...]
    mod: tvm.IRModule


def _standalone_module(func: Any, name: str, ins: list[tuple[Shape, str]],
                       outs: list[tuple[Shape, str]]) -> tvm.IRModule:
    """A module whose ``main`` takes the kernel's arguments and returns what one ``call_tir`` of it writes."""
    bb = relax.BlockBuilder()
    params = [relax.Var(f"arg{i}", relax.TensorType(list(s), d)) for i, (s, d) in enumerate(ins)]
    with bb.function("main", params):
        gv = bb.add_func(func, name)
        out_ty = [relax.TensorType(list(s), d) for s, d in outs]
        with bb.dataflow():
            out = bb.emit_output(relax.call_tir(gv, relax.Tuple(params), out_ty[0] if len(outs) == 1 else out_ty))
        bb.emit_func_output(out)
    return bb.get()


def outline_kernels(mod: tvm.IRModule, target: tvm.target.Target | None = None,
                    database_dir: str | None = None) -> list[OutlinedKernel]:
    """The distinct fused kernels of ``mod`` (a model's Relax module) after the deployment pipeline for ``target``
    (default: this host's CPU), in the order ``main`` first calls them.

    Identical PrimFuncs (same structural hash) are outlined once; kernels that take symbolic shape arguments are
    skipped with a warning. Raises :class:`PredictorError` for a tensor without a static shape."""
    pipeline, target = deployment_pipeline(target, database_dir)
    fused = fuse_for_deployment(mod, target, pipeline)
    call_tir = tvm.ir.Op.get("relax.call_tir")
    order: list[int] = []
    found: dict[int, dict[str, Any]] = {}
    for block in fused["main"].body.blocks:
        for binding in block.bindings:
            call = binding.value
            if not (isinstance(call, relax.Call) and call.op.same_as(call_tir)):
                continue
            gvar, args = call.args[0], call.args[1]
            if len(call.args) > 2:
                logger.warning("skipping kernel %s: it takes symbolic shape arguments", gvar.name_hint)
                continue
            func = fused[gvar]
            h = tvm_ffi.structural_hash(func)
            if h in found:
                found[h]["names"].append(gvar.name_hint)
                continue
            order.append(h)
            found[h] = {"func": func, "names": [gvar.name_hint], "args": list(args.fields),
                        "out": flatten_tensor_types(call.ty_args)}
    kernels = []
    for h in order:
        entry = found[h]
        name = entry["names"][0]
        ins = [_tensor_type(a.ty, f"{name} argument {i}") for i, a in enumerate(entry["args"])]
        outs = [_tensor_type(t, f"{name} output") for t in entry["out"]]
        kernels.append(OutlinedKernel(
            name=name, kind=kernel_kind(name), func=entry["func"], structural_hash=h,
            instance_names=tuple(entry["names"]), inputs=tuple(ins), outputs=tuple(outs),
            constant_inputs=tuple(not isinstance(a, relax.Var) for a in entry["args"]),
            mod=_standalone_module(entry["func"], name, ins, outs)))
    return kernels
