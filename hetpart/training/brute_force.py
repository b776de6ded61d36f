"""Exhaustive stage search for small graphs: every chain of nested ideals, every replica count and device type,
scored with the plan-level objective of :mod:`hetpart.training.common` (not the DP's own arithmetic), so the
DPs can be checked against it exactly.

Devices of a type are taken in cluster order, as the DPs do. The search is exponential: keep graphs under ~8
ops and clusters under ~4 devices.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from hetpart.errors import StageInfeasibleError
from hetpart.graph import OpGraph
from hetpart.training.cluster import Cluster
from hetpart.training.common import (GraphCuts, PlannerConfig, bottleneck_us, memory_capacity, memory_need,
                                     stage_terms)
from hetpart.training.cost_model import TrainCosts


@dataclass(frozen=True)
class BruteForceResult:
    value_us: float
    stage_ops: tuple[tuple[int, ...], ...]
    stage_devices: tuple[tuple[str, ...], ...]
    candidates: int


def all_ideals(graph: OpGraph) -> list[frozenset[int]]:
    n = graph.num_ops
    out = []
    for bits in range(1 << n):
        members = {i for i in range(n) if bits >> i & 1}
        if all(p in members for v in members for p in graph.nodes[v].inputs):
            out.append(frozenset(members))
    return out


def ideal_chains(ideals: Sequence[frozenset[int]], full: frozenset[int]) -> Iterator[list[frozenset[int]]]:
    """Every chain ∅ ⊂ I_1 ⊂ ... ⊂ full, as the list of stages (differences)."""
    def extend(current: frozenset[int]) -> Iterator[list[frozenset[int]]]:
        if current == full:
            yield []
            return
        for nxt in ideals:
            if current < nxt:
                for rest in extend(nxt):
                    yield [nxt - current] + rest
    yield from extend(frozenset())


def solve(graph: OpGraph, costs: TrainCosts, cluster: Cluster, config: PlannerConfig | None = None,
          families: Sequence[frozenset[int]] | None = None) -> BruteForceResult:
    """The best split over all chains of ``families`` (default: every ideal of ``graph``)."""
    config = PlannerConfig.coerce(config)
    cuts = GraphCuts(graph)
    ideals = list(families) if families is not None else all_ideals(graph)
    full = frozenset(range(graph.num_ops))
    types = [(p, [d.name for d in cluster.devices if d.preset == p]) for p in cluster.presets]
    best: BruteForceResult | None = None
    count = 0
    for stages in ideal_chains(ideals, full):
        s = len(stages)
        if s > cluster.size:
            continue
        choices = [(t, r) for t, (_, names) in enumerate(types)
                   for r in range(1, min(len(names), config.microbatches if config.replication else 1) + 1)]
        for assign in itertools.product(choices, repeat=s):
            used = [0] * len(types)
            devices = []
            for t, r in assign:
                names = types[t][1]
                devices.append(tuple(names[used[t]:used[t] + r]))
                used[t] += r
            if any(used[t] > len(types[t][1]) for t in range(len(types))):
                continue
            if not config.allow_fewer_devices and sum(used) != cluster.size:
                continue
            ops = [sorted(st) for st in stages]
            if any(not costs.supported[np.asarray(o), costs.column(d[0])].all() for o, d in zip(ops, devices)):
                continue
            count += 1
            terms = stage_terms(cuts, costs, cluster, ops, devices)
            need = memory_need(terms, devices, config.schedule, config.microbatches)
            if any(v > memory_capacity(cluster, d, config) for d, v in need.items()):
                continue
            value = bottleneck_us(terms, devices, cluster, config.microbatches)
            if best is None or value < best.value_us - 1e-9 * max(1.0, abs(value)):
                best = BruteForceResult(value, tuple(tuple(o) for o in ops), tuple(devices), count)
    if best is None:
        raise StageInfeasibleError(f"no stage split of {graph.name!r} fits the cluster {cluster.spec!r}")
    return BruteForceResult(best.value_us, best.stage_ops, best.stage_devices, count)


__all__ = ["BruteForceResult", "all_ideals", "ideal_chains", "solve"]
