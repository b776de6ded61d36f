"""``portfolio``: multi-start search, the baselines' plans each improved by cp_greedy's correction.

Starts (each an assignment and an issue order, simulated once): cp_greedy's greedy start (every cluster on
its fastest device, upward-rank order), the plans of ``all_cpu``, ``all_gpu``, ``greedy`` and ``heft`` with
their own issue orders, and the greedy-start and heft assignments issued by earliest-start list scheduling.
The correction of ``cp_greedy`` (``cp_greedy.Correction``: critical-path cluster moves, re-orders, pair
moves) descends from the best start, then from the next ones while the simulation budget
(``config.max_evaluations``, the same default as cp_greedy's) lasts; identical starts are searched once.
The rest of the budget goes to cp_greedy's perturbation (``cp_greedy.iterate``) from the best plan found.

Every start is itself a simulated plan and no step worsens the best one, so the result is never worse than
``all_cpu``, ``all_gpu``, ``greedy`` or ``heft`` *by construction*. ``plan.stats["start"]`` names the start
the returned plan came from, ``start_makespans_us`` lists them all, ``searches`` counts the descents, and
``moves``/``reorders``/``perturbations``/``stopped`` are as for cp_greedy. Deterministic (seeded kicks).

**Many requests, the task runtime.** With ``config.requests`` > 1 or a task-runtime model (an overhead per
segment in ``config.dispatch_overhead_us_by_device``, which ``hetpart compile --segments`` measures), the search
still descends on one request's simulated makespan, then every start, every local optimum and the final plan are
simulated as the task runtime runs them (``hetpart.simulate_requests``: segments, their overhead, N requests in
flight) and the one with the smallest N-request makespan is chosen (``plan.stats["requests_objective"]``). The
baselines are among them, and so are two-stage pipelines cut from the final plan's issue order
(``request_search.pipeline_cut_starts``), which a chain needs: its single-request starts all keep it on one device.
The chosen plan is then improved by moves scored on that objective itself (``request_search.improve_for_requests``:
whole segments, clusters and related pairs of clusters to another device), which takes only improvements, so the
plan is never worse than ``all_cpu``, ``all_gpu``, ``greedy`` or ``heft`` on that objective either.
"""
from __future__ import annotations

import logging
from typing import Any, Mapping

import numpy as np

from hetpart.costs import CostTable
from hetpart.errors import UnknownDeviceError
from hetpart.graph import OpGraph
from hetpart.partition.common import PartitionConfig, Problem, finish_plan
from hetpart.partition.cp_greedy import IMPROVEMENT_REL_TOL, Correction, Outcome, fastest_per_cluster, iterate
from hetpart.partition.greedy import greedy_assignment
from hetpart.partition.heft import heft_schedule
from hetpart.partition.request_score import choose_for_requests, wants_request_objective
from hetpart.partition.request_search import improve_for_requests, pipeline_cut_starts
from hetpart.partition.single_device import single_device_assignment
from hetpart.plan import Plan

logger = logging.getLogger(__name__)


def starting_points(problem: Problem, groups: list[list[int]]) -> list[tuple[str, list[int], list[int]]]:
    """(name, assignment, order) of cp_greedy's greedy start, of every baseline and of two re-issued splits."""
    fastest = fastest_per_cluster(problem, groups)
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
    starts.append(("fastest_per_cluster+earliest_start", fastest, problem.earliest_start_order(fastest)))
    starts.append(("heft+earliest_start", heft_dev, problem.earliest_start_order(heft_dev)))
    return starts


def search(problem: Problem) -> tuple[list[int], list[int], float, dict[str, Any]]:
    """Run the whole method on a prepared problem: (assignment, order, makespan, stats)."""
    correction = Correction(problem)
    scored = []
    for name, dev, order in starting_points(problem, correction.groups):
        scored.append((correction.evaluate(dev, order), len(scored), name, dev, order))
    scored.sort(key=lambda s: (s[0], s[1]))
    best: tuple[Outcome, str, float] | None = None
    searched: list[tuple[list[int], list[int]]] = []
    candidates = [(name, dev, order) for _, _, name, dev, order in scored]      # for the N-request choice
    for start_makespan, _, name, dev, order in scored:
        if best is not None and correction.exhausted:
            break
        if (dev, order) in searched:
            continue                        # the same start twice (e.g. greedy == all_gpu)
        searched.append((dev, order))
        result = correction.descend(Outcome(list(dev), list(order), start_makespan))
        candidates.append((f"{name}+correction", result.dev, result.order))
        if best is None or result.makespan_us < best[0].makespan_us * (1 - IMPROVEMENT_REL_TOL):
            best = (result, name, start_makespan)
    assert best is not None
    local, start_name, start_makespan = best
    if not np.isfinite(start_makespan):
        logger.warning("portfolio: every starting point overflows a device's memory")
    result, info = iterate(correction, local, problem.config.perturbations, problem.config.seed)
    stats = {"start": start_name, "start_makespan_us": start_makespan,
             "start_makespans_us": {name: ms for (ms, _, name, _, _) in scored}, "searches": len(searched),
             "clusters": len(correction.groups), "moves": result.moves, "reorders": result.reorders, **info,
             "evaluations": correction.evaluations, "budget": correction.budget}
    if not wants_request_objective(problem):
        return result.dev, result.order, result.makespan_us, stats
    single_request_best = (f"{start_name}+perturbation", result.dev, result.order)
    candidates += pipeline_cut_starts(problem, result.order) + [single_request_best]
    chosen, scores = choose_for_requests(problem, candidates, "portfolio")
    name, dev, order = candidates[chosen]
    dev, refined, search_stats = improve_for_requests(problem, dev, order, correction.groups, "portfolio")
    stats["requests_objective"] = {
        "n_requests": problem.config.requests, "chosen": name,
        "dispatch_overhead_us_by_device": dict(problem.config.dispatch_overhead_us_by_device),
        "single_request_best": candidates[-1][0], "chosen_score": refined.to_dict(),
        "single_request_best_score": scores[-1].to_dict(),
        "makespans_us": {n: sc.makespan_us for (n, _, _), sc in zip(candidates, scores)},
        "search": search_stats}
    if search_stats["moves"]:
        logger.info("portfolio: %d move(s) by the %d-request objective took %s from %.0f us to %.0f us",
                    search_stats["moves"], problem.config.requests, name, scores[chosen].makespan_us,
                    refined.makespan_us)
    if chosen != len(candidates) - 1:
        logger.info("portfolio: %s wins for %d request(s) in flight (%.0f us against %.0f us for the single-request "
                    "best)", name, problem.config.requests, scores[chosen].makespan_us, scores[-1].makespan_us)
    return list(dev), list(order), problem.model.makespan(dev, order), stats


def solve(graph: OpGraph, costs: CostTable, config: PartitionConfig | Mapping[str, Any] | None = None) -> Plan:
    problem = Problem(graph, costs, config, "portfolio")
    dev, order, _, stats = search(problem)
    return finish_plan(problem, dev, order, stats=stats)
