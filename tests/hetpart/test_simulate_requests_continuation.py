"""Continuation and work sharing in the runtime model: a worker with nothing of its own to do runs a newly ready
segment of an interchangeable CPU core group itself (continuation), and a free worker with nothing of its own takes
a busy peer's best ready segment (sharing)."""
from __future__ import annotations

import numpy as np
import pytest

from hetpart.costs import CostTable
from hetpart.devices import DeviceSet, Link, cpu_device, interchangeable_cpu_groups, shared_memory_link
from hetpart.errors import UsageError
from hetpart.plan import Plan
from hetpart.simulate_requests import RuntimeModel, simulate_requests

OVERHEAD_US = 5.0


def core_groups(cores=((0,), (1,)), shared: bool = True) -> DeviceSet:
    links = ((shared_memory_link("cpu0", "cpu1"), shared_memory_link("cpu1", "cpu0")) if shared
             else (Link("cpu0", "cpu1", 1e9, 1.0), Link("cpu1", "cpu0", 1e9, 1.0)))
    return DeviceSet((cpu_device(name="cpu0", cores=cores[0]), cpu_device(name="cpu1", cores=cores[1])),
                     links).validate()


def on_core_groups(make_tiny, latency_us, edges, outputs, devices: DeviceSet | None = None):
    graph, costs = make_tiny(latency_us, edges, outputs=outputs)
    costs = CostTable.from_arrays(costs.latency_us, devices or core_groups(), graph=graph, source="measured")
    return graph, costs


def plan(device_of) -> Plan:
    return Plan(device_of=tuple(device_of), order=tuple(range(len(device_of))), devices=("cpu0", "cpu1"),
                method="hand")


def runtime(continuation: bool = True, sharing: bool = False) -> RuntimeModel:
    return RuntimeModel({"cpu0": OVERHEAD_US, "cpu1": OVERHEAD_US}, copies="consumer", continuation=continuation,
                        sharing=sharing)


def workers(timeline, request=None) -> dict[int, str]:
    """segment id -> the worker that ran it (of ``request``, or of request 0)."""
    return {e.segment_id: e.resource for e in timeline.events_of(request or 0, "segment")}


def test_the_groups_are_cpu_core_groups_of_equal_size_joined_by_shared_memory():
    assert core_groups().interchangeable_groups() == (("cpu0", "cpu1"),)
    assert core_groups(cores=((0,), (1, 2))).interchangeable_groups() == ()
    assert core_groups(shared=False).interchangeable_groups() == ()
    found = interchangeable_cpu_groups([("a", "cpu", (0,)), ("g", "gpu", ()), ("b", "cpu", (1,)), ("c", "cpu", (2, 3)),
                                        ("d", "cpu", (4, 5)), ("host", "cpu", ())])
    assert found == (("a", "b"), ("c", "d"))


def test_one_request_through_a_chain_stays_on_the_first_worker(make_tiny):
    graph, costs = on_core_groups(make_tiny, [(100, 100), (50, 50)], [(0, 1, 8)], [(1, 4)])
    one = simulate_requests(graph, costs, plan(["cpu0", "cpu1"]), runtime=runtime()).validate()
    assert workers(one) == {0: "cpu0", 1: "cpu0"}
    assert [(e.start_us, e.end_us) for e in one.events_of(0, "segment")] == [(0, 105), (105, 160)]
    handed = simulate_requests(graph, costs, plan(["cpu0", "cpu1"]), runtime=runtime(False)).validate()
    assert workers(handed) == {0: "cpu0", 1: "cpu1"} and handed.makespan_us == one.makespan_us


def test_with_work_of_its_own_a_worker_leaves_the_segment_to_its_device(make_tiny):
    graph, costs = on_core_groups(make_tiny, [(100, 100), (50, 50)], [(0, 1, 8)], [(1, 4)])
    tl = simulate_requests(graph, costs, plan(["cpu0", "cpu1"]), n_requests=4, runtime=runtime()).validate()
    for r in range(3):                      # request r+1's first segment waits on cpu0: the pipeline holds
        assert workers(tl, r) == {0: "cpu0", 1: "cpu1"}
    assert workers(tl, 3) == {0: "cpu0", 1: "cpu0"}    # the last one: cpu0 has nothing left, so it carries on
    assert tl.period_us == pytest.approx(105)


def test_without_interchangeable_groups_nothing_moves(make_tiny):
    devices = core_groups(cores=((0,), (1, 2)))
    graph, costs = on_core_groups(make_tiny, [(100, 100), (50, 50)], [(0, 1, 8)], [(1, 4)], devices)
    assert workers(simulate_requests(graph, costs, plan(["cpu0", "cpu1"]), runtime=runtime())) == {0: "cpu0",
                                                                                                    1: "cpu1"}
    fixed = RuntimeModel({"cpu0": OVERHEAD_US}, copies="consumer", worker_policy="fixed_order")
    graph, costs = on_core_groups(make_tiny, [(100, 100), (50, 50)], [(0, 1, 8)], [(1, 4)])
    assert workers(simulate_requests(graph, costs, plan(["cpu0", "cpu1"]), runtime=fixed)) == {0: "cpu0", 1: "cpu1"}


