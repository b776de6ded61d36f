"""Use a CPU predictor on a CPU, or with a thread count, it was not measured with: scale it by a calibration suite.

A CPU predictor's labels are kernel timings on one CPU with one TVM thread count. When hetpart has no predictor for
this host's CPU, or the deployment runs another thread count, :func:`calibrate_to_host` times a fixed suite of
kernels here (:data:`CALIBRATION_SUITE`: the kinds the zoo's time goes to -- 3x3, 1x1 and weight-heavy
convolutions, a depthwise convolution, a matrix-vector product, a matmul, a max-pool, a streaming and a
transcendental elementwise kernel, a layer norm -- built, compiled and timed exactly like profiled kernels by the
sweep the caller passes in, :func:`predictors.profiling.calibration_sweep.time_fresh`), asks the predictor for the
same kernels, and multiplies every prediction (isolated kernels and the in-model terms) by the geometric mean of
measured / predicted (:class:`HostScaledPredictor`). This module never imports the profiler: the sweep is injected
(``time_fresh``), and a host with a clean cached calibration never needs it.

**Only a clean sweep is kept, or used.** The suite's timings are kept in ``$HETPART_CACHE_DIR/calibration/`` per CPU,
thread count, suite, pipeline and TVM version, with the UTC time they were measured, so a host pays for them (~5 s)
once -- so a ratio timed while another process held a core would mis-scale every later compile: contention only
adds time, by an unknown factor. A sweep is *clean* (:func:`predictors.host_load.judge_sweep`) when all of these
hold:

1. every timing of every pass was accepted by the profiler (:class:`~predictors.profiling.profiler.KernelProfiler`):
   its canary windows were within the profiler's ``contention_tolerance`` of the reference and its spread within
   ``reject_spread`` (kernels that fail to build are left out; that is not contention);
2. judged again at the end of the sweep, against the reference of all the sweep's canaries (the lower quartile,
   better known then than when the first windows were judged), every accepted window's canary is still within
   that tolerance;
3. the canary's reference is the host's quiet level: both checks above are relative to the sweep's own canaries,
   which a host busy through the whole sweep slows as much as the kernels. So the CPU time other processes (and
   the hypervisor, as steal) took on this process's CPUs during the sweep (``/proc/stat`` less this process's own
   time) must leave the suite's threads their cores: at most ``cpus - threads`` plus
   :data:`predictors.host_load.OTHER_LOAD_ALLOWANCE_CORES` cores on average. Where ``/proc/stat`` cannot be read
   this check is skipped.

An unclean sweep is neither kept nor used: the predictor stays unscaled for that compile (a documented cross-CPU
error, and the same plan on every retry) rather than scaled by an unknown share of contention, and the warning and
the report's cost note say so (``calibration: none-fallback``). A busy host never fails a compile.

**Why a suite, not one kernel.** The profiler's canary alone (a 256^3 matmul) is a poor ratio: CPUs do not differ
by one factor, and a matmul is where they differ most. Zen 4 executes AVX-512 on 256-bit units, so the canary took
2.08x as long on the Zen 4 host as on the Zen 5 host while the zoo's models took a median 1.57x as long as the Zen 5
predictor predicts; the Intel guest ran the canary 1.40x as fast as Zen 4, while its predictor matched Zen 4's
models at a median 0.91x. Measured on the Zen 4 host (``benchmarks/results/predictor_transfer_*_on_znver4.md``),
whole-model MAPE over the 23 zoo variants:

=====================================  ========  =============  =========================
predictor                              unscaled  canary-scaled  suite-scaled (this module)
=====================================  ========  =============  =========================
Zen 5 (``cpu_znver5.json``)           35.5%     34.1% (x2.08)  12.7% (x1.44)
Intel (``cpu_rocketlake.json``)        27.7%     64.6% (x1.40)  25.7% (x0.81)
=====================================  ========  =============  =========================

The Zen 5 predictor was fitted on kernels of older CPU rules (it records no rules version), so part of its error is
not the CPU's. One ratio is still a first-order correction, not a model of the new CPU: the Intel predictor's batch-1
recurrent models stay 1.6-1.7x high on Zen 4 after scaling (their 6.8 MB matrix-vector products stream at ~150 GB/s
on Zen 4, at 50-63 GB/s on the Intel guest once they leave its L2), and its calibrated ratios span x0.41 to x1.24 per
kernel. A predictor fitted on the host (``hetpart profile`` + ``hetpart fit``) is the real fix, and
:func:`predictors.registry.load_cpu_predictor` only scales when there is none.
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from hetpart.errors import ExtrapolationWarning, HetpartError, PredictorError
from hetpart.graph import OpNode
from hetpart.paths import cache_root
from tvm_passes.thread_pool import restricted_pool
from predictors.host_load import SweepJudgement
from predictors.synthetic_spec import SyntheticSpec

logger = logging.getLogger(__name__)

# Bump when a kernel of the suite changes: cached host timings of another version are measured again.
SUITE_VERSION = 1
# Bump when the cache file's meaning changes. 2: only clean sweeps are kept, with the time they were measured;
# files of format 1 may hold a busy host's timings and are never read.
CACHE_FORMAT = 2
CALIBRATION_SUITE: tuple[SyntheticSpec, ...] = (
    SyntheticSpec.of("conv2d", n=1, ci=64, co=64, hw=56, k=3, stride=1),        # ResNet's 3x3 body
    SyntheticSpec.of("conv2d", n=1, ci=256, co=64, hw=56, k=1, stride=1),       # a bottleneck's 1x1 reduce
    SyntheticSpec.of("conv2d", n=1, ci=256, co=256, hw=14, k=3, stride=1),      # weight-heavy (2.4 MB), small map
    SyntheticSpec.of("depthwise_conv2d", n=1, c=144, hw=56, k=3, stride=1),     # MobileNetV2, memory-bound
    SyntheticSpec.of("matmul", m=1, k=650, n=2608),                             # an LSTM step: a 6.8 MB GEMV
    SyntheticSpec.of("matmul", m=128, k=256, n=1024),                           # a transformer's FFN
    SyntheticSpec.of("max_pool2d", n=1, c=64, hw=112, k=3, stride=2),
    SyntheticSpec.of("add_relu", n=1, c=128, hw=56),                            # streaming elementwise
    SyntheticSpec.of("gates", m=35, n=2600, t=3),                               # RNN gates: sigmoid / tanh / erf
    SyntheticSpec.of("layer_norm", m=512, n=512),
)
MIN_MEASURED_SHARE = 0.5   # below this share of the suite built and timed, the ratio is not trusted


@dataclasses.dataclass(frozen=True)
class CalibrationKernel:
    """One kernel of the suite as timed on this host: its features and its median latency (µs)."""

    name: str
    node: OpNode
    host_us: float

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "node": self.node.to_dict(), "host_us": self.host_us}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CalibrationKernel":
        kernel = cls(str(data["name"]), OpNode.from_dict(data["node"]), float(data["host_us"]))
        if not np.isfinite(kernel.host_us) or kernel.host_us <= 0:
            raise PredictorError(f"calibration kernel {kernel.name}: host_us must be a positive latency; found "
                                 f"{kernel.host_us!r}")
        return kernel


@dataclasses.dataclass(frozen=True)
class SuiteTiming:
    """The suite as timed on this host: its kernels, when (UTC ISO 8601), whether read from the cache file
    (``origin="cached"``) or timed by this process (``"fresh"``), and how clean its windows were."""

    kernels: tuple[CalibrationKernel, ...]
    measured_at: str
    origin: str
    judgement: SweepJudgement

    @property
    def clean(self) -> bool:
        return self.judgement.clean


@dataclasses.dataclass(frozen=True)
class HostCalibration:
    """How a CPU predictor was fitted to this host, for its warning and the report's cost note: ``status`` is
    ``cached`` or ``fresh`` (scaled by that calibration) or ``none-fallback`` (left unscaled, ``reason`` says why);
    ``speed_ratio`` is the ratio applied, or for a fallback the unused ratio of an unclean sweep (None: none);
    ``measured_at`` is when the suite was timed (UTC ISO 8601; None: it was not)."""

    status: str
    speed_ratio: float | None
    measured_at: str | None
    reason: str = ""


def suite_cache_path(host_cpu: str, num_threads: int, specs: Sequence[SyntheticSpec] = CALIBRATION_SUITE) -> Path:
    """Where this host's timings of ``specs`` are kept: one file per CPU, thread count, suite, pipeline and TVM."""
    import tvm

    from predictors.versions import PIPELINE_VERSION

    ident = json.dumps([SUITE_VERSION, CACHE_FORMAT, [s.name for s in specs], PIPELINE_VERSION, tvm.__version__])
    digest = hashlib.sha256(ident.encode()).hexdigest()[:12]
    return cache_root() / "calibration" / f"{host_cpu or 'cpu'}_{num_threads}threads_{digest}.json"


