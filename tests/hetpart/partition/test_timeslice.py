"""The time-slice pipeline scheduler: never worse than its baselines, exact on tiny grids, typed errors."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hetpart.costs import CostTable
from hetpart.devices import DeviceSet, Link, cpu_device, gpu_from_preset
from hetpart.errors import DegeneratePlanWarning, InvalidPlanError, UsageError
from hetpart.graph import OpGraph
from hetpart.partition import get_method, partition
from hetpart.partition.common import PartitionConfig, Problem
from hetpart.partition.request_balance import simulate_request_balance, two_device_limit_per_s
from hetpart.partition.request_score import score_plan
from hetpart.partition.slices import NoRnnTagsError, build_slice_grid
from hetpart.partition.synthetic import synthetic_problem
from hetpart.partition.timeslice import EXACT_CUTS, _Candidates, enumerate_cuts, slice_segmentation
from hetpart.plan import Plan
from hetpart.segments import segment_plan
from hetpart.simulate_requests import RuntimeModel

from .rnn_graphs import synthetic_rnn

FAST = {"max_evaluations": 150, "perturbations": 2}


def _solve(graph: OpGraph, costs: CostTable, method: str, config: dict) -> Plan:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegeneratePlanWarning)
        return partition(graph, costs, method, config)


def _baselines(graph: OpGraph, costs: CostTable, config: dict) -> dict[str, float]:
    runtime = RuntimeModel(config.get("dispatch_overhead_us_by_device", {}), copies="consumer")
    return {method: score_plan(graph, costs, _solve(graph, costs, method, config), config["requests"],
                               runtime=runtime).makespan_us
            for method in ("all_cpu", "all_gpu", "cp_greedy")}


def _chosen(plan: Plan) -> float:
    return plan.stats["chosen"]["makespan_us"]


@settings(max_examples=40, deadline=None)
@given(layers=st.integers(1, 3), steps=st.integers(2, 5), requests=st.integers(1, 12),
       slice_steps=st.integers(1, 3), speedup=st.floats(0.4, 8.0), seed=st.integers(0, 10_000),
       projection=st.sampled_from(["per_slice", "hoisted"]), bidirectional=st.booleans(),
       overhead_us=st.sampled_from([0.0, 40.0]), segments=st.sampled_from(["runtime", "slices"]))
def test_never_worse_than_single_devices_and_cp_greedy(layers, steps, requests, slice_steps, speedup, seed,
                                                        projection, bidirectional, overhead_us, segments):
    graph, costs = synthetic_rnn(layers, steps, projection=projection, projection_steps=slice_steps, seed=seed,
                                 gpu_speedup=speedup, bidirectional=(0,) if bidirectional else ())
    config = {**FAST, "requests": requests, "slice_steps": slice_steps, "timeslice_segments": segments,
              "dispatch_overhead_us_by_device": {"cpu": overhead_us, "gpu": overhead_us}}
    plan = _solve(graph, costs, "timeslice", config)
    runtime = RuntimeModel(config["dispatch_overhead_us_by_device"], copies="consumer")
    per_task = plan.stats["segments"] == "slices"
    segmentation = slice_segmentation(graph, plan, build_slice_grid(graph, slice_steps)) if per_task else None
    assert score_plan(graph, costs, plan, requests, runtime=runtime,
                      segmentation=segmentation).makespan_us == pytest.approx(_chosen(plan))
    for method, makespan_us in _baselines(graph, costs, config).items():
        assert _chosen(plan) <= makespan_us * (1 + 1e-9), method
        assert plan.stats["baselines"][{"all_cpu": "all_cpu", "all_gpu": "all_gpu"}.get(method, method)][
            "makespan_us"] == pytest.approx(makespan_us)


@pytest.mark.parametrize("layers,steps,kwargs", [
    (1, 5, {}), (2, 4, {}), (3, 2, {}), (2, 4, {"projection": "hoisted"}), (2, 3, {"bidirectional": (0, 1)}),
])
@pytest.mark.parametrize("requests", [1, 6])
def test_best_cut_is_the_exhaustive_optimum_on_tiny_grids(layers, steps, kwargs, requests):
    graph, costs = synthetic_rnn(layers, steps, seed=layers * 10 + steps, gpu_speedup=2.5, **kwargs)
    config = {**FAST, "requests": requests}
    plan = _solve(graph, costs, "timeslice", config)
    problem = Problem(graph, costs, config, "timeslice")
    grid = build_slice_grid(graph, 1)
    cands = _Candidates(problem, grid)
    cuts, stride = enumerate_cuts(grid)
    assert stride == 1 and len(cuts) <= EXACT_CUTS
    scores = {(first, tuple(cut)): cands.score(cands.assignment(cut, first), cands.order).makespan_us
              for first in (0, 1) for cut in cuts}
    assert plan.stats["best_cut"]["makespan_us"] == pytest.approx(min(scores.values()))
    assert _chosen(plan) <= min(scores.values()) * (1 + 1e-9)
    # the published criterion: the smallest |T_first - T_second| over every cut and order
    imbalance = min(float(cands.screen(cuts, first)[1].min()) for first in (0, 1))
    assert plan.stats["published_criterion"]["imbalance_us"] == pytest.approx(imbalance)


@pytest.mark.parametrize("layers,steps,requests,overhead_us,seed", [(2, 11, 8, 0.0, 2), (3, 6, 16, 40.0, 5)])
def test_screening_finds_the_exhaustive_optimum_beyond_exact_cuts(layers, steps, requests, overhead_us, seed):
    graph, costs = synthetic_rnn(layers, steps, seed=seed, gpu_speedup=1 + seed % 4)
    config = {**FAST, "requests": requests, "dispatch_overhead_us_by_device": {"cpu": overhead_us, "gpu": overhead_us}}
    plan = _solve(graph, costs, "timeslice", config)
    problem = Problem(graph, costs, config, "timeslice")
    grid = build_slice_grid(graph, 1)
    cands = _Candidates(problem, grid)
    cuts, _ = enumerate_cuts(grid)
    assert len(cuts) > EXACT_CUTS
    best = min(cands.score(cands.assignment(cut, first), cands.order).makespan_us for first in (0, 1) for cut in cuts)
    assert plan.stats["best_cut"]["makespan_us"] == pytest.approx(best)
    assert plan.stats["simulated"] < len(cuts)


def test_plan_runs_each_device_in_slice_then_layer_order_and_records_its_choice():
    graph, costs = synthetic_rnn(2, 6, seed=3, gpu_speedup=1.2)
    overhead = {"dispatch_overhead_us_by_device": {"cpu": 50.0, "gpu": 50.0}}     # interleaving op by op costs
    plan = _solve(graph, costs, "timeslice", {**FAST, "requests": 16, "slice_steps": 2, **overhead})
    stats = plan.stats
    assert plan.method == "timeslice" and plan.config["requests"] == 16 and plan.config["slice_steps"] == 2
    assert stats["grid"]["slices"] == [3, 3] and stats["cuts_per_order"] == math.comb(3 + 2, 2)
    assert {"chosen", "best_cut", "published_criterion", "baselines", "shortlist"} <= set(stats)
    assert stats["chosen"]["candidate"] == "cut", stats["chosen"]
    grid = build_slice_grid(graph, 2)
    keys = [(grid.tasks[grid.task_of[op]].slice, grid.tasks[grid.task_of[op]].layer) for op in plan.order]
    assert keys == sorted(keys)
    inside = grid.members(stats["chosen"]["cut"])
    first = stats["chosen"]["first_device"]
    assert all((plan.device_of[op] == first) == inside[grid.task_of[op]] for op in range(graph.num_ops))
    segments = segment_plan(graph, plan)
    assert len(segments.segments) == 2                  # data flows one way: one segment per device and request
    assert plan.notes and plan.notes[0].startswith("timeslice: chose")


def test_many_requests_pipeline_across_devices_near_the_two_device_limit():
    graph, costs = synthetic_rnn(2, 8, seed=1, gpu_speedup=1.0, post=False, pre=False)
    n = 32
    plan = _solve(graph, costs, "timeslice", {**FAST, "requests": n})
    balance = simulate_request_balance(graph, costs, n_requests=n, runtime=RuntimeModel(copies="consumer"))
    limit = two_device_limit_per_s(balance.services)
    assert n / (_chosen(plan) * 1e-6) >= 0.9 * limit
    # (its p99 latency is not always below request balancing's: the runtime's copies take the workers' time, and
    # on two equal devices whole requests need fewer copies than a layer cut)


def test_per_task_segments_overlap_the_devices_within_one_request():
    graph, costs = synthetic_rnn(2, 8, seed=1, gpu_speedup=1.0)
    runtime_plan = _solve(graph, costs, "timeslice", {**FAST, "requests": 1})
    plan = _solve(graph, costs, "timeslice", {**FAST, "requests": 1, "timeslice_segments": "slices"})
    assert plan.stats["segments"] == "slices" and plan.stats["chosen"]["kind"] != "empty"
    best_single = min(plan.stats["baselines"][m]["makespan_us"] for m in ("all_cpu", "all_gpu"))
    assert _chosen(plan) < 0.8 * best_single                       # a wavefront inside one request
    assert _chosen(runtime_plan) >= best_single * (1 - 1e-9)       # two whole segments cannot overlap
    grid = build_slice_grid(graph, 1)
    segmentation = slice_segmentation(graph, plan, grid)
    assert len(segmentation.segments) == len(grid.tasks)
    keys = [(grid.tasks[grid.task_of[s.op_ids[0]]].slice, grid.tasks[grid.task_of[s.op_ids[0]]].layer)
            for s in segmentation.segments]
    assert keys == sorted(keys)                                    # worker priority: (request, slice, layer)
    segmentation.validate(graph, plan)


def test_typed_errors():
    graph, costs = synthetic_problem("layered", 6, 0)
    with pytest.raises(NoRnnTagsError, match="Plan this model with another method"):
        get_method("timeslice")(graph, costs, None)
    with pytest.raises(InvalidPlanError, match="requests must be a positive integer"):
        PartitionConfig(requests=0)
    with pytest.raises(InvalidPlanError, match="slice_steps"):
        PartitionConfig.coerce({"slice_steps": 1.5})
    with pytest.raises(InvalidPlanError, match="dispatch_overhead"):
        PartitionConfig(dispatch_overhead_us_by_device={"cpu": -1})
    with pytest.raises(InvalidPlanError, match="timeslice_segments"):
        PartitionConfig(timeslice_segments="tasks")
    rnn, two = synthetic_rnn(1, 3)
    names = ("cpu", "gpu", "gpu2")
    devices = DeviceSet((cpu_device(), gpu_from_preset("t4"), gpu_from_preset("t4", "gpu2")),
                        tuple(Link(a, b, 1e9, 10.0) for a in names for b in names if a != b))
    three = CostTable.from_arrays(np.concatenate([two.latency_us, two.latency_us[:, 1:]], axis=1), devices,
                                  graph=rnn, source="analytic")
    with pytest.raises(UsageError, match="exactly two devices"):
        partition(rnn, three, "timeslice", None)


def test_request_balance_sends_each_request_to_the_device_that_frees_first(make_tiny):
    graph, costs = make_tiny([(100.0, 30.0)], input_bytes=50)       # gpu: 60 us input copy + 30 us
    timeline = simulate_request_balance(graph, costs, n_requests=4)
    assert [s.latency_us for s in timeline.services] == [100.0, 90.0]
    assert timeline.device_of_request == ("gpu", "cpu", "gpu", "cpu")
    assert timeline.completed_us == (90.0, 100.0, 180.0, 200.0) and timeline.makespan_us == 200.0
    closed = simulate_request_balance(graph, costs, n_requests=4, max_in_flight=2)
    assert closed.admitted_us == (0.0, 0.0, 90.0, 100.0) and closed.latency_us == (90.0, 100.0, 90.0, 100.0)
    assert two_device_limit_per_s(timeline.services) == pytest.approx(1e6 / 100 + 1e6 / 90)
    with pytest.raises(UsageError):
        simulate_request_balance(graph, costs, n_requests=2, max_in_flight=3)


def test_request_balance_holds_the_gpu_worker_for_the_output_copy_the_runtime_makes(make_tiny):
    # gpu: the 50-byte input copied in (60 us), 30 us, the 4-byte output copied back (14 us)
    graph, costs = make_tiny([(100.0, 30.0)], input_bytes=50, outputs=[(0, 4)])
    consumer = simulate_request_balance(graph, costs, n_requests=1, runtime=RuntimeModel(copies="consumer"))
    assert [(s.latency_us, s.busy_us) for s in consumer.services] == [(100.0, 100.0), (104.0, 104.0)]
    links = simulate_request_balance(graph, costs, n_requests=1, runtime=RuntimeModel(copies="links"))
    assert [(s.latency_us, s.busy_us) for s in links.services] == [(100.0, 100.0), (104.0, 90.0)]


@pytest.mark.tvm
@pytest.mark.parametrize("model", ["lstm_lm", "gru_lm"])
def test_zoo_rnn_with_predicted_costs(model, zoo_rnn_graph):
    from pathlib import Path

    from hetpart.driver.device_choice import parse_devices
    from predictors.analytic import AnalyticGpuModel
    from predictors.costs import build_cost_table
    from predictors.registry import load_cpu_predictor

    graph = zoo_rnn_graph(model, 4, 1)
    repo = Path(__file__).resolve().parents[3]
    cpu = load_cpu_predictor(repo / "predictors" / "data" / "cpu_default.json", scale_to_host=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        costs = build_cost_table(graph, {"cpu": cpu, "gpu": AnalyticGpuModel("t4")},
                                 parse_devices("cpu,gpu=t4").devices)
    for requests in (1, 8):
        config = {**FAST, "requests": requests}
        plan = _solve(graph, costs, "timeslice", config)
        assert plan.stats["grid"]["slices"] == [4, 4]
        for method, makespan_us in _baselines(graph, costs, config).items():
            assert _chosen(plan) <= makespan_us * (1 + 1e-9), method


def test_compile_command_takes_the_timeslice_options():
    from hetpart.driver.cli import build_parser

    args = build_parser().parse_args(["compile", "lstm_lm", "--method", "timeslice", "--requests", "16",
                                      "--slice-steps", "2", "--rnn-projection", "per_slice"])
    assert (args.method, args.requests, args.slice_steps, args.rnn_projection) == ("timeslice", 16, 2, "per_slice")
    defaults = build_parser().parse_args(["compile", "lstm_lm"])
    assert (defaults.requests, defaults.slice_steps, defaults.rnn_projection) == (None, None, None)


@settings(max_examples=25, deadline=None)
@given(layers=st.integers(1, 3), steps=st.integers(2, 6), requests=st.integers(3, 16), speedup=st.floats(0.4, 8.0),
       seed=st.integers(0, 10_000), overhead_us=st.sampled_from([0.0, 40.0]),
       segments=st.sampled_from(["runtime", "slices"]))
def test_with_cross_device_sharing_never_worse_than_baselines_and_within_the_robust_tolerance(
        layers, steps, requests, speedup, seed, overhead_us, segments):
    """Planned for cross-device sharing: the plan's N-request makespan (with sharing) is no worse than any baseline
    plan's with sharing, within ROBUST_TOL of the best candidate, and where it traded some of it for few requests in
    flight, it is the best of the near candidates with two in flight."""
    from hetpart.partition.timeslice import ROBUST_TOL

    graph, costs = synthetic_rnn(layers, steps, seed=seed, gpu_speedup=speedup)
    overheads = {"cpu": overhead_us, "gpu": overhead_us}
    config = {**FAST, "requests": requests, "dispatch_overhead_us_by_device": overheads, "cross_device_sharing": True,
              "timeslice_segments": segments}
    plan = _solve(graph, costs, "timeslice", config)
    runtime = RuntimeModel(overheads, copies="consumer", cross_device_sharing=True)
    per_task = plan.stats["segments"] == "slices"
    segmentation = slice_segmentation(graph, plan, build_slice_grid(graph, 1)) if per_task else None
    assert score_plan(graph, costs, plan, requests, runtime=runtime,
                      segmentation=segmentation).makespan_us == pytest.approx(_chosen(plan))
    for method in ("all_cpu", "all_gpu", "cp_greedy"):
        assert _chosen(plan) <= plan.stats["baselines"][method]["makespan_us"] * (1 + 1e-9), method
    best = min(c["makespan_us"] for c in plan.stats["candidates"])
    assert _chosen(plan) <= best * (1 + ROBUST_TOL) + 1e-6
    few = plan.stats.get("few_in_flight")
    if few:
        two = score_plan(graph, costs, plan, requests, runtime=runtime, max_in_flight=2,
                         segmentation=segmentation).makespan_us
        assert two == pytest.approx(few["makespan_us"]) and few["compared"] >= 2


def test_a_plan_for_cross_device_sharing_holds_with_two_requests_in_flight():
    """Two equal devices: with sharing, whole requests on one device and the other taking them beats any cut; with two
    requests in flight the guard stops a device with work of its own from taking, so the plan leaves one device
    without work in the plan."""
    graph, costs = synthetic_rnn(1, 8, seed=3, gpu_speedup=1.0, post=False, pre=False)
    config = {**FAST, "requests": 16, "dispatch_overhead_us_by_device": {"cpu": 20.0, "gpu": 20.0},
              "cross_device_sharing": True}
    plan = _solve(graph, costs, "timeslice", config)
    runtime = RuntimeModel(config["dispatch_overhead_us_by_device"], copies="consumer", cross_device_sharing=True)
    static = _solve(graph, costs, "timeslice", {**config, "cross_device_sharing": False})
    assert len(set(plan.device_of)) == 1 and plan.stats["few_in_flight"]["compared"] >= 2
    two = score_plan(graph, costs, plan, 16, runtime=runtime, max_in_flight=2).makespan_us
    assert two <= score_plan(graph, costs, static, 16, runtime=runtime, max_in_flight=2).makespan_us * (1 + 1e-9)
    assert _chosen(plan) <= score_plan(graph, costs, static, 16, runtime=runtime).makespan_us * (1 + 1e-9)
