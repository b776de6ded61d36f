"""Re-emit a Relax ``main`` as one function per plan segment and build them into one executable.

The task runtime (``hetpart.driver.task_runtime``) runs a plan's segments (``hetpart.segments.Segmentation``,
op ids = :func:`tvm_passes.bindings.op_bindings` order of the *imported, un-annotated* ``main``) on one worker
thread per device. ``emit_segment_functions`` rewrites ``main`` with a BlockBuilder into one function
``hetpart_seg<k>`` per segment, all in ONE IRModule:

- parameters: the model inputs the segment's ops read (in ``main``'s parameter order), then the outputs of other
  segments' ops it reads (ascending op id, exactly ``segment.inputs``);
- body: the segment's op bindings in plan order, plus every non-op binding (TupleGetItem, Tuple, alias,
  constant) they need, re-emitted inside the segment; weights stay constants of the function;
- result: always a tuple, the segment's ``outputs`` (ops read by another segment or by the model output) in
  op order.

No function carries a vdevice: every function is a single-device program and the *VM* places it. Without CUDA
the GPU is emulated by a second CPU device (``tvm.cpu(1)``), so all segment functions compile for the same llvm
target into ONE executable (one ``.so``); the CPU worker runs it on a VM created for ``cpu(0)``, the GPU worker on
a VM created for ``cpu(1)`` (each VM loads the constants onto its own device, so the weights are held twice).
For a real CUDA GPU (``emulate_gpu=False``) the GPU segment functions are compiled for CUDA into a second
executable (``segments_gpu.so``), which the GPU worker runs on ``tvm.cuda(0)`` on its own stream.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import tvm
from tvm import relax

from hetpart.errors import BuildError, InvalidPlanError, SchemaError, UnsupportedOpError
from hetpart.segments import Segmentation
from tvm_passes.bindings import op_bindings
from tvm_passes.native_log import native_output_to_log

__all__ = ["SegmentFunction", "SegmentProgram", "SegmentBuild", "emit_segment_functions", "build_segments",
           "function_name", "gpu_source"]

logger = logging.getLogger(__name__)



def function_name(segment_id: int) -> str:
    return f"hetpart_seg{segment_id}"


@dataclass(frozen=True)
class SegmentFunction:
    """How to call one segment function: its device, what each parameter is, and what it returns."""

    segment: int
    device: str
    name: str
    input_params: tuple[int, ...]      # indices into the model inputs, first parameters
    op_params: tuple[int, ...]         # op ids produced by other segments, following parameters
    outputs: tuple[int, ...]           # op ids, the returned tuple's fields in order


@dataclass(frozen=True)
class SegmentProgram:
    """All segment functions of a plan, in segment id order, and where the model outputs come from."""

    functions: tuple[SegmentFunction, ...]
    model_outputs: tuple[tuple[int, tuple[int, ...]], ...]   # per output leaf: (op id, tuple index path)
    input_names: tuple[str, ...]
    segment_of: tuple[int, ...]                               # segment per op id

    def to_dict(self) -> dict[str, Any]:
        return {"functions": [{"segment": f.segment, "device": f.device, "name": f.name,
                               "input_params": list(f.input_params), "op_params": list(f.op_params),
                               "outputs": list(f.outputs)} for f in self.functions],
                "model_outputs": [[op, list(path)] for op, path in self.model_outputs],
                "input_names": list(self.input_names), "segment_of": list(self.segment_of)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SegmentProgram":
        try:
            functions = tuple(SegmentFunction(int(f["segment"]), str(f["device"]), str(f["name"]),
                                              tuple(f["input_params"]), tuple(f["op_params"]), tuple(f["outputs"]))
                              for f in data["functions"])
            return cls(functions, tuple((int(op), tuple(path)) for op, path in data["model_outputs"]),
                       tuple(data["input_names"]), tuple(data["segment_of"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise SchemaError(f"segment program JSON is malformed ({type(exc).__name__}: {exc})") from exc


@dataclass(frozen=True)
class SegmentBuild:
    """The compiled segment functions (one executable) and how to call them."""

    executable: Any
    program: SegmentProgram
    input_specs: tuple[dict[str, Any], ...]     # name, shape, dtype per model input
    emulated: bool
    build_time_s: float = 0.0
    stats: dict[str, Any] = field(default_factory=dict)
    # The plan's devices in DeviceSet order (the host first): name, kind and the cores of a CPU device (empty: any).
    devices: tuple[dict[str, Any], ...] = ()
    gpu_executable: Any = None                  # the GPU segment functions compiled for CUDA (None: emulated/none)
    # Cross-device sharing: every segment function built for every device, and each segment's predicted time and
    # input copies per device (hetpart.cross_sharing.SharingTable.to_dict()); None: each is built for its device
    sharing: dict[str, Any] | None = None


class _SegmentEmitter:
    def __init__(self, func: relax.Function):
        self.func = func
        self.ops = op_bindings(func)
        self.op_id_of = {b.var: i for i, b in enumerate(self.ops)}
        self.param_index = {p: k for k, p in enumerate(func.params)}
        self.binding_of: dict[relax.Var, relax.VarBinding] = {}
        for block in func.body.blocks:
            for binding in block.bindings:
                if not isinstance(binding, relax.VarBinding):
                    raise UnsupportedOpError(f"segment functions need plain var bindings; {binding.var.name!r} is a "
                                             f"{type(binding).__name__}; bind shapes statically first")
                self.binding_of[binding.var] = binding
        self.dataflow = all(isinstance(b, relax.DataflowBlock) for b in func.body.blocks)

    # ----------------------------------------------------------------- analysis
    def reads(self, op_ids: Sequence[int]) -> tuple[set[int], set[int]]:
        """(model input indices, external op ids) that the ops ``op_ids`` read, through non-op bindings."""
        inside = set(op_ids)
        inputs: set[int] = set()
        external: set[int] = set()
        seen: set[relax.Var] = set()
        stack = [v for op in op_ids for v in relax.analysis.free_vars(self.ops[op].value)]
        while stack:
            var = stack.pop()
            if var in seen:
                continue
            seen.add(var)
            if var in self.param_index:
                inputs.add(self.param_index[var])
            elif var in self.op_id_of:
                if self.op_id_of[var] not in inside:
                    external.add(self.op_id_of[var])
            elif var in self.binding_of:
                stack.extend(relax.analysis.free_vars(self.binding_of[var].value))
            else:
                raise InvalidPlanError(f"variable {var.name!r} is not defined in main")
        return inputs, external

    def output_leaves(self) -> list[tuple[int, tuple[int, ...]]]:
        leaves: list[tuple[int, tuple[int, ...]]] = []

        def walk(expr: relax.Expr, path: tuple[int, ...]) -> None:
            if isinstance(expr, relax.Tuple):
                for f in expr.fields:
                    walk(f, ())
                return
            if isinstance(expr, relax.Var) and expr in self.op_id_of:
                leaves.append((self.op_id_of[expr], path))
                return
            if isinstance(expr, relax.Var) and expr in self.binding_of:
                value = self.binding_of[expr].value
                if isinstance(value, relax.TupleGetItem):
                    return walk_item(value.tuple_value, (int(value.index),) + path)
                if isinstance(value, (relax.Var, relax.Tuple)) and not path:
                    return walk(value, ())
            raise UnsupportedOpError(f"model output {expr} is not computed by an op (a model input or a constant "
                                     "returned as is); the task runtime cannot serve it")

        def walk_item(expr: relax.Expr, path: tuple[int, ...]) -> None:
            if isinstance(expr, relax.Var) and expr in self.op_id_of:
                leaves.append((self.op_id_of[expr], path))
            elif isinstance(expr, relax.Var) and expr in self.binding_of and isinstance(
                    self.binding_of[expr].value, relax.Tuple):
                walk(self.binding_of[expr].value.fields[path[0]], path[1:])
            else:
                walk(expr, path)

        walk(self.func.body.body, ())
        return leaves

    # ----------------------------------------------------------------- emission
    def emit(self, bb: relax.BlockBuilder, name: str, op_ids: Sequence[int], input_params: Sequence[int],
             op_params: Sequence[int], outputs: Sequence[int]) -> None:
        new_var: dict[relax.Var, relax.Expr] = {}
        params = []
        for k in input_params:
            old = self.func.params[k]
            new_var[old] = relax.Var(old.name, old.ty)
            params.append(new_var[old])
        for op in op_params:
            old = self.ops[op].var
            new_var[old] = relax.Var(f"{old.name}_in", old.ty)
            params.append(new_var[old])
        inside = set(op_ids)

        def define(var: relax.Var) -> relax.Expr:
            if var not in new_var:
                if var in self.op_id_of:
                    where = "its own op" if self.op_id_of[var] in inside else "an op it does not take as input"
                    raise InvalidPlanError(f"segment function {name} reads op {self.op_id_of[var]} ({var.name}), "
                                           f"{where}, before it is computed: plan.order must be topological")
                new_var[var] = bb.emit(rewrite(self.binding_of[var].value), name_hint=var.name)
            return new_var[var]

        def rewrite(expr: relax.Expr) -> relax.Expr:
            if isinstance(expr, relax.Var):
                return define(expr)
            if isinstance(expr, relax.Tuple):
                return relax.Tuple([rewrite(f) for f in expr.fields])
            if isinstance(expr, relax.TupleGetItem):
                return relax.TupleGetItem(rewrite(expr.tuple_value), expr.index)
            if isinstance(expr, relax.Call) and not isinstance(expr.op, tvm.ir.Op):
                raise UnsupportedOpError(f"segment functions re-emit op calls only; found a call to {expr.op}")
            return expr

        def body() -> relax.Expr:
            for op in op_ids:
                binding = self.ops[op]
                call = binding.value
                new_call = relax.Call(call.op, [rewrite(a) for a in call.args], call.attrs, call.ty_args, call.span)
                new_var[binding.var] = bb.emit(new_call, name_hint=binding.var.name)
            return relax.Tuple([new_var[self.ops[op].var] for op in outputs])

        with bb.function(name, params, pure=self.func.is_pure):
            if self.dataflow:
                with bb.dataflow():
                    result = bb.emit_output(body())
            else:
                result = bb.emit(body())
            bb.emit_func_output(result)


def emit_segment_functions(mod: tvm.IRModule, segmentation: Segmentation) -> tuple[tvm.IRModule, SegmentProgram]:
    """One function per segment of ``segmentation`` (see the module docstring), all in one new IRModule."""
    if "vdevice" in mod.global_infos:
        raise InvalidPlanError("emit_segment_functions needs the frontend's module, not an annotated one")
    emitter = _SegmentEmitter(mod["main"])
    if len(emitter.ops) != len(segmentation.segment_of):
        raise InvalidPlanError(f"the segmentation covers {len(segmentation.segment_of)} ops but main has "
                               f"{len(emitter.ops)} op bindings; segment the op-level plan of this module")
    leaves = emitter.output_leaves()
    model_output_ops = {op for op, _ in leaves}
    # the functions main calls come along (e.g. the PrimFuncs the ONNX frontend emits for a Clip with tensor
    # bounds: MobileNetV2's ReLU6 is call_tir(maximum/minimum) already at import)
    bb = relax.BlockBuilder(tvm.IRModule({gv: f for gv, f in mod.functions_items() if gv.name_hint != "main"},
                                         attrs=mod.attrs))
    functions = []
    for seg in segmentation.segments:
        inputs, external = emitter.reads(seg.op_ids)
        declared = {i.op_id for i in seg.inputs}
        if not external <= declared:
            raise InvalidPlanError(f"segment {seg.id} reads ops {sorted(external - declared)} that its "
                                   f"segmentation does not list as inputs; segment this module's own op graph")
        op_params = tuple(sorted(external))
        outputs = tuple(op for op in seg.op_ids if op in set(seg.outputs) | model_output_ops)
        fn = SegmentFunction(seg.id, seg.device, function_name(seg.id), tuple(sorted(inputs)), op_params, outputs)
        emitter.emit(bb, fn.name, seg.op_ids, fn.input_params, fn.op_params, fn.outputs)
        functions.append(fn)
    out = bb.get()
    program = SegmentProgram(tuple(functions), tuple(leaves), tuple(p.name for p in mod["main"].params),
                             segmentation.segment_of)
    logger.info("emitted %d segment functions (%s)", len(functions),
                ", ".join(f"{f.name}@{f.device}:{len(segmentation.segments[f.segment].op_ids)} ops"
                          for f in functions[:8]) + (" ..." if len(functions) > 8 else ""))
    return out, program


def _input_specs(func: relax.Function) -> tuple[dict[str, Any], ...]:
    specs = []
    for p in func.params:
        if not isinstance(p.ty, relax.TensorType) or p.ty.shape is None:
            raise BuildError(f"model input {p.name!r} must be a tensor of static shape; found {p.ty}")
        specs.append({"name": p.name, "shape": [int(s) for s in p.ty.shape.values], "dtype": str(p.ty.dtype)})
    return tuple(specs)


def build_segments(mod: tvm.IRModule, segmentation: Segmentation, gpu_devices: Sequence[str] = ("gpu",), *,
                   emulate_gpu: bool = True, cpu_target: Any = None,
                   tuning_database: str | Path | None = None,
                   devices: Sequence[dict[str, Any]] = (), gpu_target: Any = None,
                   sharing: Any = None) -> SegmentBuild:
    """Emit the segment functions of ``mod["main"]`` and compile them: the CPU segments (and, with
    ``emulate_gpu``, the GPU ones, run on a second CPU device) into one executable for the host CPU target with
    hetpart's CPU pipeline (``tvm_passes.schedules.cpu_pipeline``); with ``emulate_gpu=False`` the segments on
    ``gpu_devices`` into a second executable for ``gpu_target`` (e.g. ``{"kind": "cuda", "arch": "sm_75"}``) with
    TVM's CUDA pipeline (DLight schedules). ``devices`` (name, kind and cores per device, the host first) is
    recorded for the task runtime. ``sharing`` (a :class:`hetpart.cross_sharing.SharingTable` of these segments):
    build every segment function for every device that can run it (the GPU executable also holds the CPU segments
    the table prices on the GPU; the CPU executable keeps every one) so that the task runtime's workers may run
    each other's segments, and record the table for it."""
    from tvm.target import Target

    from tvm_passes.schedules.pipeline import cpu_pipeline, default_cpu_target

    start = time.perf_counter()
    on_gpu = any(s.device in gpu_devices for s in segmentation.segments)
    if on_gpu and not emulate_gpu and gpu_target is None:
        raise BuildError("GPU segments compiled for the GPU need its target: pass gpu_target (e.g. "
                         "{'kind': 'cuda', 'arch': 'sm_75'}), or emulate_gpu=True")
    seg_mod, program = emit_segment_functions(mod, segmentation)
    runnable_on_gpu: set[int] = set()       # with sharing: the segments a GPU may take (the table prices them there)
    if sharing is not None:
        sharing = sharing.validate(len(program.functions))
        runnable_on_gpu = {f.segment for f in program.functions for g in gpu_devices if g in sharing.devices
                           and sharing.duration_us[sharing.index(g)][f.segment] is not None}
        sharing = sharing.to_dict()
    target = cpu_target if isinstance(cpu_target, Target) else (
        Target(dict(cpu_target)) if cpu_target is not None else default_cpu_target())
    gpu_executable = None
    if on_gpu and not emulate_gpu:
        gpu_names = {f.name for f in program.functions if f.device in gpu_devices or f.segment in runnable_on_gpu}
        rest, gpu_mod = _split_functions(seg_mod, gpu_names)
        seg_mod = seg_mod if sharing is not None else rest       # sharing: the CPU executable keeps every one
        gpu_executable = _compile_gpu(gpu_mod, gpu_target, target)
    try:
        with native_output_to_log():
            executable = tvm.compile(seg_mod, target=target, relax_pipeline=cpu_pipeline(target, tuning_database))
    except Exception as exc:  # TVM raises its own error types
        raise BuildError(f"compiling the segment functions failed: {type(exc).__name__}: "
                         f"{str(exc).strip()[:2000]}") from exc
    seconds = round(time.perf_counter() - start, 3)
    logger.info("built %d segment functions in %.2f s", len(program.functions), seconds)
    return SegmentBuild(executable, program, _input_specs(mod["main"]), emulated=on_gpu and emulate_gpu,
                        build_time_s=seconds, stats={"segments": len(program.functions)},
                        devices=tuple({"name": str(d["name"]), "kind": str(d["kind"]),
                                       "cores": [int(c) for c in d.get("cores", ())]} for d in devices),
                        gpu_executable=gpu_executable, sharing=sharing)


