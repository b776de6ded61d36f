"""The task runtime's measured overheads (``hetpart.driver.runtime_overhead``): the per-request probe's size, the
single-device request time that sizes it, and a real measurement carried into the simulator's RuntimeModel."""
from __future__ import annotations

import math

import numpy as np
import pytest

from hetpart.costs import CostTable
from hetpart.devices import DeviceSet, DeviceSpec, Link
from hetpart.driver.runtime_overhead import (STREAM_ROWS, STREAM_ROWS_RANGE, measure_dispatch_overhead,
                                             single_device_request_us, stream_rows_for)


def test_the_probe_grows_with_the_request_within_its_range():
    assert stream_rows_for(None) == STREAM_ROWS and stream_rows_for(math.inf) == STREAM_ROWS
    sizes = [stream_rows_for(us) for us in (0.0, 10.0, 100.0, 1_000.0, 3_000.0, 1e5, 1e9)]
    assert sizes == sorted(sizes) and sizes[0] == STREAM_ROWS_RANGE[0] and sizes[-1] == STREAM_ROWS_RANGE[1]
    assert all(rows % 1024 == 0 for rows in sizes) and len(set(sizes)) >= 4


def _devices() -> DeviceSet:
    return DeviceSet((DeviceSpec("cpu", "cpu", {"kind": "llvm"}, 2**30),
                      DeviceSpec("gpu", "gpu", {"kind": "cuda"}, 2**30, source="datasheet")),
                     (Link("cpu", "gpu", 1e9, 10.0), Link("gpu", "cpu", 1e9, 10.0)))


def test_single_device_request_is_the_fastest_device_that_runs_every_op():
    latency = np.array([[100.0, 10.0], [50.0, 20.0], [30.0, 60.0]])
    assert single_device_request_us(CostTable.from_arrays(latency, _devices())) == 90.0
    unsupported = np.ones_like(latency, dtype=bool)
    unsupported[1, 1] = False                              # the gpu cannot run op 1: only the cpu counts
    latency[1, 1] = np.nan
    assert single_device_request_us(CostTable.from_arrays(latency, _devices(), supported=unsupported)) == 180.0


@pytest.mark.tvm
def test_a_measurement_carries_its_per_request_overheads_into_the_runtime_model():
    devices = [{"name": "cpu", "kind": "cpu", "cores": []}, {"name": "gpu", "kind": "gpu", "cores": []}]
    measured = measure_dispatch_overhead(devices, requests=6, rounds=1, request_us=200.0)
    assert measured.admission_us > 0 and measured.completion_us >= 0 and measured.request_probe_us > 0
    assert measured.overhead_us >= 0 and measured.segments_added > 0
    model = measured.runtime_model(["cpu", "gpu"]).validate(["cpu", "gpu"])
    assert (model.admission_us, model.completion_us) == (measured.admission_us, measured.completion_us)
    assert model.dispatch_overhead_us_by_device == {"cpu": measured.overhead_us, "gpu": measured.overhead_us}
    assert {"admission_us", "completion_us", "request_probe_us"} <= set(measured.to_dict())
