"""Per-device latency predictor: one polynomial model (:mod:`predictors.polynomial`) per kernel kind.

:class:`DevicePredictor` holds one model per kernel kind for one device plus a fallback model on
(bytes, FLOPs) of all kinds. A kind without enough training data is predicted, with an :class:`UnseenKindWarning`,
by its related kind's model (:data:`RELATED_KIND`: conv2d <-> depthwise_conv2d) or else by the fallback.
It also holds the device's in-model terms (:mod:`predictors.context`) and is saved as JSON with its provenance
(device, target, TVM version, feature schema, training ranges), never as a pickle. Convolutions are modelled per
batch element (:data:`~predictors.features.PER_SAMPLE_KINDS`).

A specialist kind (:data:`~predictors.features.SPECIALIST_KINDS`: ``gemv``, the matmuls scheduled as
matrix-vector products) has a model of its own, trained on its kernels only; they also train their parent kind's
model (matmul), which predicts them when the specialist has too few samples or the predictor predates it.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import time
import warnings
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from hetpart.errors import ExtrapolationWarning, PredictorError, SchemaError
from hetpart.graph import OpNode
from predictors.context import ContextTerms, core_cache_bytes, fit_context_terms, predict_in_context_us
from predictors.features import (DEFAULT_CORE_CACHE_BYTES, FALLBACK_FEATURES, FEATURE_SCHEMA_VERSION, KIND_FEATURES,
                                 KIND_FEATURES_BY_SCHEMA, PER_SAMPLE_KINDS, RESIDUAL_EXCLUDED, SPECIALIST_KINDS,
                                 feature_matrix, feature_vector, kernel_kind, model_kind, vectors_to_matrix,
                                 workload_key)
from predictors.polynomial import PolynomialLatencyModel
from tvm_passes.tile_plan import vector_lanes_for

logger = logging.getLogger(__name__)

PREDICTOR_FORMAT = "hetpart.device_predictor"
PREDICTOR_FORMAT_VERSION = 3     # 2: context terms replace the overhead; 3: measured kernels (exact lookup)

# A kind without a model is predicted by its related kind's model when there is one (the same TVM operator
# with different groups), else by the device's fallback model.
RELATED_KIND = {"depthwise_conv2d": "conv2d", "conv2d": "depthwise_conv2d"}


class UnseenKindWarning(ExtrapolationWarning):
    """A kernel kind had no fitted model; a related kind's model or the fallback (bytes, FLOPs) model predicted it."""


def _kind_model(kind: str, degrees: Sequence[int], alphas: Sequence[float]) -> PolynomialLatencyModel:
    names = KIND_FEATURES[kind]
    excluded = RESIDUAL_EXCLUDED.get(kind, ())
    columns = [j for j, name in enumerate(names) if name not in excluded] if excluded else None
    return PolynomialLatencyModel(degrees=tuple(degrees), alphas=tuple(alphas), feature_names=names,
                                  residual_columns=columns)


