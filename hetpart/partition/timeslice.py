"""``timeslice``: time-slice pipeline scheduling of an unrolled RNN across two devices, many requests in flight.

After the CPU-GPU thesis (Shang Shaofa, "Research on Adaptive Division Method of Deep Learning Model for CPU-GPU
Platform", master's thesis, Xi'an University of Science and Technology, 2023): the RNN is cut into time slices,
partitioned "into subgraphs with comparable performance" and run as a pipeline of tasks over many requests. The
details the thesis abstract leaves open follow docs/rnn_pipeline.md:

1. **Slices.** :func:`hetpart.partition.slices.build_slice_grid` with ``config.slice_steps`` steps per slice.
2. **Candidates.** Every cut of the grid that is a down-set (layer splits, time splits, wavefronts) times which
   of the two devices runs it (the *first* device; the *second* runs the rest, so data flows one way). Ops a
   device cannot run, or pinned elsewhere, go to an allowed device. The issue order is the grid's task order,
   earliest (slice, layer) first, ops by id; the task runtime's workers take the ready segment with the lowest
   (request, segment), so every device runs its work in (request, slice, layer) order. A grid with more than
   ``MAX_CUTS`` cuts is enumerated at a coarser stride, refined below.
3. **The published criterion** ("comparable performance"): the cut minimising |T_first - T_second|, the summed
   latencies of the two sides. It is kept as a candidate and reported.
4. **The choice**: a two-stage pipeline estimate of the N-request makespan (``a + c + b + (N - 1) * max(a, b,
   links)``) ranks every candidate; the best ``SHORTLIST`` per device order, the ``BALANCED`` most balanced ones
   and both whole-grid cuts (every cut, up to ``EXACT_CUTS`` per order) are simulated exactly with
   ``hetpart.simulate_requests`` (N = ``config.requests`` requests in flight, the plan's segments as the task
   runtime cuts them), then one-slice moves from the best cut are simulated while they improve (at most
   ``REFINE_EVALUATIONS``). The plans of every single device and of ``cp_greedy`` are simulated the same way and
   compete, so the result is never worse than any of them. With cross-device sharing
   (``config.cross_device_sharing``) the candidates within ``ROBUST_TOL`` of the best are compared again with only
   as many requests in flight as devices, and the best of them there is chosen (:func:`_robust_choice`).
5. **Segments.** The task runtime cuts a plan with ``segment_plan``: data flowing one way, a cut becomes one
   segment per device and request, so requests pipeline across the devices but one request's second part waits
   for all of its first. With ``config.timeslice_segments = "slices"`` every cut is also simulated with one
   segment per task (:func:`slice_segmentation`), so the second device starts a request's first slice while the
   first device runs the next one (a wavefront within one request), and the better of the two counts;
   ``plan.stats["segments"]`` says which segmentation the plan needs.

``plan.stats`` records the grid, how many cuts were enumerated and simulated, the chosen candidate and the
published criterion's candidate with their N-request makespan, period and latency percentiles, the baselines, and
``candidates``: every distinct candidate simulated, with one request's kernel time on each side of a cut and why it
was considered (:func:`candidate_table`; the compile report's "Which cut and why" is drawn from it).
The plan describes one request (the runtime replicates it per request); ``plan.makespan_us`` is, as for every
method, the one-request simulated makespan. Imports nothing outside the core.
"""
from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

import numpy as np

from hetpart.costs import CostTable
from hetpart.errors import UsageError
from hetpart.graph import OpGraph
from hetpart.partition import cp_greedy
from hetpart.partition.common import PartitionConfig, Problem, finish_plan
from hetpart.partition.request_score import Score, runtime_model, score_assignment
from hetpart.partition.single_device import single_device_assignment
from hetpart.partition.slices import SliceGrid, build_slice_grid
from hetpart.plan import Plan
from hetpart.segments import Segmentation, describe_segments

logger = logging.getLogger(__name__)

