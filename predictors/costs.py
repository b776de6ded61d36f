"""Build a :class:`hetpart.costs.CostTable` for an OpGraph from per-device predictors (and measurements).

Each device of the :class:`~hetpart.devices.DeviceSet` needs a predictor: any object with
``predict(nodes) -> np.ndarray`` (µs) and a ``source`` attribute — ``"predicted"`` for a fitted
:class:`~predictors.device_predictor.DevicePredictor`, ``"analytic"`` for
:class:`~predictors.analytic.AnalyticGpuModel`.
On a kernel-level graph the predictor's in-model terms (``predictor.context``, when it has them) are added: the
kernel's latency inside a model, not in isolation. Entries found in ``measured`` replace predictions and are
labelled ``"measured"``. Copy links come from the DeviceSet (the CostTable reads them from there).

Support (unless ``supported`` is given): every op runs on a CPU. On a GPU, ops that compute only shapes or
metadata (``node.shape_only``, or shape ops such as ``shape_of`` / ``tensor_to_shape`` / ``shape_to_tensor``)
are **not** supported: their results are host values the VM consumes on the CPU, so they stay there.
"""
from __future__ import annotations

import logging
from typing import Any, Mapping

import numpy as np

from hetpart.costs import SOURCES, CostTable
from hetpart.devices import DeviceSet
from hetpart.errors import InvalidCostTableError, PredictorError
from hetpart.graph import OpGraph, OpNode
from predictors.context import predict_in_context_us
from predictors.features import member_ops

logger = logging.getLogger(__name__)

HOST_ONLY_OPS = frozenset({"shape_of", "tensor_to_shape", "shape_to_tensor", "null_value", "print", "assert_op",
                           "call_pure_packed", "call_packed"})


def gpu_supports(node: OpNode) -> bool:
    """Whether a GPU can run this op/kernel (see the module docstring)."""
    return not node.shape_only and not any(op in HOST_ONLY_OPS for op in member_ops(node))


def default_supported(graph: OpGraph, devices: DeviceSet) -> np.ndarray:
    """Bool [n_ops, n_devices]: CPUs run everything, GPUs everything but host-only shape ops."""
    gpu_ok = np.array([gpu_supports(n) for n in graph.nodes], dtype=bool)
    return np.stack([np.ones(len(graph.nodes), dtype=bool) if d.kind == "cpu" else gpu_ok
                     for d in devices.devices], axis=1).reshape(len(graph.nodes), len(devices.devices))


def build_cost_table(graph: OpGraph, predictors: Mapping[str, Any], devices: DeviceSet,
                     supported: np.ndarray | None = None,
                     measured: Mapping[str, Mapping[int, float]] | None = None) -> CostTable:
    """Latency of every node of ``graph`` on every device of ``devices``.

    ``predictors`` maps device name -> predictor; a device without one raises :class:`PredictorError`.
    ``measured`` maps device name -> {op id: measured latency µs}; those entries are labelled ``measured``.
    ``supported`` (bool [n_ops, n_devices]) overrides :func:`default_supported`.
    """
    devices.validate()
    graph.validate()
    n, names = len(graph.nodes), devices.names
    missing = [d for d in names if d not in predictors and not _fully_measured(measured, d, n)]
    if missing:
        raise PredictorError(f"no latency predictor for device(s) {missing}; every device needs one "
                             f"(given: {sorted(predictors)}). Fit one with `hetpart fit` or use an analytic preset.")
    sup = default_supported(graph, devices) if supported is None else np.asarray(supported, dtype=bool)
    if sup.shape != (n, len(names)):
        raise InvalidCostTableError(f"supported must be [{n}, {len(names)}] (ops x devices); found {sup.shape}")
    latency = np.full((n, len(names)), np.nan)
    source = np.full((n, len(names)), "predicted", dtype=object)
    provenance: dict[str, Any] = {"devices": {}}
    for d, name in enumerate(names):
        spec = devices.devices[d]
        rows = np.flatnonzero(sup[:, d])
        predictor = predictors.get(name)
        if predictor is not None:
            _check_target(predictor, spec, name)
            label = getattr(predictor, "source", "predicted")
            if label not in SOURCES:
                raise PredictorError(f"predictor for {name!r} has source {label!r}; expected one of {SOURCES}")
            if len(rows):
                values = np.asarray(predict(predictor, [graph.nodes[i] for i in rows], graph.level), dtype=np.float64)
                if values.shape != (len(rows),) or not np.all(np.isfinite(values)) or np.any(values < 0):
                    raise PredictorError(f"predictor for {name!r} returned invalid latencies (must be finite, "
                                         f">= 0, one per op); got shape {values.shape}")
                latency[rows, d] = values
            source[:, d] = label
            provenance["devices"][name] = predictor.provenance() if hasattr(predictor, "provenance") else {}
        else:
            source[:, d] = "measured"
            provenance["devices"][name] = {"source": "measured"}
        for op_id, value in (measured or {}).get(name, {}).items():
            if not 0 <= op_id < n:
                raise InvalidCostTableError(f"measured latency for op {op_id} on {name!r}: the graph has ops "
                                            f"0..{n - 1}")
            latency[op_id, d], source[op_id, d] = float(value), "measured"
    table = CostTable.from_arrays(latency, devices, supported=sup, source=source, graph=graph, provenance=provenance)
    logger.info("cost table for %s (%d %ss): sources %s", graph.name, n, graph.level,
                {s: int((table.source == s).sum()) for s in SOURCES})
    return table


def predict(predictor: Any, nodes: list[OpNode], level: str) -> np.ndarray:
    """Kernels: latency inside a model (isolated latency plus the predictor's fitted per-kernel overhead and
    cold-weight time, :func:`predictors.context.predict_in_context_us`). Ops: isolated latency."""
    return predict_in_context_us(nodes, predictor) if level == "kernel" else predictor.predict(nodes)


def _fully_measured(measured: Mapping[str, Mapping[int, float]] | None, device: str, n: int) -> bool:
    return measured is not None and device in measured and set(measured[device]) >= set(range(n))


def _check_target(predictor: Any, spec: Any, name: str) -> None:
    target = getattr(predictor, "target", None)
    want, have = spec.target.get("kind"), (target or {}).get("kind")
    if want and have and want != have and not spec.emulated:
        raise PredictorError(f"device {name!r} has target kind {want!r} but its predictor was built for {have!r}; "
                             "use a predictor fitted/defined for this device")
