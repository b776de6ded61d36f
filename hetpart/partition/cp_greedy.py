"""``cp_greedy``: critical-path greedy correction, the seed method.

The algorithm follows the seed thesis' CPU/GPU partitioner and DUET (Zhang et al., "DUET: A Compiler-Runtime
Subgraph Scheduling Approach for Tensor Programs on a Coupled CPU-GPU Architecture", IPDPS 2021): cluster
the graph, start each cluster on its fastest device, then repeatedly move what lies on the critical path.

1. **Clusters** (operators that are cheap to keep together): ops of one fused kernel (``kernel_groups``)
   and every linear chain link ``u -> v`` where ``v`` is ``u``'s only consumer and ``u`` is ``v``'s only
   producer (splitting such a link adds a copy and gains no concurrency). Ops are merged only when they may
   run on the same devices (support and pins).
2. **Start**: each cluster on the device with the smallest summed latency, issued in upward-rank order.
   So that the result is never worse than the baselines, the plans of ``all_cpu``, ``all_gpu``, ``greedy``
   and ``heft`` (each with its own issue order) are simulated too, as are the fastest-per-cluster and heft
   assignments issued by earliest-start list scheduling. The local search runs from the best of these seven
   starts, then from the next ones while the budget lasts, and the best result is kept
   (``plan.stats["start"]`` names the start it came from). cp_greedy is therefore <= every baseline *by
   construction* (it evaluates them), not because the correction always beats them on its own.
3. **Greedy correction**: simulate; compute every op's slack on the schedule (``explain.op_slack_us``:
   device order, data and copy constraints). Neighbourhoods, tried in turn until one improves:
   (a) move a cluster holding a zero-slack op, a single zero-slack op, then any other cluster, to another
   allowed device (most compute saved first); (b) re-order: issue an op before an earlier op of its device;
   (c) on small graphs, move two clusters at once; (d) re-derive the issue order from upward ranks or by
   earliest-start list scheduling. Every candidate is scored by the simulator itself (copies, link
   contention, concurrency off the critical path), re-simulated from the first issue position it changes.
   Large graphs take the first improving candidate; graphs up to ``THOROUGH_MAX_OPS`` take the best one of
   the neighbourhood and also try every move with re-derived orders. The critical path is recomputed after
   each step. The search stops at a local optimum or when the simulation budget ``config.max_evaluations``
   (default scaled to the graph size, so 1k ops plan in well under a second) is spent;
   ``plan.stats["stopped"]`` says which.

The returned ``makespan_us`` is exactly the simulator's. Deterministic: no randomness, no wall-clock limits,
ties broken by op/device index.
"""
from __future__ import annotations

import logging
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from hetpart.costs import CostTable
from hetpart.graph import OpGraph
from hetpart.partition.common import PartitionConfig, Problem, finish_plan
from hetpart.partition.explain import critical_ops
from hetpart.partition.greedy import greedy_assignment
from hetpart.partition.heft import heft_schedule
from hetpart.partition.single_device import single_device_assignment
from hetpart.errors import UnknownDeviceError
from hetpart.plan import Plan
from hetpart.simulate import Schedule

logger = logging.getLogger(__name__)

IMPROVEMENT_REL_TOL = 1e-9
THOROUGH_MAX_OPS = 60      # up to this size: best-improvement steps, every op may be re-ordered, and every
                           # move is also tried with its own upward-rank and earliest-start orders
PAIR_MOVES_MAX_OPS = 60    # up to this size, pairs of cluster moves are tried at a single-move local optimum


