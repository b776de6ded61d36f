"""From a profile database to a fitted predictor (``hetpart fit``) and to an error report (``hetpart evaluate``).

Labels: each ``ok`` kernel row's median, put on one scale with the canary of its timing window
(:func:`predictors.store.normalise_latency`, reference = the median canary of the rows used). Rows whose
features were not taken from the kernel graph (``tags.source == "tir"``: the kernel <-> node alignment failed for
their model, see :mod:`predictors.zoo_profile`) are left out and counted, because prediction-time features
never look like them. Rows superseded by a newer measurement of the same operator as another kernel (the
compiler changed since, :func:`superseded_keys`) are left out too, and so are synthetic rows that no current
synthetic spec makes (an older sampling, :func:`_orphan_keys`).

Model-level data: every aligned model variant with a measured whole-model latency and an ``ok`` label for each
of its kernels becomes an :class:`predictors.evaluate.ModelRecord` (nodes, per-node labels, normalised model
latency, family). Kernel-graph nodes that run no kernel in deployment (host-side shape computations, see
:func:`predictors.zoo_profile.align_calls`) have no label and are not part of the record. Variants with a kernel
that is missing or only ``rejected_noisy`` are listed as excluded.

Splits (:func:`evaluate_db`): leave-one-model-out trains on the other variants' kernels **plus** the synthetic
kernels; leave-one-family-out trains on the other families' kernels only (synthetic kernels are variations
around every family's kernels, so they would leak the held-out family).
"""
from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from hetpart.errors import PredictorError
from hetpart.graph import OpNode
from predictors import evaluate as ev
from predictors.cache_probe import cache_report_fields, cache_sizes_for_db
from predictors.context import core_cache_bytes
from predictors.model_db import ModelDatabase
from predictors.device_predictor import DevicePredictor
from predictors.noise import miss_analysis, noise_floor_of
from predictors.store import Measurement, ProfileStore, feature_identity, normalise_latency

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainingData:
    device: str
    target: str
    tvm_version: str
    reference_canary_us: float
    kernels: dict[str, tuple[OpNode, float]]        # key hash -> (features, normalised label µs), ok rows only
    raw: dict[str, Measurement]                     # key hash -> row (any status)
    excluded_tir_features: int
    records: dict[str, ev.ModelRecord]              # complete model variants
    model_keys: dict[str, tuple[str, ...]]          # variant -> key hash per node
    excluded_models: dict[str, str]                 # variant -> why it is not a record
    retests: list[tuple[str, float, float, str]]    # (key hash, median µs, canary µs, session) of re-measurements
    excluded_orphan_rows: int = 0                   # synthetic rows no current spec makes (older samplings)
    num_threads: int = 0                            # TVM threads every row was measured with

    @property
    def zoo_keys(self) -> set[str]:
        return {k for keys in self.model_keys.values() for k in keys}

    def synthetic(self) -> tuple[list[OpNode], list[float]]:
        """Kernels measured but not part of any zoo variant (the synthetic variations)."""
        keys = sorted(set(self.kernels) - self.zoo_keys)
        return [self.kernels[k][0] for k in keys], [self.kernels[k][1] for k in keys]


def _pick_target(rows: Sequence[Measurement], device: str) -> tuple[str, str]:
    combos = Counter((m.target, m.tvm_version) for m in rows)
    if not combos:
        raise PredictorError(f"the profile database has no measurements for device {device!r}; run "
                             f"`hetpart profile --device {device}` first")
    (target, version), n = combos.most_common(1)[0]
    if len(combos) > 1:
        logger.warning("the database holds %d (target, TVM version) combinations for %s; using the one with the "
                       "most rows (%d, TVM %s)", len(combos), device, n, version)
    return target, version


