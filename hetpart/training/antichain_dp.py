"""Exact stage partitioning over the ideals (down-sets) of a branchy DAG, after the antichain-DAG method.

The antichain DAG of PipeDream's planner and of Ju et al. ("Task segmentation and parallel optimization of DNN
model", J. Beijing Univ. Aeronautics and Astronautics 50(9), 2024) has one node per ideal of the operator graph
(an ideal is the closure of exactly one antichain). Here every ideal is enumerated directly, by growing ideals
one op at a time, and the DP of :mod:`hetpart.training.dp_core` runs over them: stages are differences of nested
ideals, so branches may be cut anywhere and every tensor crossing a cut is charged, skip connections included.

To keep the states few, ops that read nothing but weights (no producer, no model input) and feed one consumer
are folded into that consumer first. If the ideals still exceed ``state_limit``, the planner falls back to
coarser units, consecutive blocks of the topological order with the block size doubled until the ideals fit,
and logs a warning; ``fallback=False`` raises :class:`StateLimitError` instead. The topological prefixes are
always states too, so the result is never worse than pipedream_dp's chain.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from hetpart.errors import StateLimitError
from hetpart.graph import OpGraph
from hetpart.training.cluster import Cluster
from hetpart.training.common import (GraphCuts, PlannerConfig, require_identical_devices,
                                     topological_prefix_masks)
from hetpart.training.cost_model import TrainCosts
from hetpart.training.dp_core import choose_plan, solve_family
from hetpart.training.stage_plan import StagePlan

logger = logging.getLogger(__name__)

DEFAULT_STATE_LIMIT = 20_000


@dataclass(frozen=True)
class AntichainConfig(PlannerConfig):
    state_limit: int = DEFAULT_STATE_LIMIT   # most ideals enumerated before coarser units are used
    fallback: bool = True                     # above the limit: coarser units (True) or StateLimitError (False)
    fold_parameter_ops: bool = True


def fold_units(graph: OpGraph, fold: bool = True) -> list[int]:
    """Unit id per op: a weight-only op (no producer, no model input, one consumer) joins its consumer's unit.
    Units are numbered in topological order of their last op."""
    succ = graph.successors()
    owner = list(range(graph.num_ops))
    if fold:
        for v in range(graph.num_ops - 1, -1, -1):
            node = graph.nodes[v]
            if not node.inputs and not node.graph_inputs and len(succ[v]) == 1:
                owner[v] = owner[succ[v][0]]
    reps = sorted(set(owner))
    number = {r: k for k, r in enumerate(reps)}
    return [number[o] for o in owner]


def block_units(unit_of: list[int], block: int) -> list[int]:
    """Coarser units: consecutive blocks of ``block`` units in topological order."""
    return [u // block for u in unit_of]


def enumerate_ideals(graph: OpGraph, unit_of: list[int], limit: int) -> np.ndarray:
    """Every ideal of the unit graph as a boolean op mask [N, n_ops]; StateLimitError beyond ``limit``."""
    n_units = max(unit_of) + 1 if unit_of else 0
    preds = [0] * n_units
    succ: list[set[int]] = [set() for _ in range(n_units)]
    for node in graph.nodes:
        u = unit_of[node.id]
        for p in node.inputs:
            if unit_of[p] != u:
                preds[u] |= 1 << unit_of[p]
                succ[unit_of[p]].add(u)
    avail0 = sum(1 << u for u in range(n_units) if preds[u] == 0)
    seen = {0: avail0}
    frontier = [0]
    while frontier:
        grown: dict[int, int] = {}
        for ideal in frontier:
            avail = seen[ideal]
            bits = avail
            while bits:
                low = bits & -bits
                bits ^= low
                nxt = ideal | low
                if nxt in grown:
                    continue
                a = avail & ~low
                for w in succ[low.bit_length() - 1]:
                    if preds[w] & ~nxt == 0:
                        a |= 1 << w
                grown[nxt] = a
        seen.update(grown)
        frontier = list(grown)
        if len(seen) > limit:
            raise StateLimitError(
                f"graph {graph.name!r} has more than {limit} ideals over {n_units} units (state_limit); raise "
                "state_limit, or allow the fallback to coarser units (fallback=True)")
    unit_masks = np.array([[(ideal >> u) & 1 for u in range(n_units)] for ideal in seen], dtype=bool)
    return unit_masks[:, np.asarray(unit_of, dtype=np.int64)] if n_units else unit_masks


def state_family(graph: OpGraph, config: AntichainConfig) -> tuple[np.ndarray, dict]:
    """The states the DP runs over, and how they were obtained."""
    units = fold_units(graph, config.fold_parameter_ops)
    info = {"units": max(units) + 1 if units else 0, "block": 1}
    try:
        ideals = enumerate_ideals(graph, units, config.state_limit)
    except StateLimitError:
        if not config.fallback:
            raise
        block = 2
        while True:
            coarse = block_units(units, block)
            try:
                ideals = enumerate_ideals(graph, coarse, config.state_limit)
                break
            except StateLimitError:
                block *= 2
        logger.warning("antichain_dp: %s has more than %d ideals at op granularity; using blocks of %d "
                       "consecutive units (%d units, %d ideals) plus the topological prefixes",
                       graph.name, config.state_limit, block, max(coarse) + 1, len(ideals))
        info = {"units": max(coarse) + 1, "block": block}
    family = np.unique(np.vstack([ideals, topological_prefix_masks(graph.num_ops)]), axis=0)
    info["ideals"] = int(len(ideals))
    return family, info


def solve(graph: OpGraph, train_costs: TrainCosts, cluster: Cluster,
          config: AntichainConfig | None = None) -> StagePlan:
    started = time.perf_counter()
    config = AntichainConfig.coerce(config)
    require_identical_devices(cluster, "antichain_dp")
    train_costs.validate(graph)
    cuts = GraphCuts(graph)
    family, info = state_family(graph, config)
    solutions, n_states = solve_family(family, cuts, train_costs, cluster, config)
    notes = [f"coarse units: blocks of {info['block']}"] if info["block"] > 1 else []
    return choose_plan(graph, train_costs, cluster, config, solutions, "antichain_dp", started=started, cuts=cuts,
                       notes=notes, stats={"states": n_states, **info})
