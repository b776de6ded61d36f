"""benchmarks/gil_vm_call.py: the off-CPU share of a call, and the table."""
from __future__ import annotations

import time

import pytest

from tests.scripts import load_benchmark


@pytest.fixture(scope="module")
def gil_vm_call():
    return load_benchmark("gil_vm_call")


def test_a_sleeping_call_is_off_the_cpu_and_a_busy_one_is_not(gil_vm_call):
    sleeping = gil_vm_call.time_calls(lambda: time.sleep(0.003), 3)
    assert min(sleeping["wall_us"]) >= 2900
    assert all(off > 0.9 * wall for off, wall in zip(sleeping["off_cpu_us"], sleeping["wall_us"]))

    def busy():
        began = time.perf_counter()
        while time.perf_counter() - began < 0.003:
            pass

    spinning = gil_vm_call.time_calls(busy, 3)
    assert min(spinning["wall_us"]) >= 2900
    # on the CPU most of the time, even on a host where another process takes some of this core
    shares = sorted(off / wall for off, wall in zip(spinning["off_cpu_us"], spinning["wall_us"]))
    assert shares[1] < 0.75


def test_markdown_lists_every_scenario(gil_vm_call):
    result = {"model": "GRU", "calls": 3, "cores": [0, 1], "meta": {"date": "now", "cpu": "x", "command": "cmd"},
              "scenarios": {"alone": {"wall_us": [1.0, 2.0, 3.0, 4.0], "off_cpu_us": [0.0, 0.0, 0.0, 1.0]},
                            "python_loop": {"wall_us": [6000.0, 6100.0, 6200.0, 6300.0],
                                            "off_cpu_us": [5000.0, 5001.0, 5002.0, 5003.0]}}}
    text = gil_vm_call.markdown(result)
    assert "| alone | 1 / 2 / 3 / 4 | 0 / 0 / 0 / 1 |" in text
    assert "| python_loop | 6000 / 6100 / 6200 / 6300 | 5000 / 5001 / 5002 / 5003 |" in text
