"""``milp``: the exact optimum of the simulator's model by mixed-integer programming (scipy/HiGHS).

Variables: ``x[i,d]`` (op i on device d, binary), ``s[i]`` (start), ``C`` (makespan), ``y[i,j]`` (for every
pair of ops with no path between them: i before j when they share a device), and per producer ``u`` and
device ``b`` a copy ``z[u,b]`` (binary: u's output is copied to b) with start ``cs[u,b]``; likewise per model
input and non-host device. Constraints (big-M with M = horizon + longest op + longest copy;
the horizon is 1.25 x the portfolio makespan):

* one device per op (pins and support fix ``x``); data precedence ``s_v >= s_u + p_u`` on every edge;
* a consumer on another device than its producer starts after the copy ends; a copy starts after its
  producer ends; an output produced off the host is copied to the host before ``C``;
* device exclusivity for unrelated pairs through ``y`` (related pairs are ordered by the data path);
* with ``serial_links``: copies on the same link do not overlap and follow their producers' order on the
  source device (this is exactly the simulator's FIFO); model-input copies go first, in input order;
* a valid load cut per device (``C >= sum of the latencies placed there``) that tightens the LP relaxation.

This is the simulator's model, so the optimum over (assignment, per-device order) is the simulator's
optimum (tested against ``exhaustive``). Differences, stated plainly: the MILP ignores the memory check
(the returned plan is simulated, memory included; if the MILP's plan overflows, the portfolio plan is
kept); and all times are bounded by a horizon ``H`` = 1.25 x the makespan of the portfolio plan computed
first (so ``C <= H`` cuts off nothing better). That plan is also the incumbent returned when HiGHS finds
nothing better within ``config.time_limit_s``. The returned plan is always scored by ``simulate``.
``plan.stats`` holds the MILP objective, HiGHS' dual bound, the best lower bound (with ``lower_bound_us``),
the gap ``(makespan - bound) / makespan`` and whether optimality was proven. Graphs above
``config.milp_max_ops`` raise ProblemTooLargeError (the model grows ~n^2).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Mapping

import numpy as np
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, linprog, milp

from hetpart.costs import CostTable
from hetpart.errors import InfeasibleError
from hetpart.graph import OpGraph
from hetpart.partition import portfolio
from hetpart.partition.common import PartitionConfig, Problem, ProblemTooLargeError, finish_plan
from hetpart.plan import Plan

logger = logging.getLogger(__name__)


class _Model:
    """A sparse MILP under construction."""

    def __init__(self) -> None:
        self.lb: list[float] = []
        self.ub: list[float] = []
        self.integer: list[int] = []
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.row_lb: list[float] = []
        self.row_ub: list[float] = []

    def var(self, lb: float, ub: float, integer: bool = False) -> int:
        self.lb.append(lb)
        self.ub.append(ub)
        self.integer.append(1 if integer else 0)
        return len(self.lb) - 1

    def row(self, terms: list[tuple[int, float]], lb: float, ub: float = np.inf) -> None:
        r = len(self.row_lb)
        for col, val in terms:
            if val != 0.0:
                self.rows.append(r)
                self.cols.append(col)
                self.vals.append(val)
        self.row_lb.append(lb)
        self.row_ub.append(ub)


def lower_bound_us(problem: Problem) -> float:
    """Makespan lower bound: the longest path at each op's fastest allowed latency (copies ignored), and the
    load bound: the LP relaxation of "split the ops over the devices so that the busiest device finishes
    first" (fractional assignment, no precedence, no copies), solved with scipy's HiGHS LP."""
    n, n_dev = problem.n, problem.n_dev
    if n == 0:
        return 0.0
    P = np.where(problem.allowed, problem.lat, np.inf)
    fastest = P.min(axis=1)
    finish = [0.0] * n
    for v in range(n):
        finish[v] = fastest[v] + max([finish[u] for u in problem.model.preds[v]] + [0.0])
    ops, devs = np.nonzero(problem.allowed)
    n_x = len(ops)
    cost = np.zeros(n_x + 1)
    cost[-1] = 1.0
    a_eq = sp.csr_matrix((np.ones(n_x), (ops, np.arange(n_x))), shape=(n, n_x + 1))
    a_ub = sp.hstack([sp.csr_matrix((P[ops, devs], (devs, np.arange(n_x))), shape=(n_dev, n_x)),
                      sp.csr_matrix(-np.ones((n_dev, 1)))]).tocsr()
    res = linprog(cost, A_ub=a_ub, b_ub=np.zeros(n_dev), A_eq=a_eq, b_eq=np.ones(n),
                  bounds=[(0, None)] * (n_x + 1), method="highs")
    load = float(res.fun) * (1 - 1e-9) if res.status == 0 else float(np.sum(fastest)) / n_dev
    return float(max(max(finish), load))


