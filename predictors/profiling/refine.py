"""Refine a profile database: measure its zoo kernels, models and synthetic kernels again; keep the lower medians.

Contention on a shared machine only ever adds time, so over several sessions the lowest median is the best estimate
of a kernel's own latency (``hetpart profile --refine``; the same rule
:class:`~predictors.profiling.model_timing.BestWindowProfiler` applies within a session). Each pass also records its
timings as retests of its session, the data of the noise floors in :func:`predictors.fitting.noise.noise_floor_of`.

"Lower" compares canary-normalised medians (:func:`predictors.profiling.store.normalise_latency`), so drift of the
whole machine within the canary's trust band does not count as a better label. A pass refuses to start when the canary
runs faster than the database's reference by more than that band: the host is then in a faster regime than when the
database was measured (this host has switched between ~72 and ~82 µs canaries from one hour to the next), and
keeping the lower medians would replace most labels with the other regime's timings -- normalising cannot undo that,
since memory-bound kernels moved ~20% when the compute-bound canary moved 13%. Such a pass lowered 526 of 723 labels
of one database and made every predictor figure worse; the fix is a new database measured in one regime.

Synthetic kernels are refined too, after the zoo's (they are the bulk of the training set). A kernel's windows are
timed back to back, so one slow spell of the host reaches all of them, and the canary does not see it: this host has
spells of seconds to minutes in which memory-heavy kernels run 1.2-1.5x slower while the L2-resident canary does not
move (``benchmarks/results/host_spells.md``): in one 7-second spell every synthetic 1x1 convolution timed was
1.33-1.47x slower than when re-timed in a later sitting, with spreads under 3% and canaries at the reference
(docs/predictors_history.md). Only passes minutes apart are independent samples; :func:`refine_passes` runs several.
"""
from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from hetpart.errors import HostRegimeError

from predictors.profiling import sampling
from predictors.profiling.kernel_mapping import map_kernels
from predictors.profiling.model_db import ModelDatabase, ModelVariantRecord
from predictors.profiling.profiler import KernelProfiler
from predictors.profiling.store import CANARY_TRUST, Measurement, ProfileStore, normalise_latency
from predictors.profiling.model_timing import import_variant, measure_model, model_windows, release_memory
from predictors.profiling.synthetic_modules import build_synthetic_module
from predictors.profiling.zoo_profile import current_marker_suffix
from predictors.synthetic_spec import SyntheticSpec

logger = logging.getLogger(__name__)


def refine_zoo(db_path: str | Path, budget_s: float, profiler: KernelProfiler,
               variants: Sequence[sampling.ModelVariant] | None = None,
               load_module: Callable[[sampling.ModelVariant], Any] = import_variant) -> dict[str, int]:
    """Measure every stored zoo kernel and whole model once more, then every stored synthetic kernel; keep
    whichever median is lower (see the module docstring). Variants are visited in tier order, then the synthetic
    specs by name, until ``budget_s`` runs out; the run is logged in the database.
    """
    start = time.monotonic()
    left = lambda: budget_s - (time.monotonic() - start)   # noqa: E731
    ident = (profiler.device, profiler.target, profiler.tvm_version)
    counts = {"kernels": 0, "kernels_lowered": 0, "models": 0, "models_lowered": 0, "models_first_timed": 0,
              "variants_skipped": 0, "synthetic_kernels": 0, "synthetic_lowered": 0}
    with ProfileStore(db_path) as store, ModelDatabase(db_path) as models:
        if getattr(profiler, "num_threads", None):
            store.check_thread_count(*ident, profiler.num_threads)
        stored = {m.key_hash: m for m in store.measurements(profiler.device, "ok", profiler.target,
                                                            profiler.tvm_version)}
        reference = _check_regime(list(stored.values()), profiler, db_path)
        known = {r.name: r for r in models.variants(*ident)}
        seen: set[str] = set()

        def remeasure(w: Any) -> bool:
            """Time ``w`` again, record the retest, keep the lower median; whether it was lowered."""
            seen.add(w.key_hash)
            old, new = stored[w.key_hash], profiler.measure(w)
            if new.status == "ok" and new.canary_us:       # one value per session: the noise floor's data
                models.add_retest(w.key_hash, *ident, new.median_us, new.spread or 0.0, new.canary_us,
                                  profiler.session_id)
            if new.status != "ok" or not _lower(new.median_us, new.canary_us, old.median_us, old.canary_us,
                                                reference):
                return False
            store.add(new, replace=True)
            stored[w.key_hash] = new
            return True

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
                if w.key_hash not in seen and w.key_hash in stored and left() > 0:
                    counts["kernels"] += 1
                    counts["kernels_lowered"] += remeasure(w)
            if left() > 0:         # a model no clean window has timed yet gets its first latency here
                median, spread, canary, clean = measure_model(mod, profiler, model_windows(profiler))
                counts["models"] += 1
                first = record.model_median_us is None
                if clean if first else _lower(median, canary, record.model_median_us, record.canary_us, reference):
                    models.set_model_latency(variant.name, *ident, median, spread, canary, profiler.session_id)
                    counts["models_first_timed" if first else "models_lowered"] += 1
            del mod, kernels
            release_memory()
            logger.info("refined %s: %s", variant.name, counts)
        for k, spec in enumerate(stored_synthetic_specs(models, known.values(), ident)):
            if left() <= 0:
                break
            if k % 50 == 49:
                release_memory()
            for w in map_kernels(build_synthetic_module(spec), spec.name, profiler).workloads:
                if w.key_hash not in seen and w.key_hash in stored and left() > 0:
                    counts["synthetic_kernels"] += 1
                    counts["synthetic_lowered"] += remeasure(w)
        logger.info("refined the synthetic kernels: %s", counts)
        models.record_run(profiler.session_id, profiler.device, budget_s, time.monotonic() - start,
                          {"refine": counts})
    return counts


