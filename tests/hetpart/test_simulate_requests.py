"""The task runtime's simulator with copies on the links (``RuntimeModel(copies="links")``; the copies the runtime
makes itself are tested in test_simulate_requests_consumer.py): hand-computed timelines (copy = 10 us + 1 us per
byte, see conftest), its relation to hetpart.simulate, and dependency/resource invariants on random plans with many
requests."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hetpart.costs import CostTable
from hetpart.devices import DeviceSet, DeviceSpec, Link
from hetpart.errors import InvalidPlanError, SchemaError, UsageError
from hetpart.plan import Plan
from hetpart.segments import segment_plan
from hetpart.simulate import SimModel, SimulationConfig, simulate
from hetpart.simulate_requests import RequestsTimeline, RuntimeModel, steady_state_period_us
from hetpart.simulate_requests import simulate_requests as _simulate_requests
from tests.hetpart.test_segments import random_problem
from tests.hetpart.test_simulate import plan_of
from tests.scaling import cpu_time_growth

LINKS = RuntimeModel(copies="links")
FIXED = RuntimeModel(worker_policy="fixed_order", copies="links")
TOL = 1e-6


def simulate_requests(*args, **kwargs) -> RequestsTimeline:
    """hetpart's, with this file's runtime model (copies on the links) unless another is given."""
    kwargs.setdefault("runtime", LINKS)
    return _simulate_requests(*args, **kwargs)


def spans(tl: RequestsTimeline, request: int = 0) -> dict:
    out = {}
    for e in tl.events_of(request):
        key = ("seg", e.segment_id) if e.kind == "segment" else ("copy", e.op_id, e.resource)
        out[key] = (e.start_us, e.end_us)
    return out


def two_device_chain(make_tiny, cpu_us: float, gpu_us: float):
    """op0 on the cpu -> 10 bytes -> op1 on the gpu, whose 5-byte output is copied back (copies 20 and 15 us)."""
    graph, costs = make_tiny([(cpu_us, 999), (999, gpu_us)], [(0, 1, 10)], outputs=[(1, 5)])
    return graph, costs, plan_of(["cpu", "gpu"])


# ---------------------------------------------------------------------- hand-computed cases
def test_one_request_on_a_two_device_chain(make_tiny):
    graph, costs, plan = two_device_chain(make_tiny, 100, 50)
    tl = simulate_requests(graph, costs, plan).validate()
    assert spans(tl) == {("seg", 0): (0, 100), ("copy", 0, "cpu->gpu"): (100, 120), ("seg", 1): (120, 170),
                         ("copy", 1, "gpu->cpu"): (170, 185)}
    assert tl.latency_us == (185,) and tl.makespan_us == 185 and tl.period_us == 185
    assert [e.size_bytes for e in tl.events if e.kind == "copy"] == [10, 5]
    assert tl.makespan_us == simulate(graph, costs, plan).makespan_us


def test_a_model_input_read_on_the_gpu_is_copied_when_the_request_is_admitted(make_tiny):
    graph, costs = make_tiny([(999, 30), (100, 999)], [], input_consumers=(0, 1), outputs=[(0, 4), (1, 4)])
    tl = simulate_requests(graph, costs, plan_of(["gpu", "cpu"])).validate()
    assert spans(tl) == {("copy", -1, "cpu->gpu"): (0, 60), ("seg", 0): (60, 90), ("seg", 1): (0, 100),
                         ("copy", 0, "gpu->cpu"): (90, 104)}
    assert tl.makespan_us == 104


@pytest.mark.parametrize("cpu_us, gpu_us, completions", [
    (100, 50, (185, 285, 385, 485)),   # the cpu is the bottleneck: one request every 100 us
    (30, 80, (145, 225, 305, 385)),    # the gpu is the bottleneck: one request every 80 us
])
def test_requests_pipeline_across_a_two_device_chain(make_tiny, cpu_us, gpu_us, completions):
    graph, costs, plan = two_device_chain(make_tiny, cpu_us, gpu_us)
    tl = simulate_requests(graph, costs, plan, n_requests=4).validate()
    assert tl.completed_us == completions and tl.admitted_us == (0, 0, 0, 0)
    assert tl.period_us == max(cpu_us, gpu_us) and tl.makespan_us == completions[-1]
    assert tl.latency_us[0] == simulate(graph, costs, plan).makespan_us


def test_max_in_flight_one_runs_requests_back_to_back(make_tiny):
    graph, costs, plan = two_device_chain(make_tiny, 100, 50)
    single = simulate_requests(graph, costs, plan).makespan_us
    tl = simulate_requests(graph, costs, plan, n_requests=3, max_in_flight=1).validate()
    assert tl.makespan_us == 3 * single
    assert tl.admitted_us == (0, 185, 370) and tl.latency_us == (single,) * 3


def test_a_request_is_admitted_when_a_slot_frees(make_tiny):
    graph, costs, plan = two_device_chain(make_tiny, 30, 80)
    tl = simulate_requests(graph, costs, plan, n_requests=4, max_in_flight=2).validate()
    assert tl.admitted_us == (0, 0, 145, 225)          # the completions of requests 0 and 1
    assert tl.completed_us == (145, 225, 305, 385)     # two in flight already keep the gpu busy


def test_dispatch_overhead_is_added_once_per_segment(make_tiny):
    graph, costs, plan = two_device_chain(make_tiny, 100, 50)
    runtime = RuntimeModel({"cpu": 7.0, "gpu": 3.0}, copies="links")
    tl = simulate_requests(graph, costs, plan, runtime=runtime).validate()
    assert spans(tl) == {("seg", 0): (0, 107), ("copy", 0, "cpu->gpu"): (107, 127), ("seg", 1): (127, 180),
                         ("copy", 1, "gpu->cpu"): (180, 195)}
    chain, chain_costs = make_tiny([(10, 1), (20, 1), (30, 1)], [(0, 1, 4), (1, 2, 4)])
    merged = simulate_requests(chain, chain_costs, plan_of(["cpu"] * 3), n_requests=2, runtime=runtime)
    assert merged.completed_us == (67, 134)            # one segment: 60 us of kernels + 7 us, not 3 x 7 us
    alone = segment_plan(chain, plan_of(["cpu"] * 3), merge=False)
    assert simulate_requests(chain, chain_costs, plan_of(["cpu"] * 3), runtime=runtime,
                             segmentation=alone).makespan_us == 81


def test_admission_and_completion_add_to_every_latency_without_occupying_a_worker(make_tiny):
    graph, costs, plan = two_device_chain(make_tiny, 100, 50)           # alone: 185 us, the cpu busy 0-100
    runtime = RuntimeModel(admission_us=30, completion_us=12, copies="links")
    tl = simulate_requests(graph, costs, plan, runtime=runtime).validate()
    assert spans(tl)[("seg", 0)] == (30, 130) and tl.latency_us == (30 + 185 + 12,)
    back_to_back = simulate_requests(graph, costs, plan, n_requests=3, max_in_flight=1, runtime=runtime).validate()
    assert back_to_back.admitted_us == (0, 227, 454) and back_to_back.makespan_us == 3 * 227
    at_once = simulate_requests(graph, costs, plan, n_requests=3, runtime=runtime).validate()
    # admitted together, each may start 30 us later; the cpu then runs them back to back (the workers are free
    # while a request is admitted or completed), so the last completes 12 us after its copy back ends
    assert at_once.admitted_us == (0, 0, 0)
    assert at_once.completed_us == (227, 327, 427)
    with pytest.raises(UsageError, match="admission_us must be finite and >= 0"):
        RuntimeModel(admission_us=-1).validate()
    with pytest.raises(UsageError, match="completion_us must be a number"):
        RuntimeModel(completion_us="soon")
    assert RuntimeModel.from_dict(runtime.to_dict()) == runtime
    written_before = {k: v for k, v in runtime.to_dict().items() if k not in ("admission_us", "completion_us")}
    assert RuntimeModel.from_dict(written_before) == RuntimeModel(copies="links")


def test_a_free_worker_takes_a_later_request_while_an_earlier_one_waits(make_tiny):
    # A (cpu 30) -> B (gpu 50) -> C (cpu 20), 10-byte edges (20 us copies), two requests
    graph, costs = make_tiny([(30, 999), (999, 50), (20, 999)], [(0, 1, 10), (1, 2, 10)])
    plan = plan_of(["cpu", "gpu", "cpu"])
    tl = simulate_requests(graph, costs, plan, n_requests=2).validate()
    assert spans(tl, 1)[("seg", 0)] == (30, 60)        # A of request 1 runs while request 0 is on the gpu
    assert tl.completed_us == (140, 190)
    fixed = simulate_requests(graph, costs, plan, n_requests=2, runtime=FIXED).validate()
    assert spans(fixed, 1)[("seg", 0)] == (140, 170)   # strictly A0, C0, A1, C1 on the cpu
    assert fixed.completed_us == (140, 280)


def test_one_op_per_segment_backfills_where_simulate_keeps_the_issue_order(make_tiny):
    # op0 (gpu) reads x (copy 0-60), runs 60-110; its output reaches op1 (cpu) at 130; op2 (cpu) reads only x
    graph, costs = make_tiny([(999, 50), (40, 999), (100, 999)], [(0, 1, 10)], input_consumers=(0, 2))
    plan = plan_of(["gpu", "cpu", "cpu"])
    assert simulate(graph, costs, plan).makespan_us == 270             # op2 waits behind op1: 130-170, 170-270
    single = segment_plan(graph, plan, merge=False)
    backfilled = simulate_requests(graph, costs, plan, segmentation=single)
    assert spans(backfilled)[("seg", 2)] == (0, 100) and backfilled.makespan_us == 170
    assert simulate_requests(graph, costs, plan, segmentation=single, runtime=FIXED).makespan_us == 270
    assert simulate_requests(graph, costs, plan).makespan_us == 270   # segment {op1, op2} runs 130-270


def test_period_is_the_mean_completion_interval_of_the_second_half():
    assert steady_state_period_us([185]) == 185
    assert steady_state_period_us([100, 130]) == 30
    assert steady_state_period_us([10, 20, 40]) == 15                  # a = 1: (40 - 10) / 2
    assert steady_state_period_us([40, 10, 100, 20]) == 40             # a = 2: (100 - 20) / 2
    assert steady_state_period_us([0, 0, 0, 10, 20, 30]) == 10         # a = 3: (30 - 0) / 3


def test_json_round_trip_and_refused_arguments(make_tiny):
    graph, costs, plan = two_device_chain(make_tiny, 100, 50)
    tl = simulate_requests(graph, costs, plan, n_requests=3, max_in_flight=2,
                           runtime=RuntimeModel({"gpu": 2}, copies="links"))
    assert RequestsTimeline.from_dict(tl.to_dict()) == tl
    assert RuntimeModel.from_dict(FIXED.to_dict()) == FIXED
    with pytest.raises(SchemaError, match="schema_version"):
        RequestsTimeline.from_dict({**tl.to_dict(), "schema_version": 0})
    with pytest.raises(InvalidPlanError, match="latency"):
        RequestsTimeline.from_dict({**tl.to_dict(), "latency_us": [1.0, 2.0, 3.0]})
    with pytest.raises(UsageError, match="finite and >= 0"):
        simulate_requests(graph, costs, plan, runtime=RuntimeModel({"cpu": -1.0}, copies="links"))
    with pytest.raises(UsageError, match="tpu"):
        simulate_requests(graph, costs, plan, runtime=RuntimeModel({"tpu": 1.0}, copies="links"))
    with pytest.raises(UsageError, match="worker_policy"):
        RuntimeModel(worker_policy="random", copies="links").validate()
    with pytest.raises(UsageError, match="n_requests"):
        simulate_requests(graph, costs, plan, n_requests=0)
    with pytest.raises(UsageError, match="max_in_flight"):
        simulate_requests(graph, costs, plan, n_requests=2, max_in_flight=3)
    with pytest.raises(InvalidPlanError, match="another device"):
        simulate_requests(graph, costs, plan, segmentation=segment_plan(graph, plan_of(["cpu", "cpu"])))


# ---------------------------------------------------------------------- invariants on random plans
def with_third_device(graph, costs: CostTable) -> CostTable:
    """The same problem with a second accelerator "npu" (1.5x the gpu's latencies, same links everywhere)."""
    cpu, gpu = costs.devices.devices
    link = costs.devices.link("cpu", "gpu")
    names = ("cpu", "gpu", "npu")
    devices = DeviceSet((cpu, gpu, DeviceSpec("npu", "gpu", gpu.target, gpu.memory_bytes)),
                        tuple(Link(a, b, link.bandwidth_bytes_per_s, link.latency_us) for a in names for b in names
                              if a != b))
    lat = np.column_stack([costs.latency_us, costs.latency_us[:, 1] * 1.5])
    sup = np.column_stack([costs.supported, costs.supported[:, 1]])
    return CostTable.from_arrays(lat, devices, supported=sup, graph=graph)


def problem(shape: str, n: int, seed: int, three: bool):
    graph, costs, plan = random_problem(shape, n, seed)
    if three:
        costs = with_third_device(graph, costs)
        rng = np.random.default_rng(seed)
        device_of = tuple(d if d == "cpu" else str(rng.choice(["gpu", "npu"])) for d in plan.device_of)
        plan = Plan(device_of, plan.order, ("cpu", "gpu", "npu"), "random")
    return graph, costs, plan


def check_runtime_timeline(graph, costs, plan, seg, tl: RequestsTimeline, runtime: RuntimeModel) -> None:
    """Every segment and copy once per request, with the right durations, after everything it needs; no
    resource runs two things at once; never more than max_in_flight requests in flight."""
    tl.validate()
    host = costs.device_names[SimModel(graph, costs).host]
    input_index = {t.name: k for k, t in enumerate(graph.inputs)}
    outputs = {t.producer for t in graph.outputs if t.producer is not None}
    for r in range(tl.n_requests):
        segs = {e.segment_id: e for e in tl.events_of(r, "segment")}
        assert sorted(segs) == list(range(len(seg))) and len(tl.events_of(r, "segment")) == len(seg)
        copies = {(e.op_id, e.resource.split("->")[1]): e for e in tl.events_of(r, "copy")}
        assert len(copies) == len(tl.events_of(r, "copy"))                      # once per tensor and device
        for c in copies.values():
            src, dst = c.resource.split("->")
            assert c.end_us - c.start_us == pytest.approx(costs.transfer_us(c.size_bytes, src, dst))
            assert c.start_us >= (tl.admitted_us[r] if c.op_id < 0 else segs[c.segment_id].end_us) - TOL
        for s in seg.segments:
            ev, d = segs[s.id], s.device
            work = sum(costs.latency(op, d) for op in s.op_ids)
            assert ev.resource == d and ev.end_us - ev.start_us == pytest.approx(runtime.overhead_us(d) + work)
            for inp in s.inputs:
                producer = seg.segments[inp.segment]
                ready = segs[producer.id].end_us if producer.device == d else copies[(inp.op_id, d)].end_us
                assert ev.start_us >= ready - TOL
            for name in s.graph_inputs if d != host else ():
                assert ev.start_us >= copies[(-1 - input_index[name], d)].end_us - TOL
            for u in outputs & set(s.op_ids) if d != host else ():
                assert copies[(u, host)].start_us >= ev.end_us - TOL
        assert tl.completed_us[r] == pytest.approx(max(e.end_us for e in tl.events_of(r)) + runtime.completion_us)
        assert min(e.start_us for e in tl.events_of(r)) >= tl.admitted_us[r] + runtime.admission_us - TOL
    for r, t in enumerate(tl.admitted_us):
        assert sum(a <= t < c for a, c in zip(tl.admitted_us, tl.completed_us)) <= tl.max_in_flight
        assert r < tl.max_in_flight or t in tl.completed_us[:r]


@settings(max_examples=40, deadline=None)
@given(shape=st.sampled_from(["dag", "layered", "branchy", "series_parallel"]), n=st.integers(1, 25),
       seed=st.integers(0, 10_000), n_requests=st.integers(1, 4), limit=st.integers(1, 4),
       overhead=st.floats(0, 50), policy=st.sampled_from(["priority", "fixed_order"]), merge=st.booleans(),
       serial=st.booleans(), three=st.booleans(), per_request=st.sampled_from([(0, 0), (25, 0), (0, 9), (40, 15)]))
def test_events_respect_dependencies_and_resources(shape, n, seed, n_requests, limit, overhead, policy, merge,
                                                   serial, three, per_request):
    graph, costs, plan = problem(shape, n, seed, three)
    seg = segment_plan(graph, plan, merge=merge)
    runtime = RuntimeModel({"cpu": overhead, "gpu": overhead / 2}, worker_policy=policy, copies="links",
                           admission_us=per_request[0], completion_us=per_request[1])
    tl = simulate_requests(graph, costs, plan, n_requests=n_requests, max_in_flight=min(limit, n_requests),
                           runtime=runtime, segmentation=seg, config=SimulationConfig(serial_links=serial))
    check_runtime_timeline(graph, costs, plan, seg, tl, runtime)


@settings(max_examples=60, deadline=None)
@given(shape=st.sampled_from(["dag", "layered", "branchy", "series_parallel"]), n=st.integers(1, 40),
       seed=st.integers(0, 10_000), serial=st.booleans(), three=st.booleans())
def test_one_op_per_segment_in_fixed_order_equals_simulate(shape, n, seed, serial, three):
    """With one op per segment, one request, no overhead and each worker running its segments in issue order,
    the runtime model is simulate's model: the same makespan, op times and copies, exactly."""
    graph, costs, plan = problem(shape, n, seed, three)
    config = SimulationConfig(serial_links=serial)
    reference = simulate(graph, costs, plan, config)
    single = segment_plan(graph, plan, merge=False)
    tl = simulate_requests(graph, costs, plan, runtime=FIXED, segmentation=single, config=config)
    assert tl.makespan_us == reference.makespan_us
    op_of = {s.id: s.op_ids[0] for s in single.segments}
    assert sorted((op_of[e.segment_id], e.resource, e.start_us, e.end_us) for e in tl.events_of(0, "segment")) \
        == sorted((e.op_id, e.resource, e.start_us, e.end_us) for e in reference.op_events())
    assert sorted((e.op_id, e.resource, e.start_us, e.end_us, e.size_bytes) for e in tl.events_of(0, "copy")) \
        == sorted((e.op_id, e.resource, e.start_us, e.end_us, e.size_bytes) for e in reference.copy_events())
    # the priority policy may start a ready op before one issued earlier on its device (backfilling); when it
    # does not, it is the same schedule
    dynamic = simulate_requests(graph, costs, plan, segmentation=single, config=config)
    position = {v: k for k, v in enumerate(plan.order)}
    backfilled = False
    for device in plan.devices:
        runs = sorted(dynamic.events_of(0, "segment"), key=lambda e: e.start_us)
        issued = [position[op_of[e.segment_id]] for e in runs if e.resource == device]
        backfilled |= issued != sorted(issued)
    if not backfilled:
        assert dynamic.makespan_us == reference.makespan_us


@settings(max_examples=40, deadline=None)
@given(shape=st.sampled_from(["dag", "layered", "branchy", "series_parallel"]), n=st.integers(1, 40),
       seed=st.integers(0, 10_000), serial=st.booleans(), three=st.booleans())
def test_one_request_of_merged_segments_is_never_faster_than_simulate(shape, n, seed, serial, three):
    """A device's segments of segment_plan are chained in the segment graph, so for one request both policies
    run them in issue order; outputs leave a segment at its end and a segment waits for all its inputs, so its
    makespan is at least simulate's."""
    graph, costs, plan = problem(shape, n, seed, three)
    config = SimulationConfig(serial_links=serial)
    dynamic = simulate_requests(graph, costs, plan, config=config)
    assert dynamic.makespan_us == simulate_requests(graph, costs, plan, runtime=FIXED, config=config).makespan_us
    assert dynamic.makespan_us >= simulate(graph, costs, plan, config).makespan_us - TOL


def test_all_on_the_host_is_one_segment_and_the_sum_of_the_kernels(make_tiny):
    graph, costs = make_tiny([(5, 1), (7, 1), (11, 1)], [(0, 1, 100), (0, 2, 4)], outputs=[(1, 20), (2, 4)])
    plan = plan_of(["cpu"] * 3)
    tl = simulate_requests(graph, costs, plan, n_requests=3)
    assert len(tl.events) == 3 and tl.completed_us == (23, 46, 69) and tl.period_us == 23
    assert tl.latency_us[0] == simulate(graph, costs, plan).makespan_us


@pytest.mark.parametrize("shape", ["layered", "branchy"])
def test_simulating_four_requests_grows_about_linearly_up_to_two_thousand_ops(shape):
    def simulating(n_ops: int):
        graph, costs, plan = random_problem(shape, n_ops, 0)
        return lambda: simulate_requests(graph, costs, plan, n_requests=4)

    # 4x the ops: about 4-5x the time when linear (heap of ready tasks), 16x when quadratic
    assert cpu_time_growth(simulating, 500, 2000) < 10
    graph, costs, plan = random_problem(shape, 2000, 0)
    tl = simulate_requests(graph, costs, plan, n_requests=4)
    tl.validate()
    assert len(tl.events_of(3, "segment")) == len(segment_plan(graph, plan))

