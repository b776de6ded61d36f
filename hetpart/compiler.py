"""``hetpart.compile``: import -> OpGraph -> CostTable -> Plan -> annotated Relax -> one executable + report.

Planning happens at the fused-kernel level (the units TVM really launches); the kernel plan is expanded to
the op level for ``tvm_passes.annotate``. ``plan.json`` in the output directory is the kernel-level plan: edit
a device there and pass it back with ``--plan`` to compile exactly that placement.
"""
from __future__ import annotations

import functools
import json
import os
import logging
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from hetpart.costs import CostTable
from hetpart.devices import (DEFAULT_GPU_PRESET, DeviceSet, cpu_device, gpu_from_preset, preset_links)
from hetpart.errors import DegeneratePlanWarning, InvalidPlanError, PredictorError, UnknownDeviceError
from hetpart.graph import OpGraph
from hetpart.plan import Plan, Timeline
from hetpart.threads import deployment_threads

log = logging.getLogger(__name__)

DEFAULT_CPU_PREDICTOR = "cpu_default.json"
COMPILE_INFO = "compile.json"


@dataclass(frozen=True)
class DeviceChoice:
    devices: DeviceSet
    gpu_preset: str | None          # analytic preset for the GPU's costs (None: no GPU offered)


def parse_devices(spec: str | Sequence[str]) -> DeviceChoice:
    """``"cpu,gpu=t4"`` / ``"cpu,gpu"`` (default preset) / ``"cpu"`` -> devices + links (datasheet)."""
    items = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    if not items or items[0] != "cpu":
        raise UnknownDeviceError(f"--devices must start with the host cpu, e.g. cpu,gpu=p2200; found {spec!r}")
    devices = [cpu_device()]
    links: list = []
    preset = None
    for item in items[1:]:
        name, _, value = item.partition("=")
        if name != "gpu" or preset is not None:
            raise UnknownDeviceError(f"unknown device {item!r} in {spec!r}: hetpart plans for one cpu and at most "
                                     "one gpu (gpu=<preset>, e.g. gpu=t4)")
        preset = value or DEFAULT_GPU_PRESET
        if preset == "cuda":
            raise UnknownDeviceError("gpu=cuda needs a measured GPU predictor, which only a machine with CUDA can "
                                     "produce (`hetpart profile --device gpu`); use a datasheet preset such as gpu=t4")
        devices.append(gpu_from_preset(preset))
        links.extend(preset_links(preset))
    return DeviceChoice(DeviceSet(tuple(devices), tuple(links)).validate(), preset)


@functools.lru_cache(maxsize=1)
def host_cpu_name() -> str:
    """LLVM's name for this host's CPU core (TVM's ``-mcpu``, e.g. ``znver4``): what compiled kernels are tuned
    for, and so what a CPU predictor's measurements are valid for (asked once per process)."""
    from tvm_passes.schedules.pipeline import default_cpu_target

    return str(default_cpu_target().attrs["mcpu"])


def cpu_predictor_path_for(cpu_name: str) -> Path:
    """predictors/data/cpu_<cpu_name>.json: where ``hetpart fit`` writes, and the loader looks first."""
    return Path(str(resources.files("predictors") / "data" / f"cpu_{cpu_name}.json"))


def default_cpu_predictor_path(cpu_name: str | None = None) -> Path:
    """The predictor fitted for this host's CPU (``cpu_<mcpu>.json``) if there is one, else ``cpu_default.json``.

    One machine kind is not one CPU here: the same 2-core VMs ran on AMD Zen 5 (znver5), Zen 4 (znver4) and Intel
    (rocketlake) cores, where the profiler's canary kernel takes 70, 147-152 and 105 µs and other kernels differ by
    other factors, so a predictor is only valid on the CPU it was measured on (:func:`load_cpu_predictor` scales one
    from another CPU by a calibration suite timed on the host)."""
    cpu_name = cpu_name if cpu_name is not None else host_cpu_name()
    matched = cpu_predictor_path_for(cpu_name)
    return matched if matched.exists() else Path(str(resources.files("predictors") / "data" / DEFAULT_CPU_PREDICTOR))


