"""Every partitioner on random DAGs: valid plans, the simulator's makespan, exact methods agree, portfolio bounds."""
from __future__ import annotations

import warnings

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from hetpart.errors import DegeneratePlanWarning, InfeasibleError, InvalidPlanError, PinError
from hetpart.partition import METHODS, get_method, partition
from hetpart.partition.common import PartitionConfig, ProblemTooLargeError
from hetpart.partition.synthetic import synthetic_problem
from hetpart.simulate import simulate

BASELINES = ["all_cpu", "all_gpu", "greedy", "heft"]
HEURISTICS = BASELINES + ["cp_greedy", "portfolio"]
shapes = st.sampled_from(["layered", "branchy", "series_parallel"])


def solve_quietly(method, graph, costs, config=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegeneratePlanWarning)
        return get_method(method)(graph, costs, config)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=shapes, n=st.integers(1, 30), seed=st.integers(0, 10_000),
       unsupported=st.sampled_from([0.0, 0.3]), shape_only=st.sampled_from([0.0, 0.2]))
def test_every_method_returns_a_valid_plan_scored_by_the_simulator(shape, n, seed, unsupported, shape_only):
    graph, costs = synthetic_problem(shape, n, seed, gpu_unsupported_fraction=unsupported,
                                     shape_only_fraction=shape_only)
    plans = {m: solve_quietly(m, graph, costs, {"max_evaluations": 2000}) for m in HEURISTICS}
    for method, plan in plans.items():
        plan.validate(graph)
        assert plan.method == method
        assert all(costs.supported[i, costs.devices.index(d)] for i, d in enumerate(plan.device_of))
        timeline = simulate(graph, costs, plan).validate(graph)
        assert timeline.makespan_us == pytest.approx(plan.makespan_us, rel=1e-12)
    best_baseline = min(plans[m].makespan_us for m in BASELINES)
    port = plans["portfolio"]
    assert port.makespan_us <= best_baseline * (1 + 1e-12)
    assert port.makespan_us <= port.stats["start_makespan_us"] * (1 + 1e-12)
    assert port.stats["start_makespans_us"]["heft"] == pytest.approx(plans["heft"].makespan_us)
    cp = plans["cp_greedy"]                       # no baseline is a start of cp_greedy: only its own start bounds it
    assert cp.makespan_us <= cp.stats["start_makespan_us"] * (1 + 1e-12)
    assert "start_makespans_us" not in cp.stats
    # the ORT-like baseline keeps shape-only ops and GPU-unsupported ops on the CPU, everything else on the GPU
    for node in graph.nodes:
        on_gpu = costs.supported[node.id, 1] and not node.shape_only
        assert plans["greedy"].device_of[node.id] == ("gpu" if on_gpu else "cpu")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=shapes, n=st.integers(1, 6), seed=st.integers(0, 10_000), serial=st.booleans())
@example(shape="layered", n=6, seed=27, serial=False)   # HiGHS "Solve error" at the first horizon, both presolves
def test_milp_equals_exhaustive_on_tiny_graphs(shape, n, seed, serial):
    graph, costs = synthetic_problem(shape, n, seed, gpu_unsupported_fraction=0.2)
    config = PartitionConfig(simulation={"serial_links": serial}, time_limit_s=30)
    exact = solve_quietly("exhaustive", graph, costs, config)
    milp = solve_quietly("milp", graph, costs, config)
    assert milp.stats["proven_optimal"]
    assert milp.makespan_us == pytest.approx(exact.makespan_us, rel=1e-6)
    assert milp.stats["milp_objective_us"] == pytest.approx(exact.makespan_us, rel=1e-6)
    assert milp.stats["lower_bound_us"] <= exact.makespan_us * (1 + 1e-6)
    for method in ("cp_greedy", "portfolio"):
        assert solve_quietly(method, graph, costs, config).makespan_us >= exact.makespan_us * (1 - 1e-9)


def test_milp_reports_its_gap_and_beats_or_matches_the_heuristics():
    graph, costs = synthetic_problem("branchy", 12, 3)
    plan = solve_quietly("milp", graph, costs, {"time_limit_s": 30})
    assert plan.stats["proven_optimal"] and plan.stats["gap"] < 1e-6
    assert plan.makespan_us <= plan.stats["incumbent_makespan_us"] * (1 + 1e-9)
    for method in ("cp_greedy", "portfolio"):
        assert plan.makespan_us <= solve_quietly(method, graph, costs).makespan_us * (1 + 1e-9)


def test_exact_methods_refuse_graphs_beyond_their_limits():
    graph, costs = synthetic_problem("layered", 30, 0)
    with pytest.raises(ProblemTooLargeError, match="exhaustive_max_schedules"):
        solve_quietly("exhaustive", graph, costs)
    with pytest.raises(ProblemTooLargeError, match="milp_max_ops=10"):
        solve_quietly("milp", graph, costs, {"milp_max_ops": 10})
    assert issubclass(ProblemTooLargeError, InfeasibleError)


