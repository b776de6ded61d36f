"""Building the segments a :class:`hetpart.driver.task_runtime.TaskRuntime` runs, from a Relax module and an
op-level plan, or from a compiled model (``TaskRuntime.from_module`` and ``TaskRuntime.from_compiled``)."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from hetpart.errors import InvalidPlanError, UsageError
from hetpart.segments import Segmentation

__all__ = ["plan_segments", "segments_of_module", "segments_of_compiled"]


def segments_of_module(mod: Any, graph: Any, plan: Any, *, gpu_devices: Sequence[str] = ("gpu",),
                       tuning_database: Any = None, devices: Sequence[Mapping[str, Any]] = (),
                       segmentation: Segmentation | None = None, sharing: Any = None) -> Any:
    """The :class:`tvm_passes.segment_build.SegmentBuild` of the op-level ``plan`` of ``graph`` (the OpGraph of
    ``mod["main"]``): ``segmentation`` (checked against the graph and plan) or ``segment_plan(graph, plan)``;
    ``sharing``: a :class:`hetpart.cross_sharing.SharingTable` of those segments (every one built for every
    device)."""
    from hetpart.segments import segment_plan
    from tvm_passes.segment_build import build_segments

    if plan.level != "op":
        raise InvalidPlanError(f"the task runtime segments an op-level plan; found level={plan.level!r} "
                               "(expand a kernel plan with hetpart.driver.compiler.expand_plan)")
    segmentation = segment_plan(graph, plan) if segmentation is None else segmentation.validate(graph, plan)
    return build_segments(mod, segmentation, gpu_devices, tuning_database=tuning_database, devices=devices,
                          sharing=sharing)


def plan_segments(op_graph: Any, op_plan: Any, graph: Any, plan: Any, costs: Any,
                  across: Any = None) -> tuple[Segmentation, Any]:
    """The op-level segments the task runtime runs for the kernel-level ``plan`` (expanded as ``op_plan``), and
    their :class:`hetpart.cross_sharing.SharingTable` when ``across`` (a ``RuntimeModel`` with
    ``cross_device_sharing``) is given, else None. With sharing, the kernel-level segments the simulator prices are
    expanded (ids kept), so the table's segments are the runtime's; otherwise
    ``hetpart.driver.task_segments.runtime_segmentation``."""
    from hetpart.driver.task_segments import kernel_segmentation, runtime_segmentation
    from hetpart.segments import expand_segmentation, segment_plan
    from hetpart.simulate_requests import sharing_table

    if across is None or not across.cross_device_sharing:
        return runtime_segmentation(op_graph, op_plan, graph, plan), None
    kernel_segments = kernel_segmentation(graph, plan) or segment_plan(graph, plan)
    return (expand_segmentation(kernel_segments, graph, op_graph, op_plan),
            sharing_table(graph, costs, plan, runtime=across, segmentation=kernel_segments))


def _imported_module(compiled: Any) -> Any:
    onnx_path = compiled.source.get("onnx_path")
    if not onnx_path:
        raise UsageError("this model was not compiled from an ONNX file; pass the imported module "
                         "(tvm_passes.sources.import_model(...).mod) as module=")
    from tvm_passes.rnn import RnnImportOptions
    from tvm_passes.sources import import_model

    shapes = {str(i["name"]): list(i["shape"]) for i in compiled.source["inputs"]}
    rnn = compiled.source.get("rnn_options")
    return import_model(onnx_path, input_shapes=shapes, rnn_options=RnnImportOptions(**rnn) if rnn else None).mod


def segments_of_compiled(compiled: Any, module: Any = None) -> Any:
    """The SegmentBuild of a :class:`hetpart.driver.compiler.CompiledModel`'s plan. ``module`` is the imported Relax
    module it was compiled from; by default it is re-imported from the ONNX file the compile recorded, and refused
    unless its op graph is the compiled one. The segments are the plan's
    (``hetpart.driver.task_segments.runtime_segmentation``: one per time-slice task for a plan that needs it); a plan
    made for cross-device sharing gets its kernel-level segments, built for every device, with their table."""
    from hetpart.partition.common import PartitionConfig
    from hetpart.partition.request_score import runtime_model
    from tvm_passes.extract import extract_op_graph

    module = _imported_module(compiled) if module is None else module
    found = extract_op_graph(module, with_kernels=False).structure_hash()
    if found != compiled.op_graph.structure_hash():
        raise InvalidPlanError(f"the module's op graph ({found}) is not the one compiled "
                               f"({compiled.op_graph.structure_hash()}); pass the module it was compiled from")
    gpus = [d.name for d in compiled.costs.devices.devices if d.kind == "gpu"]
    devices = [{"name": d.name, "kind": d.kind, "cores": list(d.cores)} for d in compiled.costs.devices.devices]
    model = runtime_model(PartitionConfig.coerce(dict(compiled.plan.config)), compiled.costs.device_names)
    segmentation, table = plan_segments(compiled.op_graph, compiled.op_plan, compiled.graph, compiled.plan,
                                        compiled.costs, model)
    return segments_of_module(module, compiled.op_graph, compiled.op_plan, gpu_devices=gpus, devices=devices,
                              segmentation=segmentation, sharing=table)
