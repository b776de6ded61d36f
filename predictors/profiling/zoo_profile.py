"""Profile the zoo for a device: kernels with prediction-time features, whole-model latencies, retests.

Kernels and their features come from :func:`predictors.profiling.kernel_mapping.map_kernels` (deployment kernels paired
with the kernel-graph nodes a CostTable is built on). Timing uses
:class:`predictors.profiling.model_timing.BestWindowProfiler`, which keeps the least contended of several back-to-back
windows on a shared machine. Windows a second apart share the host's slow spells
(``benchmarks/results/host_spells.md``), so ``hetpart profile`` follows this campaign with refine passes
(:func:`predictors.profiling.refine.refine_passes`) that time every kernel again minutes later and keep the lower
median.

:func:`profile_zoo` runs the whole campaign under one time budget, resumably (the store skips what is measured):

1. zoo kernels (tiers 0 and 1 of :mod:`predictors.profiling.sampling`) in priority order, with at most
   ``zoo_budget_share`` of the budget (a variant whose kernels are all measured is not extracted again, unless
   it was extracted by an older :data:`predictors.versions.PIPELINE_VERSION`: then its graph, kernel keys and
   stored features are refreshed, and kernels the compiler now makes differently are measured);
2. whole-model latency of every variant whose kernels are all measured (deployment pipeline, ``vm["main"]``,
   the profiler's timing protocol and canary);
3. a retest of ``retest_count`` measured kernels (the test-retest noise floor);
4. synthetic variations (tier 2) with whatever budget is left (specs are marked done per
   :data:`PIPELINE_VERSION` and ``sampling.SYNTHETIC_VERSION``, so a new version rebuilds them and measures the
   kernels that changed).
"""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from hetpart.errors import HetpartError
from predictors.profiling import sampling
from predictors.profiling.kernel_mapping import ModelKernels, map_kernels
from predictors.profiling.model_db import ModelDatabase
from predictors.profiling.model_timing import import_variant, measure_model, model_windows, release_memory
from predictors.profiling.profiler import KernelProfiler
from predictors.profiling.workloads import KernelWorkload
from predictors.profiling.profiling_run import ProfileRunSummary, profile_workloads
from predictors.profiling.store import ProfileStore, feature_identity
from predictors.profiling.synthetic_modules import build_synthetic_module
from predictors.synthetic_spec import SyntheticSpec
from predictors.versions import PIPELINE_VERSION

logger = logging.getLogger(__name__)


def candidates_of(kernels: ModelKernels, tier: int) -> list[sampling.Candidate]:
    """One prioritisation candidate per distinct kernel, with its expected measuring cost."""
    out = []
    for w in kernels.workloads:
        f = w.features
        cost = sampling.expected_measure_s(float(f.get("flops", 0)),
                                           float(f.get("bytes_read", 0)) + float(f.get("bytes_written", 0)))
        out.append(sampling.Candidate(w.key_hash, tier, cost, kernels.name, w))
    return out


# ---------------------------------------------------------------------------------------------- campaign
@dataclass
class ZooProfileSummary:
    variants: int = 0
    aligned: int = 0
    fallback_tir: int = 0
    zoo_candidates: int = 0
    kernels_measured: int = 0
    kernels_skipped: int = 0
    kernels_not_started: int = 0
    kernels_remeasured: int = 0
    features_repaired: int = 0
    skipped_extraction: int = 0
    models_measured: int = 0
    retests: int = 0
    synthetic_specs: int = 0
    elapsed_s: float = 0.0
    stopped_contended: bool = False
    waited_s: float = 0.0           # spent waiting for slow spells of the machine to end
    failed_variants: dict[str, str] = dataclasses.field(default_factory=dict)


Progress = Callable[[str, int, int, str], None]     # (phase, done, total, item)