MAX_CUTS = 20_000           # cuts enumerated per device order before the stride is coarsened
SHORTLIST = 6               # best pipeline estimates per device order simulated exactly
BALANCED = 2                # most balanced cuts per device order simulated exactly
REFINE_EVALUATIONS = 40     # exact simulations spent on one-slice moves from the best cut
EXACT_CUTS = 64             # up to this many cuts per device order, every cut is simulated exactly
REL_TOL = 1e-9
ROBUST_TOL = 0.02           # cross-device sharing: N-request makespan given up for a plan that holds with few requests


def slice_segmentation(graph: OpGraph, plan: Plan, grid: SliceGrid) -> Segmentation:
    """One segment per task of ``grid`` (per run of one device's ops, in plan order, where a task's ops are on two
    devices), numbered in the grid's (slice, layer) order: the time-slice method's schedule, every task a unit."""
    position = {op: k for k, op in enumerate(plan.order)}
    groups: list[list[int]] = []
    devices: list[str] = []
    for task in grid.tasks:
        last = None
        for op in sorted(task.op_ids, key=position.__getitem__):
            if plan.device_of[op] != last:
                groups.append([])
                devices.append(plan.device_of[op])
                last = plan.device_of[op]
            groups[-1].append(op)
    return describe_segments(graph, groups, devices)


