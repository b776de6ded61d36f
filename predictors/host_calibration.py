"""Use a CPU predictor on a CPU, or with a thread count, it was not measured with: scale it by a calibration suite.

A CPU predictor's labels are kernel timings on one CPU with one TVM thread count. When hetpart has no predictor for
this host's CPU, or the deployment runs another thread count, :func:`scale_to_host` times a fixed suite of kernels
here (:data:`CALIBRATION_SUITE`: the kinds the zoo's time goes to -- 3x3, 1x1 and weight-heavy convolutions, a
depthwise convolution, a matrix-vector product, a matmul, a max-pool, a streaming and a transcendental elementwise
kernel, a layer norm -- built by :func:`predictors.synthetic_modules.build_synthetic_module` and compiled and timed exactly
like profiled kernels), asks the predictor for the same kernels, and multiplies every prediction (isolated kernels
and the in-model terms) by the geometric mean of measured / predicted (:class:`HostScaledPredictor`). The suite's
timings are kept in ``$HETPART_CACHE_DIR/calibration/`` per CPU, thread count, suite, CPU rules and TVM version, so
a host pays for them (~5 s) once.

**Why a suite, not one kernel.** Until session 17 the ratio was that of the profiler's canary alone (a 256^3
matmul). CPUs do not differ by one factor, and a matmul is where they differ most: Zen 4 executes AVX-512 on 256-bit
units, so the canary took 2.08x as long on this machine kind's Zen 4 host as on its Zen 5 host while the zoo's
models took a median 1.57x as long as the Zen 5 predictor predicts; the Intel guest ran the canary 1.40x as fast as
Zen 4, while its predictor matched Zen 4's models at a median 0.91x. Measured on the Zen 4 host against
profiles_session17a (``benchmarks/results/predictor_transfer_*_on_znver4.md``), whole-model MAPE over the 23 zoo
variants:

=====================================  ========  =============  =========================
predictor                              unscaled  canary-scaled  suite-scaled (this module)
=====================================  ========  =============  =========================
Zen 5 (``cpu_default.json``)           35.5%     34.1% (x2.08)  12.7% (x1.44)
Intel (``cpu_rocketlake.json``)        27.7%     64.6% (x1.40)  25.7% (x0.81)
=====================================  ========  =============  =========================

The Zen 5 predictor was fitted in session 10 on kernels of older CPU rules (it records no rules version), so part
of its error is not the CPU's. One ratio
is still a first-order correction, not a model of the new CPU: the Intel predictor's batch-1 recurrent models stay
1.6-1.7x high on Zen 4 after scaling (their 6.8 MB matrix-vector products stream at ~150 GB/s on Zen 4, at 50-63 GB/s
on the Intel guest once they leave its L2), and its calibrated ratios span x0.41 to x1.24 per kernel. A predictor
fitted on the host (``hetpart profile`` + ``hetpart fit``) is the real fix, and
:func:`hetpart.compiler.load_cpu_predictor` only scales when there is none.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from hetpart.errors import ExtrapolationWarning, PredictorError
from hetpart.graph import OpNode
from hetpart.paths import cache_root
from predictors.sampling import SyntheticSpec

logger = logging.getLogger(__name__)

# Bump when a kernel of the suite changes: cached host timings of another version are measured again.
SUITE_VERSION = 1
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
MIN_MEASURED_SHARE = 0.5   # below this share of the suite timed cleanly, the ratio is not trusted
# Sweeps over the suite, keeping each kernel's lowest median: a predictor's labels are the lowest of
# ``hetpart profile``'s passes, and contention only adds time. Against the Zen 4 host's own predictor (session 17)
# one sweep put the suite (geometric mean) 5.8% above its labels, two sweeps 3.4% and 3.8%. ~5 s in all.
SUITE_PASSES = 2


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


def suite_cache_path(host_cpu: str, num_threads: int, specs: Sequence[SyntheticSpec] = CALIBRATION_SUITE) -> Path:
    """Where this host's timings of ``specs`` are kept: one file per CPU, thread count, suite, CPU rules and TVM."""
    import tvm

    from predictors.zoo_profile import PIPELINE_VERSION

    ident = json.dumps([SUITE_VERSION, [s.name for s in specs], PIPELINE_VERSION, tvm.__version__])
    digest = hashlib.sha256(ident.encode()).hexdigest()[:12]
    return cache_root() / "calibration" / f"{host_cpu or 'cpu'}_{num_threads}threads_{digest}.json"


def _load_cached(path: Path) -> tuple[CalibrationKernel, ...] | None:
    if not path.exists():
        return None
    try:
        return tuple(CalibrationKernel.from_dict(k) for k in json.loads(path.read_text())["kernels"])
    except (OSError, ValueError, KeyError, TypeError, PredictorError) as exc:
        logger.warning("ignoring the unreadable host calibration %s (%s); timing the suite again", path, exc)
        return None