def test_continuation_and_sharing_are_checked_and_round_trip():
    for model in (runtime(False), runtime(True, True), runtime(False, True)):
        assert RuntimeModel.from_dict(model.to_dict()) == model
    assert RuntimeModel().continuation and RuntimeModel().sharing                 # the task runtime's defaults
    old = {k: v for k, v in runtime(True, True).to_dict().items() if k not in ("continuation", "sharing")}
    old = RuntimeModel.from_dict(old)                                             # written before they were modelled
    assert old.continuation is False and old.sharing is False
    for key in ("continuation", "sharing"):
        with pytest.raises(UsageError, match=f"{key} must be True or False"):
            RuntimeModel(**{key: "yes"}).validate()


def test_sharing_balances_whole_requests_of_a_one_device_plan(make_tiny):
    graph, costs = on_core_groups(make_tiny, [(100, 100), (50, 50)], [(0, 1, 8)], [(1, 4)])
    alone = simulate_requests(graph, costs, plan(["cpu0", "cpu0"]), n_requests=4, runtime=runtime())
    shared = simulate_requests(graph, costs, plan(["cpu0", "cpu0"]), n_requests=4,
                               runtime=runtime(sharing=True)).validate()
    assert alone.makespan_us == pytest.approx(4 * 155) and shared.makespan_us == pytest.approx(2 * 155)
    assert [set(workers(shared, r).values()) for r in range(4)] == [{"cpu0"}, {"cpu1"}, {"cpu0"}, {"cpu1"}]


def test_sharing_takes_a_busy_peers_best_segment_and_never_slows_a_pipeline(make_tiny):
    graph, costs = on_core_groups(make_tiny, [(100, 100), (50, 50)], [(0, 1, 8)], [(1, 4)])
    handed = simulate_requests(graph, costs, plan(["cpu0", "cpu1"]), n_requests=8, runtime=runtime())
    shared = simulate_requests(graph, costs, plan(["cpu0", "cpu1"]), n_requests=8,
                               runtime=runtime(sharing=True)).validate()
    assert workers(shared, 1)[0] == "cpu1"          # cpu1 had nothing at t = 0: it took request 1's first segment
    assert shared.makespan_us < handed.makespan_us


def test_every_request_still_runs_every_segment_once(make_tiny):
    rng = np.random.default_rng(0)
    n = 6
    latency = [(float(v), float(v)) for v in rng.integers(10, 90, n)]
    edges = [(i, i + 1, 8) for i in range(n - 1)] + [(0, 3, 8), (1, 5, 8)]
    graph, costs = on_core_groups(make_tiny, latency, edges, [(n - 1, 4)])
    device_of = ["cpu0", "cpu1", "cpu1", "cpu0", "cpu1", "cpu0"]
    for in_flight, sharing in ((1, False), (3, False), (8, False), (1, True), (3, True), (8, True)):
        tl = simulate_requests(graph, costs, plan(device_of), n_requests=8, max_in_flight=in_flight,
                               runtime=runtime(sharing=sharing)).validate()
        for r in range(8):
            runs = tl.events_of(r, "segment")
            assert sorted(e.segment_id for e in runs) == sorted(set(e.segment_id for e in runs))
        by_worker: dict[str, list] = {}
        for e in tl.events:
            if e.kind == "segment":
                by_worker.setdefault(e.resource, []).append((e.start_us, e.end_us))
        for spans in by_worker.values():                                 # one segment at a time per worker
            spans.sort()
            assert all(a[1] <= b[0] + 1e-9 for a, b in zip(spans, spans[1:]))


def test_a_plan_on_one_of_equal_core_groups_is_noted_not_warned_when_made_for_the_task_runtime(make_tiny):
    import warnings

    from hetpart.errors import DegeneratePlanWarning
    from hetpart.partition import partition

    graph, costs = on_core_groups(make_tiny, [(100, 100), (50, 50)], [(0, 1, 8)], [(1, 4)])
    with warnings.catch_warnings():
        warnings.simplefilter("error", DegeneratePlanWarning)
        plan = partition(graph, costs, "heft", {"requests": 4})
    assert any("spreads requests in flight over ['cpu0', 'cpu1']" in note for note in plan.notes)
    for options in ({"requests": 4, "work_sharing": False}, {}):      # static placement, or not for the runtime
        with pytest.warns(DegeneratePlanWarning, match="degenerate plan"):
            partition(graph, costs, "heft", options)