def load_training_data(db_path: str | Path, device: str = "cpu") -> TrainingData:
    """Read kernels, model variants and retests of ``device`` (see the module docstring)."""
    from predictors.zoo_profile import current_synthetic_keys     # imported here: it loads TVM

    with ProfileStore(db_path) as store:
        all_rows = store.measurements(device=device, status=None)
    target, version = _pick_target(all_rows, device)
    rows = [m for m in all_rows if (m.target, m.tvm_version) == (target, version)]
    ok = [m for m in rows if m.status == "ok" and m.canary_us]
    threads = sorted({m.num_threads for m in rows})
    if len(threads) > 1:
        raise PredictorError(f"{db_path} mixes {device} rows measured with {threads} TVM threads; labels of "
                             "different thread counts cannot be fitted together. Fix: profile into a new database "
                             "with one TVM_NUM_THREADS.")
    if not ok:
        raise PredictorError(f"no 'ok' kernel measurements for {device!r} in {db_path}; profile again when the "
                             "machine is quieter (every row was rejected as noisy or failed)")
    reference = float(np.median([m.canary_us for m in ok]))
    with ModelDatabase(db_path) as models:
        variants = models.variants(device, target, version)
        retests = [(r.key_hash, r.median_us, r.canary_us, r.session_id)
                   for r in models.retests(device, target, version)]
        current_synthetic = current_synthetic_keys(models, device, target, version)
    # rows of any status: a newer kernel for the operator retires the old one even before it is measured ok
    superseded = superseded_keys(rows, keep={k for v in variants for k in v.node_keys})
    if superseded:
        logger.info("%d kernel rows measure an operator that a newer row measures as a different kernel (the "
                    "compiler changed since); only the newer rows are used", len(superseded))
    kernels, excluded = {}, 0
    for m in ok:
        if m.key_hash in superseded:
            continue
        if m.features.get("tags", {}).get("source") == "tir":
            excluded += 1
            continue
        kernels[m.key_hash] = (OpNode.from_dict(m.features), m.normalised_us(reference))
    if excluded:
        logger.warning("%d kernel rows carry TIR-derived features (alignment fallback) and are not used", excluded)
    records, model_keys, why_not = {}, {}, {}
    raw = {m.key_hash: m for m in rows}
    for v in variants:
        if not v.aligned:
            why_not[v.name] = "kernels and kernel-graph nodes did not align"
            continue
        keyed = [(node, k) for node, k in zip(v.graph.nodes, v.node_keys) if k]   # "" = no deployment kernel
        model_keys[v.name] = tuple(k for _, k in keyed)
        missing = [k for _, k in keyed if k not in kernels]
        if missing:
            statuses = Counter(raw[k].status if k in raw else "not measured" for k in missing)
            why_not[v.name] = f"{len(missing)} of {len(keyed)} kernels lack an ok label ({dict(statuses)})"
        elif v.model_median_us is None or not v.canary_us:
            why_not[v.name] = "whole-model latency not measured"
        else:
            nodes = tuple(node for node, _ in keyed)
            labels = tuple(kernels[k][1] for _, k in keyed)
            total = normalise_latency(v.model_median_us, v.canary_us, reference)
            records[v.name] = ev.ModelRecord(nodes, labels, total, v.family)
    orphans = _orphan_keys(kernels, {k for v in variants for k in v.node_keys}, current_synthetic)
    for key in orphans:
        del kernels[key]
    return TrainingData(device, target, version, reference, kernels, raw, excluded, records, model_keys, why_not,
                        retests, len(orphans), threads[0] if threads else 0)


def _orphan_keys(kernels: Mapping[str, Any], zoo_keys: set[str], current: set[str] | None) -> set[str]:
    """Synthetic rows that no current synthetic spec makes: the sampling moved on (its seeds are the zoo's
    kernels, which change with the compiler) and such rows describe kernels nothing asks about any more -- some
    built by older CPU rules (27-wide 1x1 convs at 5-7x their neighbours' time). Kept only when no current spec
    recorded its keys yet (a database not profiled since; ``current`` is None)."""
    if current is None:
        return set()
    orphans = {k for k in kernels if k not in zoo_keys and k not in current}
    if orphans:
        logger.info("%d synthetic kernel rows are made by no current synthetic spec (an older sampling); they are "
                    "not used", len(orphans))
    return orphans


def superseded_keys(rows: Sequence[Measurement], keep: set[str] = frozenset()) -> set[str]:
    """Key hashes of rows whose operator a *newer* row (of any status) measures as a different kernel.

    Equal :func:`~predictors.store.feature_identity` under a different key means the compiler now builds
    another kernel for that operator (e.g. a changed CPU rule, see ``tvm_passes.schedules.RULES_VERSION``);
    only the newest row describes what deployment runs, even while it is still ``rejected_noisy``. Rows in
    ``keep`` (listed by a stored model variant) are never superseded.
    """
    newest: dict[str, Measurement] = {}
    for m in rows:
        identity = feature_identity(m.features)
        if identity not in newest or m.timestamp_s > newest[identity].timestamp_s:
            newest[identity] = m
    return {m.key_hash for m in rows
            if m.key_hash not in keep and newest[feature_identity(m.features)].key_hash != m.key_hash}


