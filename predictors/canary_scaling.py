"""Use a CPU predictor on a CPU it was not measured on: scale its predictions by the canary's speed ratio.

Every label a CPU predictor was fitted on is on the scale of the profiler's canary (a 256x256x256 float32 matmul
compiled like every kernel, ``canary_reference_us`` in the predictor's provenance). Timing that same canary on this
host, with the deployment's TVM thread count, gives one number for how much slower or faster this host runs
compute-bound kernels than the CPU the predictor was measured on. :class:`CanaryScaledPredictor` multiplies every
prediction -- isolated kernels and the in-model terms -- by ``host canary / predictor canary``.

One ratio is a first-order correction, not a fitted model of the new CPU: memory-bound and launch-bound kernels
do not scale like a matmul. ``benchmarks/predictor_transfer.py`` measures how much of the error it removes
(``benchmarks/results/predictor_transfer*.md``); a predictor fitted on the host (``hetpart profile`` +
``hetpart fit``) is the real fix, and :func:`hetpart.compiler.load_cpu_predictor` only scales when it has none.
"""
from __future__ import annotations

import functools
import logging
from typing import Any, Sequence

import numpy as np

from hetpart.errors import PredictorError
from hetpart.graph import OpNode

logger = logging.getLogger(__name__)

CANARY_TRIES = 5     # canary timings on the host; their median is used (each is itself a median of >= 7 repeats)


def predictor_canary_us(predictor: Any) -> float | None:
    """The canary latency (µs) the predictor's labels are normalised to, or None if its provenance lacks it."""
    training = getattr(predictor, "fit_info", {}).get("training") or {}
    value = training.get("canary_reference_us")
    return float(value) if value and value > 0 else None


@functools.lru_cache(maxsize=4)
def host_canary_us(num_threads: int, tries: int = CANARY_TRIES) -> float:
    """Time the profiler's canary on this host's CPU (``num_threads`` must be the TVM pool's thread count: it is
    part of the cache key and checked). Measured once per process and thread count; about a second."""
    from predictors.profiler import KernelProfiler, num_threads as pool_threads

    if pool_threads() != num_threads:
        raise PredictorError(f"the host canary must be timed with the deployment's {num_threads} TVM thread(s); "
                             f"TVM's pool runs {pool_threads()}. Set TVM_NUM_THREADS={num_threads} before TVM "
                             "starts (the hetpart CLI and API do).")
    profiler = KernelProfiler("cpu")
    values = [profiler.canary_us() for _ in range(tries)]
    logger.info("canary on this host (%d thread(s)): %s µs", num_threads, ", ".join(f"{v:.1f}" for v in values))
    return float(np.median(values))


class _ScaledContext:
    """A predictor's in-model terms, multiplied by the speed ratio."""

    def __init__(self, terms: Any, ratio: float) -> None:
        self._terms, self._ratio = terms, ratio

    def extra_us(self, nodes: Sequence[OpNode]) -> np.ndarray:
        return np.asarray(self._terms.extra_us(list(nodes)), dtype=np.float64) * self._ratio


class CanaryScaledPredictor:
    """A fitted CPU predictor whose every prediction is multiplied by ``host_canary_us / predictor canary``.

    Same interface as :class:`~predictors.device_predictor.DevicePredictor` for costing (``predict``,
    ``predict_in_context``, ``context``, ``source``, ``target``, ``num_threads``, ``fit_info``, ``provenance``);
    the provenance gains a ``canary_scaling`` entry with both canaries, the ratio and the host's CPU."""

    def __init__(self, base: Any, host_canary_us: float, host_cpu: str, host_threads: int) -> None:
        reference = predictor_canary_us(base)
        if reference is None:
            raise PredictorError("this CPU predictor records no canary latency (provenance training."
                                 "canary_reference_us), so it cannot be scaled to another CPU; refit it with "
                                 "`hetpart fit` or fit one on this host")
        if not host_canary_us > 0:
            raise PredictorError(f"the host canary must be a positive latency; found {host_canary_us!r} µs")
        self.base = base
        self.speed_ratio = float(host_canary_us) / reference
        self.scaling = {"host_cpu": host_cpu, "host_threads": int(host_threads),
                        "host_canary_us": float(host_canary_us), "predictor_canary_us": reference,
                        "predictor_cpu": str(base.target.get("mcpu", "")), "speed_ratio": self.speed_ratio}
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
        return {**self.base.provenance(), "canary_scaling": dict(self.scaling)}


def scale_to_host(base: Any, host_cpu: str, host_threads: int) -> CanaryScaledPredictor:
    """``base`` scaled to this host: times the canary here (:func:`host_canary_us`) and wraps ``base``."""
    scaled = CanaryScaledPredictor(base, host_canary_us(host_threads), host_cpu, host_threads)
    s = scaled.scaling
    logger.info("CPU predictor measured on %s (canary %.1f µs, %s thread(s)) scaled to this %s host (canary %.1f µs, "
                "%d thread(s)): x%.2f", s["predictor_cpu"] or "an unrecorded CPU", s["predictor_canary_us"],
                base.num_threads or "?", host_cpu, s["host_canary_us"], host_threads, scaled.speed_ratio)
    return scaled
