"""``--devices``: the grammar (host CPU, CPU devices on core groups, one GPU preset), its errors, and the
canonical spec a plan records."""
from __future__ import annotations

import os

import pytest

from hetpart.devices import DeviceSpec, cpu_device
from hetpart.driver.device_choice import parse_devices
from hetpart.errors import InvalidPlanError, UnknownDeviceError

CORES = sorted(os.sched_getaffinity(0))
two_cores = pytest.mark.skipif(len(CORES) < 2, reason="needs a process allowed on two cores")


def test_host_and_gpu_keep_their_names_and_spec():
    choice = parse_devices("cpu,gpu=t4")
    assert choice.devices.names == ("cpu", "gpu") and choice.spec == "cpu,gpu=t4" and choice.gpu_preset == "t4"
    assert parse_devices("cpu").spec == "cpu" and parse_devices(["cpu", "gpu"]).spec == "cpu,gpu=p2200"
    assert choice.devices.device("cpu").cores == () and choice.devices.device("cpu").threads is None


@two_cores
def test_two_cpu_devices_on_their_own_cores():
    a, b = CORES[:2]
    choice = parse_devices(f"cpu:{a},cpu:{b}")
    assert choice.devices.names == ("cpu0", "cpu1") and choice.gpu_preset is None
    assert choice.devices.device("cpu0").cores == (a,) and choice.devices.device("cpu1").threads == 1
    assert choice.spec == f"cpu:{a},cpu:{b}" and parse_devices(choice.spec).spec == choice.spec
    link = choice.devices.link("cpu0", "cpu1")
    assert link.shared_memory and link.source == "shared memory" and link.transfer_us(1 << 20) == 0
    with_gpu = parse_devices(f"cpu:{a},cpu:{b},gpu=a100")
    assert with_gpu.devices.names == ("cpu0", "cpu1", "gpu")
    assert {(l.src, l.dst) for l in with_gpu.devices.links} >= {("cpu0", "gpu"), ("gpu", "cpu1")}


@two_cores
def test_cpu_devices_are_checked_against_the_process_cores_not_a_pinned_thread():
    """TVM pins the thread that launches its first kernel to one core when it runs one thread (TVM_NUM_THREADS=1):
    the process may still use every core, and --devices must still accept them."""
    a, b = CORES[:2]
    os.sched_setaffinity(0, {a})
    try:
        assert parse_devices(f"cpu:{a},cpu:{b}").devices.device("cpu1").cores == (b,)
    finally:
        os.sched_setaffinity(0, CORES)


@two_cores
def test_a_core_range_is_one_device():
    a, b = CORES[:2]
    choice = parse_devices(f"cpu:{a}-{b}" if b == a + 1 else f"cpu:{a}+{b}")
    assert choice.devices.names == ("cpu",) and choice.devices.device("cpu").threads == 2


@pytest.mark.parametrize("spec, message", [
    ("gpu,cpu", "must start with the host cpu"),
    ("cpu,cpu", "give each its cores"),
    ("cpu:x", "cores must be N, N-M or N[+]M"),
    ("cpu:100000", "among this process's cores"),
    ("cpu,gpu=t4,gpu=a100", "at most one gpu"),
    ("cpu,tpu", "unknown device"),
])
def test_bad_specs_name_the_fix(spec, message):
    with pytest.raises(UnknownDeviceError, match=message):
        parse_devices(spec)


@two_cores
def test_cpu_devices_must_not_share_cores():
    with pytest.raises(UnknownDeviceError, match="must not share cores"):
        parse_devices(f"cpu:{CORES[0]},cpu:{CORES[0]}-{CORES[0]}")


def test_cores_round_trip_and_validate():
    device = cpu_device(name="cpu1", cores=(1,))
    assert DeviceSpec.from_dict(device.to_dict()) == device
    old = {k: v for k, v in device.to_dict().items() if k != "cores"}       # written before devices had cores
    assert DeviceSpec.from_dict(old).cores == ()
    with pytest.raises(InvalidPlanError, match="distinct core ids"):
        cpu_device(cores=(1, 1)).validate()
