"""The task runtime's simulator: a plan's segments on one worker per device, with many requests in flight.

The model of ``simulate_requests(graph, costs, plan, n_requests=N)`` (docs/runtime_model.md says more):

* The plan is cut into segments (``hetpart.segments.segment_plan`` unless a Segmentation is given). Each device
  has ONE worker that runs whole segments, one at a time, without preemption. Segment ``s`` on device ``d`` takes
  ``RuntimeModel.dispatch_overhead_us_by_device[d]`` plus the sum of its ops' ``costs.latency_us[op, d]``.
* A segment is ready when all its inputs are on its device: the segments of its device it reads have ended, and
  the copies of the tensors (and, off the host, of the model inputs) it reads have arrived. A free worker starts
  the ready segment of its device with the lowest ``(request, segment id)`` (segment ids are a topological issue
  order). With ``RuntimeModel.worker_policy="fixed_order"`` a worker instead runs its segments strictly in
  ``(request, segment id)`` order, waiting for the next one, as ``hetpart.simulate`` does per op.
* Copies are ``hetpart.simulate``'s, computed by its ``SimModel``: an op's output read on another device is copied
  once per destination device and request (``SimModel.copy_bytes`` bytes in ``SimModel.tdur`` us) when the
  segment holding the op ends; model outputs made off the host are copied back to it; a request's model inputs
  are copied from the host, in ``graph.inputs`` order, to every other device that reads them when the request is
  admitted. With ``serial_links`` (the default) a link direction carries one copy at a time, first come first
  served (ties: lower request, model inputs first, then issue order); otherwise copies overlap freely.
* Requests ``0..N-1`` wait at t = 0 and are admitted in order, at most ``max_in_flight`` (default N) unfinished at
  a time. A request completes when its last segment or copy ends; its latency is completion minus admission.

Memory is not checked (N requests in flight hold N sets of activations). Imports numpy only through
``hetpart.simulate`` (core rule).
"""
from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, NamedTuple, Sequence

from hetpart.costs import CostTable
from hetpart.errors import InvalidPlanError, SchemaError, UsageError
from hetpart.graph import SCHEMA_VERSION, OpGraph, check_schema_version
from hetpart.plan import Plan
from hetpart.segments import Segmentation, segment_plan
from hetpart.simulate import SimModel, SimulationConfig, plan_simulation_config

WORKER_POLICIES = ("priority", "fixed_order")
EVENT_KINDS = ("segment", "copy")


@dataclass(frozen=True)
class RuntimeModel:
    """What the task runtime costs on top of the kernels, per device, and how its workers pick segments."""

    dispatch_overhead_us_by_device: Mapping[str, float] = field(default_factory=dict)   # per segment; absent: 0
    worker_policy: str = "priority"          # "priority": best ready segment; "fixed_order": strict sequence
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        try:
            overheads = {str(k): float(v) for k, v in dict(self.dispatch_overhead_us_by_device).items()}
        except (TypeError, ValueError) as exc:
            raise UsageError(f"dispatch_overhead_us_by_device must map device names to microseconds; found "
                             f"{self.dispatch_overhead_us_by_device!r}") from exc
        object.__setattr__(self, "dispatch_overhead_us_by_device", overheads)

    def overhead_us(self, device: str) -> float:
        return self.dispatch_overhead_us_by_device.get(device, 0.0)

    def validate(self, device_names: Sequence[str] | None = None) -> "RuntimeModel":
        if self.schema_version != SCHEMA_VERSION:
            raise SchemaError(f"RuntimeModel schema_version must be {SCHEMA_VERSION}; found {self.schema_version}")
        if self.worker_policy not in WORKER_POLICIES:
            raise UsageError(f"worker_policy must be one of {WORKER_POLICIES}; found {self.worker_policy!r}")
        bad = {d: v for d, v in self.dispatch_overhead_us_by_device.items() if not (math.isfinite(v) and v >= 0)}
        if bad:
            raise UsageError(f"dispatch overheads must be finite and >= 0 us; found {bad}")
        if device_names is not None:
            unknown = sorted(set(self.dispatch_overhead_us_by_device) - set(device_names))
            if unknown:
                raise UsageError(f"dispatch overheads name devices {unknown} that are not among {list(device_names)}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": self.schema_version, "worker_policy": self.worker_policy,
                "dispatch_overhead_us_by_device": dict(self.dispatch_overhead_us_by_device)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RuntimeModel":
        check_schema_version(data, "RuntimeModel")
        try:
            model = cls(dispatch_overhead_us_by_device=data.get("dispatch_overhead_us_by_device", {}),
                        worker_policy=str(data.get("worker_policy", "priority")),
                        schema_version=data["schema_version"])
        except (TypeError, ValueError) as exc:
            raise SchemaError(f"RuntimeModel JSON is malformed ({type(exc).__name__}: {exc})") from exc
        return model.validate()


@dataclass(frozen=True)
class RequestEvent:
    """One segment run or one copy of one request."""

    kind: str            # "segment" or "copy"
    request: int
    resource: str        # device name for segments, "src->dst" for copies
    start_us: float
    end_us: float
    segment_id: int      # the segment run; for a copy the segment that produced the tensor (-1: a model input)
    op_id: int = -1      # copies: the producer op, or -1-k for model input k; segments: -1
    size_bytes: int = 0  # copies only

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "request": self.request, "resource": self.resource, "start_us": self.start_us,
                "end_us": self.end_us, "segment_id": self.segment_id, "op_id": self.op_id,
                "size_bytes": self.size_bytes}