class _Candidates:
    """Cut assignments of one grid, their screening figures, and exact N-request scores (cached)."""

    def __init__(self, problem: Problem, grid: SliceGrid) -> None:
        self.problem, self.grid = problem, grid
        self.n_requests = problem.config.requests
        self.runtime = runtime_model(problem.config, problem.names)
        self.per_task = problem.config.timeslice_segments == "slices"
        self.order = tuple(op for task in grid.tasks for op in task.op_ids)
        model, n_dev = problem.model, problem.n_dev
        n_tasks = len(grid.tasks)
        self.slice_of = np.array([t.slice for t in grid.tasks])
        self.pos_of = np.array([grid.position(t.layer) for t in grid.tasks])
        self.placed = [[problem.place_or_fallback(v, d) for v in range(problem.n)] for d in range(n_dev)]
        self.task_cost = np.zeros((n_dev, n_tasks))
        for d in range(n_dev):
            for v in range(problem.n):
                self.task_cost[d, grid.task_of[v]] += problem.lat[v, self.placed[d][v]]
        tdur = np.zeros((n_dev, n_dev, problem.n))
        for a in range(n_dev):
            for b in range(n_dev):
                if a != b:
                    tdur[a, b] = model.tdur[a][b]
        crossing: dict[tuple[int, tuple[int, ...]], np.ndarray] = {}   # (task, reader tasks) -> copy us per link
        for u in range(problem.n):
            readers = tuple(sorted({grid.task_of[w] for w in model.succ[u]} - {grid.task_of[u]}))
            if readers:
                key = (grid.task_of[u], readers)
                crossing[key] = crossing.get(key, 0.0) + tdur[:, :, u]
        self.crossing = crossing
        self.outputs = [(grid.task_of[u], u) for u in range(problem.n) if model.is_output[u]]
        self.inputs = [(sorted({grid.task_of[c] for c in consumers}), k)
                       for k, consumers in enumerate(model.input_consumers)]
        self.scores: dict[tuple[tuple[int, ...], tuple[int, ...], bool], Score] = {}

    # ------------------------------------------------------------------ screening
    def _inside(self, cuts: np.ndarray) -> np.ndarray:
        """[cuts, tasks]: True where the task belongs to the cut (runs on the first device)."""
        return self.slice_of[None, :] < cuts[:, self.pos_of]

    def sides_us(self, cuts: np.ndarray, first: int, inside: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Per cut, one request's summed kernel latencies on the first device (the cut) and on the second (the
        rest), copies and runtime overhead excluded."""
        inside = self._inside(cuts) if inside is None else inside
        return inside @ self.task_cost[first], self.task_cost[1 - first].sum() - inside @ self.task_cost[1 - first]

    def screen(self, cuts: np.ndarray, first: int) -> tuple[np.ndarray, np.ndarray]:
        """(pipeline estimate of the N-request makespan, published imbalance |T_first - T_second|) per cut."""
        a, b, host, model = first, 1 - first, self.problem.host, self.problem.model
        inside = self._inside(cuts)
        t_a, t_b = self.sides_us(cuts, first, inside)
        link = {(a, b): np.zeros(len(cuts)), (b, a): np.zeros(len(cuts))}
        outputs_back = {a: np.zeros(len(cuts)), b: np.zeros(len(cuts))}     # copies of outputs made off the host
        for (task, readers), tdur in self.crossing.items():
            leaves = inside[:, task] & ~inside[:, list(readers)].all(axis=1)
            link[(a, b)] += leaves * tdur[a, b]
        for task, u in self.outputs:
            on_a = inside[:, task]
            if a != host:
                outputs_back[a] += on_a * model.tdur[a][host][u]
            if b != host:
                outputs_back[b] += ~on_a * model.tdur[b][host][u]
        for tasks, k in self.inputs:
            if tasks:
                some_a = inside[:, tasks].any(axis=1)
                some_b = ~inside[:, tasks].all(axis=1)
                other, needs = (a, some_a) if a != host else (b, some_b)
                link[(host, other)] += needs * model.input_tdur[k][other]
        # the runtime's copies take worker time: the receiving worker's, and for outputs the worker off the host
        work = {a: t_a + link[(b, a)] + outputs_back[a], b: t_b + link[(a, b)] + outputs_back[b]}
        period = np.maximum(work[a], work[b])
        estimate = work[a] + work[b] + (self.n_requests - 1) * period
        return estimate, np.abs(t_a - t_b)

    # ------------------------------------------------------------------ exact scores
    def assignment(self, cut: Sequence[int], first: int) -> tuple[int, ...]:
        inside = self.grid.members(cut)
        return tuple(self.placed[first if inside[self.grid.task_of[v]] else 1 - first][v]
                     for v in range(self.problem.n))

    def score(self, dev: Sequence[int], order: Sequence[int], per_task: bool = False,
              max_in_flight: int | None = None) -> Score:
        """``simulate_requests`` of the plan (dev, order); ``per_task``: one segment per task (slice_segmentation),
        else the segments the task runtime cuts (segment_plan); ``max_in_flight``: at most that many requests in
        flight at a time (default all)."""
        key = (tuple(dev), tuple(order), per_task, max_in_flight)
        if key not in self.scores:
            per_slice = (lambda plan: slice_segmentation(self.problem.graph, plan, self.grid)) if per_task else None
            self.scores[key] = score_assignment(self.problem, dev, order, "timeslice", self.runtime, per_slice,
                                                max_in_flight)
        return self.scores[key]


def enumerate_cuts(grid: SliceGrid, max_cuts: int = MAX_CUTS) -> tuple[np.ndarray, int]:
    """Every down-set cut of ``grid`` (rows), or, beyond ``max_cuts``, those at the smallest stride (1, 2, 4, ...)
    with at most ``max_cuts``; returns (cuts, stride)."""
    stride = 1
    while True:
        cuts = []
        for cut in grid.cuts(stride):
            cuts.append(cut)
            if len(cuts) > max_cuts:
                break
        if len(cuts) <= max_cuts or stride >= max(grid.slices):
            return np.array(cuts[:max_cuts], dtype=np.int64).reshape(-1, len(grid.layers)), stride
        stride *= 2


def _neighbours(grid: SliceGrid, cut: tuple[int, ...], stride: int) -> list[tuple[int, ...]]:
    """Cuts one slice (or one stride) away in one layer, or one slice away in every layer; down-sets only."""
    steps = sorted({1, stride})
    found = []
    for i in range(len(cut)):
        for delta in steps:
            for sign in (-1, 1):
                moved = list(cut)
                moved[i] += sign * delta
                found.append(tuple(moved))
    for sign in (-1, 1):
        found.append(tuple(c + sign for c in cut))
    slices = grid.slices
    return [c for c in dict.fromkeys(found) if c != cut and all(0 <= v <= s for v, s in zip(c, slices))
            and grid.is_down_set(grid.members(c))]


def _describe(grid: SliceGrid, names: Sequence[str], first: int, cut: Sequence[int]) -> dict[str, Any]:
    return {"first_device": names[first], "second_device": names[1 - first], "cut": list(int(c) for c in cut),
            "kind": grid.cut_kind(cut)}


def _better(a: Score, b: Score) -> bool:
    """``a`` beats ``b``: a smaller makespan, or an equal one (within REL_TOL) and a smaller p99 latency."""
    if a.makespan_us < b.makespan_us * (1 - REL_TOL):
        return True
    return a.makespan_us <= b.makespan_us * (1 + REL_TOL) and a.latency_p99_us < b.latency_p99_us


def search(problem: Problem, grid: SliceGrid) -> tuple[tuple[int, ...], tuple[int, ...], dict[str, Any], list[str]]:
    """Run the method on a prepared problem: (assignment, order, stats, notes)."""
    names = problem.names
    cands = _Candidates(problem, grid)
    cuts, stride = enumerate_cuts(grid)
    tried: list[tuple[Score, str, tuple[int, ...], tuple[int, ...], dict[str, Any]]] = []

    def consider(label: str, dev: Sequence[int], order: Sequence[int], info: dict[str, Any]) -> Score:
        """Score a candidate with the runtime's segments and, for a cut in "slices" mode, also with one segment
        per task; the better one counts."""
        score = cands.score(dev, order)
        tried.append((score, label, tuple(dev), tuple(order), {**info, "segments": "runtime", **score.to_dict()}))
        if cands.per_task and label == "cut":
            per_task = cands.score(dev, order, per_task=True)
            tried.append((per_task, label, tuple(dev), tuple(order),
                          {**info, "segments": "slices", **per_task.to_dict()}))
            if _better(per_task, score):
                return per_task
        return score

    def cut_info(first: int, cut: tuple[int, ...], **extra: Any) -> dict[str, Any]:
        return {**_describe(grid, names, first, cut), **extra}

    published: dict[str, Any] | None = None
    best_cut: tuple[Score, int, tuple[int, ...]] | None = None
    full = np.array(grid.slices)
    for first in range(2):
        estimate, imbalance = cands.screen(cuts, first)
        picks = [int(i) for i in np.argsort(estimate, kind="stable")[:len(cuts) if len(cuts) <= EXACT_CUTS
                                                                       else SHORTLIST]]
        balanced = [int(i) for i in np.argsort(imbalance, kind="stable")[:BALANCED]]
        extremes = [int(np.flatnonzero((cuts == 0).all(axis=1))[0]), int(np.flatnonzero((cuts == full).all(axis=1))[0])]
        for i in dict.fromkeys(picks + balanced + extremes):
            cut = tuple(int(c) for c in cuts[i])
            why = [reason for reason, group in (("every cut" if len(cuts) <= EXACT_CUTS else "estimate", picks),
                                                ("balance", balanced), ("whole grid", extremes)) if i in group]
            info = cut_info(first, cut, estimate_us=float(estimate[i]), imbalance_us=float(imbalance[i]),
                            considered=why)
            score = consider("cut", cands.assignment(cut, first), cands.order, info)
            if i == balanced[0] and (published is None or imbalance[i] < published["imbalance_us"]):
                published = {**info, **score.to_dict()}
            if best_cut is None or _better(score, best_cut[0]):
                best_cut = (score, first, cut)
    assert best_cut is not None and published is not None
    refined, improved = 0, True
    while improved and refined < REFINE_EVALUATIONS:
        improved = False
        score, first, cut = best_cut
        for moved in _neighbours(grid, cut, stride)[:REFINE_EVALUATIONS - refined]:
            refined += 1
            new = consider("cut", cands.assignment(moved, first), cands.order,
                           cut_info(first, moved, refined=True, considered=["refinement"]))
            if _better(new, score):
                best_cut, improved = (new, first, moved), True
                break
    baselines: dict[str, dict[str, Any]] = {}
    for d in range(2):
        label = f"all_{names[d]}"
        baselines[label] = consider(label, single_device_assignment(problem, d), range(problem.n),
                                    {"considered": ["baseline"]}).to_dict()
    cp_dev, cp_order, _, _ = cp_greedy.search(problem)
    baselines["cp_greedy"] = consider("cp_greedy", cp_dev, cp_order, {"considered": ["baseline"]}).to_dict()
    best = tried[0]
    for entry in tried[1:]:
        if _better(entry[0], best[0]):
            best = entry
    best, few_in_flight = _robust_choice(cands, tried, best, baselines)
    _, label, dev, order, chosen = best
    cut_score, first, cut = best_cut
    ranked = sorted(tried, key=lambda t: t[0].key())
    stats = {"requests": cands.n_requests, "slice_steps": grid.slice_steps, "grid": grid.to_dict(),
             "segments": chosen["segments"],
             "cuts_per_order": int(len(cuts)), "cut_stride": stride, "simulated": len(cands.scores),
             "refine_evaluations": refined, "chosen": {"candidate": label, **chosen},
             "best_cut": {**_describe(grid, names, first, cut), **cut_score.to_dict()},
             "published_criterion": published, "baselines": baselines,
             "shortlist": [{"candidate": t[1], **t[4]} for t in ranked[:8]],
             "candidates": candidate_table(cands, tried, _row_key(label, chosen), published)}
    if few_in_flight:
        stats["few_in_flight"] = few_in_flight
    notes = [_note(label, chosen, published, baselines, cands.n_requests, grid)]
    if stride > 1:
        notes.append(f"timeslice: the grid has more than {MAX_CUTS} cuts per device order; enumerated every cut at a "
                     f"stride of {stride} slices, then refined by one-slice moves")
    return dev, order, stats, notes


def _robust_choice(cands: _Candidates, tried: list, best: tuple, baselines: Mapping[str, Any]) -> tuple[tuple, dict]:
    """With cross-device sharing, which lets a plan lean on the other device taking whole requests, among the
    candidates within ``ROBUST_TOL`` of the best N-request makespan (and no slower than any baseline) the one whose
    makespan is smallest with only as many requests in flight as there are devices, where the runtime's guard stops
    a device with work of its own from taking; returns (choice, what was compared), the best unchanged otherwise."""
    problem = cands.problem
    if not cands.runtime.cross_device_sharing or cands.n_requests <= problem.n_dev:
        return best, {}
    limit = min([best[0].makespan_us * (1 + ROBUST_TOL)] + [b["makespan_us"] for b in baselines.values()])
    near: dict[tuple, tuple] = {}
    for entry in tried:
        key = (entry[2], entry[3], entry[4].get("segments") == "slices")
        if entry[0].makespan_us <= max(limit, best[0].makespan_us) and key not in near:
            near[key] = entry
    if len(near) < 2:
        return best, {}
    few = {key: cands.score(key[0], key[1], key[2], max_in_flight=problem.n_dev) for key in near}
    pick = min(near, key=lambda key: (few[key].makespan_us, near[key][0].makespan_us))
    return near[pick], {"max_in_flight": problem.n_dev, "compared": len(near), "tolerance": ROBUST_TOL,
                        "makespan_us": few[pick].makespan_us, "candidate": near[pick][1],
                        "n_request_makespan_us": near[pick][0].makespan_us}


CONSIDERED = {"every cut": "every cut is simulated (few cuts)",
              "estimate": "among the best pipeline estimates of its device order",
              "balance": "among the most balanced cuts (the published criterion)",
              "whole grid": "the whole grid on one device",
              "refinement": "a one-slice move from the best cut",
              "baseline": "a baseline plan competing with the cuts"}


def _row_key(label: str, info: Mapping[str, Any]) -> tuple[Any, ...]:
    return label, info.get("first_device"), tuple(info.get("cut", ())), info.get("segments")


def candidate_table(cands: _Candidates, tried: Sequence[tuple[Score, str, tuple[int, ...], tuple[int, ...],
                                                              dict[str, Any]]],
                    chosen_key: tuple[Any, ...], published: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every distinct candidate simulated (cuts per segmentation, and the baselines), smallest N-request makespan
    first: its simulated figures, why it was considered (keys of ``CONSIDERED``), and for a cut one request's
    summed kernel latencies on each side (``first_us``: the cut's device, ``second_us``: the rest's), their
    difference ``imbalance_us`` and the pipeline estimate; ``chosen`` and ``published`` mark the plan's candidate
    and the published criterion's cut. Bookkeeping only: the choice is made in :func:`search`."""
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for _score, label, _dev, _order, info in tried:
        key = _row_key(label, info)
        if key in rows:
            rows[key]["considered"] = list(dict.fromkeys(rows[key]["considered"] + list(info["considered"])))
        else:
            rows[key] = {"candidate": label, **{k: v for k, v in info.items() if k != "refined"},
                         "considered": list(info["considered"])}
    names = cands.problem.names
    for first in range(2):
        cut_rows = [r for r in rows.values() if r["candidate"] == "cut" and r["first_device"] == names[first]]
        if cut_rows:
            cuts = np.array([r["cut"] for r in cut_rows], dtype=np.int64)
            estimate, imbalance = cands.screen(cuts, first)
            first_us, second_us = cands.sides_us(cuts, first)
            for r, *values in zip(cut_rows, first_us, second_us, imbalance, estimate):
                r.update(zip(("first_us", "second_us", "imbalance_us", "estimate_us"), map(float, values)))
    for key, row in rows.items():
        row["chosen"] = key == chosen_key
        row["published"] = row["candidate"] == "cut" and row["first_device"] == published["first_device"] \
            and list(row["cut"]) == list(published["cut"])
    return sorted(rows.values(), key=lambda r: (r["makespan_us"], r["latency_p99_us"]))


