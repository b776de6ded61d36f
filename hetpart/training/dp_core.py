"""The exact stage DP shared by pipedream_dp (states = prefixes of a topological order), antichain_dp (states =
every ideal of the DAG) and hetero (several device types).

States are ideals ``J`` (boolean op masks) from a family that contains the empty set and the whole graph; a
stage is ``J \\ I`` for two states ``I ⊂ J``. Devices come in types (presets); ``A[J][c]`` is the smallest
bottleneck of splitting ``J`` into stages that use exactly ``c[t]`` devices of type ``t``:

    A[∅][0] = 0
    A[J][c] = min over I ⊂ J, type t, replicas 1 <= r <= c[t]:
                  max(A[I][c - r e_t],  T_t(J \\ I) / r + AR(P(J \\ I), r) / n,  send(cut(I)) / r)
              subject to  weight state(J \\ I) + (act(J \\ I) + cut(I)) x inflight(W - |c| + r, r) <= memory_t

with ``W`` the total number of devices of the plan (solved once per ``W``: the in-flight count of 1F1B depends
on it) and the terms of :mod:`hetpart.training.common`. Devices of a type are taken in cluster order, so with
one type the links of every cut and the all-reduce rings are exact; with several types a cut is charged the
cluster's slowest link (the inter-node link once the cluster spans nodes). Complexity O(N^2 x C x W) for N
states and C device-count vectors, vectorised over I.
"""
from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from hetpart.errors import StageInfeasibleError
from hetpart.training.cluster import Cluster
from hetpart.graph import OpGraph
from hetpart.training.common import GraphCuts, PlannerConfig, build_plan, inflight_microbatches, memory_capacity
from hetpart.training.cost_model import TrainCosts
from hetpart.training.stage_plan import StagePlan

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DPSolution:
    value_us: float
    stage_ops: tuple[tuple[int, ...], ...]
    stage_devices: tuple[tuple[str, ...], ...]
    total_devices: int