# ---------------------------------------------------------------------------------------------- fit
def training_set(data: TrainingData) -> tuple[list[OpNode], list[float]]:
    """What a predictor is fitted on: every kernel *instance* of the model records (a kernel a model calls 12
    times weighs 12x, as in the cross-validation of :func:`evaluate_db`) plus, once each, the kernels no record
    calls (synthetic variations, kernels of variants without a whole-model timing)."""
    nodes = [node for r in data.records.values() for node in r.nodes]
    labels = [float(v) for r in data.records.values() for v in r.kernel_latencies_us]
    in_records = {k for name in data.records for k in data.model_keys[name]}
    rest = sorted(set(data.kernels) - in_records)
    return nodes + [data.kernels[k][0] for k in rest], labels + [data.kernels[k][1] for k in rest]


def measured_core_cache(data: TrainingData) -> int:
    """The L2 of the cores the database's kernels ran on (its recorded TVM thread count), so that fitting and
    evaluating give the same in-model terms whatever ``TVM_NUM_THREADS`` the fitting process has."""
    return core_cache_bytes(data.num_threads or None)


def fit_from_db(db_path: str | Path, device: str = "cpu",
                output: str | Path | None = None) -> tuple[DevicePredictor, dict[str, Any]]:
    """Fit a :class:`DevicePredictor` on every usable kernel and its in-model terms on the model records."""
    start = time.perf_counter()
    data = load_training_data(db_path, device)
    keys = sorted(data.kernels)
    nodes, labels = training_set(data)
    predictor = DevicePredictor(device=device, target=json.loads(data.target), tvm_version=data.tvm_version,
                                num_threads=data.num_threads or None, core_cache_bytes=measured_core_cache(data))
    predictor.fit(nodes, labels)
    sizes = cache_sizes_for_db(db_path, json.loads(data.target).get("mcpu"))
    cache = None if sizes is None else sizes.bound_bytes
    if data.records:
        predictor.fit_context([(r.nodes, r.model_latency_us) for r in data.records.values()], cache_bytes=cache,
                              core_cache=measured_core_cache(data))
    else:
        logger.warning("no complete model variant in %s: the in-model terms stay 0", db_path)
    with ModelDatabase(db_path) as models:
        runs = models.profile_runs(device)
        pipelines = sorted({r.pipeline_version for r in models.variants(device, data.target, data.tvm_version)
                            if r.pipeline_version})
    info = {"fit_seconds": time.perf_counter() - start, "n_kernels": len(keys), "n_training_rows": len(nodes),
            "pipeline_versions": pipelines,     # extractor + CPU rules that compiled the kernels (zoo_profile)
            "profile_runs": len(runs), "profile_seconds_total": sum(r["elapsed_s"] for r in runs),
            "n_synthetic_kernels": len(set(keys) - data.zoo_keys), "n_model_records": len(data.records),
            "excluded_tir_feature_rows": data.excluded_tir_features, "canary_reference_us": data.reference_canary_us,
            # the probe's and sysfs's sizes and the bound the fitted share (in the context terms) is of
            **cache_report_fields(sizes),
            "excluded_orphan_rows": data.excluded_orphan_rows, "profile_db": str(db_path),
            "excluded_models": data.excluded_models}
    predictor.fit_info.update({"training": info})
    if output is not None:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        predictor.save(output)
    return predictor, info


# ---------------------------------------------------------------------------------------------- evaluate
class WithExtraTraining:
    """Wraps a predictor factory so that every fit also sees a fixed set of extra kernels (the synthetic ones)."""

    def __init__(self, factory: Callable[[], Any], nodes: Sequence[OpNode], latencies_us: Sequence[float]):
        self.inner, self.extra_nodes, self.extra_latencies = factory(), list(nodes), list(latencies_us)

    def fit(self, nodes: Sequence[OpNode], latencies_us: Sequence[float]) -> "WithExtraTraining":
        self.inner.fit(list(nodes) + self.extra_nodes, list(latencies_us) + self.extra_latencies)
        return self

    def predict(self, nodes: Sequence[OpNode]) -> np.ndarray:
        return self.inner.predict(nodes)


