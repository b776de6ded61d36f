"""``cp_greedy``: critical-path greedy correction with perturbation.

The method follows DUET (Zhang et al., "DUET: A Compiler-Runtime Subgraph Scheduling Approach for Tensor
Programs on a Coupled CPU-GPU Architecture", IPDPS 2021): cluster the graph, start each cluster on its
fastest device, then repeatedly move what lies on the critical path. Local optima are left by the kicks of
iterated local search (Lourenço, Martin & Stützle, "Iterated Local Search", Handbook of Metaheuristics, 2003).

1. **Clusters** (operators that are cheap to keep together): ops of one fused kernel (``kernel_groups``)
   and every linear chain link ``u -> v`` where ``v`` is ``u``'s only consumer and ``u`` is ``v``'s only
   producer (splitting such a link adds a copy and gains no concurrency). Ops are merged only when they may
   run on the same devices (support and pins).
2. **Greedy start**: each cluster on the device with the smallest summed latency, issued in upward-rank
   order. This is the only start: no baseline plan is evaluated (the multi-start search over the baselines
   is the ``portfolio`` method, which reuses this correction).
3. **Correction** (a descent): simulate; compute every op's slack on the schedule (``explain.op_slack_us``:
   device order, data and copy constraints). Neighbourhoods, tried in turn until one improves:
   (a) move a cluster holding a zero-slack op, a single zero-slack op, any other cluster, then the first or
   last op alone of a cluster (e.g. the head of a chain that reads a model input), to another allowed device
   (most compute saved first); (b) re-order: issue an op before an earlier op of its device;
   (c) on small graphs, move two clusters at once; (d) re-derive the issue order from upward ranks or by
   earliest-start list scheduling. Every candidate is scored by the simulator itself (copies, link
   contention, concurrency off the critical path), re-simulated from the first issue position it changes.
   Large graphs take the first improving candidate; graphs up to ``THOROUGH_MAX_OPS`` take the best one of
   a stage ((a) and (b), else (c) and (d)) and also try every move with re-derived orders. The critical
   path is recomputed after each step, until no candidate improves (a local optimum).
4. **Perturbation**: at a local optimum, a kick moves 1 to ``MAX_KICK_CLUSTERS`` clusters holding a
   zero-slack op of the best plan (when every such kick was tried: any clusters or single ops) to another
   allowed device, drawn by a generator seeded with ``config.seed``. The kicked plan is issued by
   earliest-start list scheduling and corrected again; the result replaces the best plan only if it is
   better. No assignment is kicked to twice; at most ``config.perturbations`` kicks.

The search stops when the simulation budget ``config.max_evaluations`` (default scaled to the graph size,
so 1k ops plan in about a second) is spent, when every kick was made, or when no new kick is left.
``plan.stats`` counts the device moves and re-orders accepted on the way to the returned plan, the kicks
made and those that improved, and says why the search stopped (``stopped``: "budget", "perturbations done",
"no new perturbation", or "local optimum" when ``config.perturbations`` is 0). The returned ``makespan_us`` is
exactly the simulator's. Deterministic: seeded draws, no wall-clock limits, ties broken by op/device index.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from hetpart.costs import CostTable
from hetpart.graph import OpGraph
from hetpart.partition.common import PartitionConfig, Problem, finish_plan
from hetpart.partition.explain import critical_ops
from hetpart.partition.slices import step_tasks
from hetpart.plan import Plan
from hetpart.simulate import Schedule

logger = logging.getLogger(__name__)

IMPROVEMENT_REL_TOL = 1e-9
THOROUGH_MAX_OPS = 60      # up to this size: best-improvement steps, every op may be re-ordered, and every
                           # move is also tried with its own upward-rank and earliest-start orders
PAIR_MOVES_MAX_OPS = 60    # up to this size, pairs of cluster moves are tried at a single-move local optimum
MAX_KICK_CLUSTERS = 5      # a kick moves 1..this many clusters (or single ops)
KICK_DRAWS = 20            # draws per kick before concluding that no new kick is left


def default_budget(problem: Problem) -> int:
    """Simulations allowed by default: ~2e6 / (ops + edges), at least 100 and at most 20,000 (a simulation
    costs ~ops + edges, so the search time is roughly constant; 1k ops plan in < 1 s, 10k in a few s)."""
    size = problem.n + sum(len(p) for p in problem.model.preds) + 1
    return int(min(20_000, max(100, 2_000_000 // size)))


def clusters(problem: Problem) -> list[list[int]]:
    """Partition op ids into clusters (fused kernels + linear chains with identical allowed devices; a chain
    of an unrolled RNN stays within one time step of one layer)."""
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
    steps = step_tasks(problem.graph)          # a chain never glues two RNN time steps (a time-slice cut)
    for u in range(n):
        if len(succ[u]) == 1 and len(preds[succ[u][0]]) == 1 and steps[u] == steps[succ[u][0]]:
            union(u, succ[u][0])
    members: dict[int, list[int]] = {}
    for v in range(n):
        members.setdefault(find(v), []).append(v)
    return [members[r] for r in sorted(members)]


def fastest_per_cluster(problem: Problem, groups: Sequence[Sequence[int]]) -> list[int]:
    """Each cluster on the allowed device with the smallest summed latency (ties: lower device index)."""
    dev = [0] * problem.n
    for ops in groups:
        best = min(problem.allowed_list[ops[0]], key=lambda d: (sum(problem.lat[v, d] for v in ops), d))
        for v in ops:
            dev[v] = best
    return dev


@dataclass
class Outcome:
    """A plan reached by the search and the accepted steps that led to it from its start."""

    dev: list[int]
    order: list[int]
    makespan_us: float
    moves: int = 0
    reorders: int = 0
    critical: np.ndarray | None = None       # zero-slack mask of this plan, when the search computed it


class Correction:
    """The critical-path greedy correction: neighbourhoods of an (assignment, order) pair, scored by the
    simulator, within a budget of simulations shared by every descent and kick made with this object."""

    def __init__(self, problem: Problem, groups: list[list[int]] | None = None, budget: int | None = None) -> None:
        self.problem = problem
        self.groups = clusters(problem) if groups is None else groups
        self.budget = budget or problem.config.max_evaluations or default_budget(problem)
        self.evaluations = 0
        self.thorough = problem.n <= THOROUGH_MAX_OPS
        self.lat = problem.model.lat
        self.group_of = np.empty(problem.n, dtype=np.int64)
        for g, ops in enumerate(self.groups):
            self.group_of[ops] = g
        n_groups = len(self.groups)
        self.group_size = np.bincount(self.group_of, minlength=n_groups)
        self.group_first = np.array([ops[0] for ops in self.groups], dtype=np.int64)
        self.group_allowed = problem.allowed[self.group_first]                  # same for every op of a group
        self.group_lat_us = np.zeros((n_groups, problem.n_dev))                 # summed latency per device
        np.add.at(self.group_lat_us, self.group_of, np.where(problem.allowed, problem.lat, 0.0))

    @property
    def exhausted(self) -> bool:
        return self.evaluations >= self.budget

    def evaluate(self, dev: Sequence[int], order: Sequence[int], base: Schedule | None = None,
                 first: int = 0) -> float:
        self.evaluations += 1
        return self.problem.model.makespan(dev, order, base, first)

    def critical_groups(self, critical: np.ndarray) -> list[int]:
        return sorted({int(g) for g in self.group_of[critical]})

    def candidates(self, dev: list[int], critical: np.ndarray) -> Iterator[tuple[tuple[int, ...], int]]:
        """(ops, target device) moves: critical clusters, single critical ops, other clusters, then the first
        or last op alone of the other clusters; each tier by compute saved (largest first), built only when
        the previous tiers did not improve."""
        allowed, n, n_groups = self.problem.allowed_list, self.problem.n, len(self.groups)
        dev_arr = np.asarray(dev, dtype=np.int64)
        on_device = np.zeros((n_groups, self.problem.n_dev))
        np.add.at(on_device, (self.group_of, dev_arr), 1)
        current_us = np.bincount(self.group_of, weights=self.problem.lat[np.arange(n), dev_arr], minlength=n_groups)
        saving_us = current_us[:, None] - self.group_lat_us
        movable = self.group_allowed & (on_device < self.group_size[:, None])
        is_critical_group = np.zeros(n_groups, dtype=bool)
        is_critical_group[self.group_of[critical]] = True

        def cluster_moves(selected: np.ndarray) -> Iterator[tuple[tuple[int, ...], int]]:
            gs, bs = np.nonzero(movable & selected[:, None])
            for k in np.lexsort((bs, self.group_first[gs], -saving_us[gs, bs])):
                yield tuple(self.groups[gs[k]]), int(bs[k])

        def op_moves(ops: Iterable[int]) -> Iterator[tuple[tuple[int, ...], int]]:
            moves = [(self.lat[dev[v]][v] - self.lat[b][v], v, b) for v in ops if self.group_size[self.group_of[v]] > 1
                     for b in allowed[v] if b != dev[v]]
            for _, v, b in sorted(moves, key=lambda t: (-t[0], t[1], t[2])):
                yield (v,), b

        yield from cluster_moves(is_critical_group)
        yield from op_moves(int(v) for v in np.flatnonzero(critical))
        yield from cluster_moves(~is_critical_group)
        yield from op_moves(sorted({v for ops in self.groups for v in (ops[0], ops[-1]) if not critical[v]}))

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
        for g1 in self.critical_groups(critical):
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
        """Makespan of ``dev`` with the current order and, in thorough mode, with its own re-derived orders."""
        best = (self.evaluate(dev, order, base, first), order)
        if self.thorough:
            rank = self.problem.upward_rank(dev)
            for reordered in (self.problem.rank_order(dev, rank), self.problem.earliest_start_order(dev, rank)):
                if reordered != order and not self.exhausted:
                    value = self.evaluate(dev, reordered)
                    if value < best[0]:
                        best = (value, reordered)
        return best

    def neighbourhoods(self, dev: list[int], order: list[int], critical: np.ndarray, position: list[int]) \
            -> Iterator[tuple[str, Iterator[tuple[list[int], list[int] | None, int]], bool]]:
        """Candidates (assignment, order or None = keep/re-derive, first changed issue position), by
        neighbourhood, tried one neighbourhood after the other, in two stages (the flag closes a stage):
        single moves and re-orders, then pair moves and re-derived orders."""
        def moves() -> Iterator[tuple[list[int], None, int]]:
            for ops, b in self.candidates(dev, critical):
                trial = list(dev)
                for v in ops:
                    trial[v] = b
                yield trial, None, self.first_affected(ops, position)
        yield "moves", moves(), False
        yield "reorders", ((dev, trial_order, k) for trial_order, k in
                           self.reorder_candidates(dev, order, critical)), True
        if self.problem.n <= PAIR_MOVES_MAX_OPS:
            yield "moves", ((trial, None, self.first_affected(ops, position))
                            for trial, ops in self.pair_moves(dev, critical)), False
        rank = self.problem.upward_rank(dev)
        yield "reorders", ((dev, o, 0) for o in (self.problem.rank_order(dev, rank),
                                                 self.problem.earliest_start_order(dev, rank)) if o != order), True

    def descend(self, start: Outcome) -> Outcome:
        """Correct ``start`` until a local optimum or the budget: first improvement, or (thorough) the best
        improvement of a stage of neighbourhoods. The outcome adds its accepted steps to ``start``'s counts."""
        model = self.problem.model
        dev, order, makespan = list(start.dev), list(start.order), start.makespan_us
        counts = {"moves": start.moves, "reorders": start.reorders}
        critical = None
        while not self.exhausted:
            self.evaluations += 1                 # the recorded run that candidates resume from
            base = model.run(dev, order, record=True)
            critical = critical_ops(model, base)
            position = [0] * len(order)
            for k, v in enumerate(order):
                position[v] = k
            best: tuple[float, list[int], list[int], str] | None = None
            for kind, candidates, closes_stage in self.neighbourhoods(dev, order, critical, position):
                for trial, trial_order, first in candidates:
                    if self.exhausted:
                        break
                    if trial_order is None:
                        value, trial_order = self.value(trial, order, base, first)
                    else:
                        value = self.evaluate(trial, trial_order, base, first)
                    if value < (best[0] if best else makespan * (1 - IMPROVEMENT_REL_TOL)):
                        best = (value, trial, trial_order, kind)
                        if not self.thorough:
                            break
                if self.exhausted or (best is not None and (closes_stage or not self.thorough)):
                    break
            if best is None:
                break
            makespan, dev, order, kind = best
            counts[kind] += 1
            critical = None
        return Outcome(dev, order, makespan, counts["moves"], counts["reorders"], critical)

    def kick(self, best: Outcome, rng: np.random.Generator, tried: set) -> Outcome | None:
        """Move 1..MAX_KICK_CLUSTERS random clusters holding a zero-slack op of ``best`` (once no new such kick
        is drawn: random clusters or single ops of any kind) to another allowed device, issued by earliest-start
        list scheduling. Assignments in ``tried`` are not kicked to again; None when no new kick is found."""
        problem, allowed = self.problem, self.problem.allowed_list
        if best.critical is None:
            self.evaluations += 1
            best.critical = critical_ops(problem.model, problem.model.run(best.dev, best.order))
        critical = [tuple(self.groups[g]) for g in self.critical_groups(best.critical)]
        anywhere = [tuple(ops) for ops in self.groups] + [(v,) for ops in self.groups if len(ops) > 1 for v in ops]
        for pool in (critical, anywhere):
            movable = [ops for ops in pool if len(allowed[ops[0]]) > 1]
            kicked = self._kick_from(movable, best, rng, tried) if movable else None
            if kicked is not None:
                return kicked
        return None

    def _kick_from(self, units: list[tuple[int, ...]], best: Outcome, rng: np.random.Generator,
                   tried: set) -> Outcome | None:
        allowed = self.problem.allowed_list
        for _ in range(KICK_DRAWS):
            k = int(rng.integers(1, min(MAX_KICK_CLUSTERS, len(units)) + 1))
            dev = list(best.dev)
            for u in sorted(int(u) for u in rng.choice(len(units), size=k, replace=False)):
                ops = units[u]
                options = [d for d in allowed[ops[0]] if any(best.dev[v] != d for v in ops)]
                target = int(options[int(rng.integers(len(options)))])
                for v in ops:
                    dev[v] = target
            if tuple(dev) not in tried:
                return self._kicked(dev, best, tried)
        return None

    def _kicked(self, dev: list[int], best: Outcome, tried: set) -> Outcome:
        tried.add(tuple(dev))
        order = self.problem.earliest_start_order(dev)
        return Outcome(dev, order, self.evaluate(dev, order), best.moves, best.reorders)