def _load_cached(path: Path) -> SuiteTiming | None:
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        measured_at = str(data["measured_at"])
        datetime.datetime.fromisoformat(measured_at)
        judgement = data["judgement"]
        if data.get("format") != CACHE_FORMAT or not judgement.get("clean"):
            raise ValueError(f"a clean calibration of format {CACHE_FORMAT} is expected")
        kernels = tuple(CalibrationKernel.from_dict(k) for k in data["kernels"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError, PredictorError) as exc:
        logger.warning("ignoring the unreadable host calibration %s (%s); timing the suite again", path, exc)
        return None
    return SuiteTiming(kernels, measured_at, "cached",
                       SweepJudgement((), judgement.get("canary_reference_us"), judgement.get("other_load_cores")))


def _save(path: Path, timing: SuiteTiming, host_cpu: str, num_threads: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"format": CACHE_FORMAT, "suite_version": SUITE_VERSION, "host_cpu": host_cpu,
               "num_threads": num_threads, "measured_at": timing.measured_at, "judgement": timing.judgement.to_dict(),
               "kernels": [k.to_dict() for k in timing.kernels]}
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        json.dump(payload, handle)
    os.replace(tmp, path)       # atomic: a concurrent reader sees the old file or the new one


def _pool_threads() -> int:
    import tvm

    return int(tvm.get_global_func("runtime.NumThreads")())


# Compiles and times the suite now and judges the sweep: ``time_fresh(num_threads, specs) -> SuiteTiming``. The
# caller passes it in (the profiler's is :func:`predictors.profiling.calibration_sweep.time_fresh`), so this
# module, and a compile that finds a clean cached calibration, never import the profiler.
FreshTiming = Callable[[int, tuple[SyntheticSpec, ...]], SuiteTiming]


_CLEAN_TIMINGS: dict[tuple[str, int, tuple[SyntheticSpec, ...]], SuiteTiming] = {}
# After a busy sweep, later compiles in the same process reuse its verdict for this long instead of timing again.
BUSY_RETRY_AFTER_S = 600.0
_BUSY_TIMINGS: dict[tuple[str, int, tuple[SyntheticSpec, ...]], tuple[float, SuiteTiming]] = {}


def forget_timings() -> None:
    """Forget this process's timings (the next :func:`time_suite` reads the cache file or times again)."""
    _CLEAN_TIMINGS.clear()
    _BUSY_TIMINGS.clear()


def time_suite(host_cpu: str, num_threads: int, specs: tuple[SyntheticSpec, ...] = CALIBRATION_SUITE, *,
               time_fresh: FreshTiming | None = None) -> SuiteTiming:
    """The suite's kernels as timed on this host with ``num_threads`` TVM threads.

    Read from :func:`suite_cache_path` when this host timed them cleanly before; else timed now by ``time_fresh``
    (:data:`FreshTiming`; ``num_threads`` must then be the pool's count) and written there only if the sweep was
    clean. A busy host gives an unclean timing, not an error; raises :class:`PredictorError` when the suite cannot
    be timed (no ``time_fresh`` given, another thread count in TVM's pool, too few kernels built). A clean timing
    is kept for the rest of the process."""
    key = (host_cpu, num_threads, tuple(specs))
    if key in _CLEAN_TIMINGS:
        return _CLEAN_TIMINGS[key]
    path = suite_cache_path(host_cpu, num_threads, specs)
    timing = _load_cached(path)
    if timing is not None:
        logger.info("host calibration: %d kernels timed on this %s with %d thread(s) at %s, from %s",
                    len(timing.kernels), host_cpu, num_threads, timing.measured_at, path)
        _CLEAN_TIMINGS[key] = timing
        return timing
    busy_since = _BUSY_TIMINGS.get(key)
    if busy_since is not None and time.monotonic() - busy_since[0] < BUSY_RETRY_AFTER_S:
        return busy_since[1]
    if time_fresh is None:
        raise PredictorError(f"this {host_cpu} host has no clean cached calibration ({path}) and no sweep was given "
                             "to time the suite (time_fresh=predictors.profiling.calibration_sweep.time_fresh)")
    restrict = num_threads if num_threads < _pool_threads() else None    # a CPU device on fewer cores
    with restricted_pool(restrict):
        if _pool_threads() != num_threads:
            raise PredictorError(f"the calibration suite must be timed with {num_threads} TVM thread(s); TVM's "
                                 f"pool runs {_pool_threads()}. Set TVM_NUM_THREADS={num_threads} before TVM "
                                 "starts (the hetpart CLI and API do).")
        logger.info("timing %d calibration kernels on this %s with %d thread(s) (kept in %s if the host stays "
                    "quiet)", len(specs), host_cpu, num_threads, path)
        timing = time_fresh(num_threads, tuple(specs))
    if not timing.clean:
        logger.info("host calibration timed on a busy host, not kept: %s", "; ".join(timing.judgement.reasons))
        _BUSY_TIMINGS[key] = (time.monotonic(), timing)
        return timing
    if len(timing.kernels) < MIN_MEASURED_SHARE * len(specs):
        raise PredictorError(f"only {len(timing.kernels)} of the {len(specs)} calibration kernels could be built and "
                             "timed on this host (see the warnings above): too few to scale a foreign CPU predictor. "
                             "Fit a predictor here: `hetpart profile --device cpu --budget-minutes 60 && hetpart fit`.")
    _save(path, timing, host_cpu, num_threads)
    _CLEAN_TIMINGS[key] = timing
    return timing


def measure_suite(host_cpu: str, num_threads: int, specs: tuple[SyntheticSpec, ...] = CALIBRATION_SUITE, *,
                  time_fresh: FreshTiming | None = None) -> tuple[CalibrationKernel, ...]:
    """The kernels of a clean :func:`time_suite`; raises :class:`PredictorError` when the host was busy."""
    timing = time_suite(host_cpu, num_threads, specs, time_fresh=time_fresh)
    if not timing.clean:
        raise PredictorError(f"the calibration suite timed on this {host_cpu} at {timing.measured_at} is not clean "
                             f"({'; '.join(timing.judgement.reasons)}); time it again on a quiet host")
    return timing.kernels


def suite_speed_ratio(predictor: Any, kernels: Sequence[CalibrationKernel]) -> tuple[float, list[dict[str, Any]]]:
    """Geometric mean over ``kernels`` of host latency / ``predictor``'s prediction, and the per-kernel rows."""
    if not kernels:
        raise PredictorError("the host calibration needs at least one timed kernel")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ExtrapolationWarning)
        predicted = np.asarray(predictor.predict([k.node for k in kernels]), dtype=np.float64)
    for warning in caught:
        logger.debug("predicting the calibration suite: %s", warning.message)
    if not np.all(np.isfinite(predicted) & (predicted > 0)):
        raise PredictorError(f"the CPU predictor gave non-positive latencies for the calibration suite: "
                             f"{predicted.tolist()}")
    host = np.array([k.host_us for k in kernels])
    ratio = float(np.exp(np.mean(np.log(host / predicted))))
    rows = [{"name": k.name, "host_us": float(h), "predicted_us": float(p)}
            for k, h, p in zip(kernels, host, predicted)]
    return ratio, rows


