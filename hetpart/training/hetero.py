"""Stage partitioning over devices of unequal speed and memory, the device assignment part of the search.

After Wang et al., "An automatic model splitting strategy generation method for model parallel training",
Computer Engineering & Science 42(9), 2020: contiguous stages (differences of nested ideals, so branchy graphs
are handled) are mapped to devices so that the slowest stage, including the sends across cuts, is as fast as
possible and every stage fits its device's memory.

Rather than running one DP per device order, the DP of :mod:`hetpart.training.dp_core` tracks how many devices
of each type (preset) the stages so far use: ``B[J][c] = min over I ⊂ J, type t, replicas r of
max(B[I][c - r e_t], T_t(J \\ I) / r + ..., send(cut(I)) / r)``. That covers every order of the device types at
once, exactly, in O(N^2 x prod(n_t + 1) x W). Speed differences enter only through each preset's cost column,
so layer types one device runs relatively faster are placed there. With ``allow_fewer_devices`` a slow device
may stay idle; replication is limited to devices of one preset.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from hetpart.graph import OpGraph
from hetpart.training.antichain_dp import DEFAULT_STATE_LIMIT, AntichainConfig, state_family
from hetpart.training.cluster import Cluster
from hetpart.training.common import GraphCuts, PlannerConfig, topological_prefix_masks
from hetpart.training.cost_model import TrainCosts
from hetpart.training.dp_core import choose_plan, device_types, solve_family
from hetpart.training.stage_plan import StagePlan

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeteroConfig(PlannerConfig):
    states: str = "ideals"                   # "ideals" (branchy graphs) or "chain" (topological prefixes)
    state_limit: int = DEFAULT_STATE_LIMIT


def solve(graph: OpGraph, train_costs: TrainCosts, cluster: Cluster, config: HeteroConfig | None = None) -> StagePlan:
    started = time.perf_counter()
    config = HeteroConfig.coerce(config)
    train_costs.validate(graph)
    cuts = GraphCuts(graph)
    if config.states == "chain":
        family, info = topological_prefix_masks(graph.num_ops), {"block": 1}
    else:
        family, info = state_family(graph, AntichainConfig.coerce(config))
    solutions, n_states = solve_family(family, cuts, train_costs, cluster, config, device_types(cluster))
    return choose_plan(graph, train_costs, cluster, config, solutions, "hetero", started=started, cuts=cuts,
                       stats={"states": n_states, **info})
