"""Plan (which device runs each op, in which issue order) and Timeline (what the simulator predicts).

A Plan is what partitioners return and what ``tvm_passes.annotate`` applies. It is JSON you can read, edit
(change a device) and reload: ``Plan.load(path)`` re-validates it against the graph it is used with.
Pins (``{"conv1": "cpu", "*lstm*": "gpu"}``) name ops by Relax variable name or ``fnmatch`` glob.
"""
from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from hetpart.errors import InvalidPlanError, PinError, SchemaError
from hetpart.graph import SCHEMA_VERSION, OpGraph, check_schema_version


def resolve_pins(graph: OpGraph, pins: Mapping[str, str], device_names: Sequence[str]) -> dict[int, str]:
    """Map pin patterns to op ids. Every pattern must match at least one op; every device must exist.

    A pattern matches an op's name exactly, or as an fnmatch glob on the name, or ``op:<relax op glob>``
    on the op type (``op:relax.nn.conv2d``). At kernel level, a pattern also matches the member ops' names
    and types (``tags["op_names"]``, ``tags["op_types"]``), so pinning one op pins its whole fused kernel.
    """
    resolved: dict[int, str] = {}
    for pattern, device in pins.items():
        if device not in device_names:
            raise PinError(f"pin {pattern}={device}: device {device!r} is not one of {list(device_names)}")
        if pattern.startswith("op:"):
            matched = [n.id for n in graph.nodes
                       if any(fnmatch.fnmatchcase(t, pattern[3:]) for t in (n.op, *n.tags.get("op_types", ())))]
        else:
            matched = [n.id for n in graph.nodes
                       if n.name == pattern or fnmatch.fnmatchcase(n.name, pattern)
                       or any(fnmatch.fnmatchcase(m, pattern) for m in n.tags.get("op_names", ()))]
        if not matched:
            examples = ", ".join(n.name for n in graph.nodes[:5])
            raise PinError(f"pin {pattern!r} names no op in graph {graph.name!r} (op names look like: {examples}); "
                           "use an op name, a glob like 'conv*', or 'op:relax.nn.conv2d'")
        for op_id in matched:
            if resolved.get(op_id, device) != device:
                raise PinError(f"op {graph.nodes[op_id].name!r} is pinned to both {resolved[op_id]!r} and "
                               f"{device!r}; make the pin patterns disjoint")
            resolved[op_id] = device
    return resolved