def steady_state_period_us(completed_us: Sequence[float]) -> float:
    """Mean interval between consecutive completions over the second half of the requests.

    With completions sorted as c_0 <= ... <= c_{N-1} and a = max(1, N // 2), the period is
    (c_{N-1} - c_{a-1}) / (N - a): the mean of the intervals c_i - c_{i-1} for i = a .. N-1. For N = 1 it is
    c_0 (one request admitted at 0 completes every c_0 us). Its inverse is the sustained throughput.
    """
    c = sorted(completed_us)
    if not c:
        return 0.0
    if len(c) == 1:
        return c[0]
    a = max(1, len(c) // 2)
    return (c[-1] - c[a - 1]) / (len(c) - a)


@dataclass(frozen=True)
class RequestsTimeline:
    """What the task runtime is predicted to do with N requests (see the module docstring)."""

    events: tuple[RequestEvent, ...]
    admitted_us: tuple[float, ...]       # per request
    completed_us: tuple[float, ...]      # per request
    latency_us: tuple[float, ...]        # per request: completed - admitted
    makespan_us: float                   # the last completion
    period_us: float                     # steady_state_period_us(completed_us)
    max_in_flight: int
    serial_links: bool = True
    runtime: RuntimeModel = field(default_factory=RuntimeModel)
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        object.__setattr__(self, "events", tuple(self.events))
        for key in ("admitted_us", "completed_us", "latency_us"):
            object.__setattr__(self, key, tuple(float(v) for v in getattr(self, key)))

    @property
    def n_requests(self) -> int:
        return len(self.completed_us)

    def events_of(self, request: int, kind: str | None = None) -> list[RequestEvent]:
        return [e for e in self.events if e.request == request and (kind is None or e.kind == kind)]

    def validate(self) -> "RequestsTimeline":
        if self.schema_version != SCHEMA_VERSION:
            raise SchemaError(f"RequestsTimeline schema_version must be {SCHEMA_VERSION}; found "
                              f"{self.schema_version}")
        n, tol = self.n_requests, 1e-6
        if not (len(self.admitted_us) == len(self.latency_us) == n) or not 1 <= self.max_in_flight <= max(n, 1):
            raise InvalidPlanError(f"a timeline of {n} requests needs {n} admissions, completions and latencies "
                                   f"and 1 <= max_in_flight <= {n}")
        for r in range(n):
            if abs(self.completed_us[r] - self.admitted_us[r] - self.latency_us[r]) > tol:
                raise InvalidPlanError(f"request {r}: latency {self.latency_us[r]} is not completion minus "
                                       "admission")
        if n and abs(self.makespan_us - max(self.completed_us)) > tol:
            raise InvalidPlanError(f"makespan {self.makespan_us} is not the last completion {max(self.completed_us)}")
        if abs(self.period_us - steady_state_period_us(self.completed_us)) > tol:
            raise InvalidPlanError(f"period {self.period_us} does not follow from the completions")
        busy: dict[str, list[RequestEvent]] = {}
        for e in self.events:
            if e.kind not in EVENT_KINDS or not 0 <= e.request < n:
                raise InvalidPlanError(f"event {e} has an unknown kind or request")
            if e.end_us < e.start_us - tol or e.start_us < self.admitted_us[e.request] - tol \
                    or e.end_us > self.completed_us[e.request] + tol:
                raise InvalidPlanError(f"event {e} ends before it starts or lies outside its request's lifetime")
            if e.kind == "segment" or self.serial_links:
                busy.setdefault(e.resource, []).append(e)
        for resource, events in busy.items():
            events.sort(key=lambda e: (e.start_us, e.end_us))
            for a, b in zip(events, events[1:]):
                if b.start_us < a.end_us - tol:
                    raise InvalidPlanError(f"{resource} runs two things at once: {a} and {b}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": self.schema_version, "makespan_us": self.makespan_us,
                "period_us": self.period_us, "max_in_flight": self.max_in_flight, "serial_links": self.serial_links,
                "runtime": self.runtime.to_dict(), "admitted_us": list(self.admitted_us),
                "completed_us": list(self.completed_us), "latency_us": list(self.latency_us),
                "events": [e.to_dict() for e in self.events]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RequestsTimeline":
        check_schema_version(data, "RequestsTimeline")
        try:
            timeline = cls(
                events=tuple(RequestEvent(**e) for e in data["events"]), admitted_us=data["admitted_us"],
                completed_us=data["completed_us"], latency_us=data["latency_us"],
                makespan_us=float(data["makespan_us"]), period_us=float(data["period_us"]),
                max_in_flight=int(data["max_in_flight"]), serial_links=bool(data.get("serial_links", True)),
                runtime=RuntimeModel.from_dict(data["runtime"]), schema_version=data["schema_version"])
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, SchemaError):
                raise
            raise SchemaError(f"RequestsTimeline JSON is malformed ({type(exc).__name__}: {exc})") from exc
        return timeline.validate()


class _Copy(NamedTuple):
    key: tuple[int, int]          # tie-break on a link: (0, model input) before (1, issue position of the producer)
    src: int
    dst: int
    duration_us: float
    size_bytes: int
    op_id: int                    # producer op, or -1-k for model input k
    producer_segment: int         # -1 for a model input
    waiting: list[int]            # segments on dst that need this copy


class _Program:
    """The per-request structure of a segmented plan, as flat lists for the event loop."""

    def __init__(self, model: SimModel, seg: Segmentation, dev: Sequence[int], runtime: RuntimeModel) -> None:
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
        self.copies_after: list[list[_Copy]] = [[] for _ in range(k)]
        for s in seg.segments:
            a = self.dev[s.id]
            for u in s.outputs:
                targets = {dev[w] for w in model.succ[u]} - {a}
                if model.is_output[u] and a != host:
                    targets.add(host)
                for b in sorted(targets):
                    self.copies_after[s.id].append(_Copy((1, position[u]), a, b, model.tdur[a][b][u],
                                                         model.copy_bytes[u], u, s.id, readers.get((u, b), [])))
        self.input_copies: list[_Copy] = []
        for x, consumers in enumerate(model.input_consumers):
            for b in sorted({dev[c] for c in consumers} - {host}):
                self.input_copies.append(_Copy((0, x), host, b, model.input_tdur[x][b], model.input_bytes[x],
                                               -1 - x, -1, input_readers.get((x, b), [])))
        self.tasks = k + sum(len(c) for c in self.copies_after) + len(self.input_copies)
        self.sequence = [[s.id for s in seg.segments if self.dev[s.id] == d] for d in range(model.n_dev)]


def _run(prog: _Program, names: Sequence[str], n_req: int, in_flight: int, runtime: RuntimeModel,
         serial: bool) -> RequestsTimeline:
    policy = runtime.worker_policy
    pending: list[tuple] = []                         # (time, seq, kind, payload)
    counter = itertools.count()
    deps: list[list[int]] = []
    remaining = [prog.tasks] * n_req
    admitted, completed = [math.nan] * n_req, [math.nan] * n_req
    worker_busy = [False] * prog.n_dev
    worker_queue: list[list[tuple[int, int]]] = [[] for _ in range(prog.n_dev)]
    expected = [(0, 0)] * prog.n_dev                  # fixed_order: (request, index into the device's sequence)
    link_busy: dict[tuple[int, int], bool] = {}
    link_queue: dict[tuple[int, int], list[tuple]] = {}
    events: list[RequestEvent] = []
    admit_next = 0

    def start_copy(now: float, r: int, copy: _Copy) -> None:
        end = now + copy.duration_us
        heapq.heappush(pending, (end, next(counter), "copy", (r, copy)))
        events.append(RequestEvent("copy", r, f"{names[copy.src]}->{names[copy.dst]}", now, end,
                                   copy.producer_segment, copy.op_id, copy.size_bytes))

    def offer_copy(now: float, r: int, copy: _Copy) -> None:
        if serial:
            heapq.heappush(link_queue.setdefault((copy.src, copy.dst), []), (now, r, copy.key, next(counter), copy))
        else:
            start_copy(now, r, copy)

    def ready(r: int, s: int) -> None:
        heapq.heappush(worker_queue[prog.dev[s]], (r, s))

    def admit(now: float) -> None:
        nonlocal admit_next
        r, admit_next = admit_next, admit_next + 1
        admitted[r] = now
        deps.append(list(prog.n_deps))
        for s, n in enumerate(prog.n_deps):
            if not n:
                ready(r, s)
        for copy in prog.input_copies:
            offer_copy(now, r, copy)
        if not prog.tasks:
            complete(now, r)

    def complete(now: float, r: int) -> None:
        completed[r] = now
        if admit_next < n_req:
            admit(now)

    def finish(now: float, r: int) -> None:
        remaining[r] -= 1
        if not remaining[r]:
            complete(now, r)

    def satisfy(r: int, segments: Sequence[int]) -> None:
        for s in segments:
            deps[r][s] -= 1
            if not deps[r][s]:
                ready(r, s)

    def dispatch(now: float) -> None:
        for d in range(prog.n_dev):
            queue = worker_queue[d]
            if worker_busy[d] or not queue:
                continue
            r, s = queue[0]
            if policy == "fixed_order":
                er, ek = expected[d]
                if (r, s) != (er, prog.sequence[d][ek]):
                    continue
                expected[d] = (er + 1, 0) if ek + 1 == len(prog.sequence[d]) else (er, ek + 1)
            heapq.heappop(queue)
            worker_busy[d] = True
            end = now + prog.duration_us[s]
            heapq.heappush(pending, (end, next(counter), "segment", (r, s)))
            events.append(RequestEvent("segment", r, names[d], now, end, s))
        for link, queue in link_queue.items():
            if queue and not link_busy.get(link):
                link_busy[link] = True
                _ready, r, _key, _n, copy = heapq.heappop(queue)
                start_copy(now, r, copy)

    for _ in range(in_flight):
        admit(0.0)
    dispatch(0.0)
    while pending:
        now = pending[0][0]
        while pending and pending[0][0] == now:
            _t, _n, kind, (r, item) = heapq.heappop(pending)
            if kind == "segment":
                worker_busy[prog.dev[item]] = False
                satisfy(r, prog.after_segment[item])
                for copy in prog.copies_after[item]:
                    offer_copy(now, r, copy)
            else:
                link_busy[(item.src, item.dst)] = False
                satisfy(r, item.waiting)
            finish(now, r)
        dispatch(now)
    if any(math.isnan(c) for c in completed):
        raise InvalidPlanError("the runtime simulation stalled: some segment never became ready (the "
                               "segmentation does not match the plan)")
    events.sort(key=lambda e: (e.start_us, e.end_us, e.request, e.kind, e.segment_id, e.op_id))
    return RequestsTimeline(tuple(events), tuple(admitted), tuple(completed),
                            tuple(c - a for c, a in zip(completed, admitted)), max(completed),
                            steady_state_period_us(completed), in_flight, serial, runtime)


def simulate_requests(graph: OpGraph, costs: CostTable, plan: Plan, *, n_requests: int = 1,
                      max_in_flight: int | None = None, runtime: RuntimeModel | None = None,
                      segmentation: Segmentation | None = None,
                      config: SimulationConfig | None = None) -> RequestsTimeline:
    """Predict the task runtime's timeline of ``n_requests`` requests of ``plan`` (see the module docstring).

    ``segmentation`` defaults to ``segment_plan(graph, plan)``; ``config`` (links, host) to the one the plan
    records, as for ``hetpart.simulate.simulate``. Raises InvalidPlanError/PinError for a plan or segmentation
    that does not fit the graph, MissingCostError for an op on a device that cannot run it, UsageError for bad
    request counts or runtime parameters.
    """
    if n_requests < 1:
        raise UsageError(f"n_requests must be >= 1; found {n_requests}")
    in_flight = n_requests if max_in_flight is None else max_in_flight
    if not 1 <= in_flight <= n_requests:
        raise UsageError(f"max_in_flight must be between 1 and n_requests ({n_requests}); found {max_in_flight}")
    runtime = (runtime or RuntimeModel()).validate(costs.device_names)
    model = SimModel(graph, costs, config or plan_simulation_config(plan))
    plan.validate(graph)
    dev = model.device_indices(plan)
    model.check_supported(dev)
    seg = segment_plan(graph, plan) if segmentation is None else segmentation.validate(graph, plan)
    return _run(_Program(model, seg, dev, runtime), model.names, n_requests, in_flight, runtime,
                model.config.serial_links)
