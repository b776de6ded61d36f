"""``heft``: Heterogeneous Earliest Finish Time (Topcuoglu, Hariri & Wu, IEEE TPDS 13(3), 2002).

1. Upward rank of every op: its mean latency over the devices allowed to run it plus the maximum, over its
   successors, of the mean copy time of its output and the successor's rank.
2. In decreasing rank order, put each op on the device giving the earliest finish time, using the
   *insertion* policy: the op may go into an idle gap between ops already scheduled on that device if the gap
   is long enough. Data ready time = max over producers of their finish + the copy time when on another
   device (model inputs read from the host count their copy too).
3. The plan's issue order is the HEFT start-time order, so each device issues ops in HEFT's sequence.

As in the paper, HEFT's internal model has no link contention and copies every edge separately; the
returned plan is scored by the shared simulator (one copy per tensor and device, serialised links), so
``plan.makespan_us`` can differ from HEFT's own estimate (kept in ``plan.stats["heft_estimate_us"]``).
"""
from __future__ import annotations

import bisect
from typing import Any, Mapping

from hetpart.costs import CostTable
from hetpart.graph import OpGraph
from hetpart.partition.common import PartitionConfig, Problem, finish_plan
from hetpart.plan import Plan


def _earliest_slot(starts: list[float], ends: list[float], ready: float, duration: float) -> float:
    """Earliest start >= ready of a gap of ``duration`` between the busy intervals (sorted, disjoint)."""
    i = bisect.bisect_right(ends, ready)
    t = ready
    while i < len(starts):
        if t + duration <= starts[i]:
            return t
        if ends[i] > t:
            t = ends[i]
        i += 1
    return t


def solve(graph: OpGraph, costs: CostTable, config: PartitionConfig | Mapping[str, Any] | None = None) -> Plan:
    problem = Problem(graph, costs, config, "heft")
    dev, order, estimate = heft_schedule(problem)
    return finish_plan(problem, dev, order, stats={"heft_estimate_us": estimate})


def heft_schedule(problem: Problem) -> tuple[list[int], list[int], float]:
    """HEFT assignment, issue order and HEFT's own makespan estimate."""
    model, n, n_dev, host = problem.model, problem.n, problem.n_dev, problem.host
    priority = problem.rank_order()
    position = [0] * n
    for k, v in enumerate(priority):
        position[v] = k
    dev = [0] * n
    start = [0.0] * n
    finish = [0.0] * n
    busy_starts: list[list[float]] = [[] for _ in range(n_dev)]
    busy_ends: list[list[float]] = [[] for _ in range(n_dev)]
    input_ready = [[0.0 if d == host else max([model.input_tdur[k][d] for k in model.op_inputs[v]] + [0.0])
                    for d in range(n_dev)] for v in range(n)]
    for v in priority:
        best = None
        for d in problem.allowed_list[v]:
            ready = input_ready[v][d]
            for u in model.preds[v]:
                t = finish[u] if dev[u] == d else finish[u] + model.tdur[dev[u]][d][u]
                if t > ready:
                    ready = t
            duration = model.lat[d][v]
            est = _earliest_slot(busy_starts[d], busy_ends[d], ready, duration)
            key = (est + duration, d)
            if best is None or key < best[0]:
                best = (key, est, d)
        assert best is not None, f"op {v} has no allowed device"
        (_, est, d) = best
        dev[v], start[v], finish[v] = d, est, est + model.lat[d][v]
        i = bisect.bisect_right(busy_starts[d], est)
        while i > 0 and busy_starts[d][i - 1] == est and busy_ends[d][i - 1] > finish[v]:
            i -= 1                                   # a zero-length op goes before a longer one starting with it
        busy_starts[d].insert(i, est)
        busy_ends[d].insert(i, finish[v])
    order = sorted(range(n), key=lambda v: (start[v], position[v]))
    estimate = max(finish) if n else 0.0
    return dev, order, estimate
