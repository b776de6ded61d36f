"""Kernel latency *inside a model* from isolated kernel latencies: per-kernel overhead + cold weights.

The profiler times each kernel in isolation, many calls in a row: its weights stay in the last-level cache
between calls. Inside a model, every other kernel runs in between, so a kernel whose weights are read once per
inference streams them from DRAM. Measured on this 2-core EPYC (32 MiB L3), ResNet-18 at 112 px in the
deployment VM (``relax.VirtualMachine.set_instrument``, per-kernel wall time) vs isolated:

====================================  ==========  ==========  =========
kernel                                isolated µs  in model µs  weights
====================================  ==========  ==========  =========
conv 512->512 3x3 at 4x4              386         560         9.4 MB
matmul 512 x 1000 (classifier)        12.9        48.9        2.0 MB
conv 64->64 3x3 at 28x28              162         167         0.15 MB
====================================  ==========  ==========  =========

so the model (4.3-5.0 ms) took 1.3-1.5x the sum of its isolated kernels (3.3 ms). Two terms, fitted on
whole-model measurements (:func:`fit_context_terms`), turn isolated predictions into in-model ones:

* ``per_kernel_overhead_us`` — the VM's work per kernel call beyond what the isolated timing already includes
  (tensor allocation, argument checks). The fit on the zoo database (``predictors/data/cpu_default.json``) gives
  0 µs: the isolated labels already carry the call overhead, and the cold-weight term explains the gap;
* ``cold_param_us_per_mb`` — time per MB of *cold* parameters: a kernel's ``param_bytes`` when they fit in the
  last-level cache (``cache_bytes``; larger ones are cold in isolation too, so the label already pays for them)
  and the kernel is not a recurrent step (the ONNX RNN unroller tags step kernels ``rnn_phase="step"``: every
  step re-reads the same weights, which stay warm).

Both are fitted by non-negative least squares on relative error, so they never turn a latency negative.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from scipy.optimize import lsq_linear

from hetpart.errors import PredictorError
from hetpart.graph import OpGraph, OpNode

logger = logging.getLogger(__name__)

DEFAULT_CACHE_BYTES = 32 * 2 ** 20


def last_level_cache_bytes(default: int = DEFAULT_CACHE_BYTES) -> int:
    """Size of this machine's largest CPU cache (Linux sysfs), else ``default``."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip().upper()
        try:
            scale = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}.get(text[-1], 1)
            sizes.append(int(text.rstrip("KMG")) * scale)
        except (ValueError, IndexError):
            continue
    if not sizes:
        logger.info("cache size not readable on %s; assuming %d MiB", os.uname().sysname, default // 2 ** 20)
    return max(sizes) if sizes else default


@dataclass(frozen=True)
class ContextTerms:
    """Additive in-model costs of one device (see the module docstring)."""

    per_kernel_overhead_us: float = 0.0
    cold_param_us_per_mb: float = 0.0
    cache_bytes: int = DEFAULT_CACHE_BYTES

    def validate(self) -> "ContextTerms":
        if not (np.isfinite(self.per_kernel_overhead_us) and np.isfinite(self.cold_param_us_per_mb)) \
                or self.per_kernel_overhead_us < 0 or self.cold_param_us_per_mb < 0 or self.cache_bytes <= 0:
            raise PredictorError(f"context terms must be finite and >= 0 with a positive cache size; found {self}. "
                                 "Refit them with `hetpart fit`.")
        return self

    def cold_param_bytes(self, node: OpNode) -> float:
        """Parameter bytes this kernel reads from DRAM inside a model but from cache when timed in isolation."""
        if node.tags.get("rnn_phase") == "step" or node.param_bytes > self.cache_bytes:
            return 0.0
        return float(node.param_bytes)

    def extra_us(self, nodes: Sequence[OpNode]) -> np.ndarray:
        """In-model latency minus isolated latency of each node (µs)."""
        cold_mb = np.array([self.cold_param_bytes(n) for n in nodes], dtype=np.float64) / 1e6
        return self.per_kernel_overhead_us + self.cold_param_us_per_mb * cold_mb

    def to_dict(self) -> dict[str, Any]:
        return {"per_kernel_overhead_us": self.per_kernel_overhead_us,
                "cold_param_us_per_mb": self.cold_param_us_per_mb, "cache_bytes": self.cache_bytes}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ContextTerms":
        try:
            return cls(float(data["per_kernel_overhead_us"]), float(data["cold_param_us_per_mb"]),
                       int(data["cache_bytes"])).validate()
        except (KeyError, TypeError, ValueError) as exc:
            raise PredictorError(f"malformed context terms {data!r} ({exc}); refit with `hetpart fit`") from exc


def fit_context_terms(predictor: Any, models: Iterable[tuple[Sequence[OpNode], float]],
                      cache_bytes: int | None = None) -> ContextTerms:
    """Fit both terms so that ``measured ≈ Σ isolated predictions + Σ extra_us`` in relative error.

    Each model contributes one equation ``n·o + cold_MB·c = measured - predicted``, weighted by 1/measured;
    ``o, c >= 0`` (bounded least squares).
    """
    cache = int(cache_bytes if cache_bytes is not None else last_level_cache_bytes())
    probe = ContextTerms(0.0, 1.0, cache)
    rows, rhs = [], []
    for nodes, measured_us in models:
        nodes = list(nodes)
        if not nodes or not measured_us > 0:
            raise PredictorError(f"each model needs >= 1 kernel and a measured latency > 0; found "
                                 f"{len(nodes)} kernels, {measured_us} µs")
        predicted = float(np.sum(predictor.predict(nodes)))
        cold_mb = float(np.sum(probe.extra_us(nodes)))
        rows.append([len(nodes) / measured_us, cold_mb / measured_us])
        rhs.append((measured_us - predicted) / measured_us)
    if not rows:
        raise PredictorError("fitting the in-model terms needs at least one whole-model measurement")
    solution = lsq_linear(np.array(rows), np.array(rhs), bounds=(0.0, np.inf), method="bvls").x
    return ContextTerms(float(solution[0]), float(solution[1]), cache).validate()


def predict_in_context_us(nodes: Sequence[OpNode], predictor: Any) -> np.ndarray:
    """Per-kernel latency inside a model: isolated prediction + the predictor's context terms (if any)."""
    isolated = np.asarray(predictor.predict(list(nodes)), dtype=np.float64)
    terms = getattr(predictor, "context", None)
    return isolated if terms is None else isolated + terms.extra_us(list(nodes))


def predict_model_latency_us(graph: OpGraph, predictor: Any) -> float:
    """Whole-model latency on ONE device: the sum of in-model kernel latencies.

    A single device runs one kernel at a time, so its critical path through the dependency graph is the sum of
    all kernel latencies in topological order (what the simulator's single-device timeline gives).
    """
    if graph.level != "kernel":
        raise PredictorError(f"predict_model_latency_us needs a kernel-level graph; {graph.name!r} is "
                             f"{graph.level!r}-level. Pass graph.kernel_graph().")
    if not graph.nodes:
        raise PredictorError(f"graph {graph.name!r} has no kernels")
    total = float(np.sum(predict_in_context_us(graph.nodes, predictor)))
    if not np.isfinite(total) or total <= 0:
        raise PredictorError(f"predicted model latency {total} µs of {graph.name!r} is not positive; refit the "
                             "predictor with `hetpart fit`")
    return total
