"""List-scheduling simulator: the one objective every partitioner is scored by.

The model (``simulate(graph, costs, plan)``):

* Every device runs one kernel at a time; devices run concurrently. Ops are issued per device in
  ``plan.order`` and start as soon as their device is free and all their inputs are present on it.
  Op ``i`` on device ``d`` takes ``costs.latency_us[i, d]`` (a missing cost raises MissingCostError).
* A tensor read on another device than the one that produced it is copied over the link
  (``costs.transfer_us(bytes, src, dst)`` = latency + bytes / bandwidth) once per destination device and is
  reused there by every consumer. A copy is issued eagerly when its producer finishes. By default each link
  direction carries one copy at a time, in issue order (``SimulationConfig.serial_links``); with
  ``serial_links=False`` copies overlap freely.
* The bytes copied for a producer are the largest edge leaving it (or its model-output size if larger): the
  tensor a producer writes is the same whichever consumer reads it.
* Model inputs live on the host device (the first CPU-kind device unless configured) and are copied, in
  ``graph.inputs`` order and before anything else, to every other device that has a consumer of them.
  Model outputs must end on the host: an output produced elsewhere is copied back, and the makespan is the
  end of the last op or copy.
* Memory per device = parameters of the ops placed there (resident for the whole run) + live activations
  (an op's output from its start until its last local reader and its outgoing copies finish; a copied-in
  tensor from the copy start until its last reader finishes; model inputs on the host from 0; model outputs
  on the host until the end). Exceeding ``DeviceSpec.memory_bytes`` raises InfeasibleError.

``SimModel`` pre-processes a graph + cost table once into flat lists so that partitioners can simulate
thousands of candidate assignments cheaply (``SimModel.run``); ``simulate`` is the one-shot public entry point.
Imports numpy only (core rule).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from typing import Any, Mapping, Sequence

import numpy as np

from hetpart.costs import CostTable
from hetpart.errors import InfeasibleError, InvalidPlanError, MissingCostError
from hetpart.graph import OpGraph
from hetpart.plan import Event, Plan, Timeline

logger = logging.getLogger(__name__)

# A copy record: (producer op id, or -1-k for model input k; src device; dst device; start_us; end_us)
CopyRecord = tuple[int, int, int, float, float]


@dataclass(frozen=True)
class SimulationConfig:
    """Knobs of the simulated machine."""

    serial_links: bool = True          # one copy at a time per link direction
    check_memory: bool = True          # raise InfeasibleError when a device's memory overflows
    host_device: str | None = None     # where inputs live / outputs end; None: first CPU-kind device

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SimulationConfig":
        return cls(**dict(data))


@dataclass(frozen=True)
class Schedule:
    """Raw result of one simulation, indexed by op id (what Timeline is built from)."""

    device_of: tuple[int, ...]     # device index per op
    order: tuple[int, ...]
    start_us: list[float]
    end_us: list[float]
    copies: list[CopyRecord]
    makespan_us: float
    arrival: list[dict[int, float]] | None = None     # recorded runs only (see SimModel.resume)
    in_arrival: list[dict[int, float]] | None = None
    checkpoints: list | None = None                   # per issue position: (dev_free, link_free, n_copies)


class SimModel:
    """A graph + cost table pre-processed for fast repeated simulation of different plans."""

    def __init__(self, graph: OpGraph, costs: CostTable, config: SimulationConfig | None = None) -> None:
        self.config = config or SimulationConfig()
        costs.validate(graph)
        self.graph, self.costs = graph, costs
        self.names: tuple[str, ...] = costs.device_names
        n, n_dev = graph.num_ops, len(self.names)
        self.n, self.n_dev = n, n_dev
        self.host = self._host_index(costs)
        self.supported = costs.supported.copy()
        self.lat = [[float(v) for v in costs.latency_us[:, d]] for d in range(n_dev)]   # lat[d][op]
        self.preds: list[tuple[int, ...]] = [n_.inputs for n_ in graph.nodes]
        succ = graph.successors()
        self.succ: list[tuple[int, ...]] = [tuple(s) for s in succ]
        out_bytes = np.zeros(n, dtype=np.int64)
        self.is_output = [False] * n
        for t in graph.outputs:
            if t.producer is not None:
                self.is_output[t.producer] = True
                out_bytes[t.producer] += t.size_bytes
        edge_max = np.zeros(n, dtype=np.int64)
        for e in graph.edges:
            edge_max[e.src] = max(edge_max[e.src], e.size_bytes)
        written = np.array([nd.bytes_written for nd in graph.nodes], dtype=np.int64)
        copy_bytes = np.maximum(edge_max, out_bytes)
        self.copy_bytes = [int(b) for b in copy_bytes]
        self.act_bytes = [int(b) for b in np.maximum(written, copy_bytes)]
        self.param_bytes = np.array([nd.param_bytes for nd in graph.nodes], dtype=np.float64)
        self.capacity = [d.memory_bytes for d in costs.devices.devices]
        # every parameter, activation and possible copy at once still fits on the smallest device
        self.always_fits = (self.param_bytes.sum() + sum(self.act_bytes) + (n_dev - 1) * sum(self.copy_bytes)
                            + sum(t.size_bytes for t in graph.inputs) * n_dev) <= min(self.capacity)
        # transfer durations tdur[a][b][op] (None on the diagonal)
        self.tdur: list[list[list[float] | None]] = [[None] * n_dev for _ in range(n_dev)]
        for a in range(n_dev):
            for b in range(n_dev):
                if a != b:
                    link = costs.devices.link(self.names[a], self.names[b])
                    self.tdur[a][b] = [link.transfer_us(sz) for sz in self.copy_bytes]
        # model inputs: (size, consumers); op -> indices of the inputs it reads
        consumers_of: list[set[int]] = [set(t.consumers) for t in graph.inputs]
        index_of = {t.name: k for k, t in enumerate(graph.inputs)}
        for nd in graph.nodes:
            for name in nd.graph_inputs:
                if name in index_of:
                    consumers_of[index_of[name]].add(nd.id)
        self.input_bytes = [t.size_bytes for t in graph.inputs]
        self.input_consumers = [tuple(sorted(c)) for c in consumers_of]
        reads: list[list[int]] = [[] for _ in range(n)]
        for k, cons in enumerate(self.input_consumers):
            for c in cons:
                reads[c].append(k)
        self.op_inputs: list[tuple[int, ...]] = [tuple(r) for r in reads]
        self.input_tdur = [[0.0 if b == self.host else costs.transfer_us(sz, self.names[self.host], self.names[b])
                            for b in range(n_dev)] for sz in self.input_bytes]

    def _host_index(self, costs: CostTable) -> int:
        wanted = self.config.host_device
        if wanted is not None:
            return costs.devices.index(wanted)
        for k, dev in enumerate(costs.devices.devices):
            if dev.kind == "cpu":
                return k
        return 0

    # ------------------------------------------------------------------ plans <-> index arrays
    def device_indices(self, plan: Plan) -> list[int]:
        index = {name: k for k, name in enumerate(self.names)}
        unknown = sorted(set(plan.device_of) - set(index))
        if unknown:
            raise InvalidPlanError(f"plan uses devices {unknown}, but the cost table has only {list(self.names)}; "
                                   "plan with the same devices as the costs")
        return [index[name] for name in plan.device_of]

    def check_supported(self, dev: Sequence[int]) -> None:
        bad = [i for i, d in enumerate(dev) if not self.supported[i, d]]
        if bad:
            nodes = self.graph.nodes
            listed = ", ".join(f"{nodes[i].name} ({nodes[i].op}) on {self.names[dev[i]]}" for i in bad[:5])
            raise MissingCostError(f"{len(bad)} ops are placed on a device that cannot run them (no cost): "
                                   f"{listed}. Move them to a supporting device or provide costs.")

    # ------------------------------------------------------------------ the hot loop
    def run(self, dev: Sequence[int], order: Sequence[int], record: bool = False) -> Schedule:
        """Simulate device assignment ``dev`` (index per op) with issue ``order`` (assumed topological).

        ``record=True`` keeps a checkpoint before every issue position so that ``resume`` can re-simulate
        a changed plan from the first position the change affects.
        """
        n, n_dev, host, serial = self.n, self.n_dev, self.host, self.config.serial_links
        arrival: list[dict[int, float]] = [{} for _ in range(n_dev)]
        in_arrival: list[dict[int, float]] = [{} for _ in range(n_dev)]
        link_free = [[0.0] * n_dev for _ in range(n_dev)]
        copies: list[CopyRecord] = []
        for k, consumers in enumerate(self.input_consumers):
            for b in sorted({dev[c] for c in consumers} - {host}):
                cs = link_free[host][b] if serial else 0.0
                ce = cs + self.input_tdur[k][b]
                link_free[host][b] = ce
                in_arrival[b][k] = ce
                copies.append((-1 - k, host, b, cs, ce))
        state = ([0.0] * n, [0.0] * n, arrival, in_arrival, [0.0] * n_dev, link_free, copies)
        return self._issue(dev, order, 0, state, record)

    def resume(self, base: Schedule, dev: Sequence[int], order: Sequence[int], first: int) -> Schedule:
        """Re-simulate from issue position ``first`` of a recorded ``base`` run.

        The caller guarantees that ``order[:first] == base.order[:first]``, that no op issued before
        ``first`` changed device or has a consumer that changed device, and that no model-input consumer
        changed device (else pass ``first=0``). The result equals ``run(dev, order)``.
        """
        if first <= 0 or base.checkpoints is None:
            return self.run(dev, order)
        dev_free, link_free, n_copies = base.checkpoints[first]
        state = (list(base.start_us), list(base.end_us), [dict(a) for a in base.arrival],
                 base.in_arrival, list(dev_free), [list(r) for r in link_free], base.copies[:n_copies])
        return self._issue(dev, order, first, state, False)

    def _issue(self, dev: Sequence[int], order: Sequence[int], first: int, state: tuple, record: bool) -> Schedule:
        lat, preds, succ, tdur = self.lat, self.preds, self.succ, self.tdur
        is_output, op_inputs, serial, host = self.is_output, self.op_inputs, self.config.serial_links, self.host
        start, end, arrival, in_arrival, dev_free, link_free, copies = state
        two_devices = self.n_dev == 2
        checkpoints: list | None = [None] * first if record else None
        for v in order[first:] if first else order:
            if checkpoints is not None:
                checkpoints.append((tuple(dev_free), tuple(tuple(r) for r in link_free), len(copies)))
            d = dev[v]
            t = dev_free[d]
            arr_d = arrival[d]
            for u in preds[v]:
                x = end[u] if dev[u] == d else arr_d[u]
                if x > t:
                    t = x
            if d != host and op_inputs[v]:
                for k in op_inputs[v]:
                    x = in_arrival[d][k]
                    if x > t:
                        t = x
            e = t + lat[d][v]
            start[v] = t
            end[v] = e
            dev_free[d] = e
            if two_devices:
                o = 1 - d
                need = is_output[v] and d != host
                if not need:
                    for w in succ[v]:
                        if dev[w] == o:
                            need = True
                            break
                if need:
                    lf = link_free[d]
                    cs = e if (not serial or lf[o] < e) else lf[o]
                    ce = cs + tdur[d][o][v]
                    lf[o] = ce
                    arrival[o][v] = ce
                    copies.append((v, d, o, cs, ce))
                continue
            targets = None
            for w in succ[v]:
                b = dev[w]
                if b != d:
                    if targets is None:
                        targets = {b}
                    else:
                        targets.add(b)
            if is_output[v] and d != host:
                if targets is None:
                    targets = {host}
                else:
                    targets.add(host)
            if targets is not None:
                for b in sorted(targets) if len(targets) > 1 else targets:
                    lf = link_free[d]
                    cs = e if (not serial or lf[b] < e) else lf[b]
                    ce = cs + tdur[d][b][v]
                    lf[b] = ce
                    arrival[b][v] = ce
                    copies.append((v, d, b, cs, ce))
        makespan = max(end) if self.n else 0.0
        for c in copies:
            if c[4] > makespan:
                makespan = c[4]
        return Schedule(tuple(dev), tuple(order), start, end, copies, makespan,
                        arrival if record else None, in_arrival if record else None, checkpoints)

    # ------------------------------------------------------------------ memory
    def resident_bytes(self, dev: Sequence[int]) -> np.ndarray:
        return np.bincount(np.asarray(dev, dtype=np.int64), weights=self.param_bytes, minlength=self.n_dev)

    def peak_memory(self, sched: Schedule) -> list[int]:
        """Peak bytes per device: resident parameters + the maximum of live activations over time."""
        dev, start, end, makespan = sched.device_of, sched.start_us, sched.end_us, sched.makespan_us
        n_dev, host = self.n_dev, self.host
        # free time of each op's output on its own device, and of each copied-in tensor
        free_local = list(end)
        copied_in: dict[tuple[int, int], list[float]] = {}
        for (u, a, b, cs, ce) in sched.copies:
            copied_in[(u, b)] = [cs, ce]
            if u >= 0 and ce > free_local[u]:
                free_local[u] = ce
        for v in range(self.n):
            d = dev[v]
            for u in self.preds[v]:
                key = u if dev[u] == d else None
                if key is not None:
                    if end[v] > free_local[u]:
                        free_local[u] = end[v]
                else:
                    rec = copied_in[(u, d)]
                    if end[v] > rec[1]:
                        rec[1] = end[v]
            for k in self.op_inputs[v]:
                rec = copied_in.get((-1 - k, d)) if d != self.host else None
                if rec is not None and end[v] > rec[1]:
                    rec[1] = end[v]
            if self.is_output[v] and d == host:
                free_local[v] = makespan
        intervals: list[tuple[int, float, float, int]] = []
        for v in range(self.n):
            intervals.append((dev[v], start[v], free_local[v], self.act_bytes[v]))
        for (u, b), (cs, free) in copied_in.items():
            size = self.copy_bytes[u] if u >= 0 else self.input_bytes[-1 - u]
            if u >= 0 and self.is_output[u] and b == host:
                free = makespan
            intervals.append((b, cs, free, size))
        input_copy_end = [0.0] * len(self.input_bytes)
        for c in sched.copies:
            if c[0] < 0:
                input_copy_end[-1 - c[0]] = max(input_copy_end[-1 - c[0]], c[4])
        for k, size in enumerate(self.input_bytes):
            host_free = max([end[c] for c in self.input_consumers[k] if dev[c] == host] + [input_copy_end[k]])
            intervals.append((host, 0.0, host_free, size))
        peaks = self.resident_bytes(dev)
        arr = np.array([(dd, s, f, sz) for (dd, s, f, sz) in intervals], dtype=np.float64).reshape(-1, 4)
        for d in range(n_dev):
            mine = arr[arr[:, 0] == d]
            if not len(mine):
                continue
            times = np.concatenate([mine[:, 1], mine[:, 2]])
            deltas = np.concatenate([mine[:, 3], -mine[:, 3]])
            is_alloc = np.concatenate([np.ones(len(mine)), np.zeros(len(mine))])
            # at equal times frees come before allocations
            live = np.cumsum(deltas[np.lexsort((is_alloc, times))])
            peaks[d] += max(0.0, float(live.max()))
        return [int(p) for p in peaks]

    def check_memory(self, sched: Schedule) -> list[int] | None:
        """Raise InfeasibleError if a device overflows. Cheap when every activation would fit at once."""
        if not self.config.check_memory or self.always_fits:
            return None
        dev = sched.device_of
        bound = self.resident_bytes(dev)
        np.add.at(bound, np.asarray(dev, dtype=np.int64), np.asarray(self.act_bytes, dtype=np.float64))
        for (u, _a, b, _cs, _ce) in sched.copies:
            bound[b] += self.copy_bytes[u] if u >= 0 else self.input_bytes[-1 - u]
        bound[self.host] += sum(self.input_bytes)
        if all(bound[d] <= self.capacity[d] for d in range(self.n_dev)):
            return None
        peaks = self.peak_memory(sched)
        for d, peak in enumerate(peaks):
            if peak > self.capacity[d]:
                resident = int(self.resident_bytes(dev)[d])
                raise InfeasibleError(
                    f"device {self.names[d]!r} needs {peak} bytes at peak ({resident} of resident parameters + "
                    f"live activations) but has {self.capacity[d]} bytes of memory; place fewer ops (or smaller "
                    "ones) on it, pin large layers to another device, or lower the batch size")
        return peaks

    def makespan(self, dev: Sequence[int], order: Sequence[int], base: Schedule | None = None,
                 first: int = 0) -> float:
        """Makespan of an assignment; ``inf`` when the memory check fails (for search loops).
        With a recorded ``base`` run, re-simulates only from issue position ``first`` (see ``resume``)."""
        sched = self.run(dev, order) if base is None else self.resume(base, dev, order, first)
        try:
            self.check_memory(sched)
        except InfeasibleError:
            return float("inf")
        return sched.makespan_us

    # ------------------------------------------------------------------ public result
    def timeline(self, sched: Schedule) -> Timeline:
        peaks = self.check_memory(sched)
        if peaks is None:
            peaks = self.peak_memory(sched)
        names = self.names
        events = [Event("op", v, names[sched.device_of[v]], sched.start_us[v], sched.end_us[v])
                  for v in sched.order]
        for (u, a, b, cs, ce) in sched.copies:
            size = self.copy_bytes[u] if u >= 0 else self.input_bytes[-1 - u]
            events.append(Event("copy", u, f"{names[a]}->{names[b]}", cs, ce, size))
        events.sort(key=lambda e: (e.start_us, e.end_us, e.kind, e.op_id))
        return Timeline(tuple(events), sched.makespan_us, {names[d]: peaks[d] for d in range(self.n_dev)})

    def schedule_plan(self, plan: Plan) -> Schedule:
        plan.validate(self.graph)
        dev = self.device_indices(plan)
        self.check_supported(dev)
        return self.run(dev, plan.order)


def plan_simulation_config(plan: Plan) -> SimulationConfig:
    """The SimulationConfig recorded in ``plan.config["simulation"]`` (defaults when absent)."""
    recorded = plan.config.get("simulation")
    return SimulationConfig.from_dict(recorded) if isinstance(recorded, Mapping) else SimulationConfig()


def simulate(graph: OpGraph, costs: CostTable, plan: Plan, config: SimulationConfig | None = None) -> Timeline:
    """Predict the timeline of ``plan`` (see the module docstring for the exact model).

    Raises InvalidPlanError/PinError for a plan that does not fit the graph, MissingCostError for an op on a
    device that cannot run it, InfeasibleError when a device's memory overflows.
    Copy events of model input ``k`` carry ``op_id = -1 - k``. Without ``config``, the simulation settings
    the plan was made with (``plan.config["simulation"]``) are used, so a saved plan re-simulates to its
    own ``makespan_us``; else the defaults.
    """
    model = SimModel(graph, costs, config or plan_simulation_config(plan))
    return model.timeline(model.schedule_plan(plan))
