"""Training clusters: the devices a model is pipelined over and the links between them.

A :class:`Cluster` is a tuple of :class:`TrainDevice` (GPUs from the datasheet presets of
:mod:`hetpart.devices`, or local CPU processes) placed on one or more nodes, plus two link presets: the
intra-node link (PCIe, NVLink, or loopback for CPU processes) and the inter-node link (Ethernet, InfiniBand).
Every link figure is a public datasheet number (``source="datasheet"``) except where no datasheet applies
(loopback between CPU processes, latencies of network stacks), which are labelled ``source="assumed"``.

Spec strings (``Cluster.parse``), items separated by commas::

    gpu=a100x4            four A100s (also "a100x4", "gpu=a100" for one)
    gpu=a100x2,gpu=t4x2   two A100s and two T4s
    cpu:2                 two CPU processes on this host (also "cpux2", "cpu=2")
    link=nvlink           the intra-node link (pcie | pcie3 | pcie4 | nvlink | loopback | ethernet | infiniband)
    inter=ethernet        the inter-node link
    per_node=4            devices per node, in order (default: all devices on one node)

Device names are ``gpu0, gpu1, ...`` and ``cpu0, cpu1, ...`` in spec order; a device's index in
``Cluster.devices`` is its rank.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from hetpart.devices import GB_PER_S, GIB, GPU_PRESETS, DeviceSpec, Link, gpu_from_preset
from hetpart.errors import InvalidClusterError

CPU_PRESET = "cpu"
DEFAULT_CPU_MEMORY_BYTES = 16 * GIB   # the host memory hetpart assumes for the CPU (hetpart.devices.cpu_device)


@dataclass(frozen=True)
class LinkPreset:
    """A symmetric, full-duplex link kind: time per message = latency_us + size_bytes / bandwidth * 1e6."""

    name: str
    bandwidth_bytes_per_s: float        # per direction
    latency_us: float
    source: str                          # "datasheet" or "assumed"
    citation: str = ""

    def validate(self) -> "LinkPreset":
        if not (self.bandwidth_bytes_per_s > 0 and math.isfinite(self.bandwidth_bytes_per_s)) \
                or not (self.latency_us >= 0):
            raise InvalidClusterError(
                f"link preset {self.name!r} needs bandwidth > 0 and latency >= 0; found "
                f"{self.bandwidth_bytes_per_s} B/s and {self.latency_us} us")
        if self.source not in ("datasheet", "assumed", "measured"):
            raise InvalidClusterError(f"link preset {self.name!r}: source must be datasheet, assumed or measured; "
                                      f"found {self.source!r}")
        return self

    def transfer_us(self, size_bytes: float) -> float:
        return self.latency_us + size_bytes / self.bandwidth_bytes_per_s * 1e6

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
                "latency_us": self.latency_us, "source": self.source, "citation": self.citation}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "LinkPreset":
        try:
            return cls(**data).validate()
        except TypeError as exc:
            raise InvalidClusterError(f"link preset JSON is malformed: {exc}") from exc


# Bandwidths per direction. PCIe x16: PCI-SIG; NVLink 3: NVIDIA A100 datasheet (600 GB/s total over 12 links,
# 300 GB/s per direction); 10 GbE and HDR InfiniBand: their line rates. The 10 us PCIe latency is the copy
# latency of hetpart.devices' presets.
LINK_PRESETS: dict[str, LinkPreset] = {p.name: p for p in (
    LinkPreset("pcie3", 15.75 * GB_PER_S, 10.0, "datasheet", "PCIe 3.0 x16: 15.75 GB/s per direction (PCI-SIG)"),
    LinkPreset("pcie4", 31.5 * GB_PER_S, 10.0, "datasheet", "PCIe 4.0 x16: 31.5 GB/s per direction (PCI-SIG)"),
    LinkPreset("nvlink", 300 * GB_PER_S, 5.0, "datasheet",
               "NVLink 3 (A100): 600 GB/s bidirectional, 300 GB/s per direction (NVIDIA A100 datasheet); "
               "latency assumed"),
    LinkPreset("ethernet", 1.25 * GB_PER_S, 50.0, "datasheet",
               "10 Gigabit Ethernet line rate (1.25 GB/s); latency assumed (TCP stack)"),
    LinkPreset("infiniband", 25 * GB_PER_S, 5.0, "datasheet",
               "InfiniBand HDR 200 Gb/s line rate (25 GB/s); latency assumed"),
    LinkPreset("loopback", 2 * GB_PER_S, 20.0, "assumed",
               "processes on one host exchanging tensors through the loopback interface: assumed, not measured"),
)}


def link_preset(name: str, devices: Sequence["TrainDevice"] = ()) -> LinkPreset:
    """A link preset by name; ``pcie`` means the slowest PCIe generation among ``devices``' host interfaces."""
    key = name.lower()
    if key == "pcie":
        rates = [GPU_PRESETS[d.preset].host_link_bandwidth_bytes_per_s for d in devices if d.preset in GPU_PRESETS]
        return LINK_PRESETS["pcie3" if not rates or min(rates) < LINK_PRESETS["pcie4"].bandwidth_bytes_per_s
                             else "pcie4"]
    try:
        return LINK_PRESETS[key]
    except KeyError:
        raise InvalidClusterError(
            f"unknown link preset {name!r}; known: pcie, {', '.join(sorted(LINK_PRESETS))}") from None


