"""Why each op runs where it runs: per-op predicted times, copy costs, slack and the critical path.

Slack is computed on the simulated schedule's constraint graph: an op waits for the previous op on its
device, for its same-device producers and for the copies bringing other inputs; a copy waits for its
producer and (with serial links) for the previous copy on its link. A backward pass from the makespan gives
every op's latest finish time that does not delay the makespan; ``slack = latest finish - finish``.
Ops with zero slack form the critical path(s): making any of them faster or moving them can shorten the
makespan, while an op with slack S can be delayed by up to S without any effect.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from hetpart.costs import CostTable
from hetpart.graph import OpGraph
from hetpart.plan import Plan, resolve_pins
from hetpart.simulate import Schedule, SimModel, SimulationConfig, plan_simulation_config

CRITICAL_REL_TOL = 1e-9


def op_slack_us(model: SimModel, sched: Schedule) -> np.ndarray:
    """Slack of every op (µs) in a simulated schedule; 0 on the critical path."""
    n, dev, host = model.n, sched.device_of, model.host
    makespan = sched.makespan_us
    lf_op = [makespan] * n
    lf_copy = [makespan] * len(sched.copies)
    copy_index: dict[tuple[int, int], int] = {}
    copies_of: dict[int, list[int]] = {}
    prev_on_link: list[int] = [-1] * len(sched.copies)
    last_on_link: dict[tuple[int, int], int] = {}
    for c, (u, a, b, _cs, _ce) in enumerate(sched.copies):
        copy_index[(u, b)] = c
        copies_of.setdefault(u, []).append(c)
        if model.config.serial_links:
            prev_on_link[c] = last_on_link.get((a, b), -1)
            last_on_link[(a, b)] = c
    prev_on_device = [-1] * n
    last_on_device: dict[int, int] = {}
    for v in sched.order:
        prev_on_device[v] = last_on_device.get(dev[v], -1)
        last_on_device[dev[v]] = v
    sequence: list[tuple[bool, int]] = []
    for k in range(len(model.input_bytes)):            # model-input copies are issued first
        sequence += [(False, c) for c in copies_of.get(-1 - k, [])]
    for v in sched.order:
        sequence.append((True, v))
        sequence += [(False, c) for c in copies_of.get(v, [])]
    start, end = sched.start_us, sched.end_us
    for is_op, x in reversed(sequence):
        if is_op:
            latest_start = lf_op[x] - (end[x] - start[x])
            d = dev[x]
            p = prev_on_device[x]
            if p >= 0 and latest_start < lf_op[p]:
                lf_op[p] = latest_start
            for u in model.preds[x]:
                if dev[u] == d:
                    if latest_start < lf_op[u]:
                        lf_op[u] = latest_start
                else:
                    c = copy_index[(u, d)]
                    if latest_start < lf_copy[c]:
                        lf_copy[c] = latest_start
            if d != host:
                for k in model.op_inputs[x]:
                    c = copy_index[(-1 - k, d)]
                    if latest_start < lf_copy[c]:
                        lf_copy[c] = latest_start
        else:
            u, _a, _b, cs, ce = sched.copies[x]
            latest_start = lf_copy[x] - (ce - cs)
            if u >= 0 and latest_start < lf_op[u]:
                lf_op[u] = latest_start
            p = prev_on_link[x]
            if p >= 0 and latest_start < lf_copy[p]:
                lf_copy[p] = latest_start
    return np.maximum(np.array(lf_op) - np.array(end), 0.0) if n else np.zeros(0)


def critical_ops(model: SimModel, sched: Schedule) -> np.ndarray:
    """Boolean mask of ops with zero slack."""
    return op_slack_us(model, sched) <= CRITICAL_REL_TOL * max(sched.makespan_us, 1.0)


@dataclass(frozen=True)
class OpWhy:
    """One row of the per-op explanation of a plan."""

    op_id: int
    name: str
    op: str
    device: str
    latency_us: Mapping[str, float | None]   # predicted time on every device (None: cannot run there)
    copy_in_us: float                        # copies this op waits for (inputs produced on another device)
    copy_out_us: float                       # copies of its output to other devices (incl. output to host)
    start_us: float
    end_us: float
    slack_us: float
    on_critical_path: bool
    pinned: bool

    def to_dict(self) -> dict[str, Any]:
        return {"op_id": self.op_id, "name": self.name, "op": self.op, "device": self.device,
                "latency_us": dict(self.latency_us), "copy_in_us": self.copy_in_us,
                "copy_out_us": self.copy_out_us, "start_us": self.start_us, "end_us": self.end_us,
                "slack_us": self.slack_us, "on_critical_path": self.on_critical_path, "pinned": self.pinned}


def explain(graph: OpGraph, costs: CostTable, plan: Plan, config: SimulationConfig | None = None) -> list[OpWhy]:
    """Per-op rows: where it runs, what it would cost elsewhere, the copies it causes, its slack.
    Simulated with ``config``, else with the settings the plan was made with."""
    model = SimModel(graph, costs, config or plan_simulation_config(plan))
    sched = model.schedule_plan(plan)
    slack = op_slack_us(model, sched)
    tol = CRITICAL_REL_TOL * max(sched.makespan_us, 1.0)
    pinned = resolve_pins(graph, plan.pins, plan.devices)
    copy_in = [0.0] * model.n
    copy_out = [0.0] * model.n
    duration = {(u, b): ce - cs for (u, _a, b, cs, ce) in sched.copies}
    for (u, _a, _b, cs, ce) in sched.copies:
        if u >= 0:
            copy_out[u] += ce - cs
    for v in range(model.n):
        d = sched.device_of[v]
        for u in model.preds[v]:
            if sched.device_of[u] != d:
                copy_in[v] += duration[(u, d)]
        if d != model.host:
            copy_in[v] += sum(duration[(-1 - k, d)] for k in model.op_inputs[v])
    rows = []
    for node in graph.nodes:
        v = node.id
        rows.append(OpWhy(
            op_id=v, name=node.name, op=node.op, device=plan.device_of[v],
            latency_us={name: (float(costs.latency_us[v, k]) if costs.supported[v, k] else None)
                        for k, name in enumerate(costs.device_names)},
            copy_in_us=copy_in[v], copy_out_us=copy_out[v], start_us=sched.start_us[v], end_us=sched.end_us[v],
            slack_us=float(slack[v]), on_critical_path=bool(slack[v] <= tol), pinned=v in pinned))
    return rows
