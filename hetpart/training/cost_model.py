"""Training costs per op and device: forward and backward time, stashed activations, weights and optimizer state.

What is measured and what is assumed:

* **Forward time** ``forward_us[op, device]`` is the inference latency of the op (a kernel at kernel level) from
  a :class:`~hetpart.costs.CostTable`: measured, predicted (the host CPU predictor) or analytic (the GPU
  datasheet roofline); each device's source is recorded in ``forward_source``.
* **Backward time** is forward time x a ratio per op kind. hetpart's predictors model inference kernels only, so
  without a measured ratio table the ratio is 2.0 for every kind and the costs say ``backward_source="assumed"``.
  A measured table is a JSON file ``{"kind_ratio": {"conv2d": 2.1, ...}, "default_ratio": 2.0, "source":
  "measured on <cpu>"}`` (:class:`BackwardRatios`).
* **Activations** stashed per micro-batch: the bytes every op writes (``OpNode.bytes_written``), kept until the
  op's backward ran. This estimates what autograd keeps; operators that save their inputs instead of their
  outputs keep about as much, since every output is some other op's input.
* **Weights** (``OpNode.param_bytes``), their gradients (same size) and optimizer state: ``sgd`` keeps none,
  ``momentum`` one buffer, ``adam`` two (first and second moments), all in the weights' dtype.
* **Weight-gradient share** of the backward time, used by the zero-bubble schedule that splits backward into an
  input-gradient and a weight-gradient part: 0.5 by default, assumed.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from hetpart.costs import CostTable
from hetpart.errors import InvalidCostTableError, MissingCostError, SchemaError
from hetpart.graph import SCHEMA_VERSION, OpGraph, OpNode, check_schema_version
from hetpart.training.cluster import Cluster

DEFAULT_BACKWARD_RATIO = 2.0
DEFAULT_WEIGHT_GRAD_FRACTION = 0.5
OPTIMIZER_STATE_FACTOR = {"sgd": 0, "momentum": 1, "adam": 2}

# torch module class names -> the Relax op kind hetpart's graphs use, so a ratio table keyed either way works
_KIND_ALIASES = {
    "conv1d": "conv1d", "conv2d": "conv2d", "convtranspose2d": "conv2d_transpose", "linear": "matmul",
    "dense": "matmul", "batchnorm2d": "batch_norm", "batchnorm1d": "batch_norm", "relu": "relu",
    "maxpool2d": "max_pool2d", "avgpool2d": "avg_pool2d", "adaptiveavgpool2d": "adaptive_avg_pool2d",
    "layernorm": "layer_norm", "embedding": "take", "gelu": "gelu", "softmax": "softmax", "tanh": "tanh",
    "sigmoid": "sigmoid", "dropout": "dropout",
}
# kinds that dominate a fused kernel's time: the kernel takes the ratio of the first one among its members
_ANCHORS = ("conv2d", "conv1d", "conv2d_transpose", "matmul", "batch_matmul", "dense", "max_pool2d", "avg_pool2d",
            "adaptive_avg_pool2d", "layer_norm", "batch_norm", "softmax", "take")


def normalize_kind(kind: str) -> str:
    """``relax.nn.conv2d`` / ``nn.conv2d`` / ``Conv2d`` -> ``conv2d``."""
    k = kind.strip().rsplit(".", 1)[-1]
    return _KIND_ALIASES.get(k.lower().replace("_", ""), k.lower())


def member_kinds(node: OpNode) -> list[str]:
    """The op kinds of a node: its members' at kernel level, else its own."""
    types = node.tags.get("op_types") or [node.op]
    return [normalize_kind(t) for t in types]


def anchor_kind(node: OpNode) -> str:
    kinds = member_kinds(node)
    for anchor in _ANCHORS:
        if anchor in kinds:
            return anchor
    return kinds[0] if kinds else "unknown"


