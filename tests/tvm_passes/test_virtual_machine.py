"""VMs are made one at a time: two task-runtime workers (and any other thread) never construct a VM at once,
since concurrent construction from one fresh executable corrupts it (tvm_passes/virtual_machine.py)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

pytest.importorskip("tvm")

from hetpart.plan import Plan  # noqa: E402
from tests.hetpart.runtime_cases import small_module  # noqa: E402

pytestmark = pytest.mark.tvm


@pytest.fixture
def construction_overlap(monkeypatch):
    """Wrap relax.VirtualMachine so each construction lingers 50 ms; records the most constructions at once."""
    from tvm import relax

    real = relax.VirtualMachine
    state = {"inside": 0, "most": 0, "made": 0}
    lock = threading.Lock()

    def lingering(*args, **kwargs):
        with lock:
            state["inside"] += 1
            state["most"] = max(state["most"], state["inside"])
        try:
            time.sleep(0.05)
            return real(*args, **kwargs)
        finally:
            with lock:
                state["inside"] -= 1
                state["made"] += 1

    monkeypatch.setattr(relax, "VirtualMachine", lingering)
    return state


def test_task_runtime_workers_make_their_vms_one_at_a_time(construction_overlap):
    from hetpart.driver.task_runtime import TaskRuntime
    from tvm_passes.extract import extract_op_graph

    graph = extract_op_graph(small_module(), with_kernels=False)
    device_of = ["cpu" if k % 2 else "gpu" for k in range(graph.num_ops)]
    plan = Plan(device_of=device_of, order=range(graph.num_ops), devices=("cpu", "gpu"), method="fixed",
                graph_hash=graph.structure_hash(), level="op").validate(graph)
    x = np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32)
    with TaskRuntime.from_module(small_module(), graph, plan) as rt:
        assert len(rt(x)) == 2
    assert construction_overlap["made"] == 2 and construction_overlap["most"] == 1


def test_threads_making_vms_directly_are_serialised(construction_overlap):
    import tvm

    from tvm_passes.virtual_machine import new_virtual_machine

    executable = tvm.compile(small_module(), target="llvm")
    made = []
    threads = [threading.Thread(target=lambda: made.append(new_virtual_machine(executable, tvm.cpu(0), ["main"])))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 3 and all(set(calls) == {"main"} for _, calls in made)
    assert construction_overlap["most"] == 1
