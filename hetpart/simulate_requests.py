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
* With ``RuntimeModel.copies="consumer"`` (what the task runtime does) copies take worker time instead: a segment
  is ready when its producer segments on every device have ended; its worker then copies each tensor (and, off
  the host, each model input) it reads that is not yet on its device for this request, one after another, and
  runs the segment. The worker that ends a request's last segment copies the model outputs made off the host.
* Requests ``0..N-1`` wait at t = 0 and are admitted in order, at most ``max_in_flight`` (default N) unfinished at
  a time. A request's segments may start ``RuntimeModel.admission_us`` after its admission; it completes
  ``RuntimeModel.completion_us`` after its last segment or copy ends (then the next waiting request is admitted);
  its latency is completion minus admission.
* Continuation (``RuntimeModel.continuation``, with copies="consumer" and the "priority" policy): when a worker
  ends a segment and no segment of its own device is ready, it runs the first newly ready segment (of the request
  whose segment it ended, lowest id) of an interchangeable device (``DeviceSet.interchangeable_groups``: CPU core
  groups of one host with as many cores each) itself, at that device's cost and overhead, instead of leaving it to
  that device's worker. One request through a chain of segments then runs on one core, as the task runtime does.
* Work sharing (``RuntimeModel.sharing``, same conditions): after the workers have taken their own devices' ready
  segments, a free worker with none of its own takes the ready segment with the lowest (request, segment id) among
  its interchangeable devices' queues (whose workers are busy), at that device's cost and overhead.
* Cross-device sharing (``RuntimeModel.cross_device_sharing``, with sharing): a free worker with nothing of its
  own or its peers' takes another busy device's first ready segment when ``hetpart.cross_sharing.takes`` says it
  ends it sooner (:func:`sharing_table`); the outputs stay on its device and readers copy them from there.

