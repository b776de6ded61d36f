"""``exhaustive``: the exact optimum of the simulator by enumeration, for tiny graphs (tests ``milp``).

Enumerates every device assignment (allowed devices only: support and pins) and every topological issue
order, simulates each distinct combination of per-device op sequences (the simulated schedule depends on
the order only through them: copies on a link follow the producers' order on their device), and keeps the
lowest makespan (first found on ties). Memory-infeasible combinations are skipped. Raises
ProblemTooLargeError when more than ``config.exhaustive_max_schedules`` (assignment, order) pairs would be
enumerated.
"""
from __future__ import annotations

import itertools
from typing import Any, Iterator, Mapping

from hetpart.costs import CostTable
from hetpart.errors import InfeasibleError
from hetpart.graph import OpGraph
from hetpart.partition.common import PartitionConfig, Problem, ProblemTooLargeError, finish_plan
from hetpart.plan import Plan


def topological_orders(preds: list[tuple[int, ...]], succ: list[tuple[int, ...]]) -> Iterator[list[int]]:
    """Every topological order of the DAG, in lexicographic order of op ids."""
    n = len(preds)
    indegree = [len(p) for p in preds]
    order: list[int] = []
    ready = sorted(v for v in range(n) if indegree[v] == 0)

    def extend(ready: list[int]) -> Iterator[list[int]]:
        if len(order) == n:
            yield list(order)
            return
        for k, v in enumerate(ready):
            order.append(v)
            rest = ready[:k] + ready[k + 1:]
            for w in succ[v]:
                indegree[w] -= 1
                if indegree[w] == 0:
                    rest.append(w)
            yield from extend(sorted(rest))
            for w in succ[v]:
                indegree[w] += 1
            order.pop()

    yield from extend(ready)


def solve(graph: OpGraph, costs: CostTable, config: PartitionConfig | Mapping[str, Any] | None = None) -> Plan:
    problem = Problem(graph, costs, config, "exhaustive")
    limit = problem.config.exhaustive_max_schedules
    model = problem.model
    n_assignments = 1
    for options in problem.allowed_list:
        n_assignments *= len(options)
    max_orders = limit // n_assignments
    orders = []
    for order in topological_orders(model.preds, model.succ):
        orders.append(order)
        if len(orders) > max_orders:
            break
    if n_assignments * len(orders) > limit:
        raise ProblemTooLargeError(
            f"exhaustive search of {graph.name!r} needs {n_assignments} assignments x "
            f"{len(orders) if len(orders) <= max_orders else f'> {max_orders}'} issue orders, more than "
            f"exhaustive_max_schedules={limit}; use milp or cp_greedy for graphs this size")
    best: tuple[float, list[int], list[int]] | None = None
    simulated = 0
    for assignment in itertools.product(*problem.allowed_list):
        seen: set[tuple] = set()
        for order in orders:
            key = tuple(tuple(v for v in order if assignment[v] == d) for d in range(problem.n_dev))
            if key in seen:
                continue
            seen.add(key)
            simulated += 1
            sched = model.run(assignment, order)
            try:
                model.check_memory(sched)
            except InfeasibleError:
                continue
            if best is None or sched.makespan_us < best[0] * (1 - 1e-12):
                best = (sched.makespan_us, list(assignment), order)
    if best is None:
        raise InfeasibleError(f"no assignment of {graph.name!r} fits in the devices' memory; "
                              "offer more memory or a smaller batch")
    return finish_plan(problem, best[1], best[2], stats={"simulated": simulated, "assignments": n_assignments,
                                                          "orders": len(orders)})