class _ScaledContext:
    """A predictor's in-model terms, multiplied by the speed ratio."""

    def __init__(self, terms: Any, ratio: float) -> None:
        self._terms, self._ratio = terms, ratio

    def extra_us(self, nodes: Sequence[OpNode]) -> np.ndarray:
        return np.asarray(self._terms.extra_us(list(nodes)), dtype=np.float64) * self._ratio


class HostScaledPredictor:
    """A fitted CPU predictor whose every prediction is multiplied by ``speed_ratio`` (host / where it was fitted).

    Same interface as :class:`~predictors.device_predictor.DevicePredictor` for costing (``predict``,
    ``predict_in_context``, ``context``, ``source``, ``target``, ``num_threads``, ``fit_info``, ``provenance``);
    the provenance gains a ``host_scaling`` entry (``scaling``): how the ratio was found, the host's CPU and
    threads, and the calibration kernels behind it."""

    def __init__(self, base: Any, speed_ratio: float, scaling: Mapping[str, Any]) -> None:
        if not (np.isfinite(speed_ratio) and speed_ratio > 0):
            raise PredictorError(f"a host speed ratio must be a positive number; found {speed_ratio!r}")
        self.base, self.speed_ratio = base, float(speed_ratio)
        self.scaling = {**scaling, "speed_ratio": self.speed_ratio,
                        "predictor_cpu": str(base.target.get("mcpu", "")), "predictor_threads": base.num_threads}
        base_context = getattr(base, "context", None)
        self.context = None if base_context is None else _ScaledContext(base_context, self.speed_ratio)
        self.device, self.source, self.target = base.device, base.source, base.target
        self.num_threads, self.fit_info = base.num_threads, base.fit_info

    @property
    def calibration(self) -> HostCalibration | None:
        """The calibration behind the ratio (None when it was not a calibration suite's, e.g. a canary ratio)."""
        status = self.scaling.get("calibration")
        return None if status is None else HostCalibration(str(status), self.speed_ratio,
                                                           self.scaling.get("measured_at"))

    def predict(self, nodes: Sequence[OpNode]) -> np.ndarray:
        return np.asarray(self.base.predict(nodes), dtype=np.float64) * self.speed_ratio

    def predict_in_context(self, nodes: Sequence[OpNode]) -> np.ndarray:
        from predictors.context import predict_in_context_us

        return predict_in_context_us(nodes, self)

    def provenance(self) -> dict[str, Any]:
        return {**self.base.provenance(), "host_scaling": dict(self.scaling)}


