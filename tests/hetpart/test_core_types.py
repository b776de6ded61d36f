"""hetpart.devices, hetpart.costs and hetpart.plan: validation, typed errors, JSON round-trips."""
from __future__ import annotations

import json

import numpy as np
import pytest

from hetpart.costs import CostTable
from hetpart.devices import (GPU_PRESETS, DeviceSet, DeviceSpec, Link, cpu_device, gpu_from_preset,
                             preset_links, shared_memory_link)
from hetpart.errors import (InvalidCostTableError, InvalidPlanError, MissingCostError, PinError, SchemaError,
                            UnknownDeviceError)
from hetpart.plan import Event, Plan, Timeline, resolve_pins


def two_devices(preset: str = "t4") -> DeviceSet:
    return DeviceSet((cpu_device(), gpu_from_preset(preset)), preset_links(preset)).validate()


# ---------------------------------------------------------------- devices
def test_presets_are_datasheet_devices_with_links_both_ways():
    for name, preset in GPU_PRESETS.items():
        gpu = gpu_from_preset(name)
        assert gpu.kind == "gpu" and gpu.source == "datasheet" and gpu.target["arch"] == preset.arch
        assert gpu.memory_bytes == preset.memory_bytes and name in gpu.citation
        there, back = preset_links(name)
        assert (there.src, there.dst, back.src, back.dst) == ("cpu", "gpu", "gpu", "cpu")
    with pytest.raises(UnknownDeviceError, match="unknown GPU preset 'h900'.*t4"):
        gpu_from_preset("h900")
    with pytest.raises(UnknownDeviceError):
        preset_links("h900")


def test_link_transfer_time_is_latency_plus_bytes_over_bandwidth():
    link = Link("cpu", "gpu", bandwidth_bytes_per_s=2e9, latency_us=10.0)
    assert link.transfer_us(0) == 10.0
    assert link.transfer_us(4_000_000) == pytest.approx(10.0 + 2000.0)
    with pytest.raises(InvalidPlanError, match="bandwidth > 0"):
        Link("cpu", "gpu", 0.0, 1.0).validate()
    with pytest.raises(InvalidPlanError, match="finite latency"):
        Link("cpu", "gpu", 1e9, float("inf")).validate()
    assert not link.shared_memory


def test_a_shared_memory_link_moves_any_tensor_in_no_time_and_round_trips_through_strict_json():
    link = shared_memory_link("cpu0", "cpu1")
    assert link.shared_memory and link.transfer_us(0) == 0 and link.transfer_us(1 << 30) == 0
    devices = DeviceSet((cpu_device(name="cpu0", cores=(0,)), cpu_device(name="cpu1", cores=(1,))),
                        (link, shared_memory_link("cpu1", "cpu0"))).validate()
    text = json.dumps(devices.to_dict(), allow_nan=False)          # no Infinity in the file
    assert DeviceSet.from_dict(json.loads(text)) == devices


def test_device_set_validation():
    devices = two_devices()
    assert devices.names == ("cpu", "gpu") and devices.index("gpu") == 1
    with pytest.raises(UnknownDeviceError, match="unknown device 'tpu'"):
        devices.index("tpu")
    with pytest.raises(InvalidPlanError, match="unique"):
        DeviceSet((cpu_device(), cpu_device())).validate()
    with pytest.raises(UnknownDeviceError, match="no link gpu->cpu"):
        DeviceSet((cpu_device(), gpu_from_preset("t4")), preset_links("t4")[:1]).validate()
    with pytest.raises(InvalidPlanError, match="kind"):
        DeviceSpec("npu", "npu", {}, 1).validate()
    assert DeviceSet.from_dict(json.loads(json.dumps(devices.to_dict()))) == devices


# ---------------------------------------------------------------- costs
def test_cost_table_queries_and_missing_costs():
    lat = np.array([[10.0, 2.0], [5.0, np.nan]])
    costs = CostTable.from_arrays(lat, two_devices(), source="predicted")
    assert costs.latency(0, "gpu") == 2.0 and costs.latency(1, 0) == 5.0
    assert costs.best_device(0) == "gpu" and costs.best_device(1) == "cpu"
    with pytest.raises(MissingCostError, match="not supported on device 'gpu'"):
        costs.latency(1, "gpu")
    with pytest.raises(MissingCostError, match="covers ops 0..1"):
        costs.latency(2, "cpu")
    assert costs.transfer_us(100, "cpu", "cpu") == 0.0
    assert costs.transfer_us(15_750_000, "cpu", "gpu") == pytest.approx(10.0 + 1000.0)


