"""``hetpart.compile``: import -> OpGraph -> CostTable -> Plan -> annotated Relax -> one executable + report.

Planning happens at the fused-kernel level (the units TVM really launches); the kernel plan is expanded to
the op level for ``tvm_passes.annotate``. ``plan.json`` in the output directory is the kernel-level plan: edit
a device there and pass it back with ``--plan`` to compile exactly that placement.
"""
from __future__ import annotations

import json
import logging
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from hetpart.costs import CostTable
from hetpart.driver.device_choice import DEFAULT_DEVICES, DeviceChoice, parse_devices
from hetpart.driver.inputs import check_inputs
from hetpart.errors import DegeneratePlanWarning, InvalidPlanError, UsageError
from hetpart.graph import OpGraph
from hetpart.plan import Plan, Timeline

log = logging.getLogger(__name__)

COMPILE_INFO = "compile.json"


def expand_plan(plan: Plan, kernels: OpGraph, ops: OpGraph) -> Plan:
    """Kernel-level plan -> op-level plan (every op on its kernel's device, kernels issued in plan order)."""
    device_of = [""] * ops.num_ops
    order: list[int] = []
    for k in plan.order:
        members = sorted(kernels.nodes[k].tags.get("op_ids", [k]))
        for op_id in members:
            device_of[op_id] = plan.device_of[k]
        order.extend(members)
    return Plan(device_of=device_of, order=order, devices=plan.devices, method=plan.method,
                makespan_us=plan.makespan_us, config=plan.config, graph_hash=ops.structure_hash(), level="op",
                notes=plan.notes, stats=plan.stats, device_spec=plan.device_spec).validate(ops)


