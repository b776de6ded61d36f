"""CostTable: how long every op (or fused kernel) of one graph takes on every device, plus the copy links.

Costs live here, never on the graph. ``latency_us[i, d]`` is op ``i`` on device ``d``; an op a device cannot
run has ``supported[i, d] = False`` and its latency is NaN. Asking for an unsupported or missing cost raises
:class:`MissingCostError` — a missing cost never silently becomes 0.

``source[i, d]`` says where each number came from: ``measured`` (timed on the device), ``predicted``
(a fitted model of measurements) or ``analytic`` (a datasheet roofline; no measurement behind it).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from hetpart.devices import DeviceSet
from hetpart.errors import InvalidCostTableError, MissingCostError, SchemaError
from hetpart.graph import SCHEMA_VERSION, OpGraph, check_schema_version

SOURCES = ("measured", "predicted", "analytic")


@dataclass(frozen=True)
class CostTable:
    latency_us: np.ndarray            # float64 [n_ops, n_devices]; NaN where unsupported
    supported: np.ndarray             # bool [n_ops, n_devices]
    source: np.ndarray                # str [n_ops, n_devices] in SOURCES
    devices: DeviceSet
    graph_hash: str = ""              # OpGraph.structure_hash() of the graph these costs are for
    level: str = "op"
    provenance: Mapping[str, Any] = field(default_factory=dict)   # predictor names, versions, ...
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        lat = np.array(self.latency_us, dtype=np.float64)
        sup = np.array(self.supported, dtype=bool)
        src = np.array(self.source, dtype=object)
        for arr in (lat, sup, src):
            arr.setflags(write=False)
        object.__setattr__(self, "latency_us", lat)
        object.__setattr__(self, "supported", sup)
        object.__setattr__(self, "source", src)
        object.__setattr__(self, "provenance", dict(self.provenance))

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_arrays(cls, latency_us: np.ndarray, devices: DeviceSet, *, supported: np.ndarray | None = None,
                    source: str | np.ndarray = "predicted", graph: OpGraph | None = None,
                    provenance: Mapping[str, Any] | None = None) -> "CostTable":
        lat = np.asarray(latency_us, dtype=np.float64)
        sup = np.isfinite(lat) if supported is None else np.asarray(supported, dtype=bool)
        src = np.full(lat.shape, source, dtype=object) if isinstance(source, str) else np.asarray(source, dtype=object)
        return cls(np.where(sup, lat, np.nan), sup, src, devices,
                   graph_hash=graph.structure_hash() if graph is not None else "",
                   level=graph.level if graph is not None else "op",
                   provenance=provenance or {}).validate(graph)

    # ---------------------------------------------------------------- queries
    @property
    def n_ops(self) -> int:
        return int(self.latency_us.shape[0])

    @property
    def device_names(self) -> tuple[str, ...]:
        return self.devices.names

    def latency(self, op_id: int, device: str | int) -> float:
        d = device if isinstance(device, int) else self.devices.index(device)
        if not 0 <= op_id < self.n_ops:
            raise MissingCostError(f"no cost for op {op_id}: the table covers ops 0..{self.n_ops - 1}")
        if not self.supported[op_id, d]:
            raise MissingCostError(
                f"op {op_id} is not supported on device {self.device_names[d]!r}: no latency is known. "
                "Pin it to another device or provide a cost for it.")
        return float(self.latency_us[op_id, d])

    def transfer_us(self, size_bytes: int, src: str, dst: str) -> float:
        """Time to copy ``size_bytes`` from device ``src`` to ``dst`` (0 when src == dst)."""
        if src == dst:
            return 0.0
        return self.devices.link(src, dst).transfer_us(size_bytes)

    def best_device(self, op_id: int) -> str:
        row = np.where(self.supported[op_id], self.latency_us[op_id], np.inf)
        if not np.isfinite(row).any():
            raise MissingCostError(f"op {op_id} is supported on no device")
        return self.device_names[int(np.argmin(row))]

    # ---------------------------------------------------------------- validation
    def validate(self, graph: OpGraph | None = None) -> "CostTable":
        if self.schema_version != SCHEMA_VERSION:
            raise SchemaError(f"CostTable schema_version must be {SCHEMA_VERSION}; found {self.schema_version}")
        self.devices.validate()
        shape = (self.latency_us.shape[0], len(self.devices.devices))
        if self.latency_us.ndim != 2 or self.latency_us.shape != shape or self.supported.shape != shape \
                or self.source.shape != shape:
            raise InvalidCostTableError(
                f"latency_us, supported and source must all be [n_ops, {shape[1]}] (one column per device); "
                f"found {self.latency_us.shape}, {self.supported.shape}, {self.source.shape}")
        lat = self.latency_us[self.supported]
        if not np.all(np.isfinite(lat)) or np.any(lat < 0):
            bad = np.argwhere(self.supported & ~(np.isfinite(self.latency_us) & (self.latency_us >= 0)))
            raise InvalidCostTableError(
                f"every supported latency must be finite and >= 0; found bad entries at (op, device) "
                f"{bad[:5].tolist()}. Mark unsupported entries supported=False instead.")
        if not self.supported.any(axis=1).all():
            orphan = np.flatnonzero(~self.supported.any(axis=1))[:5].tolist()
            raise InvalidCostTableError(f"every op needs at least one supported device; ops {orphan} have none")
        bad_src = set(self.source.ravel().tolist()) - set(SOURCES)
        if bad_src:
            raise InvalidCostTableError(f"source entries must be one of {SOURCES}; found {sorted(bad_src)}")
        if graph is not None:
            if graph.num_ops != self.n_ops:
                raise InvalidCostTableError(
                    f"cost table has {self.n_ops} rows but graph {graph.name!r} has {graph.num_ops} "
                    f"{graph.level}s; build the costs for this graph (and the same level)")
            if self.graph_hash and self.graph_hash != graph.structure_hash():
                raise InvalidCostTableError(
                    f"cost table was built for graph {self.graph_hash}, not for {graph.structure_hash()} "
                    f"({graph.name!r}); rebuild the costs for this model")
        return self

    # ---------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": self.schema_version, "graph_hash": self.graph_hash, "level": self.level,
                "devices": self.devices.to_dict(), "provenance": dict(self.provenance),
                "latency_us": [[None if not np.isfinite(v) else float(v) for v in row] for row in self.latency_us],
                "supported": self.supported.tolist(), "source": self.source.tolist()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CostTable":
        check_schema_version(data, "CostTable")
        try:
            lat = np.array([[np.nan if v is None else v for v in row] for row in data["latency_us"]], dtype=float)
            devices = DeviceSet.from_dict(data["devices"])
            lat = lat.reshape(-1, len(devices.devices))
            return cls(lat, np.array(data["supported"], dtype=bool).reshape(lat.shape),
                       np.array(data["source"], dtype=object).reshape(lat.shape), devices,
                       graph_hash=data.get("graph_hash", ""), level=data.get("level", "op"),
                       provenance=data.get("provenance", {})).validate()
        except (KeyError, TypeError) as exc:
            raise SchemaError(f"CostTable JSON is malformed ({type(exc).__name__}: {exc})") from exc

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict()))

    @classmethod
    def load(cls, path: str | Path) -> "CostTable":
        return cls.from_dict(json.loads(Path(path).read_text()))
