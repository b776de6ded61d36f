"""Robust timing of fused kernels on a TVM device.

The unit of measurement is one *fused kernel* of a model's deployment pipeline, wrapped into a standalone module
(:mod:`predictors.profiling.workloads`). :class:`KernelProfiler` compiles those modules with the same pipeline and
target, then times them with a protocol made for a noisy shared machine:

* compile ahead (``prepare``), warm up, choose ``number`` so one repeat lasts >= ``min_repeat_us``;
* ``repeat`` repeats; the median is the label, spread = MAD / median is stored with all samples;
* spread > ``remeasure_spread`` (3 %): measure again (up to ``max_attempts``), keep the least noisy attempt;
  spread still > ``reject_spread`` (10 %): status ``rejected_noisy``;
* a fixed canary kernel (a square matmul, same threads as the kernels) is timed right before and right after
  each kernel. It gates the window: if either canary is more than ``contention_tolerance`` slower than the
  reference (lower quartile of this session's canaries and of those stored with earlier accepted rows, which
  ``profile_workloads`` seeds from the database), another process was taking a core. On a 2-core machine a
  multi-threaded kernel then runs 2-4x slower *with a small spread*, which the spread test cannot see; so the
  kernel is timed again after a pause, up to ``max_windows`` windows, else rejected. The canary of the
  accepted window is stored with each row (:func:`predictors.profiling.store.normalise_latency` rescales by it).
* after the thread pool sat idle (compiling, pausing), the canary is first spun until it runs at its reference
  speed (at most ``idle_warmup_max_s``): right after a long single-threaded step two-thread kernels can run at
  one thread's speed for tens of ms, which would otherwise cost a contended window.
"""
from __future__ import annotations

import logging
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import tvm
from tvm import relax

from hetpart.errors import BuildError, PredictorError
from tvm_passes.thread_pool import pool_threads_wanted
from predictors.profiling.store import Measurement
from predictors.profiling.workloads import KernelWorkload, canary_workload, target_string
from tvm_passes.outline import deployment_pipeline

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------- statistics
@dataclass(frozen=True)
class TimingStats:
    """Robust statistics of one timing attempt (per-call latencies of each repeat, µs)."""

    samples_us: tuple[float, ...]
    number: int

    @property
    def median_us(self) -> float:
        return float(np.median(self.samples_us))

    @property
    def mad_us(self) -> float:
        return float(np.median(np.abs(np.asarray(self.samples_us) - self.median_us)))

    @property
    def spread(self) -> float:
        return self.mad_us / self.median_us if self.median_us > 0 else math.inf


@dataclass(frozen=True)
class TimingProtocol:
    repeat: int = 7
    min_repeat_us: float = 1000.0      # one repeat lasts at least this long (number is raised for tiny kernels)
    max_number: int = 10000
    probe_runs: int = 3                # warm-up calls, also used to choose number
    remeasure_spread: float = 0.03
    reject_spread: float = 0.10
    max_attempts: int = 3
    # A window is clean if both canaries are <= (1 + this) * the session reference. Quiet canaries stay within
    # +-4% (p5-p95); in a contended hour windows with canaries 1.13x the reference passed 0.15 while the kernels
    # in them ran +45% (median) to 2.5x slow: the compute-bound canary under-reports memory-bound contention.
    contention_tolerance: float = 0.08
    max_windows: int = 3
    window_pause_s: float = 0.2
    canary_warmup: int = 3              # canary timings at session start (seed the reference)
    # After the thread pool sat idle (compiling, pausing) for idle_warmup_after_s, the first parallel runs can take
    # one thread's time (the canary right after compiling a model's kernels ran 140 us against 70 in most of the
    # contended windows of a 2-thread profile). Spin the canary, up to idle_warmup_max_s, until it runs at its
    # reference speed before the window starts, instead of spending a whole window on it.
    idle_warmup_after_s: float = 0.2
    idle_warmup_max_s: float = 0.3

    def calls_per_repeat(self, per_call_us: float) -> int:
        """Calls one repeat needs to last ``min_repeat_us`` for a kernel taking ``per_call_us`` (1..max_number)."""
        return int(min(self.max_number, max(1, math.ceil(self.min_repeat_us / max(per_call_us, 1e-3)))))


