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
The same nearest-neighbour rule predicts rows *inside* the per-feature ranges that lie farther than
``support_radius`` standard deviations (standardised log space) from every training kernel: a combination of sizes
never measured (also with an :class:`~hetpart.errors.ExtrapolationWarning`). And every prediction stays within
``max_departure``x of that work-scaled nearest measured kernel (a trust region). Both guards were added after
leave-one-family-out, where unseen kernel families land between training points: without them the polynomial
predicted BERT's reshape+permute kernels (2-5 µs) at 55 ms and the kernel MAPE was 2,095%; with radius 2 and
departure 3x it was 95-99% (radius 2 alone: 211%, departure 10x: 105%); leave-one-model-out was unchanged or
better.
Every log prediction is held within [min / 10, max × ``extrapolation_limit``] of the training latencies, so the
model never explodes. The training points are stored with the coefficients for this.

Degree: 1 or 2 by default. Degree 3 was tried: on leave-one-model-out it predicted fused elementwise kernels of
an unseen model up to 10^4x off (a cubic in six log features swings wildly between training points), while
degree <= 2 kept every whole-model error of that experiment within 40%.

**Local residual correction.** A smooth polynomial cannot follow the steps the compiler's schedule choices put
into latency (a tile that does not divide a loop, a vector width that falls back to scalar code). The model
therefore stores each training kernel's log residual and adds, for a query, the Gaussian-weighted mean residual of
its ``residual_neighbours`` nearest training kernels in the standardised log-feature space:
``Σ w_i r_i / (residual_prior + Σ w_i)`` with ``w_i = exp(-d_i² / 2h²)``, so it fades to 0 away from the data.
The bandwidth ``h`` (or 0 = off) is chosen by the same k-fold cross-validation as the degree, among 0.1-1.0 in six
steps, finer than a grid of three (0.1/0.3/1.0): with conv2d's batch out of the distance it took kernels >= 100 µs
about a point of MAPE lower (measurements: docs/predictors_history.md). It is still a closed-form model in JSON:
coefficients, training points and their residuals. ``residual_columns`` limits the distance to some features
(:data:`predictors.features.RESIDUAL_EXCLUDED`).

**Twins.** A query whose features equal a training kernel's (distance 0) is predicted by that kernel's measured
label -- the geometric mean if several training rows share the features -- not by the polynomial. Exact workload
repeats are already answered by :class:`~predictors.device_predictor.DevicePredictor`'s lookup; twins are the
kernels the features cannot tell apart from a measured one although the workload differs: a convolution at batch 4
whose batch-1 twin was measured (convolutions are modelled per batch element), or a kernel whose fused epilogue
differs only in ops its kind's features do not count. The bandwidth cross-validation cannot credit them (its folds
hold out each distinct feature row whole), so the correction alone left them to the polynomial: MobileNetV2's
32->16 1x1 convolution at 112x112, measured 60 µs at batch 1, was predicted 144 µs per sample at batch 4 (+216%).
Answering twins by their label took leave-one-model-out kernels >= 100 µs from 8.4% to 6.8% MAPE (Z5-B in
docs/predictors_history.md).

