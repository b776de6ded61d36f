"""single_vm_plan: a plan's CPU core groups folded into the host for the one-VM executable, GPUs kept."""
from __future__ import annotations

import pytest

pytest.importorskip("tvm")

from hetpart.devices import DeviceSet, cpu_device, gpu_from_preset  # noqa: E402
from hetpart.plan import Plan  # noqa: E402
from tvm_passes.vdevices import single_vm_plan, vdevice_order  # noqa: E402

pytestmark = pytest.mark.tvm

DEVICES = DeviceSet((cpu_device(name="cpu0", cores=(0,)), cpu_device(name="cpu1", cores=(1,)),
                     gpu_from_preset("t4")))


def plan(device_of, devices=("cpu0", "cpu1", "gpu")) -> Plan:
    return Plan(device_of=tuple(device_of), order=tuple(range(len(device_of))), devices=devices, method="test")


def test_core_groups_fold_into_the_host_and_gpu_ops_stay():
    merged = single_vm_plan(plan(["cpu1", "cpu0", "gpu", "cpu1"]), DEVICES)
    assert merged.device_of == ("cpu0", "cpu0", "gpu", "cpu0")
    assert merged.devices == ("cpu0", "gpu") and merged.order == (0, 1, 2, 3) and merged.method == "test"
    assert [d.name for d in vdevice_order(merged, DEVICES)] == ["cpu0", "gpu"]


def test_a_plan_without_a_second_core_group_is_returned_as_it_is():
    unchanged = plan(["cpu0", "gpu"], devices=("cpu0", "gpu"))
    assert single_vm_plan(unchanged, DEVICES) is unchanged


def test_a_core_group_offered_but_unused_leaves_the_devices():
    offered_but_unused = plan(["cpu0", "cpu0"], devices=("cpu0", "cpu1"))
    assert single_vm_plan(offered_but_unused, DEVICES).devices == ("cpu0",)


def test_only_the_non_host_group_used_still_lands_on_the_host():
    merged = single_vm_plan(plan(["cpu1", "gpu"], devices=("cpu1", "gpu")), DEVICES)
    assert merged.device_of == ("cpu0", "gpu") and merged.devices == ("cpu0", "gpu")
