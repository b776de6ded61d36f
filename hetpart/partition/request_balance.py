"""Request-level load balancing: every request runs whole on one device, the one that frees first.

The baseline the time-slice pipeline is compared with (docs/rnn_pipeline.md). No request is split: each device
runs its single-device plan (``single_device_assignment``: every op it can run, the rest on an allowed device),
and a dispatcher hands the next waiting request to whichever device frees first. What one request costs on
device ``d`` comes from ``hetpart.simulate_requests`` of that plan with one request and the same runtime model:

* ``latency_d``: the request's latency on idle devices (input copies, the device's segments, any segment of ops
  the device cannot run, output copies);
* ``busy_d``: how long it holds device ``d``'s worker: from its start to the end of its last segment on ``d``,
  and with the task runtime's copies (``RuntimeModel(copies="consumer")``: the worker that ends a request copies
  its outputs back to the host) to the end of that copy; with copies on the links it overlaps the next request.

Requests ``0..N-1`` wait at t = 0 and are admitted in order, at most ``max_in_flight`` unfinished at a time (a
completion admits the next), as in ``simulate_requests``. Request ``r`` goes, at its admission, to the device
with the earliest free time (ties: the smaller ``latency_d``, then the lower device index); it starts when that
device frees and completes ``latency_d`` later. Not modelled: link contention between requests on different
devices, and the host time of the few ops a GPU plan leaves on the host (both absent from the zoo RNNs' plans).

Imports nothing outside the core.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from hetpart.costs import CostTable
from hetpart.errors import InvalidPlanError, UsageError
from hetpart.graph import OpGraph
from hetpart.partition.common import PartitionConfig, Problem
from hetpart.partition.single_device import single_device_assignment
from hetpart.plan import Plan
from hetpart.simulate_requests import RuntimeModel, simulate_requests, steady_state_period_us


@dataclass(frozen=True)
class DeviceService:
    """What one whole request costs on one device (module docstring)."""

    device: str
    latency_us: float
    busy_us: float
    ops_elsewhere: int        # ops its plan cannot place on the device

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "latency_us": self.latency_us, "busy_us": self.busy_us,
                "ops_elsewhere": self.ops_elsewhere}


@dataclass(frozen=True)
class BalanceTimeline:
    """N requests dispatched whole to the device that frees first."""

    services: tuple[DeviceService, ...]
    device_of_request: tuple[str, ...]
    admitted_us: tuple[float, ...]
    started_us: tuple[float, ...]
    completed_us: tuple[float, ...]
    latency_us: tuple[float, ...]        # completed - admitted
    makespan_us: float
    period_us: float                     # steady_state_period_us(completed_us), as simulate_requests
    max_in_flight: int

    def validate(self) -> "BalanceTimeline":
        n, tol = len(self.completed_us), 1e-6
        if not (len(self.admitted_us) == len(self.started_us) == len(self.latency_us) == len(self.device_of_request)
                == n) or not 1 <= self.max_in_flight <= max(n, 1):
            raise InvalidPlanError(f"a balance timeline of {n} requests needs {n} admissions, starts, completions, "
                                   "latencies and devices, and 1 <= max_in_flight <= n")
        for r in range(n):
            if not self.admitted_us[r] - tol <= self.started_us[r] <= self.completed_us[r] + tol \
                    or abs(self.completed_us[r] - self.admitted_us[r] - self.latency_us[r]) > tol:
                raise InvalidPlanError(f"request {r}: admission {self.admitted_us[r]}, start {self.started_us[r]} "
                                       f"and completion {self.completed_us[r]} are out of order")
        if n and abs(self.makespan_us - max(self.completed_us)) > tol:
            raise InvalidPlanError(f"makespan {self.makespan_us} is not the last completion")
        return self

    def to_dict(self) -> dict[str, Any]:
        return {"services": [s.to_dict() for s in self.services], "device_of_request": list(self.device_of_request),
                "admitted_us": list(self.admitted_us), "started_us": list(self.started_us),
                "completed_us": list(self.completed_us), "latency_us": list(self.latency_us),
                "makespan_us": self.makespan_us, "period_us": self.period_us, "max_in_flight": self.max_in_flight}


def device_services(graph: OpGraph, costs: CostTable, config: PartitionConfig | Mapping[str, Any] | None = None,
                    runtime: RuntimeModel | None = None) -> tuple[DeviceService, ...]:
    """Latency and worker time of one whole request on each device (module docstring)."""
    problem = Problem(graph, costs, config, "request_balance")
    services = []
    for d, name in enumerate(problem.names):
        dev = single_device_assignment(problem, d)
        plan = Plan(device_of=tuple(problem.names[x] for x in dev), order=tuple(range(problem.n)),
                    devices=problem.names, method=f"all_{name}", pins=problem.config.pins,
                    graph_hash=graph.structure_hash(), level=graph.level)
        timeline = simulate_requests(graph, costs, plan, n_requests=1, runtime=runtime,
                                     config=problem.config.simulation)
        segments = [e for e in timeline.events if e.kind == "segment"]
        busy = max((e.end_us for e in segments if e.resource == name), default=0.0)
        last = max(segments, key=lambda e: e.end_us, default=None)
        if timeline.runtime.copies == "consumer" and last is not None and last.resource == name:
            busy = timeline.completed_us[0] - timeline.runtime.completion_us   # it copied the outputs back
        services.append(DeviceService(name, timeline.latency_us[0], busy, sum(1 for x in dev if x != d)))
    return tuple(services)


def simulate_request_balance(graph: OpGraph, costs: CostTable, *, n_requests: int, max_in_flight: int | None = None,
                             config: PartitionConfig | Mapping[str, Any] | None = None,
                             runtime: RuntimeModel | None = None) -> BalanceTimeline:
    """Dispatch ``n_requests`` whole requests to the device that frees first (module docstring)."""
    if n_requests < 1:
        raise UsageError(f"n_requests must be >= 1; found {n_requests}")
    in_flight = n_requests if max_in_flight is None else max_in_flight
    if not 1 <= in_flight <= n_requests:
        raise UsageError(f"max_in_flight must be between 1 and n_requests ({n_requests}); found {max_in_flight}")
    services = device_services(graph, costs, config, runtime)
    free = [0.0] * len(services)
    admitted, started, completed, chosen = [], [], [], []
    for r in range(n_requests):
        admit = 0.0 if r < in_flight else sorted(completed)[r - in_flight]
        d = min(range(len(services)), key=lambda k: (max(free[k], admit), services[k].latency_us, k))
        start = max(free[d], admit)
        free[d] = start + services[d].busy_us
        admitted.append(admit)
        started.append(start)
        completed.append(start + services[d].latency_us)
        chosen.append(services[d].device)
    latency = tuple(c - a for c, a in zip(completed, admitted))
    return BalanceTimeline(services, tuple(chosen), tuple(admitted), tuple(started), tuple(completed), latency,
                           max(completed), steady_state_period_us(completed), in_flight).validate()


def two_device_limit_per_s(services: tuple[DeviceService, ...]) -> float:
    """Requests per second of all devices each running whole requests back to back: sum of 1e6 / busy_us."""
    return sum(1e6 / s.busy_us if s.busy_us > 0 else math.inf for s in services)