@pytest.mark.parametrize("method", HEURISTICS + ["milp", "exhaustive"])
def test_pins_are_respected_by_every_method(method):
    graph, costs = synthetic_problem("branchy", 6, 5)
    pins = {"op0": "cpu", "op[45]": "gpu"}
    plan = solve_quietly(method, graph, costs, {"pins": pins})
    assert plan.device_of[0] == "cpu" and plan.device_of[4] == "gpu" and plan.device_of[5] == "gpu"
    assert plan.pins == pins
    plan.validate(graph)                          # re-checks the pins


def test_a_pin_to_a_device_that_cannot_run_the_op_is_an_error(make_tiny):
    import numpy as np
    graph, costs = make_tiny([(5, 1), (7, np.nan)], [(0, 1, 100)],
                             supported=np.array([[True, True], [True, False]]))
    with pytest.raises(PinError, match="op1.*cannot run it"):
        solve_quietly("cp_greedy", graph, costs, {"pins": {"op1": "gpu"}})
    with pytest.raises(PinError, match="names no op"):
        solve_quietly("heft", graph, costs, {"pins": {"conv9": "gpu"}})


@pytest.mark.parametrize("method", HEURISTICS)
def test_methods_are_deterministic(method):
    graph, costs = synthetic_problem("series_parallel", 60, 9)
    a, b = solve_quietly(method, graph, costs), solve_quietly(method, graph, costs)
    assert a.device_of == b.device_of and a.order == b.order and a.makespan_us == b.makespan_us


def test_degenerate_plan_is_noted_and_warned(make_tiny):
    graph, costs = make_tiny([(50, 1), (70, 1)], [(0, 1, 100)], outputs=[(1, 4)])
    with pytest.warns(DegeneratePlanWarning, match="all 2 ops on 'gpu'"):
        plan = partition(graph, costs, "greedy")
    assert any("degenerate" in note for note in plan.notes)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DegeneratePlanWarning)
        partition(graph, costs, "all_gpu")        # a single-device baseline is single-device on purpose


@pytest.mark.parametrize("method", ["cp_greedy", "portfolio"])
def test_searches_avoid_a_device_whose_memory_would_overflow(make_tiny, method):
    # everything is faster on the GPU, but both ops' parameters do not fit there together
    graph, costs = make_tiny([(50, 1), (70, 2), (60, 1)], [(0, 1, 10), (1, 2, 10)], param_bytes=[400, 400, 0],
                             memory_bytes=(1 << 20, 700))
    with pytest.raises(InfeasibleError):
        solve_quietly("all_gpu", graph, costs)
    plan = solve_quietly(method, graph, costs)
    simulate(graph, costs, plan)
    assert plan.device_of.count("gpu") >= 1 and plan.device_of[:2] != ("gpu", "gpu")


def test_unknown_method_and_option_are_typed_errors():
    graph, costs = synthetic_problem("layered", 4, 0)
    with pytest.raises(InvalidPlanError, match="unknown partitioning method 'magic'.*cp_greedy"):
        get_method("magic")
    with pytest.raises(InvalidPlanError, match="unknown partition options"):
        partition(graph, costs, "heft", {"tim_limit": 3})
    assert set(METHODS) == {"all_cpu", "all_gpu", "greedy", "heft", "cp_greedy", "portfolio", "milp", "exhaustive",
                            "timeslice"}


def test_three_devices_work_end_to_end():
    import numpy as np
    from hetpart.costs import CostTable
    from hetpart.devices import DeviceSet, Link, cpu_device, gpu_from_preset
    graph, two = synthetic_problem("branchy", 5, 4, gpu_speedup_scale=0.2)
    names = ("cpu", "gpu", "gpu2")
    devices = DeviceSet((cpu_device(), gpu_from_preset("t4"), gpu_from_preset("p2200", name="gpu2")),
                        tuple(Link(a, b, 8e9, 10.0) for a in names for b in names if a != b)).validate()
    lat = np.column_stack([two.latency_us, two.latency_us[:, 1] * 1.5])
    costs = CostTable.from_arrays(lat, devices, graph=graph)
    exact = solve_quietly("exhaustive", graph, costs)
    milp = solve_quietly("milp", graph, costs)
    assert milp.makespan_us == pytest.approx(exact.makespan_us, rel=1e-6)
    for method in HEURISTICS:
        plan = solve_quietly(method, graph, costs)
        simulate(graph, costs, plan).validate(graph)
        assert set(plan.device_of) <= set(names)
    for method in ("cp_greedy", "portfolio"):
        assert solve_quietly(method, graph, costs).makespan_us >= exact.makespan_us * (1 - 1e-9)