class StateDP:
    """Pre-computed per-state sums over one family of ideals, for one cluster and cost table."""

    def __init__(self, masks: np.ndarray, cuts: GraphCuts, costs: TrainCosts, cluster: Cluster,
                 config: PlannerConfig, types: Sequence[tuple[str, Sequence[str]]]) -> None:
        masks = np.asarray(masks, dtype=bool)
        order = np.argsort(masks.sum(axis=1), kind="stable")
        self.masks = masks[order]
        size = self.masks.sum(axis=1)
        if size[0] != 0 or size[-1] != cuts.n or (size[1:-1] == cuts.n).any() or (size[1:] == 0).any() \
                or len(np.unique(np.packbits(self.masks, axis=1), axis=0)) != len(self.masks):
            raise StageInfeasibleError("the state family must hold the empty set and the whole graph once each, "
                                       "and no state twice")
        self.cuts, self.costs, self.cluster, self.config = cuts, costs, cluster, config
        self.types = [(preset, list(names)) for preset, names in types]
        self.n_states = len(self.masks)
        x = self.masks.astype(np.float64)
        self.cut = cuts.cut_bytes(self.masks)
        self.cut[0] = 0.0
        self.params = x @ costs.param_bytes.astype(np.float64)
        self.wstate = x @ costs.weight_state_bytes.astype(np.float64)
        self.act = x @ costs.activation_bytes.astype(np.float64)
        self.time, self.unsupported = [], []
        for preset, _ in self.types:
            col = costs.preset_column(preset)
            t = costs.forward_us[:, col] + costs.backward_us[:, col]
            self.time.append(x @ np.where(np.isfinite(t), t, 0.0))
            self.unsupported.append(x @ (~np.isfinite(t)).astype(np.float64))
        packed = np.packbits(self.masks, axis=1)
        self.subsets = [np.flatnonzero(((packed[:j] & ~packed[j]) == 0).all(axis=1)) for j in range(self.n_states)]
        self.capacity = [min(memory_capacity(cluster, d, config) for d in names) for _, names in self.types]

    # -------------------------------------------------------------------------------------------- solve
    def solve(self, total_devices: int | None = None) -> DPSolution:
        """The best split using exactly ``total_devices`` devices (any mix of types); None: the best over
        every total when ``allow_fewer_devices``, else all devices."""
        return self.solve_all(total_devices)[0]

    def solve_all(self, total_devices: int | None = None) -> list[DPSolution]:
        """The best split for every device-count vector the plan may use, best bottleneck first."""
        counts = [len(names) for _, names in self.types]
        all_devices = sum(counts)
        if total_devices is not None:
            runs = [(total_devices, False)]
        elif not self.config.allow_fewer_devices:
            runs = [(all_devices, False)]
        elif self._memory_never_binds(all_devices):
            runs = [(all_devices, True)]       # one run serves every total: the memory check cannot bind
        else:
            runs = [(w, False) for w in range(all_devices, 0, -1)]
        found: list[DPSolution] = []
        for w, any_total in runs:
            found += self._solve_total(w, counts, any_total)
        if not found:
            raise StageInfeasibleError(
                f"no split into stages fits: with {all_devices} device(s) ({', '.join(p for p, _ in self.types)}) "
                f"every candidate stage exceeds a device's memory (capacity "
                f"{', '.join(f'{c / 2**30:.2f} GiB' for c in self.capacity)}) or holds an op a device cannot run. "
                "Use more devices, fewer micro-batches in flight (schedule 1f1b), a smaller micro-batch or a "
                "larger memory_limit_bytes")
        return sorted(found, key=lambda sol: (sol.value_us, sol.total_devices))

    def _memory_never_binds(self, w: int) -> bool:
        worst = self.wstate[-1] + (self.act[-1] + self.cut.max()) * inflight_microbatches(
            self.config.schedule, self.config.microbatches, w, 1)
        return bool(worst <= min(self.capacity))

    def _solve_total(self, w: int, counts: list[int], any_total: bool) -> list[DPSolution]:
        vectors = [c for c in itertools.product(*(range(k + 1) for k in counts)) if 0 < sum(c) <= w]
        vectors.sort(key=sum)
        index = {c: i + 1 for i, c in enumerate(vectors)}
        index[tuple(0 for _ in counts)] = 0
        A = np.full((self.n_states, len(vectors) + 1), np.inf)
        back = np.full((self.n_states, len(vectors) + 1, 3), -1, dtype=np.int64)     # (I, type, replicas)
        A[0, 0] = 0.0
        n_mb, schedule = self.config.microbatches, self.config.schedule
        for j in range(1, self.n_states):
            subs = self.subsets[j]
            nonempty = subs != 0
            cut = self.cut[subs]
            dparams = self.params[j] - self.params[subs]
            dmem_w = self.wstate[j] - self.wstate[subs]
            dmem_a = self.act[j] - self.act[subs] + cut
            dtime = [self.time[t][j] - self.time[t][subs] for t in range(len(self.types))]
            unsup = [(self.unsupported[t][j] - self.unsupported[t][subs]) > 0 for t in range(len(self.types))]
            for c in vectors:
                best_val, best_arg = np.inf, None
                for t, (_, names) in enumerate(self.types):
                    for r in range(1, min(c[t], n_mb if self.config.replication else 1) + 1):
                        prev = list(c)
                        prev[t] -= r
                        a_prev = A[subs, index[tuple(prev)]]
                        if not np.isfinite(a_prev).any():
                            continue
                        inflight = inflight_microbatches(schedule, n_mb, w - sum(c) + r, r)
                        bad = unsup[t] | (dmem_w + dmem_a * inflight > self.capacity[t])
                        comp = dtime[t] / r
                        if r > 1:
                            link = self.cluster.ring_link(names[prev[t]:prev[t] + r])
                            ar = 2.0 * (r - 1) / r * dparams / link.bandwidth_bytes_per_s * 1e6 \
                                + 2.0 * (r - 1) * link.latency_us
                            comp = comp + np.where(dparams > 0, ar, 0.0) / n_mb
                        link = self._cut_link(t, prev[t])
                        comm = np.where(nonempty, (link.latency_us + cut / link.bandwidth_bytes_per_s * 1e6) / r, 0.0)
                        val = np.where(bad, np.inf, np.maximum(a_prev, np.maximum(comp, comm)))
                        k = int(np.argmin(val))
                        if val[k] < best_val:
                            best_val, best_arg = float(val[k]), (int(subs[k]), t, r)
                if best_arg is not None:
                    A[j, index[c]] = best_val
                    back[j, index[c]] = best_arg
        full = self.n_states - 1
        finals = [c for c in vectors if (any_total or sum(c) == w) and np.isfinite(A[full, index[c]])]
        return [self._trace(back, index, full, c, A[full, index[c]], sum(c)) for c in finals]

    def _cut_link(self, t: int, start: int):
        names = self.types[t][1]
        if len(self.types) == 1:
            if start == 0:
                return self.cluster.intra_node_link
            return self.cluster.link_between(names[start - 1], names[start])
        return self.cluster.intra_node_link if self.cluster.num_nodes == 1 else self.cluster.inter_node_link

    def _trace(self, back: np.ndarray, index: dict, j: int, c: tuple[int, ...], value: float,
               w: int) -> DPSolution:
        stages: list[tuple[tuple[int, ...], tuple[str, ...]]] = []
        c = list(c)
        while j != 0:
            i, t, r = (int(v) for v in back[j, index[tuple(c)]])
            ops = tuple(int(v) for v in np.flatnonzero(self.masks[j] & ~self.masks[i]))
            names = self.types[t][1]
            c[t] -= r
            stages.append((ops, tuple(names[c[t]:c[t] + r])))
            j = i
        stages.reverse()
        return DPSolution(float(value), tuple(s[0] for s in stages), tuple(s[1] for s in stages), w)


