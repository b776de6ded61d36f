"""Repetend-based schedule search for a fixed stage placement, after Tessel (Lin et al., "Efficient Schedule
Construction for Distributed Execution of Large DNN Models", IEEE TPDS 35(12), 2024).

A micro-batch is a chain of blocks ``F_0 .. F_{S-1}, B_{S-1} .. B_0``, each on its stage's device. A *repetend*
holds every block once: the chain is cut into ``n_r`` contiguous segments and segment ``k`` works on micro-batch
``i + n_r - 1 - k`` in repetend instance ``i`` (so a repetend can hold, e.g., the forward of micro-batch ``i + 2``
and the backward of micro-batch ``i``: 1F1B's steady state), each device running its blocks in a chosen order.
Repeating the repetend gives the steady state; the first and last instances, with the blocks of micro-batches
outside ``0..n-1`` dropped, are the warm-up and cool-down.

Instead of Tessel's SMT solver, the steady-state period of a candidate is computed exactly as the maximum cycle
ratio of its constraint graph (block durations and sends over iteration distances), by bisection with
Bellman-Ford. Candidates are enumerated by increasing ``n_r`` (less memory first); with ``stop_at_zero_bubbles``
the search stops at the first repetend without bubbles (period = the busiest device's work), as Tessel does,
otherwise every repetend with the best period is completed and simulated and the shortest iteration wins (the
completion here is the plain unrolling, not Tessel's makespan-optimal warm-up and cool-down solver). Every
candidate must fit each device's memory (stashed activations x micro-batches held in the steady state). The
chosen repetend is unrolled into per-device orders and simulated with :func:`schedules.simulate`, so its
iteration time is directly comparable with GPipe, 1F1B and zero-bubble.
"""
from __future__ import annotations

import itertools
import logging
import math
from dataclasses import dataclass, field

import numpy as np

from hetpart.errors import ScheduleError
from hetpart.training.schedules import ScheduleResult, Task, simulate
from hetpart.training.stage_plan import StagePlan

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TesselConfig:
    max_repetend_microbatches: int | None = None   # None: up to the number of stages + 1
    max_candidates: int = 20_000                   # (segmentation, order) pairs evaluated at most
    memory_limit_bytes: int | None = None
    stop_at_zero_bubbles: bool = False             # Tessel's rule: the first (least memory) bubble-free repetend;
                                                   # else every repetend with the best period is completed and
                                                   # simulated, and the shortest iteration wins
    max_simulations: int = 64


@dataclass(frozen=True)
class Repetend:
    blocks: tuple[tuple[str, int], ...]          # (kind, stage) in chain order
    offsets: tuple[int, ...]                     # micro-batch offset per block
    device_orders: dict[str, tuple[int, ...]] = field(default_factory=dict)   # block indices per device
    period_us: float = math.inf
    lower_bound_us: float = 0.0
    microbatches_held: int = 0


@dataclass(frozen=True)
class SearchResult:
    repetend: Repetend
    result: ScheduleResult
    candidates: int


def _feasible(n_blocks: int, edges: list[tuple[int, int, float, int]], lam: float) -> bool:
    """True if t_v >= t_u + w - d * lam has a solution: no positive cycle (Bellman-Ford, longest paths)."""
    dist = [0.0] * n_blocks
    for _ in range(n_blocks + 1):
        changed = False
        for u, v, w, d in edges:
            cand = dist[u] + w - d * lam
            if cand > dist[v] + 1e-9 * max(1.0, abs(cand)):
                dist[v] = cand
                changed = True
        if not changed:
            return True
    return False


def _period(n_blocks: int, edges: list[tuple[int, int, float, int]], lo: float, hi: float) -> float:
    """The steady-state period (maximum cycle ratio) if it is below ``hi``, else inf; ``lo`` is a lower bound."""
    if not _feasible(n_blocks, edges, hi):
        return math.inf
    if _feasible(n_blocks, edges, lo):
        return lo
    for _ in range(50):
        mid = (lo + hi) / 2
        if _feasible(n_blocks, edges, mid):
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-7 * max(1.0, hi):
            break
    return hi


def _segmentations(n_blocks: int, n_stages: int, n_r: int, general: bool):
    """Cut positions of the block chain into n_r segments; without ``general`` the forward blocks stay in
    the first segment (the family of 1F1B-like repetends)."""
    first = 1 if general else n_stages
    yield from itertools.combinations(range(first, n_blocks), n_r - 1)


def _device_order(blocks_of_device: list[int], offsets: tuple[int, ...], blocks: list[tuple[str, int]],
                  backward_first: bool) -> tuple[int, ...]:
    """Chain order, or backward blocks first where every stage still holds a micro-batch (saves memory)."""
    if backward_first:
        b_first = [b for b in blocks_of_device if blocks[b][0] == "B"] + \
                  [b for b in blocks_of_device if blocks[b][0] == "F"]
        ok = all(offsets[blocks.index(("F", s))] > offsets[blocks.index(("B", s))]
                 for s in {blocks[b][1] for b in blocks_of_device})
        if ok:
            return tuple(b_first)
    return tuple(blocks_of_device)