def _save(path: Path, kernels: Sequence[CalibrationKernel], host_cpu: str, num_threads: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"suite_version": SUITE_VERSION, "host_cpu": host_cpu, "num_threads": num_threads,
               "kernels": [k.to_dict() for k in kernels]}
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        json.dump(payload, handle)
    os.replace(tmp, path)       # atomic: a concurrent reader sees the old file or the new one


@functools.lru_cache(maxsize=4)
def measure_suite(host_cpu: str, num_threads: int,
                  specs: tuple[SyntheticSpec, ...] = CALIBRATION_SUITE) -> tuple[CalibrationKernel, ...]:
    """The suite's kernels timed on this host with ``num_threads`` TVM threads (which must be the pool's count).

    Read from :func:`suite_cache_path` when this host timed them before; else compiled and timed with the
    profiler's protocol (canary windows, re-measured while noisy) and written there. Once per process."""
    from predictors.kernel_mapping import map_kernels
    from predictors.profiler import KernelProfiler, num_threads as pool_threads
    from predictors.synthetic_modules import build_synthetic_module

    if pool_threads() != num_threads:
        raise PredictorError(f"the calibration suite must be timed with the deployment's {num_threads} TVM "
                             f"thread(s); TVM's pool runs {pool_threads()}. Set TVM_NUM_THREADS={num_threads} "
                             "before TVM starts (the hetpart CLI and API do).")
    path = suite_cache_path(host_cpu, num_threads, specs)
    cached = _load_cached(path)
    if cached is not None:
        logger.info("host calibration: %d kernels timed on this %s with %d thread(s), from %s", len(cached),
                    host_cpu, num_threads, path)
        return cached
    logger.info("timing %d calibration kernels on this %s with %d thread(s) (once; kept in %s)", len(specs),
                host_cpu, num_threads, path)
    profiler = KernelProfiler("cpu")
    workloads = [(f"{spec.name}/{w.name}", w) for spec in specs
                 for w in map_kernels(build_synthetic_module(spec), spec.name, profiler).workloads]
    best: dict[str, float] = {}
    for _ in range(SUITE_PASSES):
        for name, workload in workloads:
            row = profiler.measure(workload)
            if row.status == "ok" and row.median_us:
                best[name] = min(best.get(name, np.inf), float(row.median_us))
            else:
                logger.warning("calibration kernel %s: %s %s", name, row.status, row.error)
    kernels = [CalibrationKernel(name, OpNode.from_dict(w.features), best[name]) for name, w in workloads
               if name in best]
    if len(kernels) < MIN_MEASURED_SHARE * len(specs):
        raise PredictorError(f"only {len(kernels)} of the {len(specs)} calibration kernels were timed cleanly on this "
                             "host (it is busy, or kernels failed to build; see the warnings above): too few to scale "
                             "a foreign CPU predictor. Retry on a quiet host, or fit a predictor here: `hetpart "
                             "profile --device cpu --budget-minutes 60 && hetpart fit`.")
    _save(path, kernels, host_cpu, num_threads)
    return tuple(kernels)


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

    def predict(self, nodes: Sequence[OpNode]) -> np.ndarray:
        return np.asarray(self.base.predict(nodes), dtype=np.float64) * self.speed_ratio

    def predict_in_context(self, nodes: Sequence[OpNode]) -> np.ndarray:
        from predictors.context import predict_in_context_us

        return predict_in_context_us(nodes, self)

    def provenance(self) -> dict[str, Any]:
        return {**self.base.provenance(), "host_scaling": dict(self.scaling)}


def scale_by_suite(base: Any, kernels: Sequence[CalibrationKernel], host_cpu: str,
                   host_threads: int) -> HostScaledPredictor:
    """``base`` scaled by the suite ``kernels`` timed on this ``host_cpu`` with ``host_threads`` threads."""
    ratio, rows = suite_speed_ratio(base, kernels)
    per_kernel = [r["host_us"] / r["predicted_us"] for r in rows]
    return HostScaledPredictor(base, ratio, {
        "method": "calibration_suite", "suite_version": SUITE_VERSION, "host_cpu": host_cpu,
        "host_threads": int(host_threads), "n_kernels": len(rows),
        "kernel_ratio_min": float(min(per_kernel)), "kernel_ratio_max": float(max(per_kernel)), "kernels": rows})


def scale_to_host(base: Any, host_cpu: str, host_threads: int) -> HostScaledPredictor:
    """``base`` scaled to this host: times the calibration suite here (:func:`measure_suite`, cached) and wraps it."""
    scaled = scale_by_suite(base, measure_suite(host_cpu, host_threads), host_cpu, host_threads)
    s = scaled.scaling
    logger.info("CPU predictor measured on %s (%s thread(s)) scaled to this %s host (%d thread(s)) by %d calibration "
                "kernels: x%.2f (per kernel x%.2f to x%.2f)", s["predictor_cpu"] or "an unrecorded CPU",
                base.num_threads or "?", host_cpu, host_threads, s["n_kernels"], scaled.speed_ratio,
                s["kernel_ratio_min"], s["kernel_ratio_max"])
    return scaled
