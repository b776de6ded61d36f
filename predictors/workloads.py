"""What the profiler measures: the fused kernels of a model's deployment pipeline, as standalone workloads.

:func:`kernels_of_module` runs the deployment pipeline of a model (``tvm_passes.schedules.cpu_pipeline``) up to
its fused, scheduled PrimFuncs and wraps every distinct ``call_tir`` of ``main`` into a standalone module
(:class:`KernelWorkload`), keyed by kind, shapes, dtypes and the TIR structural hash; :func:`canary_workload` is
the fixed canary matmul. :mod:`predictors.profiler` times them.
"""
from __future__ import annotations

import importlib
import json
import logging
import re
from dataclasses import dataclass
from typing import Any, Mapping

import tvm
import tvm_ffi
from tvm import relax

from hetpart.errors import BuildError, PredictorError, SchemaError
from hetpart.graph import OpGraph, OpNode, tensor_bytes
from predictors.store import canonical_json, key_hash_of

logger = logging.getLogger(__name__)

_LOWERING_PASSES = ("RewriteDataflowReshape", "ToNonDataflow", "RemovePurityChecking", "CallTIRRewrite")
_DIGIT_ENDING_OPS = ("log2", "log10", "atan2", "expm1")
WORKLOAD_SCHEMA_VERSION = 1


# ---------------------------------------------------------------------------------------------- pipeline
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


def target_string(target: tvm.target.Target) -> str:
    """Canonical JSON of a target (what the database stores)."""
    return canonical_json(json.loads(str(target)))