@dataclass(frozen=True)
class BackwardRatios:
    """Backward time / forward time per op kind (``kind_ratio``), else ``default_ratio``; ``source`` says whether
    the numbers were measured (``"measured on <cpu>"``) or ``"assumed"``."""

    kind_ratio: Mapping[str, float] = field(default_factory=dict)
    default_ratio: float = DEFAULT_BACKWARD_RATIO
    source: str = "assumed"

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind_ratio", {normalize_kind(k): float(v) for k, v in dict(self.kind_ratio).items()})

    def validate(self) -> "BackwardRatios":
        bad = {k: v for k, v in self.kind_ratio.items() if not (math.isfinite(v) and v > 0)}
        if bad or not (math.isfinite(self.default_ratio) and self.default_ratio > 0):
            raise InvalidCostTableError(
                f"backward ratios must be finite and > 0; found default_ratio={self.default_ratio} and {bad}. "
                "Re-measure them or drop the bad kinds (they then use default_ratio)")
        if not self.source:
            raise InvalidCostTableError("backward ratios need a source ('assumed' or 'measured on <cpu>')")
        return self

    def ratio(self, node: OpNode) -> float:
        kinds = member_kinds(node)
        anchor = anchor_kind(node)
        if anchor in self.kind_ratio:
            return self.kind_ratio[anchor]
        for kind in kinds:
            if kind in self.kind_ratio:
                return self.kind_ratio[kind]
        return self.default_ratio

    @property
    def is_measured(self) -> bool:
        return self.source.startswith("measured")

    def to_dict(self) -> dict[str, Any]:
        return {"kind_ratio": dict(self.kind_ratio), "default_ratio": self.default_ratio, "source": self.source}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "BackwardRatios":
        if not isinstance(data, Mapping) or "kind_ratio" not in data:
            raise SchemaError("a backward-ratio JSON must be an object with 'kind_ratio', 'default_ratio' and "
                              f"'source'; found {str(data)[:80]!r}")
        return cls(dict(data["kind_ratio"]), float(data.get("default_ratio", DEFAULT_BACKWARD_RATIO)),
                   str(data.get("source", "assumed"))).validate()

    @classmethod
    def load(cls, path: str | Path) -> "BackwardRatios":
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except json.JSONDecodeError as exc:
            raise SchemaError(f"backward-ratio file {path} is not valid JSON: {exc}") from exc


