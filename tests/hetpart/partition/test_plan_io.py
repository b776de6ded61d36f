"""Save a plan, load it, edit it by hand (JSON), re-simulate it; and the searches' simulation budget."""
from __future__ import annotations

import json
import warnings

import pytest

from hetpart.errors import DegeneratePlanWarning, InvalidPlanError, PinError, SchemaError
from hetpart.partition import partition
from hetpart.partition.common import Problem
from hetpart.partition.cp_greedy import default_budget
from hetpart.partition.synthetic import synthetic_problem
from hetpart.plan import Plan
from hetpart.simulate import simulate


def test_plan_json_round_trip_edit_and_resimulate(tmp_path):
    graph, costs = synthetic_problem("branchy", 40, 2, gpu_speedup_scale=0.2)
    plan = partition(graph, costs, "cp_greedy", {"pins": {"op3": "cpu"}})
    path = tmp_path / "plan.json"
    plan.save(path)
    loaded = Plan.load(path, graph)
    assert loaded == plan
    assert simulate(graph, costs, loaded).makespan_us == plan.makespan_us
    # a user moves one unpinned op to the other device by editing the JSON, then re-evaluates the plan
    data = json.loads(path.read_text())
    victim = next(i for i in range(graph.num_ops) if i != 3)
    data["device_of"][victim] = "gpu" if data["device_of"][victim] == "cpu" else "cpu"
    path.write_text(json.dumps(data))
    edited = Plan.load(path, graph)
    assert edited.device_of[victim] != plan.device_of[victim]
    assert edited.makespan_us == plan.makespan_us          # the stored number is stale until re-simulated
    timeline = simulate(graph, costs, edited)
    expected = simulate(graph, costs, plan.with_devices(edited.device_of))
    assert timeline.makespan_us == expected.makespan_us
    assert next(e.resource for e in timeline.op_events() if e.op_id == victim) == edited.device_of[victim]


def test_loading_an_edited_plan_that_breaks_a_pin_or_the_graph_fails(tmp_path):
    graph, costs = synthetic_problem("layered", 20, 1)
    plan = partition(graph, costs, "heft", {"pins": {"op0": "cpu"}})
    data = plan.to_dict()
    data["device_of"][0] = "gpu"
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PinError, match="op0"):
        Plan.load(path, graph)
    other, _ = synthetic_problem("layered", 21, 1)
    plan.save(path)
    with pytest.raises(InvalidPlanError, match="21"):
        Plan.load(path, other)
    path.write_text("{not json")
    with pytest.raises(SchemaError):
        Plan.load(path)


@pytest.mark.parametrize("n_ops", [1000, pytest.param(10_000, marks=pytest.mark.slow)])
@pytest.mark.parametrize("method", ["cp_greedy", "portfolio"])
def test_the_searches_stay_within_their_simulation_budget(method, n_ops):
    # planner times are reported by benchmarks/partition.py; here the deterministic bound on the work done
    graph, costs = synthetic_problem("layered", n_ops, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegeneratePlanWarning)
        plan = partition(graph, costs, method)
    assert plan.stats["budget"] == default_budget(Problem(graph, costs, None, method))
    assert 0 < plan.stats["evaluations"] <= plan.stats["budget"]


def test_a_saved_plan_resimulates_with_the_settings_it_was_made_with(tmp_path):
    graph, costs = synthetic_problem("layered", 30, 4, gpu_speedup_scale=0.2)
    plan = partition(graph, costs, "heft", {"simulation": {"serial_links": False}})
    plan.save(tmp_path / "plan.json")
    loaded = Plan.load(tmp_path / "plan.json", graph)
    assert simulate(graph, costs, loaded).makespan_us == plan.makespan_us
    from hetpart.simulate import SimulationConfig
    serial = simulate(graph, costs, loaded, SimulationConfig(serial_links=True)).makespan_us
    assert serial >= plan.makespan_us - 1e-9          # contention on the links can only delay