def resolve_cpu_predictor_path(path: str | Path | None = None) -> Path:
    """``path``, else $HETPART_CPU_PREDICTOR, else :func:`default_cpu_predictor_path`."""
    return Path(path or os.environ.get("HETPART_CPU_PREDICTOR") or default_cpu_predictor_path())


def predictor_rules_version(predictor: Any) -> int | None:
    """The version of hetpart's CPU schedule rules (``tvm_passes.schedules.RULES_VERSION``) that compiled the
    kernels a predictor was fitted on, from the pipeline versions its profile database recorded; None when the
    predictor does not record them (fitted before they were kept)."""
    found = [int(part.removeprefix("rules-")) for version in
             predictor.fit_info.get("training", {}).get("pipeline_versions", ())
             for part in str(version).split(".") if part.startswith("rules-") and part[6:].isdigit()]
    return max(found) if found else None


def stale_rules_note(predictor: Any) -> str | None:
    """Why a predictor's costs may be stale for this hetpart's kernels (older CPU rules), or None."""
    from tvm_passes.schedules import RULES_VERSION

    fitted = predictor_rules_version(predictor)
    if fitted is not None and fitted >= RULES_VERSION:
        return None
    when = f"CPU rules v{fitted}" if fitted is not None else "CPU rules it does not record"
    return (f"fitted on kernels compiled by {when}; this hetpart compiles v{RULES_VERSION}, so the costs of the "
            "kernels the newer rules changed are stale (tvm_passes/schedules/__init__.py lists each version's change)")


def cpu_cost_note(predictor: Any, path: Path) -> str:
    """One line for the report: which predictor gave the CPU costs, the CPU it was measured on and, when it was
    scaled to this host by the calibration suite (:mod:`predictors.host_calibration`), by how much."""
    fitted = predictor.fit_info.get("fit_date", "at an unrecorded date")
    note = (f"CPU costs: {path.name}, measured on a {predictor.target.get('mcpu', 'unrecorded')} CPU with "
            f"{predictor.num_threads or 'an unrecorded number of'} TVM thread(s), fitted {fitted}; this host's CPU: "
            f"{host_cpu_name()}")
    scaling = getattr(predictor, "scaling", None)
    if scaling:
        note += (f"; scaled x{scaling['speed_ratio']:.2f} to this host: the geometric mean of measured / predicted "
                 f"over {scaling['n_kernels']} calibration kernels timed here with {scaling['host_threads']} "
                 f"thread(s) (x{scaling['kernel_ratio_min']:.2f} to x{scaling['kernel_ratio_max']:.2f} per kernel)")
    stale = stale_rules_note(predictor)
    if stale:
        note += f"; {stale}"
    return note


