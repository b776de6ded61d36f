"""One resumable, budgeted profiling run over a :class:`~predictors.profiling.store.ProfileStore`
(``profile_workloads``).

Workloads already in the database are skipped, each one is claimed before it is measured (two profilers on one
database never measure the same workload), and the run stops starting new workloads when its budget is spent;
rows rejected as noisy are measured again with what is left. Killing the run loses at most the measurement in
flight. Like the store, this module does not import TVM.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol, Sequence

from predictors.profiling.store import STATUSES, Measurement, ProfileStore

logger = logging.getLogger(__name__)


class Profiler(Protocol):
    """What :func:`profile_workloads` needs from a profiler (:class:`~predictors.profiling.profiler.KernelProfiler`
    is one)."""

    device: str
    target: str
    tvm_version: str
    session_id: str

    def measure(self, workload: Any) -> Measurement: ...


@dataclass
class ProfileRunSummary:
    """What one :func:`profile_workloads` call did."""

    measured: int = 0            # new rows written by this call (any status)
    skipped: int = 0             # already in the database
    claimed_elsewhere: int = 0   # being measured by another live profiler
    not_started: int = 0         # left over when the budget ran out
    statuses: dict[str, int] = field(default_factory=lambda: {s: 0 for s in STATUSES})
    elapsed_s: float = 0.0
    stopped_contended: bool = False   # stopped early: every recent window was contended (see profile_workloads)
    waited_s: float = 0.0             # spent waiting for a slow spell of the machine to end (wait_when_slow_s)


ProgressCallback = Callable[[int, int, str, str], None]   # (done, total, kernel name, status)


def profile_workloads(store: ProfileStore, workloads: Iterable[Any], profiler: Profiler, budget_s: float,
                      progress: ProgressCallback | None = None, stale_after_s: float = 3600.0,
                      prepare_chunk: int = 16, retry: Sequence[str] = (),
                      noisy_passes: int = 1, stop_after_contended: int = 12, wait_when_slow_s: float = 0.0,
                      poll_s: float = 30.0) -> ProfileRunSummary:
    """Measure every workload not yet in ``store`` until ``budget_s`` runs out; commit each row as it finishes.

    Workloads need ``key_hash`` and ``name``. Workloads already measured (same key, device, target, TVM version)
    are skipped, so rerunning after a kill continues where it stopped. Each workload is claimed before it is
    measured, so two profilers on the same database measure disjoint sets. If the profiler has ``prepare(ws)``
    (compile ahead), it is called on each chunk of ``prepare_chunk`` pending workloads before timing them; if
    it has ``seed_canary_history(values)`` and ``canary_kind``, it gets the canaries of the stored ok rows; if it
    has ``contention_of(row) -> reason``, this call's ok rows are judged again at the end (a session that
    started contended learns its reference late) and re-measured like noisy ones.
    ``retry``: statuses (``rejected_noisy``, ``failed``) whose rows are measured again and replaced.
    ``noisy_passes``: while budget remains, workloads this call rejected as noisy are measured again (their row
    replaced) up to this many extra passes at the end, when the machine may be quieter.
    ``stop_after_contended``: after this many workloads in a row rejected because their windows were contended
    (the profiler's canary stayed above the database's reference), the machine is slower or busier than when the
    database was profiled: the run warns once and stops (``stopped_contended``) instead of spending its budget on
    rejections. 0 never stops.
    ``wait_when_slow_s``: before stopping so, wait up to this long in all (within the budget) for the machine to
    come back: the canary is timed every ``poll_s`` seconds, outside the session's history, and once it runs within
    the reference's tolerance again the run goes on (the rejected workloads are retried with the noisy ones). This
    needs a profiler with ``canary_now_us()`` and ``canary_limit_us``; without them the run stops as before.
    """
    if not set(retry) <= {"rejected_noisy", "failed"}:
        raise ValueError(f"retry may name 'rejected_noisy' and 'failed' only; found {list(retry)}")
    done_statuses = tuple(s for s in STATUSES if s not in retry)
    start = time.monotonic()
    summary = ProfileRunSummary()
    ident = (profiler.device, profiler.target, profiler.tvm_version)
    items = list(workloads)
    pending = [w for w in items if not store.has(w.key_hash, *ident, statuses=done_statuses)]
    summary.skipped = len(items) - len(pending)
    done = summary.skipped
    prepare = getattr(profiler, "prepare", None)
    seed = getattr(profiler, "seed_canary_history", None)
    if seed is not None and pending:
        seed(store.canary_history(*ident, getattr(profiler, "canary_kind", "")))
    chunk = max(1, prepare_chunk)
    noisy: list[Any] = []
    accepted: list[tuple[Any, Measurement]] = []
    contended_run: list[Measurement] = []
    for index, w in enumerate(pending):
        if time.monotonic() - start > budget_s:
            summary.not_started = len(pending) - index
            logger.info("profiling budget of %.0f s used up; %d workloads not started", budget_s,
                        summary.not_started)
            break
        if prepare is not None and index % chunk == 0:
            prepare([v for v in pending[index:index + chunk]
                     if not store.has(v.key_hash, *ident, statuses=done_statuses)])
        done += 1
        if not store.try_claim(w.key_hash, *ident, profiler.session_id, stale_after_s, done_statuses):
            if store.has(w.key_hash, *ident, statuses=done_statuses):
                summary.skipped += 1
            else:
                summary.claimed_elsewhere += 1
            continue
        try:
            m = profiler.measure(w)
            assert (m.key_hash, m.device, m.target, m.tvm_version) == (w.key_hash, *ident), "profiler/row mismatch"
            store.add(m, replace=bool(retry))
        finally:
            store.release_claim(w.key_hash, *ident, profiler.session_id)
        summary.measured += 1
        summary.statuses[m.status] += 1
        if m.status == "rejected_noisy":
            noisy.append(w)
        else:
            accepted.append((w, m))
        if progress is not None:
            progress(done, len(items), w.name, m.status)
        if m.error.startswith("contended"):
            contended_run.append(m)
        else:
            contended_run.clear()
        if stop_after_contended and len(contended_run) >= stop_after_contended:
            budget_left_s = budget_s - (time.monotonic() - start)
            if wait_when_slow_s > summary.waited_s and budget_left_s <= 0:
                continue      # it would have waited, but the budget is spent: the run ends on that, not contended
            wait_s = min(wait_when_slow_s - summary.waited_s, budget_left_s)
            waited_from = time.monotonic()
            back = _wait_for_reference_speed(profiler, wait_s, poll_s)
            summary.waited_s += time.monotonic() - waited_from
            if back:
                contended_run.clear()
                continue
            _warn_contended(contended_run, profiler)
            summary.stopped_contended = True
            summary.not_started = len(pending) - index - 1
            break
    contended = getattr(profiler, "contention_of", None)
    for w, m in accepted if contended is not None else ():
        reason = contended(m)   # judged again with the final canary reference of the session
        if m.status == "ok" and reason:
            store.mark_rejected(w.key_hash, *ident, reason)
            summary.statuses["ok"] -= 1
            summary.statuses["rejected_noisy"] += 1
            noisy.append(w)
    remaining_s = budget_s - (time.monotonic() - start)
    if noisy and noisy_passes > 0 and remaining_s > 0 and summary.not_started == 0 and not summary.stopped_contended:
        logger.info("re-measuring %d workloads rejected as noisy", len(noisy))
        again = profile_workloads(store, noisy, profiler, remaining_s, progress, stale_after_s, prepare_chunk,
                                  retry=("rejected_noisy",), noisy_passes=noisy_passes - 1,
                                  stop_after_contended=stop_after_contended,
                                  wait_when_slow_s=max(0.0, wait_when_slow_s - summary.waited_s), poll_s=poll_s)
        summary.waited_s += again.waited_s
        summary.not_started += again.not_started
        for status, count in again.statuses.items():   # the retried rows replace this call's rejections
            summary.statuses[status] += count
        summary.statuses["rejected_noisy"] -= again.measured
        summary.stopped_contended = again.stopped_contended
    summary.elapsed_s = time.monotonic() - start
    return summary


_sleep = time.sleep      # tests replace it


def _wait_for_reference_speed(profiler: Any, wait_s: float, poll_s: float) -> bool:
    """Poll the profiler's canary until it runs within the reference's tolerance (True) or ``wait_s`` is spent."""
    canary_now = getattr(profiler, "canary_now_us", None)
    if canary_now is None or wait_s <= 0:
        return False
    limit_us = float(profiler.canary_limit_us)
    deadline = time.monotonic() + wait_s
    while True:
        now_us = float(canary_now())
        if now_us <= limit_us:
            logger.info("the canary runs at %.1f us again (limit %.1f us): profiling goes on", now_us, limit_us)
            return True
        left_s = deadline - time.monotonic()
        if left_s <= 0:
            return False
        logger.info("the canary runs at %.1f us, above the %.1f us a clean window allows: waiting for the machine "
                    "(%.0f s of waiting left)", now_us, limit_us, left_s)
        _sleep(min(poll_s, left_s))


def _warn_contended(rows: Sequence[Measurement], profiler: Profiler) -> None:
    canaries = sorted(m.canary_us for m in rows if m.canary_us)
    reference = getattr(profiler, "canary_reference_us", None)
    median = canaries[len(canaries) // 2] if canaries else float("nan")
    against = f" vs the database's reference {reference:.1f} us ({100 * (median / reference - 1):+.0f}%)" \
        if reference else ""
    logger.warning("the last %d kernels were all rejected as contended: the canary ran at a median %.1f us%s. The "
                   "machine is slower or busier than when this database was profiled, so measurements now would "
                   "not be comparable with the stored ones; stopping instead of spending the budget on rejections. "
                   "Profile again when the machine is quiet, or into a new database (--db NEW.sqlite) to start a "
                   "fresh reference.", len(rows), median, against)
