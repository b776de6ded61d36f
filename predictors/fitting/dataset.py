"""The training data of a profile database: what ``hetpart fit`` fits on and ``hetpart evaluate`` evaluates.

Labels: each ``ok`` kernel row's median, put on one scale with the canary of its timing window
(:func:`predictors.profiling.store.normalise_latency`, reference = the median canary of the rows used). Rows whose
features were not taken from the kernel graph (``tags.source == "tir"``: the kernel <-> node alignment failed for
their model, see :mod:`predictors.profiling.kernel_mapping`) are left out and counted, because prediction-time
features never look like them. Rows superseded by a newer measurement of the same operator as another kernel (the
compiler changed since, :func:`superseded_keys`) are left out too, and so are synthetic rows that no current
synthetic spec makes (an older sampling, :func:`_orphan_keys`).

Model-level data: every aligned model variant with a measured whole-model latency and an ``ok`` label for each
of its kernels becomes an :class:`predictors.fitting.evaluate.ModelRecord` (nodes, per-node labels, normalised
model latency, family). Kernel-graph nodes that run no kernel in deployment (host-side shape computations, see
:func:`predictors.profiling.kernel_mapping.align_calls`) have no label and are not part of the record. Variants
with a kernel that is missing or only ``rejected_noisy`` are listed as excluded.
"""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from hetpart.errors import PredictorError
from hetpart.graph import OpNode
from predictors.fitting import evaluate as ev
from predictors.profiling.model_db import ModelDatabase
from predictors.profiling.store import Measurement, ProfileStore, feature_identity, normalise_latency

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
    from predictors.profiling.zoo_profile import current_synthetic_keys     # imported here: it loads TVM

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

    Equal :func:`~predictors.profiling.store.feature_identity` under a different key means the compiler now builds
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
