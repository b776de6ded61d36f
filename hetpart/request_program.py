"""The per-request structure of a segmented plan, as flat lists for the N-request simulator's event loop
(:mod:`hetpart.simulate_requests`): each segment's duration, dependencies and copies, and cross-device sharing's
table (:func:`sharing_table`). Imports numpy only through ``hetpart.simulate`` (core rule)."""
from __future__ import annotations

import functools
from typing import NamedTuple, Sequence

from hetpart.costs import CostTable
from hetpart.cross_sharing import SharingTable, planned_load_us
from hetpart.graph import OpGraph
from hetpart.plan import Plan, resolve_pins
from hetpart.request_timeline import RuntimeModel
from hetpart.segments import Segmentation, segment_plan
from hetpart.simulate import SimModel, SimulationConfig, plan_simulation_config

__all__ = ["Program", "RequestCopy", "prepared_program", "sharing_table"]


class RequestCopy(NamedTuple):
    key: tuple[int, int]          # tie-break on a link: (0, model input) before (1, issue position of the producer)
    src: int
    dst: int
    duration_us: float
    size_bytes: int
    op_id: int                    # producer op, or -1-k for model input k
    producer_segment: int         # -1 for a model input
    waiting: list[int]            # segments on dst that need this copy


class Program:
    """The per-request structure of a segmented plan, as flat lists for the event loop."""

    def __init__(self, model: SimModel, seg: Segmentation, dev: Sequence[int], runtime: RuntimeModel,
                 pinned: frozenset[int] = frozenset()) -> None:
        names, host, lat = model.names, model.host, model.lat
        self.n_dev = model.n_dev
        k = len(seg.segments)
        self.dev = [names.index(s.device) for s in seg.segments]
        self.duration_us = [runtime.overhead_us(s.device) for s in seg.segments]
        for s in seg.segments:
            for op in s.op_ids:                         # added in plan order, as simulate adds them
                self.duration_us[s.id] += lat[self.dev[s.id]][op]
        self.n_deps = [0] * k
        self.after_segment: list[list[int]] = [[] for _ in range(k)]    # same-device readers
        readers: dict[tuple[int, int], list[int]] = {}                   # (op, device) -> segments reading it
        input_readers: dict[tuple[int, int], list[int]] = {}             # (model input, device) -> segments
        for s in seg.segments:
            d = self.dev[s.id]
            for p in sorted({i.segment for i in s.inputs if self.dev[i.segment] == d}):
                self.after_segment[p].append(s.id)
                self.n_deps[s.id] += 1
            for u in sorted({i.op_id for i in s.inputs if self.dev[i.segment] != d}):
                readers.setdefault((u, d), []).append(s.id)
                self.n_deps[s.id] += 1
            if d != host:
                for x in sorted({x for op in s.op_ids for x in model.op_inputs[op]}):
                    input_readers.setdefault((x, d), []).append(s.id)
                    self.n_deps[s.id] += 1
        position = {v: p for p, v in enumerate(op for s in seg.segments for op in s.op_ids)}
        self.copies_after: list[list[RequestCopy]] = [[] for _ in range(k)]
        for s in seg.segments:
            a = self.dev[s.id]
            for u in s.outputs:
                targets = {dev[w] for w in model.succ[u]} - {a}
                if model.is_output[u] and a != host:
                    targets.add(host)
                for b in sorted(targets):
                    self.copies_after[s.id].append(RequestCopy((1, position[u]), a, b, model.tdur[a][b][u],
                                                               model.copy_bytes[u], u, s.id, readers.get((u, b), [])))
        self.input_copies: list[RequestCopy] = []
        for x, consumers in enumerate(model.input_consumers):
            for b in sorted({dev[c] for c in consumers} - {host}):
                self.input_copies.append(RequestCopy((0, x), host, b, model.input_tdur[x][b], model.input_bytes[x],
                                                     -1 - x, -1, input_readers.get((x, b), [])))
        self.tasks = k + sum(len(c) for c in self.copies_after) + len(self.input_copies)
        self.sequence = [[s.id for s in seg.segments if self.dev[s.id] == d] for d in range(model.n_dev)]
        # copies="consumer": a segment waits for its producer segments on every device, then its worker copies
        # what is not yet on its device (op outputs, and off the host the model inputs) before running it
        self.k = k
        self.producers = [sorted({i.segment for i in s.inputs}) for s in seg.segments]
        self.readers_of: list[list[int]] = [[] for _ in range(k)]
        for s in seg.segments:
            for p in self.producers[s.id]:
                self.readers_of[p].append(s.id)
        # what each segment reads, wherever its producers ran: (position, op, producer segment), model inputs
        self.model, self.host = model, host
        self.reads = [sorted({(position[i.op_id], i.op_id, i.segment) for i in s.inputs}) for s in seg.segments]
        self.input_reads = [sorted({x for op in s.op_ids for x in model.op_inputs[op]}) for s in seg.segments]
        self.model_outputs = [(u, s.id) for s in seg.segments for u in s.outputs if model.is_output[u]]
        self._for_sharing = (seg, runtime, pinned)       # the table is built only when asked for (``sharing``)
        # while no segment of a request has run on another device, its copies are these (the hot path)
        self.planned_pulls = [self.pulls(s, self.dev[s], self.dev) for s in range(k)]
        self.planned_output_copies = self.output_copies(self.dev)

    @functools.cached_property
    def sharing(self) -> SharingTable:
        """Cross-device sharing's table: each segment's predicted time and input copies on every device."""
        seg, runtime, pinned = self._for_sharing
        model, k = self.model, len(seg.segments)
        duration_on: list[list[float | None]] = [[None] * k for _ in range(model.n_dev)]
        for w in range(model.n_dev):
            for s in seg.segments:
                if all(model.supported[op, w] for op in s.op_ids) and (w == self.dev[s.id] or not any(
                        op in pinned for op in s.op_ids)):
                    duration_on[w][s.id] = runtime.overhead_us(model.names[w]) + sum(model.lat[w][op]
                                                                                      for op in s.op_ids)
        copy_in = [[sum(c.duration_us for c in self.pulls(s, w, self.dev)) for s in range(k)]
                   for w in range(model.n_dev)]
        return SharingTable(model.names, tuple(map(tuple, duration_on)), tuple(map(tuple, copy_in)),
                            planned_load_us(duration_on, copy_in, self.dev))

    def pulls(self, s: int, target: int, location: Sequence[int]) -> list[RequestCopy]:
        """The copies segment ``s`` needs on device ``target`` when its producers' outputs are on ``location``
        (per segment): op outputs held elsewhere, and off the host the model inputs, in key order."""
        model = self.model
        pulls = [RequestCopy((0, x), self.host, target, model.input_tdur[x][target], model.input_bytes[x], -1 - x, -1,
                             []) for x in self.input_reads[s]] if target != self.host else []
        pulls += [RequestCopy((1, pos), location[p], target, model.tdur[location[p]][target][u], model.copy_bytes[u],
                              u, p, []) for pos, u, p in self.reads[s] if location[p] != target]
        return pulls

    def output_copies(self, location: Sequence[int]) -> list[RequestCopy]:
        """The copies of the model outputs made off the host back to it, in issue order."""
        copies = [RequestCopy((1, 0), location[p], self.host, self.model.tdur[location[p]][self.host][u],
                        self.model.copy_bytes[u], u, p, []) for u, p in self.model_outputs if location[p] != self.host]
        return copies


def prepared_program(graph: OpGraph, costs: CostTable, plan: Plan, runtime: RuntimeModel | None,
              segmentation: Segmentation | None, config: SimulationConfig | None) -> tuple[Program, SimModel]:
    runtime = (runtime or RuntimeModel()).validate(costs.device_names)
    model = SimModel(graph, costs, config or plan_simulation_config(plan))
    plan.validate(graph)
    dev = model.device_indices(plan)
    model.check_supported(dev)
    seg = segment_plan(graph, plan) if segmentation is None else segmentation.validate(graph, plan)
    pinned = frozenset(resolve_pins(graph, plan.pins, costs.device_names))
    return Program(model, seg, dev, runtime, pinned), model


def sharing_table(graph: OpGraph, costs: CostTable, plan: Plan, *, runtime: RuntimeModel | None = None,
                  segmentation: Segmentation | None = None, config: SimulationConfig | None = None) -> SharingTable:
    """The predicted time and input copies of each segment of ``plan`` on every device, with which the simulator and
    the task runtime decide cross-device sharing (``hetpart.cross_sharing``); arguments as for
    :func:`simulate_requests`."""
    return prepared_program(graph, costs, plan, runtime, segmentation, config)[0].sharing
