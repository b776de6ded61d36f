"""Baselines that run everything on one device: ``all_cpu`` and ``all_gpu``.

Ops the device cannot run (no cost) and ops pinned elsewhere run on the host (or their fastest allowed
device); the plan notes how many. Issue order is the graph's topological op order.
"""
from __future__ import annotations

from typing import Any, Mapping

from hetpart.costs import CostTable
from hetpart.graph import OpGraph
from hetpart.partition.common import PartitionConfig, Problem, finish_plan
from hetpart.plan import Plan


def single_device_assignment(problem: Problem, target: int) -> list[int]:
    """Every op on device ``target`` unless it cannot run there or is pinned elsewhere."""
    return [problem.place_or_fallback(i, target) for i in range(problem.n)]


def _solve_on(kind: str, method: str, graph: OpGraph, costs: CostTable,
              config: PartitionConfig | Mapping[str, Any] | None) -> Plan:
    problem = Problem(graph, costs, config, method)
    target = problem.device_of_kind(kind)
    dev = single_device_assignment(problem, target)
    moved = sum(1 for d in dev if d != target)
    notes = [f"{moved} ops cannot run on (or are pinned away from) {problem.names[target]!r} and run elsewhere"] \
        if moved else []
    return finish_plan(problem, dev, list(range(problem.n)), notes=notes, warn_degenerate=False,
                       stats={"ops_off_target": moved})


def solve_all_cpu(graph: OpGraph, costs: CostTable, config: PartitionConfig | Mapping[str, Any] | None = None) -> Plan:
    """Every op on the CPU."""
    return _solve_on("cpu", "all_cpu", graph, costs, config)


def solve_all_gpu(graph: OpGraph, costs: CostTable, config: PartitionConfig | Mapping[str, Any] | None = None) -> Plan:
    """Every op the GPU supports on the GPU; the rest on the CPU (host)."""
    return _solve_on("gpu", "all_gpu", graph, costs, config)
