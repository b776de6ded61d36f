"""Polynomial latency models: one per (kernel kind, device), saved as JSON coefficients (never pickles).

:class:`PolynomialLatencyModel` (a scikit-learn regressor) maps positive features ``x`` to a latency in µs:

    z = (log(1 + x) - mean) / scale          log features, standardised on the training set
    log(latency_us) = intercept + coef · poly(z)    poly = all monomials of z up to ``degree_``

It is fitted to **log latency** with ridge regression, so it minimises squared log error — i.e. relative error
(for small errors ``|log(p/y)| ≈ |p - y| / y``), not absolute error. The degree (among ``degrees``) and ridge
strength (among ``alphas``) are chosen by k-fold cross-validation on the same log error.

Outside the training range an :class:`~hetpart.errors.ExtrapolationWarning` is raised and inputs are clamped:
* a row with a feature *below* its training minimum: that feature is clamped to the minimum (small kernels sit on
  the launch-overhead floor) and the polynomial predicts;
* a row with a feature *above* its training maximum: the polynomial is not evaluated there, nor at the
  per-feature clamped point (whose features then describe a combination never seen: e.g. FLOPs clamped while
  M, N, K are not). Instead the nearest training kernel (standardised log space) is predicted by the polynomial
  and scaled linearly by the ratio of the *work* feature (column ``work_feature``, e.g. FLOPs): a saturated
  device takes time proportional to work. The work ratio is clamped to ``extrapolation_limit``.
Every log prediction is held within [min / 10, max × ``extrapolation_limit``] of the training latencies, so the
model never explodes. The training points are stored with the coefficients for this.

Degree: 1 or 2 by default. Degree 3 was tried: on leave-one-model-out it predicted fused elementwise kernels of
an unseen model up to 10^4x off (a cubic in six log features swings wildly between training points), while
degree <= 2 kept every model within 40%.

**Local residual correction.** A smooth polynomial cannot follow the steps the compiler's schedule choices put
into latency (a tile that does not divide a loop, a vector width that falls back to scalar code). The model
therefore stores each training kernel's log residual and adds, for a query, the Gaussian-weighted mean residual of
its ``residual_neighbours`` nearest training kernels in the standardised log-feature space:
``Σ w_i r_i / (residual_prior + Σ w_i)`` with ``w_i = exp(-d_i² / 2h²)``, so it fades to 0 away from the data.
The bandwidth ``h`` (or 0 = off) is chosen by the same k-fold cross-validation as the degree. It is still a
closed-form model in JSON: coefficients, training points and their residuals.

:class:`DevicePredictor` holds one model per kernel kind for one device plus a fallback model on
(bytes, FLOPs) of all kinds. A kind without enough training data is predicted, with an :class:`UnseenKindWarning`,
by its related kind's model (:data:`RELATED_KIND`: conv2d <-> depthwise_conv2d) or else by the fallback.
"""
from __future__ import annotations

import datetime as _dt
import json
import logging
import time
import warnings
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.linear_model import Ridge
from sklearn.model_selection import KFold
from sklearn.preprocessing import PolynomialFeatures
from sklearn.utils.validation import check_array, check_is_fitted, check_X_y

from hetpart.errors import ExtrapolationWarning, PredictorError, SchemaError
from hetpart.graph import OpNode
from predictors.context import ContextTerms, fit_context_terms
from predictors.features import (FALLBACK_FEATURES, FEATURE_SCHEMA_VERSION, KIND_FEATURES, feature_matrix,
                                 feature_vector, kernel_kind, vectors_to_matrix)

logger = logging.getLogger(__name__)

PREDICTOR_FORMAT = "hetpart.device_predictor"
PREDICTOR_FORMAT_VERSION = 2     # 2: context terms (per-kernel overhead + cold weights) replace the overhead
_FITTED = ("n_features_in_", "degree_", "alpha_", "feature_min_", "feature_max_", "log_mean_", "log_scale_",
           "powers_", "coef_", "intercept_", "anchors_", "anchor_residuals_", "residual_bandwidth_",
           "log_latency_min_", "log_latency_max_", "cv_rmse_log_", "n_samples_")


# A kind without a model is predicted by its related kind's model when there is one (the same TVM operator
# with different groups), else by the device's fallback model.
RELATED_KIND = {"depthwise_conv2d": "conv2d", "conv2d": "depthwise_conv2d"}


class UnseenKindWarning(ExtrapolationWarning):
    """A kernel kind had no fitted model; a related kind's model or the fallback (bytes, FLOPs) model predicted it."""