def scale_by_suite(base: Any, kernels: Sequence[CalibrationKernel], host_cpu: str, host_threads: int,
                   timing: SuiteTiming | None = None) -> HostScaledPredictor:
    """``base`` scaled by the suite ``kernels`` timed on this ``host_cpu`` with ``host_threads`` threads
    (``timing``, when given, records which calibration it was and when it was measured)."""
    ratio, rows = suite_speed_ratio(base, kernels)
    per_kernel = [r["host_us"] / r["predicted_us"] for r in rows]
    when = {} if timing is None else {"calibration": timing.origin, "measured_at": timing.measured_at}
    return HostScaledPredictor(base, ratio, {
        "method": "calibration_suite", "suite_version": SUITE_VERSION, "host_cpu": host_cpu,
        "host_threads": int(host_threads), "n_kernels": len(rows), **when,
        "kernel_ratio_min": float(min(per_kernel)), "kernel_ratio_max": float(max(per_kernel)), "kernels": rows})


def calibrate_to_host(base: Any, host_cpu: str, host_threads: int, *,
                      time_fresh: FreshTiming | None = None) -> tuple[Any, HostCalibration]:
    """``base`` scaled to this host by a clean calibration (cached, else timed now by ``time_fresh``), or ``base``
    itself with a ``none-fallback`` calibration saying why when the host was busy or the suite could not be timed
    (also when it must be timed and no ``time_fresh`` was given). Never raises for a busy host."""
    try:
        timing = time_suite(host_cpu, host_threads, time_fresh=time_fresh)
        scaled = scale_by_suite(base, timing.kernels, host_cpu, host_threads, timing) if timing.clean else None
    except HetpartError as exc:         # e.g. TVM's pool already runs another thread count than deployments
        reason = f"the calibration suite could not be timed: {str(exc).rstrip('.')}"
        return base, HostCalibration("none-fallback", None, None, reason)
    if scaled is None:
        unused = None
        if timing.kernels:
            try:
                unused = suite_speed_ratio(base, timing.kernels)[0]
            except PredictorError:
                pass
        told = f" x{unused:.2f}" if unused is not None else ""
        return base, HostCalibration("none-fallback", unused, timing.measured_at, (
            f"the host was busy while the calibration suite ran ({'; '.join(timing.judgement.reasons)}), so its "
            f"ratio{told} was neither used nor kept"))
    s = scaled.scaling
    logger.info("CPU predictor measured on %s (%s thread(s)) scaled to this %s host (%d thread(s)) by %d calibration "
                "kernels (%s, timed %s): x%.2f (per kernel x%.2f to x%.2f)", s["predictor_cpu"] or "an unrecorded "
                "CPU", base.num_threads or "?", host_cpu, host_threads, s["n_kernels"], timing.origin,
                timing.measured_at, scaled.speed_ratio, s["kernel_ratio_min"], s["kernel_ratio_max"])
    return scaled, HostCalibration(timing.origin, scaled.speed_ratio, timing.measured_at)