class DevicePredictor:
    """Per-kind polynomial models for one device; ``predict(nodes)`` gives kernel latencies in µs.

    With ``exact_lookup`` (default) a kernel whose workload (:func:`~predictors.features.workload_key`: ops,
    shapes, dtypes, attributes) was among the training kernels is predicted by its measured label -- the median
    if it was measured more than once -- and only unmeasured kernels by the models. The labels are stored with
    the coefficients (``measured_us_``, keyed by a hash of the workload key).
    """

    source = "predicted"

    def __init__(self, device: str = "cpu", target: Mapping[str, Any] | None = None, tvm_version: str | None = None,
                 degrees: Sequence[int] = (1, 2), alphas: Sequence[float] = (1e-4, 1e-2, 1.0),
                 min_samples_per_kind: int = 12, exact_lookup: bool = True, num_threads: int | None = None,
                 core_cache_bytes: int | None = None):
        self.device = device
        self.num_threads = num_threads      # TVM threads the training kernels ran with (None: not recorded)
        # Combined L2 of the cores those threads ran on (a feature of the gemv model); None: this host's, resolved
        # by fit() into core_cache_bytes_
        self.core_cache_bytes = core_cache_bytes
        self.core_cache_bytes_: int | None = None
        self.target = dict(target or {"kind": "llvm"})
        self.tvm_version = tvm_version if tvm_version is not None else _installed_tvm_version()
        self.degrees, self.alphas = tuple(degrees), tuple(alphas)
        self.min_samples_per_kind = min_samples_per_kind
        self.exact_lookup = bool(exact_lookup)
        self.measured_us_: dict[str, float] = {}
        self.models: dict[str, PolynomialLatencyModel] = {}
        self.fallback: PolynomialLatencyModel | None = None
        self.context = ContextTerms()
        self.fit_info: dict[str, Any] = {}
        self.feature_schema_version = FEATURE_SCHEMA_VERSION   # a loaded predictor keeps the schema it was fitted with

    @property
    def kind_features(self) -> Mapping[str, tuple[str, ...]]:
        """The features each kind's model takes, as of the schema this predictor was fitted with."""
        return KIND_FEATURES_BY_SCHEMA[self.feature_schema_version]

    @property
    def vector_lanes(self) -> int:
        """fp32 SIMD lanes of the target (the schedule-derived features depend on it)."""
        mattr = self.target.get("mattr", ())
        return vector_lanes_for(str(self.target.get("mcpu", "")), [mattr] if isinstance(mattr, str) else mattr)

    def fit(self, nodes: Sequence[OpNode], latencies_us: Sequence[float]) -> "DevicePredictor":
        nodes, y = list(nodes), np.asarray(latencies_us, dtype=np.float64)
        if not nodes:
            raise PredictorError(f"no measurements to fit a predictor for device {self.device!r}; "
                                 "run `hetpart profile` first")
        if len(nodes) != len(y):
            raise PredictorError(f"{len(nodes)} kernels but {len(y)} latencies: they must pair up")
        start = time.perf_counter()
        self.core_cache_bytes_ = int(self.core_cache_bytes if self.core_cache_bytes is not None
                                     else core_cache_bytes(self.num_threads))
        kinds = np.array([kernel_kind(n) for n in nodes])
        model_kinds = np.array([model_kind(n) for n in nodes])     # the kernel kind, or its specialist kind
        vectors = self._vectors(nodes)
        self.models, self.feature_schema_version = {}, FEATURE_SCHEMA_VERSION
        for kind in sorted(set(kinds.tolist()) | set(model_kinds.tolist())):
            idx = np.flatnonzero((kinds == kind) | (model_kinds == kind))
            if len(idx) < self.min_samples_per_kind:
                logger.info("kind %s has %d samples (< %d): it gets no model of its own",
                            kind, len(idx), self.min_samples_per_kind)
                continue
            names = KIND_FEATURES[kind]
            scale = _batch_scale(kind, [vectors[i] for i in idx])
            self.models[kind] = _kind_model(kind, self.degrees, self.alphas).fit(
                vectors_to_matrix([vectors[i] for i in idx], names), y[idx] / scale)
        self.fallback = PolynomialLatencyModel(degrees=(1,), alphas=(1e-4,), feature_names=FALLBACK_FEATURES).fit(
            vectors_to_matrix(vectors, FALLBACK_FEATURES), y)
        labels: dict[str, list[float]] = {}
        for node, value in zip(nodes, y):
            labels.setdefault(_lookup_key(node), []).append(float(value))
        self.measured_us_ = {k: float(np.median(v)) for k, v in sorted(labels.items())} if self.exact_lookup else {}
        self.fit_info = {"fit_seconds": time.perf_counter() - start, "n_samples": len(nodes),
                         "samples_per_kind": {k: int(((kinds == k) | (model_kinds == k)).sum())
                                              for k in sorted(set(kinds.tolist()) | set(model_kinds.tolist()))},
                         "fit_date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
        return self

    def predict(self, nodes: Sequence[OpNode]) -> np.ndarray:
        if self.fallback is None:
            raise PredictorError(f"the predictor for device {self.device!r} is not fitted; call fit() or load() it")
        nodes = list(nodes)
        out = np.empty(len(nodes))
        kinds = np.array([self._model_kind(n) for n in nodes]) if nodes else np.array([], dtype=str)
        for kind in sorted(set(kinds.tolist())):
            idx = np.flatnonzero(kinds == kind)
            sub = [nodes[i] for i in idx]
            used_kind = kind if kind in self.models else RELATED_KIND.get(kind)
            model = self.models.get(used_kind) if used_kind else None
            if used_kind != kind:
                warnings.warn(UnseenKindWarning(
                    f"device {self.device!r} has no model for kernel kind {kind!r} ({len(idx)} kernels, e.g. "
                    f"{sub[0].op}); the {used_kind + ' model' if model else 'fallback (bytes, FLOPs) model'} "
                    "predicted them. Profile such kernels and refit for better accuracy."), stacklevel=2)
            if model is None:
                out[idx] = self.fallback.predict(feature_matrix(sub, FALLBACK_FEATURES, self.vector_lanes))
            else:
                vectors = self._vectors(sub)
                out[idx] = model.predict(vectors_to_matrix(vectors, self.kind_features[used_kind])) \
                    * _batch_scale(used_kind, vectors)
        if self.measured_us_:
            for i, node in enumerate(nodes):
                out[i] = self.measured_us_.get(_lookup_key(node), out[i])
        return out

    def _model_kind(self, node: OpNode) -> str:
        """The kind whose model predicts ``node``: its specialist kind if that was fitted, else its kernel kind."""
        kind = model_kind(node)
        return kind if kind in self.models or kind not in SPECIALIST_KINDS else SPECIALIST_KINDS[kind]

    def _vectors(self, nodes: Sequence[OpNode]) -> list[dict[str, float]]:
        return [feature_vector(n, self.vector_lanes, self.core_cache_bytes_) for n in nodes]

    def fit_context(self, models: Iterable[tuple[Sequence[OpNode], float]],
                    cache_bytes: int | None = None, core_cache: int | None = None) -> ContextTerms:
        """Fit and store the in-model terms from whole-model measurements (see :mod:`predictors.context`)."""
        self.context = fit_context_terms(self, models, cache_bytes, core_cache)
        return self.context

    def predict_in_context(self, nodes: Sequence[OpNode]) -> np.ndarray:
        """Latency of each kernel inside a model: :meth:`predict` + the context terms (µs)."""
        return predict_in_context_us(nodes, self)

    # ------------------------------------------------------------------ provenance + JSON
    def provenance(self) -> dict[str, Any]:
        ranges = {kind: {name: [float(lo), float(hi)] for name, lo, hi in
                         zip(self.kind_features[kind], m.feature_min_, m.feature_max_)}
                  for kind, m in self.models.items()}
        return {"device": self.device, "target": dict(self.target), "tvm_version": self.tvm_version,
                "num_threads": self.num_threads, "core_cache_bytes": self.core_cache_bytes_,
                "feature_schema_version": self.feature_schema_version,
                "source": self.source, "training_ranges": ranges, **self.fit_info}

    def to_dict(self) -> dict[str, Any]:
        if self.fallback is None:
            raise PredictorError("cannot save an unfitted predictor; call fit() first")
        return {"format": PREDICTOR_FORMAT, "format_version": PREDICTOR_FORMAT_VERSION,
                "provenance": self.provenance(), "degrees": list(self.degrees), "alphas": list(self.alphas),
                "min_samples_per_kind": self.min_samples_per_kind, "exact_lookup": self.exact_lookup,
                "context": self.context.to_dict(), "measured_us": dict(self.measured_us_),
                "models": {k: m.to_dict() for k, m in self.models.items()}, "fallback": self.fallback.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "DevicePredictor":
        if not isinstance(data, Mapping) or data.get("format") != PREDICTOR_FORMAT \
                or data.get("format_version") != PREDICTOR_FORMAT_VERSION:
            raise SchemaError(f"not a {PREDICTOR_FORMAT} v{PREDICTOR_FORMAT_VERSION} file; re-create it with "
                              "`hetpart fit`")
        prov = data.get("provenance", {})
        schema = prov.get("feature_schema_version")
        if schema not in KIND_FEATURES_BY_SCHEMA:
            raise PredictorError(
                f"predictor was fitted with feature schema {schema!r}; this hetpart computes schema "
                f"{FEATURE_SCHEMA_VERSION} and reads {sorted(KIND_FEATURES_BY_SCHEMA)}. Refit it with `hetpart fit` "
                "on the profile database.")
        pred = cls(device=prov.get("device", "cpu"), target=prov.get("target"), tvm_version=prov.get("tvm_version"),
                   degrees=data["degrees"], alphas=data["alphas"], min_samples_per_kind=data["min_samples_per_kind"],
                   exact_lookup=data["exact_lookup"], num_threads=prov.get("num_threads"),
                   core_cache_bytes=prov.get("core_cache_bytes"))
        pred.feature_schema_version = int(schema)
        # files before schema 10 have no gemv model, so the default never reaches a prediction
        pred.core_cache_bytes_ = int(prov.get("core_cache_bytes") or DEFAULT_CORE_CACHE_BYTES)
        pred.measured_us_ = {str(k): float(v) for k, v in data["measured_us"].items()}
        pred.models = {k: PolynomialLatencyModel.from_dict(m) for k, m in data["models"].items()}
        pred.fallback = PolynomialLatencyModel.from_dict(data["fallback"])
        pred.context = ContextTerms.from_dict(data["context"])
        pred.fit_info = {k: prov[k] for k in ("fit_seconds", "n_samples", "samples_per_kind", "fit_date", "training")
                        if k in prov}
        return pred

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> "DevicePredictor":
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise PredictorError(f"cannot read predictor {path}: {exc}. Fit one with `hetpart fit`.") from exc
        return cls.from_dict(data)


def _batch_scale(kind: str, vectors: Sequence[Mapping[str, float]]) -> np.ndarray:
    """What a kind's model predicts a fraction of: the batch for :data:`PER_SAMPLE_KINDS` (modelled per batch
    element), else 1. Latencies are divided by it before fitting and predictions multiplied by it."""
    if kind not in PER_SAMPLE_KINDS:
        return np.ones(len(vectors))
    return np.array([max(v["batch"], 1.0) for v in vectors])


def _lookup_key(node: OpNode) -> str:
    return hashlib.sha256(workload_key(node).encode()).hexdigest()[:20]


def _installed_tvm_version() -> str:
    try:
        return metadata.version("apache-tvm")
    except metadata.PackageNotFoundError:
        return "unknown"