@dataclass
class CompiledModel:
    """The result of :func:`compile`: plan, predictions, the built executable; callable on numpy arrays."""

    name: str
    op_graph: OpGraph
    graph: OpGraph                  # kernel level: what was planned
    costs: CostTable
    plan: Plan                      # kernel level
    op_plan: Plan
    timeline: Timeline
    baselines_us: Mapping[str, float]
    build: Any                      # tvm_passes.build.BuildResult
    why: list
    source: Mapping[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    segments: Any = None            # tvm_passes.segment_build.SegmentBuild for the task runtime (compile(segments=True))
    task_runtime: dict[str, Any] | None = None   # its predicted figures (report_fidelity.predict_task_runtime)
    _runner: Any = None
    _index_bounds: dict[str, int] | None = None

    def _report_data(self):
        from hetpart.driver.report import ReportData

        return ReportData(graph=self.graph, costs=self.costs, plan=self.plan, timeline=self.timeline,
                          baselines_us=self.baselines_us, why=self.why, op_graph=self.op_graph,
                          build=self.build.manifest.to_dict(), compile_seconds=self.seconds,
                          import_notes=tuple(self.source.get("import_notes", ())),
                          cost_notes=tuple(self.source.get("cost_notes", ())),
                          weight_uploads=self.build.stats.get("weight_uploads"),
                          weight_upload_bytes=self.build.stats.get("weight_upload_bytes"),
                          program_copies_per_call=self.build.stats.get("copies_per_call"),
                          task_runtime=self.task_runtime)

    def report(self) -> str:
        """The markdown report (images are referenced by file name, written by :meth:`save`)."""
        from hetpart.driver.report import markdown

        return markdown(self._report_data(), {"gantt": "gantt.png", "graph": "graph.png"})

    def save(self, directory: str | Path, *, overwrite: bool = False) -> Path:
        """Write library, manifest, plans, costs and report to ``directory``.

        ``directory`` must be new or empty; an earlier hetpart output there is replaced only with
        ``overwrite=True``, and nothing hetpart did not write is ever deleted (:mod:`hetpart.driver.output_dir`). The
        files are written into a temporary sibling and renamed into place, so an interrupted save leaves the
        earlier output intact."""
        from hetpart.driver.output_dir import write_directory
        from hetpart.driver.report import write_report
        from tvm_passes.artifact import export

        def write(staging: Path) -> None:
            export(self.build, staging)
            self.plan.save(staging / "plan.json")
            self.op_plan.save(staging / "op_plan.json")
            self.costs.save(staging / "costs.json")
            self.op_graph.save(staging / "graph.json")
            (staging / "timeline.json").write_text(json.dumps(self.timeline.to_dict()))
            (staging / COMPILE_INFO).write_text(json.dumps({**self.source, "seconds": self.seconds,
                                                            "task_runtime": self.task_runtime,
                                                            "index_bounds": self.index_bounds}, indent=1))
            write_report(self._report_data(), staging)
            if self.segments is not None:
                from tvm_passes.segment_artifact import export_segments

                export_segments(self.segments, staging)

        return write_directory(directory, write, overwrite=overwrite)

    def __call__(self, *args: Any, **named: Any) -> list[np.ndarray]:
        if not args and not named:
            raise InvalidPlanError("call the compiled model with its inputs (numpy arrays)")
        return self.build.run(*check_inputs(self.build.manifest.inputs, args, named, self.index_bounds))

    @property
    def index_bounds(self) -> dict[str, int]:
        """Table length of each input that indexes a table (token ids; :func:`hetpart.driver.check.index_input_bounds`),
        checked on every call: the compiled gather does not check its indices."""
        if self._index_bounds is None:
            from hetpart.driver.check import index_input_bounds

            self._index_bounds = index_input_bounds(self.op_graph)
        return self._index_bounds


def _simulate_baselines(graph: OpGraph, costs: CostTable, config) -> dict[str, float]:
    from hetpart.errors import HetpartError
    from hetpart.partition import get_method

    out = {}
    for method in ("all_cpu", "all_gpu", "greedy", "heft"):
        if method != "all_cpu" and len(costs.device_names) < 2:
            continue
        try:
            with warnings.catch_warnings():  # single-device baselines are degenerate on purpose
                warnings.simplefilter("ignore", DegeneratePlanWarning)
                out[method] = float(get_method(method)(graph, costs, config).makespan_us)
        except HetpartError as exc:  # e.g. all_gpu infeasible (unsupported ops / memory)
            log.info("baseline %s not available: %s", method, exc)
    return out


def _build_segments(mod: Any, op_graph: OpGraph, op_plan: Plan, graph: OpGraph, plan: Plan, choice: DeviceChoice,
                    emulate: bool, tuning_database: Path | None, costs: CostTable, across: Any = None) -> Any:
    """The plan's segments (:func:`hetpart.driver.task_segments.runtime_segmentation`: one per time-slice task for a
    plan that needs it, else :func:`hetpart.segments.segment_plan`), each one function of one executable for the task
    runtime. ``across`` (the runtime model of a plan made for cross-device sharing): the kernel-level segments
    expanded (ids kept), every one built for every device, with their :func:`hetpart.simulate_requests.sharing_table`."""
    from hetpart.driver.task_build import plan_segments
    from tvm_passes.segment_build import build_segments

    gpus = [d.name for d in choice.devices.devices if d.kind == "gpu"]
    devices = [{"name": d.name, "kind": d.kind, "cores": list(d.cores)} for d in choice.devices.devices]
    gpu_target = dict(choice.devices.device(gpus[0]).target) if gpus else None
    segmentation, table = plan_segments(op_graph, op_plan, graph, plan, costs, across)
    return build_segments(mod, segmentation, gpus, emulate_gpu=emulate, tuning_database=tuning_database,
                          devices=devices, gpu_target=gpu_target, sharing=table)


def _cross_sharing_model(plan: Plan, overhead: Any, costs: CostTable) -> Any:
    """The task runtime's model with cross-device sharing when the plan was made for it (partition options
    ``cross_device_sharing`` and ``work_sharing``) and its overheads were measured, else None."""
    from hetpart.partition import PartitionConfig
    from hetpart.partition.request_score import runtime_model

    planned_for = runtime_model(PartitionConfig.coerce(dict(plan.config)), costs.device_names)
    if overhead is None or not planned_for.cross_device_sharing:
        return None
    return replace(overhead.runtime_model(costs.device_names), cross_device_sharing=True)


def _measure_overhead(choice: DeviceChoice, costs: CostTable) -> Any:
    """The task runtime's overheads per segment and per request on these devices, measured here now
    (:func:`hetpart.driver.runtime_overhead.measure_dispatch_overhead`, per request after a request as long as
    this model's on one device)."""
    from hetpart.driver.report_fidelity import device_dicts
    from hetpart.driver.runtime_overhead import measure_dispatch_overhead, single_device_request_us

    return measure_dispatch_overhead(device_dicts(choice.devices), request_us=single_device_request_us(costs))


def _predict_task_runtime(graph: OpGraph, costs: CostTable, plan: Plan, overhead: Any,
                          segments: int, across: Any = None) -> dict[str, Any]:
    """The task runtime's predicted figures, with its measured overhead per segment, simulated with the segments
    the runtime runs (one per time-slice task for a plan that needs it)."""
    from hetpart.driver.report_fidelity import predict_task_runtime
    from hetpart.driver.task_segments import kernel_segmentation
    from hetpart.simulate_requests import simulate_requests

    predicted = predict_task_runtime(graph, costs, plan, overhead, segments, model=across)
    per_task = kernel_segmentation(graph, plan)
    if per_task is not None:      # predict_task_runtime simulates segment_plan's segments; re-simulate with the tasks
        model = across or overhead.runtime_model(costs.device_names)
        one = simulate_requests(graph, costs, plan, n_requests=1, runtime=model, segmentation=per_task)
        many = simulate_requests(graph, costs, plan, n_requests=int(predicted["requests"]), runtime=model,
                                 segmentation=per_task)
        predicted.update(one_request_us=one.makespan_us, period_us=many.period_us,
                         p50_latency_us=float(np.median(many.latency_us)))
    return predicted


def _given_plan(plan: str | Path | Plan | None, devices: str | Sequence[str] | None) -> tuple[Plan | None, DeviceChoice]:
    """Read ``plan`` (if any) and choose the devices: ``devices`` if given, else the devices the plan was made for,
    else :data:`DEFAULT_DEVICES`. A plan made for other devices than ``devices`` is refused."""
    chosen = None if plan is None else plan if isinstance(plan, Plan) else Plan.load(plan)
    recorded = chosen.device_spec if chosen is not None else ""
    if devices is None:
        if chosen is not None and not recorded:
            log.warning("the plan does not record the devices it was made for (written by an older hetpart); "
                        "planning for --devices %s", DEFAULT_DEVICES)
        devices = recorded or DEFAULT_DEVICES
    choice = parse_devices(devices)
    if recorded and parse_devices(recorded).spec != choice.spec:
        raise InvalidPlanError(f"the plan was made for --devices {recorded}, not {choice.spec}: its costs and "
                               f"placement are for those devices. Drop --devices to reuse the plan's, or re-plan "
                               f"for {choice.spec} without --plan")
    return chosen, choice


def _time_calibration_suite(num_threads: int, specs: tuple) -> Any:
    """Time the host calibration suite now (a foreign CPU predictor and no clean cached calibration): the profiler is
    imported only then."""
    from predictors.profiling.calibration_sweep import time_fresh

    return time_fresh(num_threads, specs)


def compile(model: Any, *, devices: str | Sequence[str] | None = None, method: str | None = None,
            pins: Mapping[str, str] | None = None, plan: str | Path | Plan | None = None,
            input_shapes: Any = None, example_inputs: Sequence[Any] | None = None, batch: int | None = None,
            size: int | None = None, cpu_predictor: str | Path | None = None, emulate_gpu: bool | None = None,
            output_dir: str | Path | None = None, overwrite: bool = False, segments: bool | None = None,
            requests: int | None = None, slice_steps: int | None = None, rnn_projection: str | None = None,
            partition_options: Mapping[str, Any] | None = None, outputs: str | Sequence[str] | None = None,
            progress: Callable[[str], None] | None = None) -> CompiledModel:
    """Compile ``model`` (ONNX path, zoo name, or torch.nn.Module + ``example_inputs``) for a CPU+GPU machine.

    ``devices``: ``"cpu,gpu=<preset>"`` (default ``cpu,gpu``: the p2200 preset), or the devices ``plan`` was made
    for. ``method``: a partitioner of :data:`hetpart.partition.METHODS` (default ``DEFAULT_METHOD``). ``plan``: a
    plan.json (or Plan) to compile as it is instead of planning. ``output_dir``: write the executable, plans and
    report there; it must be new or empty, or an earlier hetpart output with ``overwrite=True``. ``segments=True``
    also builds the plan's segments for the task runtime (``hetpart.load(dir, mode="tasks")``; the GPU's segments
    compiled for CUDA, or emulated without it), and plans for it: the runtime's overhead per segment is measured
    first and given to the partitioner (unless ``partition_options`` sets ``dispatch_overhead_us_by_device``).
    ``segments=None`` (the default) builds them when the plan is made for the task runtime: ``timeslice`` or
    ``portfolio`` for more than one request in flight, or cross-device sharing, on more than one device.
    ``requests``: requests in flight the ``timeslice`` and ``portfolio`` plans are chosen for (simulated N-request
    makespan); ``slice_steps``: ``timeslice``'s steps per time slice;
    ``rnn_projection="per_slice"`` imports ONNX RNNs with one input projection per ``slice_steps`` steps
    (``tvm_passes.rnn``). ``partition_options``: further :class:`hetpart.partition.PartitionConfig` options, e.g.
    ``{"timeslice_segments": "slices", "dispatch_overhead_us_by_device": {...}}`` (a ``timeslice`` plan may then run
    one segment per slice task; ``segments=True`` builds those). ``outputs``: tensor names (``"a,b"`` or a list) to
    keep an ONNX model up to, e.g. before a detector's NonMaxSuppression (``tvm_passes.onnx_cut``). Every argument
    is checked before the model is imported."""
    from tvm_passes import sources
    from tvm_passes.onnx_cut import parse_output_names
    from hetpart.driver.output_dir import check_writable
    from hetpart.partition import DEFAULT_METHOD, PartitionConfig, explain, get_method
    from hetpart.simulate import simulate
    from predictors.analytic import AnalyticGpuModel
    from predictors.costs import build_cost_table
    from predictors.registry import load_host_cpu_predictor
    from tvm_passes.annotate import annotate_module
    from tvm_passes.build import build, cuda_available, deployment_vdevices
    from tvm_passes.extract import extract_op_graph
    from tvm_passes.rnn import RnnImportOptions
    from tvm_passes.vdevices import single_vm_plan
    from tvm_passes.tuning_db import default_database_dir, has_database

    say = progress or (lambda msg: log.info("%s", msg))
    seconds: dict[str, float] = {}
    started = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal started
        now = time.perf_counter()
        seconds[name] = round(now - started, 2)
        started = now

    method = method or DEFAULT_METHOD
    solve = get_method(method)
    timeslice = {k: v for k, v in (("requests", requests), ("slice_steps", slice_steps)) if v is not None}
    given = {"pins": dict(pins or {}), **timeslice}
    twice = sorted(set(given) & set(partition_options or {}))
    if twice:
        raise UsageError(f"partition_options repeats {twice}, which compile() takes as arguments; give each once")
    config = PartitionConfig.coerce({**given, **dict(partition_options or {})})
    rnn_options = None if rnn_projection is None else RnnImportOptions(rnn_projection, slice_steps or 1)
    given_plan, choice = _given_plan(plan, devices)
    if segments is None:            # a plan made for many requests in flight runs on the task runtime
        segments = given_plan is None and len(choice.devices.names) > 1 and (
            config.cross_device_sharing or (method in ("timeslice", "portfolio") and config.requests > 1))
    if output_dir is not None:
        check_writable(output_dir, overwrite=overwrite)
    outputs = None if outputs is None else parse_output_names(outputs)
    say("importing model")
    imported = sources.import_model(model, input_shapes=input_shapes, example_inputs=example_inputs, batch=batch,
                                size=size, rnn_options=rnn_options, outputs=outputs)
    lap("import")
    say(f"extracting ops and fused kernels of {imported.name}")
    op_graph = extract_op_graph(imported.mod, name=imported.name, source_hash=imported.source_hash,
                                param_inputs=imported.param_inputs)
    graph = op_graph.kernel_graph()
    lap("analyze")
    say(f"predicting latencies of {graph.num_ops} kernels on {', '.join(choice.devices.names)}")
    predictors: dict[str, Any] = {}
    cost_notes = []
    for device in choice.cpu_devices:
        at_threads = load_host_cpu_predictor(cpu_predictor, time_fresh=_time_calibration_suite,
                                             threads=device.threads)
        predictors[device.name] = at_threads.predictor
        note = at_threads.cost_note()
        cost_notes.append(note if len(choice.cpu_devices) == 1 else f"{device.name}: {note}")
    if choice.gpu_preset is not None:
        predictors["gpu"] = AnalyticGpuModel(choice.gpu_preset)
    costs = build_cost_table(graph, predictors, choice.devices)
    lap("costs")
    overhead = None
    if segments and len(choice.devices.names) > 1:
        say("measuring the task runtime's overheads per segment and per request")
        overhead = _measure_overhead(choice, costs)
        if given_plan is None and not config.dispatch_overhead_us_by_device:    # the plan is made for the runtime
            config = replace(config, dispatch_overhead_us_by_device=overhead.runtime_model(
                costs.device_names).dispatch_overhead_us_by_device)
        lap("runtime overhead")
    if given_plan is not None:
        chosen = given_plan.validate(graph)
        if set(chosen.devices) != set(choice.devices.names):
            raise InvalidPlanError(f"the plan uses devices {list(chosen.devices)} but --devices offers "
                                   f"{list(choice.devices.names)}")
        say(f"using the given plan ({chosen.method}), re-simulated")
        timeline = simulate(graph, costs, chosen)
        chosen = replace(chosen, makespan_us=timeline.makespan_us, pins=dict(pins or chosen.pins)).validate(graph)
    else:
        say(f"partitioning with {method}")
        chosen = solve(graph, costs, config)
        timeline = simulate(graph, costs, chosen)
    chosen = replace(chosen, device_spec=choice.spec)
    baselines = _simulate_baselines(graph, costs, config)
    why = explain(graph, costs, chosen)
    lap("plan")
    op_plan = expand_plan(chosen, graph, op_graph)
    emulate = (not cuda_available()) if emulate_gpu is None else emulate_gpu
    say("compiling" + (" (GPU emulated on a second CPU device: no CUDA here)" if emulate and choice.gpu_preset is not None else ""))
    one_vm_plan = single_vm_plan(op_plan, choice.devices)      # CPU core groups share the host's VM
    annotated = annotate_module(imported.mod, one_vm_plan, choice.devices,
                                deployment_vdevices(one_vm_plan, choice.devices, emulate_gpu=emulate))
    tuning = default_database_dir()
    built = build(annotated, choice.devices, emulate_gpu=emulate,
                  tuning_database=tuning if has_database(tuning) else None)
    segment_build = task_runtime = None
    across = _cross_sharing_model(chosen, overhead, costs)
    if segments:
        say("building the plan's segments for the task runtime"
            + (", each for every device (cross-device sharing)" if across is not None else ""))
        segment_build = _build_segments(imported.mod, op_graph, op_plan, graph, chosen, choice, emulate,
                                        tuning if has_database(tuning) else None, costs, across)
    lap("build")
    if segment_build is not None and overhead is not None:
        task_runtime = _predict_task_runtime(graph, costs, chosen, overhead, len(segment_build.program.functions),
                                             across)
    source = {"model": str(model) if isinstance(model, (str, Path)) else type(model).__name__,
              "name": imported.name, "source_kind": imported.source_kind, "source_hash": imported.source_hash,
              "onnx_path": str(imported.onnx_path) if imported.onnx_path else None,
              "inputs": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype} for t in imported.inputs],
              "devices": choice.devices.to_dict(), "method": chosen.method, "emulated": built.manifest.emulated,
              "import_notes": list(imported.notes), "cost_notes": cost_notes,
              "outputs": None if outputs is None else list(outputs),
              "rnn_options": None if rnn_options is None else {"input_projection": rnn_options.input_projection,
                                                               "slice_steps": rnn_options.slice_steps}}
    result = CompiledModel(name=imported.name, op_graph=op_graph, graph=graph, costs=costs, plan=chosen,
                           op_plan=op_plan, timeline=timeline, baselines_us=baselines, build=built, why=why,
                           source=source, seconds=seconds, segments=segment_build, task_runtime=task_runtime)
    if output_dir is not None:
        say(f"writing {output_dir}")
        result.save(output_dir, overwrite=overwrite)
        lap("save")
    return result