def iterate(correction: Correction, best: Outcome, kicks: int, seed: int) -> tuple[Outcome, dict[str, Any]]:
    """Kick the local optimum ``best`` up to ``kicks`` times, correcting after each kick and keeping the best
    plan (iterated local search with "better" acceptance)."""
    rng = np.random.default_rng(seed)
    tried: set = {tuple(best.dev)}      # a kick's plan depends on its assignment only: never kick to one twice
    made = improved = 0
    stopped = "perturbations done" if kicks > 0 else "local optimum"
    while made < kicks:
        if correction.evaluations + 2 > correction.budget:      # a kick simulates up to twice
            stopped = "budget"
            break
        kicked = correction.kick(best, rng, tried)
        if kicked is None:
            stopped = "no new perturbation"
            break
        made += 1
        result = correction.descend(kicked)
        if result.makespan_us < best.makespan_us * (1 - IMPROVEMENT_REL_TOL):
            best, improved = result, improved + 1
    if correction.exhausted:
        stopped = "budget"
    return best, {"perturbations": made, "perturbations_improved": improved, "stopped": stopped}


def search(problem: Problem) -> tuple[list[int], list[int], float, dict[str, Any]]:
    """Run the whole method on a prepared problem: (assignment, order, makespan, stats)."""
    correction = Correction(problem)
    dev = fastest_per_cluster(problem, correction.groups)
    order = problem.rank_order(dev)
    start = Outcome(dev, order, correction.evaluate(dev, order))
    if not np.isfinite(start.makespan_us):
        logger.info("cp_greedy: the greedy start overflows a device's memory")
    local = correction.descend(start)
    best, info = iterate(correction, local, problem.config.perturbations, problem.config.seed)
    stats = {"start_makespan_us": start.makespan_us, "first_local_optimum_us": local.makespan_us,
             "clusters": len(correction.groups), "moves": best.moves, "reorders": best.reorders, **info,
             "evaluations": correction.evaluations, "budget": correction.budget}
    return best.dev, best.order, best.makespan_us, stats


def solve(graph: OpGraph, costs: CostTable, config: PartitionConfig | Mapping[str, Any] | None = None) -> Plan:
    problem = Problem(graph, costs, config, "cp_greedy")
    dev, order, _, stats = search(problem)
    return finish_plan(problem, dev, order, stats=stats)