@dataclass(frozen=True)
class TrainDevice:
    """One training worker: a GPU (datasheet preset) or one CPU process."""

    name: str                                  # "gpu0", "cpu1"
    kind: str                                  # "gpu" or "cpu"
    preset: str                                # GPU preset name ("a100") or "cpu"; devices with equal presets are identical
    memory_bytes: int
    peak_flops_per_s: float | None = None
    memory_bandwidth_bytes_per_s: float | None = None
    node: int = 0
    source: str = "datasheet"                  # "datasheet" (GPU presets) or "assumed" (CPU process memory share)
    citation: str = ""

    def validate(self) -> "TrainDevice":
        if self.kind not in ("cpu", "gpu"):
            raise InvalidClusterError(f"device {self.name!r}: kind must be 'cpu' or 'gpu'; found {self.kind!r}")
        if self.kind == "gpu" and self.preset not in GPU_PRESETS:
            raise InvalidClusterError(f"device {self.name!r}: unknown GPU preset {self.preset!r}; known: "
                                      f"{', '.join(sorted(GPU_PRESETS))}")
        if self.kind == "cpu" and self.preset != CPU_PRESET:
            raise InvalidClusterError(f"device {self.name!r}: a CPU device has preset 'cpu'; found {self.preset!r}")
        if self.memory_bytes <= 0 or self.node < 0:
            raise InvalidClusterError(f"device {self.name!r}: memory_bytes must be > 0 and node >= 0; found "
                                      f"{self.memory_bytes} and {self.node}")
        return self

    def to_device_spec(self) -> DeviceSpec:
        """The inference-side DeviceSpec of this device (for building a CostTable)."""
        if self.kind == "gpu":
            return gpu_from_preset(self.preset, name=self.name)
        return DeviceSpec(name=self.name, kind="cpu", target={"kind": "llvm"}, memory_bytes=self.memory_bytes,
                          source="measured")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "preset": self.preset, "memory_bytes": self.memory_bytes,
                "peak_flops_per_s": self.peak_flops_per_s,
                "memory_bandwidth_bytes_per_s": self.memory_bandwidth_bytes_per_s, "node": self.node,
                "source": self.source, "citation": self.citation}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TrainDevice":
        try:
            return cls(**data).validate()
        except TypeError as exc:
            raise InvalidClusterError(f"training device JSON is malformed: {exc}") from exc


def gpu_device(preset: str, name: str, node: int = 0) -> TrainDevice:
    p = GPU_PRESETS.get(preset.lower())
    if p is None:
        raise InvalidClusterError(f"unknown GPU preset {preset!r}; known presets: {', '.join(sorted(GPU_PRESETS))} "
                                  "(e.g. gpu=a100x4)")
    return TrainDevice(name=name, kind="gpu", preset=p.name, memory_bytes=p.memory_bytes,
                       peak_flops_per_s=p.peak_flops_per_s, memory_bandwidth_bytes_per_s=p.memory_bandwidth_bytes_per_s,
                       node=node, source="datasheet", citation=p.citation)


def cpu_process(name: str, memory_bytes: int, node: int = 0) -> TrainDevice:
    return TrainDevice(name=name, kind="cpu", preset=CPU_PRESET, memory_bytes=memory_bytes, node=node,
                       source="assumed", citation="an equal share of the host memory per CPU process (assumed)")