def load_cpu_predictor(path: str | Path | None = None, *, scale_to_host: bool = True):
    """The CPU predictor: ``path``, else $HETPART_CPU_PREDICTOR, else the shipped one for this host's CPU
    (:func:`default_cpu_predictor_path`).

    When it was measured on another CPU or with another TVM thread count, this warns and -- unless
    ``scale_to_host=False`` -- times a calibration suite here and scales every prediction by the host's speed
    ratio (:class:`predictors.host_calibration.HostScaledPredictor`; ~5 s the first time on a host, then cached)."""
    from predictors.device_predictor import DevicePredictor
    from predictors.host_calibration import scale_to_host as scale

    path = resolve_cpu_predictor_path(path)
    if not path.exists():
        raise PredictorError(f"no CPU latency predictor at {path}; build one with `hetpart profile --device cpu "
                             "--budget-minutes 60` and `hetpart fit`, or pass --cpu-predictor FILE")
    predictor = DevicePredictor.load(path)
    fitted_on, host = str(predictor.target.get("mcpu", "")), host_cpu_name()
    threads = deployment_threads()
    foreign_cpu = bool(fitted_on) and fitted_on != host
    foreign_threads = bool(predictor.num_threads) and predictor.num_threads != threads
    result = predictor
    if scale_to_host and (foreign_cpu or foreign_threads):
        try:
            result = scale(predictor, host, threads)
        except PredictorError as exc:       # e.g. TVM's pool already runs another thread count than deployments
            log.warning("cannot scale the CPU predictor to this host: %s", exc)
    remedy = (f"scaled x{result.speed_ratio:.2f} by a calibration suite timed here, a first-order correction "
              "(benchmarks/results/predictor_transfer*.md)" if result is not predictor else "not scaled")
    if foreign_cpu:
        log.warning("the CPU predictor %s was measured on a %s CPU; this host is a %s: its CPU costs are %s. "
                    "Profile and fit on this host for costs measured here: `hetpart profile --device cpu "
                    "--budget-minutes 60 && hetpart fit` writes %s, which is then used by default.",
                    path, fitted_on, host, remedy, cpu_predictor_path_for(host))
    if foreign_threads:
        log.warning("the CPU predictor %s was fitted on kernels timed with %d TVM thread(s); this deployment runs %d "
                    "(TVM_NUM_THREADS): its CPU costs are %s. Profile and fit with the deployment's "
                    "TVM_NUM_THREADS.", path, predictor.num_threads, threads, remedy)
    stale = stale_rules_note(predictor)
    if stale:
        log.warning("the CPU predictor %s was %s. Refit it on this host: `hetpart profile --device cpu "
                    "--budget-minutes 60 && hetpart fit`.", path, stale)
    return result


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
                notes=plan.notes, stats=plan.stats).validate(ops)


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
    _runner: Any = None

    def _report_data(self):
        from hetpart.report import ReportData

        return ReportData(graph=self.graph, costs=self.costs, plan=self.plan, timeline=self.timeline,
                          baselines_us=self.baselines_us, why=self.why, op_graph=self.op_graph,
                          build=self.build.manifest.to_dict(), compile_seconds=self.seconds,
                          import_notes=tuple(self.source.get("import_notes", ())),
                          cost_notes=tuple(self.source.get("cost_notes", ())))

    def report(self) -> str:
        """The markdown report (images are referenced by file name, written by :meth:`save`)."""
        from hetpart.report import markdown

        return markdown(self._report_data(), {"gantt": "gantt.png", "graph": "graph.png"})

    def save(self, directory: str | Path) -> Path:
        """Write library, manifest, plans, costs and report to ``directory`` atomically (temp dir + rename)."""
        from hetpart.report import write_report
        from tvm_passes.artifact import export

        target = Path(directory).resolve()
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            export(self.build, staging)
            self.plan.save(staging / "plan.json")
            self.op_plan.save(staging / "op_plan.json")
            self.costs.save(staging / "costs.json")
            self.op_graph.save(staging / "graph.json")
            (staging / "timeline.json").write_text(json.dumps(self.timeline.to_dict()))
            (staging / COMPILE_INFO).write_text(json.dumps({**self.source, "seconds": self.seconds}, indent=1))
            write_report(self._report_data(), staging)
            if target.exists():
                backup = target.with_name(f".{target.name}.old")
                if backup.exists():
                    shutil.rmtree(backup)
                target.rename(backup)
                staging.rename(target)
                shutil.rmtree(backup)
            else:
                staging.rename(target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return target

    def __call__(self, *args: Any, **named: Any) -> list[np.ndarray]:
        if not args and not named:
            raise InvalidPlanError("call the compiled model with its inputs (numpy arrays)")
        arrays = list(args) if args else [named[str(i["name"])] for i in self.build.manifest.inputs]
        return self.build.run(*[np.asarray(a) for a in arrays])


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


def compile(model: Any, *, devices: str | Sequence[str] = "cpu,gpu", method: str = "cp_greedy",
            pins: Mapping[str, str] | None = None, plan: str | Path | Plan | None = None,
            input_shapes: Any = None, example_inputs: Sequence[Any] | None = None, batch: int | None = None,
            size: int | None = None, cpu_predictor: str | Path | None = None, emulate_gpu: bool | None = None,
            output_dir: str | Path | None = None,
            progress: Callable[[str], None] | None = None) -> CompiledModel:
    """Compile ``model`` (ONNX path, zoo name, or torch.nn.Module + ``example_inputs``) for a CPU+GPU machine."""
    from hetpart import api
    from hetpart.partition import PartitionConfig, explain, get_method
    from hetpart.simulate import simulate
    from predictors.analytic import AnalyticGpuModel
    from predictors.costs import build_cost_table
    from tvm_passes.annotate import annotate_module
    from tvm_passes.build import build, cuda_available
    from tvm_passes.extract import extract_op_graph

    say = progress or (lambda msg: log.info("%s", msg))
    seconds: dict[str, float] = {}
    started = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal started
        now = time.perf_counter()
        seconds[name] = round(now - started, 2)
        started = now

    choice = parse_devices(devices)
    say("importing model")
    imported = api.import_model(model, input_shapes=input_shapes, example_inputs=example_inputs, batch=batch,
                                size=size)
    lap("import")
    say(f"extracting ops and fused kernels of {imported.name}")
    op_graph = extract_op_graph(imported.mod, name=imported.name, source_hash=imported.source_hash,
                                param_inputs=imported.param_inputs)
    graph = op_graph.kernel_graph()
    lap("analyze")
    say(f"predicting latencies of {graph.num_ops} kernels on {', '.join(choice.devices.names)}")
    cpu_path = resolve_cpu_predictor_path(cpu_predictor)
    predictors: dict[str, Any] = {"cpu": load_cpu_predictor(cpu_path)}
    if choice.gpu_preset is not None:
        predictors["gpu"] = AnalyticGpuModel(choice.gpu_preset)
    costs = build_cost_table(graph, predictors, choice.devices)
    lap("costs")
    config = PartitionConfig(pins=dict(pins or {}))
    if plan is not None:
        chosen = plan if isinstance(plan, Plan) else Plan.load(plan)
        chosen = chosen.validate(graph)
        if set(chosen.devices) != set(choice.devices.names):
            raise InvalidPlanError(f"the plan uses devices {list(chosen.devices)} but --devices offers "
                                   f"{list(choice.devices.names)}")
        say(f"using the given plan ({chosen.method}), re-simulated")
        timeline = simulate(graph, costs, chosen)
        chosen = replace(chosen, makespan_us=timeline.makespan_us, pins=dict(pins or chosen.pins)).validate(graph)
    else:
        say(f"partitioning with {method}")
        chosen = get_method(method)(graph, costs, config)
        timeline = simulate(graph, costs, chosen)
    baselines = _simulate_baselines(graph, costs, config)
    why = explain(graph, costs, chosen)
    lap("plan")
    op_plan = expand_plan(chosen, graph, op_graph)
    emulate = (not cuda_available()) if emulate_gpu is None else emulate_gpu
    say("compiling" + (" (GPU emulated on a second CPU device: no CUDA here)" if emulate and len(choice.devices.names) > 1 else ""))
    annotated = annotate_module(imported.mod, op_plan, choice.devices)
    tuning = api.tuning_database_dir()
    built = build(annotated, choice.devices, emulate_gpu=emulate,
                  tuning_database=tuning if any(tuning.glob("*.json")) else None)
    lap("build")
    source = {"model": str(model) if isinstance(model, (str, Path)) else type(model).__name__,
              "name": imported.name, "source_kind": imported.source_kind, "source_hash": imported.source_hash,
              "onnx_path": str(imported.onnx_path) if imported.onnx_path else None,
              "inputs": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype} for t in imported.inputs],
              "devices": choice.devices.to_dict(), "method": chosen.method, "emulated": built.manifest.emulated,
              "import_notes": list(imported.notes), "cost_notes": [cpu_cost_note(predictors["cpu"], cpu_path)]}
    result = CompiledModel(name=imported.name, op_graph=op_graph, graph=graph, costs=costs, plan=chosen,
                           op_plan=op_plan, timeline=timeline, baselines_us=baselines, build=built, why=why,
                           source=source, seconds=seconds)
    if output_dir is not None:
        say(f"writing {output_dir}")
        result.save(output_dir)
        lap("save")
    return result
