"""Honest error evaluation of latency predictors: metrics, leave-one-model/family-out, noise floor, baselines.

A dataset maps a model name to :class:`ModelRecord` (or a tuple ``(kernel nodes, measured kernel latencies µs,
measured whole-model latency µs, family)``). For each split (leave-one-model-out, leave-one-family-out) every
method is fitted on the kernels and whole-model latencies of the training models only, then predicts the
held-out models' kernels and whole-model latency (sum of kernel predictions + the fitted in-model terms of
:mod:`predictors.context`: per-kernel overhead, cold weights, spilled activations). The
methods are the polynomial :class:`~predictors.device_predictor.DevicePredictor` and the baselines of
:mod:`predictors.fitting.baselines`, all on the same split. The report states plainly where the polynomial loses.

Metrics (APE = |predicted - measured| / measured): MAPE, median APE, ±10% accuracy (share with APE <= 0.10),
signed bias (mean of (predicted - measured) / measured; > 0 = over-prediction), max APE, Spearman rank
correlation per kernel kind.
"""
from __future__ import annotations

import functools
import logging
import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from scipy.stats import spearmanr

from hetpart.errors import PredictorError
from hetpart.graph import OpNode
from predictors.fitting.baselines import BASELINES
from predictors.features import kernel_kind, workload_key
from predictors.context import fit_context_terms
from predictors.device_predictor import DevicePredictor

logger = logging.getLogger(__name__)

Progress = Callable[[str, int, int], None]
SIZE_BUCKETS = (("lt_10us", 0.0, 10.0), ("10_to_100us", 10.0, 100.0), ("ge_100us", 100.0, math.inf))
GOALS = {  # accuracy goals, checked on the polynomial under leave-one-model-out
    "kernel_ge_100us_mape": ("kernel", "ge_100us", "mape", 0.08, "max"),
    "kernel_ge_100us_within_10pct": ("kernel", "ge_100us", "within_10pct", 0.90, "min"),
    "kernel_10_to_100us_mape": ("kernel", "10_to_100us", "mape", 0.15, "max"),
    "model_mape": ("model", None, "mape", 0.07, "max"),
    "model_worst_ape": ("model", None, "max_ape", 0.20, "max"),
}


@dataclass(frozen=True)
class ModelRecord:
    nodes: tuple[OpNode, ...]
    kernel_latencies_us: tuple[float, ...]
    model_latency_us: float
    family: str


def as_records(dataset: Mapping[str, Any]) -> dict[str, ModelRecord]:
    out = {}
    for name, rec in dataset.items():
        if not isinstance(rec, ModelRecord):
            nodes, lat, total, family = rec
            rec = ModelRecord(tuple(nodes), tuple(float(v) for v in lat), float(total), str(family))
        if len(rec.nodes) != len(rec.kernel_latencies_us) or not rec.nodes:
            raise PredictorError(f"model {name!r}: needs >= 1 kernel and one latency per kernel; found "
                                 f"{len(rec.nodes)} kernels, {len(rec.kernel_latencies_us)} latencies")
        out[name] = rec
    return out


# ---------------------------------------------------------------------- metrics
def error_metrics(measured: Sequence[float], predicted: Sequence[float]) -> dict[str, Any]:
    m, p = np.asarray(measured, dtype=float), np.asarray(predicted, dtype=float)
    if m.shape != p.shape or np.any(m <= 0):
        raise PredictorError(f"measured and predicted must pair up and measured must be > 0; shapes {m.shape}, "
                             f"{p.shape}")
    if m.size == 0:
        return {"n": 0, "mape": None, "median_ape": None, "within_10pct": None, "signed_bias": None, "max_ape": None}
    rel = (p - m) / m
    ape = np.abs(rel)
    return {"n": int(m.size), "mape": float(ape.mean()), "median_ape": float(np.median(ape)),
            "within_10pct": float(np.mean(ape <= 0.10)), "signed_bias": float(rel.mean()), "max_ape": float(ape.max())}


