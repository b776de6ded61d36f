"""Kernel latency *inside a model* from isolated kernel latencies: overhead, cold weights, spilled activations.

The profiler times each kernel in isolation, many calls in a row: its weights and activations stay in the
caches between calls. Inside a model, every other kernel runs in between. Measured on this 2-core EPYC (1 MiB L2
per core, 32 MiB L3), ResNet-18 at 112 px in the deployment VM (``relax.VirtualMachine.set_instrument``,
per-kernel wall time) vs isolated:

====================================  ==========  ==========  =========
kernel                                isolated µs  in model µs  weights
====================================  ==========  ==========  =========
conv 512->512 3x3 at 4x4              386         560         9.4 MB
matmul 512 x 1000 (classifier)        12.9        48.9        2.0 MB
conv 64->64 3x3 at 28x28              162         167         0.15 MB
====================================  ==========  ==========  =========

so the model (4.3-5.0 ms) took 1.3-1.5x the sum of its isolated kernels (3.3 ms). Three terms, fitted on
whole-model measurements (:func:`fit_context_terms`), turn isolated predictions into in-model ones:

* ``per_kernel_overhead_us`` — the VM's work per kernel call beyond what the isolated timing already includes
  (tensor allocation, argument checks). Fits give ~0 µs on this machine: the isolated labels already carry the
  call overhead;
* ``cold_param_us_per_mb`` — time per MB of *cold* parameters: a kernel's ``param_bytes`` when they fit in the
  last-level cache (``cache_bytes``; larger ones are cold in isolation too, so the label already pays for them)
  and the kernel is not a recurrent step (the ONNX RNN unroller tags step kernels ``rnn_phase="step"``: every
  step re-reads the same weights, which stay warm); a gather counts the rows it reads, not its table; and none
  of a model's weights are cold when they all take at most half the cache (:data:`WARM_MODEL_FRACTION`) -- or,
  under the ``cache_share`` rule ``hetpart fit`` uses (a predictor saved with the older rule keeps it), only the
  share the cache cannot keep between inferences (:meth:`ContextTerms.cold_param_bytes_in_model`, below);
* ``spilled_activation_us_per_mb`` — time per MB of activation traffic (``bytes_read + bytes_written -
  param_bytes``) beyond the cores' private caches (``core_cache_bytes``: L2 x cores in use, 2 MiB here), for
  kernels whose activations fit in the last-level cache. Timed in isolation such a kernel finds them in the
  shared L3; inside a model that streams more activations than the L3 holds, its output buffer and part of
  its input come from DRAM. Whole-model error with the *measured* kernel labels (leave-one-model-out over the
  23 zoo variants, ``model_level_floor``) fell from 6.8 % (worst 19.9 %, MobileNetV2 at batch 4) with the first
  two terms to 5.5 % (worst 14.7 %) with this one; thresholds of 1-8 MiB all gave 5.3-6.2 %, so the L2 size
  read from the machine is used rather than a tuned constant.

The last-level cache these terms take shares of is the bound :mod:`predictors.profiling.cache_probe` derives for the
profiled host (stored in the profile database): its probe, or sysfs's figure when the probe lies within the
smallest share of it; sysfs's figure alone only when there is no probe -- a VM may report a cache it does not get
(480 MiB on the 2-core Intel guest, which behaves like 48 MiB).

**Which weights are cold: the cache share rule.** Between two inferences a model streams its weights and its
activations through the last-level cache. A thrash-resistant LLC (adaptive insertion, as on current x86 parts)
keeps about ``cache / footprint`` of a cyclic working set that does not fit, so a model's cold weights are

    cold = Σ cold_param_bytes × (1 - min(1, cache_bytes / footprint))
    footprint = Σ cold_param_bytes + Σ activation traffic (bytes_read + bytes_written - param_bytes)

The older rule (``half_cache_gate``) counted all of a model's weights as cold once they took more than half the
cache, and none below. On the Intel host (48 MiB measured LLC) it could not tell ResNet-18 at 112 px from 224 px:
the same 47 MB of weights, but 6.5 MB of activation traffic against 26 MB; the models ran 1.27x and 1.37x the sum
of their isolated kernels. With measured kernel labels (``model_level_floor``, leave-one-model-out over the 23 zoo
variants of the Intel database I-A) the gate gave MAPE 9.4%, worst 25.8%; the cache share rule 6.3%, worst 15.2%. The
footprint is what could stay cached: weights larger than the cache (cold in isolation too) and recurrent steps'
weights are left out. The share is first-order (``cache / footprint``, chosen before measuring); sharper
retentions and other footprints were measured and not adopted (docs/predictors_history.md).

**How much of the cache a model keeps.** The cache probe measures how large a buffer the LLC holds when one loop
streams it over and over; between two inferences a model keeps less. ``benchmarks/composition.py`` replays a
model's kernel calls with their real buffers: on the Intel guest (probe: 48-64 MiB), ResNet-50 at 112 px (25 MB of
weights) ran each 512->512 3x3 conv (9.4 MB of weights) in 1.8 ms in model order against 0.9 ms when the same
call was repeated, and streaming 16 MiB through the cores' L2 between repeats did not reproduce it -- its weights
came from DRAM although the model's footprint is well under the probe's size. So the cache the terms assume is
fitted with the rates: :func:`fit_context_terms` solves for each share of the measured LLC in
:data:`CACHE_SHARES` and keeps the least-residual one (chosen on the training models only). With measured kernel
labels (``model_level_floor``, leave-one-model-out over the 23 zoo variants) the fitted share took the floor from
6.6% MAPE / 20.7% worst to 5.5% / 15.2% on the Intel database I-C (48 of 64 MiB chosen in every fold; the other
databases: docs/predictors_history.md). Predictors saved before keep the cache they stored. A fourth rate, for
the weights of kernels whose traffic fits in the cores' L2, and one core's L2 as the spill threshold were measured
and not adopted (same document).

All are fitted by non-negative least squares on relative error, so they never turn a latency negative.
Predictors saved before the third term load with it at 0, and those saved before the cache share rule keep the
half-cache gate (``cold_weight_rule``): their behaviour is unchanged.
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
from predictors.features import DEFAULT_CORE_CACHE_BYTES, member_ops

logger = logging.getLogger(__name__)

DEFAULT_CACHE_BYTES = 32 * 2 ** 20
# A model whose cold weights add up to at most this share of the last-level cache finds them there at the next
# inference (the rest of the cache holds its activations): its kernels pay no cold-weight term. Chosen a priori
# (half the cache), then confirmed with measured kernel labels (model_level_floor, leave-one-model-out): share 0
# (no gate) 5.0% MAPE, worst 18.3%; 0.5: 2.3%, worst 6.8%; 1.0: 3.7%, worst 12.1% (GoogLeNet's 26 MB and DenseNet's
# 32 MB then count as warm, 12% low). Database Z5-B in docs/predictors_history.md.
WARM_MODEL_FRACTION = 0.5
# How a model's cold weights are counted (see the module docstring): "cache_share" (what `hetpart fit` fits) or the
# older "half_cache_gate" (all or nothing at WARM_MODEL_FRACTION; predictors saved with it keep it).
COLD_WEIGHT_RULES = ("cache_share", "half_cache_gate")
# Shares of the measured last-level cache tried as the cache a model keeps between inferences (fitted with the
# rates, see "How much of the cache a model keeps" in the module docstring).
CACHE_SHARES = (0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0)
_GATHER_OPS = frozenset({"take", "gather_elements", "gather_nd", "index_tensor"})   # read rows, not the table


def _cpu_caches() -> list[tuple[int, int, str]]:
    """(level, size in bytes, shared_cpu_list) of every data/unified cache of every online CPU (Linux sysfs)."""
    caches = []
    for index in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cache/index*"):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            text = (index / "size").read_text().strip().upper()
            scale = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}.get(text[-1], 1)
            caches.append((int((index / "level").read_text()), int(text.rstrip("KMG")) * scale,
                           (index / "shared_cpu_list").read_text().strip()))
        except (OSError, ValueError, IndexError):
            continue
    return caches


def last_level_cache_bytes(default: int = DEFAULT_CACHE_BYTES) -> int:
    """Size of this machine's largest CPU cache (Linux sysfs), else ``default``."""
    sizes = [size for _, size, _ in _cpu_caches()]
    if not sizes:
        logger.info("cache size not readable on %s; assuming %d MiB", os.uname().sysname, default // 2 ** 20)
    return max(sizes) if sizes else default


def core_cache_bytes(threads: int | None = None, default: int = DEFAULT_CORE_CACHE_BYTES) -> int:
    """Combined L2 of the cores TVM's threads run on (``TVM_NUM_THREADS``, else all CPUs), else ``default``."""
    l2 = {shared: size for level, size, shared in _cpu_caches() if level == 2}
    if not l2:
        logger.info("L2 size not readable on %s; assuming %d MiB in total", os.uname().sysname, default // 2 ** 20)
        return default
    if threads is None:
        threads = int(os.environ.get("TVM_NUM_THREADS", "0") or 0) or os.cpu_count() or 1
    sizes = sorted(l2.values(), reverse=True)
    return int(sum(sizes[:max(1, threads)]))


@dataclass(frozen=True)
class ContextTerms:
    """Additive in-model costs of one device (see the module docstring)."""

    per_kernel_overhead_us: float = 0.0
    cold_param_us_per_mb: float = 0.0
    cache_bytes: int = DEFAULT_CACHE_BYTES
    spilled_activation_us_per_mb: float = 0.0
    core_cache_bytes: int = DEFAULT_CORE_CACHE_BYTES
    cold_weight_rule: str = "cache_share"

    def validate(self) -> "ContextTerms":
        rates = (self.per_kernel_overhead_us, self.cold_param_us_per_mb, self.spilled_activation_us_per_mb)
        if not all(np.isfinite(r) and r >= 0 for r in rates) or self.cache_bytes <= 0 or self.core_cache_bytes <= 0:
            raise PredictorError(f"context terms must be finite and >= 0 with positive cache sizes; found {self}. "
                                 "Refit them with `hetpart fit`.")
        if self.cold_weight_rule not in COLD_WEIGHT_RULES:
            raise PredictorError(f"cold_weight_rule must be one of {COLD_WEIGHT_RULES}; found "
                                 f"{self.cold_weight_rule!r}. Refit the predictor with `hetpart fit`.")
        return self

    def cold_param_bytes(self, node: OpNode) -> float:
        """Parameter bytes this kernel reads from DRAM inside a model but from cache when timed in isolation.

        A gather (``take``: an embedding lookup) reads only the rows it outputs, not its whole table: BERT-small's
        31 MB embedding counted whole made its in-model prediction 39% high with measured kernel labels."""
        if node.tags.get("rnn_phase") == "step" or node.param_bytes > self.cache_bytes:
            return 0.0
        if _GATHER_OPS & set(member_ops(node)):
            return float(min(node.param_bytes, node.bytes_written))
        return float(node.param_bytes)

    def cold_param_bytes_in_model(self, nodes: Sequence[OpNode]) -> np.ndarray:
        """Bytes of each kernel's weights that one run of the model (``nodes``: all its kernels) reads from DRAM.

        ``cache_share``: :meth:`cold_param_bytes` times the share of the model's footprint the last-level cache
        cannot keep, ``1 - min(1, cache_bytes / footprint)`` (module docstring). ``half_cache_gate``: all of
        them, or none when they total at most half the cache."""
        cold = np.array([self.cold_param_bytes(n) for n in nodes], dtype=np.float64)
        if self.cold_weight_rule == "half_cache_gate":
            return np.zeros_like(cold) if cold.sum() <= WARM_MODEL_FRACTION * self.cache_bytes else cold
        footprint = cold.sum() + sum(max(0, n.bytes_read + n.bytes_written - n.param_bytes) for n in nodes)
        return cold * (1.0 - min(1.0, self.cache_bytes / footprint)) if footprint > 0 else cold

    def spilled_activation_bytes(self, node: OpNode) -> float:
        """Activation bytes beyond the cores' caches that come from L3 in isolation but from DRAM in a model."""
        activation = node.bytes_read + node.bytes_written - node.param_bytes
        if activation > self.cache_bytes:
            return 0.0                     # streamed from DRAM in isolation too: the label already pays for it
        return float(max(0, activation - self.core_cache_bytes))

    def extra_us(self, nodes: Sequence[OpNode]) -> np.ndarray:
        """In-model latency minus isolated latency of each node (µs). ``nodes`` are all the kernels of one model
        run: whether its weights stay warm depends on their total (:meth:`cold_param_bytes_in_model`)."""
        cold_mb = self.cold_param_bytes_in_model(nodes) / 1e6
        spilled_mb = np.array([self.spilled_activation_bytes(n) for n in nodes], dtype=np.float64) / 1e6
        return (self.per_kernel_overhead_us + self.cold_param_us_per_mb * cold_mb
                + self.spilled_activation_us_per_mb * spilled_mb)

    def to_dict(self) -> dict[str, Any]:
        return {"per_kernel_overhead_us": self.per_kernel_overhead_us,
                "cold_param_us_per_mb": self.cold_param_us_per_mb, "cache_bytes": self.cache_bytes,
                "spilled_activation_us_per_mb": self.spilled_activation_us_per_mb,
                "core_cache_bytes": self.core_cache_bytes, "cold_weight_rule": self.cold_weight_rule}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ContextTerms":
        try:     # files written before the activation term: the term is absent and stays 0; before the cache
            # share rule: they keep the half-cache gate their cold-weight rate was fitted with
            return cls(float(data["per_kernel_overhead_us"]), float(data["cold_param_us_per_mb"]),
                       int(data["cache_bytes"]), float(data.get("spilled_activation_us_per_mb", 0.0)),
                       int(data.get("core_cache_bytes", DEFAULT_CORE_CACHE_BYTES)),
                       str(data.get("cold_weight_rule", "half_cache_gate"))).validate()
        except (KeyError, TypeError, ValueError) as exc:
            raise PredictorError(f"malformed context terms {data!r} ({exc}); refit with `hetpart fit`") from exc


def fit_context_terms(predictor: Any, models: Iterable[tuple[Sequence[OpNode], float]],
                      cache_bytes: int | None = None, core_cache: int | None = None,
                      cache_shares: Sequence[float] = CACHE_SHARES) -> ContextTerms:
    """Fit the terms so that ``measured ≈ Σ isolated predictions + Σ extra_us`` in relative error.

    Each model contributes one equation ``n·o + cold_MB·c + spilled_MB·a = measured - predicted``, weighted by
    1/measured; ``o, c, a >= 0`` (bounded least squares). Cache sizes default to this machine's.

    The last-level cache the terms assume is fitted as well: the fit is solved for each share of ``cache_bytes``
    in ``cache_shares`` and the one with the least squared residual is kept (on a tie the larger cache). Pass
    ``cache_shares=(1.0,)`` to use ``cache_bytes`` as it is.
    """
    cache = int(cache_bytes if cache_bytes is not None else last_level_cache_bytes())
    core = int(core_cache if core_cache is not None else core_cache_bytes())
    if not cache_shares or not all(0.0 < share <= 1.0 for share in cache_shares):
        raise PredictorError(f"cache_shares must be a non-empty list of shares in (0, 1]; found {cache_shares!r}")
    data = []
    for nodes, measured_us in models:
        nodes = list(nodes)
        if not nodes or not measured_us > 0:
            raise PredictorError(f"each model needs >= 1 kernel and a measured latency > 0; found "
                                 f"{len(nodes)} kernels, {measured_us} µs")
        data.append((nodes, float(measured_us), float(np.sum(predictor.predict(nodes)))))
    if not data:
        raise PredictorError("fitting the in-model terms needs at least one whole-model measurement")
    best: tuple[float, ContextTerms] | None = None
    for share in sorted(set(cache_shares), reverse=True):
        geometry = ContextTerms(cache_bytes=max(1, int(cache * share)), core_cache_bytes=core)
        rows, rhs = [], []
        for nodes, measured_us, predicted in data:
            cold_mb = float(geometry.cold_param_bytes_in_model(nodes).sum()) / 1e6
            spilled_mb = sum(geometry.spilled_activation_bytes(n) for n in nodes) / 1e6
            rows.append([len(nodes) / measured_us, cold_mb / measured_us, spilled_mb / measured_us])
            rhs.append((measured_us - predicted) / measured_us)
        fit = lsq_linear(np.array(rows), np.array(rhs), bounds=(0.0, np.inf), method="bvls")
        terms = ContextTerms(float(fit.x[0]), float(fit.x[1]), geometry.cache_bytes, float(fit.x[2]), core).validate()
        if best is None or fit.cost < best[0] * (1.0 - 1e-9) - 1e-12:     # a real improvement, not rounding
            best = (float(fit.cost), terms)
    assert best is not None
    if best[1].cache_bytes != cache:
        logger.debug("in-model terms: a model keeps %.0f MiB of the %.0f MiB last-level cache between inferences "
                     "(fitted share %.3f)", best[1].cache_bytes / 2 ** 20, cache / 2 ** 20, best[1].cache_bytes / cache)
    return best[1]


def predict_in_context_us(nodes: Sequence[OpNode], predictor: Any) -> np.ndarray:
    """Per-kernel latency inside a model: isolated prediction + the predictor's context terms (if any).
    ``nodes`` are all the kernels of one model run (see :meth:`ContextTerms.extra_us`)."""
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