def profile_zoo(db_path: str | Path, budget_s: float, profiler: KernelProfiler | None = None,
                variants: Sequence[sampling.ModelVariant] | None = None, synthetic: bool = True,
                max_synthetic: int = 1200, zoo_budget_share: float = 0.6, retest_count: int = 40,
                synthetic_chunk: int = 24, progress: Progress | None = None,
                load_module: Callable[[sampling.ModelVariant], Any] = import_variant,
                wait_when_slow_s: float = 0.0) -> ZooProfileSummary:
    """The profiling campaign of the module docstring; safe to kill and rerun (nothing is measured twice).

    ``wait_when_slow_s``: how long in all the kernel runs may wait for a slow spell of the machine to end before
    they stop (``profile_workloads``); the default stops at once, as before.

    ``load_module(variant)`` gives the variant's Relax module (default: the zoo model via hetpart.driver.api).
    """
    start = time.monotonic()
    profiler = profiler or KernelProfiler("cpu")
    variants = list(variants if variants is not None else sampling.zoo_variants())
    ident = (profiler.device, profiler.target, profiler.tvm_version)
    summary = ZooProfileSummary(variants=len(variants))
    # once a kernel run stopped because every window was contended, nothing more is timed
    left = lambda: 0.0 if summary.stopped_contended else budget_s - (time.monotonic() - start)   # noqa: E731
    wait_left = lambda: max(0.0, wait_when_slow_s - summary.waited_s)   # noqa: E731

    def on_kernel(done: int, total: int, name: str, status: str) -> None:
        if progress is not None:
            progress("kernels", done, total, f"{name} {status}")

    with ProfileStore(db_path) as store, ModelDatabase(db_path) as models:
        if getattr(profiler, "num_threads", None):   # fail before compiling anything, not at the first row
            store.check_thread_count(*ident, profiler.num_threads)
        candidates, seeds = [], []
        stored = {m.key_hash: m for m in store.measurements(device=profiler.device, status=None,
                                                            target=profiler.target, tvm_version=profiler.tvm_version)}
        known = {r.name: r for r in models.variants(*ident)}
        for k, variant in enumerate(variants):
            record = known.get(variant.name)
            current = record is not None and record.aligned and record.pipeline_version == PIPELINE_VERSION
            if current and all(key == "" or (key in stored and stored[key].status != "rejected_noisy")
                               for key in record.node_keys):
                summary.skipped_extraction += 1       # every kernel measured: nothing to extract again
                seeds += list(record.graph.nodes)
                continue
            try:
                kernels = map_kernels(load_module(variant), variant.name, profiler)
            except HetpartError as exc:
                summary.failed_variants[variant.name] = f"{type(exc).__name__}: {exc}"
                logger.warning("skipping %s: its kernels cannot be profiled (%s)", variant.name, exc)
                continue
            summary.aligned += kernels.aligned
            summary.fallback_tir += not kernels.aligned
            models.put_variant(variant.name, *ident, variant.family, variant.tier, kernels.aligned, kernels.graph,
                               kernels.node_keys, profiler.session_id, PIPELINE_VERSION)
            candidates += candidates_of(kernels, variant.tier)
            summary.features_repaired += repair_features(store, kernels, stored)
            seeds += list(kernels.graph.nodes)     # every batch and size: batch 4 puts 4x the rows in a matmul
            release_memory()
            if progress is not None:
                progress("extract", k + 1, len(variants), variant.name)
        ordered = sampling.prioritise(candidates)
        summary.zoo_candidates = len(ordered)
        logger.info("%d model variants -> %d distinct zoo kernels (%d aligned, %d fell back to TIR features); "
                    "%.0f s used for extraction", len(variants), len(ordered), summary.aligned,
                    summary.fallback_tir, budget_s - left())
        run = profile_workloads(store, [c.workload for c in ordered], profiler,
                                max(0.0, zoo_budget_share * budget_s - (budget_s - left())), on_kernel,
                                wait_when_slow_s=wait_left())
        summary.waited_s += run.waited_s
        summary.kernels_measured += run.measured
        summary.kernels_skipped += run.skipped
        summary.kernels_not_started += run.not_started
        summary.stopped_contended = run.stopped_contended

        remeasured = remeasure_noisy(store, [c.workload for c in ordered], profiler, left,
                                     wait_when_slow_s=wait_left())
        summary.waited_s += remeasured.waited_s if remeasured else 0.0
        summary.kernels_remeasured = remeasured.statuses.get("ok", 0) if remeasured else 0
        summary.stopped_contended |= bool(remeasured and remeasured.stopped_contended)

        # whole-model latencies of variants whose kernels are all measured (not yet timed, or timed noisily)
        measured = {m.key_hash for m in store.measurements(device=profiler.device, status=None,
                                                           target=profiler.target,
                                                           tvm_version=profiler.tvm_version)}
        reject = profiler.protocol.reject_spread
        todo = [r for r in models.variants(*ident) if r.aligned and set(r.node_keys) - {""} <= measured
                and (r.model_median_us is None or (r.model_spread or 0.0) > reject)]
        by_name = {v.name: v for v in variants}
        for k, record in enumerate(todo):
            if left() <= 0 or record.name not in by_name:
                continue
            try:
                median, spread, canary, clean = measure_model(load_module(by_name[record.name]), profiler,
                                                              model_windows(profiler))
            except (HetpartError, RuntimeError) as exc:   # TVM build/run failures are RuntimeErrors
                logger.warning("whole-model timing of %s failed: %s", record.name, exc)
                continue
            finally:
                release_memory()
            if not clean:          # not stored: the next run times it again
                logger.warning("whole-model timing of %s: every window was contended (canary %.1f us); not stored",
                               record.name, canary)
                continue
            if record.model_median_us is not None and spread >= (record.model_spread or 0.0):
                continue      # the earlier (noisy) timing was still the better one
            models.set_model_latency(record.name, *ident, median, spread, canary, profiler.session_id)
            summary.models_measured += 1
            logger.info("model %s: %.1f us (spread %.1f%%)", record.name, median, 100 * spread)
            if progress is not None:
                progress("models", k + 1, len(todo), record.name)

        # retests for the noise floor: a deterministic sample of measured kernels, in a later window
        done_retests = {r.key_hash for r in models.retests(*ident)}
        pool = [c.workload for c in ordered if c.key_hash in measured and c.key_hash not in done_retests]
        wanted = max(0, retest_count - len(done_retests))
        picks = [pool[i] for i in np.random.default_rng(0).permutation(len(pool))[:wanted]]
        for k, w in enumerate(picks):
            if left() <= 0:
                break
            m = profiler.measure(w)
            if m.status != "failed" and m.median_us and m.canary_us:
                models.add_retest(w.key_hash, *ident, m.median_us, m.spread or 0.0, m.canary_us,
                                  profiler.session_id)
                summary.retests += 1
            if progress is not None:
                progress("retest", k + 1, len(picks), w.name)

        # synthetic variations with what is left, extracted chunk by chunk (cheapest expected cost first)
        if synthetic and left() > 0:
            specs = sampling.synthetic_specs(seeds, max_specs=max_synthetic)
            summary.synthetic_specs = len(specs)
            done_specs = models.synthetic_done(*ident)
            specs = sorted((s for s in specs if _done_marker(s) not in done_specs), key=_spec_cost)
            for first in range(0, len(specs), synthetic_chunk):
                if left() <= 0:
                    summary.kernels_not_started += len(specs) - first
                    break
                chunk, keys_of_spec = [], {}
                for spec in specs[first:first + synthetic_chunk]:
                    made = candidates_of(map_kernels(build_synthetic_module(spec), spec.name, profiler),
                                         sampling.TIER_SYNTHETIC)
                    keys_of_spec[_done_marker(spec)] = [c.key_hash for c in made]
                    chunk += made
                run = profile_workloads(store, [c.workload for c in sampling.prioritise(chunk)], profiler,
                                        max(0.0, left()), on_kernel, retry=("rejected_noisy",),
                                        wait_when_slow_s=wait_left())
                summary.waited_s += run.waited_s
                summary.kernels_measured += run.measured
                summary.kernels_skipped += run.skipped
                summary.kernels_not_started += run.not_started
                summary.stopped_contended |= run.stopped_contended
                release_memory()
                # a spec is done when each of its kernels has a final row; noisy or unstarted ones: next run
                models.mark_synthetic_done({spec: keys for spec, keys in keys_of_spec.items() if all(
                    store.has(k, *ident, statuses=("ok", "failed")) for k in keys)}, *ident)
        summary.elapsed_s = time.monotonic() - start
        models.record_run(profiler.session_id, profiler.device, budget_s, summary.elapsed_s,
                          dataclasses.asdict(summary))
    return summary