def spearman(measured: Sequence[float], predicted: Sequence[float]) -> float | None:
    """Spearman rank correlation, or None when undefined (< 3 points or a constant side)."""
    m, p = np.asarray(measured, dtype=float), np.asarray(predicted, dtype=float)
    if m.size < 3 or np.ptp(m) == 0 or np.ptp(p) == 0:
        return None
    return float(spearmanr(m, p).statistic)


def kernel_report(measured: Sequence[float], predicted: Sequence[float], kinds: Sequence[str]) -> dict[str, Any]:
    """Overall metrics, metrics per measured-latency bucket, and metrics + Spearman per kernel kind."""
    m, p, k = np.asarray(measured, dtype=float), np.asarray(predicted, dtype=float), np.asarray(kinds)
    out: dict[str, Any] = {"all": error_metrics(m, p), "spearman": spearman(m, p)}
    for bucket, lo, hi in SIZE_BUCKETS:
        sel = (m >= lo) & (m < hi)
        out[bucket] = error_metrics(m[sel], p[sel])
    out["by_kind"] = {kind: {**error_metrics(m[k == kind], p[k == kind]),
                             "spearman": spearman(m[k == kind], p[k == kind])} for kind in sorted(set(k.tolist()))}
    return out


def noise_floor(repeats: Sequence[Sequence[float]]) -> dict[str, Any]:
    """Test-retest error of the measurements themselves: each repeat against the median of the other repeats."""
    measured, predicted = [], []
    for values in repeats:
        v = np.asarray(values, dtype=float)
        if v.size < 2:
            raise PredictorError(f"the noise floor needs >= 2 repeats per kernel; found {v.size}")
        for r in range(v.size):
            measured.append(float(np.median(np.delete(v, r))))
            predicted.append(float(v[r]))
    return {"n_kernels": len(repeats), **error_metrics(measured, predicted)}


def model_level_floor(records: Mapping[str, ModelRecord], group_of: Mapping[str, str],
                      cache_bytes: int | None = None, core_cache: int | None = None) -> dict[str, Any]:
    """Whole-model error that remains with *perfect* kernel predictions: each held-out model's measured kernel
    labels plus in-model terms fitted on the other groups, against its measured latency. No kernel predictor can
    do better than this on the same split; it measures how well isolated kernels compose into a model."""
    labels = {}
    for rec in records.values():
        labels.update({workload_key(n): y for n, y in zip(rec.nodes, rec.kernel_latencies_us)})

    class _Exact:
        def predict(self, nodes: Sequence[OpNode]) -> np.ndarray:
            return np.array([labels[workload_key(n)] for n in nodes])

    measured, predicted, per_model = [], [], {}
    for held in sorted(set(group_of.values())):
        train = [(records[n].nodes, records[n].model_latency_us) for n in records if group_of[n] != held]
        context = fit_context_terms(_Exact(), train, cache_bytes, core_cache)
        for name in (n for n in records if group_of[n] == held):
            rec = records[name]
            value = float(np.sum(rec.kernel_latencies_us) + context.extra_us(rec.nodes).sum())
            measured.append(rec.model_latency_us)
            predicted.append(value)
            per_model[name] = value / rec.model_latency_us - 1.0
    return {**error_metrics(measured, predicted), "signed_error_per_model": per_model}


# ---------------------------------------------------------------------- cross-validation
def default_methods(target: Mapping[str, Any] | None = None,
                    core_cache_bytes: int | None = None) -> dict[str, Callable[[], Any]]:
    """Name -> factory of an unfitted predictor with fit(nodes, latencies_us) / predict(nodes).

    ``target``: the compilation target the kernels were measured for (the polynomial's schedule-derived features
    depend on its SIMD width); ``core_cache_bytes``: the combined L2 of the cores they ran on (None: this host's)."""
    return {"polynomial": functools.partial(DevicePredictor, target=target, core_cache_bytes=core_cache_bytes),
            **BASELINES}