def _ancestors(problem: Problem) -> list[int]:
    anc = [0] * problem.n
    for v in range(problem.n):
        bits = 0
        for u in problem.model.preds[v]:
            bits |= anc[u] | (1 << u)
        anc[v] = bits
    return anc


def build(problem: Problem, horizon: float) -> tuple[_Model, dict[str, Any]]:
    """The MILP of the simulator's model with all times in [0, horizon]."""
    sim, n, n_dev, host = problem.model, problem.n, problem.n_dev, problem.host
    allowed = problem.allowed
    P = np.where(allowed, problem.lat, 0.0)
    T = {(a, b): sim.tdur[a][b] for a in range(n_dev) for b in range(n_dev) if a != b}
    big_m = horizon + float(P.max(initial=0.0)) + max([max(t, default=0.0) for t in T.values()] + [0.0]) \
        + max([max(t) for t in sim.input_tdur] + [0.0]) + 1.0
    m = _Model()
    x = [[m.var(0, 1 if allowed[i, d] else 0, True) for d in range(n_dev)] for i in range(n)]
    s = [m.var(0, horizon) for _ in range(n)]
    C = m.var(0, horizon)

    def end(i: int, sign: float = 1.0) -> list[tuple[int, float]]:
        return [(s[i], sign)] + [(x[i][d], sign * P[i, d]) for d in range(n_dev)]

    for d in range(n_dev):           # load cut: a device is busy at least the sum of its ops (valid, tightens LP)
        m.row([(C, 1.0)] + [(x[i][d], -P[i, d]) for i in range(n)], 0.0)
    for i in range(n):
        m.row([(x[i][d], 1.0) for d in range(n_dev)], 1.0, 1.0)
        m.row([(C, 1.0)] + end(i, -1.0), 0.0)
        for u in sim.preds[i]:
            m.row([(s[i], 1.0)] + end(u, -1.0), 0.0)
    # device exclusivity for unrelated pairs
    anc = _ancestors(problem)
    before: dict[tuple[int, int], int] = {}   # (i, j), i < j unrelated -> y var (1: i first)
    for j in range(n):
        for i in range(j):
            if (anc[j] >> i) & 1:
                continue
            shared = [d for d in range(n_dev) if allowed[i, d] and allowed[j, d]]
            if not shared:
                continue
            y = before[(i, j)] = m.var(0, 1, True)
            for d in shared:
                m.row([(s[j], 1.0), (s[i], -1.0), (y, -big_m), (x[i][d], -big_m), (x[j][d], -big_m)],
                      P[i, d] - 3 * big_m)
                m.row([(s[i], 1.0), (s[j], -1.0), (y, big_m), (x[i][d], -big_m), (x[j][d], -big_m)],
                      P[j, d] - 2 * big_m)
    # model-input copies (host -> b), first on their link, in input order
    in_copy: dict[tuple[int, int], tuple[int, int]] = {}
    for k, consumers in enumerate(sim.input_consumers):
        for b in range(n_dev):
            cons = [c for c in consumers if allowed[c, b]]
            if b == host or not cons:
                continue
            z, cs = m.var(0, 1, True), m.var(0, horizon)
            in_copy[(k, b)] = (z, cs)
            for c in cons:
                m.row([(z, 1.0), (x[c][b], -1.0)], 0.0)
                m.row([(s[c], 1.0), (cs, -1.0), (x[c][b], -big_m)], sim.input_tdur[k][b] - big_m)
    serial = problem.config.simulation.serial_links
    if serial:
        for (k1, b), (z1, cs1) in in_copy.items():
            for (k2, b2), (_z2, cs2) in in_copy.items():
                if b2 == b and k1 < k2:
                    m.row([(cs2, 1.0), (cs1, -1.0), (z1, -sim.input_tdur[k1][b])], 0.0)
    # op output copies
    copy: dict[tuple[int, int], tuple[int, int]] = {}
    for u in range(n):
        for b in range(n_dev):
            cons = [v for v in sim.succ[u] if allowed[v, b]]
            to_host = sim.is_output[u] and b == host
            if not (cons or to_host) or not any(allowed[u, a] for a in range(n_dev) if a != b):
                continue
            z, cs = m.var(0, 1, True), m.var(0, horizon)
            copy[(u, b)] = (z, cs)
            duration = [(x[u][a], T[(a, b)][u]) for a in range(n_dev) if a != b]
            m.row([(z, 1.0), (x[u][b], 1.0)], -np.inf, 1.0)
            m.row([(cs, 1.0)] + end(u, -1.0), 0.0)
            for v in cons:
                m.row([(z, 1.0), (x[v][b], -1.0), (x[u][b], 1.0)], 0.0)
                m.row([(s[v], 1.0), (cs, -1.0), (x[v][b], -big_m), (x[u][b], big_m)]
                      + [(col, -val) for col, val in duration], -big_m)
            if to_host:
                m.row([(z, 1.0), (x[u][b], 1.0)], 1.0)
                m.row([(C, 1.0), (cs, -1.0), (z, -big_m)] + [(col, -val) for col, val in duration], -big_m)
            if serial and b != host:
                for (k, b2), (zk, csk) in in_copy.items():
                    if b2 == b:
                        m.row([(cs, 1.0), (csk, -1.0), (zk, -sim.input_tdur[k][b]), (x[u][host], -big_m)], -big_m)
    if serial:
        keys = sorted(copy)
        for idx, (u, b) in enumerate(keys):
            for (w, b2) in keys[idx + 1:]:
                if b2 != b:
                    continue
                (zu, csu), (zw, csw) = copy[(u, b)], copy[(w, b)]
                for a in range(n_dev):
                    if a == b or not (allowed[u, a] and allowed[w, a]):
                        continue
                    same_src = [] if n_dev == 2 else [(x[u][a], -big_m), (x[w][a], -big_m)]
                    extra = 0.0 if n_dev == 2 else 2 * big_m
                    if (anc[w] >> u) & 1:          # u before w on every device
                        m.row([(csw, 1.0), (csu, -1.0), (zu, -big_m), (zw, -big_m)] + same_src,
                              T[(a, b)][u] - 2 * big_m - extra)
                    else:
                        y = before[(u, w)]
                        m.row([(csw, 1.0), (csu, -1.0), (y, -big_m), (zu, -big_m), (zw, -big_m)] + same_src,
                              T[(a, b)][u] - 3 * big_m - extra)
                        m.row([(csu, 1.0), (csw, -1.0), (y, big_m), (zu, -big_m), (zw, -big_m)] + same_src,
                              T[(a, b)][w] - 2 * big_m - extra)
    index = {"x": x, "s": s, "C": C, "pairs": len(before), "copies": len(copy) + len(in_copy)}
    return m, index


