"""A seeded family of small random two-device DAGs, and the measured cp_greedy/exhaustive ratio on it.

``random_dag(n_ops, dense, seed)``: every pair ``i < j`` is an edge with probability 0.35 (sparse) or 0.65
(dense), carrying 0, 20, 100 or 400 bytes (the ``tiny_problem`` links copy B bytes in 10 + B us); CPU
latencies are uniform in [10, 200] us, GPU speed-ups log-normal (median e^0.3), 10% of the ops have no GPU
kernel; sources read the model input, sinks are model outputs.

``python -m tests.hetpart.partition.dags`` solves every member with n_ops 1..10, both densities and seeds
0..99 (2,000 graphs; those whose exhaustive search exceeds ``EXHAUSTIVE_MAX_SCHEDULES`` are skipped) with
exhaustive, cp_greedy, portfolio and the baselines, and logs the worst ratios (about 20 minutes on 2 cores).
"""
from __future__ import annotations

import logging
import sys
import warnings

import numpy as np

from hetpart.costs import CostTable
from hetpart.errors import DegeneratePlanWarning
from hetpart.graph import OpGraph
from tests.hetpart.conftest import tiny_problem

logger = logging.getLogger(__name__)

EXHAUSTIVE_MAX_SCHEDULES = 20_000
FAMILY_SEEDS = 100
BASELINES = ("all_cpu", "all_gpu", "greedy", "heft")


def random_dag(n_ops: int, dense: bool, seed: int) -> tuple[OpGraph, CostTable]:
    rng = np.random.default_rng([n_ops, int(dense), seed])
    edge_p = 0.65 if dense else 0.35
    edges = [(i, j, int(rng.choice([0, 20, 100, 400]))) for j in range(1, n_ops) for i in range(j)
             if rng.random() < edge_p]
    has_pred = {d for _, d, _ in edges}
    has_succ = {s for s, _, _ in edges}
    cpu_us = rng.uniform(10.0, 200.0, n_ops)
    gpu_us = cpu_us / np.exp(rng.normal(0.3, 0.8, n_ops))
    supported = np.ones((n_ops, 2), dtype=bool)
    supported[:, 1] = rng.random(n_ops) >= 0.1
    latency = [(float(c), float(g) if ok else float("nan")) for c, g, ok in zip(cpu_us, gpu_us, supported[:, 1])]
    return tiny_problem(latency, edges, input_consumers=[v for v in range(n_ops) if v not in has_pred],
                        input_bytes=int(rng.choice([10, 100])), supported=supported,
                        outputs=[(v, int(rng.choice([4, 100]))) for v in range(n_ops) if v not in has_succ])


def measure() -> dict[str, float]:
    """Worst ratio to the exhaustive optimum of every method over the whole family (and, logged, how often
    each method is optimal or more than 5% above the optimum)."""
    from hetpart.partition import get_method
    from hetpart.partition.common import ProblemTooLargeError
    worst: dict[str, float] = {}
    optimal: dict[str, int] = {}
    above_5pct: dict[str, int] = {}
    solved = skipped = 0
    for n_ops in range(1, 11):
        for dense in (False, True):
            for seed in range(FAMILY_SEEDS):
                graph, costs = random_dag(n_ops, dense, seed)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", DegeneratePlanWarning)
                    try:
                        optimum = get_method("exhaustive")(
                            graph, costs, {"exhaustive_max_schedules": EXHAUSTIVE_MAX_SCHEDULES}).makespan_us
                    except ProblemTooLargeError:
                        skipped += 1
                        continue
                    solved += 1
                    for method in ("cp_greedy", "portfolio") + BASELINES:
                        ratio = get_method(method)(graph, costs).makespan_us / optimum
                        optimal[method] = optimal.get(method, 0) + (ratio <= 1 + 1e-9)
                        above_5pct[method] = above_5pct.get(method, 0) + (ratio > 1.05)
                        if ratio > worst.get(method, 0.0):
                            worst[method] = ratio
                            logger.info("%s: %.4f at n_ops=%d dense=%s seed=%d", method, ratio, n_ops, dense, seed)
    logger.info("solved %d graphs exactly, skipped %d (exhaustive too large)", solved, skipped)
    for method in worst:
        logger.info("%s: optimal on %d, more than 5%% above the optimum on %d", method, optimal[method],
                    above_5pct[method])
    return worst


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("hetpart").setLevel(logging.WARNING)
    for name, ratio in measure().items():
        logger.info("worst %s / exhaustive: %.4f", name, ratio)
    sys.exit(0)
