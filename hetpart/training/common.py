"""What every training partitioner shares: its configuration, the graph's cut sizes, the one stage objective and
the factory that turns a stage split into a simulated :class:`StagePlan`.

The objective every method is scored by (``bottleneck_us``, the steady-state time per micro-batch): for a plan
with stages ``k`` (ops ``S_k``, ``r_k`` replicas, devices ``D_k``) and ``n`` micro-batches per iteration,

    load(d)    = sum over the stages k on device d of  T_d(S_k) / r_k + AR(P(S_k), D_k) / n
    comm_k     = send_us(cut_{k-1}, last device of stage k-1, first device of stage k) / r_k
    bottleneck = max( max_d load(d),  max_k comm_k )

where ``T_d`` is forward + backward time on the stage's slowest replica device, ``AR`` the ring all-reduce of the
stage's gradients and ``cut_k`` the bytes of every tensor produced in stages ``0..k`` and read later (model
inputs and outputs included). Memory: a replica of stage ``k`` needs ``weights + gradients + optimizer state +
(activations + received input) x in-flight micro-batches`` (``inflight_microbatches``).
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, fields
from typing import Any, Mapping, Sequence

import numpy as np

from hetpart.errors import InvalidClusterError, InvalidStagePlanError, StageInfeasibleError
from hetpart.graph import OpGraph
from hetpart.training.cluster import Cluster
from hetpart.training.cost_model import TrainCosts
from hetpart.training.schedules import simulate
from hetpart.training.stage_plan import SCHEDULES, Stage, StagePlan

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlannerConfig:
    """Options every training partitioner reads."""

    microbatches: int = 8
    schedule: str = "1f1b"                    # the schedule the plan is simulated (and its memory checked) with
    memory_limit_bytes: int | None = None     # per-device cap below the device's memory (None: the device's)
    replication: bool = True                  # a stage may run on several devices (data parallel inside it)
    allow_fewer_devices: bool = True          # a plan may leave devices idle
    bucket_bytes: int | None = None           # gradient all-reduce buckets in the simulation (None: one per stage)
    objective: str = "bottleneck"             # DPs: "bottleneck" (steady state) or "iteration" (simulated, over the
                                              # best split of every device count)

    def __post_init__(self) -> None:
        if self.microbatches < 1 or self.schedule not in SCHEDULES:
            raise InvalidStagePlanError(f"microbatches must be >= 1 and schedule one of {SCHEDULES}; found "
                                        f"{self.microbatches} and {self.schedule!r}")
        if self.objective not in ("bottleneck", "iteration"):
            raise InvalidStagePlanError(f"objective must be 'bottleneck' or 'iteration'; found {self.objective!r}")
        if self.memory_limit_bytes is not None and self.memory_limit_bytes <= 0:
            raise InvalidStagePlanError(f"memory_limit_bytes must be > 0 or None; found {self.memory_limit_bytes}")

    def to_dict(self) -> dict[str, Any]:
        return {f.name: list(v) if isinstance(v, tuple) else v for f in fields(self) for v in [getattr(self, f.name)]}

    @classmethod
    def coerce(cls, config: Any) -> Any:
        if config is None:
            return cls()
        if isinstance(config, cls):
            return config
        if isinstance(config, PlannerConfig):
            known = {f.name for f in fields(cls)}
            return cls(**{k: v for k, v in config.to_dict().items() if k in known})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise InvalidStagePlanError(f"unknown planner options {unknown}; known: {sorted(known)}")
        return cls(**dict(config))


def inflight_microbatches(schedule: str, microbatches: int, devices_from_here: int, replicas: int) -> int:
    """Micro-batches a replica stashes at once: all of its share under GPipe; under 1F1B (and the zero-bubble
    policy) ceil(devices of this and later stages / replicas), at most its share."""
    share = math.ceil(microbatches / replicas)
    if schedule == "gpipe":
        return share
    return min(share, math.ceil(devices_from_here / replicas))


class GraphCuts:
    """Per-op arrays and the exact bytes crossing the cut after any ideal (given as a boolean op mask)."""

    def __init__(self, graph: OpGraph) -> None:
        self.graph = graph
        self.n = graph.num_ops
        self.preds = [list(node.inputs) for node in graph.nodes]
        out: list[list[tuple[int, int]]] = [[] for _ in range(self.n)]
        for e in graph.edges:
            out[e.src].append((e.dst, e.size_bytes))
        self.out_edges = [sorted(o, key=lambda x: -x[1]) for o in out]
        self.inputs = [(np.array(t.consumers, dtype=np.int64), t.size_bytes) for t in graph.inputs if t.consumers]
        self.outputs = [(t.producer, t.size_bytes) for t in graph.outputs if t.producer is not None]

    def cut_bytes(self, masks: np.ndarray) -> np.ndarray:
        """Bytes crossing the cut after each ideal in ``masks`` (bool [N, n_ops]); 0 for the empty and full set.
        A tensor read by several ops outside the ideal crosses once, with the largest read."""
        masks = np.atleast_2d(np.asarray(masks, dtype=bool))
        out = np.zeros(masks.shape[0], dtype=np.float64)
        for v, edges in enumerate(self.out_edges):
            remaining = masks[:, v].copy()
            for dst, size in edges:
                hit = remaining & ~masks[:, dst]
                out[hit] += size
                remaining &= ~hit
        nonempty = masks.any(axis=1)
        full = masks.all(axis=1)
        for consumers, size in self.inputs:
            out[nonempty & ~masks[:, consumers].all(axis=1)] += size
        for producer, size in self.outputs:
            out[masks[:, producer] & ~full] += size
        return out

    def is_ideal(self, mask: np.ndarray) -> bool:
        return all(mask[p] for v in np.flatnonzero(mask) for p in self.preds[v])


@dataclass(frozen=True)
class StageTerms:
    """What the objective needs about one stage, computed by ``stage_terms``."""

    forward_us: float
    backward_us: float
    activation_bytes: int
    param_bytes: int
    weight_state_bytes: int
    send_bytes: int
    recv_bytes: int
    allreduce_us: float


def stage_terms(cuts: GraphCuts, costs: TrainCosts, cluster: Cluster, stage_ops: Sequence[Sequence[int]],
                stage_devices: Sequence[Sequence[str]]) -> list[StageTerms]:
    n = cuts.n
    prefix = np.zeros((len(stage_ops), n), dtype=bool)
    acc = np.zeros(n, dtype=bool)
    for k, ops in enumerate(stage_ops):
        acc[list(ops)] = True
        prefix[k] = acc
    cut = cuts.cut_bytes(prefix)
    out = []
    for k, (ops, devs) in enumerate(zip(stage_ops, stage_devices)):
        ids = np.asarray(sorted(ops), dtype=np.int64)
        fwd = max(costs.ops_time_us(ids, d, "forward") for d in devs)
        bwd = max(costs.ops_time_us(ids, d, "backward") for d in devs)
        params = int(costs.param_bytes[ids].sum())
        recv = int(cut[k - 1]) if k else 0
        out.append(StageTerms(fwd, bwd, int(costs.activation_bytes[ids].sum()) + recv, params,
                              int(costs.weight_state_bytes[ids].sum()), int(cut[k]) if k + 1 < len(stage_ops) else 0,
                              recv, cluster.allreduce_us(params, list(devs))))
    return out


def bottleneck_us(terms: Sequence[StageTerms], stage_devices: Sequence[Sequence[str]], cluster: Cluster,
                  microbatches: int) -> float:
    load: dict[str, float] = {}
    worst = 0.0
    for k, (t, devs) in enumerate(zip(terms, stage_devices)):
        r = len(devs)
        for d in devs:
            load[d] = load.get(d, 0.0) + (t.forward_us + t.backward_us) / r + t.allreduce_us / microbatches
        if k:
            worst = max(worst, cluster.send_us(t.recv_bytes, stage_devices[k - 1][-1], devs[0]) / r)
    return max(worst, max(load.values()))


def memory_need(terms: Sequence[StageTerms], stage_devices: Sequence[Sequence[str]], schedule: str,
                microbatches: int) -> dict[str, int]:
    """Per device: the memory model the planners check (the simulator reports the peak it observes)."""
    need: dict[str, int] = {}
    for k, (t, devs) in enumerate(zip(terms, stage_devices)):
        later = sum(len(d) for d in stage_devices[k:])
        stash = t.activation_bytes * inflight_microbatches(schedule, microbatches, later, len(devs))
        for d in devs:
            need[d] = need.get(d, 0) + t.weight_state_bytes + stash
    return need


def memory_capacity(cluster: Cluster, device: str, config: PlannerConfig) -> int:
    mem = cluster.device(device).memory_bytes
    return mem if config.memory_limit_bytes is None else min(mem, config.memory_limit_bytes)


def build_plan(graph: OpGraph, costs: TrainCosts, cluster: Cluster, stage_ops: Sequence[Sequence[int]],
               stage_devices: Sequence[Sequence[str]], config: PlannerConfig, method: str, *, started: float,
               groups: int = 1, stats: Mapping[str, Any] | None = None, notes: Sequence[str] = (),
               cuts: GraphCuts | None = None) -> StagePlan:
    """Score a stage split (bottleneck + simulated schedule) and return it as a validated StagePlan."""
    cuts = cuts or GraphCuts(graph)
    terms = stage_terms(cuts, costs, cluster, stage_ops, stage_devices)
    stages = tuple(Stage(index=k, op_ids=tuple(int(i) for i in ops), devices=tuple(devs), forward_us=t.forward_us,
                         backward_us=t.backward_us, activation_bytes=t.activation_bytes, param_bytes=t.param_bytes,
                         weight_state_bytes=t.weight_state_bytes, send_bytes=t.send_bytes,
                         allreduce_us=t.allreduce_us)
                   for k, (ops, devs, t) in enumerate(zip(stage_ops, stage_devices, terms)))
    result = simulate(stages, cluster, config.microbatches, config.schedule,
                      weight_grad_fraction=costs.weight_grad_fraction, bucket_bytes=config.bucket_bytes,
                      stage_grad_profile=grad_profile(costs, stages) if config.bucket_bytes else None)
    notes = list(notes)
    over = {d: v for d, v in result.peak_memory_bytes.items() if v > memory_capacity(cluster, d, config)}
    if over:
        notes.append("exceeds memory on " + ", ".join(f"{d} ({v / 2**30:.2f} GiB)" for d, v in over.items()))
    all_stats = {"planner_s": time.perf_counter() - started, "fits_memory": not over, **dict(stats or {})}
    plan = StagePlan(model=graph.name, method=method, microbatches=config.microbatches, schedule=config.schedule,
                     stages=stages, cluster=cluster, iteration_us=result.iteration_us,
                     bottleneck_us=bottleneck_us(terms, stage_devices, cluster, config.microbatches),
                     bubble_fraction=result.bubble_fraction, peak_memory_bytes=result.peak_memory_bytes,
                     groups=groups, optimizer=costs.optimizer, n_ops=graph.num_ops,
                     graph_hash=graph.structure_hash(),
                     costs_source={"forward": dict(costs.forward_source), "backward": costs.backward_source,
                                   "weight_grad_fraction": costs.weight_grad_fraction},
                     config=config.to_dict(), notes=tuple(notes), stats=all_stats)
    return plan.validate(graph)


def grad_profile(costs: TrainCosts, stages: Sequence[Stage]) -> list[list[tuple[float, int]]]:
    """Per stage, (backward_us, param_bytes) of its ops in backward (reverse) order, for DDP-style buckets."""
    out = []
    for st in stages:
        col = costs.column(st.devices[0])
        out.append([(float(costs.backward_us[i, col]), int(costs.param_bytes[i])) for i in reversed(st.op_ids)])
    return out


def topological_prefix_masks(n: int) -> np.ndarray:
    """The n + 1 prefixes of the topological order (ids), each an ideal: the chain of states."""
    return np.tri(n + 1, n, -1, dtype=bool)


def single_device_train_us(costs: TrainCosts, microbatches: int) -> dict[str, float]:
    """Forward + backward of the whole model for one iteration on each device alone (inf where unsupported)."""
    total = np.where(costs.supported, costs.forward_us + costs.backward_us, np.inf).sum(axis=0) * microbatches
    return dict(zip(costs.device_names, total.tolist()))


def require_devices(cluster: Cluster, needed: int, method: str) -> None:
    if cluster.size < needed:
        raise StageInfeasibleError(f"{method} needs at least {needed} devices; the cluster {cluster.spec!r} has "
                                   f"{cluster.size}")


def require_identical_devices(cluster: Cluster, method: str) -> None:
    """Raise InvalidClusterError unless every device of ``cluster`` is the same preset (``method`` plans for that)."""
    if not cluster.is_homogeneous:
        raise InvalidClusterError(f"{method} plans for identical devices; the cluster {cluster.spec!r} mixes "
                                  f"{list(cluster.presets)}. Use the hetero partitioner for unequal devices")
