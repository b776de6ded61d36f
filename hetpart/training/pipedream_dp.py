"""PipeDream's stage partitioner on a chain: contiguous stages of a topological order, with stage replication.

The states are the ``n + 1`` prefixes of the op ids (a topological order), so a stage is a run of consecutive
ops; every tensor crossing a cut is charged (skip connections included). The recurrence is PipeDream's
(Narayanan et al., "PipeDream: Generalized Pipeline Parallelism for DNN Training", SOSP 2019) on identical
devices: ``A[j][m] = min over i < j, r < m of max(A[i][m - r], stage(i..j, r), comm(i, r))`` with the stage's
gradient all-reduce across its ``r`` replicas and the 1F1B in-flight memory check, solved exactly per total
device count (see :mod:`hetpart.training.dp_core`).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from hetpart.graph import OpGraph
from hetpart.training.cluster import Cluster
from hetpart.training.common import GraphCuts, PlannerConfig, require_identical_devices, topological_prefix_masks
from hetpart.training.cost_model import TrainCosts
from hetpart.training.dp_core import choose_plan, solve_family
from hetpart.training.stage_plan import StagePlan

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PipeDreamConfig(PlannerConfig):
    """PipeDream's options are the shared ones (``replication=False`` is its ``straight_pipeline``,
    ``allow_fewer_devices`` its ``use_fewer_machines``)."""


def solve(graph: OpGraph, train_costs: TrainCosts, cluster: Cluster,
          config: PipeDreamConfig | None = None) -> StagePlan:
    started = time.perf_counter()
    config = PipeDreamConfig.coerce(config)
    require_identical_devices(cluster, "pipedream_dp")
    train_costs.validate(graph)
    cuts = GraphCuts(graph)
    solutions, n_states = solve_family(topological_prefix_masks(graph.num_ops), cuts, train_costs, cluster, config)
    return choose_plan(graph, train_costs, cluster, config, solutions, "pipedream_dp", started=started, cuts=cuts,
                       stats={"states": n_states})
