"""Cost module units through hetpart: import each unit module into Relax, extract its fused kernels, predict them
on every device type of a training cluster, and sum per unit. The result, :class:`UnitGraph`, is an OpGraph whose
nodes are units plus the :class:`~hetpart.training.cost_model.TrainCosts` the training partitioners take, so any
``solve(graph, train_costs, cluster, config)`` runs on it unchanged and its stages map back to module names.

* **Forward**: a unit's forward time on a device type is the sum of its kernels' predicted latencies there (the
  host CPU predictor for CPU processes, at ``cpu_threads`` TVM threads; the analytic datasheet roofline for a GPU
  preset). Each unit is imported on its own, so TVM cannot fuse across unit boundaries, and the root module's
  glue ops between units (``torch.flatten``, adding a position embedding) are not costed; both are listed in the
  unit's tags. Kernels a GPU cannot run (shape computations) are left out of the GPU sum.
* **Backward**: every kernel's forward time x the ratio of its op kind (:class:`BackwardRatios`, by default the
  table measured with torch on a CPU and shipped with hetpart), summed per unit.
* **Memory**: parameters are the torch parameters a unit owns (exact); activations are the bytes its kernels
  write (what autograd roughly keeps per micro-batch).

A unit whose module imports to no kernel at all (a Dropout, a Flatten) is folded into the unit before it.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import numpy as np

from hetpart.costs import CostTable
from hetpart.devices import DeviceSet, DeviceSpec, cpu_device, gpu_from_preset
from hetpart.graph import OpGraph
from hetpart.threads import ensure_tvm_threads
from hetpart.training.cluster import CPU_PRESET, Cluster
from hetpart.training.cost_model import BackwardRatios, TrainCosts
from hetpart.training.stage_plan import StagePlan, with_unit_names
from hetpart.training_torch.errors import UnitMappingError
from hetpart.training_torch.plan_file import contiguous_split_points
from hetpart.training_torch.units import TracedModel, TracedUnit, map_units, trace_model

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KernelSums:
    """One unit's kernels: counts and sums per device preset."""

    kernels: int
    op_types: tuple[str, ...]               # member Relax op types of every kernel
    flops: int
    activation_bytes: int
    forward_us: Mapping[str, float]         # preset -> µs (supported kernels)
    backward_us: Mapping[str, float]
    unsupported: Mapping[str, int] = field(default_factory=dict)   # preset -> kernels it cannot run


@dataclass(frozen=True)
class UnitGraph:
    """A torch model as units: the unit OpGraph, per-preset forward CostTables, the TrainCosts over a cluster."""

    graph: OpGraph
    units: tuple[TracedUnit, ...]
    costs: Mapping[str, CostTable]          # cluster preset -> forward latency of every unit (one column)
    train_costs: TrainCosts
    cluster: Cluster
    microbatch_size: int
    notes: tuple[str, ...] = ()
    sums: Mapping[str, KernelSums] = field(default_factory=dict, repr=False)    # unit name -> its kernels' sums
    ratios: BackwardRatios | None = field(default=None, repr=False)

    @property
    def unit_names(self) -> tuple[str, ...]:
        return tuple(u.name for u in self.units)

    def with_cluster(self, cluster: Cluster | str, optimizer: str | None = None) -> "UnitGraph":
        """The same units and costs on another cluster of the same device types (no re-import, no re-costing)."""
        cluster = Cluster.parse(cluster) if isinstance(cluster, str) else cluster.validate()
        missing = sorted(set(cluster.presets) - set(self.costs))
        if missing:
            raise UnitMappingError(f"the units were costed for {sorted(self.costs)}, not for {missing}; build the "
                                   "unit graph for this cluster")
        return replace(self, cluster=cluster, train_costs=_train_costs(
            self.graph, self.units, self.sums, self.costs, cluster, self.ratios or BackwardRatios(),
            optimizer or self.train_costs.optimizer, self.microbatch_size))

    def stage_unit_names(self, plan: StagePlan) -> list[tuple[str, ...]]:
        """Per stage, the names of the units it holds (in forward order)."""
        plan.check_graph(self.graph)
        return [tuple(self.units[i].name for i in stage.op_ids) for stage in plan.stages]

    def name_stages(self, plan: StagePlan) -> StagePlan:
        """``plan`` with every stage's ``unit_names`` filled with its module paths."""
        return with_unit_names(plan, self.stage_unit_names(plan))

    def split_points(self, plan: StagePlan) -> list[str]:
        """The unit each stage after the first begins with: ``pipeline(split_spec={name: SplitPoint.BEGINNING})``.
        Stages must be contiguous runs of units in forward order (what a split at module boundaries can cut)."""
        plan.check_graph(self.graph)
        return contiguous_split_points([s.op_ids for s in plan.stages], self.unit_names)