# (compiled kernel, number, repeat) -> per-call latency of each repeat, in seconds
Timer = Callable[["CompiledKernel", int, int], Sequence[float]]


@dataclass
class CompiledKernel:
    workload: KernelWorkload
    vm: Any
    dev: Any
    args: list[Any]
    compile_s: float


def tvm_timer(kernel: CompiledKernel, number: int, repeat: int) -> Sequence[float]:
    """TVM's time_evaluator on the kernel's VM (device-synchronised)."""
    return kernel.vm.time_evaluator("timed_main", kernel.dev, number=number, repeat=repeat)().results


def num_threads() -> int:
    """Threads of the TVM CPU thread pool of the calling thread (TVM_NUM_THREADS, or nproc/2 by default)."""
    return int(tvm.get_global_func("runtime.NumThreads")())


class KernelProfiler:
    """Times :class:`KernelWorkload` s on one TVM device; yields :class:`~predictors.profiling.store.Measurement`
    rows."""

    def __init__(self, device: str = "cpu", target: tvm.target.Target | None = None,
                 dev: tvm.runtime.Device | None = None, protocol: TimingProtocol = TimingProtocol(),
                 timer: Timer = tvm_timer, canary_size: int = 256, session_id: str | None = None,
                 seed: int = 0, database_dir: str | None = None) -> None:
        self.pipeline, self.tvm_target = deployment_pipeline(target, database_dir)
        self.device, self.target = device, target_string(self.tvm_target)
        kind = self.tvm_target.kind.name
        self.dev = dev if dev is not None else tvm.cpu(0) if kind in ("llvm", "c") else tvm.device(kind, 0)
        self.tvm_version = tvm.__version__
        self.protocol, self.timer, self.seed = protocol, timer, seed
        self.session_id = session_id or uuid.uuid4().hex[:12]
        self.num_threads = num_threads()
        wanted = pool_threads_wanted()
        if self.device == "cpu" and self.num_threads != wanted:
            logger.warning("TVM's thread pool runs %d thread(s) but hetpart deployments on this machine run %d: "
                           "these timings will not match compiled models. Set TVM_NUM_THREADS=%d before TVM starts "
                           "(the hetpart CLI and API do).", self.num_threads, wanted, wanted)
        self.canary_kind = f"matmul_{canary_size}_float32"
        self._canary = canary_workload(canary_size, self.tvm_target)
        self._canary_history: list[float] = []
        self._last_timed_s: float | None = None      # time.monotonic() after the last timing (None: none yet)
        self.idle_warmups = 0                         # windows that needed the idle warm-up (spun > 1 call)
        self._session_canaries = 0
        self._seeded = False
        self._compiled: dict[str, CompiledKernel] = {}
        self._compile_errors: dict[str, BuildError] = {}

    # ---------------------------------------------------------------- compile
    def compile(self, workload: KernelWorkload) -> CompiledKernel:
        if workload.key_hash in self._compiled:
            return self._compiled[workload.key_hash]
        if workload.key_hash in self._compile_errors:
            raise self._compile_errors[workload.key_hash]
        start = time.perf_counter()
        try:
            ex = tvm.compile(workload.mod, target=self.tvm_target, relax_pipeline=self.pipeline)
        except Exception as exc:  # TVM raises many types; re-raised typed, with the kernel named
            error = BuildError(f"compiling kernel {workload.name} for {self.target} failed: {exc}")
            self._compile_errors[workload.key_hash] = error
            raise error from exc
        vm = relax.VirtualMachine(ex, self.dev)
        rng = np.random.default_rng(self.seed)
        args = []
        for shape, dtype in zip(workload.input_shapes, workload.input_dtypes):
            data = rng.standard_normal(shape).astype(dtype) if dtype.startswith(("float", "bfloat")) \
                else np.zeros(shape, dtype)     # zeros are valid indices / masks for integer operands
            args.append(tvm.runtime.tensor(data, self.dev))
        vm.save_function("main", "timed_main", *args)
        kernel = CompiledKernel(workload, vm, self.dev, args, time.perf_counter() - start)
        self._compiled[workload.key_hash] = kernel
        return kernel

    def prepare(self, workloads: Sequence[KernelWorkload]) -> None:
        """Compile ahead of timing (compile failures are reported by measure())."""
        for w in workloads:
            try:
                self.compile(w)
            except BuildError as exc:
                logger.warning("%s", exc)

    # ---------------------------------------------------------------- timing
    def time_kernel(self, kernel: CompiledKernel) -> list[TimingStats]:
        """All attempts, following the protocol (re-measure while noisy, at most max_attempts)."""
        p = self.protocol
        probe = [float(s) for s in self.timer(kernel, 1, p.probe_runs)]
        number = p.calls_per_repeat(min(probe) * 1e6)
        attempts: list[TimingStats] = []
        rescaled = False
        while len(attempts) < p.max_attempts:
            stats = TimingStats(tuple(float(s) * 1e6 for s in self.timer(kernel, number, p.repeat)), number)
            if not rescaled and number < p.max_number and stats.median_us * number < p.min_repeat_us / 4:
                # The probe ran slow (a thread pool waking up, a preempted call: a 10 µs kernel probed at 200 µs
                # on a busy host), so these repeats last a fraction of min_repeat_us, too short to time
                # reliably. Once, time again with the calls per repeat the kernel's real speed needs.
                number, rescaled = p.calls_per_repeat(stats.median_us), True
                continue
            attempts.append(stats)
            if stats.spread <= p.remeasure_spread:
                break
        self._last_timed_s = time.monotonic()
        return attempts

    def warm_up_after_idle(self) -> int:
        """Spin the canary until it runs within the contention tolerance of the reference (at most
        ``idle_warmup_max_s``), if nothing was timed for ``idle_warmup_after_s``; returns the calls spent."""
        p = self.protocol
        if self._last_timed_s is None or not self._canary_history or p.idle_warmup_max_s <= 0 \
                or time.monotonic() - self._last_timed_s < p.idle_warmup_after_s:
            return 0
        kernel = self.compile(self._canary)
        limit_us = (1 + p.contention_tolerance) * self.canary_reference_us
        number = max(1, math.ceil(p.min_repeat_us / limit_us))
        start, calls = time.monotonic(), 0
        while time.monotonic() - start < p.idle_warmup_max_s:
            calls += 1
            if float(self.timer(kernel, number, 1)[0]) * 1e6 <= limit_us:
                break
        if calls > 1:
            self.idle_warmups += 1
        self._last_timed_s = time.monotonic()
        return calls

    def canary_us(self) -> float:
        """Time the canary now (median of its least noisy attempt) and add it to the session's history."""
        kernel = self.compile(self._canary)
        tries = self.protocol.canary_warmup if not self._session_canaries else 1
        values = [min(self.time_kernel(kernel), key=lambda s: s.spread).median_us for _ in range(tries)]
        self._session_canaries += len(values)
        self._canary_history.extend(values)
        return min(values)

    def canary_now_us(self) -> float:
        """Time the canary now WITHOUT adding it to the session's history: polling whether a slow spell of the
        machine ended must not drag the reference (a lower quartile of the history) up with it."""
        kernel = self.compile(self._canary)
        return float(min(self.time_kernel(kernel), key=lambda s: s.spread).median_us)

    @property
    def canary_limit_us(self) -> float:
        """The slowest canary a clean window may have: the reference plus the contention tolerance."""
        return (1 + self.protocol.contention_tolerance) * self.canary_reference_us

    def contention_of(self, m: Measurement) -> str:
        """Why ``m``'s window now counts as contended under the current reference ('' if it does not)."""
        if m.canary_us is None or not self._canary_history:
            return ""
        reference = self.canary_reference_us
        if m.canary_us <= (1 + self.protocol.contention_tolerance) * reference:
            return ""
        return (f"contended: canary {m.canary_us:.1f} us in its window vs reference {reference:.1f} us "
                "(judged at the end of the session)")

    def seed_canary_history(self, canaries_us: Sequence[float]) -> None:
        """Add canaries of accepted rows of earlier sessions (same device, target, TVM version, canary), so a
        session that is contended from its start is recognised as such instead of becoming the reference.
        Only the first call per profiler counts (later ones would add this session's own rows again)."""
        if not self._seeded:
            self._canary_history.extend(float(c) for c in canaries_us if c and c > 0)
            self._seeded = True

    @property
    def canary_reference_us(self) -> float:
        """The uncontended canary: lower quartile of every canary timed so far plus the seeded history (robust
        to one lucky fast timing, unlike the minimum; below contended timings while most windows are clean)."""
        if not self._canary_history:
            raise PredictorError("no canary has been timed in this session yet")
        return float(np.percentile(self._canary_history, 25))

    def measure(self, workload: KernelWorkload) -> Measurement:
        """Time one kernel in a clean window; compile or run failures become a ``failed`` row with the error."""
        p = self.protocol
        common = dict(key_hash=workload.key_hash, workload_key=workload.workload_key, kernel_name=workload.name,
                      device=self.device, target=self.target, tvm_version=self.tvm_version,
                      num_threads=self.num_threads, canary_kernel=self.canary_kind,
                      features=workload.features, session_id=self.session_id)
        try:
            kernel = self.compile(workload)
            for window in range(max(1, p.max_windows)):
                self.warm_up_after_idle()
                before = self.canary_us()
                attempts = self.time_kernel(kernel)
                after = self.canary_us()
                reference = self.canary_reference_us
                clean = max(before, after) <= (1 + p.contention_tolerance) * reference
                if clean:
                    break
                logger.info("kernel %s: contended window %d (canary %.0f/%.0f us, reference %.0f us)",
                            workload.name, window + 1, before, after, reference)
                if window + 1 < p.max_windows:
                    time.sleep(p.window_pause_s)
        except Exception as exc:  # record the failure in the database instead of aborting the batch
            self._compiled.pop(workload.key_hash, None)
            logger.warning("kernel %s failed: %s", workload.name, exc)
            return Measurement(**common, canary_us=None, median_us=None, mad_us=None, spread=None,
                               n_repeats=0, number=0, samples_us=(), status="failed",
                               error=f"{type(exc).__name__}: {exc}", timestamp_s=time.time()).validate()
        self._compiled.pop(workload.key_hash, None)     # free its inputs; each workload is measured once
        best = min(attempts, key=lambda s: s.spread)
        status = "ok" if clean and best.spread <= p.reject_spread else "rejected_noisy"
        note = "" if clean else (f"contended: canary {before:.1f}/{after:.1f} us around the kernel vs reference "
                                 f"{reference:.1f} us in this session ({p.max_windows} windows)")
        if len(attempts) > 1 or not clean:
            logger.info("kernel %s: %d attempts, spread %.1f%% -> %s", workload.name, len(attempts),
                        100 * best.spread, status)
        return Measurement(**common, canary_us=0.5 * (before + after), median_us=best.median_us,
                           mad_us=best.mad_us, spread=best.spread, n_repeats=len(best.samples_us),
                           number=best.number, samples_us=best.samples_us, status=status, error=note,
                           timestamp_s=time.time()).validate()