def device_types(cluster: Cluster) -> list[tuple[str, list[str]]]:
    """Devices grouped by preset, each group in cluster order."""
    return [(p, [d.name for d in cluster.devices if d.preset == p]) for p in cluster.presets]


def solve_family(masks: np.ndarray, cuts: GraphCuts, costs: TrainCosts, cluster: Cluster, config: PlannerConfig,
                 types: Sequence[tuple[str, Sequence[str]]] | None = None) -> tuple[list[DPSolution], int]:
    """Run the DP over a family of ideals; returns the solutions per device-count vector (best bottleneck
    first) and the number of states. With ``objective="iteration"`` and replication, the straight pipelines
    (no replication) and pure data parallelism on every device count of one type join the candidates."""
    types = types or device_types(cluster)
    dp = StateDP(masks, cuts, costs, cluster, config, types)
    logger.debug("stage DP over %d states, device types %s", dp.n_states, [p for p, _ in dp.types])
    solutions = dp.solve_all()
    if config.objective == "iteration" and config.replication:
        straight = StateDP(masks, cuts, costs, cluster, replace(config, replication=False), types)
        try:
            solutions += straight.solve_all()
        except StageInfeasibleError:
            pass
        everything = tuple(range(cuts.n))
        for _, names in types:
            for w in range(2, min(len(names), config.microbatches) + 1):
                solutions.append(DPSolution(np.inf, (everything,), (tuple(names[:w]),), w))
    return solutions, dp.n_states


def choose_plan(graph: OpGraph, costs: TrainCosts, cluster: Cluster, config: PlannerConfig,
                solutions: Sequence[DPSolution], method: str, *, started: float, cuts: GraphCuts,
                stats: dict, notes: Sequence[str] = ()) -> StagePlan:
    """The plan of the best solution: smallest bottleneck (``objective="bottleneck"``), or smallest simulated
    iteration among the best split of every device count (``objective="iteration"``)."""
    pool = list(solutions[:1]) if config.objective == "bottleneck" else list(solutions)
    best = None
    for sol in pool:
        plan = build_plan(graph, costs, cluster, sol.stage_ops, sol.stage_devices, config, method, started=started,
                          cuts=cuts, notes=notes, stats={**stats, "candidates": len(solutions),
                                                         **({"dp_value_us": sol.value_us} if np.isfinite(
                                                             sol.value_us) else {})})
        if not plan.stats["fits_memory"] and sol.value_us == np.inf:
            continue
        if best is None or (plan.iteration_us, plan.bottleneck_us) < (best.iteration_us, best.bottleneck_us):
            best = plan
    logger.info("%s: %d stages on %d device(s), bottleneck %.1f us, iteration %.1f us", method, best.num_stages,
                len(best.devices_used), best.bottleneck_us, best.iteration_us)
    return best

