"""``greedy``: ONNX-Runtime-like placement.

Like ONNX Runtime's execution-provider assignment: the preferred device (``config.preferred_device``,
default the first GPU) takes every op it supports; ops it cannot run, and shape-computation ops
(``OpNode.shape_only``), stay on the host CPU. Copy costs and concurrency play no part in the decision
(they do in the simulated makespan it is scored by). Pins override. Issue order is the op id order.
"""
from __future__ import annotations

from typing import Any, Mapping

from hetpart.costs import CostTable
from hetpart.errors import UnknownDeviceError
from hetpart.graph import OpGraph
from hetpart.partition.common import PartitionConfig, Problem, finish_plan
from hetpart.plan import Plan


def solve(graph: OpGraph, costs: CostTable, config: PartitionConfig | Mapping[str, Any] | None = None) -> Plan:
    problem = Problem(graph, costs, config, "greedy")
    dev, target = greedy_assignment(problem)
    kept = sum(1 for d in dev if d != target)
    return finish_plan(problem, dev, list(range(problem.n)), stats={"ops_not_on_preferred": kept})


def greedy_assignment(problem: Problem) -> tuple[list[int], int]:
    """The ORT-like device per op, and the preferred device index."""
    preferred = problem.config.preferred_device
    if preferred is not None:
        target = problem.costs.devices.index(preferred)      # raises UnknownDeviceError listing the devices
    else:
        try:
            target = problem.device_of_kind("gpu")
        except UnknownDeviceError:                            # no GPU offered: the host takes everything
            target = problem.host
    dev = []
    for node in problem.graph.nodes:
        wanted = problem.host if node.shape_only else target
        dev.append(problem.place_or_fallback(node.id, wanted))
    return dev, target