def default_budget(problem: Problem) -> int:
    """Simulations allowed by default: ~2e6 / (ops + edges), at least 100 and at most 20,000 (a simulation
    costs ~ops + edges, so the search time is roughly constant; 1k ops plan in < 1 s, 10k in a few s)."""
    size = problem.n + sum(len(p) for p in problem.model.preds) + 1
    return int(min(20_000, max(100, 2_000_000 // size)))


def clusters(problem: Problem) -> list[list[int]]:
    """Partition op ids into clusters (fused kernels + linear chains with identical allowed devices)."""
    n = problem.n
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: int, b: int) -> None:
        if problem.allowed_list[a] == problem.allowed_list[b]:
            ra, rb = find(a), find(b)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)

    for group in problem.graph.kernel_groups:
        for a, b in zip(group.op_ids, group.op_ids[1:]):
            union(a, b)
    succ, preds = problem.model.succ, problem.model.preds
    for u in range(n):
        if len(succ[u]) == 1 and len(preds[succ[u][0]]) == 1:
            union(u, succ[u][0])
    members: dict[int, list[int]] = {}
    for v in range(n):
        members.setdefault(find(v), []).append(v)
    return [members[r] for r in sorted(members)]


class _Search:
    """The greedy correction: neighbourhoods of a (assignment, order) pair, scored by the simulator."""

    def __init__(self, problem: Problem, groups: list[list[int]], budget: int) -> None:
        self.problem, self.groups, self.budget = problem, groups, budget
        self.evaluations = 0
        self.thorough = problem.n <= THOROUGH_MAX_OPS
        self.lat = problem.model.lat
        self.group_of = np.empty(problem.n, dtype=np.int64)
        for g, ops in enumerate(groups):
            self.group_of[ops] = g

    def evaluate(self, dev: Sequence[int], order: Sequence[int], base: Schedule | None = None,
                 first: int = 0) -> float:
        self.evaluations += 1
        return self.problem.model.makespan(dev, order, base, first)

    def saving(self, ops: Sequence[int], dev: Sequence[int], target: int) -> float:
        return sum(self.lat[dev[v]][v] - self.lat[target][v] for v in ops)

    def candidates(self, dev: list[int], critical: np.ndarray) -> list[tuple[tuple[int, ...], int]]:
        """(ops, target device) moves: critical clusters, then single critical ops, then other clusters."""
        allowed = self.problem.allowed_list
        crit_groups = sorted({int(g) for g in self.group_of[critical]})
        crit_set = set(crit_groups)
        tiers: list[list[tuple[float, int, tuple[int, ...], int]]] = [[], [], []]
        for g in crit_groups:
            ops = tuple(self.groups[g])
            for b in allowed[ops[0]]:
                if any(dev[v] != b for v in ops):
                    tiers[0].append((-self.saving(ops, dev, b), ops[0], ops, b))
        for v in np.flatnonzero(critical):
            v = int(v)
            if len(self.groups[self.group_of[v]]) > 1:
                for b in allowed[v]:
                    if b != dev[v]:
                        tiers[1].append((-self.saving((v,), dev, b), v, (v,), b))
        for g, ops_list in enumerate(self.groups):
            if g not in crit_set:
                ops = tuple(ops_list)
                for b in allowed[ops[0]]:
                    if any(dev[v] != b for v in ops):
                        tiers[2].append((-self.saving(ops, dev, b), ops[0], ops, b))
        out = []
        for tier in tiers:
            tier.sort(key=lambda t: (t[0], t[1], t[3]))
            out += [(ops, b) for (_, _, ops, b) in tier]
        return out

    def reorder_candidates(self, dev: Sequence[int], order: list[int], critical: np.ndarray) \
            -> Iterator[tuple[list[int], int]]:
        """Orders where an op is issued just before an earlier op of its device: zero-slack ops first, and
        (thorough mode) every op and every earlier position it may legally take."""
        position = [0] * len(order)
        for k, v in enumerate(order):
            position[v] = k
        on_device: dict[int, list[int]] = {}
        earlier: list[list[int]] = [[] for _ in order]
        for v in order:
            seq = on_device.setdefault(dev[v], [])
            earlier[v] = seq[::-1] if self.thorough else seq[-1:]
            seq.append(v)
        ops = [v for v in order if critical[v]]
        if self.thorough:
            ops += [v for v in order if not critical[v]]
        preds = self.problem.model.preds
        for v in ops:
            latest_pred = max([position[u] for u in preds[v]] + [-1])
            for p in earlier[v]:
                if latest_pred >= position[p]:
                    break                 # v cannot overtake an op issued before its own producer
                k, j = position[p], position[v]
                yield order[:k] + [v] + order[k:j] + order[j + 1:], k

    def pair_moves(self, dev: list[int], critical: np.ndarray) -> Iterator[tuple[list[int], list[int]]]:
        """Assignments where a cluster holding a zero-slack op and one other cluster both change device."""
        allowed = self.problem.allowed_list
        crit_groups = sorted({int(g) for g in self.group_of[critical]})
        for g1 in crit_groups:
            ops1 = self.groups[g1]
            for b1 in allowed[ops1[0]]:
                if all(dev[v] == b1 for v in ops1):
                    continue
                for g2, ops2 in enumerate(self.groups):
                    if g2 == g1:
                        continue
                    for b2 in allowed[ops2[0]]:
                        if all(dev[v] == b2 for v in ops2):
                            continue
                        trial = list(dev)
                        for v in ops1:
                            trial[v] = b1
                        for v in ops2:
                            trial[v] = b2
                        yield trial, ops1 + ops2

    def first_affected(self, ops: Sequence[int], position: list[int]) -> int:
        """First issue position whose simulation changes when ``ops`` change device."""
        model = self.problem.model
        if any(model.op_inputs[v] for v in ops):
            return 0
        return min(position[x] for v in ops for x in (v, *model.preds[v]))

    def value(self, dev: list[int], order: list[int], base: Schedule | None = None,
              first: int = 0) -> tuple[float, list[int]]:
        """Makespan of ``dev`` with the current order and, in thorough mode, with its own upward-rank order."""
        best = (self.evaluate(dev, order, base, first), order)
        if self.thorough:
            rank = self.problem.upward_rank(dev)
            for reordered in (self.problem.rank_order(dev, rank), self.problem.earliest_start_order(dev, rank)):
                if reordered != order and self.evaluations < self.budget:
                    value = self.evaluate(dev, reordered)
                    if value < best[0]:
                        best = (value, reordered)
        return best

    def neighbourhoods(self, dev: list[int], order: list[int], critical: np.ndarray, position: list[int]) \
            -> Iterator[tuple[str, Iterator[tuple[list[int], list[int] | None, int]]]]:
        """Candidates (assignment, order or None = keep/re-derive, first changed issue position), by
        neighbourhood, tried one neighbourhood after the other."""
        def moves() -> Iterator[tuple[list[int], None, int]]:
            for ops, b in self.candidates(dev, critical):
                trial = list(dev)
                for v in ops:
                    trial[v] = b
                yield trial, None, self.first_affected(ops, position)
        yield "moves", moves()
        yield "reorders", ((dev, trial_order, k) for trial_order, k in self.reorder_candidates(dev, order, critical))
        if self.problem.n <= PAIR_MOVES_MAX_OPS:
            yield "moves", ((trial, None, self.first_affected(ops, position))
                            for trial, ops in self.pair_moves(dev, critical))
        rank = self.problem.upward_rank(dev)
        yield "reorders", ((dev, o, 0) for o in (self.problem.rank_order(dev, rank),
                                                 self.problem.earliest_start_order(dev, rank)) if o != order)

    def run(self, dev: list[int], order: list[int], makespan: float) -> tuple[list[int], list[int], float, dict]:
        """Descend from (dev, order): first improvement, or best improvement per neighbourhood if thorough."""
        model = self.problem.model
        counts = {"moves": 0, "reorders": 0}
        while True:
            base = model.run(dev, order, record=True)
            critical = critical_ops(model, base)
            position = [0] * len(order)
            for k, v in enumerate(order):
                position[v] = k
            best: tuple[float, list[int], list[int], str] | None = None
            for kind, candidates in self.neighbourhoods(dev, order, critical, position):
                for trial, trial_order, first in candidates:
                    if self.evaluations >= self.budget:
                        break
                    if trial_order is None:
                        value, trial_order = self.value(trial, order, base, first)
                    else:
                        value = self.evaluate(trial, trial_order, base, first)
                    if value < (best[0] if best else makespan * (1 - IMPROVEMENT_REL_TOL)):
                        best = (value, trial, trial_order, kind)
                        if not self.thorough:
                            break
                if best is not None or self.evaluations >= self.budget:
                    break
            if best is None:
                break
            makespan, dev, order, kind = best
            counts[kind] += 1
        stopped = "budget" if self.evaluations >= self.budget else "local optimum"
        return dev, order, makespan, {**counts, "stopped": stopped}


def starting_points(problem: Problem, groups: list[list[int]]) -> list[tuple[str, list[int], list[int]]]:
    """(name, assignment, order) of the fastest-device-per-cluster start and of the baselines."""
    fastest = [0] * problem.n
    for ops in groups:
        options = problem.allowed_list[ops[0]]
        best = min(options, key=lambda d: (sum(problem.lat[v, d] for v in ops), d))
        for v in ops:
            fastest[v] = best
    ids = list(range(problem.n))
    starts = [("fastest_per_cluster", fastest, problem.rank_order(fastest))]
    for kind in ("cpu", "gpu"):
        try:
            target = problem.device_of_kind(kind)
        except UnknownDeviceError:
            continue
        starts.append((f"all_{kind}", single_device_assignment(problem, target), ids))
    starts.append(("greedy", greedy_assignment(problem)[0], ids))
    heft_dev, heft_order, _ = heft_schedule(problem)
    starts.append(("heft", heft_dev, heft_order))
    # the two split assignments again, issued by earliest-start list scheduling instead
    starts.append(("fastest_per_cluster+earliest_start", fastest, problem.earliest_start_order(fastest)))
    starts.append(("heft+earliest_start", heft_dev, problem.earliest_start_order(heft_dev)))
    return starts


def search(problem: Problem) -> tuple[list[int], list[int], float, dict[str, Any]]:
    """Run the whole method on a prepared problem: (assignment, order, makespan, stats)."""
    groups = clusters(problem)
    budget = problem.config.max_evaluations or default_budget(problem)
    searcher = _Search(problem, groups, budget)
    scored = []
    for name, dev, order in starting_points(problem, groups):
        scored.append((searcher.evaluate(dev, order), len(scored), name, dev, order))
    scored.sort(key=lambda s: (s[0], s[1]))
    best = None
    runs = []
    for start_makespan, _, start_name, dev, order in scored:
        if best is not None and searcher.evaluations >= budget:
            break
        if any(dev == r[0] and order == r[1] for r in runs):
            continue                        # the same start twice (e.g. greedy == all_gpu)
        runs.append((dev, order))
        result = searcher.run(list(dev), list(order), start_makespan)
        if best is None or result[2] < best[2] * (1 - IMPROVEMENT_REL_TOL):
            best = (*result, start_name, start_makespan)
    assert best is not None
    dev, order, makespan, info, start_name, start_makespan = best
    if not np.isfinite(start_makespan):
        logger.warning("cp_greedy: every starting point overflows a device's memory")
    stats = {"start": start_name, "start_makespan_us": start_makespan, "clusters": len(groups),
             "evaluations": searcher.evaluations, "budget": budget, "searches": len(runs),
             "start_makespans_us": {name: ms for (ms, _, name, _, _) in scored}, **info}
    return dev, order, makespan, stats


def solve(graph: OpGraph, costs: CostTable, config: PartitionConfig | Mapping[str, Any] | None = None) -> Plan:
    problem = Problem(graph, costs, config, "cp_greedy")
    dev, order, _, stats = search(problem)
    return finish_plan(problem, dev, order, stats=stats)
