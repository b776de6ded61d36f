"""Local search on the task runtime's objective: segments and clusters moved across devices.

``portfolio`` descends on one request's makespan (``hetpart.simulate``) and then chooses, among its starts and
local optima, the plan with the smallest N-request makespan under the task runtime's model
(``hetpart.simulate_requests``: segments, a dispatch overhead per segment, copies made by the consuming worker).
The plans it chooses among were never moved *by* that objective, which charges what the single-request search
does not see: every extra segment costs its overhead, and every tensor crossing devices costs the consumer's time.
:func:`improve_for_requests` is that missing descent. From the chosen plan it tries, scored by the same N-request
simulation (``request_score.score_assignment``):

1. **segment moves**: every op of one segment to another device it may run on (merging it into its neighbours,
   which removes a crossing and a dispatch), smallest predicted compute first;
2. **cluster moves**: one cluster (``cp_greedy.clusters``: a fused kernel, a chain, never two RNN time steps) to
   another device: first those with a producer or consumer there (removing a crossing), then the others (ops
   with no edge between them still share a worker), each in issue order;
3. **pair moves**: two clusters joined by an edge or by a common producer or consumer, both to a device neither
   is on (one alone would add crossings that its move may not repay).

It accepts the first move that lowers the score key (N-request makespan, then p99 latency) by more than
``cp_greedy.IMPROVEMENT_REL_TOL`` and starts again from the new plan, until no move improves or the budget of
simulations (:func:`request_search_budget`) is spent. The issue order is kept (it stays a topological order; the
runtime's workers pick ready segments by it). The result is never worse than the plan it started from, since that
plan is scored first and only strict improvements are taken.

It also makes the two-stage pipeline cuts portfolio adds to its N-request choice (:func:`pipeline_cut_starts`).

Imports nothing outside the core.
"""
from __future__ import annotations

import itertools
from typing import Any, Sequence

import numpy as np

from hetpart.partition.common import Problem
from hetpart.partition.cp_greedy import IMPROVEMENT_REL_TOL
from hetpart.partition.request_score import Score, runtime_model, score_assignment
from hetpart.plan import Plan
from hetpart.segments import segment_plan

__all__ = ["improve_for_requests", "pipeline_cut_starts", "request_search_budget"]

# One N-request simulation costs about (ops + edges) x requests steps, measured at ~3 µs each in CPython (11 ms
# for 150 synthetic ops and 16 requests, 80 ms for 600, 325 ms for 2,000); this many steps keep the search to about
# 4 s. The budget is at least MIN and at most MAX simulations.
REQUEST_SEARCH_WORK = 1_500_000
MIN_REQUEST_EVALUATIONS = 10
MAX_REQUEST_EVALUATIONS = 400