def cross_validate(records: Mapping[str, ModelRecord], group_of: Mapping[str, str],
                   methods: Mapping[str, Callable[[], Any]], progress: Progress | None = None,
                   split_name: str = "split", cache_bytes: int | None = None,
                   core_cache: int | None = None) -> dict[str, Any]:
    """Hold out each group in turn (all models sharing a ``group_of`` value); train every method on the rest.
    ``cache_bytes``: the last-level cache bound of the database's host (:mod:`predictors.profiling.cache_probe`;
    None: this host's sysfs size); each fold's in-model terms fit the share of it a model keeps
    (:func:`predictors.context.fit_context_terms`). ``core_cache``: the L2 of the cores the kernels ran on (None: as
    many cores as this process's ``TVM_NUM_THREADS``).

    Per method, ``_points`` holds the held-out kernel instances: (measured, predicted, kind, (model, index of the
    kernel in the model's record)); callers pop it before serialising."""
    groups = sorted(set(group_of.values()))
    if len(groups) < 2:
        raise PredictorError(f"{split_name}: needs >= 2 groups to hold one out; found {groups}")
    acc = {name: {"m": [], "p": [], "kind": [], "where": [], "models": {}, "fit_s": [], "warnings": {}}
           for name in methods}
    for done, held in enumerate(groups):
        test = [n for n in records if group_of[n] == held]
        train = [n for n in records if group_of[n] != held]
        nodes = [node for n in train for node in records[n].nodes]
        lat = [v for n in train for v in records[n].kernel_latencies_us]
        for name, factory in methods.items():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                start = time.perf_counter()
                predictor = factory().fit(nodes, lat)
                acc[name]["fit_s"].append(time.perf_counter() - start)
                context = fit_context_terms(predictor, [(records[n].nodes, records[n].model_latency_us)
                                                        for n in train], cache_bytes, core_cache)
                preds = {n: np.asarray(predictor.predict(records[n].nodes), dtype=float) for n in test}
            for w in caught:     # counted, not repeated: extrapolation is expected when a model is held out
                key = w.category.__name__
                acc[name]["warnings"][key] = acc[name]["warnings"].get(key, 0) + 1
            for n in test:
                rec, pred = records[n], preds[n]
                acc[name]["m"].extend(rec.kernel_latencies_us)
                acc[name]["p"].extend(pred.tolist())
                acc[name]["kind"].extend(kernel_kind(node) for node in rec.nodes)
                acc[name]["where"].extend((n, i) for i in range(len(rec.nodes)))
                acc[name]["models"][n] = {"measured_us": rec.model_latency_us,
                                          "predicted_us": float(pred.sum() + context.extra_us(rec.nodes).sum()),
                                          "held_out_group": held, "context": context.to_dict()}
        if progress is not None:
            progress(split_name, done + 1, len(groups))
        logger.info("%s: held out %s (%d/%d)", split_name, held, done + 1, len(groups))
    result = {}
    for name, a in acc.items():
        models = a["models"]
        mm = [v["measured_us"] for v in models.values()]
        pm = [v["predicted_us"] for v in models.values()]
        for v in models.values():
            v["ape"] = abs(v["predicted_us"] - v["measured_us"]) / v["measured_us"]
        result[name] = {"kernel": kernel_report(a["m"], a["p"], a["kind"]),
                        "model": {**error_metrics(mm, pm), "per_model": models},
                        "fit_seconds": {"mean": float(np.mean(a["fit_s"])), "max": float(np.max(a["fit_s"])),
                                        "n_fits": len(a["fit_s"])},
                        "warnings": dict(a["warnings"]),
                        "_points": (a["m"], a["p"], a["kind"], a["where"])}
    return result


def honest_comparison(split: Mapping[str, Any], split_name: str, reference: str = "polynomial") -> list[str]:
    """One sentence per (metric, method) where ``reference`` is worse than a baseline, and a summary."""
    checks = (("kernel MAPE", ("kernel", "all", "mape"), min), ("kernel ±10% accuracy",
              ("kernel", "all", "within_10pct"), max), ("model MAPE", ("model", "mape"), min))
    lines = []
    for label, path, better in checks:
        def get(method: str) -> float | None:
            node: Any = split[method]
            for key in path:
                node = node[key]
            return node
        ref = get(reference)
        for method in split:
            other = get(method)
            if method == reference or ref is None or other is None:
                continue
            if better(ref, other) == other and other != ref:
                lines.append(f"{split_name}: {reference} LOSES to {method} on {label} "
                             f"({ref:.4g} vs {other:.4g})")
        values = {m: get(m) for m in split if get(m) is not None}
        if values:
            winner = better(values, key=values.get)
            lines.append(f"{split_name}: best {label} = {winner} ({values[winner]:.4g})")
    return lines