def search(plan: StagePlan, config: TesselConfig | None = None) -> SearchResult:
    """The best repetend for ``plan``'s placement (every stage on one device) and its simulated iteration."""
    config = config or TesselConfig()
    stages = plan.stages
    if any(s.replicas != 1 for s in stages):
        raise ScheduleError("the repetend search needs one device per stage; this plan replicates stages "
                            f"{[s.index for s in stages if s.replicas > 1]}")
    S = len(stages)
    blocks = [("F", s) for s in range(S)] + [("B", s) for s in range(S - 1, -1, -1)]
    dev = [stages[s].devices[0] for _, s in blocks]
    dur = [stages[s].forward_us if k == "F" else stages[s].backward_us for k, s in blocks]
    comm = [0.0] * len(blocks)                   # send after block b to block b + 1
    for b in range(len(blocks) - 1):
        (_, s), (_, s2) = blocks[b], blocks[b + 1]
        size = stages[min(s, s2)].send_bytes
        comm[b] = plan.cluster.send_us(size, dev[b], dev[b + 1])
    devices = list(dict.fromkeys(dev))
    per_device = {d: [b for b in range(len(blocks)) if dev[b] == d] for d in devices}
    load = {d: sum(dur[b] for b in per_device[d]) for d in devices}
    lower = max(load.values())
    hi = sum(dur) + sum(comm) + 1.0
    static = {d: sum(st.weight_state_bytes for st in stages if st.devices[0] == d) for d in devices}
    cap = {d: plan.cluster.device(d).memory_bytes if config.memory_limit_bytes is None
           else min(plan.cluster.device(d).memory_bytes, config.memory_limit_bytes) for d in devices}
    max_nr = config.max_repetend_microbatches or S + 1
    n_b = len(blocks)
    general = sum(math.comb(n_b - 1, k - 1) for k in range(1, max_nr + 1)) * 2 <= config.max_candidates
    best: Repetend | None = None
    ties: list[Repetend] = []
    count = 0
    for n_r in range(1, max_nr + 1):
        for cuts in _segmentations(n_b, S, n_r, general):
            seg = np.searchsorted(np.asarray(cuts, dtype=np.int64), np.arange(n_b), side="right")
            offsets = tuple(int(n_r - 1 - k) for k in seg)
            for backward_first in (True, False):
                orders = tuple(_device_order(per_device[d], offsets, blocks, backward_first) for d in devices)
                count += 1
                held, fits = {}, True
                for d, order in zip(devices, orders):
                    mem = static[d]
                    for s in {blocks[b][1] for b in order}:
                        f, bw = blocks.index(("F", s)), blocks.index(("B", s))
                        peak = offsets[f] - offsets[bw] + (1 if order.index(f) < order.index(bw) else 0)
                        fits = fits and peak >= 1
                        held[s] = peak
                        mem += peak * stages[s].activation_bytes
                    fits = fits and mem <= cap[d]
                if not fits:
                    continue
                edges = [(b, b + 1, dur[b] + comm[b], offsets[b] - offsets[b + 1]) for b in range(n_b - 1)]
                for order in orders:
                    edges += [(order[k], order[k + 1], dur[order[k]], 0) for k in range(len(order) - 1)]
                    edges.append((order[-1], order[0], dur[order[-1]], 1))
                bound = hi if best is None else best.period_us * (1 + 1e-9)
                period = _period(n_b, edges, lower, bound)
                if not math.isfinite(period):
                    continue
                rep = Repetend(tuple(blocks), offsets, dict(zip(devices, orders)), period, lower, max(held.values()))
                if best is None or period < best.period_us * (1 - 1e-9):
                    best, ties = rep, [rep]
                elif len(ties) < config.max_simulations:
                    ties.append(rep)
            if count >= config.max_candidates or (config.stop_at_zero_bubbles and best
                                                  and best.period_us <= lower * (1 + 1e-9)):
                break
        if count >= config.max_candidates or (config.stop_at_zero_bubbles and best
                                              and best.period_us <= lower * (1 + 1e-9)):
            break
    if best is None or not math.isfinite(best.period_us):
        raise ScheduleError(f"no repetend of up to {max_nr} micro-batches fits the devices' memory; raise "
                            "max_repetend_microbatches or the memory limit")
    logger.info("tessel: repetend of %d micro-batches, period %.1f us (bound %.1f us), %d candidates",
                max(best.offsets) + 1, best.period_us, lower, count)
    chosen = None
    for rep in ([best] if config.stop_at_zero_bubbles else ties):
        result = simulate(plan.stages, plan.cluster, plan.microbatches, plan.schedule,
                          orders=unroll(rep, plan.microbatches))
        if chosen is None or (result.iteration_us, rep.microbatches_held) < (chosen[1].iteration_us,
                                                                              chosen[0].microbatches_held):
            chosen = (rep, result)
    return SearchResult(chosen[0], chosen[1], min(count, config.max_candidates))


def unroll(rep: Repetend, microbatches: int) -> dict[str, list[Task]]:
    """Per-device task orders: repetend instances in sequence, blocks outside micro-batches 0..n-1 dropped."""
    orders: dict[str, list[Task]] = {d: [] for d in rep.device_orders}
    for i in range(-max(rep.offsets), microbatches):
        for d, order in rep.device_orders.items():
            for b in order:
                m = i + rep.offsets[b]
                if 0 <= m < microbatches:
                    kind, stage = rep.blocks[b]
                    orders[d].append(Task(kind, stage, m))
    return orders