class PolynomialLatencyModel(RegressorMixin, BaseEstimator):
    """Polynomial regression in log space of positive features -> latency (µs); see the module docstring."""

    def __init__(self, degrees: Sequence[int] = (1, 2), alphas: Sequence[float] = (1e-4, 1e-2, 1.0),
                 cv: int = 5, work_feature: int = 0, extrapolation_limit: float = 1000.0,
                 feature_names: Sequence[str] | None = None, random_state: int = 0,
                 residual_bandwidths: Sequence[float] = (0.1, 0.3, 1.0), residual_neighbours: int = 8,
                 residual_prior: float = 0.05):
        self.degrees = degrees
        self.alphas = alphas
        self.cv = cv
        self.work_feature = work_feature
        self.extrapolation_limit = extrapolation_limit
        self.feature_names = feature_names
        self.random_state = random_state
        self.residual_bandwidths = residual_bandwidths
        self.residual_neighbours = residual_neighbours
        self.residual_prior = residual_prior

    # ------------------------------------------------------------------ fit
    def fit(self, X: Any, y: Any) -> "PolynomialLatencyModel":
        X, y = check_X_y(X, y, dtype=np.float64, y_numeric=True)
        if np.any(X < 0) or np.any(y <= 0):
            raise PredictorError("features must be >= 0 and latencies > 0 (µs) to fit in log space; found "
                                 f"min feature {X.min():.3g}, min latency {y.min():.3g}. Drop failed measurements.")
        n, f = X.shape
        self.n_features_in_, self.n_samples_ = f, n
        self.feature_min_, self.feature_max_ = X.min(axis=0), X.max(axis=0)
        logx, logy = np.log1p(X), np.log(y)
        self.log_mean_ = logx.mean(axis=0)
        std = logx.std(axis=0)
        self.log_scale_ = np.where(std > 1e-12, std, 1.0)
        z = (logx - self.log_mean_) / self.log_scale_
        self.log_latency_min_, self.log_latency_max_ = float(logy.min()), float(logy.max())
        max_degree = max(int(d) for d in self.degrees)
        poly = PolynomialFeatures(max_degree, include_bias=False).fit(z)
        phi = poly.transform(z)
        n_terms = {int(d): int((poly.powers_.sum(axis=1) <= d).sum()) for d in self.degrees}
        self.anchors_, inverse = np.unique(X, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        folds = min(int(self.cv), len(self.anchors_))
        scores: dict[str, float] = {}
        if folds >= 2 and n >= 10:
            # Folds of distinct kernels: a kernel measured once per model that uses it must not sit on both sides.
            splits = [(np.flatnonzero(np.isin(inverse, tr)), np.flatnonzero(np.isin(inverse, te))) for tr, te in
                      KFold(folds, shuffle=True, random_state=self.random_state).split(self.anchors_)]
            for d in sorted(n_terms):
                if n_terms[d] > 0.5 * n * (folds - 1) / folds:
                    continue   # too many terms for the data: skip rather than overfit
                for alpha in self.alphas:
                    err = []
                    for tr, te in splits:
                        model = Ridge(alpha=float(alpha)).fit(phi[tr, :n_terms[d]], logy[tr])
                        err.append(np.mean((model.predict(phi[te, :n_terms[d]]) - logy[te]) ** 2))
                    scores[f"{d}:{float(alpha)!r}"] = float(np.sqrt(np.mean(err)))
        if scores:
            best = min(scores, key=scores.get)
            degree, alpha = int(best.split(":")[0]), float(best.split(":")[1])
        else:      # too little data to cross-validate: the lowest degree, the strongest regularisation
            degree, alpha = min(n_terms), float(max(self.alphas))
        terms = n_terms[degree]
        model = Ridge(alpha=alpha).fit(phi[:, :terms], logy)
        self.degree_, self.alpha_, self.cv_rmse_log_ = degree, alpha, scores
        self.powers_ = poly.powers_[:terms].astype(np.int64)
        self.coef_, self.intercept_ = np.asarray(model.coef_, dtype=np.float64), float(model.intercept_)
        residual = logy - model.predict(phi[:, :terms])
        self.anchor_residuals_ = np.bincount(inverse, residual) / np.bincount(inverse)
        self.residual_bandwidth_ = 0.0
        if folds >= 2 and n >= 10 and self.residual_bandwidths:
            self.residual_bandwidth_ = self._choose_bandwidth(phi[:, :terms], z, logy, alpha, splits)
        return self

    def _choose_bandwidth(self, phi: np.ndarray, z: np.ndarray, logy: np.ndarray, alpha: float,
                          splits: list[tuple[np.ndarray, np.ndarray]]) -> float:
        """The residual-correction bandwidth (0 = off) with the lowest k-fold RMSE of log latency."""
        candidates = [0.0] + [float(h) for h in self.residual_bandwidths]
        sq_err = {h: 0.0 for h in candidates}
        for tr, te in splits:
            model = Ridge(alpha=alpha).fit(phi[tr], logy[tr])
            residual, base = logy[tr] - model.predict(phi[tr]), model.predict(phi[te])
            for h in candidates:
                pred = base + (self._correction(z[te], z[tr], residual, h) if h > 0 else 0.0)
                sq_err[h] += float(np.sum((pred - logy[te]) ** 2))
        self.cv_rmse_log_ = {**self.cv_rmse_log_,
                             **{f"residual_bandwidth:{h!r}": float(np.sqrt(e / len(logy))) for h, e in sq_err.items()}}
        return min(candidates, key=lambda h: (sq_err[h], h))

    def _correction(self, z_query: np.ndarray, z_anchor: np.ndarray, residual: np.ndarray,
                    bandwidth: float) -> np.ndarray:
        """Gaussian-weighted mean residual of the nearest anchors (see the module docstring)."""
        k = min(int(self.residual_neighbours), len(z_anchor))
        out = np.empty(len(z_query))
        for start in range(0, len(z_query), 256):
            chunk = z_query[start:start + 256]
            d2 = ((chunk[:, None, :] - z_anchor[None, :, :]) ** 2).sum(axis=2)
            nearest = np.argpartition(d2, k - 1, axis=1)[:, :k]
            d2k = np.take_along_axis(d2, nearest, axis=1)
            w = np.exp(-d2k / (2.0 * bandwidth ** 2))
            out[start:start + 256] = (w * residual[nearest]).sum(axis=1) / (self.residual_prior + w.sum(axis=1))
        return out

    # ------------------------------------------------------------------ predict
    def predict(self, X: Any) -> np.ndarray:
        check_is_fitted(self, "coef_")
        X = check_array(X, dtype=np.float64)
        if X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features; this model was fitted with {self.n_features_in_}")
        low, high = X < self.feature_min_, X > self.feature_max_
        if low.any() or high.any():
            names = list(self.feature_names or [f"x{j}" for j in range(X.shape[1])])
            bad = [f"{names[j]} ({int(low[:, j].sum())} below {self.feature_min_[j]:.4g}, "
                   f"{int(high[:, j].sum())} above {self.feature_max_[j]:.4g})"
                   for j in range(X.shape[1]) if low[:, j].any() or high[:, j].any()]
            warnings.warn(ExtrapolationWarning(
                f"{int((low | high).any(axis=1).sum())} of {len(X)} inputs lie outside the training range in "
                f"{', '.join(bad)}; they were clamped to it (rows above it: the nearest training kernel scaled by the "
                f"work ratio). Profile workloads that cover these sizes and refit."),
                stacklevel=2)
        log_t = self._log_poly(np.clip(X, self.feature_min_, self.feature_max_))
        above = np.flatnonzero(high.any(axis=1))
        if above.size:
            z_anchor = self._z(self.anchors_)
            chunks = np.array_split(self._z(X[above]), max(1, above.size // 256))
            nearest = np.concatenate([np.argmin(((c[:, None, :] - z_anchor[None, :, :]) ** 2).sum(axis=2), axis=1)
                                      for c in chunks])
            anchor = self.anchors_[nearest]
            j = self.work_feature
            ratio = np.clip((X[above, j] + 1.0) / (anchor[:, j] + 1.0), 1.0 / self.extrapolation_limit,
                            self.extrapolation_limit)
            log_t[above] = self._log_poly(anchor) + np.log(ratio)
        if self.residual_bandwidth_ > 0:
            log_t += self._correction(self._z(X), self._z(self.anchors_), self.anchor_residuals_,
                                      self.residual_bandwidth_)
        return np.exp(np.clip(log_t, self.log_latency_min_ - np.log(10.0),
                              self.log_latency_max_ + np.log(self.extrapolation_limit)))

    def _z(self, X: np.ndarray) -> np.ndarray:
        return (np.log1p(X) - self.log_mean_) / self.log_scale_

    def _log_poly(self, X: np.ndarray) -> np.ndarray:
        z = self._z(X)
        return np.prod(z[:, None, :] ** self.powers_[None, :, :], axis=2) @ self.coef_ + self.intercept_

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        check_is_fitted(self, "coef_")
        fitted = {}
        for key in _FITTED:
            value = getattr(self, key)
            fitted[key] = value.tolist() if isinstance(value, np.ndarray) else value
        params = {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.get_params().items()}
        return {"params": params, "fitted": fitted}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PolynomialLatencyModel":
        try:
            params = dict(data["params"])
            for key in ("degrees", "alphas", "feature_names", "residual_bandwidths"):
                if params.get(key) is not None:
                    params[key] = tuple(params[key])
            model = cls(**params)
            fitted = data["fitted"]
            for key in _FITTED:
                value = fitted[key]
                if key in ("feature_min_", "feature_max_", "log_mean_", "log_scale_", "coef_", "anchor_residuals_"):
                    value = np.asarray(value, dtype=np.float64)
                elif key == "powers_":
                    value = np.asarray(value, dtype=np.int64).reshape(-1, fitted["n_features_in_"])
                elif key == "anchors_":
                    value = np.asarray(value, dtype=np.float64).reshape(-1, fitted["n_features_in_"])
                setattr(model, key, value)
        except (KeyError, TypeError, ValueError) as exc:
            raise SchemaError(f"polynomial model JSON is malformed ({type(exc).__name__}: {exc}); "
                              "re-create it with `hetpart fit`") from exc
        return model


def _kind_model(names: tuple[str, ...], degrees: Sequence[int], alphas: Sequence[float]) -> PolynomialLatencyModel:
    return PolynomialLatencyModel(degrees=tuple(degrees), alphas=tuple(alphas), feature_names=names)


class DevicePredictor:
    """Per-kind polynomial models for one device; ``predict(nodes)`` gives kernel latencies in µs."""

    source = "predicted"

    def __init__(self, device: str = "cpu", target: Mapping[str, Any] | None = None, tvm_version: str | None = None,
                 degrees: Sequence[int] = (1, 2), alphas: Sequence[float] = (1e-4, 1e-2, 1.0),
                 min_samples_per_kind: int = 12):
        self.device = device
        self.target = dict(target or {"kind": "llvm"})
        self.tvm_version = tvm_version if tvm_version is not None else _installed_tvm_version()
        self.degrees, self.alphas = tuple(degrees), tuple(alphas)
        self.min_samples_per_kind = min_samples_per_kind
        self.models: dict[str, PolynomialLatencyModel] = {}
        self.fallback: PolynomialLatencyModel | None = None
        self.context = ContextTerms()
        self.fit_info: dict[str, Any] = {}

    def fit(self, nodes: Sequence[OpNode], latencies_us: Sequence[float]) -> "DevicePredictor":
        nodes, y = list(nodes), np.asarray(latencies_us, dtype=np.float64)
        if not nodes:
            raise PredictorError(f"no measurements to fit a predictor for device {self.device!r}; "
                                 "run `hetpart profile` first")
        if len(nodes) != len(y):
            raise PredictorError(f"{len(nodes)} kernels but {len(y)} latencies: they must pair up")
        start = time.perf_counter()
        kinds = np.array([kernel_kind(n) for n in nodes])
        vectors = [feature_vector(n) for n in nodes]
        self.models = {}
        for kind in sorted(set(kinds.tolist())):
            idx = np.flatnonzero(kinds == kind)
            if len(idx) < self.min_samples_per_kind:
                logger.info("kind %s has %d samples (< %d): the fallback model will predict it",
                            kind, len(idx), self.min_samples_per_kind)
                continue
            names = KIND_FEATURES[kind]
            self.models[kind] = _kind_model(names, self.degrees, self.alphas).fit(
                vectors_to_matrix([vectors[i] for i in idx], names), y[idx])
        self.fallback = PolynomialLatencyModel(degrees=(1,), alphas=(1e-4,), feature_names=FALLBACK_FEATURES).fit(
            vectors_to_matrix(vectors, FALLBACK_FEATURES), y)
        self.fit_info = {"fit_seconds": time.perf_counter() - start, "n_samples": len(nodes),
                         "samples_per_kind": {k: int((kinds == k).sum()) for k in sorted(set(kinds.tolist()))},
                         "fit_date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
        return self

    def predict(self, nodes: Sequence[OpNode]) -> np.ndarray:
        if self.fallback is None:
            raise PredictorError(f"the predictor for device {self.device!r} is not fitted; call fit() or load() it")
        nodes = list(nodes)
        out = np.empty(len(nodes))
        kinds = np.array([kernel_kind(n) for n in nodes]) if nodes else np.array([], dtype=str)
        for kind in sorted(set(kinds.tolist())):
            idx = np.flatnonzero(kinds == kind)
            sub = [nodes[i] for i in idx]
            model_kind = kind if kind in self.models else RELATED_KIND.get(kind)
            model = self.models.get(model_kind) if model_kind else None
            if model_kind != kind:
                warnings.warn(UnseenKindWarning(
                    f"device {self.device!r} has no model for kernel kind {kind!r} ({len(idx)} kernels, e.g. "
                    f"{sub[0].op}); the {model_kind + ' model' if model else 'fallback (bytes, FLOPs) model'} "
                    "predicted them. Profile such kernels and refit for better accuracy."), stacklevel=2)
            if model is None:
                out[idx] = self.fallback.predict(feature_matrix(sub, FALLBACK_FEATURES))
            else:
                out[idx] = model.predict(feature_matrix(sub, KIND_FEATURES[model_kind]))
        return out

    def fit_context(self, models: Iterable[tuple[Sequence[OpNode], float]],
                    cache_bytes: int | None = None) -> ContextTerms:
        """Fit and store the in-model terms from whole-model measurements (see :mod:`predictors.context`)."""
        self.context = fit_context_terms(self, models, cache_bytes)
        return self.context

    def predict_in_context(self, nodes: Sequence[OpNode]) -> np.ndarray:
        """Latency of each kernel inside a model: :meth:`predict` + the context terms (µs)."""
        nodes = list(nodes)
        return self.predict(nodes) + self.context.extra_us(nodes)

    # ------------------------------------------------------------------ provenance + JSON
    def provenance(self) -> dict[str, Any]:
        ranges = {kind: {name: [float(lo), float(hi)] for name, lo, hi in
                         zip(KIND_FEATURES[kind], m.feature_min_, m.feature_max_)} for kind, m in self.models.items()}
        return {"device": self.device, "target": dict(self.target), "tvm_version": self.tvm_version,
                "feature_schema_version": FEATURE_SCHEMA_VERSION, "source": self.source,
                "training_ranges": ranges, **self.fit_info}

    def to_dict(self) -> dict[str, Any]:
        if self.fallback is None:
            raise PredictorError("cannot save an unfitted predictor; call fit() first")
        return {"format": PREDICTOR_FORMAT, "format_version": PREDICTOR_FORMAT_VERSION,
                "provenance": self.provenance(), "degrees": list(self.degrees), "alphas": list(self.alphas),
                "min_samples_per_kind": self.min_samples_per_kind,
                "context": self.context.to_dict(),
                "models": {k: m.to_dict() for k, m in self.models.items()}, "fallback": self.fallback.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "DevicePredictor":
        if not isinstance(data, Mapping) or data.get("format") != PREDICTOR_FORMAT \
                or data.get("format_version") != PREDICTOR_FORMAT_VERSION:
            raise SchemaError(f"not a {PREDICTOR_FORMAT} v{PREDICTOR_FORMAT_VERSION} file; re-create it with "
                              "`hetpart fit`")
        prov = data.get("provenance", {})
        if prov.get("feature_schema_version") != FEATURE_SCHEMA_VERSION:
            raise PredictorError(
                f"predictor was fitted with feature schema {prov.get('feature_schema_version')!r}; this hetpart "
                f"computes schema {FEATURE_SCHEMA_VERSION}. Refit it with `hetpart fit` on the profile database.")
        pred = cls(device=prov.get("device", "cpu"), target=prov.get("target"), tvm_version=prov.get("tvm_version"),
                   degrees=data["degrees"], alphas=data["alphas"], min_samples_per_kind=data["min_samples_per_kind"])
        pred.models = {k: PolynomialLatencyModel.from_dict(m) for k, m in data["models"].items()}
        pred.fallback = PolynomialLatencyModel.from_dict(data["fallback"])
        pred.context = ContextTerms.from_dict(data["context"])
        pred.fit_info = {k: prov[k] for k in ("fit_seconds", "n_samples", "samples_per_kind", "fit_date") if k in prov}
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


def _installed_tvm_version() -> str:
    try:
        return metadata.version("apache-tvm")
    except metadata.PackageNotFoundError:
        return "unknown"
