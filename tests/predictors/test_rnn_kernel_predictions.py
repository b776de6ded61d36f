"""The CPU predictor against the CPU on one time slice of a small unrolled LSTM and GRU.

A time slice (the kernels of ``k`` consecutive steps of one layer, ``hetpart.partition.slices``) is what the
time-slice planner prices, so its predicted time is compared with its measured time, both in this process: every
distinct kernel of the model is timed in isolation (the profiler's protocol, lowest median of several windows), the
slice's time is the sum over its kernel instances, and the prediction is that of the shipped default predictor
scaled to this host by two kernels of the host calibration suite timed in the same process (an LSTM step's
matrix-vector product and the RNN gates). Contention on a busy host slows the reference kernels and the slice's
kernels alike, so the ratio stays put where absolute times would not; the band is wide enough for that and narrow
enough to catch a 2x miss.
"""
from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest

from hetpart.errors import ExtrapolationWarning
from hetpart.graph import OpNode
from hetpart.partition.slices import build_slice_grid
from predictors.device_predictor import DevicePredictor
from predictors.host_calibration import CALIBRATION_SUITE, CalibrationKernel, suite_speed_ratio
from predictors.profiling.calibration_sweep import suite_workloads
from predictors.profiling.kernel_mapping import map_kernels
from predictors.profiling.model_timing import BestWindowProfiler
from predictors.registry import default_cpu_predictor_path
from tests.tvm_passes.rnn_models import build_rnn_model

logger = logging.getLogger(__name__)

# Predicted / measured slice time must lie in this band: a 2x miss either way falls outside it.
RATIO_BAND = (0.55, 1.8)
SEQ_STEPS = 8
SLICE_STEPS = 2
HIDDEN = 256
ROUNDS = 3          # timing rounds over all kernels (reference and slice interleaved); each kernel keeps its lowest


def _is_reference(spec) -> bool:
    """The suite's kernels an RNN step spends its time in: the matrix-vector product and the gates."""
    return spec.op == "gates" or (spec.op == "matmul" and dict(spec.params).get("m") == 1)


def _import(op_type: str, tmp_path):
    from tvm_passes.frontend import import_model

    model, _ = build_rnn_model(op_type, seq=SEQ_STEPS, batch=1, input_size=HIDDEN, hidden=HIDDEN,
                               linear_before_reset=1 if op_type == "GRU" else 0, weight_range=0.1)
    path = tmp_path / f"{op_type.lower()}.onnx"
    path.write_bytes(model.SerializeToString())
    return import_model(str(path), name=f"{op_type.lower()}_h{HIDDEN}_s{SEQ_STEPS}").mod


def _lowest_medians_us(profiler: BestWindowProfiler, workloads: dict[str, object]) -> dict[str, float]:
    best: dict[str, float] = {}
    for _ in range(ROUNDS):
        for key, workload in workloads.items():
            row = profiler.measure(workload)
            assert row.status != "failed", row.error
            best[key] = min(best.get(key, np.inf), float(row.median_us))
    return best


@pytest.mark.slow          # ~40 s per cell: compiles and times every kernel of the model and two suite kernels
@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
def test_time_slice_prediction_matches_measurement(op_type, tmp_path):
    profiler = BestWindowProfiler("cpu", windows=2)
    kernels = map_kernels(_import(op_type, tmp_path), op_type.lower(), profiler)
    assert kernels.aligned, kernels.mismatch
    graph = kernels.graph
    grid = build_slice_grid(graph, slice_steps=SLICE_STEPS)
    # a slice inside the recurrence: no prologue (hoisted projection) or epilogue (stacking) joins it
    task = next(t for t in grid.tasks if t.slice == 1)
    slice_nodes = [graph.nodes[i] for i in task.op_ids if kernels.node_keys[i]]
    assert len(slice_nodes) >= 2 * SLICE_STEPS

    references = suite_workloads([s for s in CALIBRATION_SUITE if _is_reference(s)], profiler)
    assert len(references) == 2
    workloads = {**dict(references), **{w.key_hash: w for w in kernels.workloads}}
    measured = _lowest_medians_us(profiler, workloads)

    predictor = DevicePredictor.load(default_cpu_predictor_path())
    ratio, rows = suite_speed_ratio(predictor, [CalibrationKernel(name, OpNode.from_dict(w.features), measured[name])
                                                for name, w in references])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExtrapolationWarning)
        predicted_us = ratio * np.asarray(predictor.predict(slice_nodes))
    measured_us = np.array([measured[kernels.node_keys[i]] for i in task.op_ids if kernels.node_keys[i]])
    by_op: dict[str, list[float]] = {}
    for node, p, m in zip(slice_nodes, predicted_us, measured_us):
        by_op.setdefault(node.op, [0.0, 0.0])
        by_op[node.op][0] += p
        by_op[node.op][1] += m
    detail = "; ".join(f"{op}: {p:.1f} / {m:.1f} us" for op, (p, m) in sorted(by_op.items()))
    slice_ratio = float(predicted_us.sum() / measured_us.sum())
    logger.info("%s slice (layer %d, slice %d): predicted %.1f us, measured %.1f us (x%.2f; host scale %.2f from %s); "
                "%s", op_type, task.layer, task.slice, predicted_us.sum(), measured_us.sum(), slice_ratio, ratio,
                rows, detail)
    assert RATIO_BAND[0] <= slice_ratio <= RATIO_BAND[1], (
        f"{op_type} time slice predicted {predicted_us.sum():.1f} us against {measured_us.sum():.1f} us measured "
        f"(x{slice_ratio:.2f}, host scale {ratio:.2f}); per op, predicted / measured: {detail}")
