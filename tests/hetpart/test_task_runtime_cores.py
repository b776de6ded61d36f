"""The task runtime on two CPU devices, each on its own core (``--devices cpu:0,cpu:1``): workers pinned to their
cores, numerics against onnxruntime, continuation and work sharing between the two, and 100 random pinned plans
(hypothesis) that neither deadlock nor change a result, with 1 and 8 requests in flight."""
from __future__ import annotations

import os
import re

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import hetpart
from tests.hetpart.runtime_cases import random_plan, small_module

pytestmark = [pytest.mark.tvm,
              pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a process allowed on two cores")]

CORES = sorted(os.sched_getaffinity(0))[:2] if len(os.sched_getaffinity(0)) >= 2 else [0, 1]   # else skipped
SPEC = f"cpu:{CORES[0]},cpu:{CORES[1]}"


@pytest.fixture(scope="module")
def compiled():
    # the pins make the plan use both devices whatever the costs of this host (heft alone may keep one busy)
    return hetpart.compile("squeezenet1_1", size=64, devices=SPEC, method="heft", segments=True,
                           pins={"op:relax.nn.max_pool2d": "cpu1", "op:relax.nn.conv2d": "cpu0"})


def test_two_cpu_devices_compile_and_run_pinned(compiled):
    from hetpart.driver.task_runtime import TaskRuntime

    assert compiled.costs.device_names == ("cpu0", "cpu1")
    assert compiled.plan.device_spec == SPEC and set(compiled.plan.device_of) == {"cpu0", "cpu1"}
    x = np.random.default_rng(1).standard_normal((1, 3, 64, 64)).astype(np.float32)
    session = ort.InferenceSession(compiled.source["onnx_path"], providers=["CPUExecutionProvider"])
    (reference,) = session.run(None, {session.get_inputs()[0].name: x})
    np.testing.assert_allclose(compiled(x)[0], reference, rtol=1e-4, atol=1e-4)       # one VM, two devices
    # one VM on one thread cannot keep core groups apart: its executable has the host only, so no weight copies,
    # no copies between the groups, and memory planned as for one device
    assert [d["name"] for d in compiled.build.manifest.devices if d["used"]] == ["cpu0"]
    stats = compiled.build.stats
    assert stats["plan_memory"] and stats["weight_uploads"] == 0 and stats["copies_per_call"] == 0
    with TaskRuntime(compiled.segments, trace=True) as rt:
        assert rt.worker_cores == {"cpu0": (CORES[0],), "cpu1": (CORES[1],)}
        assert not rt.emulated and "EMULATED" not in repr(rt)
        for in_flight in (1, 8):
            outputs, _ = rt.run_many([[x]] * 8, max_in_flight=in_flight)
            for (ours,) in outputs:
                np.testing.assert_allclose(ours, reference, rtol=1e-4, atol=1e-4)
        runs = rt.trace
    assert {run.device for run in runs} == {"cpu0", "cpu1"}
    predicted = compiled.task_runtime             # simulate_requests with the overhead measured at compile time
    assert predicted["segments"] == len(compiled.segments.program.functions)
    assert predicted["overhead_per_segment_us"] >= 0 and predicted["period_us"] > 0
    assert predicted["one_request_us"] >= compiled.timeline.makespan_us * 0.999     # overhead only adds time
    report = compiled.report()
    assert "## Task runtime (many requests)" in report and re.search(r"[Ss]imulator(.s)? error", report)
    assert len(runs) == 16 * len(compiled.segments.program.functions)
    assert all(run.end_s - run.start_s >= run.copy_s >= 0 for run in runs)
    # the plan crosses devices, but CPU devices share memory: every tensor was handed over, none copied
    assert rt.copies_made == 0 and set(map(str, rt.runtime_devices.values())) == {"cpu:0"}
    assert compiled.costs.devices.link("cpu0", "cpu1").transfer_us(1 << 20) == 0


def test_one_request_at_a_time_stays_on_one_core_by_continuation(compiled):
    from hetpart.driver.task_runtime import TaskRuntime
    from hetpart.simulate_requests import RuntimeModel, simulate_requests

    x = np.random.default_rng(2).standard_normal((1, 3, 64, 64)).astype(np.float32)
    (expected,) = compiled(x)
    devices = {}
    for continuation in (True, False):
        with TaskRuntime(compiled.segments, trace=True, continuation=continuation, sharing=False) as rt:
            for _ in range(3):
                np.testing.assert_allclose(rt(x)[0], expected, rtol=1e-5, atol=1e-5)
            devices[continuation] = {run.device for run in rt.trace}
            assert len(rt.trace) == 3 * len(compiled.segments.program.functions)
    first = compiled.segments.program.functions[0].device
    assert devices == {True: {first}, False: {"cpu0", "cpu1"}}
    # the runtime model places one request the same way
    predicted = simulate_requests(compiled.graph, compiled.costs, compiled.plan,
                                  runtime=RuntimeModel(copies="consumer", sharing=False))
    assert {e.resource for e in predicted.events if e.kind == "segment"} == {first}


def test_an_idle_core_group_takes_work_from_a_busy_one(compiled):
    from hetpart.driver.task_runtime import TaskRuntime

    x = np.random.default_rng(3).standard_normal((1, 3, 64, 64)).astype(np.float32)
    (expected,) = compiled(x)
    moved = {}
    for sharing in (True, False):
        with TaskRuntime(compiled.segments, trace=True, continuation=False, sharing=sharing) as rt:
            outputs, _ = rt.run_many([[x]] * 24, max_in_flight=24)
            planned = {k: f.device for k, f in enumerate(rt.program.functions)}
            moved[sharing] = sum(run.device != planned[run.segment] for run in rt.trace)
            assert len(rt.trace) == 24 * len(planned)
        for (ours,) in outputs:
            np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)
    # the pins put the convs on cpu0 and only the max-pools on cpu1, which is idle most of the time
    assert moved[True] > 0 and moved[False] == 0


