"""Baseline stage splits, scored with the same costs, objective and simulator as the DPs.

* ``uniform_ops``: contiguous runs of the topological order with equal op counts, one device each.
* ``uniform_params``: DeepSpeed's ``PipelineModule(partition_method="parameters")``: contiguous runs whose
  largest parameter count is as small as possible (ties: the most even op counts).
* ``balance_time``: torchgpipe's ``balance_by_time``: contiguous runs whose largest forward + backward time on
  the first device is as small as possible; communication is not considered.
* ``data_parallel``: one stage with every op, replicated on every device, gradients all-reduced in DDP's 25 MiB
  buckets as the backward produces them.

The pipelined baselines put stage ``k`` on device ``k`` in cluster order and use as many stages as devices
(fewer only when the model has fewer ops).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from hetpart.graph import OpGraph
from hetpart.training.cluster import Cluster
from hetpart.training.common import PlannerConfig, build_plan
from hetpart.training.cost_model import TrainCosts
from hetpart.training.stage_plan import StagePlan

DDP_BUCKET_BYTES = 25 * 1024 * 1024     # torch DistributedDataParallel's default bucket_cap_mb=25


@dataclass(frozen=True)
class BaselineConfig(PlannerConfig):
    stages: int | None = None            # pipelined baselines: number of stages (None: one per device)


@dataclass(frozen=True)
class DataParallelConfig(PlannerConfig):
    bucket_bytes: int | None = DDP_BUCKET_BYTES


def linear_partition(weights: Sequence[float], parts: int, tie: Sequence[float] | None = None) -> list[int]:
    """Cut points 0 = b_0 < b_1 < ... < b_parts = n of contiguous non-empty runs minimising the largest run
    weight; among optima, the largest ``tie`` sum (default: op count) is minimised. Exact, O(parts x n^2)."""
    w = np.concatenate([[0.0], np.cumsum(np.asarray(weights, dtype=float))])
    t = np.concatenate([[0.0], np.cumsum(np.ones(len(weights)) if tie is None else np.asarray(tie, dtype=float))])
    n = len(weights)
    parts = max(1, min(parts, n))
    best = np.full((parts + 1, n + 1, 2), np.inf)
    arg = np.zeros((parts + 1, n + 1), dtype=np.int64)
    best[0, 0] = (0.0, 0.0)
    for k in range(1, parts + 1):
        for j in range(k, n + 1):
            i = np.arange(k - 1, j)
            c0 = np.maximum(best[k - 1, i, 0], w[j] - w[i])
            c1 = np.maximum(best[k - 1, i, 1], t[j] - t[i])
            lowest = c0.min()
            c1 = np.where(c0 <= lowest + 1e-9 * max(1.0, abs(lowest)), c1, np.inf)
            pick = int(np.argmin(c1))
            best[k, j] = (c0[pick], c1[pick])
            arg[k, j] = i[pick]
    cuts = [n]
    for k in range(parts, 0, -1):
        cuts.append(int(arg[k, cuts[-1]]))
    return cuts[::-1]


def _chain_plan(graph: OpGraph, costs: TrainCosts, cluster: Cluster, config: BaselineConfig, bounds: list[int],
                method: str, started: float) -> StagePlan:
    stage_ops = [tuple(range(a, b)) for a, b in zip(bounds, bounds[1:])]
    stage_devices = [(cluster.names[k],) for k in range(len(stage_ops))]
    return build_plan(graph, costs, cluster, stage_ops, stage_devices, config, method, started=started,
                      stats={"bounds": bounds})


def _parts(graph: OpGraph, cluster: Cluster, config: BaselineConfig) -> int:
    return max(1, min(config.stages or cluster.size, cluster.size, graph.num_ops))


def solve_uniform_ops(graph: OpGraph, train_costs: TrainCosts, cluster: Cluster,
                      config: BaselineConfig | None = None) -> StagePlan:
    started = time.perf_counter()
    config = BaselineConfig.coerce(config)
    parts, n = _parts(graph, cluster, config), graph.num_ops
    bounds = [round(k * n / parts) for k in range(parts + 1)]
    return _chain_plan(graph, train_costs, cluster, config, bounds, "uniform_ops", started)


def solve_uniform_params(graph: OpGraph, train_costs: TrainCosts, cluster: Cluster,
                         config: BaselineConfig | None = None) -> StagePlan:
    started = time.perf_counter()
    config = BaselineConfig.coerce(config)
    bounds = linear_partition(train_costs.param_bytes, _parts(graph, cluster, config))
    return _chain_plan(graph, train_costs, cluster, config, bounds, "uniform_params", started)


def solve_balance_time(graph: OpGraph, train_costs: TrainCosts, cluster: Cluster,
                       config: BaselineConfig | None = None) -> StagePlan:
    started = time.perf_counter()
    config = BaselineConfig.coerce(config)
    col = train_costs.column(cluster.names[0])
    train_costs.ops_time_us(range(graph.num_ops), cluster.names[0])       # raises on a missing cost
    times = train_costs.forward_us[:, col] + train_costs.backward_us[:, col]
    bounds = linear_partition(times, _parts(graph, cluster, config))
    return _chain_plan(graph, train_costs, cluster, config, bounds, "balance_time", started)


def solve_data_parallel(graph: OpGraph, train_costs: TrainCosts, cluster: Cluster,
                        config: DataParallelConfig | None = None) -> StagePlan:
    started = time.perf_counter()
    config = DataParallelConfig.coerce(config)
    replicas = cluster.names[:max(1, min(cluster.size, config.microbatches))]
    return build_plan(graph, train_costs, cluster, [tuple(range(graph.num_ops))], [replicas], config,
                      "data_parallel", started=started)