def test_cost_table_rejects_bad_entries_and_foreign_graphs():
    from hetpart.partition.synthetic import synthetic_problem
    with pytest.raises(InvalidCostTableError, match="finite and >= 0"):
        CostTable.from_arrays(np.array([[-1.0, 2.0]]), two_devices())
    with pytest.raises(InvalidCostTableError, match="one column per device"):
        CostTable.from_arrays(np.ones((2, 3)), two_devices())
    graph, costs = synthetic_problem("layered", 6, 0)
    other, _ = synthetic_problem("layered", 7, 0)
    with pytest.raises(InvalidCostTableError, match="7"):
        costs.validate(other)


def test_cost_table_json_round_trip(tmp_path):
    lat = np.array([[10.0, 2.0], [5.0, np.nan]])
    source = np.array([["measured", "analytic"], ["predicted", "analytic"]], dtype=object)
    costs = CostTable.from_arrays(lat, two_devices(), source=source, provenance={"cpu": "poly v1"})
    costs.save(tmp_path / "costs.json")
    back = CostTable.load(tmp_path / "costs.json")
    np.testing.assert_array_equal(back.supported, costs.supported)
    np.testing.assert_array_equal(back.latency_us[costs.supported], costs.latency_us[costs.supported])
    assert back.source.tolist() == source.tolist() and back.provenance == {"cpu": "poly v1"}
    data = costs.to_dict()
    data["schema_version"] = 99
    with pytest.raises(SchemaError, match="schema_version"):
        CostTable.from_dict(data)


# ---------------------------------------------------------------- plans and pins
def test_resolve_pins_by_name_glob_and_op_type():
    from hetpart.partition.synthetic import synthetic_problem
    graph, _ = synthetic_problem("layered", 12, 0)
    convs = {n.id for n in graph.nodes if n.op == "relax.nn.conv2d"}
    assert resolve_pins(graph, {"op1": "gpu"}, ("cpu", "gpu")) == {1: "gpu"}
    assert set(resolve_pins(graph, {"op1*": "cpu"}, ("cpu", "gpu"))) == {1, 10, 11}
    assert set(resolve_pins(graph, {"op:relax.nn.conv2d": "gpu"}, ("cpu", "gpu"))) == convs
    with pytest.raises(PinError, match="names no op"):
        resolve_pins(graph, {"conv_nope": "cpu"}, ("cpu", "gpu"))
    with pytest.raises(PinError, match="not one of"):
        resolve_pins(graph, {"op1": "tpu"}, ("cpu", "gpu"))
    with pytest.raises(PinError, match="pinned to both"):
        resolve_pins(graph, {"op1": "cpu", "op1*": "gpu"}, ("cpu", "gpu"))


def test_plan_validation_and_json_round_trip(tmp_path):
    plan = Plan(("cpu", "gpu", "gpu"), (0, 2, 1), ("cpu", "gpu"), "hand", makespan_us=12.5,
                config={"a": 1}, notes=("n",), stats={"planner_wall_s": 0.1})
    assert plan.ops_on("gpu") == [1, 2]
    plan.save(tmp_path / "p.json")
    assert Plan.load(tmp_path / "p.json") == plan
    with pytest.raises(InvalidPlanError, match="not among its devices"):
        Plan(("cpu", "tpu"), (0, 1), ("cpu", "gpu"), "hand").validate()
    with pytest.raises(InvalidPlanError, match="permutation"):
        Plan(("cpu", "cpu"), (0, 0), ("cpu", "gpu"), "hand").validate()
    with pytest.raises(SchemaError, match="schema_version"):
        Plan.from_dict({**plan.to_dict(), "schema_version": 0})
    with pytest.raises(SchemaError, match="malformed"):
        Plan.from_dict({k: v for k, v in plan.to_dict().items() if k != "order"})


def test_timeline_validation_catches_overlap_and_broken_dependencies(make_tiny):
    graph, _ = make_tiny([(1, 1), (1, 1)], [(0, 1, 4)])
    ok = Timeline((Event("op", 0, "cpu", 0, 5), Event("op", 1, "cpu", 5, 7)), 7)
    ok.validate(graph)
    with pytest.raises(InvalidPlanError, match="two things at once"):
        Timeline((Event("op", 0, "cpu", 0, 5), Event("op", 1, "cpu", 4, 7)), 7).validate()
    with pytest.raises(InvalidPlanError, match="before its input"):
        Timeline((Event("op", 0, "cpu", 0, 5), Event("op", 1, "gpu", 3, 7)), 7).validate(graph)
    assert ok.to_dict()["events"][1] == {"kind": "op", "op_id": 1, "resource": "cpu", "start_us": 5,
                                         "end_us": 7, "size_bytes": 0}
