"""Partitioners: decide which device runs each op. All share ``solve(graph, costs, config) -> Plan``.

``METHODS`` maps a method name to its solve function; ``get_method(name)`` looks one up. Every plan is
scored by the one simulator (``hetpart.simulate``): ``plan.makespan_us == simulate(graph, costs, plan)``.
Imports numpy/scipy only (core rule).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

from hetpart.costs import CostTable
from hetpart.errors import InvalidPlanError
from hetpart.graph import OpGraph
from hetpart.partition import cp_greedy, exhaustive, greedy, heft, milp, portfolio, timeslice
from hetpart.partition.common import PartitionConfig, ProblemTooLargeError
from hetpart.partition.explain import OpWhy, explain
from hetpart.partition.single_device import solve_all_cpu, solve_all_gpu
from hetpart.plan import Plan

SolveFn = Callable[[OpGraph, CostTable, "PartitionConfig | Mapping[str, Any] | None"], Plan]

METHODS: dict[str, SolveFn] = {
    "all_cpu": solve_all_cpu,
    "all_gpu": solve_all_gpu,
    "greedy": greedy.solve,
    "heft": heft.solve,
    "cp_greedy": cp_greedy.solve,
    "portfolio": portfolio.solve,
    "milp": milp.solve,
    "exhaustive": exhaustive.solve,
    "timeslice": timeslice.solve,
}
DEFAULT_METHOD = "portfolio"


def get_method(name: str) -> SolveFn:
    try:
        return METHODS[name]
    except KeyError:
        raise InvalidPlanError(f"unknown partitioning method {name!r}; choose one of {sorted(METHODS)}") from None


def partition(graph: OpGraph, costs: CostTable, method: str = DEFAULT_METHOD,
              config: PartitionConfig | Mapping[str, Any] | None = None) -> Plan:
    """Plan ``graph`` on the devices of ``costs`` with the named method."""
    return get_method(method)(graph, costs, config)


__all__ = ["METHODS", "DEFAULT_METHOD", "OpWhy", "PartitionConfig", "ProblemTooLargeError", "explain",
           "get_method", "partition"]
