"""The per-op "why": predicted times per device, copy costs, slack and the critical path (hand-computed)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hetpart.partition import explain, partition
from hetpart.partition.explain import op_slack_us
from hetpart.partition.synthetic import synthetic_problem
from hetpart.plan import Plan
from hetpart.simulate import SimModel


def test_parallel_branch_has_slack_and_the_long_branch_is_critical(make_tiny):
    # op0 on cpu 0-100 (critical); op1 on gpu waits for the input copy (0-60), runs 60-75, its output is
    # copied back 75-95 (10 + 10 bytes): it could finish as late as 80 without delaying the makespan of 100.
    graph, costs = make_tiny([(100, 90), (200, 15)], [], input_consumers=(0, 1), outputs=[(0, 5), (1, 10)])
    plan = Plan(("cpu", "gpu"), (0, 1), ("cpu", "gpu"), "hand", pins={"op1": "gpu"})
    rows = explain(graph, costs, plan)
    assert [r.device for r in rows] == ["cpu", "gpu"]
    assert rows[0].latency_us == {"cpu": 100.0, "gpu": 90.0}
    assert rows[0].on_critical_path and rows[0].slack_us == 0
    assert not rows[1].on_critical_path and rows[1].slack_us == pytest.approx(5.0)
    assert rows[1].copy_in_us == 60 and rows[1].copy_out_us == 20
    assert rows[1].pinned and not rows[0].pinned
    assert rows[1].to_dict()["latency_us"] == {"cpu": 200.0, "gpu": 15.0}


def test_slack_of_an_op_off_the_critical_path(make_tiny):
    # cpu: op0 (0-10) then op2 (10-110); gpu: op1 (60-70) reads the input copy (0-60); op3 on cpu needs
    # op2 and op1's copy (70-90 + nothing else): op3 starts 110. op1 may finish as late as 110-20 = 90.
    graph, costs = make_tiny([(10, 10), (500, 10), (100, 100), (5, 5)], [(0, 2, 10), (1, 3, 10), (2, 3, 10)],
                             input_consumers=(0, 1))
    plan = Plan(("cpu", "gpu", "cpu", "cpu"), (0, 1, 2, 3), ("cpu", "gpu"), "hand")
    rows = {r.op_id: r for r in explain(graph, costs, plan)}
    assert rows[1].start_us == 60 and rows[1].end_us == 70
    assert rows[1].slack_us == pytest.approx(20.0)
    assert [rows[i].on_critical_path for i in range(4)] == [True, False, True, True]
    assert rows[3].copy_in_us == 20.0


def test_unsupported_device_shows_none(make_tiny):
    graph, costs = make_tiny([(5, 1), (7, np.nan)], [(0, 1, 100)], supported=np.array([[True, True], [True, False]]))
    rows = explain(graph, costs, Plan(("cpu", "cpu"), (0, 1), ("cpu", "gpu"), "hand"))
    assert rows[1].latency_us == {"cpu": 7.0, "gpu": None}


@pytest.mark.filterwarnings("ignore::hetpart.errors.DegeneratePlanWarning")
@settings(max_examples=15, deadline=None)
@given(shape=st.sampled_from(["layered", "branchy", "series_parallel"]), n=st.integers(1, 40),
       seed=st.integers(0, 1000))
def test_critical_path_spans_the_makespan(shape, n, seed):
    graph, costs = synthetic_problem(shape, n, seed, gpu_speedup_scale=0.2)
    plan = partition(graph, costs, "heft")
    model = SimModel(graph, costs)
    sched = model.schedule_plan(plan)
    slack = op_slack_us(model, sched)
    assert (slack >= 0).all()
    critical = slack <= 1e-9 * sched.makespan_us
    assert critical.any()
    # delaying an op by less than its slack leaves the makespan unchanged (checked by slowing it down)
    v = int(np.argmax(slack))
    if slack[v] > 1e-6:
        lat = costs.latency_us.copy()
        d = costs.devices.index(plan.device_of[v])
        lat[v, d] += 0.5 * slack[v]
        slower = type(costs).from_arrays(lat, costs.devices, supported=costs.supported, graph=graph)
        assert SimModel(graph, slower).schedule_plan(plan).makespan_us == pytest.approx(sched.makespan_us)
