"""Per-slice CPU prediction on the zoo's RNNs: the predicted time of one time slice against its measured time.

A time slice (the kernels of ``--slice-steps`` consecutive steps of one layer, ``hetpart.partition.slices``) is what
the ``timeslice`` planner prices. Per model, in one process, as ``tests/predictors/test_rnn_kernel_predictions.py``
does for two small RNNs: every distinct deployment kernel of the model is timed in isolation (the profiler's
protocol, lowest median over ``--rounds`` rounds), a slice's measured time is the sum over its kernel instances, and
its prediction is the host CPU's predictor at ``TVM_NUM_THREADS`` (``predictors.registry.default_cpu_predictor_path``)
as a compile uses it: unscaled when it was fitted on this CPU at this thread count, else scaled to this host by the
two kernels of the calibration suite an RNN step spends its time in (a matrix-vector product and the gates), timed
in the same rounds (their measured / predicted ratio is recorded either way). One slice inside the recurrence per
layer is compared (slice 1: no prologue or epilogue joins it). Goal: predicted / measured within 0.9-1.1.

    python benchmarks/slice_prediction.py                   # lstm_lm, gru_lm, lstm_speaker, gru_audio
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))

import numpy as np  # noqa: E402

MODELS = ("lstm_lm", "gru_lm", "lstm_speaker:40", "gru_audio:40")
GOAL = (0.9, 1.1)
log = logging.getLogger("benchmarks.slice_prediction")


def _is_reference(spec) -> bool:
    return spec.op == "gates" or (spec.op == "matmul" and dict(spec.params).get("m") == 1)


def measure_model(name: str, size: int | None, slice_steps: int, rounds: int) -> list[dict]:
    from hetpart.errors import ExtrapolationWarning
    from hetpart.graph import OpNode
    from hetpart.partition.slices import build_slice_grid
    from predictors.device_predictor import DevicePredictor
    from predictors.host_calibration import CALIBRATION_SUITE, CalibrationKernel, suite_speed_ratio
    from predictors.profiling.calibration_sweep import suite_workloads
    from predictors.profiling.kernel_mapping import map_kernels
    from predictors.profiling.model_timing import BestWindowProfiler
    from predictors.registry import default_cpu_predictor_path, host_cpu_name
    from tvm_passes import sources

    profiler = BestWindowProfiler("cpu", windows=2)
    imported = sources.import_model(name, size=size)
    kernels = map_kernels(imported.mod, imported.name, profiler)
    if not kernels.aligned:
        raise RuntimeError(f"{name}: deployment kernels and kernel-graph nodes do not align ({kernels.mismatch})")
    graph = kernels.graph
    grid = build_slice_grid(graph, slice_steps=slice_steps)
    tasks = [next(t for t in grid.tasks if t.layer == layer and t.slice == 1) for layer in grid.layers]
    references = suite_workloads([s for s in CALIBRATION_SUITE if _is_reference(s)], profiler)
    needed = {kernels.node_keys[i] for t in tasks for i in t.op_ids if kernels.node_keys[i]}
    workloads = {**dict(references), **{w.key_hash: w for w in kernels.workloads if w.key_hash in needed}}
    best: dict[str, float] = {}
    for _ in range(rounds):
        for key, workload in workloads.items():
            row = profiler.measure(workload)
            if row.status == "failed":
                raise RuntimeError(f"{name}: timing {key} failed: {row.error}")
            best[key] = min(best.get(key, np.inf), float(row.median_us))
    path = default_cpu_predictor_path()
    predictor = DevicePredictor.load(path)
    reference_ratio, _rows = suite_speed_ratio(predictor, [CalibrationKernel(n, OpNode.from_dict(w.features), best[n])
                                                           for n, w in references])
    native = (predictor.target.get("mcpu") == host_cpu_name()
              and predictor.num_threads == int(os.environ["TVM_NUM_THREADS"]))
    scale = 1.0 if native else reference_ratio          # what a compile does with this predictor
    records = []
    for task in tasks:
        ids = [i for i in task.op_ids if kernels.node_keys[i]]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExtrapolationWarning)
            predicted_us = float(scale * np.sum(predictor.predict([graph.nodes[i] for i in ids])))
        measured_us = float(sum(best[kernels.node_keys[i]] for i in ids))
        records.append({"model": name if size is None else f"{name}:{size}", "layer": task.layer, "slice": task.slice,
                        "slice_steps": slice_steps, "kernels": len(ids), "predicted_us": predicted_us,
                        "measured_us": measured_us, "ratio": predicted_us / measured_us, "host_scale": scale,
                        "reference_measured_over_predicted": reference_ratio, "predictor": path.name})
        log.info("%s", records[-1])
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated zoo models, NAME or NAME:SIZE")
    parser.add_argument("--slice-steps", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/slice_prediction"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from predictors.registry import host_cpu_name

    records = []
    for spec in args.models.split(","):
        name, _, size = spec.partition(":")
        records += measure_model(name, int(size) if size else None, args.slice_steps, args.rounds)
    inside = sum(GOAL[0] <= r["ratio"] <= GOAL[1] for r in records)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "slice_prediction.json").write_text(json.dumps(records, indent=1) + "\n")
    lines = [f"# Per-slice CPU prediction on the zoo RNNs ({host_cpu_name()}, {os.environ['TVM_NUM_THREADS']} TVM "
             "threads)", "",
             f"Command: `python benchmarks/slice_prediction.py {' '.join(sys.argv[1:])}`"
             f" ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}). Predictor: `{records[0]['predictor']}`, "
             + ("used unscaled, as a compile on this CPU at this thread count uses it" if records[0]["host_scale"] == 1.0
                else f"scaled x{records[0]['host_scale']:.2f} to this host by the calibration suite's matrix-vector and "
                "gates kernels timed in the same rounds, as a compile does with a predictor from another CPU or "
                "thread count")
             + f" (those two kernels ran x{records[0]['reference_measured_over_predicted']:.2f} its predictions, "
             "geometric mean). "
             f"Goal: predicted / measured in {GOAL[0]}-{GOAL[1]}: **{inside} of {len(records)}** slices.", "",
             "| model | layer | slice (steps) | kernels | predicted (µs) | measured (µs) | predicted / measured |",
             "|---|---:|---|---:|---:|---:|---:|"]
    for r in records:
        lines.append(f"| {r['model']} | {r['layer']} | {r['slice']} ({r['slice_steps']}) | {r['kernels']} | "
                     f"{r['predicted_us']:,.1f} | {r['measured_us']:,.1f} | {r['ratio']:.2f} |")
    (args.out / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