# ------------------------------------------------------------------------------ random pinned plans
@pytest.fixture(scope="module")
def small():
    import tvm
    from tvm import relax

    from tvm_passes.extract import extract_op_graph

    graph = extract_op_graph(small_module(), with_kernels=False)
    vm = relax.VirtualMachine(tvm.compile(small_module(), target="llvm"), tvm.cpu(0))
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((1, 16)).astype(np.float32) for _ in range(8)]
    expected = [[t.numpy() for t in vm["main"](tvm.runtime.tensor(x))] for x in xs]
    return graph, xs, expected


@st.composite
def pinned_plans(draw, graph):
    """A device per op and a random topological issue order."""
    device_of = [draw(st.sampled_from(["cpu0", "cpu1"])) for _ in graph.nodes]
    return random_plan(graph, device_of, ("cpu0", "cpu1"), lambda n: draw(st.integers(0, n - 1)))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(data=st.data())
def test_random_pinned_plans_neither_deadlock_nor_change_results(small, data):
    from hetpart.driver.task_runtime import TaskRuntime

    graph, xs, expected = small
    plan = data.draw(pinned_plans(graph))
    in_flight = data.draw(st.sampled_from([1, 8]))
    continuation, sharing = data.draw(st.booleans()), data.draw(st.booleans())
    devices = [{"name": "cpu0", "kind": "cpu", "cores": [CORES[0]]},
               {"name": "cpu1", "kind": "cpu", "cores": [CORES[1]]}]
    with TaskRuntime.from_module(small_module(), graph, plan, devices=devices, continuation=continuation,
                                 sharing=sharing) as rt:
        outputs, latency_us = rt.run_many([[x] for x in xs], max_in_flight=in_flight)
    assert len(latency_us) == len(xs)
    for ours, ref in zip(outputs, expected):
        assert len(ours) == 2
        for a, b in zip(ours, ref):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_a_plan_with_nothing_on_the_host_still_takes_requests(small):
    """The host worker receives every request's inputs even when no segment runs on the host."""
    from hetpart.driver.task_runtime import TaskRuntime

    graph, xs, expected = small
    plan = random_plan(graph, ["cpu1"] * graph.num_ops, ("cpu0", "cpu1"), lambda n: 0)
    devices = [{"name": "cpu0", "kind": "cpu", "cores": [CORES[0]]},
               {"name": "cpu1", "kind": "cpu", "cores": [CORES[1]]}]
    with TaskRuntime.from_module(small_module(), graph, plan, devices=devices) as rt:
        assert {f.device for f in rt.program.functions} == {"cpu1"} and set(rt.worker_cores) == {"cpu0", "cpu1"}
        outputs, _ = rt.run_many([[x] for x in xs[:2]], max_in_flight=2)
    for ours, ref in zip(outputs, expected):
        for a, b in zip(ours, ref):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
