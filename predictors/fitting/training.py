"""From a profile database to a fitted predictor (``hetpart fit``) and to an error report (``hetpart evaluate``).

The data both read is :func:`predictors.fitting.dataset.load_training_data`'s. A fitted predictor records where it
came from (``provenance.training`` of its JSON): the profile database's file name and SHA-256, the hetpart commit
that fitted it (:func:`code_commit`), the pipeline versions its kernels were compiled and extracted by (which name
the CPU rules version), next to the feature schema the predictor itself records.

Splits (:func:`evaluate_db`): leave-one-model-out trains on the other variants' kernels **plus** the synthetic
kernels; leave-one-family-out trains on the other families' kernels only (synthetic kernels are variations
around every family's kernels, so they would leak the held-out family).
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from hetpart.errors import PredictorError
from hetpart.graph import OpNode
from predictors.context import core_cache_bytes
from predictors.device_predictor import DevicePredictor
from predictors.fitting import evaluate as ev
from predictors.fitting.dataset import TrainingData, load_training_data
from predictors.fitting.noise import miss_analysis, noise_floor_of
from predictors.profiling.cache_probe import cache_report_fields, cache_sizes_for_db
from predictors.profiling.model_db import ModelDatabase

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------- fit
def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file's bytes (hex)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def code_commit() -> str:
    """The commit (``git rev-parse HEAD``) of the repository this hetpart package is a checkout of; ``"unknown"``
    when it is not one (an installed copy) or git cannot tell."""
    root = Path(__file__).resolve().parents[2]          # predictors/fitting/training.py -> the checkout's root
    try:
        top = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel", "HEAD"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    lines = top.stdout.split()
    if top.returncode != 0 or len(lines) != 2 or Path(lines[0]).resolve() != root:
        return "unknown"                                 # not a checkout, or the package sits inside another repo
    return lines[1] if re.fullmatch(r"[0-9a-f]{40}", lines[1]) else "unknown"


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
            "excluded_orphan_rows": data.excluded_orphan_rows, "excluded_models": data.excluded_models,
            # where the predictor came from: the database by name and content (not by a path on the fitting
            # machine), and the code that fitted it
            "profile_db": Path(db_path).name, "profile_db_sha256": file_sha256(db_path), "code_commit": code_commit()}
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
