"""StagePlan: a model split into pipeline stages for training, each stage on one or more devices.

Stage ``k`` holds a set of ops and runs on ``len(devices)`` replicas: micro-batch ``m`` goes to replica
``m % replicas`` and the replicas all-reduce their gradients once per iteration. The stage sequence is a valid
topological cut sequence: the union of stages ``0..k`` is closed under producers (an ideal of the graph) for
every ``k``, so activations flow from earlier stages to later ones only, and every tensor crossing a cut is
sent across it (skip connections included, relayed stage by stage as ``torch.distributed.pipelining`` does).

With the ``interleaved_1f1b`` schedule a device holds several stages (virtual stages, Megatron style); with
``groups = G > 1`` (GroPipe) every stage has exactly ``G`` replicas, one per group.

Times are per micro-batch on one replica (the slowest of its devices); ``iteration_us`` is the simulated time
of one iteration of ``microbatches`` micro-batches under ``schedule``, including gradient all-reduce.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from hetpart.errors import InvalidStagePlanError, SchemaError
from hetpart.graph import SCHEMA_VERSION, OpGraph, check_schema_version
from hetpart.training.cluster import Cluster

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zero_bubble")


@dataclass(frozen=True)
class Stage:
    index: int
    op_ids: tuple[int, ...]             # sorted
    devices: tuple[str, ...]            # one per replica
    forward_us: float                   # one micro-batch, one replica (slowest device)
    backward_us: float
    activation_bytes: int               # stashed per micro-batch: outputs of its ops + the received input
    param_bytes: int                    # weights
    weight_state_bytes: int = 0         # weights + gradients + optimizer state
    send_bytes: int = 0                 # sent to the next stage per micro-batch (every tensor crossing the cut)
    allreduce_us: float = 0.0           # gradient all-reduce across the replicas, once per iteration
    unit_names: tuple[str, ...] = ()    # free-form names (e.g. torch module paths) of what the stage holds

    def __post_init__(self) -> None:
        object.__setattr__(self, "op_ids", tuple(sorted(int(i) for i in self.op_ids)))
        object.__setattr__(self, "devices", tuple(self.devices))
        object.__setattr__(self, "unit_names", tuple(self.unit_names))

    @property
    def replicas(self) -> int:
        return len(self.devices)

    def validate(self) -> "Stage":
        if not self.op_ids:
            raise InvalidStagePlanError(f"stage {self.index} holds no op; every stage needs at least one op")
        if len(set(self.op_ids)) != len(self.op_ids):
            raise InvalidStagePlanError(f"stage {self.index} lists an op twice: {list(self.op_ids)[:10]}")
        if not self.devices or len(set(self.devices)) != len(self.devices):
            raise InvalidStagePlanError(f"stage {self.index} needs one or more distinct devices; found "
                                        f"{list(self.devices)}")
        for name in ("forward_us", "backward_us", "allreduce_us", "activation_bytes", "param_bytes",
                     "weight_state_bytes", "send_bytes"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise InvalidStagePlanError(f"stage {self.index}: {name} must be finite and >= 0; found {value}")
        return self

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for key in ("op_ids", "devices", "unit_names"):
            out[key] = list(out[key])
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Stage":
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise SchemaError(f"Stage JSON has unknown keys {sorted(unknown)}; expected a subset of {sorted(known)}")
        try:
            return cls(**data).validate()
        except TypeError as exc:
            raise SchemaError(f"Stage JSON is malformed: {exc}") from exc


@dataclass(frozen=True)
class StagePlan:
    model: str
    method: str
    microbatches: int
    schedule: str
    stages: tuple[Stage, ...]
    cluster: Cluster
    iteration_us: float
    bottleneck_us: float
    bubble_fraction: float
    peak_memory_bytes: Mapping[str, int]          # per device the plan uses
    groups: int = 1
    optimizer: str = "adam"
    n_ops: int = 0
    graph_hash: str = ""
    costs_source: Mapping[str, Any] = field(default_factory=dict)   # forward / backward sources
    config: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    stats: Mapping[str, Any] = field(default_factory=dict)          # planner time, states, ...
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", tuple(self.stages))
        object.__setattr__(self, "notes", tuple(self.notes))
        object.__setattr__(self, "peak_memory_bytes", {k: int(v) for k, v in dict(self.peak_memory_bytes).items()})
        for key in ("costs_source", "config", "stats"):
            object.__setattr__(self, key, dict(getattr(self, key)))

    # ---------------------------------------------------------------- queries
    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def cluster_spec(self) -> str:
        return self.cluster.spec

    @property
    def devices_used(self) -> tuple[str, ...]:
        seen = {d for s in self.stages for d in s.devices}
        return tuple(n for n in self.cluster.names if n in seen)

    @property
    def fits_memory(self) -> bool:
        return all(v <= self.cluster.device(d).memory_bytes for d, v in self.peak_memory_bytes.items())

    def stage_of(self) -> dict[int, int]:
        return {op: s.index for s in self.stages for op in s.op_ids}

    # ---------------------------------------------------------------- validation
    def validate(self, graph: OpGraph | None = None) -> "StagePlan":
        if self.schema_version != SCHEMA_VERSION:
            raise SchemaError(f"StagePlan schema_version must be {SCHEMA_VERSION}; found {self.schema_version}")
        if self.schedule not in SCHEDULES:
            raise InvalidStagePlanError(f"schedule must be one of {SCHEDULES}; found {self.schedule!r}")
        if self.microbatches < 1 or self.groups < 1:
            raise InvalidStagePlanError(f"microbatches and groups must be >= 1; found {self.microbatches} and "
                                        f"{self.groups}")
        if not self.stages:
            raise InvalidStagePlanError("a stage plan needs at least one stage")
        self.cluster.validate()
        names = set(self.cluster.names)
        owner: dict[str, int] = {}
        seen: set[int] = set()
        for k, stage in enumerate(self.stages):
            stage.validate()
            if stage.index != k:
                raise InvalidStagePlanError(f"stage at position {k} has index {stage.index}; indices must be 0..S-1")
            overlap = seen.intersection(stage.op_ids)
            if overlap:
                raise InvalidStagePlanError(f"ops {sorted(overlap)[:5]} are in two stages; every op is in one stage")
            seen.update(stage.op_ids)
            unknown = sorted(set(stage.devices) - names)
            if unknown:
                raise InvalidStagePlanError(f"stage {k} runs on {unknown}, which are not in the cluster "
                                            f"{sorted(names)}")
            if self.groups > 1 and stage.replicas != self.groups:
                raise InvalidStagePlanError(f"with groups={self.groups} every stage has one replica per group; "
                                            f"stage {k} has {stage.replicas}")
            for d in stage.devices:
                if d in owner and self.schedule != "interleaved_1f1b":
                    raise InvalidStagePlanError(
                        f"device {d} runs stages {owner[d]} and {k}; only the interleaved_1f1b schedule puts "
                        "several stages on one device")
                owner.setdefault(d, k)
        for name in ("iteration_us", "bottleneck_us"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise InvalidStagePlanError(f"{name} must be finite and >= 0; found {value}")
        if not 0.0 <= self.bubble_fraction <= 1.0:
            raise InvalidStagePlanError(f"bubble_fraction must be in [0, 1]; found {self.bubble_fraction}")
        if self.n_ops and len(seen) != self.n_ops:
            raise InvalidStagePlanError(f"the stages hold {len(seen)} ops but the model has {self.n_ops}; every op "
                                        "must be in exactly one stage")
        if graph is not None:
            self.check_graph(graph)
        return self

    def check_graph(self, graph: OpGraph) -> None:
        """Every op in one stage, and every prefix of stages an ideal (producers never in a later stage)."""
        if self.graph_hash and self.graph_hash != graph.structure_hash():
            raise InvalidStagePlanError(f"this plan was made for graph {self.graph_hash}, not "
                                        f"{graph.structure_hash()} ({graph.name!r}); re-plan for this model")
        stage_of = self.stage_of()
        missing = [i for i in range(graph.num_ops) if i not in stage_of]
        extra = sorted(set(stage_of) - set(range(graph.num_ops)))
        if missing or extra:
            raise InvalidStagePlanError(f"every op of {graph.name!r} ({graph.num_ops} ops) must be in exactly one "
                                        f"stage; missing {missing[:5]}, unknown {extra[:5]}")
        for node in graph.nodes:
            for src in node.inputs:
                if stage_of[src] > stage_of[node.id]:
                    raise InvalidStagePlanError(
                        f"op {node.id} ({node.name}) is in stage {stage_of[node.id]} but its producer {src} is in "
                        f"the later stage {stage_of[src]}: stages must be a topological cut sequence")

    # ---------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": self.schema_version, "model": self.model, "method": self.method,
                "microbatches": self.microbatches, "schedule": self.schedule, "groups": self.groups,
                "optimizer": self.optimizer, "n_ops": self.n_ops, "graph_hash": self.graph_hash,
                "iteration_us": self.iteration_us, "bottleneck_us": self.bottleneck_us,
                "bubble_fraction": self.bubble_fraction, "peak_memory_bytes": dict(self.peak_memory_bytes),
                "cluster_spec": self.cluster.spec, "cluster": self.cluster.to_dict(),
                "costs_source": dict(self.costs_source), "config": dict(self.config), "notes": list(self.notes),
                "stats": dict(self.stats), "stages": [s.to_dict() for s in self.stages]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "StagePlan":
        check_schema_version(data, "StagePlan")
        try:
            plan = cls(model=data["model"], method=data["method"], microbatches=int(data["microbatches"]),
                       schedule=data["schedule"], stages=tuple(Stage.from_dict(s) for s in data["stages"]),
                       cluster=Cluster.from_dict(data["cluster"]), iteration_us=float(data["iteration_us"]),
                       bottleneck_us=float(data["bottleneck_us"]), bubble_fraction=float(data["bubble_fraction"]),
                       peak_memory_bytes=data["peak_memory_bytes"], groups=int(data.get("groups", 1)),
                       optimizer=data.get("optimizer", "adam"), n_ops=int(data.get("n_ops", 0)),
                       graph_hash=data.get("graph_hash", ""), costs_source=data.get("costs_source", {}),
                       config=data.get("config", {}), notes=tuple(data.get("notes", ())),
                       stats=data.get("stats", {}), schema_version=data["schema_version"])
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, (SchemaError, InvalidStagePlanError)):
                raise
            raise SchemaError(f"StagePlan JSON is malformed ({type(exc).__name__}: {exc})") from exc
        return plan.validate()

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> "StagePlan":
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as exc:
            raise SchemaError(f"StagePlan JSON is not valid JSON: {exc}") from exc

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(indent=1))

    @classmethod
    def load(cls, path: str | Path, graph: OpGraph | None = None) -> "StagePlan":
        return cls.from_json(Path(path).read_text()).validate(graph)


def stage_devices(plan: StagePlan) -> list[tuple[str, ...]]:
    return [s.devices for s in plan.stages]


def with_unit_names(plan: StagePlan, names: Sequence[Sequence[str]]) -> StagePlan:
    """The same plan with ``unit_names`` set per stage (e.g. the torch module paths each stage holds)."""
    if len(names) != plan.num_stages:
        raise InvalidStagePlanError(f"need one list of unit names per stage ({plan.num_stages}); found {len(names)}")
    return replace(plan, stages=tuple(replace(s, unit_names=tuple(n)) for s, n in zip(plan.stages, names)))
