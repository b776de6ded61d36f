"""``--devices``: which devices a plan may use, and the links between them.

Grammar (comma-separated, the host CPU first)::

    cpu                      the host CPU, every core (TVM_NUM_THREADS threads)
    cpu:0-1 / cpu:3          a CPU device restricted to these cores (its worker's threads are pinned there)
    cpu:0,cpu:1              two CPU devices, one core each: named cpu0 and cpu1, cpu0 is the host
    gpu / gpu=<preset>       one GPU, costed from a datasheet preset (default p2200)

Several CPU devices need disjoint explicit cores. Their costs come from the CPU predictor at the device's thread
count (one thread per core). They address the same memory, so a tensor passes from one to another without a copy
(a :func:`hetpart.devices.shared_memory_link`; the task runtime hands the producer's tensor to the consumer).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hetpart.devices import (DEFAULT_GPU_PRESET, DeviceSet, DeviceSpec, Link, cpu_device, gpu_from_preset,
                              preset_links, shared_memory_link)
from hetpart.errors import UnknownDeviceError
from hetpart.threads import PROCESS_CORES

DEFAULT_DEVICES = "cpu,gpu"


@dataclass(frozen=True)
class DeviceChoice:
    devices: DeviceSet
    gpu_preset: str | None          # analytic preset for the GPU's costs (None: no GPU offered)

    @property
    def spec(self) -> str:
        """The canonical ``--devices`` string, recorded in every plan."""
        items = []
        for device in self.devices.devices:
            if device.kind == "cpu":
                items.append("cpu" + (f":{_cores_text(device.cores)}" if device.cores else ""))
            else:
                items.append(f"gpu={self.gpu_preset}")
        return ",".join(items)

    @property
    def cpu_devices(self) -> tuple[DeviceSpec, ...]:
        return tuple(d for d in self.devices.devices if d.kind == "cpu")


def _cores_text(cores: Sequence[int]) -> str:
    cores = sorted(cores)
    if cores == list(range(cores[0], cores[-1] + 1)) and len(cores) > 1:
        return f"{cores[0]}-{cores[-1]}"
    return "+".join(str(c) for c in cores)


def parse_cores(text: str, spec: str) -> tuple[int, ...]:
    """``"0"``, ``"0-3"`` or ``"0+2"`` -> core ids, each one this process may run on."""
    cores: list[int] = []
    try:
        for part in text.split("+"):
            low, _, high = part.partition("-")
            cores.extend(range(int(low), int(high or low) + 1))
    except ValueError:
        raise UnknownDeviceError(f"cpu:{text} in --devices {spec!r}: cores must be N, N-M or N+M (e.g. cpu:0,cpu:1)"
                                 ) from None
    allowed = list(PROCESS_CORES)
    if not cores or len(set(cores)) != len(cores) or not set(cores) <= set(allowed):
        raise UnknownDeviceError(f"cpu:{text} in --devices {spec!r}: cores must be distinct and among this process's "
                                 f"cores {allowed}")
    return tuple(cores)


def parse_devices(spec: str | Sequence[str]) -> DeviceChoice:
    """``"cpu,gpu=t4"`` / ``"cpu,gpu"`` (default preset) / ``"cpu"`` / ``"cpu:0,cpu:1"`` -> devices and links
    (see the module docstring)."""
    text = spec if isinstance(spec, str) else ",".join(spec)
    items = [s.strip() for s in text.split(",") if s.strip()]
    if not items or not (items[0] == "cpu" or items[0].startswith("cpu:")):
        raise UnknownDeviceError(f"--devices must start with the host cpu, e.g. cpu,gpu=p2200 or cpu:0,cpu:1; "
                                 f"found {text!r}")
    cpu_items = [i for i in items if i == "cpu" or i.startswith("cpu:")]
    other = [i for i in items if i not in cpu_items]
    cpus: list[DeviceSpec] = []
    if len(cpu_items) == 1:
        cores = parse_cores(cpu_items[0][4:], text) if cpu_items[0] != "cpu" else ()
        cpus.append(cpu_device(cores=cores))
    else:
        if "cpu" in cpu_items:
            raise UnknownDeviceError(f"--devices {text!r}: with several CPU devices give each its cores "
                                     "(e.g. cpu:0,cpu:1)")
        taken: set[int] = set()
        for k, item in enumerate(cpu_items):
            cores = parse_cores(item[4:], text)
            if taken & set(cores):
                raise UnknownDeviceError(f"--devices {text!r}: CPU devices must not share cores; "
                                         f"{sorted(taken & set(cores))} appear twice")
            taken |= set(cores)
            cpus.append(cpu_device(name=f"cpu{k}", cores=cores))
    devices: list[DeviceSpec] = list(cpus)
    links: list[Link] = []
    for a in cpus:
        for b in cpus:
            if a.name != b.name:
                links.append(shared_memory_link(a.name, b.name))
    preset = None
    for item in other:
        name, _, value = item.partition("=")
        if name != "gpu" or preset is not None:
            raise UnknownDeviceError(f"unknown device {item!r} in {text!r}: hetpart plans for CPU devices and at most "
                                     "one gpu (gpu=<preset>, e.g. gpu=t4)")
        preset = (value or DEFAULT_GPU_PRESET).lower()
        if preset == "cuda":
            raise UnknownDeviceError("gpu=cuda needs a measured GPU predictor, which only a machine with CUDA can "
                                     "produce (`hetpart profile --device gpu`); use a datasheet preset such as gpu=t4")
        devices.append(gpu_from_preset(preset))
        for cpu in cpus:
            links.extend(preset_links(preset, cpu=cpu.name))
    return DeviceChoice(DeviceSet(tuple(devices), tuple(links)).validate(), preset)
