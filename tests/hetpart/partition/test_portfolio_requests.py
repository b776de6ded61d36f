"""portfolio for many requests in flight and the task runtime's overhead per segment: the plan it returns is the
best of its candidates on the N-request simulation, never worse there than any baseline, and with neither option
it is the single-request search unchanged."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hetpart.partition import get_method
from hetpart.partition.request_score import score_plan
from hetpart.simulate_requests import RuntimeModel
from tests.hetpart.partition.dags import BASELINES, random_dag


def _score(graph, costs, plan, requests, overhead_us):
    runtime = RuntimeModel({name: overhead_us for name in costs.device_names}, copies="consumer")
    return score_plan(graph, costs, plan, requests, runtime=runtime)


@settings(max_examples=25, deadline=None)
@given(n_ops=st.integers(2, 9), dense=st.booleans(), seed=st.integers(0, 10_000),
       requests=st.sampled_from([1, 4, 16]), overhead_us=st.sampled_from([0.0, 30.0, 300.0]))
def test_never_worse_than_a_baseline_on_the_n_request_simulation(n_ops, dense, seed, requests, overhead_us):
    graph, costs = random_dag(n_ops, dense, seed)
    config = {"requests": requests, "dispatch_overhead_us_by_device": {n: overhead_us for n in costs.device_names}}
    plan = get_method("portfolio")(graph, costs, config)
    ours = _score(graph, costs, plan, requests, overhead_us)
    for method in BASELINES:
        baseline = _score(graph, costs, get_method(method)(graph, costs, config), requests, overhead_us)
        assert ours.makespan_us <= baseline.makespan_us * (1 + 1e-9), method
    objective = plan.stats["requests_objective"]
    assert objective["n_requests"] == requests
    assert objective["chosen_score"]["makespan_us"] == pytest.approx(ours.makespan_us)
    assert ours.makespan_us <= min(objective["makespans_us"].values()) * (1 + 1e-9)   # improved by request_search
    assert ours.makespan_us <= objective["single_request_best_score"]["makespan_us"] * (1 + 1e-9)


def test_without_requests_or_a_runtime_model_the_single_request_search_is_unchanged():
    graph, costs = random_dag(7, True, 3)
    plan = get_method("portfolio")(graph, costs, {})
    assert "requests_objective" not in plan.stats
    runtime = get_method("portfolio")(graph, costs, {"dispatch_overhead_us_by_device": {"cpu": 0.0, "gpu": 0.0}})
    assert runtime.stats["requests_objective"]["single_request_best"].endswith("+perturbation")


def test_a_large_overhead_per_segment_picks_a_plan_with_fewer_segments():
    """Found among the family: the single-request best alternates devices; 2 ms per segment makes that lose."""
    from hetpart.segments import segment_plan

    for seed in range(200):
        graph, costs = random_dag(8, False, seed)
        single = get_method("portfolio")(graph, costs, {})
        if len(segment_plan(graph, single)) >= 4:
            break
    else:
        pytest.fail("no random DAG gave a single-request plan of >= 4 segments")
    config = {"dispatch_overhead_us_by_device": {n: 2000.0 for n in costs.device_names}}
    planned = get_method("portfolio")(graph, costs, config)
    assert len(segment_plan(graph, planned)) < len(segment_plan(graph, single))
    assert _score(graph, costs, planned, 1, 2000.0).makespan_us < _score(graph, costs, single, 1, 2000.0).makespan_us
    assert planned.stats["requests_objective"]["chosen"] != planned.stats["requests_objective"]["single_request_best"]
    np.testing.assert_array_equal(get_method("portfolio")(graph, costs, {}).device_of, single.device_of)