def check_goals(split: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for goal, (section, bucket, metric, target, sense) in GOALS.items():
        node = split[section] if bucket is None else split[section][bucket]
        value = node[metric]
        met = None if value is None else (value <= target if sense == "max" else value >= target)
        out[goal] = {"goal": target, "sense": f"{sense} {target}", "measured": value, "met": met}
    return out


def evaluate(dataset: Mapping[str, Any], *, repeats: Sequence[Sequence[float]] | None = None,
             methods: Mapping[str, Callable[[], Any]] | None = None, progress: Progress | None = None,
             plot_path: str | Path | None = None, target: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Full report (JSON-serialisable): per split and method kernel/model metrics, goals, noise floor, verdicts.

    ``target``: the compilation target the kernels were measured for (see :func:`default_methods`)."""
    records = as_records(dataset)
    methods = dict(methods or default_methods(target))
    if "polynomial" not in methods:
        raise PredictorError("evaluate() compares against the 'polynomial' method; include it in methods")
    splits = {"leave_one_model_out": {n: n for n in records},
              "leave_one_family_out": {n: r.family for n, r in records.items()}}
    report: dict[str, Any] = {"n_models": len(records), "n_kernels": sum(len(r.nodes) for r in records.values()),
                              "families": sorted({r.family for r in records.values()}), "methods": sorted(methods),
                              "splits": {}, "verdicts": []}
    for split_name, group_of in splits.items():
        if len(set(group_of.values())) < 2:
            report["splits"][split_name] = None
            report["verdicts"].append(f"{split_name}: skipped (fewer than 2 groups)")
            continue
        split = cross_validate(records, group_of, methods, progress, split_name)
        points = {name: res.pop("_points") for name, res in split.items()}
        report["splits"][split_name] = split
        report["verdicts"].extend(honest_comparison(split, split_name))
        if split_name == "leave_one_model_out":
            report["goals_polynomial_lomo"] = check_goals(split["polynomial"])
            if plot_path is not None:
                m, p, k, _ = points["polynomial"]
                report["plot"] = str(plot_predicted_vs_measured(m, p, k, plot_path,
                                                                 title="polynomial, leave-one-model-out"))
    if repeats is not None:
        report["noise_floor"] = noise_floor(repeats)
    return _json_clean(report)


def _json_clean(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _json_clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_clean(v) for v in value]
    if isinstance(value, (np.floating, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


# ---------------------------------------------------------------------- plot
def plot_predicted_vs_measured(measured: Sequence[float], predicted: Sequence[float], kinds: Sequence[str],
                               path: str | Path, title: str = "") -> Path:
    """Log-log scatter of predicted vs measured kernel latency, coloured by kind, with y=x and ±10% bands."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m, p, k = np.asarray(measured, dtype=float), np.asarray(predicted, dtype=float), np.asarray(kinds)
    fig, ax = plt.subplots(figsize=(6, 6))
    try:
        for kind in sorted(set(k.tolist())):
            sel = k == kind
            ax.scatter(m[sel], p[sel], s=8, alpha=0.6, label=f"{kind} ({int(sel.sum())})")
        lo = float(min(m.min(), p.min())) * 0.8 if m.size else 1.0
        hi = float(max(m.max(), p.max())) * 1.2 if m.size else 10.0
        line = np.array([lo, hi])
        ax.plot(line, line, "k-", lw=1, label="y = x")
        ax.fill_between(line, line * 0.9, line * 1.1, color="grey", alpha=0.2, label="±10%")
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured latency (µs)",
               ylabel="predicted latency (µs)", title=title or "predicted vs measured")
        ax.legend(fontsize=7, loc="upper left")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)
    return Path(path)
