"""GroPipe: G groups x P pipeline stages, data parallelism between groups, delayed per-stage all-reduce.

After R. D. Liu, "Research on Acceleration Method of Deep Convolutional Neural Networks Based on Hybrid
Parallelism" (master's thesis, 2023): every group holds a whole model copy split into P stages (one device
each) and runs a GPipe-style pipeline on its share of the mini-batch; the groups train data-parallel. A stage's
gradients are all-reduced across its G replicas in one bucket once the stage's last backward ended (the
"partition-based delayed communication"), so later stages' all-reduce overlaps earlier stages' backward.

For every factorisation ``G x P`` of the device count (and two layouts: groups of consecutive devices, or
strided so that a stage's replicas are neighbours), the intra-group split is the exact stage DP without
replication on ``P`` devices with ``n / G`` micro-batches per group (all stashed, as under GPipe); the plan
with the shortest simulated iteration that fits memory wins. ``G = N`` is pure data parallelism and ``G = 1``
a torchgpipe-style pipeline, so both are among the candidates.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace

from hetpart.errors import InvalidClusterError, StageInfeasibleError
from hetpart.graph import OpGraph
from hetpart.training.antichain_dp import DEFAULT_STATE_LIMIT, AntichainConfig, state_family
from hetpart.training.cluster import Cluster
from hetpart.training.common import GraphCuts, PlannerConfig, build_plan, require_identical_devices
from hetpart.training.cost_model import TrainCosts
from hetpart.training.dp_core import StateDP
from hetpart.training.stage_plan import StagePlan

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GroPipeConfig(PlannerConfig):
    schedule: str = "gpipe"
    groups: int | None = None                # None: search every divisor of the device count
    layouts: tuple[str, ...] = ("contiguous", "strided")
    state_limit: int = DEFAULT_STATE_LIMIT


def group_devices(names: list[str], groups: int, layout: str) -> list[list[str]]:
    """Devices of each group: consecutive blocks, or strided (group g takes every G-th device from g)."""
    per = len(names) // groups
    if layout == "contiguous":
        return [names[g * per:(g + 1) * per] for g in range(groups)]
    if layout == "strided":
        return [names[g::groups][:per] for g in range(groups)]
    raise InvalidClusterError(f"unknown GroPipe layout {layout!r}; use 'contiguous' or 'strided'")


def solve(graph: OpGraph, train_costs: TrainCosts, cluster: Cluster, config: GroPipeConfig | None = None) -> StagePlan:
    started = time.perf_counter()
    config = GroPipeConfig.coerce(config)
    require_identical_devices(cluster, "gropipe")
    train_costs.validate(graph)
    cuts = GraphCuts(graph)
    family, _ = state_family(graph, AntichainConfig(state_limit=config.state_limit))
    n_dev = cluster.size
    divisors = [g for g in range(1, n_dev + 1) if n_dev % g == 0 and g <= config.microbatches]
    if config.groups is not None:
        if config.groups not in divisors:
            raise StageInfeasibleError(f"groups={config.groups} must divide the {n_dev} devices and be at most the "
                                       f"{config.microbatches} micro-batches; possible: {divisors}")
        divisors = [config.groups]
    best: StagePlan | None = None
    tried: list[dict] = []
    for g in divisors:
        p = n_dev // g
        for layout in (config.layouts if 1 < g < n_dev else config.layouts[:1]):
            groups = group_devices(list(cluster.names), g, layout)
            inner = replace(config, microbatches=math.ceil(config.microbatches / g), replication=False,
                            allow_fewer_devices=False, schedule=config.schedule)
            try:
                dp = StateDP(family, cuts, train_costs, cluster, PlannerConfig.coerce(inner),
                             [(cluster.presets[0], groups[0])])
                solution = dp.solve(total_devices=min(p, graph.num_ops))
            except StageInfeasibleError as exc:
                tried.append({"groups": g, "layout": layout, "error": str(exc)[:80]})
                continue
            position = {name: k for k, name in enumerate(groups[0])}
            stage_devices = [tuple(groups[gi][position[devs[0]]] for gi in range(g))
                             for devs in solution.stage_devices]
            plan = build_plan(graph, train_costs, cluster, solution.stage_ops, stage_devices, config, "gropipe",
                              started=started, groups=g, cuts=cuts,
                              stats={"groups": g, "stages_per_group": len(stage_devices), "layout": layout,
                                     "group_bottleneck_us": solution.value_us})
            tried.append({"groups": g, "layout": layout, "iteration_us": plan.iteration_us,
                          "fits_memory": plan.stats["fits_memory"]})
            if plan.stats["fits_memory"] and (best is None or plan.iteration_us < best.iteration_us):
                best = plan
    if best is None:
        raise StageInfeasibleError(f"no GroPipe shape G x P = {n_dev} fits memory with {config.microbatches} "
                                   f"micro-batches: {tried}. Use fewer micro-batches per group or more memory")
    logger.info("gropipe: %d groups x %d stages, iteration %.1f us", best.groups, best.num_stages, best.iteration_us)
    return replace(best, stats={**best.stats, "planner_s": time.perf_counter() - started, "candidates": tried})