@dataclass(frozen=True)
class Cluster:
    """Training devices (rank = position), grouped into nodes, with an intra-node and an inter-node link."""

    devices: tuple[TrainDevice, ...]
    intra_node_link: LinkPreset
    inter_node_link: LinkPreset = field(default_factory=lambda: LINK_PRESETS["ethernet"])
    spec: str = ""                              # the spec string this cluster was parsed from ("" if built in code)

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", tuple(self.devices))

    # ---------------------------------------------------------------- construction
    @classmethod
    def identical(cls, preset: str, count: int, link: str = "pcie", *, per_node: int | None = None,
                  inter: str = "ethernet", cpu_memory_bytes: int = DEFAULT_CPU_MEMORY_BYTES) -> "Cluster":
        """``count`` devices of one preset (``"a100"``, ``"t4"``, ... or ``"cpu"`` for CPU processes)."""
        if count < 1:
            raise InvalidClusterError(f"a cluster needs at least one device; found count={count}")
        item = f"cpu:{count}" if preset.lower() == CPU_PRESET else f"gpu={preset}x{count}"
        if preset.lower() == CPU_PRESET and link == "pcie":
            link = "loopback"
        parts = [item, f"link={link}", f"inter={inter}"] + ([f"per_node={per_node}"] if per_node else [])
        return cls.parse(",".join(parts), cpu_memory_bytes=cpu_memory_bytes)

    @classmethod
    def parse(cls, spec: str, *, cpu_memory_bytes: int = DEFAULT_CPU_MEMORY_BYTES) -> "Cluster":
        """Parse a spec string (see the module docstring). CPU processes share ``cpu_memory_bytes`` equally."""
        if isinstance(spec, Cluster):
            return spec
        items = [s.strip() for s in str(spec).split(",") if s.strip()]
        groups: list[tuple[str, int]] = []
        options = {"link": None, "inter": "ethernet", "per_node": None}
        for item in items:
            key, sep, value = item.partition("=")
            key = key.strip().lower()
            if sep and key in options:
                options[key] = value.strip()
                continue
            groups.append(_parse_group(item, spec))
        if not groups:
            raise InvalidClusterError(f"cluster spec {spec!r} names no device; e.g. 'gpu=a100x4' or 'cpu:2'")
        n_cpu = sum(n for p, n in groups if p == CPU_PRESET)
        devices: list[TrainDevice] = []
        per_node = None
        if options["per_node"] is not None:
            try:
                per_node = int(options["per_node"])
            except ValueError:
                per_node = 0
            if per_node < 1:
                raise InvalidClusterError(f"per_node must be a positive integer; found {options['per_node']!r}")
        counters = {"gpu": 0, "cpu": 0}
        for preset, count in groups:
            for _ in range(count):
                rank = len(devices)
                node = rank // per_node if per_node else 0
                if preset == CPU_PRESET:
                    devices.append(cpu_process(f"cpu{counters['cpu']}", cpu_memory_bytes // max(n_cpu, 1), node))
                    counters["cpu"] += 1
                else:
                    devices.append(gpu_device(preset, f"gpu{counters['gpu']}", node))
                    counters["gpu"] += 1
        link_name = options["link"] or ("loopback" if all(d.kind == "cpu" for d in devices) else "pcie")
        cluster = cls(tuple(devices), link_preset(link_name, devices), link_preset(str(options["inter"]), devices),
                      spec=",".join(items))
        return cluster.validate()

    # ---------------------------------------------------------------- queries
    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.devices)

    @property
    def size(self) -> int:
        return len(self.devices)

    @property
    def presets(self) -> tuple[str, ...]:
        """Distinct presets in order of first appearance (the device types of the heterogeneous planner)."""
        return tuple(dict.fromkeys(d.preset for d in self.devices))

    @property
    def is_homogeneous(self) -> bool:
        return len(self.presets) == 1

    @property
    def num_nodes(self) -> int:
        return len({d.node for d in self.devices})

    def index(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise InvalidClusterError(f"unknown device {name!r}; this cluster has {list(self.names)}") from None

    def device(self, name: str) -> TrainDevice:
        return self.devices[self.index(name)]

    def link_between(self, src: str, dst: str) -> LinkPreset:
        a, b = self.device(src), self.device(dst)
        return self.intra_node_link if a.node == b.node else self.inter_node_link

    def link(self, src: str, dst: str) -> Link:
        """The hetpart :class:`~hetpart.devices.Link` from ``src`` to ``dst`` (distinct devices)."""
        p = self.link_between(src, dst)
        return Link(src, dst, p.bandwidth_bytes_per_s, p.latency_us, p.source)

    def send_us(self, size_bytes: float, src: str, dst: str) -> float:
        """Time to send ``size_bytes`` from one device to another (0 on the same device)."""
        if src == dst:
            return 0.0
        return self.link_between(src, dst).transfer_us(size_bytes)

    def ring_link(self, names: Sequence[str]) -> LinkPreset:
        """The slowest link of a ring over ``names`` (the inter-node link once the ring spans two nodes)."""
        nodes = {self.device(n).node for n in names}
        return self.intra_node_link if len(nodes) <= 1 else self.inter_node_link

    def allreduce_us(self, size_bytes: float, names: Sequence[str]) -> float:
        """Ring all-reduce of ``size_bytes`` over the devices ``names``: 2(r-1)/r * S / B + 2(r-1) * latency."""
        r = len(names)
        if r <= 1 or size_bytes <= 0:
            return 0.0
        link = self.ring_link(names)
        return 2.0 * (r - 1) / r * size_bytes / link.bandwidth_bytes_per_s * 1e6 + 2.0 * (r - 1) * link.latency_us

    def to_spec(self) -> str:
        """A spec string that parses back to an equal cluster (for clusters built with ``parse``)."""
        return self.spec

    # ---------------------------------------------------------------- validation and JSON
    def validate(self) -> "Cluster":
        if not self.devices:
            raise InvalidClusterError("a cluster needs at least one device; found none")
        names = self.names
        if len(set(names)) != len(names):
            raise InvalidClusterError(f"device names must be unique; found {list(names)}")
        for d in self.devices:
            d.validate()
        self.intra_node_link.validate()
        self.inter_node_link.validate()
        return self

    def to_dict(self) -> dict[str, Any]:
        return {"spec": self.spec, "devices": [d.to_dict() for d in self.devices],
                "intra_node_link": self.intra_node_link.to_dict(), "inter_node_link": self.inter_node_link.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Cluster":
        if not isinstance(data, Mapping):
            raise InvalidClusterError(f"cluster JSON must be an object; found {type(data).__name__}")
        try:
            return cls(tuple(TrainDevice.from_dict(d) for d in data["devices"]),
                       LinkPreset.from_dict(data["intra_node_link"]), LinkPreset.from_dict(data["inter_node_link"]),
                       spec=data.get("spec", "")).validate()
        except KeyError as exc:
            raise InvalidClusterError(f"cluster JSON lacks the key {exc}; expected devices, intra_node_link, "
                                      "inter_node_link") from exc


_GROUP = re.compile(r"^(?:(gpu|cpu)\s*[=:]\s*)?([a-z0-9_-]+?)(?:\s*[x*]\s*(\d+))?$")


def _parse_group(item: str, spec: str) -> tuple[str, int]:
    text = item.strip().lower()
    if text.startswith("cpu"):
        m = re.fullmatch(r"cpu(?:\s*[:=x*]\s*(\d+))?", text)
        if m and int(m.group(1) or 1) >= 1:
            return CPU_PRESET, int(m.group(1) or 1)
        raise InvalidClusterError(f"cannot read {item!r} in cluster spec {spec!r}: CPU processes are written "
                                  "'cpu:2' (two processes) or 'cpu'")
    m = _GROUP.match(text)
    if not m:
        raise InvalidClusterError(f"cannot read {item!r} in cluster spec {spec!r}: expected e.g. 'gpu=a100x4', "
                                  "'t4x2', 'cpu:2', 'link=nvlink', 'per_node=4'")
    preset, count = m.group(2), int(m.group(3) or 1)
    if preset not in GPU_PRESETS:
        raise InvalidClusterError(f"unknown GPU preset {preset!r} in cluster spec {spec!r}; known presets: "
                                  f"{', '.join(sorted(GPU_PRESETS))}")
    if count < 1:
        raise InvalidClusterError(f"{item!r}: the device count must be >= 1")
    return preset, count
