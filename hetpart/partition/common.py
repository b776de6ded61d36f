"""What every partitioner shares: its configuration, pin handling, priority orders and the plan factory.

Every method builds a :class:`Problem` (graph + costs + config pre-processed once, pins resolved into an
``allowed[op, device]`` mask) and returns ``finish_plan(...)``, which scores the assignment with the one
simulator (``hetpart.simulate``), records the planner's wall time, and flags degenerate plans.
"""
from __future__ import annotations

import heapq
import logging
import time
import warnings
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Sequence

import numpy as np

from hetpart.costs import CostTable
from hetpart.errors import DegeneratePlanWarning, InfeasibleError, InvalidPlanError, PinError, UnknownDeviceError
from hetpart.graph import OpGraph
from hetpart.plan import Plan, resolve_pins
from hetpart.simulate import SimModel, SimulationConfig

logger = logging.getLogger(__name__)


class ProblemTooLargeError(InfeasibleError):
    """An exact method (milp, exhaustive) was asked to solve a graph beyond its configured size limit."""


@dataclass(frozen=True)
class PartitionConfig:
    """Options shared by all partitioners (each method reads the ones it needs)."""

    pins: Mapping[str, str] = field(default_factory=dict)    # op name / glob / "op:<relax op>" -> device
    simulation: SimulationConfig = field(default_factory=SimulationConfig)
    preferred_device: str | None = None      # greedy: the device that takes every op it supports (default: a GPU)
    max_evaluations: int | None = None       # cp_greedy, portfolio: simulations allowed (None: scaled to size)
    perturbations: int = 20                  # cp_greedy, portfolio: kicks at a local optimum (0: plain descent)
    seed: int = 0                            # cp_greedy, portfolio: seed of the kicks' random draws
    time_limit_s: float = 60.0               # milp: HiGHS time limit
    milp_max_ops: int = 250                  # milp: refuse larger graphs (constraints grow ~ n^2)
    exhaustive_max_schedules: int = 200_000  # exhaustive: refuse when more (assignment, order) pairs than this
    requests: int = 1                        # timeslice, portfolio: requests in flight whose simulated makespan is minimised
    slice_steps: int = 1                     # timeslice: recurrence steps per time slice
    dispatch_overhead_us_by_device: Mapping[str, float] = field(default_factory=dict)  # timeslice, portfolio: task runtime
                                             # overhead per segment (hetpart.simulate_requests.RuntimeModel)
    timeslice_segments: str = "runtime"      # timeslice: "runtime" (segment_plan) or "slices" (one per task)
    work_sharing: bool = True                # timeslice, portfolio: the task runtime's workers of equal CPU core groups
                                             # share work (RuntimeModel.continuation and .sharing)
    cross_device_sharing: bool = False       # timeslice, portfolio: with work_sharing, a free device's worker also
                                             # takes other devices' segments it ends sooner (every segment is
                                             # built for every device; RuntimeModel.cross_device_sharing)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pins", dict(self.pins))
        if self.perturbations < 0 or (self.max_evaluations is not None and self.max_evaluations < 1):
            raise InvalidPlanError(f"perturbations must be >= 0 and max_evaluations >= 1 (or None); found "
                                   f"{self.perturbations} and {self.max_evaluations}")
        overheads = dict(self.dispatch_overhead_us_by_device)
        if any(not isinstance(v, (int, float)) or isinstance(v, bool) or not v >= 0 for v in overheads.values()):
            raise InvalidPlanError(f"dispatch_overhead_us_by_device must map device names to microseconds >= 0; "
                                   f"found {overheads}")
        object.__setattr__(self, "dispatch_overhead_us_by_device", {str(k): float(v) for k, v in overheads.items()})
        for name in ("work_sharing", "cross_device_sharing"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidPlanError(f"{name} must be True or False; found {getattr(self, name)!r}")
        if self.timeslice_segments not in ("runtime", "slices"):
            raise InvalidPlanError(f"timeslice_segments must be 'runtime' or 'slices'; found {self.timeslice_segments!r}")
        for name in ("requests", "slice_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidPlanError(f"{name} must be a positive integer; found {value!r} (e.g. requests=16, "
                                       "slice_steps=4)")
        if isinstance(self.simulation, Mapping):
            object.__setattr__(self, "simulation", SimulationConfig.from_dict(self.simulation))

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["pins"] = dict(self.pins)
        out["dispatch_overhead_us_by_device"] = dict(self.dispatch_overhead_us_by_device)
        out["simulation"] = self.simulation.to_dict()
        return out

    @classmethod
    def coerce(cls, config: "PartitionConfig | Mapping[str, Any] | None") -> "PartitionConfig":
        if config is None:
            return cls()
        if isinstance(config, PartitionConfig):
            return config
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise InvalidPlanError(f"unknown partition options {unknown}; known options: {sorted(known)}")
        return cls(**dict(config))


class Problem:
    """Graph + costs + config, pre-processed once per ``solve`` call."""

    def __init__(self, graph: OpGraph, costs: CostTable, config: PartitionConfig | Mapping[str, Any] | None,
                 method: str) -> None:
        self.started = time.perf_counter()
        self.method = method
        self.config = PartitionConfig.coerce(config)
        self.graph, self.costs = graph, costs
        self.model = SimModel(graph, costs, self.config.simulation)
        self.names = costs.device_names
        self.n, self.n_dev, self.host = graph.num_ops, len(self.names), self.model.host
        self.pins = resolve_pins(graph, self.config.pins, self.names)
        allowed = costs.supported.copy()
        for op_id, device in self.pins.items():
            d = self.names.index(device)
            if not costs.supported[op_id, d]:
                raise PinError(f"op {graph.nodes[op_id].name!r} is pinned to {device!r}, which cannot run it "
                               "(no cost for it there); pin it to a supporting device")
            allowed[op_id] = False
            allowed[op_id, d] = True
        self.allowed = allowed
        self.allowed_list = [tuple(int(d) for d in np.flatnonzero(allowed[i])) for i in range(self.n)]
        self.lat = np.where(costs.supported, costs.latency_us, np.inf)
        if self.config.cross_device_sharing and self.config.work_sharing and self.config.simulation.check_memory:
            self._check_every_device_holds_the_weights()

    def _check_every_device_holds_the_weights(self) -> None:
        """Cross-device sharing builds every segment for every device, so every device holds every weight."""
        weights = int(self.model.param_bytes.sum())
        for name, capacity in zip(self.names, self.model.capacity):
            if weights > capacity:
                raise InfeasibleError(f"cross-device sharing builds every segment for every device, so each holds "
                                      f"all {weights} bytes of weights, but {name!r} has {capacity} bytes of memory; "
                                      "drop --cross-device-sharing (partition option cross_device_sharing)")

    # ------------------------------------------------------------------ devices
    def device_of_kind(self, kind: str) -> int:
        for k, dev in enumerate(self.costs.devices.devices):
            if dev.kind == kind:
                return k
        raise UnknownDeviceError(f"no {kind.upper()} among the offered devices {list(self.names)}; "
                                 f"offer one (e.g. --devices cpu,gpu=t4) or use another method")

    def fastest_allowed(self, op_id: int) -> int:
        return min(self.allowed_list[op_id], key=lambda d: (self.lat[op_id, d], d))

    def place_or_fallback(self, op_id: int, wanted: int) -> int:
        """``wanted`` if the op may run there, else the host if allowed, else its fastest allowed device."""
        if self.allowed[op_id, wanted]:
            return wanted
        if self.allowed[op_id, self.host]:
            return self.host
        return self.fastest_allowed(op_id)

    # ------------------------------------------------------------------ orders
    def upward_rank(self, dev: Sequence[int] | None = None) -> np.ndarray:
        """HEFT upward rank: mean (or assigned-device) latency + max over successors of copy + rank. With an
        assignment, a model output produced off the host also counts its copy back to the host."""
        model, n = self.model, self.n
        if dev is None:
            w = [float(np.mean(self.lat[i, list(self.allowed_list[i])])) for i in range(n)]
            comm = [float(np.mean([model.tdur[a][b][i] for a in range(self.n_dev) for b in range(self.n_dev)
                                   if a != b])) if self.n_dev > 1 else 0.0 for i in range(n)]
        else:
            w = [model.lat[dev[i]][i] for i in range(n)]
            comm = [0.0] * n
        rank = [0.0] * n
        succ, host = model.succ, self.host
        for i in range(n - 1, -1, -1):
            best = model.tdur[dev[i]][host][i] if dev is not None and model.is_output[i] and dev[i] != host else 0.0
            for j in succ[i]:
                c = rank[j] + (comm[i] if dev is None else (model.tdur[dev[i]][dev[j]][i] if dev[i] != dev[j] else 0.0))
                if c > best:
                    best = c
            rank[i] = w[i] + best
        return np.array(rank)

    def rank_order(self, dev: Sequence[int] | None = None, rank: np.ndarray | None = None) -> list[int]:
        """Ops by decreasing upward rank (ties by id): a topological order since costs are >= 0."""
        rank = self.upward_rank(dev) if rank is None else rank
        return [int(i) for i in np.lexsort((np.arange(self.n), -rank))]

    def earliest_start_order(self, dev: Sequence[int], rank: np.ndarray | None = None) -> list[int]:
        """Issue order built by list scheduling with the assignment fixed: repeatedly issue the op that can
        start earliest on its device (ties: higher upward rank, then lower id), updating devices, links and
        copies exactly as the simulator does. Fills idle gaps that a static rank order leaves open."""
        model, n, host = self.model, self.n, self.host
        rank = self.upward_rank(dev) if rank is None else rank
        lat, preds, succ, tdur = model.lat, model.preds, model.succ, model.tdur
        serial = model.config.serial_links
        end = [0.0] * n
        arrival: list[dict[int, float]] = [{} for _ in range(self.n_dev)]
        in_arrival: list[dict[int, float]] = [{} for _ in range(self.n_dev)]
        dev_free = [0.0] * self.n_dev
        link_free = [[0.0] * self.n_dev for _ in range(self.n_dev)]
        for k, consumers in enumerate(model.input_consumers):
            for b in sorted({dev[c] for c in consumers} - {host}):
                ce = (link_free[host][b] if serial else 0.0) + model.input_tdur[k][b]
                link_free[host][b] = in_arrival[b][k] = ce

        def data_ready(v: int) -> float:
            d = dev[v]
            t = 0.0
            for u in preds[v]:
                x = end[u] if dev[u] == d else arrival[d][u]
                if x > t:
                    t = x
            if d != host:
                for k in model.op_inputs[v]:
                    t = max(t, in_arrival[d][k])
            return t

        # per device: ops whose data arrive after the device is free (by arrival time), and ops ready to go
        waiting: list[list[tuple[float, float, int]]] = [[] for _ in range(self.n_dev)]
        available: list[list[tuple[float, int]]] = [[] for _ in range(self.n_dev)]
        missing = [len(p) for p in preds]
        for v in range(n):
            if not missing[v]:
                heapq.heappush(waiting[dev[v]], (data_ready(v), -rank[v], v))
        order: list[int] = []
        while len(order) < n:
            best = None
            for d in range(self.n_dev):
                wait, avail = waiting[d], available[d]
                while wait and wait[0][0] <= dev_free[d]:
                    _, neg_rank, v = heapq.heappop(wait)
                    heapq.heappush(avail, (neg_rank, v))
                if avail:
                    key = (dev_free[d], avail[0][0], avail[0][1], d)
                elif wait:
                    key = (wait[0][0], wait[0][1], wait[0][2], d)
                else:
                    continue
                if best is None or key < best:
                    best = key
            assert best is not None, "the graph has a cycle"
            now, _, v, d = best
            heapq.heappop(available[d] if available[d] and available[d][0][1] == v else waiting[d])
            order.append(v)
            e = now + lat[d][v]
            end[v] = dev_free[d] = e
            targets = sorted({dev[w] for w in succ[v]} - {d} | ({host} if model.is_output[v] and d != host else set()))
            for b in targets:
                cs = max(e, link_free[d][b]) if serial else e
                link_free[d][b] = arrival[b][v] = cs + tdur[d][b][v]
            for w in succ[v]:
                missing[w] -= 1
                if not missing[w]:
                    heapq.heappush(waiting[dev[w]], (data_ready(w), -rank[w], w))
        return order

    def makespan(self, dev: Sequence[int], order: Sequence[int]) -> float:
        return self.model.makespan(dev, order)


def finish_plan(problem: Problem, dev: Sequence[int], order: Sequence[int], *, stats: Mapping[str, Any] | None = None,
                notes: Sequence[str] = (), warn_degenerate: bool = True) -> Plan:
    """Score an assignment with the simulator and wrap it as a validated Plan."""
    names, graph = problem.names, problem.graph
    bad = [i for i in range(problem.n) if not problem.allowed[i, dev[i]]]
    assert not bad, f"{problem.method} placed ops {bad[:5]} on a device they may not use"
    sched = problem.model.run(dev, order)
    problem.model.check_memory(sched)
    notes = list(notes)
    used = sorted({names[d] for d in dev})
    if warn_degenerate and problem.n_dev > 1 and len(used) == 1 and problem.n > 0:
        message = (f"degenerate plan: {problem.method} puts all {problem.n} ops on {used[0]!r} although "
                   f"{list(names)} were offered")
        for_task_runtime = bool(problem.config.dispatch_overhead_us_by_device) or problem.config.requests > 1
        sharing = for_task_runtime and problem.config.work_sharing and any(
            set(group) == set(names) for group in problem.costs.devices.interchangeable_groups())
        across = for_task_runtime and problem.config.work_sharing and problem.config.cross_device_sharing
        if across:
            notes.append(f"{problem.method} puts all {problem.n} ops on {used[0]!r}: with cross-device sharing the "
                         f"task runtime's other workers ({', '.join(n for n in names if n != used[0])}) take "
                         "requests they are predicted to end sooner")
        elif sharing:      # the task runtime's workers share work: every group still serves requests
            notes.append(f"{problem.method} puts all {problem.n} ops on {used[0]!r}: the task runtime spreads "
                         f"requests in flight over {list(names)}, equal core groups that share work")
        else:
            notes.append(message)
            warnings.warn(message, DegeneratePlanWarning, stacklevel=3)
    all_stats = {"planner_wall_s": time.perf_counter() - problem.started, **dict(stats or {})}
    plan = Plan(device_of=tuple(names[d] for d in dev), order=tuple(order), devices=names, method=problem.method,
                makespan_us=sched.makespan_us, pins=problem.config.pins, config=problem.config.to_dict(),
                graph_hash=graph.structure_hash(), level=graph.level, notes=tuple(notes), stats=all_stats)
    logger.info("%s: makespan %.1f us on %s in %.3f s", problem.method, sched.makespan_us, used,
                all_stats["planner_wall_s"])
    return plan.validate(graph)