def evaluate_db(db_path: str | Path, device: str = "cpu", out_dir: str | Path | None = None,
                progress: Callable[[str, int, int, str], None] | None = None,
                methods: Mapping[str, Callable[[], Any]] | None = None) -> dict[str, Any]:
    """Leave-one-model-out and leave-one-family-out report; writes predictors.json + the scatter PNG."""
    data = load_training_data(db_path, device)
    if len(data.records) < 2:
        raise PredictorError(f"evaluation needs >= 2 complete model variants; found {len(data.records)} "
                             f"(excluded: {data.excluded_models}). Profile with a larger budget.")
    methods = dict(methods or ev.default_methods(json.loads(data.target), measured_core_cache(data)))
    syn_nodes, syn_lat = data.synthetic()
    with_syn = {name: (lambda f=f: WithExtraTraining(f, syn_nodes, syn_lat)) for name, f in methods.items()}
    splits = {"leave_one_model_out": ({n: n for n in data.records}, with_syn if syn_nodes else methods),
              "leave_one_family_out": ({n: r.family for n, r in data.records.items()}, methods)}
    out_dir = Path(out_dir) if out_dir is not None else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "device": device, "target": json.loads(data.target), "tvm_version": data.tvm_version,
        "num_threads": data.num_threads, "profile_db": str(db_path), "n_model_records": len(data.records),
        "models": sorted(data.records),
        "families": sorted({r.family for r in data.records.values()}),
        "n_kernel_rows_ok": len(data.kernels), "n_synthetic_kernels": len(syn_nodes),
        "n_kernel_instances": sum(len(r.nodes) for r in data.records.values()),
        "excluded_models": data.excluded_models, "excluded_tir_feature_rows": data.excluded_tir_features,
        "excluded_orphan_rows": data.excluded_orphan_rows,
        "row_statuses": dict(Counter(m.status for m in data.raw.values())),
        "canary_reference_us": data.reference_canary_us, "methods": sorted(methods), "splits": {}, "verdicts": [],
    }
    sizes = cache_sizes_for_db(db_path, json.loads(data.target).get("mcpu"))
    cache = None if sizes is None else sizes.bound_bytes
    core = measured_core_cache(data)
    report.update(cache_report_fields(sizes), core_cache_bytes=core)
    relay = None if progress is None else (lambda split, done, total: progress(split, done, total, ""))
    for split_name, (group_of, split_methods) in splits.items():
        if len(set(group_of.values())) < 2:
            report["splits"][split_name] = None
            report["verdicts"].append(f"{split_name}: skipped (fewer than 2 groups)")
            continue
        split = ev.cross_validate(data.records, group_of, split_methods, relay, split_name, cache_bytes=cache,
                                  core_cache=core)
        points = {name: res.pop("_points") for name, res in split.items()}
        report["splits"][split_name] = split
        report["verdicts"].extend(ev.honest_comparison(split, split_name))
        if split_name == "leave_one_model_out":
            report["goals_polynomial_lomo"] = ev.check_goals(split["polynomial"])
            m, p, k, where = points["polynomial"]
            report["misses_ge_100us"] = miss_analysis(data, m, p, where)
            if out_dir is not None:
                report["plot"] = str(ev.plot_predicted_vs_measured(
                    m, p, k, out_dir / "predictors_scatter.png",
                    title=f"polynomial, leave-one-model-out ({len(data.records)} model variants)"))
    report["noise_floor"] = noise_floor_of(data)
    report["model_level_floor"] = {
        "leave_one_model_out": ev.model_level_floor(data.records, {n: n for n in data.records}, cache, core),
        "leave_one_family_out": ev.model_level_floor(data.records, {n: r.family for n, r in data.records.items()},
                                                     cache, core)}
    start = time.perf_counter()
    fit_from_db(db_path, device)
    report["full_fit_seconds"] = time.perf_counter() - start
    with ModelDatabase(db_path) as models:
        runs = models.profile_runs(device)
    report["profile_runs"] = [{k: r[k] for k in ("session_id", "budget_s", "elapsed_s", "timestamp_s")} for r in runs]
    report["profile_seconds_total"] = sum(r["elapsed_s"] for r in runs)
    report = _jsonable(report)
    if out_dir is not None:
        path = out_dir / "predictors.json"
        report["written"] = [str(path)] + ([report["plot"]] if "plot" in report else [])
        path.write_text(json.dumps(report, indent=1))
    return report


def _jsonable(value: Any) -> Any:
    """Plain JSON values (numpy scalars -> Python, non-finite floats -> None)."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return float(value) if np.isfinite(value) else None
    if isinstance(value, (np.integer, np.bool_)):
        return value.item()
    return value
