"""Was the host quiet while a sweep of kernels was timed? The judgement behind a cacheable host calibration.

The profiler (:class:`~predictors.profiling.profiler.KernelProfiler`) judges each timing window by its canary
against a reference taken from the same session's canaries. That is relative: a host busy through the whole session slows the canaries as much as
the kernels, the reference becomes the busy level, and every window passes. :func:`judge_sweep` adds an absolute
check -- the CPU time other processes (and the hypervisor, as steal time) took on this process's CPUs while the sweep
ran, read from ``/proc/stat`` (:func:`cpu_use_now`, :func:`other_load_cores`) -- to the profiler's per-window verdicts
and a re-judgement of every window against the sweep's final canary reference. :mod:`predictors.host_calibration`
lists the criteria and why a calibration must meet them.
"""
from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hetpart.threads import PROCESS_CORES

# Cores other processes may use on average, beyond those the sweep's threads leave free, in a clean sweep: a quiet
# host's daemons use a few hundredths of a core.
OTHER_LOAD_ALLOWANCE_CORES = 0.25
PROC_STAT = Path("/proc/stat")


@dataclasses.dataclass(frozen=True)
class CpuUse:
    """A snapshot: monotonic time, busy time of this process's CPUs (every process, plus steal) and this process's
    own CPU time, in seconds, and how many CPUs this process may run on."""

    wall_s: float
    busy_s: float
    own_s: float
    cpus: int


def host_cpus() -> int:
    """The CPUs this process may run on."""
    return len(PROCESS_CORES)


def cpu_use_now() -> CpuUse | None:
    """This moment's :class:`CpuUse`, or None where ``/proc/stat`` cannot be read (not Linux)."""
    try:
        cpus = PROCESS_CORES
        lines = PROC_STAT.read_text().splitlines()
        tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
    except (OSError, AttributeError, ValueError):
        return None
    wanted, busy_ticks, found = {f"cpu{c}" for c in cpus}, 0, 0
    for line in lines:
        parts = line.split()
        if parts and parts[0] in wanted and len(parts) >= 9:
            user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in parts[1:9])
            busy_ticks += user + nice + system + irq + softirq + steal
            found += 1
    if found != len(cpus):
        return None
    own = os.times()
    return CpuUse(time.monotonic(), busy_ticks * tick_s,
                  own.user + own.system + own.children_user + own.children_system, len(cpus))


def other_load_cores(start: CpuUse | None, end: CpuUse | None) -> float | None:
    """Cores other processes kept busy on average between two snapshots (None: unknown)."""
    if start is None or end is None or end.wall_s <= start.wall_s:
        return None
    others_s = (end.busy_s - start.busy_s) - (end.own_s - start.own_s)
    return max(0.0, others_s / (end.wall_s - start.wall_s))


@dataclasses.dataclass(frozen=True)
class SweepJudgement:
    """Whether a sweep's timing windows were clean, and what that was judged on."""

    reasons: tuple[str, ...]                # why the sweep is not clean; empty: clean
    canary_reference_us: float | None      # the sweep's quiet canary (None: no canary was timed)
    other_load_cores: float | None         # cores other processes used on average (None: not measurable here)

    @property
    def clean(self) -> bool:
        return not self.reasons

    def to_dict(self) -> dict[str, Any]:
        return {"clean": self.clean, "reasons": list(self.reasons), "canary_reference_us": self.canary_reference_us,
                "other_load_cores": self.other_load_cores}


def judge_sweep(rows: Sequence[Any], canary_reference_us: float | None, tolerance: float,
                other_cores: float | None, cpus: int, threads: int) -> SweepJudgement:
    """Judge a sweep's profiler rows (:class:`predictors.profiling.store.Measurement`, failed builds left out).
    Clean when no row was rejected as contended or noisy, every accepted window's canary is within ``tolerance`` of the
    sweep's final ``canary_reference_us``, and other processes used at most ``cpus - threads`` plus
    :data:`OTHER_LOAD_ALLOWANCE_CORES` cores on average (``other_cores``; None: that check is skipped)."""
    reasons = []
    noisy = [r for r in rows if r.status != "ok"]
    if noisy:
        reasons.append(f"{len(noisy)} of {len(rows)} kernel timings were rejected as contended or noisy")
    if canary_reference_us:
        limit_us = (1 + tolerance) * canary_reference_us
        late = [float(r.canary_us) for r in rows if r.status == "ok" and r.canary_us and r.canary_us > limit_us]
        if late:
            reasons.append(f"{len(late)} kernel window(s) ran the canary up to {max(late) / canary_reference_us:.2f}x "
                           f"the sweep's reference {canary_reference_us:.0f} us")
    allowed_cores = max(0, cpus - threads) + OTHER_LOAD_ALLOWANCE_CORES
    if other_cores is not None and other_cores > allowed_cores:
        reasons.append(f"other processes kept {other_cores:.2f} of this host's {cpus} core(s) busy on average "
                       f"while the suite ran {threads} thread(s)")
    return SweepJudgement(tuple(reasons), canary_reference_us, other_cores)


def busy_reason_now(threads: int, sample_s: float = 0.5) -> str | None:
    """Why the host is too busy right now to start a clean sweep of ``threads`` threads (sampled over
    ``sample_s`` seconds of ``/proc/stat``), or None when it looks quiet or cannot be read."""
    start = cpu_use_now()
    time.sleep(sample_s)
    cores = other_load_cores(start, cpu_use_now())
    cpus = host_cpus()
    allowed = max(0, cpus - threads) + OTHER_LOAD_ALLOWANCE_CORES
    if cores is None or cores <= allowed:
        return None
    return f"other processes kept {cores:.2f} of this host's {cpus} core(s) busy before the suite started"