# ------------------------------------------------------------------------------------------------ predictors
def _time_calibration_suite(num_threads: int, specs: tuple) -> Any:
    """Time the host calibration suite now (a foreign CPU predictor without a clean cached calibration)."""
    from predictors.profiling.calibration_sweep import time_fresh

    return time_fresh(num_threads, specs)


def preset_predictors(cluster: Cluster, *, cpu_predictor: Any = None,
                      cpu_threads: int = 1) -> tuple[dict[str, tuple[DeviceSpec, Any]], list[str]]:
    """preset -> (DeviceSpec, predictor) for every device type of the cluster, and notes on where costs come from."""
    predictors: dict[str, tuple[DeviceSpec, Any]] = {}
    notes: list[str] = []
    for preset in cluster.presets:
        if preset == CPU_PRESET:
            from predictors.registry import load_host_cpu_predictor

            host = load_host_cpu_predictor(cpu_predictor, time_fresh=_time_calibration_suite, threads=cpu_threads)
            predictors[preset] = (cpu_device(), host.predictor)
            notes.append(f"cpu: {host.cost_note()}")
        else:
            from predictors.analytic import AnalyticGpuModel

            predictors[preset] = (gpu_from_preset(preset), AnalyticGpuModel(preset))
            notes.append(f"{preset}: analytic roofline of the datasheet preset (no measurement)")
    return predictors, notes


def cost_kernels(kernel_graph: OpGraph, predictors: Mapping[str, tuple[DeviceSpec, Any]],
                 ratios: BackwardRatios) -> KernelSums:
    """Sum one unit's kernel latencies per preset; backward per kernel = forward x ratio of its kind."""
    from predictors.costs import build_cost_table

    fwd: dict[str, float] = {}
    bwd: dict[str, float] = {}
    unsupported: dict[str, int] = {}
    ratio = np.array([ratios.ratio(n) for n in kernel_graph.nodes], dtype=np.float64)
    for preset, (spec, predictor) in predictors.items():
        table = build_cost_table(kernel_graph, {spec.name: predictor}, DeviceSet((spec,)))
        ok = table.supported[:, 0]
        lat = np.where(ok, table.latency_us[:, 0], 0.0)
        fwd[preset], bwd[preset] = float(lat.sum()), float((lat * ratio).sum())
        if not ok.all():
            unsupported[preset] = int((~ok).sum())
    op_types = tuple(t for n in kernel_graph.nodes for t in (n.tags.get("op_types") or [n.op]))
    return KernelSums(kernels=kernel_graph.num_ops, op_types=op_types,
                      flops=int(sum(n.flops for n in kernel_graph.nodes)),
                      activation_bytes=int(sum(n.bytes_written for n in kernel_graph.nodes)),
                      forward_us=fwd, backward_us=bwd, unsupported=unsupported)


def _unit_kernel_graph(model: Any, unit: TracedUnit, args: tuple) -> OpGraph:
    from hetpart.driver import api

    module = model.get_submodule(unit.name)
    flags = {m: m.training for m in module.modules()}
    try:
        return api.analyze(module, example_inputs=args, level="kernel")
    except Exception as exc:
        from hetpart.errors import HetpartError

        if isinstance(exc, HetpartError):
            raise UnitMappingError(f"unit {unit.name!r} ({unit.module_type}) could not be imported by hetpart: "
                                   f"{type(exc).__name__}: {exc}") from exc
        raise
    finally:
        for m, flag in flags.items():   # the importer puts the module in eval mode
            m.training = flag


