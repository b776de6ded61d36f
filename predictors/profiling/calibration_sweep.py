"""The fresh timing of the host calibration suite: compile the suite's kernels and time them now, then judge the sweep.

:func:`time_fresh` is what :func:`predictors.host_calibration.time_suite` calls (passed in as ``time_fresh``) when
this host has no clean cached calibration: the compiler's cost path never imports the profiler itself, so a compile
on a CPU with its own predictor, or with a cached calibration, does not load it. Every kernel is built by
:func:`~predictors.profiling.synthetic_modules.build_synthetic_module`, paired with its kernel-graph features by
:func:`~predictors.profiling.kernel_mapping.map_kernels` and timed with the profiler's protocol (canary windows);
the sweep's cleanliness is judged by :func:`predictors.host_load.judge_sweep`.
"""
from __future__ import annotations

import datetime
import logging
from typing import Any, Sequence

import numpy as np

from hetpart.errors import PredictorError
from hetpart.graph import OpNode
from predictors.host_calibration import CalibrationKernel, SuiteTiming
from predictors.host_load import (CpuUse, SweepJudgement, busy_reason_now, cpu_use_now, host_cpus, judge_sweep,
                                  other_load_cores)
from predictors.profiling.kernel_mapping import map_kernels
from predictors.profiling.profiler import KernelProfiler
from predictors.profiling.synthetic_modules import build_synthetic_module
from predictors.synthetic_spec import SyntheticSpec

logger = logging.getLogger(__name__)

# Sweeps over the suite, keeping each kernel's lowest median: a predictor's labels are the lowest of
# ``hetpart profile``'s passes, and contention only adds time. ~5 s in all.
SUITE_PASSES = 2
# Timings of one kernel before a rejected (contended or noisy) window makes the sweep unclean: a quiet 2-core host
# still has spells of a few seconds that a single attempt ran into in 8 of 8 compiles of one benchmark run.
ATTEMPTS = 3


def suite_workloads(specs: Sequence[SyntheticSpec], profiler: Any) -> list[tuple[str, Any]]:
    """``(spec/kernel name, KernelWorkload)`` of every deployment kernel of ``specs``, with its features."""
    return [(f"{spec.name}/{w.name}", w) for spec in specs
            for w in map_kernels(build_synthetic_module(spec), spec.name, profiler).workloads]


def time_fresh(num_threads: int, specs: tuple[SyntheticSpec, ...]) -> SuiteTiming:
    """Compile and time ``specs`` now with the profiler's protocol, and judge the sweep."""
    measured_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    busy = busy_reason_now(num_threads)
    if busy is not None:      # a sweep started now could not be clean: do not spend a minute proving it
        return SuiteTiming((), measured_at, "fresh", SweepJudgement((busy,), None, None))
    profiler = KernelProfiler("cpu")
    workloads = suite_workloads(specs, profiler)
    start: CpuUse | None = cpu_use_now()
    rows, best = [], {}
    for name, workload in [item for _ in range(SUITE_PASSES) for item in workloads]:
        for attempt in range(1, ATTEMPTS + 1):       # a contended window is timed again, as the profiler does
            row = profiler.measure(workload)
            if row.status == "failed" or (row.status == "ok" and row.median_us):
                break
            logger.info("calibration kernel %s: %s %s (attempt %d of %d)", name, row.status, row.error, attempt,
                        ATTEMPTS)
        if row.status == "failed":
            logger.warning("calibration kernel %s failed: %s", name, row.error)
            continue
        rows.append(row)
        if row.status == "ok" and row.median_us:
            best[name] = min(best.get(name, np.inf), float(row.median_us))
        else:                 # rejected in every attempt: the sweep is unclean, stop here
            logger.info("calibration kernel %s rejected %d times; stopping the sweep", name, ATTEMPTS)
            break
    other_cores = other_load_cores(start, cpu_use_now())
    try:
        reference_us: float | None = profiler.canary_reference_us
    except PredictorError:      # no canary timed: every kernel failed to build
        reference_us = None
    judgement = judge_sweep(rows, reference_us, profiler.protocol.contention_tolerance, other_cores, host_cpus(),
                            num_threads)
    kernels = tuple(CalibrationKernel(name, OpNode.from_dict(w.features), best[name]) for name, w in workloads
                    if name in best)
    return SuiteTiming(kernels, measured_at, "fresh", judgement)
