"""Refine a profile database: measure its zoo kernels and models again and keep the lower medians.

Contention on a shared machine only ever adds time, so over several sessions the lowest median is the best estimate
of a kernel's own latency (``hetpart profile --refine``; the same rule :class:`~predictors.zoo_profile.
BestWindowProfiler` applies within a session). Each pass also records its timings as retests of its session, the
data of the noise floors in :func:`predictors.training.noise_floor_of`.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from predictors import sampling
from predictors.kernel_mapping import map_kernels
from predictors.model_db import ModelDatabase
from predictors.profiler import KernelProfiler
from predictors.store import ProfileStore
from predictors.zoo_profile import import_variant, measure_model

logger = logging.getLogger(__name__)


def refine_zoo(db_path: str | Path, budget_s: float, profiler: KernelProfiler,
               variants: Sequence[sampling.ModelVariant] | None = None,
               load_module: Callable[[sampling.ModelVariant], Any] = import_variant) -> dict[str, int]:
    """Measure every stored zoo kernel and whole model once more; keep whichever median is lower (see the module
    docstring). Variants are visited in tier order until ``budget_s`` runs out; the run is logged in the database.
    """
    start = time.monotonic()
    left = lambda: budget_s - (time.monotonic() - start)   # noqa: E731
    ident = (profiler.device, profiler.target, profiler.tvm_version)
    counts = {"kernels": 0, "kernels_lowered": 0, "models": 0, "models_lowered": 0, "variants_skipped": 0}
    with ProfileStore(db_path) as store, ModelDatabase(db_path) as models:
        stored = {m.key_hash: m for m in store.measurements(profiler.device, "ok", profiler.target,
                                                            profiler.tvm_version)}
        known = {r.name: r for r in models.variants(*ident)}
        seen: set[str] = set()
        for variant in variants if variants is not None else sampling.zoo_variants():
            record = known.get(variant.name)
            if left() <= 0 or record is None or not record.aligned:
                counts["variants_skipped"] += record is not None or left() <= 0
                continue
            mod = load_module(variant)
            kernels = map_kernels(mod, variant.name, profiler)
            if kernels.node_keys != record.node_keys:
                logger.warning("%s: its kernels changed since it was profiled; profile it again instead", variant.name)
                counts["variants_skipped"] += 1
                continue
            for w in kernels.workloads:
                old = stored.get(w.key_hash)
                if w.key_hash in seen or old is None or left() <= 0:
                    continue
                seen.add(w.key_hash)
                new = profiler.measure(w)
                counts["kernels"] += 1
                if new.status == "ok" and new.canary_us:       # one value per session: the noise floor's data
                    models.add_retest(w.key_hash, *ident, new.median_us, new.spread or 0.0, new.canary_us,
                                      profiler.session_id)
                if new.status == "ok" and new.median_us < old.median_us:
                    store.add(new, replace=True)
                    stored[w.key_hash] = new
                    counts["kernels_lowered"] += 1
            if record.model_median_us is not None and left() > 0:
                median, spread, canary, _ = measure_model(mod, profiler, getattr(profiler, "windows", 3))
                counts["models"] += 1
                if median < record.model_median_us:
                    models.set_model_latency(variant.name, *ident, median, spread, canary, profiler.session_id)
                    counts["models_lowered"] += 1
            logger.info("refined %s: %s", variant.name, counts)
        models.record_run(profiler.session_id, profiler.device, budget_s, time.monotonic() - start,
                          {"refine": counts})
    return counts