:class:`predictors.device_predictor.DevicePredictor` combines one such model per kernel kind for a device.
"""
from __future__ import annotations

import logging
import warnings
from typing import Any, Mapping, Sequence

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.linear_model import Ridge
from sklearn.model_selection import KFold
from sklearn.preprocessing import PolynomialFeatures
from sklearn.utils.validation import check_array, check_is_fitted, check_X_y

from hetpart.errors import ExtrapolationWarning, PredictorError, SchemaError

logger = logging.getLogger(__name__)

# Standardised log-space distance under which a query counts as a training kernel's twin (equal features up to
# float rounding).
_TWIN_DISTANCE = 1e-6

_FITTED = ("n_features_in_", "degree_", "alpha_", "feature_min_", "feature_max_", "log_mean_", "log_scale_",
           "powers_", "coef_", "intercept_", "anchors_", "anchor_residuals_", "residual_bandwidth_",
           "log_latency_min_", "log_latency_max_", "cv_rmse_log_", "n_samples_")


class PolynomialLatencyModel(RegressorMixin, BaseEstimator):
    """Polynomial regression in log space of positive features -> latency (µs); see the module docstring."""

    def __init__(self, degrees: Sequence[int] = (1, 2), alphas: Sequence[float] = (1e-4, 1e-2, 1.0),
                 cv: int = 5, work_feature: int = 0, extrapolation_limit: float = 1000.0,
                 feature_names: Sequence[str] | None = None, random_state: int = 0,
                 residual_bandwidths: Sequence[float] = (0.1, 0.2, 0.3, 0.5, 0.7, 1.0), residual_neighbours: int = 8,
                 residual_prior: float = 0.05, residual_columns: Sequence[int] | None = None,
                 support_radius: float = 2.0, max_departure: float = 3.0):
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
        self.residual_columns = residual_columns
        self.support_radius = support_radius
        self.max_departure = max_departure

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
        if self.residual_columns is not None:
            cols = list(self.residual_columns)
            z_query, z_anchor = z_query[:, cols], z_anchor[:, cols]
        out = np.empty(len(z_query))
        for start, d2 in _chunked_sq_distances(z_query, z_anchor):
            out[start:start + len(d2)] = self._weighted_residual(d2, residual, bandwidth)
        return out

    def _weighted_residual(self, d2: np.ndarray, residual: np.ndarray, bandwidth: float) -> np.ndarray:
        """Rows of squared distances to the anchors -> the correction of each row."""
        k = min(int(self.residual_neighbours), d2.shape[1])
        nearest = np.argpartition(d2, k - 1, axis=1)[:, :k]
        w = np.exp(-np.take_along_axis(d2, nearest, axis=1) / (2.0 * bandwidth ** 2))
        return (w * residual[nearest]).sum(axis=1) / (self.residual_prior + w.sum(axis=1))

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
        z_query, z_anchor = self._z(X), self._z(self.anchors_)
        nearest, distance = np.empty(len(X), dtype=np.int64), np.empty(len(X))
        correct = self.residual_bandwidth_ > 0
        shared = correct and self.residual_columns is None    # the correction can reuse these distances
        correction = np.zeros(len(X))
        for start, d2 in _chunked_sq_distances(z_query, z_anchor):
            rows = slice(start, start + len(d2))
            nearest[rows], distance[rows] = np.argmin(d2, axis=1), np.sqrt(d2.min(axis=1))
            if shared:
                correction[rows] = self._weighted_residual(d2, self.anchor_residuals_, self.residual_bandwidth_)
        if correct and not shared:
            correction = self._correction(z_query, z_anchor, self.anchor_residuals_, self.residual_bandwidth_)
        outside = distance > self.support_radius
        if (outside & ~high.any(axis=1)).any():
            warnings.warn(ExtrapolationWarning(
                f"{int((outside & ~high.any(axis=1)).sum())} of {len(X)} inputs lie inside the per-feature training "
                f"ranges but farther than {self.support_radius} standard deviations from every training kernel (a "
                "combination of sizes never measured); they were predicted from the nearest training kernel scaled "
                "by the work ratio. Profile similar workloads and refit."), stacklevel=2)
        # The nearest measured kernel scaled by the work ratio: what a saturated device would take.
        anchor = self.anchors_[nearest]
        j = self.work_feature
        ratio = np.clip((X[:, j] + 1.0) / (anchor[:, j] + 1.0), 1.0 / self.extrapolation_limit,
                        self.extrapolation_limit)
        log_anchor = self._log_poly(anchor) + self.anchor_residuals_[nearest]   # its (geometric mean) log label
        log_neighbour = log_anchor + np.log(ratio)
        above = np.flatnonzero(high.any(axis=1) | outside)
        log_t[above] = log_neighbour[above] - self.anchor_residuals_[nearest[above]]
        log_t += correction
        # Trust region: never depart more than max_departure x from the work-scaled nearest measured kernel.
        span = np.log(self.max_departure)
        log_t = np.clip(log_t, log_neighbour - span, log_neighbour + span)
        # A training kernel's twin (the same features) takes that kernel's measured (geometric mean) label.
        twin = distance <= _TWIN_DISTANCE
        log_t[twin] = log_anchor[twin]
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
            for key in ("degrees", "alphas", "feature_names", "residual_bandwidths", "residual_columns"):
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


def _chunked_sq_distances(z_query: np.ndarray, z_anchor: np.ndarray, rows: int = 256):
    """(first row, squared distances of up to ``rows`` queries to every anchor), chunk by chunk (bounded memory)."""
    for start in range(0, len(z_query), rows):
        yield start, ((z_query[start:start + rows, None, :] - z_anchor[None, :, :]) ** 2).sum(axis=2)
