"""How far the measurements themselves disagree (test-retest noise floors), and which prediction misses their
noise cannot explain. Both read a :class:`predictors.fitting.dataset.TrainingData` (its re-measurements and
labels); :func:`predictors.fitting.training.evaluate_db` puts them in the error report.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

import numpy as np

from predictors.features import kernel_kind
from predictors.fitting import evaluate as ev
from predictors.fitting.dataset import TrainingData
from predictors.profiling.store import CANARY_TRUST, normalise_latency


def _session_canaries(data: TrainingData) -> dict[str, list[float]]:
    canaries: dict[str, list[float]] = {}
    for _, _, canary, session in data.retests:
        canaries.setdefault(session, []).append(canary)
    return canaries


def quiet_sessions(data: TrainingData) -> set[str]:
    """Re-measurement sessions whose median canary is within ``CANARY_TRUST`` of the database's reference."""
    ref = data.reference_canary_us
    return {s for s, c in _session_canaries(data).items()
            if abs(np.log(np.median(c) / ref)) <= np.log1p(CANARY_TRUST)}


def noise_floor_of(data: TrainingData) -> dict[str, Any]:
    """How far the measurements themselves disagree, in µs on the canary-normalised scale.

    Re-measurements (``--retests``, and one per kernel in every ``--refine`` pass) are grouped by session. A
    session is *quiet* when its median canary is within ``CANARY_TRUST`` of the reference; a contended session
    is reported (``sessions``) but kept out of the floors, since a kernel label is the lowest median over
    sessions and contention only adds time.

    * ``retest_*``: quiet sessions' re-measurements against the stored label (split by latency bucket). The label
      is a minimum over sessions, so this includes the upward bias of a single session.
    * ``between_sessions*``: kernels re-measured in two or more quiet sessions, each session's value against the
      median of the others'.
    * ``within_window_spread``: MAD/median of the repeats inside one timing window.
    """
    out: dict[str, Any] = {}
    ref = data.reference_canary_us
    canaries = _session_canaries(data)
    quiet = quiet_sessions(data)
    sessions, pairs_norm, pairs_raw = {}, [], []
    per_session: dict[str, dict[str, float]] = {}
    for key, median, canary, session in data.retests:
        first = data.raw.get(key)
        if first is None or first.median_us is None or not first.canary_us:
            continue
        label, value = first.normalised_us(ref), normalise_latency(median, canary, ref)
        sessions.setdefault(session, []).append(value / label - 1.0)
        if session in quiet:
            per_session.setdefault(key, {}).setdefault(session, value)
            pairs_norm.append([label, value])
            pairs_raw.append([first.median_us, median])
    out["sessions"] = {s: {"n": len(v), "quiet": s in quiet, "canary_vs_reference": float(np.median(canaries[s]) / ref),
                           "median_signed_error_vs_label": float(np.median(v)),
                           "within_10pct_of_label": float(np.mean(np.abs(v) <= 0.1))} for s, v in sessions.items()}
    repeated = [list(v.values()) for v in per_session.values() if len(v) >= 2]
    if repeated:
        out["between_sessions"] = ev.noise_floor(repeated)
        for bucket, lo, hi in ev.SIZE_BUCKETS:
            sel = [v for v in repeated if lo <= float(np.median(v)) < hi]
            if sel:
                out[f"between_sessions_{bucket}"] = ev.noise_floor(sel)
    if pairs_norm:
        out["retest_normalised"] = ev.noise_floor(pairs_norm)
        out["retest_raw"] = ev.noise_floor(pairs_raw)
        m = np.array([p[0] for p in pairs_norm])
        for bucket, lo, hi in ev.SIZE_BUCKETS:
            sel = [(p, q) for p, q in pairs_norm if lo <= p < hi]
            if sel:
                out[f"retest_normalised_{bucket}"] = ev.noise_floor(sel)
        out["retest_latency_range_us"] = [float(m.min()), float(m.max())]
    spreads = [m.spread for m in data.raw.values() if m.status == "ok" and m.spread is not None]
    if spreads:
        out["within_window_spread"] = {"median": float(np.median(spreads)), "p90": float(np.quantile(spreads, 0.9)),
                                       "n": len(spreads)}
    return out


def miss_analysis(data: TrainingData, measured: Sequence[float], predicted: Sequence[float],
                  where: Sequence[tuple[str, int]], tolerance: float = 0.1, min_us: float = 100.0) -> dict[str, Any]:
    """Held-out kernel instances >= ``min_us`` predicted outside ±``tolerance``, split by whether their own label
    is stable: *label-stable* when every quiet re-measurement of the kernel (each refine pass) is within the same
    tolerance of its label. Misses on stable labels are errors of the predictor, not of the measurements; the
    test-retest floors of :func:`noise_floor_of` cannot explain them. A kernel never re-measured in a quiet session
    counts as stable (nothing contradicts its label): with ``hetpart profile``'s refine passes every kernel has
    quiet re-measurements unless every pass was contended."""
    ref, quiet = data.reference_canary_us, quiet_sessions(data)
    retests: dict[str, list[float]] = {}
    for key, median, canary, session in data.retests:
        if session in quiet:
            retests.setdefault(key, []).append(normalise_latency(median, canary, ref))
    misses, stable, keys, per_model, per_kind = 0, 0, set(), Counter(), Counter()
    for y, y_hat, (model, index) in zip(measured, predicted, where):
        if y < min_us or abs(y_hat / y - 1.0) <= tolerance:
            continue
        key = data.model_keys[model][index]
        misses += 1
        keys.add(key)
        per_model[model] += 1
        per_kind[kernel_kind(data.kernels[key][0])] += 1
        stable += all(abs(v / y - 1.0) <= tolerance for v in retests.get(key, []))
    n_big = sum(1 for y in measured if y >= min_us)
    return {"n_kernels_ge_min": n_big, "misses": misses, "distinct_kernels": len(keys),
            "label_stable": stable, "label_noisy": misses - stable,
            "per_model": dict(per_model.most_common()), "per_kind": dict(per_kind.most_common()),
            "tolerance": tolerance, "min_us": min_us}
