"""Cross-device sharing in the runtime model: a free worker takes another, busy device's ready segment when it is
predicted to end it sooner (``hetpart.cross_sharing``); the outputs stay on its device.

The tiny problems' links copy B bytes in 10 + B us (tests/hetpart/conftest.py), so the timelines are worked by hand.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hetpart.cross_sharing import SharingTable, busy_until_us, planned_load_us, takes
from hetpart.errors import SchemaError
from hetpart.plan import Plan
from hetpart.simulate_requests import RuntimeModel, sharing_table, simulate_requests
from tests.hetpart.conftest import tiny_problem


def runtime(cross: bool = True) -> RuntimeModel:
    return RuntimeModel(copies="consumer", cross_device_sharing=cross)


def plan(device_of, pins=None) -> Plan:
    return Plan(device_of=tuple(device_of), order=tuple(range(len(device_of))), devices=("cpu", "gpu"),
                method="hand", pins=pins or {})


def runs(timeline) -> list[tuple[int, int, str, float, float]]:
    return sorted((e.request, e.segment_id, e.resource, e.start_us, e.end_us) for e in timeline.events
                  if e.kind == "segment")


def one_op(make_tiny, **kwargs):
    # cpu 300 us, gpu 100 us; the 50-byte input copied to the GPU takes 60 us, the 4-byte output back 14 us
    return make_tiny([(300, 100)], outputs=[(0, 4)], **kwargs)


def test_a_whole_request_goes_to_the_cpu_while_it_ends_sooner_there(make_tiny):
    graph, costs = one_op(make_tiny)
    static = simulate_requests(graph, costs, plan(["gpu"]), n_requests=4, runtime=runtime(False)).validate()
    assert static.makespan_us == 4 * 174
    shared = simulate_requests(graph, costs, plan(["gpu"]), n_requests=4, runtime=runtime()).validate()
    # r1 at t=0 on the CPU ends at 300 < 160 + 160 on the GPU; r3 at t=300 would end at 600 > 334 + 160
    assert runs(shared) == [(0, 0, "gpu", 60, 160), (1, 0, "cpu", 0, 300), (2, 0, "gpu", 234, 334),
                            (3, 0, "gpu", 408, 508)]
    assert shared.makespan_us == 522 and shared.completed_us[1] == 300


def test_the_taken_segments_outputs_stay_on_the_taker_and_its_readers_copy_from_there(make_tiny):
    # op0 (cpu 120, gpu 100) on the GPU feeds op1 (10 us) on the CPU with 8 bytes
    graph, costs = make_tiny([(120, 100), (10, 10)], [(0, 1, 8)], outputs=[(1, 4)])
    timeline = simulate_requests(graph, costs, plan(["gpu", "cpu"]), n_requests=3, runtime=runtime()).validate()
    # at t=0 three requests are in flight (more than the two devices) and the CPU is free: r1's op0 ends on it at 120,
    # on the GPU at 160 + 160; the CPU takes it. At 130 r1 is done, two are in flight: r2 is left to the GPU
    assert runs(timeline) == [(0, 0, "gpu", 60, 160), (0, 1, "cpu", 178, 188), (1, 0, "cpu", 0, 120),
                              (1, 1, "cpu", 120, 130), (2, 0, "gpu", 220, 320), (2, 1, "cpu", 338, 348)]
    assert [e.resource for e in timeline.events_of(0, "copy")] == ["cpu->gpu", "gpu->cpu"]
    assert timeline.events_of(1, "copy") == []          # request 1 never left the CPU


def test_a_device_with_work_of_its_own_takes_only_with_more_requests_in_flight_than_devices(make_tiny):
    graph, costs = make_tiny([(120, 100), (10, 10)], [(0, 1, 8)], outputs=[(1, 4)])
    two = simulate_requests(graph, costs, plan(["gpu", "cpu"]), n_requests=2, runtime=runtime()).validate()
    assert {(r, s, device) for r, s, device, _, _ in runs(two)} == {(0, 0, "gpu"), (0, 1, "cpu"), (1, 0, "gpu"),
                                                                  (1, 1, "cpu")}
    # the same with three requests but at most two in flight at a time
    closed = simulate_requests(graph, costs, plan(["gpu", "cpu"]), n_requests=3, max_in_flight=2,
                               runtime=runtime()).validate()
    assert {device for _, s, device, _, _ in runs(closed) if s == 0} == {"gpu"}


@pytest.mark.parametrize("why", ["pinned", "unsupported"])
def test_a_segment_the_taker_may_not_run_is_never_taken(make_tiny, why):
    supported = np.array([[False, True]]) if why == "unsupported" else None
    graph, costs = one_op(make_tiny, supported=supported)
    chosen = plan(["gpu"], pins={"op0": "gpu"} if why == "pinned" else None)
    timeline = simulate_requests(graph, costs, chosen, n_requests=4, runtime=runtime()).validate()
    assert {e.resource for e in timeline.events if e.kind == "segment"} == {"gpu"}
    assert timeline.makespan_us == 4 * 174
    table = sharing_table(graph, costs, chosen, runtime=runtime())
    assert table.duration_us == ((None,), (100.0,)) and table.copy_in_us == ((0.0,), (60.0,))
    assert table.load_us == (0.0, 160.0)


def test_a_slow_taker_takes_nothing(make_tiny):
    graph, costs = make_tiny([(1000, 100)], outputs=[(0, 4)])
    timeline = simulate_requests(graph, costs, plan(["gpu"]), n_requests=3, runtime=runtime()).validate()
    assert {e.resource for e in timeline.events if e.kind == "segment"} == {"gpu"}


def test_the_rule_compares_predicted_finishes():
    table = SharingTable(("cpu", "gpu"), ((300.0,), (100.0,)), ((0.0,), (60.0,)), (0.0, 160.0)).validate()
    assert takes(table, 0.0, 0, 1, 0, 160.0, in_flight=2)           # 300 < 160 + 160
    assert not takes(table, 0.0, 0, 1, 0, 140.0, in_flight=2)       # 300 = 140 + 160: not sooner
    assert not takes(table, 300.0, 0, 1, 0, 334.0, in_flight=2)     # 600 > 494
    assert busy_until_us(table, 10.0, 1, 0) == 170.0 and busy_until_us(table, 10.0, 0, 0) == 310.0
    busy = SharingTable(table.devices, table.duration_us, table.copy_in_us, (20.0, 160.0))   # the CPU has work
    assert not takes(busy, 0.0, 0, 1, 0, 160.0, in_flight=2) and takes(busy, 0.0, 0, 1, 0, 160.0, in_flight=3)
    assert planned_load_us(((300.0, 5.0), (100.0, None)), ((0.0, 1.0), (60.0, 2.0)), [1, 0]) == (6.0, 160.0)


def test_the_table_and_the_runtime_model_round_trip_and_old_json_has_no_cross_sharing():
    table = SharingTable(("cpu", "gpu"), ((300.0, None), (100.0, 5.0)), ((0.0, 1.0), (60.0, 0.0)), (1.0, 100.0))
    assert SharingTable.from_dict(table.to_dict()) == table
    with pytest.raises(SchemaError, match="one row of 1 segments"):
        SharingTable(("cpu", "gpu"), ((1.0,), (1.0, 2.0)), ((0.0,), (0.0, 0.0)), (0.0, 0.0)).validate()
    with pytest.raises(SchemaError, match="finite and >= 0"):
        SharingTable(("cpu",), ((-1.0,),), ((0.0,),), (0.0,)).validate()
    model = runtime()
    assert RuntimeModel.from_dict(model.to_dict()) == model
    old = {k: v for k, v in model.to_dict().items() if k != "cross_device_sharing"}
    assert RuntimeModel.from_dict(old).cross_device_sharing is False


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(5, 200), st.integers(5, 200)), min_size=2, max_size=6),
       st.lists(st.sampled_from(["cpu", "gpu"]), min_size=6, max_size=6), st.integers(1, 6))
def test_every_segment_runs_once_per_request_and_no_worker_runs_two_at_once(latency_us, devices, n):
    chain = [(k, k + 1, 16) for k in range(len(latency_us) - 1)]
    graph, costs = tiny_problem(latency_us, chain, outputs=[(len(latency_us) - 1, 4)])
    chosen = plan(devices[:len(latency_us)])
    timeline = simulate_requests(graph, costs, chosen, n_requests=n, runtime=runtime()).validate()
    segments = {(e.request, e.segment_id) for e in timeline.events if e.kind == "segment"}
    k = len({e.segment_id for e in timeline.events if e.kind == "segment"})
    assert len(segments) == sum(1 for e in timeline.events if e.kind == "segment") == n * k


def test_planning_for_cross_device_sharing_refuses_a_device_that_cannot_hold_every_weight():
    from hetpart.errors import InfeasibleError
    from hetpart.partition import partition

    graph, costs = tiny_problem([(300, 100), (50, 20)], [(0, 1, 8)], outputs=[(1, 4)], param_bytes=[600, 600],
                                memory_bytes=(1 << 30, 1000))
    config = {"requests": 4, "cross_device_sharing": True}
    with pytest.raises(InfeasibleError, match="each holds all 1200 bytes of weights, but 'gpu' has 1000"):
        partition(graph, costs, "portfolio", config)
    assert partition(graph, costs, "portfolio", {**config, "cross_device_sharing": False}).validate(graph)