Memory is not checked (N requests in flight hold N sets of activations). Imports numpy only through
``hetpart.simulate`` (core rule).
"""
from __future__ import annotations

import heapq
import itertools
import math
from typing import Sequence

from hetpart.costs import CostTable
from hetpart.cross_sharing import busy_until_us, takes
from hetpart.errors import InvalidPlanError, UsageError
from hetpart.graph import OpGraph
from hetpart.plan import Plan
from hetpart.request_program import Program, RequestCopy, prepared_program, sharing_table
from hetpart.request_timeline import (COPY_PLACEMENTS, EVENT_KINDS, WORKER_POLICIES, RequestEvent, RequestsTimeline,
                                      RuntimeModel, steady_state_period_us)
from hetpart.segments import Segmentation
from hetpart.simulate import SimulationConfig

__all__ = ["COPY_PLACEMENTS", "EVENT_KINDS", "WORKER_POLICIES", "RequestEvent", "RequestsTimeline", "RuntimeModel",
           "sharing_table", "simulate_requests", "steady_state_period_us"]


def _run(prog: Program, names: Sequence[str], n_req: int, in_flight: int, runtime: RuntimeModel,
         serial: bool, groups: Sequence[Sequence[str]] = ()) -> RequestsTimeline:
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
    consumer = runtime.copies == "consumer"
    on_device: list[set[tuple]] = []                  # consumer copies: (copy key, device) already there
    segments_left = [prog.k] * n_req
    ran_on: dict[tuple[int, int], int] = {}           # (request, segment) -> the worker running it
    location: list[list[int]] = []                    # per request and segment: the device holding its outputs
    moved: list[bool] = []                            # per request: a segment of it ran on another device
    unfinished = [0]                                  # requests admitted and not yet completed
    busy_until = [0.0] * prog.n_dev                   # when each busy worker frees
    across = consumer and policy == "priority" and runtime.sharing and runtime.cross_device_sharing
    peers: list[set[int]] = [set() for _ in range(prog.n_dev)]     # the devices whose segments a worker may run
    if consumer and policy == "priority" and (runtime.continuation or runtime.sharing):
        for group in groups:
            members = {names.index(n) for n in group}
            for d in members:
                peers[d] = members - {d}

    def copy_event(start: float, r: int, copy: RequestCopy, dst: int) -> float:
        end = start + copy.duration_us
        events.append(RequestEvent("copy", r, f"{names[copy.src]}->{names[dst]}", start, end,
                                   copy.producer_segment, copy.op_id, copy.size_bytes))
        return end

    def start_copy(now: float, r: int, copy: RequestCopy) -> None:
        heapq.heappush(pending, (copy_event(now, r, copy, copy.dst), next(counter), "copy", (r, copy)))

    def offer_copy(now: float, r: int, copy: RequestCopy) -> None:
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
        deps.append([len(p) for p in prog.producers] if consumer else list(prog.n_deps))
        on_device.append(set())
        location.append(list(prog.dev))
        moved.append(False)
        unfinished[0] += 1
        if runtime.admission_us > 0:
            heapq.heappush(pending, (now + runtime.admission_us, next(counter), "admitted", (r, None)))
        else:
            start_request(now, r)

    def start_request(now: float, r: int) -> None:
        for s, n in enumerate(deps[r]):
            if not n:
                ready(r, s)
        if not consumer:
            for copy in prog.input_copies:
                offer_copy(now, r, copy)
        if not (prog.k if consumer else prog.tasks):
            complete(now, r)

    def complete(now: float, r: int) -> None:
        unfinished[0] -= 1
        if runtime.completion_us > 0:
            heapq.heappush(pending, (now + runtime.completion_us, next(counter), "completed", (r, None)))
        else:
            resolve(now, r)

    def resolve(now: float, r: int) -> None:
        completed[r] = now
        if admit_next < n_req:
            admit(now)

    def finish(now: float, r: int) -> None:
        remaining[r] -= 1
        if not remaining[r]:
            complete(now, r)

    def satisfy(r: int, segments: Sequence[int]) -> list[int]:
        newly_ready = []
        for s in segments:
            deps[r][s] -= 1
            if not deps[r][s]:
                ready(r, s)
                newly_ready.append(s)
        return newly_ready

    def start_segment(now: float, w: int, r: int, s: int, taken: bool = False) -> None:
        """Worker ``w`` starts segment ``s`` of request ``r``: its own device's, a peer's (continuation, sharing;
        the peer shares the memory of the segment's device) or, ``taken``, another device's (cross-device
        sharing: its inputs come to ``w``'s device and its outputs stay there)."""
        d = w if taken else prog.dev[s]
        worker_busy[w] = True
        ran_on[(r, s)] = w
        location[r][s] = d
        moved[r] = moved[r] or taken
        start = now
        if consumer:
            for pull in (prog.pulls(s, d, location[r]) if moved[r] else prog.planned_pulls[s]):
                if (pull.key, d) not in on_device[r]:
                    on_device[r].add((pull.key, d))
                    start = copy_event(start, r, pull, d)
        end = start + (prog.sharing.duration_us[w][s] if taken else prog.duration_us[s])
        if across:
            busy_until[w] = busy_until_us(prog.sharing, now, d, s)
        heapq.heappush(pending, (end, next(counter), "segment", (r, s)))
        events.append(RequestEvent("segment", r, names[w], start, end, s))

    def continue_with(now: float, w: int, r: int, newly_ready: Sequence[int]) -> None:
        """Continuation: worker ``w``, just free and with nothing of its own device ready, runs the first newly
        ready segment of a peer device itself."""
        if not runtime.continuation or not peers[w] or worker_queue[w]:
            return
        s = next((s for s in newly_ready if prog.dev[s] in peers[w]), None)
        if s is None:
            return
        queue = worker_queue[prog.dev[s]]
        queue.remove((r, s))
        heapq.heapify(queue)
        start_segment(now, w, r, s)

    def share_across(now: float) -> None:
        """Cross-device sharing (``hetpart.cross_sharing``): a free worker with nothing of its own takes the first
        ready segment (lowest (request, segment id) first) of a busy device that it is predicted to end sooner."""
        for w in range(prog.n_dev):
            if worker_busy[w] or worker_queue[w]:
                continue
            for d in sorted((d for d in range(prog.n_dev) if d != w and d not in peers[w] and worker_queue[d]
                             and worker_busy[d]), key=lambda d: worker_queue[d][0]):
                r, s = worker_queue[d][0]
                if takes(prog.sharing, now, w, d, s, busy_until[d], unfinished[0]):
                    heapq.heappop(worker_queue[d])
                    start_segment(now, w, r, s, taken=True)
                    break

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
            start_segment(now, d, r, s)
        if runtime.sharing:                  # work sharing: a free worker with nothing of its own takes a peer's best
            for w in range(prog.n_dev):
                if worker_busy[w] or worker_queue[w] or not peers[w]:
                    continue
                ready = [(worker_queue[p][0], p) for p in peers[w] if worker_queue[p]]
                if ready:
                    (r, s), p = min(ready)
                    heapq.heappop(worker_queue[p])
                    start_segment(now, w, r, s)
        if across:
            share_across(now)
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
            if kind == "segment" and consumer:
                w = ran_on.pop((r, item))
                newly_ready = satisfy(r, prog.readers_of[item])
                segments_left[r] -= 1
                outputs = [] if segments_left[r] else (prog.output_copies(location[r]) if moved[r]
                                                       else prog.planned_output_copies)
                if outputs:                        # this worker copies the outputs back
                    end = now
                    for copy in outputs:
                        end = copy_event(end, r, copy, copy.dst)
                    heapq.heappush(pending, (end, next(counter), "outputs", (r, w)))
                    continue
                worker_busy[w] = False
                if not segments_left[r]:
                    complete(now, r)
                else:
                    continue_with(now, w, r, newly_ready)
            elif kind == "outputs":
                worker_busy[item] = False
                complete(now, r)
            elif kind == "admitted":
                start_request(now, r)
            elif kind == "completed":
                resolve(now, r)
            elif kind == "segment":
                worker_busy[ran_on.pop((r, item))] = False
                satisfy(r, prog.after_segment[item])
                for copy in prog.copies_after[item]:
                    offer_copy(now, r, copy)
                finish(now, r)
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
    prog, model = prepared_program(graph, costs, plan, runtime, segmentation, config)
    return _run(prog, model.names, n_requests, in_flight, runtime, model.config.serial_links,
                costs.devices.interchangeable_groups())
