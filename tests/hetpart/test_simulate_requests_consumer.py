"""The runtime model with copies done by the consuming worker (``RuntimeModel(copies="consumer")``, what the task
runtime does): hand-computed timelines (copy = 10 us + 1 us per byte, see conftest) and invariants on random plans."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from hetpart.errors import UsageError
from hetpart.segments import segment_plan
from hetpart.simulate import SimModel
from hetpart.simulate_requests import RequestsTimeline, RuntimeModel, simulate_requests
from tests.hetpart.test_simulate import plan_of
from tests.hetpart.test_simulate_requests import problem, spans, two_device_chain

CONSUMER = RuntimeModel(copies="consumer")
TOL = 1e-6


def test_the_consumer_copies_before_its_segment_and_the_last_worker_copies_the_outputs(make_tiny):
    graph, costs, plan = two_device_chain(make_tiny, 100, 50)
    tl = simulate_requests(graph, costs, plan, runtime=CONSUMER).validate()
    assert spans(tl) == {("seg", 0): (0, 100), ("copy", 0, "cpu->gpu"): (100, 120), ("seg", 1): (120, 170),
                         ("copy", 1, "gpu->cpu"): (170, 185)}
    assert tl.makespan_us == 185


def test_copies_take_the_consumers_time_in_a_pipeline(make_tiny):
    """The gpu worker copies in (20 us), runs (80 us) and copies out (15 us): one request per 115 us, where copies
    on links would give one per 80 us."""
    graph, costs, plan = two_device_chain(make_tiny, 30, 80)
    tl = simulate_requests(graph, costs, plan, n_requests=4, runtime=CONSUMER).validate()
    assert tl.completed_us == (145, 260, 375, 490) and tl.period_us == 115
    links = simulate_requests(graph, costs, plan, n_requests=4, runtime=RuntimeModel(copies="links"))
    assert links.period_us == 80


def test_model_inputs_are_copied_by_the_device_worker_and_outputs_by_the_last_one(make_tiny):
    graph, costs = make_tiny([(999, 30), (100, 999)], [], input_consumers=(0, 1), outputs=[(0, 4), (1, 4)])
    tl = simulate_requests(graph, costs, plan_of(["gpu", "cpu"]), runtime=CONSUMER).validate()
    assert spans(tl) == {("copy", -1, "cpu->gpu"): (0, 60), ("seg", 0): (60, 90), ("seg", 1): (0, 100),
                         ("copy", 0, "gpu->cpu"): (100, 114)}
    assert tl.makespan_us == 114


def test_a_tensor_is_copied_once_per_device_and_request(make_tiny):
    """op0 (cpu) is read by op1 and op3 on the gpu, in two segments split by op2 on the cpu."""
    graph, costs = make_tiny([(10, 999), (999, 10), (10, 999), (999, 10)],
                             [(0, 1, 4), (1, 2, 4), (2, 3, 4), (0, 3, 4)], outputs=[(3, 4)])
    plan = plan_of(["cpu", "gpu", "cpu", "gpu"])
    tl = simulate_requests(graph, costs, plan, n_requests=2, runtime=CONSUMER).validate()
    for r in range(2):
        copied = [(e.op_id, e.resource) for e in tl.events_of(r, "copy")]
        assert sorted(copied) == [(0, "cpu->gpu"), (1, "gpu->cpu"), (2, "cpu->gpu"), (3, "gpu->cpu")]


def test_copies_is_checked_and_round_trips():
    with pytest.raises(UsageError, match="copies must be one of"):
        RuntimeModel(copies="dma").validate()
    assert RuntimeModel.from_dict(CONSUMER.to_dict()) == CONSUMER
    assert RuntimeModel.from_dict({k: v for k, v in RuntimeModel().to_dict().items() if k != "copies"}).copies \
        == "links"


@settings(max_examples=40, deadline=None)
@given(shape=st.sampled_from(["dag", "layered", "branchy", "series_parallel"]), n=st.integers(1, 25),
       seed=st.integers(0, 10_000), n_requests=st.integers(1, 4), limit=st.integers(1, 4),
       overhead=st.floats(0, 50), policy=st.sampled_from(["priority", "fixed_order"]), merge=st.booleans(),
       three=st.booleans())
def test_consumer_copies_respect_dependencies_and_workers(shape, n, seed, n_requests, limit, overhead, policy,
                                                         merge, three):
    graph, costs, plan = problem(shape, n, seed, three)
    seg = segment_plan(graph, plan, merge=merge)
    runtime = RuntimeModel({"cpu": overhead, "gpu": overhead / 2}, worker_policy=policy, copies="consumer")
    tl: RequestsTimeline = simulate_requests(graph, costs, plan, n_requests=n_requests,
                                             max_in_flight=min(limit, n_requests), runtime=runtime,
                                             segmentation=seg).validate()
    host = costs.device_names[SimModel(graph, costs).host]
    outputs = {t.producer for t in graph.outputs if t.producer is not None}
    busy: dict[str, list] = {}                                            # per worker, over all requests
    for r in range(tl.n_requests):
        segs = {e.segment_id: e for e in tl.events_of(r, "segment")}
        assert sorted(segs) == list(range(len(seg.segments)))
        last_end = max(e.end_us for e in segs.values())
        pulls = [e for e in tl.events_of(r, "copy") if not (e.op_id in outputs and e.resource.endswith("->" + host)
                                                            and e.start_us >= last_end - TOL)]
        keys = [(e.op_id, e.resource.split("->")[1]) for e in pulls]
        assert len(keys) == len(set(keys))                                # a tensor once per device and request
        for s in seg.segments:
            ev = segs[s.id]
            work = sum(costs.latency(op, s.device) for op in s.op_ids)
            assert ev.end_us - ev.start_us == pytest.approx(runtime.overhead_us(s.device) + work)
            for inp in s.inputs:                                          # after every producer, on any device
                assert ev.start_us >= segs[inp.segment].end_us - TOL
                if seg.segments[inp.segment].device != s.device:          # and after its copy to this device
                    copy = next(e for e in pulls if (e.op_id, e.resource.split("->")[1]) == (inp.op_id, s.device))
                    assert ev.start_us >= copy.end_us - TOL
            busy.setdefault(s.device, []).append((ev.start_us, ev.end_us))
        for e in pulls:                                                   # pulls run on the reading worker
            busy.setdefault(e.resource.split("->")[1], []).append((e.start_us, e.end_us))
        assert tl.completed_us[r] == pytest.approx(max(e.end_us for e in tl.events_of(r)))
    for spans_of_worker in busy.values():                                 # no worker does two things at once
        spans_of_worker.sort()
        for (_, end), (start, _) in zip(spans_of_worker, spans_of_worker[1:]):
            assert start >= end - TOL