def _split_functions(mod: tvm.IRModule, names: set[str]) -> tuple[tvm.IRModule, tvm.IRModule]:
    """(the segment functions not in ``names``, the ones in ``names``) as two modules, each with the other
    functions its segment functions call (a function both call goes to both)."""
    segments = {gv: f for gv, f in mod.functions_items() if isinstance(f, relax.Function)}

    def with_callees(chosen: dict) -> tvm.IRModule:
        called = {gv for f in chosen.values() for gv in relax.analysis.all_global_vars(f)}
        return tvm.IRModule({**{gv: mod[gv] for gv in called if gv not in segments}, **chosen})

    return (with_callees({gv: f for gv, f in segments.items() if gv.name_hint not in names}),
            with_callees({gv: f for gv, f in segments.items() if gv.name_hint in names}))


def _compile_gpu(gpu_mod: tvm.IRModule, gpu_target: Any, host: Any) -> Any:
    """The GPU segment functions compiled for ``gpu_target`` (TVM's CUDA pipeline: legalization, fusion, DLight),
    checked to have become ``__global__`` kernels."""
    from tvm.relax.backend.cuda.pipeline import get_default_pipeline
    from tvm.target import Target

    target = Target(dict(gpu_target), host=host)
    try:
        with native_output_to_log():
            executable = tvm.compile(gpu_mod, target=target, relax_pipeline=get_default_pipeline(target))
    except Exception as exc:  # TVM raises its own error types
        raise BuildError(f"compiling the GPU segment functions for {dict(gpu_target)} failed: "
                         f"{type(exc).__name__}: {str(exc).strip()[:2000]}") from exc
    if "__global__" not in gpu_source(executable):
        raise BuildError("the GPU segment functions produced no CUDA kernel (__global__); they would run as host "
                         "code")
    return executable


def gpu_source(executable: Any) -> str:
    """The CUDA source of an executable's imported modules ("" when there is none)."""
    found, stack, seen = [], [executable.mod], set()
    while stack:
        module = stack.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        if module.kind == "cuda":
            found.append(module.inspect_source())
        stack.extend(module.imports)
    return "\n".join(found)
