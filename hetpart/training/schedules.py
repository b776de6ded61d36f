"""Pipeline schedule simulator: one training iteration of a stage split under GPipe, 1F1B, interleaved 1F1B or
zero-bubble, with point-to-point sends over the cluster's links and gradient all-reduce across replicas.

The model:

* Stage ``s`` has ``r_s`` replicas; micro-batch ``m`` runs on replica ``m % r_s``. A device runs one task at a
  time: ``F`` (forward), ``B`` (backward) or, for ``zero_bubble``, ``B`` (input gradient, ``1 - w`` of the
  backward) and ``W`` (weight gradient, ``w`` = ``weight_grad_fraction`` of it).
* ``F(s, m)`` needs ``F(s-1, m)``'s activations, ``B(s, m)`` needs ``F(s, m)`` and ``B(s+1, m)``'s gradient,
  ``W(s, m)`` needs ``B(s, m)``. A tensor between devices is sent over the link between them (full duplex: each
  direction one message at a time, ``latency + bytes / bandwidth``); stages exchange only with their neighbours.
* Orders per device: ``gpipe`` all forwards then all backwards; ``1f1b`` ``k_s`` forwards, then one backward and
  one forward alternately, with ``k_s = ceil(sum_{t>=s} r_t / r_s)`` micro-batches in flight (PipeDream-Flush);
  ``interleaved_1f1b`` Megatron-LM's order for ``v`` stages per device (stage ``s`` on rank ``s % D``, micro-batch
  count a multiple of ``D``); ``zero_bubble`` a greedy policy in the spirit of ZB-H1 at 1F1B's memory per stage:
  input gradient first, then a forward while fewer than ``k_s`` micro-batches hold activations, else a deferred
  weight gradient. It removes part of 1F1B's bubble, not all of ZB-H1's (4 equal stages, 8 micro-batches, F = B
  = W = 1: 30 time units against 1F1B's 33 and ZB-H1's 3n + (p - 1)(F + B - W) = 27).
* Memory per device: weights + gradients + optimizer state of its stages, plus each stage's stashed activations
  (``Stage.activation_bytes``) from the start of a forward to the end of its backward (weight gradient for
  ``zero_bubble``).
* All-reduce: a stage's gradients are ring-all-reduced over its replicas in buckets once every replica finished
  its last backward (one bucket per stage by default, GroPipe's delayed per-partition all-reduce; with
  ``bucket_bytes`` buckets in reverse op order start as the last backward reaches them, like DDP). All-reduce
  does not slow compute or the pipeline's sends. The optimizer step is not modelled.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Sequence

from hetpart.errors import ScheduleError
from hetpart.training.cluster import Cluster
from hetpart.training.stage_plan import SCHEDULES, Stage, StagePlan


@dataclass(frozen=True)
class Task:
    kind: str          # "F", "B", "W"
    stage: int
    microbatch: int


@dataclass(frozen=True)
class TaskEvent:
    task: Task
    device: str
    start_us: float
    end_us: float


@dataclass(frozen=True)
class ScheduleResult:
    schedule: str
    microbatches: int
    iteration_us: float
    bubble_fraction: float
    peak_memory_bytes: dict[str, int]
    busy_us: dict[str, float]
    allreduce_end_us: float
    events: tuple[TaskEvent, ...] = field(default=(), repr=False)
    allreduce_events: tuple[tuple[int, float, float], ...] = field(default=(), repr=False)   # (stage, start, end)


def inflight_limit(replicas: Sequence[int], stage: int) -> int:
    """Micro-batches a replica of ``stage`` keeps in flight under 1F1B: ceil(sum of later replicas / own)."""
    return math.ceil(sum(replicas[stage:]) / replicas[stage])


def _lanes(stages: Sequence[Stage], n: int) -> dict[tuple[int, int], list[int]]:
    return {(s.index, j): [m for m in range(n) if m % s.replicas == j] for s in stages for j in range(s.replicas)}


def _device_orders(stages: Sequence[Stage], n: int, schedule: str) -> dict[str, list[Task]]:
    """Fixed per-device task orders (not used by zero_bubble, which decides at run time)."""
    reps = [s.replicas for s in stages]
    orders: dict[str, list[Task]] = {}
    if schedule == "interleaved_1f1b":
        ranks = list(dict.fromkeys(stages[k].devices[0] for k in range(len(stages))))
        d, v = len(ranks), len(stages) // max(len(ranks), 1)
        if any(r != 1 for r in reps) or len(stages) != d * v or any(
                s.devices[0] != ranks[s.index % d] for s in stages):
            raise ScheduleError(f"interleaved_1f1b needs S = v * D stages without replicas, stage s on rank s % D; "
                                f"found {len(stages)} stages on {d} devices {[s.devices for s in stages]}. Build the "
                                "plan with hetpart.training.common.interleave_stages")
        if n % d:
            raise ScheduleError(f"interleaved_1f1b needs a micro-batch count that is a multiple of the {d} pipeline "
                                f"devices; found {n}. Use {d * math.ceil(n / d)} micro-batches")
        total = n * v
        for p, dev in enumerate(ranks):
            fwd = [Task("F", ((k // d) % v) * d + p, (k // (d * v)) * d + k % d) for k in range(total)]
            bwd = [Task("B", (v - 1 - (k // d) % v) * d + p, (k // (d * v)) * d + k % d) for k in range(total)]
            warm = min(total, (d - p - 1) * 2 + (v - 1) * d)
            order = fwd[:warm]
            for k in range(total - warm):
                order += [fwd[warm + k], bwd[k]]
            orders[dev] = order + bwd[total - warm:]
        return orders
    for (s, j), mbs in _lanes(stages, n).items():
        dev = stages[s].devices[j]
        if schedule == "gpipe":
            order = [Task("F", s, m) for m in mbs] + [Task("B", s, m) for m in mbs]
        else:
            k = min(inflight_limit(reps, s), len(mbs))
            order = [Task("F", s, m) for m in mbs[:k]]
            for i in range(len(mbs) - k):
                order += [Task("B", s, mbs[i]), Task("F", s, mbs[k + i])]
            order += [Task("B", s, m) for m in mbs[len(mbs) - k:]]
        orders[dev] = order
    return orders


def simulate(stages: Sequence[Stage], cluster: Cluster, microbatches: int, schedule: str, *,
             weight_grad_fraction: float = 0.5, bucket_bytes: int | None = None,
             stage_grad_profile: Sequence[Sequence[tuple[float, int]]] | None = None,
             keep_events: bool = False, orders: dict[str, list[Task]] | None = None) -> ScheduleResult:
    """Simulate one iteration. ``stage_grad_profile[s]`` lists (backward_us, param_bytes) per op of stage ``s`` in
    backward order; with ``bucket_bytes`` it places DDP-style buckets (without it, buckets are proportional).
    ``orders`` gives every device's task order explicitly (e.g. from a schedule search) instead of ``schedule``'s;
    with ``W`` tasks in it the backward is split as under zero_bubble."""
    if schedule not in SCHEDULES:
        raise ScheduleError(f"unknown schedule {schedule!r}; known: {SCHEDULES}")
    if microbatches < 1 or not stages:
        raise ScheduleError(f"need at least one stage and one micro-batch; found {len(stages)} and {microbatches}")
    n, S = microbatches, len(stages)
    reps = [s.replicas for s in stages]
    zb = schedule == "zero_bubble" and orders is None
    split = zb or (orders is not None and any(t.kind == "W" for o in orders.values() for t in o))
    wfrac = weight_grad_fraction if split else 0.0

    def duration(t: Task) -> float:
        st = stages[t.stage]
        return {"F": st.forward_us, "B": st.backward_us * (1.0 - wfrac), "W": st.backward_us * wfrac}[t.kind]

    def device_of(s: int, m: int) -> str:
        return stages[s].devices[m % reps[s]]

    need: dict[Task, int] = {}
    for s in range(S):
        for m in range(n):
            need[Task("F", s, m)] = 1 if s > 0 else 0
            need[Task("B", s, m)] = 1 + (1 if s < S - 1 else 0)
            if split and not zb:
                need[Task("W", s, m)] = 1
    devices = list(dict.fromkeys(d for st in stages for d in st.devices))
    if orders is None and not zb:
        orders = _device_orders(stages, n, schedule)
    pos = {d: 0 for d in devices}
    ready: dict[str, set[Task]] = {d: set() for d in devices}
    busy_until = {d: 0.0 for d in devices}
    idle = {d: True for d in devices}
    busy_us = {d: 0.0 for d in devices}
    static_mem = {d: 0 for d in devices}
    for st in stages:
        for d in st.devices:
            static_mem[d] += st.weight_state_bytes
    stash = {d: 0 for d in devices}
    peak_stash = {d: 0 for d in devices}
    # zero-bubble bookkeeping per lane (stage, replica)
    next_f = {(s, j): [m for m in range(n) if m % reps[s] == j] for s in range(S) for j in range(reps[s])}
    holding = {key: 0 for key in next_f}
    pending_w: dict[tuple[int, int], list[int]] = {key: [] for key in next_f}
    lanes_of: dict[str, list[tuple[int, int]]] = {d: [] for d in devices}
    for (s, j) in next_f:
        lanes_of[stages[s].devices[j]].append((s, j))
    link_free: dict[tuple[str, str], float] = {}
    last_bwd: dict[tuple[int, int], tuple[float, float]] = {}
    events: list[TaskEvent] = []
    heap: list[tuple[float, int, str, object]] = []
    counter = 0
    done = 0
    total = sum(len(v) for v in next_f.values()) * (3 if split else 2)
    if orders is not None and sum(len(o) for o in orders.values()) != total:
        raise ScheduleError(f"the explicit orders hold {sum(len(o) for o in orders.values())} tasks; this plan "
                            f"needs {total} ({'F, B, W' if split else 'F and B'} for every stage and micro-batch)")

    def push(t: float, kind: str, payload: object) -> None:
        nonlocal counter
        counter += 1
        heapq.heappush(heap, (t, counter, kind, payload))

    def pick(d: str) -> Task | None:
        if not zb:
            order = orders.get(d, [])
            if pos[d] < len(order) and order[pos[d]] in ready[d]:
                return order[pos[d]]
            return None
        for (s, j) in lanes_of[d]:          # input gradients first
            cands = [t for t in ready[d] if t.kind == "B" and t.stage == s]
            if cands:
                return min(cands, key=lambda t: t.microbatch)
        for (s, j) in lanes_of[d]:
            lane = next_f[(s, j)]
            if lane and holding[(s, j)] < inflight_limit(reps, s) and Task("F", s, lane[0]) in ready[d]:
                return Task("F", s, lane[0])
        for (s, j) in lanes_of[d]:
            if pending_w[(s, j)]:
                return Task("W", s, pending_w[(s, j)][0])
        return None

    def dispatch(d: str, now: float) -> None:
        task = pick(d)
        if task is None:
            idle[d] = True
            return
        idle[d] = False
        ready[d].discard(task)
        lane = (task.stage, task.microbatch % reps[task.stage])
        if zb:
            if task.kind == "F":
                next_f[lane].pop(0)
                holding[lane] += 1
            elif task.kind == "W":
                pending_w[lane].pop(0)
        else:
            pos[d] += 1
        if task.kind == "F":
            stash[d] += stages[task.stage].activation_bytes
            peak_stash[d] = max(peak_stash[d], stash[d])
        end = now + duration(task)
        busy_us[d] += end - now
        busy_until[d] = end
        push(end, "done", (d, task, now))

    def deliver(task: Task, src: str, at: float, size: float) -> None:
        dst = device_of(task.stage, task.microbatch)
        if dst != src:
            key = (src, dst)
            start = max(at, link_free.get(key, 0.0))
            at = start + cluster.send_us(size, src, dst)
            link_free[key] = at
        push(at, "arrive", (dst, task))

    for m in range(n):
        for s in range(S):
            if need[Task("F", s, m)] == 0:
                ready[device_of(s, m)].add(Task("F", s, m))
    for d in devices:
        dispatch(d, 0.0)
    now = 0.0
    while heap:
        now, _, kind, payload = heapq.heappop(heap)
        if kind == "arrive":
            d, task = payload
            need[task] -= 1
            if need[task] == 0:
                ready[d].add(task)
                if idle[d]:
                    dispatch(d, now)
            continue
        d, task, start = payload
        done += 1
        if keep_events:
            events.append(TaskEvent(task, d, start, now))
        s, m = task.stage, task.microbatch
        lane = (s, m % reps[s])
        if task.kind == "F":
            if s + 1 < S:
                deliver(Task("F", s + 1, m), d, now, stages[s].send_bytes)
            push(now, "arrive", (d, Task("B", s, m)))
        elif task.kind == "B":
            if s > 0:
                deliver(Task("B", s - 1, m), d, now, stages[s - 1].send_bytes)
            if zb:
                pending_w[lane].append(m)
            elif split:
                push(now, "arrive", (d, Task("W", s, m)))
            else:
                stash[d] -= stages[s].activation_bytes
                last_bwd[lane] = max(last_bwd.get(lane, (0.0, 0.0)), (now, start))
        else:
            stash[d] -= stages[s].activation_bytes
            holding[lane] -= 1
            last_bwd[lane] = max(last_bwd.get(lane, (0.0, 0.0)), (now, start))
        dispatch(d, now)
    if done != total:
        stuck = {d: (orders[d][pos[d]] if orders and pos[d] < len(orders[d]) else None) for d in devices}
        raise ScheduleError(f"the {schedule} schedule deadlocked after {done} of {total} tasks; next tasks per "
                            f"device: {stuck}. The stage replicas or the micro-batch count do not fit this schedule")
    compute_end = max(busy_until.values())
    ar_end, ar_events = _allreduce(stages, cluster, last_bwd, bucket_bytes, stage_grad_profile)
    iteration = max(compute_end, ar_end)
    bubble = 1.0 - sum(busy_us.values()) / (len(devices) * iteration) if iteration > 0 else 0.0
    return ScheduleResult(schedule, n, iteration, min(1.0, max(0.0, bubble)),
                          {d: int(static_mem[d] + peak_stash[d]) for d in devices}, busy_us, ar_end,
                          tuple(sorted(events, key=lambda e: (e.start_us, e.device))), tuple(ar_events))


def _allreduce(stages: Sequence[Stage], cluster: Cluster, last_bwd: dict[tuple[int, int], tuple[float, float]],
               bucket_bytes: int | None,
               profile: Sequence[Sequence[tuple[float, int]]] | None) -> tuple[float, list]:
    end_all, out = 0.0, []
    for st in stages:
        if st.replicas <= 1 or st.param_bytes <= 0:
            continue
        ends = [last_bwd[(st.index, j)] for j in range(st.replicas) if (st.index, j) in last_bwd]
        span_start = max(e[1] for e in ends)
        span_end = max(e[0] for e in ends)
        buckets: list[tuple[float, int]] = []      # (fraction of the last backward done, bytes)
        ops = list(profile[st.index]) if profile is not None else []
        if bucket_bytes and ops:
            total_t = sum(t for t, _ in ops) or 1.0
            acc_t, acc_b = 0.0, 0
            for t, b in ops:
                acc_t += t
                acc_b += b
                if acc_b >= bucket_bytes:
                    buckets.append((acc_t / total_t, acc_b))
                    acc_b = 0
            if acc_b:
                buckets.append((1.0, acc_b))
        else:
            buckets = [(1.0, st.param_bytes)]
        ring_free = 0.0
        for frac, size in buckets:
            start = max(ring_free, span_start + frac * (span_end - span_start))
            ring_free = start + cluster.allreduce_us(size, st.devices)
            out.append((st.index, start, ring_free))
        end_all = max(end_all, ring_free)
    return end_all, out


def simulate_plan(plan: StagePlan, schedule: str | None = None, microbatches: int | None = None, *,
                  weight_grad_fraction: float = 0.5, bucket_bytes: int | None = None,
                  keep_events: bool = False) -> ScheduleResult:
    """Simulate a StagePlan (optionally under another schedule or micro-batch count)."""
    return simulate(plan.stages, plan.cluster, microbatches or plan.microbatches, schedule or plan.schedule,
                    weight_grad_fraction=weight_grad_fraction, bucket_bytes=bucket_bytes, keep_events=keep_events)