@dataclass(frozen=True)
class TrainCosts:
    """Per-op training costs on every device of a cluster (columns in ``device_names`` order)."""

    device_names: tuple[str, ...]
    device_presets: tuple[str, ...]     # the preset of each column (equal presets = identical devices)
    forward_us: np.ndarray              # float64 [n_ops, n_devices]; NaN where the device cannot run the op
    backward_us: np.ndarray             # float64 [n_ops, n_devices]; NaN where unsupported
    activation_bytes: np.ndarray        # int64 [n_ops]: stashed per micro-batch until the op's backward
    param_bytes: np.ndarray             # int64 [n_ops]: weights
    optimizer: str = "adam"
    weight_grad_fraction: float = DEFAULT_WEIGHT_GRAD_FRACTION
    backward_source: str = "assumed"
    forward_source: Mapping[str, str] = field(default_factory=dict)   # device -> measured/predicted/analytic
    graph_hash: str = ""
    model: str = ""
    provenance: Mapping[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        object.__setattr__(self, "device_names", tuple(self.device_names))
        object.__setattr__(self, "device_presets", tuple(self.device_presets))
        for key, dtype in (("forward_us", np.float64), ("backward_us", np.float64),
                           ("activation_bytes", np.int64), ("param_bytes", np.int64)):
            arr = np.array(getattr(self, key), dtype=dtype)
            arr.setflags(write=False)
            object.__setattr__(self, key, arr)
        object.__setattr__(self, "forward_source", dict(self.forward_source))
        object.__setattr__(self, "provenance", dict(self.provenance))

    # ---------------------------------------------------------------- construction
    @classmethod
    def build(cls, graph: OpGraph, costs: CostTable | Mapping[str, CostTable], cluster: Cluster, *,
              ratios: BackwardRatios | None = None, optimizer: str = "adam",
              weight_grad_fraction: float = DEFAULT_WEIGHT_GRAD_FRACTION,
              columns: Mapping[str, str] | None = None) -> "TrainCosts":
        """Forward times from ``costs`` (one CostTable, or one per device preset), backward = forward x ratio.

        Each cluster device takes the column of a table whose device matches it: the ``cpu`` column for CPU
        processes; for a GPU preset, the column built from that preset (``gpu_from_preset``), or the column
        ``columns[preset]`` names. A device without a matching column raises :class:`MissingCostError`.
        """
        ratios = (ratios or BackwardRatios()).validate()
        n = graph.num_ops
        fwd = np.full((n, cluster.size), np.nan)
        sources: dict[str, str] = {}
        for k, dev in enumerate(cluster.devices):
            table = costs.get(dev.preset) if isinstance(costs, Mapping) else costs
            if table is None:
                raise MissingCostError(f"no cost table for device {dev.name} (preset {dev.preset!r}); pass one "
                                       f"per preset: {{{', '.join(repr(p) for p in cluster.presets)}: CostTable}}")
            table.validate(graph)
            col = _column_for(table, dev.kind, dev.preset, (columns or {}).get(dev.preset))
            fwd[:, k] = np.where(table.supported[:, col], table.latency_us[:, col], np.nan)
            kinds = sorted(set(table.source[:, col].tolist()))
            sources[dev.name] = kinds[0] if len(kinds) == 1 else "+".join(kinds)
        ratio = np.array([ratios.ratio(node) for node in graph.nodes], dtype=np.float64)
        out = cls(device_names=cluster.names, device_presets=tuple(d.preset for d in cluster.devices),
                  forward_us=fwd, backward_us=fwd * ratio[:, None],
                  activation_bytes=np.array([node.bytes_written for node in graph.nodes], dtype=np.int64),
                  param_bytes=np.array([node.param_bytes for node in graph.nodes], dtype=np.int64),
                  optimizer=optimizer, weight_grad_fraction=weight_grad_fraction,
                  backward_source=ratios.source, forward_source=sources, graph_hash=graph.structure_hash(),
                  model=graph.name, provenance={"backward_ratios": ratios.to_dict(), "level": graph.level})
        return out.validate(graph)

    # ---------------------------------------------------------------- queries
    @property
    def n_ops(self) -> int:
        return int(self.forward_us.shape[0])

    @property
    def supported(self) -> np.ndarray:
        return np.isfinite(self.forward_us) & np.isfinite(self.backward_us)

    @property
    def optimizer_state_factor(self) -> int:
        return OPTIMIZER_STATE_FACTOR[self.optimizer]

    @property
    def weight_state_bytes(self) -> np.ndarray:
        """Per op: weights + gradients + optimizer state."""
        return self.param_bytes * (2 + self.optimizer_state_factor)

    def column(self, device: str) -> int:
        try:
            return self.device_names.index(device)
        except ValueError:
            raise MissingCostError(f"no training costs for device {device!r}; costs cover "
                                   f"{list(self.device_names)}") from None

    def preset_column(self, preset: str) -> int:
        """The column of the first device of a preset (identical devices have equal columns)."""
        try:
            return self.device_presets.index(preset)
        except ValueError:
            raise MissingCostError(f"no training costs for preset {preset!r}; costs cover "
                                   f"{sorted(set(self.device_presets))}") from None

    def ops_time_us(self, ops: Sequence[int], device: str, part: str = "train") -> float:
        """Forward, backward or forward + backward ("train") time of ``ops`` on ``device``; raises if unsupported."""
        col = self.column(device)
        ids = np.asarray(list(ops), dtype=np.int64)
        f, b = self.forward_us[ids, col], self.backward_us[ids, col]
        if ids.size and not (np.isfinite(f).all() and np.isfinite(b).all()):
            bad = ids[~(np.isfinite(f) & np.isfinite(b))][:5].tolist()
            raise MissingCostError(f"ops {bad} have no cost on device {device!r}: they cannot run there. Place them "
                                   "on a device that supports them or provide their costs")
        return float({"forward": f.sum(), "backward": b.sum(), "train": f.sum() + b.sum()}[part])

    # ---------------------------------------------------------------- validation and JSON
    def validate(self, graph: OpGraph | None = None) -> "TrainCosts":
        if self.schema_version != SCHEMA_VERSION:
            raise SchemaError(f"TrainCosts schema_version must be {SCHEMA_VERSION}; found {self.schema_version}")
        n, d = len(self.param_bytes), len(self.device_names)
        shapes = {k: getattr(self, k).shape for k in ("forward_us", "backward_us")}
        if any(s != (n, d) for s in shapes.values()) or self.activation_bytes.shape != (n,) \
                or len(self.device_presets) != d:
            raise InvalidCostTableError(f"training costs must be [n_ops, n_devices] = [{n}, {d}] (one column per "
                                        f"device, one preset per device); found {shapes}, activations "
                                        f"{self.activation_bytes.shape}, {len(self.device_presets)} presets")
        if len(set(self.device_names)) != d:
            raise InvalidCostTableError(f"device names must be unique; found {list(self.device_names)}")
        for key in ("forward_us", "backward_us"):
            arr = getattr(self, key)
            if np.any(arr[np.isfinite(arr)] < 0) or np.any(np.isinf(arr)):
                raise InvalidCostTableError(f"{key} must be finite and >= 0 where supported (NaN = unsupported)")
        if np.any(np.isnan(self.forward_us) != np.isnan(self.backward_us)):
            raise InvalidCostTableError("forward_us and backward_us must be unsupported (NaN) at the same entries")
        if n and not self.supported.any(axis=1).all():
            orphan = np.flatnonzero(~self.supported.any(axis=1))[:5].tolist()
            raise MissingCostError(f"ops {orphan} have no training cost on any device of the cluster; add a device "
                                   "that can run them or provide their costs")
        if np.any(self.activation_bytes < 0) or np.any(self.param_bytes < 0):
            raise InvalidCostTableError("activation_bytes and param_bytes must be >= 0")
        if self.optimizer not in OPTIMIZER_STATE_FACTOR:
            raise InvalidCostTableError(f"optimizer must be one of {sorted(OPTIMIZER_STATE_FACTOR)}; found "
                                        f"{self.optimizer!r}")
        if not 0.0 <= self.weight_grad_fraction <= 1.0:
            raise InvalidCostTableError(f"weight_grad_fraction must be in [0, 1]; found {self.weight_grad_fraction}")
        if graph is not None:
            if graph.num_ops != n:
                raise InvalidCostTableError(f"training costs have {n} ops but graph {graph.name!r} has "
                                            f"{graph.num_ops}; build them for this graph")
            if self.graph_hash and self.graph_hash != graph.structure_hash():
                raise InvalidCostTableError(f"training costs were built for graph {self.graph_hash}, not "
                                            f"{graph.structure_hash()} ({graph.name!r}); rebuild them")
        return self

    def to_dict(self) -> dict[str, Any]:
        def rows(a: np.ndarray) -> list:
            return [[None if not np.isfinite(v) else float(v) for v in row] for row in a]
        return {"schema_version": self.schema_version, "model": self.model, "graph_hash": self.graph_hash,
                "device_names": list(self.device_names), "device_presets": list(self.device_presets),
                "optimizer": self.optimizer, "weight_grad_fraction": self.weight_grad_fraction,
                "backward_source": self.backward_source, "forward_source": dict(self.forward_source),
                "provenance": dict(self.provenance), "forward_us": rows(self.forward_us),
                "backward_us": rows(self.backward_us), "activation_bytes": self.activation_bytes.tolist(),
                "param_bytes": self.param_bytes.tolist()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TrainCosts":
        check_schema_version(data, "TrainCosts")
        try:
            d = len(data["device_names"])
            arr = {k: np.array([[np.nan if v is None else v for v in row] for row in data[k]],
                               dtype=np.float64).reshape(-1, d) for k in ("forward_us", "backward_us")}
            return cls(device_names=tuple(data["device_names"]), device_presets=tuple(data["device_presets"]),
                       activation_bytes=np.array(data["activation_bytes"], dtype=np.int64),
                       param_bytes=np.array(data["param_bytes"], dtype=np.int64), optimizer=data["optimizer"],
                       weight_grad_fraction=float(data["weight_grad_fraction"]),
                       backward_source=data["backward_source"], forward_source=data.get("forward_source", {}),
                       graph_hash=data.get("graph_hash", ""), model=data.get("model", ""),
                       provenance=data.get("provenance", {}), **arr).validate()
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, (SchemaError, InvalidCostTableError, MissingCostError)):
                raise
            raise SchemaError(f"TrainCosts JSON is malformed ({type(exc).__name__}: {exc})") from exc

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict()))

    @classmethod
    def load(cls, path: str | Path) -> "TrainCosts":
        return cls.from_dict(json.loads(Path(path).read_text()))


def _column_for(table: CostTable, kind: str, preset: str, explicit: str | None) -> int:
    specs = table.devices.devices
    if explicit is not None:
        return table.devices.index(explicit)
    matches = [i for i, s in enumerate(specs) if s.kind == kind and (
        kind == "cpu" or s.name == preset or s.citation.lower().startswith(f"{preset}:"))]
    if len(matches) == 1:
        return matches[0]
    raise MissingCostError(
        f"the cost table (devices {[s.name for s in specs]}) has {len(matches)} columns for a {kind} device of "
        f"preset {preset!r}; build it for that preset (e.g. --devices cpu,gpu={preset}) or name the column with "
        f"columns={{{preset!r}: '<device>'}}")
