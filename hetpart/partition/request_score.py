"""Scoring plans by the task runtime's N-request simulation (``hetpart.simulate_requests``).

:class:`Score` summarises one simulated batch of requests (makespan, steady-state period, p50/p99 latency);
:func:`score_plan` simulates a plan; :func:`choose_for_requests` picks, among candidate plans of one problem, the
one with the smallest N-request makespan (then p99 latency) -- how ``portfolio`` turns its single-request search
into a choice for ``config.requests`` requests in flight and the runtime's per-segment overhead. Imports nothing
outside the core.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from hetpart.costs import CostTable
from hetpart.graph import OpGraph
from hetpart.partition.common import PartitionConfig, Problem
from hetpart.plan import Plan
from hetpart.segments import Segmentation
from hetpart.simulate_requests import RuntimeModel, simulate_requests

__all__ = ["Score", "choose_for_requests", "score_assignment", "score_plan", "wants_request_objective"]


@dataclass(frozen=True)
class Score:
    """The N-request simulation of one candidate plan."""

    n_requests: int
    makespan_us: float
    period_us: float            # simulate_requests' steady-state period (second half of the completions)
    latency_p50_us: float
    latency_p99_us: float

    def key(self) -> tuple[float, float]:
        return self.makespan_us, self.latency_p99_us

    def to_dict(self) -> dict[str, float]:
        """With ``throughput_per_s`` = requests / makespan (over the whole batch)."""
        return {"makespan_us": self.makespan_us, "period_us": self.period_us,
                "throughput_per_s": self.n_requests / self.makespan_us * 1e6 if self.makespan_us > 0 else math.inf,
                "latency_p50_us": self.latency_p50_us, "latency_p99_us": self.latency_p99_us}


def score_plan(graph: OpGraph, costs: CostTable, plan: Plan, n_requests: int, **kwargs: Any) -> Score:
    """``simulate_requests`` of ``plan`` with ``n_requests`` in flight, summarised (p50/p99: numpy's linear
    percentiles of the per-request latencies). ``kwargs`` go to ``simulate_requests``."""
    timeline = simulate_requests(graph, costs, plan, n_requests=n_requests, **kwargs)
    latency = np.asarray(timeline.latency_us)
    return Score(n_requests, timeline.makespan_us, timeline.period_us, float(np.percentile(latency, 50)),
                 float(np.percentile(latency, 99)))


def wants_request_objective(problem: Problem) -> bool:
    """Whether plans of ``problem`` are judged by the N-request simulation of the task runtime: more than one
    request in flight, or a runtime model given (``dispatch_overhead_us_by_device``, even of zeros: the plan is
    for the task runtime, whose whole segments wait for all their inputs, which the op-level simulation does
    not model)."""
    return problem.config.requests > 1 or bool(problem.config.dispatch_overhead_us_by_device)


def score_assignment(problem: Problem, dev: Sequence[int], order: Sequence[int], method: str, runtime: RuntimeModel,
                     segmentation_for: Callable[[Plan], Segmentation] | None = None,
                     max_in_flight: int | None = None) -> Score:
    """``config.requests``-request :class:`Score` of the assignment ``dev`` issued in ``order`` (infinite when one
    request overflows a device's memory); ``segmentation_for`` gives the plan's segments (default: the runtime's
    ``segment_plan``); ``max_in_flight``: at most that many of them in flight at a time (default all)."""
    n_requests = problem.config.requests
    if not math.isfinite(problem.model.makespan(dev, order)):
        return Score(n_requests, math.inf, math.inf, math.inf, math.inf)
    plan = Plan(device_of=tuple(problem.names[d] for d in dev), order=tuple(order), devices=problem.names,
                method=method, pins=problem.config.pins, level=problem.graph.level)   # made for this graph
    return score_plan(problem.graph, problem.costs, plan, n_requests, runtime=runtime,
                      config=problem.config.simulation,
                      segmentation=None if segmentation_for is None else segmentation_for(plan),
                      max_in_flight=max_in_flight)


def runtime_model(config: PartitionConfig, device_names: Sequence[str]) -> RuntimeModel:
    """The task runtime's model a partition config describes: its overhead per segment, copies on the consumer,
    work shared between equal CPU core groups unless ``config.work_sharing`` is off, and across devices with
    ``config.cross_device_sharing``."""
    return RuntimeModel(config.dispatch_overhead_us_by_device, copies="consumer", continuation=config.work_sharing,
                        sharing=config.work_sharing,
                        cross_device_sharing=config.work_sharing and config.cross_device_sharing
                        ).validate(device_names)


def choose_for_requests(problem: Problem, candidates: Sequence[tuple[str, Sequence[int], Sequence[int]]],
                        method: str) -> tuple[int, list[Score]]:
    """Index of the candidate ``(name, assignment, order)`` with the smallest ``config.requests``-request makespan
    (ties: p99 latency, then the earlier candidate) under the runtime model of ``config``, and every score."""
    runtime = runtime_model(problem.config, problem.names)
    scores = [score_assignment(problem, dev, order, method, runtime) for _name, dev, order in candidates]
    best = min(range(len(candidates)), key=lambda k: (*scores[k].key(), k))
    return best, scores