# ------------------------------------------------------------------------------------------------ building
def build_unit_graph(model: Any, example_inputs: Sequence[Any], cluster: Cluster | str, *, granularity: int = 1,
                     ratios: BackwardRatios | None = None, optimizer: str = "sgd", cpu_predictor: Any = None,
                     cpu_threads: int = 1, name: str = "") -> UnitGraph:
    """Units of ``model`` for one micro-batch ``example_inputs``, costed on every device type of ``cluster``."""
    ensure_tvm_threads()          # before anything loads TVM
    from hetpart.training_torch.backward_calibration import load_ratios

    cluster = Cluster.parse(cluster) if isinstance(cluster, str) else cluster.validate()
    ratios = (ratios or load_ratios()).validate()
    trace = trace_model(model, example_inputs, granularity=granularity, name=name)
    traced = map_units(trace)
    predictors, notes = preset_predictors(cluster, cpu_predictor=cpu_predictor, cpu_threads=cpu_threads)
    sums: dict[str, KernelSums] = {}
    by_signature: dict[tuple, KernelSums | None] = {}     # identical units (transformer layers) are costed once
    empty: set[str] = set()
    for unit in traced.units:
        key = (unit.signature, unit.input_shapes, unit.input_dtypes)
        if key not in by_signature:
            kernel_graph = _unit_kernel_graph(model, unit, traced.example_args[unit.name])
            by_signature[key] = cost_kernels(kernel_graph, predictors, ratios) if kernel_graph.num_ops else None
        if by_signature[key] is None:
            empty.add(unit.name)
            continue
        sums[unit.name] = by_signature[key]
        log.debug("unit %s: %d kernels, forward %s", unit.name, sums[unit.name].kernels,
                 ", ".join(f"{p} {v:.1f} us" for p, v in sums[unit.name].forward_us.items()))
    if empty:
        if len(empty) == len(traced.units):
            raise UnitMappingError(f"no unit of {traced.name} imports to a kernel: nothing to plan")
        traced = map_units(trace, fold=frozenset(empty))
    return _assemble(traced, sums, predictors, cluster, ratios, optimizer, notes,
                     microbatch_size=_batch_of(example_inputs))


def _batch_of(example_inputs: Sequence[Any]) -> int:
    shape = getattr(example_inputs[0], "shape", ()) if example_inputs else ()
    return int(shape[0]) if len(shape) else 1


def _assemble(traced: TracedModel, sums: Mapping[str, KernelSums], predictors: Mapping[str, tuple[DeviceSpec, Any]],
              cluster: Cluster, ratios: BackwardRatios, optimizer: str, notes: Sequence[str],
              microbatch_size: int) -> UnitGraph:
    extras = []
    for k, unit in enumerate(traced.units):
        s = sums[unit.name]
        reads = sum(e.size_bytes for e in traced.edges if e.dst == k) + unit.param_bytes \
            + sum(t.size_bytes for t in traced.inputs if k in t.consumers)
        extras.append({"flops": s.flops, "bytes_read": reads, "bytes_written": traced.output_bytes[k],
                       "tags": {"kernels": s.kernels, "op_types": list(s.op_types),
                                "activation_bytes": s.activation_bytes,
                                "forward_us": {p: round(v, 3) for p, v in s.forward_us.items()},
                                "backward_us": {p: round(v, 3) for p, v in s.backward_us.items()},
                                **({"unsupported_kernels": dict(s.unsupported)} if s.unsupported else {})}})
    graph = traced.to_graph(extras)
    tables: dict[str, CostTable] = {}
    for preset, (spec, predictor) in predictors.items():
        lat = np.array([[sums[u.name].forward_us[preset]] for u in traced.units], dtype=np.float64)
        tables[preset] = CostTable.from_arrays(
            lat, DeviceSet((spec,)), source=getattr(predictor, "source", "predicted"), graph=graph,
            provenance={"unit_costs": "sum of the unit's kernel latencies (each unit imported on its own)",
                        "device": predictor.provenance() if hasattr(predictor, "provenance") else {}})
    train = _train_costs(graph, traced.units, sums, tables, cluster, ratios, optimizer, microbatch_size)
    return UnitGraph(graph=graph, units=traced.units, costs=tables, train_costs=train, cluster=cluster,
                     microbatch_size=microbatch_size, notes=tuple(notes) + traced.notes,
                     sums={u.name: sums[u.name] for u in traced.units}, ratios=ratios)


def _train_costs(graph: OpGraph, units: Sequence[TracedUnit], sums: Mapping[str, KernelSums],
                 tables: Mapping[str, CostTable], cluster: Cluster, ratios: BackwardRatios, optimizer: str,
                 microbatch_size: int) -> TrainCosts:
    cols = [cluster.presets.index(d.preset) for d in cluster.devices]
    fwd = np.array([[sums[u.name].forward_us[p] for p in cluster.presets] for u in units])[:, cols]
    bwd = np.array([[sums[u.name].backward_us[p] for p in cluster.presets] for u in units])[:, cols]
    return TrainCosts(
        device_names=cluster.names, device_presets=tuple(d.preset for d in cluster.devices), forward_us=fwd,
        backward_us=bwd, activation_bytes=np.array([sums[u.name].activation_bytes for u in units]),
        param_bytes=np.array([u.param_bytes for u in units]), optimizer=optimizer,
        backward_source=ratios.source,
        forward_source={d.name: str(tables[d.preset].source[0, 0]) for d in cluster.devices},
        graph_hash=graph.structure_hash(), model=graph.name,
        provenance={"backward_ratios": ratios.to_dict(), "level": "unit",
                    "backward": "per kernel: forward x the ratio of its op kind, summed over the unit's kernels",
                    "microbatch_size": microbatch_size}).validate(graph)
