"""Baseline kernel-latency predictors the polynomial model is compared against (same fit/predict interface).

* ``flops_constant``: per kernel kind, latency = c × work, with work = FLOPs (bytes for kinds whose samples
  all have 0 FLOPs, e.g. reshapes); c = median(latency / work) (robust, relative-error friendly).
* ``calibrated_roofline``: per kind, latency = o + max(FLOPs / P, bytes / B) with an effective peak P, bandwidth
  B and overhead o fitted by least squares on log latency.
* ``random_forest``: scikit-learn RandomForestRegressor on all log features + one-hot kind, target log latency.
* ``lookup``: the median measured latency of the same workload (exact :func:`workload_key`), else of the nearest
  training kernel (same kind when there is one) in standardised log(FLOPs, bytes, output elements) space.

Kinds unseen in training fall back to a model fitted on all kinds.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
from scipy.optimize import least_squares
from sklearn.ensemble import RandomForestRegressor

from hetpart.errors import PredictorError
from hetpart.graph import OpNode
from predictors.features import FEATURE_SCHEMA, KINDS, feature_vector, kernel_kind, workload_key

_ALL = "__all__"


def _prepare(nodes: Sequence[OpNode], latencies_us: Sequence[float]) -> tuple[list[OpNode], np.ndarray, np.ndarray]:
    nodes, y = list(nodes), np.asarray(latencies_us, dtype=float)
    if not nodes or len(nodes) != len(y) or np.any(y <= 0):
        raise PredictorError(f"baseline fit needs >= 1 kernel with one latency > 0 each; found {len(nodes)} "
                             f"kernels, {len(y)} latencies")
    return nodes, y, np.array([kernel_kind(n) for n in nodes])


def _work(nodes: Sequence[OpNode]) -> tuple[np.ndarray, np.ndarray]:
    flops = np.array([float(n.flops) for n in nodes])
    nbytes = np.array([float(n.bytes_read + n.bytes_written) for n in nodes])
    return flops, nbytes


class FlopsConstantBaseline:
    source = "predicted"

    def fit(self, nodes: Sequence[OpNode], latencies_us: Sequence[float]) -> "FlopsConstantBaseline":
        nodes, y, kinds = _prepare(nodes, latencies_us)
        flops, nbytes = _work(nodes)
        self.constants_: dict[str, tuple[str, float]] = {}
        for kind in [*sorted(set(kinds)), _ALL]:
            sel = np.ones(len(y), bool) if kind == _ALL else kinds == kind
            use_flops = kind != _ALL and bool(np.all(flops[sel] > 0))
            work = flops[sel] if use_flops else np.maximum(nbytes[sel], 1.0)
            self.constants_[kind] = ("flops" if use_flops else "bytes", float(np.median(y[sel] / work)))
        return self

    def predict(self, nodes: Sequence[OpNode]) -> np.ndarray:
        flops, nbytes = _work(nodes)
        out = np.empty(len(nodes))
        for i, node in enumerate(nodes):
            basis, c = self.constants_.get(kernel_kind(node), self.constants_[_ALL])
            out[i] = c * (max(flops[i], 1.0) if basis == "flops" else max(nbytes[i], 1.0))
        return out


class CalibratedRooflineBaseline:
    source = "predicted"

    def fit(self, nodes: Sequence[OpNode], latencies_us: Sequence[float]) -> "CalibratedRooflineBaseline":
        nodes, y, kinds = _prepare(nodes, latencies_us)
        flops, nbytes = _work(nodes)
        self.params_: dict[str, tuple[float, float, float]] = {}
        for kind in [*sorted(set(kinds)), _ALL]:
            sel = np.ones(len(y), bool) if kind == _ALL else kinds == kind
            if sel.sum() >= 3:
                self.params_[kind] = self._fit_one(flops[sel], nbytes[sel], y[sel])
        return self

    @staticmethod
    def _fit_one(flops: np.ndarray, nbytes: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
        """(log effective FLOP/µs, log effective bytes/µs, log overhead µs)."""
        f, b = np.maximum(flops, 1.0), np.maximum(nbytes, 1.0)
        x0 = np.log([np.median(f / y) * 2, np.median(b / y) * 2, max(float(y.min()) / 2, 1e-3)])

        def residual(x: np.ndarray) -> np.ndarray:
            return np.log(np.exp(x[2]) + np.maximum(flops / np.exp(x[0]), nbytes / np.exp(x[1]))) - np.log(y)
        return tuple(float(v) for v in least_squares(residual, x0, method="trf").x)

    def predict(self, nodes: Sequence[OpNode]) -> np.ndarray:
        flops, nbytes = _work(nodes)
        out = np.empty(len(nodes))
        for i, node in enumerate(nodes):
            lp, lb, lo = self.params_.get(kernel_kind(node), self.params_[_ALL])
            out[i] = np.exp(lo) + max(flops[i] / np.exp(lp), nbytes[i] / np.exp(lb))
        return out


def _rf_features(nodes: Sequence[OpNode]) -> np.ndarray:
    rows = []
    for node in nodes:
        f = feature_vector(node)
        kind = kernel_kind(node)
        rows.append([f[k] if k.startswith("log_") else np.log1p(f[k]) for k in sorted(FEATURE_SCHEMA)]
                    + [1.0 if kind == k else 0.0 for k in KINDS])
    return np.array(rows, dtype=float)


class RandomForestBaseline:
    source = "predicted"

    def __init__(self, n_estimators: int = 100, random_state: int = 0):
        self.n_estimators, self.random_state = n_estimators, random_state

    def fit(self, nodes: Sequence[OpNode], latencies_us: Sequence[float]) -> "RandomForestBaseline":
        nodes, y, _ = _prepare(nodes, latencies_us)
        self.forest_ = RandomForestRegressor(n_estimators=self.n_estimators, min_samples_leaf=2, n_jobs=1,
                                             random_state=self.random_state).fit(_rf_features(nodes), np.log(y))
        return self

    def predict(self, nodes: Sequence[OpNode]) -> np.ndarray:
        return np.exp(self.forest_.predict(_rf_features(nodes)))


class LookupBaseline:
    source = "predicted"

    def fit(self, nodes: Sequence[OpNode], latencies_us: Sequence[float]) -> "LookupBaseline":
        nodes, y, kinds = _prepare(nodes, latencies_us)
        by_key: dict[str, list[float]] = {}
        for node, value in zip(nodes, y):
            by_key.setdefault(workload_key(node), []).append(float(value))
        self.exact_ = {k: float(np.median(v)) for k, v in by_key.items()}
        self.points_ = self._coords(nodes)
        self.mean_, self.scale_ = self.points_.mean(axis=0), np.maximum(self.points_.std(axis=0), 1e-9)
        self.latency_, self.kinds_ = y, kinds
        return self

    @staticmethod
    def _coords(nodes: Sequence[OpNode]) -> np.ndarray:
        return np.array([[np.log1p(n.flops), np.log1p(n.bytes_read + n.bytes_written),
                          np.log1p(float(np.prod(n.output_shapes[0])) if n.output_shapes else 0.0)]
                         for n in nodes], dtype=float).reshape(len(nodes), 3)

    def predict(self, nodes: Sequence[OpNode]) -> np.ndarray:
        coords = (self._coords(nodes) - self.mean_) / self.scale_
        train = (self.points_ - self.mean_) / self.scale_
        out = np.empty(len(nodes))
        for i, node in enumerate(nodes):
            key = workload_key(node)
            if key in self.exact_:
                out[i] = self.exact_[key]
                continue
            same = self.kinds_ == kernel_kind(node)
            pool = np.flatnonzero(same) if same.any() else np.arange(len(train))
            j = pool[np.argmin(((train[pool] - coords[i]) ** 2).sum(axis=1))]
            out[i] = self.latency_[j]
        return out


BASELINES: dict[str, Callable[[], object]] = {
    "flops_constant": FlopsConstantBaseline,
    "calibrated_roofline": CalibratedRooflineBaseline,
    "random_forest": RandomForestBaseline,
    "lookup": LookupBaseline,
}