@dataclass(frozen=True)
class Plan:
    device_of: tuple[str, ...]          # device name per op id
    order: tuple[int, ...]              # issue order: a topological order of all op ids
    devices: tuple[str, ...]            # device names offered to the planner
    method: str
    makespan_us: float | None = None    # simulated makespan of this plan (the objective)
    pins: Mapping[str, str] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)
    graph_hash: str = ""
    level: str = "op"
    notes: tuple[str, ...] = ()         # warnings and facts worth showing (e.g. "degenerate: all on gpu")
    stats: Mapping[str, Any] = field(default_factory=dict)   # planner wall time, MILP gap, iterations, ...
    device_spec: str = ""               # the devices planned for, as given to --devices ("cpu,gpu=t4"); "" unknown
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        object.__setattr__(self, "device_of", tuple(self.device_of))
        object.__setattr__(self, "order", tuple(int(i) for i in self.order))
        object.__setattr__(self, "devices", tuple(self.devices))
        object.__setattr__(self, "notes", tuple(self.notes))
        for key in ("pins", "config", "stats"):
            object.__setattr__(self, key, dict(getattr(self, key)))

    def ops_on(self, device: str) -> list[int]:
        return [i for i, d in enumerate(self.device_of) if d == device]

    def with_devices(self, device_of: Sequence[str], **changes: Any) -> "Plan":
        return replace(self, device_of=tuple(device_of), **changes)

    def validate(self, graph: OpGraph | None = None) -> "Plan":
        if self.schema_version != SCHEMA_VERSION:
            raise SchemaError(f"Plan schema_version must be {SCHEMA_VERSION}; found {self.schema_version}")
        unknown = sorted(set(self.device_of) - set(self.devices))
        if unknown:
            raise InvalidPlanError(f"plan places ops on {unknown}, which are not among its devices {list(self.devices)}")
        n = len(self.device_of)
        if sorted(self.order) != list(range(n)):
            raise InvalidPlanError(f"plan order must be a permutation of all {n} op ids; found {len(self.order)} "
                                   "entries with duplicates or gaps")
        if graph is not None:
            if graph.num_ops != n:
                raise InvalidPlanError(
                    f"plan assigns {n} ops but graph {graph.name!r} has {graph.num_ops} ({graph.level} level): "
                    "this plan was made for another model or level")
            if self.graph_hash and self.graph_hash != graph.structure_hash():
                raise InvalidPlanError(
                    f"plan was made for graph {self.graph_hash}, not {graph.structure_hash()} ({graph.name!r}); "
                    "re-plan for this model")
            position = {op: k for k, op in enumerate(self.order)}
            for node in graph.nodes:
                for src in node.inputs:
                    if position[src] > position[node.id]:
                        raise InvalidPlanError(
                            f"plan order issues op {node.id} ({node.name}) before its input {src}; the order "
                            "must be topological")
            for op_id, device in resolve_pins(graph, self.pins, self.devices).items():
                if self.device_of[op_id] != device:
                    raise PinError(f"op {graph.nodes[op_id].name!r} is pinned to {device!r} but the plan puts it "
                                   f"on {self.device_of[op_id]!r}")
        return self

    # ---------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": self.schema_version, "method": self.method, "devices": list(self.devices),
                "makespan_us": self.makespan_us, "graph_hash": self.graph_hash, "level": self.level,
                "pins": dict(self.pins), "config": dict(self.config), "notes": list(self.notes),
                "stats": dict(self.stats), "device_spec": self.device_spec, "order": list(self.order),
                "device_of": list(self.device_of)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Plan":
        check_schema_version(data, "Plan")
        try:
            return cls(device_of=data["device_of"], order=data["order"], devices=data["devices"],
                       method=data["method"], makespan_us=data.get("makespan_us"), pins=data.get("pins", {}),
                       config=data.get("config", {}), graph_hash=data.get("graph_hash", ""),
                       level=data.get("level", "op"), notes=data.get("notes", ()), stats=data.get("stats", {}),
                       device_spec=str(data.get("device_spec", "")), schema_version=data["schema_version"]).validate()
        except (KeyError, TypeError) as exc:
            raise SchemaError(f"Plan JSON is malformed ({type(exc).__name__}: {exc})") from exc

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | Path, graph: OpGraph | None = None) -> "Plan":
        try:
            data = json.loads(Path(path).read_text())
        except json.JSONDecodeError as exc:
            raise SchemaError(f"plan file {path} is not valid JSON: {exc}") from exc
        except OSError as exc:
            raise InvalidPlanError(f"cannot read plan file {path}: {exc.strerror or exc}; pass the plan.json a "
                                   "compile wrote (hetpart compile ... -o DIR writes DIR/plan.json)") from exc
        if not isinstance(data, dict):
            raise SchemaError(f"plan file {path} must hold a JSON object (a plan.json hetpart wrote); found "
                              f"{type(data).__name__}")
        plan = cls.from_dict(data)
        return plan.validate(graph) if graph is not None else plan


@dataclass(frozen=True)
class Event:
    kind: str              # "op" or "copy"
    op_id: int             # the op (for a copy: the producer whose output is copied)
    resource: str          # device name for ops, "src->dst" for copies
    start_us: float
    end_us: float
    size_bytes: int = 0    # copies only

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "op_id": self.op_id, "resource": self.resource,
                "start_us": self.start_us, "end_us": self.end_us, "size_bytes": self.size_bytes}


@dataclass(frozen=True)
class Timeline:
    events: tuple[Event, ...]
    makespan_us: float
    peak_memory_bytes: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "events", tuple(self.events))
        object.__setattr__(self, "peak_memory_bytes", dict(self.peak_memory_bytes))

    def op_events(self) -> list[Event]:
        return [e for e in self.events if e.kind == "op"]

    def copy_events(self) -> list[Event]:
        return [e for e in self.events if e.kind == "copy"]

    def validate(self, graph: OpGraph | None = None) -> "Timeline":
        by_resource: dict[str, list[Event]] = {}
        for e in self.events:
            if e.end_us < e.start_us - 1e-9:
                raise InvalidPlanError(f"event {e} ends before it starts")
            by_resource.setdefault(e.resource, []).append(e)
        for resource, events in by_resource.items():
            events.sort(key=lambda e: (e.start_us, e.end_us))
            for a, b in zip(events, events[1:]):
                if b.start_us < a.end_us - 1e-6:
                    raise InvalidPlanError(f"{resource} runs two things at once: {a} and {b}")
        if graph is not None:
            end = {e.op_id: e.end_us for e in self.op_events()}
            start = {e.op_id: e.start_us for e in self.op_events()}
            for node in graph.nodes:
                for src in node.inputs:
                    if start[node.id] < end[src] - 1e-6:
                        raise InvalidPlanError(f"op {node.id} starts before its input {src} is finished")
        return self

    def to_dict(self) -> dict[str, Any]:
        return {"makespan_us": self.makespan_us, "peak_memory_bytes": dict(self.peak_memory_bytes),
                "events": [e.to_dict() for e in self.events]}