def refine_passes(db_path: str | Path, budget_s: float, profiler: KernelProfiler, passes: int,
                  variants: Sequence[sampling.ModelVariant] | None = None,
                  load_module: Callable[[sampling.ModelVariant], Any] = import_variant) -> list[dict[str, int]]:
    """Up to ``passes`` :func:`refine_zoo` sweeps within ``budget_s``, each recorded as its own session
    (``<session id>.refine<k>``), so the noise floors see every sweep as a separate re-measurement."""
    start, base, done = time.monotonic(), profiler.session_id, []
    try:
        for k in range(max(0, passes)):
            left = budget_s - (time.monotonic() - start)
            if left <= 0:
                logger.info("the budget ended after %d of %d refine passes", k, passes)
                break
            profiler.session_id = f"{base}.refine{k + 1}"
            done.append(refine_zoo(db_path, left, profiler, variants, load_module))
    finally:
        profiler.session_id = base
    return done


def stored_synthetic_specs(models: ModelDatabase, records: Iterable[ModelVariantRecord],
                           ident: tuple[str, str, str]) -> list[SyntheticSpec]:
    """The synthetic specs whose kernels the database holds under the current pipeline and sampling, rebuilt from
    its zoo variants (the seeds :func:`~predictors.profiling.zoo_profile.profile_zoo` used), by name."""
    seeds = [node for r in records for node in r.graph.nodes]
    done = set(models.synthetic_done(*ident))
    every = sampling.synthetic_specs(seeds, max_specs=sys.maxsize)
    return [spec for spec in every if f"{spec.name}{current_marker_suffix()}" in done]


def _check_regime(rows: Sequence[Measurement], profiler: KernelProfiler, db_path: str | Path) -> float | None:
    """The database's reference canary (median of its rows'); raises when the host now runs faster than it."""
    canaries = [m.canary_us for m in rows if m.canary_us]
    if not canaries:
        return None
    reference = float(np.median(canaries))
    now = profiler.canary_us()
    if now < reference / (1 + CANARY_TRUST):
        raise HostRegimeError(
            f"refining needs the host at the speed {db_path} was measured at: its canary took {reference:.1f} us, "
            f"now it takes {now:.1f} us ({reference / now:.2f}x faster, beyond the {CANARY_TRUST:.0%} drift band). "
            "Keeping the lower medians would mix the two speeds. Profile into a new database (--db NEW.sqlite, "
            "then hetpart fit --db NEW.sqlite), or refine this one when the canary is back near its reference.")
    if now > reference * (1 + CANARY_TRUST):
        logger.warning("the canary takes %.1f us now against %.1f us in %s: the host is slower or busy, so few "
                       "labels will be lowered; refine when it is quiet", now, reference, db_path)
    return reference


def _lower(new_us: float, new_canary_us: float | None, old_us: float, old_canary_us: float | None,
           reference: float | None) -> bool:
    """Whether a new median beats the stored one once both are normalised to the reference canary."""
    if reference is None or not new_canary_us or not old_canary_us:
        return new_us < old_us
    return normalise_latency(new_us, new_canary_us, reference) < normalise_latency(old_us, old_canary_us, reference)