def repair_features(store: ProfileStore, kernels: ModelKernels, stored: dict[str, Any]) -> int:
    """Give stored rows the features the current extractor computes for their kernel, keeping the timing data.

    Two cases: rows stored with TIR-derived features (an earlier, failed alignment), and rows whose kernel-graph
    features changed since (``tvm_passes.extract.EXTRACTOR_VERSION`` went up, e.g. a fixed ``param_bytes``).
    Provenance tags (which model's ops the kernel came from) are not compared, since several models share a
    kernel. Returns how many rows were rewritten.
    """
    if not kernels.aligned:
        return 0
    repaired = 0
    for w in kernels.workloads:
        old = stored.get(w.key_hash)
        if old is None:
            continue
        if (old.features.get("tags", {}).get("source") == "tir"
                or feature_identity(old.features) != feature_identity(w.features)):
            new = dataclasses.replace(old, features=w.features, row_id=None)
            store.add(new, replace=True)
            stored[w.key_hash] = new
            repaired += 1
    if repaired:
        logger.info("%s: %d stored kernels got the current kernel-graph features", kernels.name, repaired)
    return repaired


def remeasure_noisy(store: ProfileStore, workloads: Sequence[KernelWorkload], profiler: KernelProfiler,
                    left: Callable[[], float], wait_when_slow_s: float = 0.0) -> ProfileRunSummary | None:
    """Measure again the workloads stored as ``rejected_noisy`` (their rows are replaced); the run's summary, or
    None when there was nothing to do. Run when the machine may be quieter than at the first attempt; like any
    kernel run it waits up to ``wait_when_slow_s`` for a slow spell to end before it stops."""
    noisy = {m.key_hash for m in store.measurements(device=profiler.device, status="rejected_noisy",
                                                    target=profiler.target, tvm_version=profiler.tvm_version)}
    todo = [w for w in workloads if w.key_hash in noisy]
    if not todo or left() <= 0:
        return None
    run = profile_workloads(store, todo, profiler, left(), retry=("rejected_noisy",), noisy_passes=0,
                            wait_when_slow_s=wait_when_slow_s)
    logger.info("re-measured %d noisy kernels: %s", run.measured, run.statuses)
    return run