def _note(label: str, chosen: Mapping[str, Any], published: Mapping[str, Any], baselines: Mapping[str, Any],
          n_requests: int, grid: SliceGrid) -> str:
    if label != "cut":
        what = f"the {label} plan"
    elif chosen["kind"] in ("empty", "all"):
        what = f"the whole grid on {chosen['second_device' if chosen['kind'] == 'empty' else 'first_device']}"
    else:
        what = (f"the {chosen['kind']} cut {chosen['cut']} of {list(grid.slices)} {grid.slice_steps}-step slices "
                f"on {chosen['first_device']}, the rest on {chosen['second_device']}")
    best_base = min(baselines, key=lambda k: baselines[k]["makespan_us"])
    return (f"timeslice: chose {what}: {n_requests} requests in {chosen['makespan_us']:.0f} us (period "
            f"{chosen['period_us']:.0f} us, p99 latency {chosen['latency_p99_us']:.0f} us); the published "
            f"'comparable performance' cut {published['cut']} ({published['first_device']} first) takes "
            f"{published['makespan_us']:.0f} us, the best baseline ({best_base}) "
            f"{baselines[best_base]['makespan_us']:.0f} us")


def solve(graph: OpGraph, costs: CostTable, config: PartitionConfig | Mapping[str, Any] | None = None) -> Plan:
    problem = Problem(graph, costs, config, "timeslice")
    if problem.n_dev != 2:
        raise UsageError(f"timeslice pipelines an RNN across exactly two devices; found {list(problem.names)}. "
                         "Offer two (e.g. --devices cpu,gpu=t4) or use another method")
    grid = build_slice_grid(graph, problem.config.slice_steps)
    dev, order, stats, notes = search(problem, grid)
    logger.info("%s", notes[0])
    return finish_plan(problem, dev, order, stats=stats, notes=notes)