# ---------------------------------------------------------------------------------------------- kernels
@dataclass(frozen=True)
class KernelWorkload:
    """A standalone IRModule whose ``main`` calls one fused kernel, with its key and kernel-level features."""

    name: str                              # fused PrimFunc name in the model, e.g. "fused_conv2d_add_relu"
    kind: str                              # name without TVM's uniquifying suffix
    mod: tvm.IRModule
    input_shapes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_shapes: tuple[tuple[int, ...], ...]
    output_dtypes: tuple[str, ...]
    workload_key: str                      # canonical JSON (kind, shapes, dtypes, TIR structural hash)
    key_hash: str
    features: Mapping[str, Any]            # kernel-level OpNode dict (hetpart.graph)
    count: int = 1                         # how often the model calls this kernel
    instance_names: tuple[str, ...] = ()   # every PrimFunc name of the model that dedupes to this kernel

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form; the module is stored as TVM JSON (tvm.ir.save_json)."""
        return {"schema_version": WORKLOAD_SCHEMA_VERSION, "name": self.name, "kind": self.kind,
                "mod": tvm.ir.save_json(self.mod), "input_shapes": [list(s) for s in self.input_shapes],
                "input_dtypes": list(self.input_dtypes), "output_shapes": [list(s) for s in self.output_shapes],
                "output_dtypes": list(self.output_dtypes), "workload_key": self.workload_key,
                "key_hash": self.key_hash, "features": dict(self.features), "count": self.count,
                "instance_names": list(self.instance_names)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "KernelWorkload":
        if data.get("schema_version") != WORKLOAD_SCHEMA_VERSION:
            raise SchemaError(f"KernelWorkload JSON must have schema_version={WORKLOAD_SCHEMA_VERSION}; found "
                              f"{data.get('schema_version')!r}. Fix: re-create it with kernels_of_module().")
        try:
            return cls(name=data["name"], kind=data["kind"], mod=tvm.ir.load_json(data["mod"]),
                       input_shapes=tuple(tuple(s) for s in data["input_shapes"]),
                       input_dtypes=tuple(data["input_dtypes"]),
                       output_shapes=tuple(tuple(s) for s in data["output_shapes"]),
                       output_dtypes=tuple(data["output_dtypes"]), workload_key=data["workload_key"],
                       key_hash=data["key_hash"], features=data["features"], count=int(data["count"]),
                       instance_names=tuple(data["instance_names"])).validate()
        except (KeyError, TypeError) as exc:
            raise SchemaError(f"KernelWorkload JSON is malformed ({type(exc).__name__}: {exc})") from exc

    def validate(self) -> "KernelWorkload":
        if self.key_hash != key_hash_of(self.workload_key):
            raise PredictorError(f"kernel {self.name}: key_hash does not match its workload_key")
        if len(self.input_shapes) != len(self.input_dtypes) or self.count < 1:
            raise PredictorError(f"kernel {self.name}: shapes/dtypes must pair up and count be >= 1")
        return self


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


def _tensor_type(ty: Any, what: str) -> tuple[tuple[int, ...], str]:
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        raise PredictorError(f"{what}: only tensors with static shapes can be profiled; found {ty}")
    try:
        return tuple(int(d) for d in ty.shape.values), str(ty.dtype)
    except (TypeError, ValueError):
        raise PredictorError(f"{what}: shape {ty.shape} is symbolic; bind input shapes first") from None


def _graph_features(graph: OpGraph | None) -> dict[tuple[str, tuple], dict[str, Any]]:
    """Kernel-level OpNode dicts of ``graph`` keyed by (kind of the kernel name, output shapes)."""
    if graph is None:
        return {}
    kernels = graph.kernel_graph() if graph.level == "op" else graph
    out: dict[tuple[str, tuple], dict[str, Any]] = {}
    for node in kernels.nodes:
        out.setdefault((kernel_kind(node.name), tuple(node.output_shapes)), node.to_dict())
    return out


def kernels_of_module(mod: tvm.IRModule, target: tvm.target.Target | None = None,
                      graph: OpGraph | None = None, database_dir: str | None = None) -> list[KernelWorkload]:
    """The distinct fused kernels of ``mod`` (a model's Relax module), one standalone module each.

    Identical PrimFuncs (same structural hash) are profiled once; ``count`` says how often ``main`` calls it.
    Features: the kernel-level OpNode of ``graph`` (the model's OpGraph from tvm_passes.extract, op or kernel
    level) whose name and output shapes match the kernel; for kernels without a match (or no graph), a
    kernel-level OpNode derived from the TIR (shapes, bytes, FLOPs estimated by TVM, ``op`` = kernel kind).
    """
    from tvm.s_tir.analysis import estimate_tir_flops
    pipeline, target = deployment_pipeline(target, database_dir)
    fused = fuse_for_deployment(mod, target, pipeline)
    known = _graph_features(graph)
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
    workloads = []
    for h in order:
        entry = found[h]
        name = entry["names"][0]
        ins = [_tensor_type(a.ty, f"{name} argument {i}") for i, a in enumerate(entry["args"])]
        outs = [_tensor_type(t, f"{name} output") for t in entry["out"]]
        kind = kernel_kind(name)
        key = canonical_json({"kind": kind, "inputs": [[list(s), d] for s, d in ins],
                              "outputs": [[list(s), d] for s, d in outs], "tir_hash": f"{h:016x}"})
        bb = relax.BlockBuilder()
        params = [relax.Var(f"arg{i}", relax.TensorType(list(s), d)) for i, (s, d) in enumerate(ins)]
        with bb.function("main", params):
            gv = bb.add_func(entry["func"], name)
            out_ty = [relax.TensorType(list(s), d) for s, d in outs]
            with bb.dataflow():
                out = bb.emit_output(relax.call_tir(gv, relax.Tuple(params), out_ty[0] if len(outs) == 1 else out_ty))
            bb.emit_func_output(out)
        features = known.get((kind, tuple(s for s, _ in outs)))
        if features is not None:
            features = {**features, "tags": {**features["tags"], "tir_hash": f"{h:016x}"}}
        else:
            flops = int(estimate_tir_flops(tvm.IRModule({"main": entry["func"]})))
            param_bytes = sum(tensor_bytes(s, d) for a, (s, d) in zip(entry["args"], ins)
                              if not isinstance(a, relax.Var))
            features = OpNode(id=0, name=name, op=kind, input_shapes=[s for s, _ in ins],
                              input_dtypes=[d for _, d in ins], output_shapes=[s for s, _ in outs],
                              output_dtypes=[d for _, d in outs], flops=flops,
                              bytes_read=sum(tensor_bytes(s, d) for s, d in ins),
                              bytes_written=sum(tensor_bytes(s, d) for s, d in outs), param_bytes=param_bytes,
                              kernel_group=0, tags={"source": "tir", "tir_hash": f"{h:016x}"}).to_dict()
        workloads.append(KernelWorkload(
            name=name, kind=kind, mod=bb.get(), input_shapes=tuple(s for s, _ in ins),
            input_dtypes=tuple(d for _, d in ins), output_shapes=tuple(s for s, _ in outs),
            output_dtypes=tuple(d for _, d in outs), workload_key=key, key_hash=key_hash_of(key),
            features=dict(features), count=len(entry["names"]), instance_names=tuple(entry["names"])).validate())
    return workloads


def canary_workload(size: int = 256, target: tvm.target.Target | None = None) -> KernelWorkload:
    """The fixed canary: a ``size x size x size`` float32 matmul, compiled like every other kernel."""
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType([size, size], "float32"))
    b = relax.Var("b", relax.TensorType([size, size], "float32"))
    with bb.function("main", [a, b]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(a, b))
        bb.emit_func_output(out)
    (kernel,) = kernels_of_module(bb.get(), target)
    return kernel