def solve(graph: OpGraph, costs: CostTable, config: PartitionConfig | Mapping[str, Any] | None = None) -> Plan:
    problem = Problem(graph, costs, config, "milp")
    limit = problem.config.milp_max_ops
    if problem.n > limit:
        raise ProblemTooLargeError(f"milp builds ~n^2 constraints; {graph.name!r} has {problem.n} ops, more than "
                                   f"milp_max_ops={limit}. Use portfolio or heft, or raise the limit.")
    inc_dev, inc_order, incumbent, _ = portfolio.search(problem)
    # The horizon (the big-M of the ordering constraints) sits above the incumbent: a tight one (== incumbent)
    # made HiGHS' presolve fail (status 4, "Solve error"). HiGHS still fails now and then on a model it solves
    # with another horizon or without presolve (a 6-op layered graph: status 4 at 1.25x with and without
    # presolve, optimal at 1.1x, 1.5x and 2x), so a failed solve is retried that way, within the time limit.
    fallback = float(np.sum(np.max(np.where(problem.allowed, problem.lat, 0.0), axis=1))) * 2 + 1e6
    built = time.perf_counter()
    res = None
    for scale in (1.25, 1.5, 2.0):
        horizon = incumbent * scale + 1.0 if np.isfinite(incumbent) else fallback * scale / 1.25
        m, index = build(problem, horizon)
        n_vars, n_rows = len(m.lb), len(m.row_lb)
        A = sp.csr_matrix((m.vals, (m.rows, m.cols)), shape=(n_rows, n_vars))
        c = np.zeros(n_vars)
        c[index["C"]] = 1.0
        for presolve in (True, False):
            remaining = float(problem.config.time_limit_s) - (time.perf_counter() - built)
            if remaining <= 0:
                break
            res = milp(c, constraints=LinearConstraint(A, m.row_lb, m.row_ub), integrality=np.array(m.integer),
                       bounds=Bounds(m.lb, m.ub), options={"time_limit": remaining, "mip_rel_gap": 1e-7,
                                                           "presolve": presolve})
            if res.status != 4:
                break
        if res is None or res.status != 4 or time.perf_counter() - built >= float(problem.config.time_limit_s):
            break
        logger.info("milp: HiGHS failed to solve the model with horizon %.4g (status 4); retrying", horizon)
    assert res is not None, "time_limit_s must be > 0"
    solve_s = time.perf_counter() - built
    dev, order, best = inc_dev, inc_order, incumbent
    source = "portfolio incumbent"
    objective = None
    if res.x is not None:
        objective = float(res.x[index["C"]])
        x = res.x
        milp_dev = [int(np.argmax([x[index["x"][i][d]] for d in range(problem.n_dev)])) for i in range(problem.n)]
        milp_order = sorted(range(problem.n), key=lambda i: (round(float(x[index["s"][i]]), 6), i))
        sched = problem.model.run(milp_dev, milp_order)
        try:
            problem.model.check_memory(sched)
            feasible = True
        except InfeasibleError:
            feasible = False
            logger.warning("milp: the MILP optimum overflows a device's memory (not modelled); keeping the portfolio plan")
        if sched.makespan_us > objective * (1 + 1e-6) + 1e-6:
            logger.warning("milp: simulated makespan %.3f exceeds the MILP objective %.3f: model mismatch",
                           sched.makespan_us, objective)
        if feasible and sched.makespan_us <= best:
            dev, order, best, source = milp_dev, milp_order, sched.makespan_us, "milp solution"
    dual = float(res.mip_dual_bound) if getattr(res, "mip_dual_bound", None) is not None and \
        np.isfinite(res.mip_dual_bound) else 0.0
    bound = max(dual, lower_bound_us(problem))
    proven = res.status == 0 and res.x is not None
    if proven:
        bound = max(bound, min(best, objective if objective is not None else best))
    gap = 0.0 if best <= 0 else max(0.0, (best - bound) / best)
    stats = {"milp_status": int(res.status), "milp_message": str(res.message), "milp_objective_us": objective,
             "lower_bound_us": bound, "dual_bound_us": dual, "gap": gap, "proven_optimal": proven,
             "incumbent_makespan_us": incumbent, "returned": source, "variables": n_vars, "constraints": n_rows,
             "unrelated_pairs": index["pairs"], "solve_s": solve_s, "time_limit_s": problem.config.time_limit_s}
    notes = [] if proven else [f"milp did not prove optimality within {problem.config.time_limit_s} s; "
                               f"gap to lower bound {gap:.1%}"]
    return finish_plan(problem, dev, order, stats=stats, notes=notes)
