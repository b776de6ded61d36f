"""Devices and the links between them; datasheet presets for GPUs that cannot be measured here.

Every preset number below is a public datasheet figure (peak FP32 throughput, memory bandwidth, memory size,
host interface) and is labelled ``source="datasheet"``. Achieved figures are lower; the analytic predictor
(``predictors.analytic``) applies efficiency factors on top and labels its costs ``analytic``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

from hetpart.errors import InvalidPlanError, UnknownDeviceError

GIB = 1024 ** 3
GB_PER_S = 1e9


@dataclass(frozen=True)
class DeviceSpec:
    """One device a plan can place ops on."""

    name: str                          # unique name used in plans: "cpu", "gpu"
    kind: str                          # "cpu" or "gpu"
    target: Mapping[str, Any]          # TVM target in dict form, e.g. {"kind": "llvm"} / {"kind": "cuda", "arch": "sm_75"}
    memory_bytes: int
    peak_flops_per_s: float | None = None
    memory_bandwidth_bytes_per_s: float | None = None
    launch_overhead_us: float = 0.0
    source: str = "measured"           # "measured" or "datasheet"
    citation: str = ""
    emulated: bool = False             # GPU vdevice mapped to a second CPU device (no CUDA here)
    cores: tuple[int, ...] = ()        # a CPU device's cores (its worker's threads are pinned there); () = any

    def __post_init__(self) -> None:
        object.__setattr__(self, "target", dict(self.target))
        object.__setattr__(self, "cores", tuple(int(c) for c in self.cores))

    @property
    def threads(self) -> int | None:
        """The TVM thread count of a CPU device restricted to ``cores`` (None: the deployment's count)."""
        return len(self.cores) or None

    def validate(self) -> "DeviceSpec":
        if self.kind not in ("cpu", "gpu"):
            raise InvalidPlanError(f"device {self.name!r}: kind must be 'cpu' or 'gpu'; found {self.kind!r}")
        if self.memory_bytes <= 0:
            raise InvalidPlanError(f"device {self.name!r}: memory_bytes must be > 0; found {self.memory_bytes}")
        if self.cores and (self.kind != "cpu" or len(set(self.cores)) != len(self.cores) or min(self.cores) < 0):
            raise InvalidPlanError(f"device {self.name!r}: cores must be distinct core ids >= 0 of a CPU device; "
                                   f"found {list(self.cores)} on a {self.kind}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "target": dict(self.target),
                "memory_bytes": self.memory_bytes, "peak_flops_per_s": self.peak_flops_per_s,
                "memory_bandwidth_bytes_per_s": self.memory_bandwidth_bytes_per_s,
                "launch_overhead_us": self.launch_overhead_us, "source": self.source,
                "citation": self.citation, "emulated": self.emulated, "cores": list(self.cores)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "DeviceSpec":
        return cls(**data).validate()


@dataclass(frozen=True)
class Link:
    """A one-directional copy path: time = latency_us + size_bytes / bandwidth_bytes_per_s * 1e6.

    Two devices that address the same memory (CPU devices on disjoint cores of one host) are joined by a
    :func:`shared_memory_link`: infinite bandwidth and no latency, so a tensor crosses it in 0 us (the task runtime
    hands it over without copying)."""

    src: str
    dst: str
    bandwidth_bytes_per_s: float
    latency_us: float
    source: str = "datasheet"   # "measured", "datasheet" or "shared memory"

    def validate(self) -> "Link":
        if not self.bandwidth_bytes_per_s > 0 or not 0 <= self.latency_us < math.inf:
            raise InvalidPlanError(
                f"link {self.src}->{self.dst} needs bandwidth > 0 and a finite latency >= 0; found "
                f"{self.bandwidth_bytes_per_s} B/s, {self.latency_us} us")
        return self

    @property
    def shared_memory(self) -> bool:
        """Whether a tensor crosses this link without a copy."""
        return self.latency_us == 0 and math.isinf(self.bandwidth_bytes_per_s)

    def transfer_us(self, size_bytes: int) -> float:
        return self.latency_us + size_bytes / self.bandwidth_bytes_per_s * 1e6

    def to_dict(self) -> dict[str, Any]:
        bandwidth = None if math.isinf(self.bandwidth_bytes_per_s) else self.bandwidth_bytes_per_s   # JSON has no inf
        return {"src": self.src, "dst": self.dst, "bandwidth_bytes_per_s": bandwidth,
                "latency_us": self.latency_us, "source": self.source}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Link":
        fields = dict(data)
        if fields.get("bandwidth_bytes_per_s", 0) is None:
            fields["bandwidth_bytes_per_s"] = math.inf
        return cls(**fields).validate()


def shared_memory_link(src: str, dst: str) -> Link:
    """The link between two devices that address the same memory: a tensor crosses it in 0 us."""
    return Link(src, dst, math.inf, 0.0, "shared memory")


@dataclass(frozen=True)
class GpuPreset:
    """Datasheet figures of one GPU (FP32 peak, DRAM bandwidth, memory, host link)."""

    name: str
    description: str
    peak_flops_per_s: float
    memory_bandwidth_bytes_per_s: float
    memory_bytes: int
    arch: str                           # CUDA compute capability for the TVM target, e.g. "sm_75"
    host_link_bandwidth_bytes_per_s: float   # PCIe theoretical per direction (or shared DRAM for SoCs)
    host_link_latency_us: float
    launch_overhead_us: float
    citation: str


# Public datasheet figures. PCIe 3.0 x16 = 15.75 GB/s, PCIe 4.0 x16 = 31.5 GB/s per direction (PCI-SIG).
# Launch overhead ~5 us and copy latency ~10 us are typical CUDA figures (CUDA C Best Practices Guide).
GPU_PRESETS: dict[str, GpuPreset] = {p.name: p for p in (
    GpuPreset("p2200", "NVIDIA Quadro P2200 (Pascal, 1280 CUDA cores)",
              3.8e12, 200 * GB_PER_S, 5 * GIB, "sm_61", 15.75 * GB_PER_S, 10.0, 5.0,
              "NVIDIA Quadro P2200 datasheet: 3.8 TFLOPS FP32, 5 GB GDDR5X, 200 GB/s, PCIe 3.0 x16"),
    GpuPreset("t4", "NVIDIA T4 (Turing, 70 W)",
              8.1e12, 320 * GB_PER_S, 16 * GIB, "sm_75", 15.75 * GB_PER_S, 10.0, 5.0,
              "NVIDIA T4 datasheet: 8.1 TFLOPS FP32, 16 GB GDDR6, 320 GB/s, PCIe 3.0 x16"),
    GpuPreset("a100", "NVIDIA A100 40GB PCIe (Ampere)",
              19.5e12, 1555 * GB_PER_S, 40 * GIB, "sm_80", 31.5 * GB_PER_S, 10.0, 4.0,
              "NVIDIA A100 datasheet: 19.5 TFLOPS FP32, 40 GB HBM2, 1,555 GB/s, PCIe 4.0 x16"),
    GpuPreset("rtx3090", "NVIDIA GeForce RTX 3090 (Ampere)",
              35.6e12, 936 * GB_PER_S, 24 * GIB, "sm_86", 31.5 * GB_PER_S, 10.0, 4.0,
              "NVIDIA GeForce RTX 3090 specifications: 35.6 TFLOPS FP32, 24 GB GDDR6X, 936 GB/s, PCIe 4.0"),
    GpuPreset("jetson-orin", "NVIDIA Jetson AGX Orin 64GB (2048-core Ampere iGPU, shared LPDDR5)",
              5.3e12, 204.8 * GB_PER_S, 64 * GIB, "sm_87", 204.8 * GB_PER_S, 5.0, 6.0,
              "NVIDIA Jetson AGX Orin datasheet: 2048 CUDA cores @1.3 GHz (5.3 TFLOPS FP32), 204.8 GB/s "
              "LPDDR5 shared with the CPU (copies are DRAM-to-DRAM)"),
)}

DEFAULT_GPU_PRESET = "p2200"


def cpu_device(memory_bytes: int = 16 * GIB, target: Mapping[str, Any] | None = None, *, name: str = "cpu",
               cores: tuple[int, ...] = ()) -> DeviceSpec:
    """A CPU device (the host, or a group of its ``cores``); its costs are measured (or predicted from
    measurements) with TVM."""
    return DeviceSpec(name=name, kind="cpu", target=dict(target or {"kind": "llvm"}),
                      memory_bytes=memory_bytes, source="measured", cores=tuple(cores))


def gpu_from_preset(preset: str, name: str = "gpu") -> DeviceSpec:
    try:
        p = GPU_PRESETS[preset.lower()]
    except KeyError:
        raise UnknownDeviceError(
            f"unknown GPU preset {preset!r}; known presets: {', '.join(sorted(GPU_PRESETS))} "
            "(e.g. --devices cpu,gpu=t4)") from None
    return DeviceSpec(name=name, kind="gpu", target={"kind": "cuda", "arch": p.arch},
                      memory_bytes=p.memory_bytes, peak_flops_per_s=p.peak_flops_per_s,
                      memory_bandwidth_bytes_per_s=p.memory_bandwidth_bytes_per_s,
                      launch_overhead_us=p.launch_overhead_us, source="datasheet",
                      citation=f"{p.name}: {p.citation}")


def preset_links(preset: str, cpu: str = "cpu", gpu: str = "gpu") -> tuple[Link, Link]:
    """Host<->GPU links from the preset's datasheet interface (both directions)."""
    p = GPU_PRESETS[preset.lower()] if preset.lower() in GPU_PRESETS else None
    if p is None:
        raise UnknownDeviceError(f"unknown GPU preset {preset!r}; known presets: {', '.join(sorted(GPU_PRESETS))}")
    return (Link(cpu, gpu, p.host_link_bandwidth_bytes_per_s, p.host_link_latency_us, "datasheet"),
            Link(gpu, cpu, p.host_link_bandwidth_bytes_per_s, p.host_link_latency_us, "datasheet"))


def interchangeable_cpu_groups(devices: Iterable[tuple[str, str, Sequence[int]]]) -> tuple[tuple[str, ...], ...]:
    """Groups (two or more, in the order given) of CPU devices (name, kind, cores) that are core groups of one host
    with as many cores each: a segment planned on one runs as fast on another, so the task runtime lets a worker
    with nothing of its own to do run a newly ready segment of the others itself (docs/runtime_model.md)."""
    by_size: dict[int, list[str]] = {}
    for name, kind, cores in devices:
        if kind == "cpu" and len(cores) > 0:
            by_size.setdefault(len(cores), []).append(str(name))
    return tuple(tuple(names) for names in by_size.values() if len(names) > 1)


@dataclass(frozen=True)
class DeviceSet:
    """The devices of one plan plus the links between every ordered pair of distinct devices."""

    devices: tuple[DeviceSpec, ...]
    links: tuple[Link, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", tuple(self.devices))
        object.__setattr__(self, "links", tuple(self.links))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.devices)

    def index(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise UnknownDeviceError(f"unknown device {name!r}; this plan has devices {list(self.names)}") from None

    def device(self, name: str) -> DeviceSpec:
        return self.devices[self.index(name)]

    def link(self, src: str, dst: str) -> Link:
        for link in self.links:
            if link.src == src and link.dst == dst:
                return link
        raise UnknownDeviceError(f"no link {src}->{dst}; links: {[(l.src, l.dst) for l in self.links]}")

    def validate(self) -> "DeviceSet":
        names = self.names
        if len(set(names)) != len(names) or not names:
            raise InvalidPlanError(f"device names must be unique and non-empty; found {list(names)}")
        for d in self.devices:
            d.validate()
        for link in self.links:
            link.validate()
            if link.src not in names or link.dst not in names:
                raise InvalidPlanError(f"link {link.src}->{link.dst} names a device not in {list(names)}")
        for a in names:
            for b in names:
                if a != b:
                    self.link(a, b)
        return self

    def interchangeable_groups(self) -> tuple[tuple[str, ...], ...]:
        """Groups of devices whose task-runtime workers may run each other's segments (``interchangeable_cpu_groups``),
        keeping only pairs joined by shared-memory links."""
        groups = interchangeable_cpu_groups((d.name, d.kind, d.cores) for d in self.devices)
        shared = [tuple(n for n in g if all(self.link(n, m).shared_memory for m in g if m != n)) for g in groups]
        return tuple(g for g in shared if len(g) > 1)

    def with_device(self, device: DeviceSpec) -> "DeviceSet":
        return replace(self, devices=tuple(device if d.name == device.name else d for d in self.devices))

    def to_dict(self) -> dict[str, Any]:
        return {"devices": [d.to_dict() for d in self.devices], "links": [l.to_dict() for l in self.links]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "DeviceSet":
        return cls(tuple(DeviceSpec.from_dict(d) for d in data["devices"]),
                   tuple(Link.from_dict(l) for l in data["links"])).validate()