def _done_marker(spec: SyntheticSpec) -> str:
    return f"{spec.name}{current_marker_suffix()}"


def current_marker_suffix() -> str:
    """How the done markers of the current pipeline and synthetic version end (see :func:`current_synthetic_keys`)."""
    return f"@{PIPELINE_VERSION}.synthetic-{sampling.SYNTHETIC_VERSION}"


def current_synthetic_keys(models: ModelDatabase, device: str, target: str, tvm_version: str) -> set[str] | None:
    """Key hashes of the kernels the current synthetic specs make, or None when no spec of the current sampling
    recorded its keys (a database not profiled since; then every stored synthetic row counts).

    Specs done under the current pipeline count. Until the database is profiled under a new pipeline version (a
    compiler change), the current sampling's specs done under the most recent earlier pipeline version stand in
    for them: what they made is what the database holds, and rows of older samplings stay orphans.
    """
    done = models.synthetic_done(device, target, tvm_version)
    current = [keys for spec, keys in done.items() if spec.endswith(current_marker_suffix())]
    if current:
        return set().union(*current)
    sampling_suffix = f".synthetic-{sampling.SYNTHETIC_VERSION}"
    same_sampling = [spec for spec in done if spec.endswith(sampling_suffix)]
    if not same_sampling:
        return None
    latest_suffix = "@" + same_sampling[-1].rsplit("@", 1)[1]       # markers come oldest first
    return set().union(*(done[spec] for spec in same_sampling if spec.endswith(latest_suffix)))


def _spec_cost(spec: SyntheticSpec) -> float:
    p = spec.params
    if spec.op in ("conv2d", "conv2d_residual"):
        out = p["n"] * p["co"] * (p["hw"] // p["stride"]) ** 2
        flops, nbytes = 2.0 * out * p["ci"] * p["k"] ** 2, 4.0 * (out + p["n"] * p["ci"] * p["hw"] ** 2)
    elif spec.op in ("depthwise_conv2d", "max_pool2d"):
        out = p["n"] * p["c"] * (p["hw"] // p["stride"]) ** 2
        flops, nbytes = 2.0 * out * p["k"] ** 2, 4.0 * (out + p["n"] * p["c"] * p["hw"] ** 2)
    elif spec.op == "matmul":
        flops, nbytes = 2.0 * p["m"] * p["n"] * p["k"], 4.0 * (p["m"] * p["k"] + p["k"] * p["n"] + p["m"] * p["n"])
    elif spec.op == "gates":
        flops, nbytes = 10.0 * p["t"] * p["m"] * p["n"], 8.0 * p["m"] * p["n"]
    elif spec.op in ("layer_norm", "softmax"):
        flops, nbytes = 8.0 * p["m"] * p["n"], 8.0 * p["m"] * p["n"]
    else:
        flops = nbytes = 12.0 * p["n"] * p["c"] * p["hw"] ** 2
    return sampling.expected_measure_s(flops, nbytes)