def request_search_budget(problem: Problem) -> int:
    """Simulations the search may run: ``REQUEST_SEARCH_WORK / ((ops + edges) x requests)``, clamped to
    [MIN_REQUEST_EVALUATIONS, MAX_REQUEST_EVALUATIONS]."""
    size = (problem.n + sum(len(p) for p in problem.model.preds) + 1) * max(1, problem.config.requests)
    return int(min(MAX_REQUEST_EVALUATIONS, max(MIN_REQUEST_EVALUATIONS, REQUEST_SEARCH_WORK // size)))


PIPELINE_CUT_SHIFTS = (-0.1, -0.05, 0.0, 0.05, 0.1)     # cuts tried around the balanced one, as shares of the ops


def pipeline_cut_starts(problem: Problem, order: Sequence[int]) -> list[tuple[str, list[int], list[int]]]:
    """Two-stage pipelines as starts for the N-request objective: for each ordered pair of devices (a, b), the
    ops of a prefix of ``order`` on ``a`` and the rest on ``b`` (an op that may not run there goes where
    ``Problem.place_or_fallback`` puts it), cut where the predicted work of the two stages is most even and a few
    ops either side.

    A prefix of a topological order is closed under predecessors, so each cut is two segments with edges one
    way. A chain (an LSTM language model, a ResNet) gains nothing from a split for one request, so the
    single-request search offers only single-device plans there, and moving clusters one by one from those
    rarely reaches a balanced pipeline within the search's budget; these starts give it one directly."""
    order = [int(i) for i in order]
    n, starts = len(order), []
    if n < 2 or problem.n_dev < 2:
        return starts
    for a, b in itertools.permutations(range(problem.n_dev), 2):
        dev_a = [problem.place_or_fallback(i, a) for i in order]
        dev_b = [problem.place_or_fallback(i, b) for i in order]
        work_a = np.concatenate(([0.0], np.cumsum([problem.lat[i, d] for i, d in zip(order, dev_a)])))
        work_b = np.concatenate(([0.0], np.cumsum([problem.lat[i, d] for i, d in zip(order, dev_b)][::-1])))
        balanced = int(np.argmin(np.maximum(work_a, work_b[::-1])))     # cut k: order[:k] on a, order[k:] on b
        cuts = sorted({min(n - 1, max(1, balanced + int(round(shift * n)))) for shift in PIPELINE_CUT_SHIFTS})
        for k in cuts:
            dev = [0] * problem.n
            for pos, i in enumerate(order):
                dev[i] = dev_a[pos] if pos < k else dev_b[pos]
            starts.append((f"pipeline {problem.names[a]}->{problem.names[b]} at {k}/{n}", dev, list(order)))
    return starts


def _better(score: Score, best: Score) -> bool:
    """A lower N-request makespan (by more than the tolerance), or an equal one with a lower p99 latency."""
    (makespan, p99), (best_makespan, best_p99) = score.key(), best.key()
    if makespan < best_makespan * (1 - IMPROVEMENT_REL_TOL):
        return True
    return makespan <= best_makespan and p99 < best_p99 * (1 - IMPROVEMENT_REL_TOL)


def _segment_moves(problem: Problem, dev: Sequence[int], order: Sequence[int]) -> list[tuple[tuple[int, ...], int]]:
    """(ops, device) moving one whole segment of the runtime's cut to another device every op of it may use;
    smallest predicted compute on the target first (cheap segments are the ones whose dispatch and copies cost
    the most relative to their work)."""
    plan = Plan(device_of=tuple(problem.names[d] for d in dev), order=tuple(order), devices=problem.names,
                method="request_search", level=problem.graph.level)
    moves = []
    for segment in segment_plan(problem.graph, plan).segments:
        ops = segment.op_ids
        current = problem.names.index(segment.device)
        for target in range(problem.n_dev):
            if target != current and all(problem.allowed[v, target] for v in ops):
                moves.append((float(sum(problem.lat[v, target] for v in ops)), ops[0], ops, target))
    return [(ops, target) for _, _, ops, target in sorted(moves, key=lambda m: (m[0], m[1], m[3]))]


def _cluster_moves(problem: Problem, dev: Sequence[int], order: Sequence[int],
                   groups: Sequence[Sequence[int]]) -> list[tuple[tuple[int, ...], int]]:
    """(cluster, device) for every cluster and every other device all its ops may use: first the clusters with
    a producer or consumer on that device (boundary moves, which remove a crossing), then the rest (which
    rebalance the workers: ops without any edge between them still share a worker); each in issue order of the
    cluster's first op."""
    position = {v: k for k, v in enumerate(order)}
    preds, succ = problem.model.preds, problem.model.succ
    moves = []
    for ops in groups:
        here = dev[ops[0]]
        neighbours = {dev[u] for v in ops for u in (*preds[v], *succ[v])}
        for target in range(problem.n_dev):
            if target != here and all(problem.allowed[v, target] for v in ops):
                moves.append((target not in neighbours, min(position[v] for v in ops), target, tuple(ops)))
    return [(ops, target) for _, _, target, ops in sorted(moves)]


def _pair_moves(problem: Problem, dev: Sequence[int], order: Sequence[int],
                groups: Sequence[Sequence[int]]) -> list[tuple[tuple[int, ...], int]]:
    """(two clusters, device) moving both to a device where neither is yet and both may run, for clusters joined
    by an edge (a producer and its consumer moved one at a time each add a crossing) or by a common producer or
    consumer (parallel branches: one alone may not repay the crossings its move adds)."""
    position = {v: k for k, v in enumerate(order)}
    group_of = {v: g for g, ops in enumerate(groups) for v in ops}
    preds, succ = problem.model.preds, problem.model.succ
    pairs: set[tuple[int, int]] = set()
    for v in range(problem.n):
        related = {group_of[u] for u in preds[v]} | {group_of[w] for u in succ[v] for w in preds[u]} \
            | {group_of[w] for u in preds[v] for w in succ[u]}
        g = group_of[v]
        pairs.update((min(g, h), max(g, h)) for h in related if h != g)
    moves = []
    for a, b in sorted(pairs):
        ops = (*groups[a], *groups[b])
        for target in range(problem.n_dev):
            if dev[groups[a][0]] != target and dev[groups[b][0]] != target \
                    and all(problem.allowed[v, target] for v in ops):
                moves.append((min(position[v] for v in ops), target, tuple(ops)))
    return [(ops, target) for _, target, ops in sorted(moves)]


def improve_for_requests(problem: Problem, dev: Sequence[int], order: Sequence[int],
                         groups: Sequence[Sequence[int]], method: str,
                         budget: int | None = None) -> tuple[list[int], Score, dict[str, Any]]:
    """Descend from ``(dev, order)`` on the N-request objective (module docstring): the improved assignment, its
    score and stats (``evaluations``, ``moves``, ``segment_moves``, ``start_score``, ``stopped``)."""
    budget = request_search_budget(problem) if budget is None else budget
    runtime = runtime_model(problem.config, problem.names)
    dev = list(dev)
    best = score_assignment(problem, dev, order, method, runtime)
    stats: dict[str, Any] = {"start_score": best.to_dict(), "evaluations": 1, "moves": 0, "segment_moves": 0,
                             "budget": budget, "stopped": "local optimum"}
    tried: set[tuple[int, ...]] = {tuple(dev)}
    improved = True
    while improved:
        improved = False
        for tier, moves in (("segment", lambda: _segment_moves(problem, dev, order)),   # built when reached
                            ("cluster", lambda: _cluster_moves(problem, dev, order, groups)),
                            ("pair", lambda: _pair_moves(problem, dev, order, groups))):
            for ops, target in moves():
                if stats["evaluations"] >= budget:
                    stats["stopped"] = "budget"
                    return dev, best, stats
                candidate = list(dev)
                for v in ops:
                    candidate[v] = target
                key = tuple(candidate)
                if key in tried:
                    continue
                tried.add(key)
                score = score_assignment(problem, candidate, order, method, runtime)
                stats["evaluations"] += 1
                if _better(score, best):
                    dev, best, improved = candidate, score, True
                    stats["moves"] += 1
                    stats["segment_moves"] += tier == "segment"
                    break
            if improved:
                break
    return dev, best, stats
