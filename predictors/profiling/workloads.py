"""What the profiler measures: the fused kernels of a model's deployment pipeline, as standalone workloads.

:func:`kernels_of_module` outlines every distinct fused kernel of a model (:func:`tvm_passes.outline.outline_kernels`:
the deployment pipeline up to its fused, scheduled PrimFuncs, one standalone module per kernel) and keys each one
by kind, shapes, dtypes and the TIR structural hash, with its kernel-level features (:class:`KernelWorkload`);
:func:`canary_workload` is the fixed canary matmul. :mod:`predictors.profiling.profiler` times them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

import tvm
from tvm import relax

from hetpart.errors import PredictorError, SchemaError
from hetpart.graph import OpGraph, OpNode, tensor_bytes
from predictors.profiling.store import canonical_json, key_hash_of
from tvm_passes.outline import kernel_kind, outline_kernels

WORKLOAD_SCHEMA_VERSION = 1


def target_string(target: tvm.target.Target) -> str:
    """Canonical JSON of a target (what the database stores)."""
    return canonical_json(json.loads(str(target)))


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

    known = _graph_features(graph)
    workloads = []
    for kernel in outline_kernels(mod, target, database_dir):
        name, kind, ins, outs = kernel.name, kernel.kind, kernel.inputs, kernel.outputs
        tir_hash = f"{kernel.structural_hash:016x}"
        key = canonical_json({"kind": kind, "inputs": [[list(s), d] for s, d in ins],
                              "outputs": [[list(s), d] for s, d in outs], "tir_hash": tir_hash})
        features = known.get((kind, tuple(s for s, _ in outs)))
        if features is not None:
            features = {**features, "tags": {**features["tags"], "tir_hash": tir_hash}}
        else:
            flops = int(estimate_tir_flops(tvm.IRModule({"main": kernel.func})))
            param_bytes = sum(tensor_bytes(s, d) for constant, (s, d) in zip(kernel.constant_inputs, ins)
                              if constant)
            features = OpNode(id=0, name=name, op=kind, input_shapes=[s for s, _ in ins],
                              input_dtypes=[d for _, d in ins], output_shapes=[s for s, _ in outs],
                              output_dtypes=[d for _, d in outs], flops=flops,
                              bytes_read=sum(tensor_bytes(s, d) for s, d in ins),
                              bytes_written=sum(tensor_bytes(s, d) for s, d in outs), param_bytes=param_bytes,
                              kernel_group=0, tags={"source": "tir", "tir_hash": tir_hash}).to_dict()
        workloads.append(KernelWorkload(
            name=name, kind=kind, mod=kernel.mod, input_shapes=tuple(s for s, _ in ins),
            input_dtypes=tuple(d for _, d in ins), output_shapes=tuple(s for s, _ in outs),
            output_dtypes=tuple(d for _, d in outs), workload_key=key, key_hash=key_hash_of(key),
            features=dict(features), count=len(kernel.instance_names),
            instance_names=kernel.instance_names).validate())
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
