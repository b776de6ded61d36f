"""Where the task runtime's workers run (:mod:`hetpart.driver.task_runtime`): the TVM device of each planned device,
which devices share memory, each CPU device's cores and pool threads, and which CPU core groups may share work."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from hetpart.devices import interchangeable_cpu_groups
from hetpart.errors import InvalidPlanError


@dataclass(frozen=True)
class DeviceLayout:
    names: tuple[str, ...]                          # the host first, then every recorded or planned device
    runtime_devices: Mapping[str, Any]              # name -> TVM device its worker runs on
    cuda_names: frozenset[str]                      # devices whose segments were compiled for CUDA
    memory_of: Mapping[str, tuple[int, int]]        # name -> (DLPack device type, index): equal = no copy
    cores: Mapping[str, tuple[int, ...]]            # recorded cores of a CPU device (its pool is pinned there)
    threads: Mapping[str, int]                      # TVM pool threads of a device's worker
    peers: Mapping[str, frozenset[str]]             # interchangeable CPU core groups of the same memory


def device_layout(build: Any, host: str, planned: Sequence[str], runtime_devices: Mapping[str, Any] | None,
                  threads_per_device: Mapping[str, int] | None, peers_wanted: bool) -> DeviceLayout:
    """CPU devices share ``cpu(0)``; a GPU runs on ``cuda(k)`` when its segments were compiled for CUDA, else it is
    emulated on the next ``cpu(i)`` (unless ``runtime_devices`` maps the devices itself)."""
    import tvm

    recorded = list(getattr(build, "devices", ()) or ())
    names = tuple(dict.fromkeys([host] + [d["name"] for d in recorded] + list(planned)))
    kinds = {d["name"]: d["kind"] for d in recorded}
    cuda_names: frozenset[str] = frozenset()
    if getattr(build, "gpu_executable", None) is not None:
        cuda_names = frozenset(n for n in names if n != host and kinds.get(n, "gpu") == "gpu")
    if runtime_devices is None:
        cpu_names = [n for n in names if n not in cuda_names                     # unrecorded: the host only
                     and kinds.get(n, "cpu" if n == host else "gpu") == "cpu"]
        emulated = [n for n in names if n not in cuda_names and n not in cpu_names]
        runtime_devices = {name: tvm.cpu(0) for name in cpu_names}
        runtime_devices.update({name: tvm.cpu(k) for k, name in enumerate(emulated, start=1)})
        runtime_devices.update({name: tvm.cuda(k) for k, name in enumerate(sorted(cuda_names))})
    unknown = [n for n in names if n not in runtime_devices]
    if unknown:
        raise InvalidPlanError(f"segments run on devices {unknown} that runtime_devices does not map")
    memory_of = {name: (int(dev.dlpack_device_type()), int(dev.index)) for name, dev in runtime_devices.items()}
    cores = {str(d["name"]): tuple(int(c) for c in d.get("cores", ())) for d in recorded}
    threads = {name: len(c) for name, c in cores.items() if c}
    threads.update(threads_per_device or {})
    groups = interchangeable_cpu_groups((n, kinds.get(n, ""), cores.get(n, ())) for n in names
                                        if n not in cuda_names) if peers_wanted else ()
    peers = {n: frozenset(g) - {n} for g in groups for n in g if all(memory_of[m] == memory_of[n] for m in g)}
    return DeviceLayout(names, dict(runtime_devices), cuda_names, memory_of, cores, threads, peers)
