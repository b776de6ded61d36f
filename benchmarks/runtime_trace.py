"""Where the task runtime's time goes: a stacked RNN planned by ``timeslice`` on two one-core CPU devices, run with
all requests admitted at once, read from the runtime's trace.

Per round: the wall time, how long admitting the requests took the calling thread, and per device its busy time,
the part of it spent copying inputs, the time its worker waited between segments, and the mean segment time in
eighths of the run (a stage slower at the start than later points at contention for the cores)::

    TVM_NUM_THREADS=2 python benchmarks/runtime_trace.py --config GRU,2,256,35,1 --requests 64 --rounds 3
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from rnn_pipeline import RnnConfig, build_onnx  # noqa: E402


def trace_round(rt, inputs: list[list[np.ndarray]]) -> dict:
    """Admit every request at once, wait for all; the round's figures from the trace."""
    rt.trace.clear()
    started = time.perf_counter()
    futures = [rt.submit(*x) for x in inputs]
    admitted_s = time.perf_counter() - started
    for future in futures:
        future.result()
    wall_s = time.perf_counter() - started
    devices = {}
    for device in sorted({run.device for run in rt.trace}):
        runs = sorted((r for r in rt.trace if r.device == device), key=lambda r: r.start_s)
        durations = [r.end_s - r.start_s for r in runs]
        eighth = max(1, len(runs) // 8)
        devices[device] = {
            "runs": len(runs), "busy_ms": sum(durations) * 1e3, "copy_ms": sum(r.copy_s for r in runs) * 1e3,
            "waiting_ms": sum(b.start_s - a.end_s for a, b in zip(runs, runs[1:])) * 1e3,
            "first_start_ms": (runs[0].start_s - started) * 1e3, "last_end_ms": (runs[-1].end_s - started) * 1e3,
            "segment_ms_by_eighth": [float(np.mean(durations[i:i + eighth])) * 1e3
                                     for i in range(0, len(runs), eighth)]}
    return {"wall_ms": wall_s * 1e3, "admitting_ms": admitted_s * 1e3, "devices": devices}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="GRU,2,256,35,1", help="cell,layers,hidden,seq,batch")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--slice-steps", type=int, default=5)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    import hetpart
    from hetpart.driver.compiler import expand_plan
    from hetpart.driver.runtime_overhead import measure_dispatch_overhead, single_device_request_us
    from hetpart.driver.task_runtime import TaskRuntime
    from hetpart.partition import partition
    from tvm_passes.sources import import_model

    cell, layers, hidden, seq, batch = args.config.split(",")
    config = RnnConfig(cell, int(layers), int(hidden), int(seq), int(batch))
    cores = tuple(sorted(os.sched_getaffinity(0))[:2])
    if len(cores) < 2:
        raise SystemExit("two one-core CPU devices need a process allowed on two cores")
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = build_onnx(config, Path(tmp) / "model.onnx")
        compiled = hetpart.compile(str(path), devices=f"cpu:{cores[0]},cpu:{cores[1]}", method="all_cpu",
                                   slice_steps=args.slice_steps)
        module = import_model(str(path)).mod
        overhead = measure_dispatch_overhead([{"name": d.name, "kind": d.kind, "cores": list(d.cores)}
                                              for d in compiled.costs.devices.devices],
                                             request_us=single_device_request_us(compiled.costs))
        model = overhead.runtime_model(compiled.costs.device_names)
        plan = partition(compiled.graph, compiled.costs, "timeslice",
                         {"requests": args.requests, "slice_steps": args.slice_steps, "timeslice_segments": "slices",
                          "dispatch_overhead_us_by_device": dict(model.dispatch_overhead_us_by_device)})
        op_plan = expand_plan(plan, compiled.graph, compiled.op_graph)
        rng = np.random.default_rng(0)
        shape = [int(d) for d in compiled.build.manifest.inputs[0]["shape"]]
        inputs = [[rng.uniform(-1, 1, shape).astype(np.float32)] for _ in range(args.requests)]
        chosen = plan.stats.get("chosen", {})
        print(f"# Task runtime trace: {config.name}, {args.requests} requests admitted at once\n\n"
              f"Command: `TVM_NUM_THREADS={os.environ['TVM_NUM_THREADS']} python benchmarks/runtime_trace.py "
              f"--config {args.config} --requests {args.requests} --rounds {args.rounds}` "
              f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}). Plan: timeslice, {chosen.get('kind')} "
              f"{chosen.get('cut')}, {chosen.get('first_device')} first; overhead per segment measured here "
              f"{overhead.overhead_us:.0f} us.\n")
        with TaskRuntime.from_compiled(replace(compiled, plan=plan, op_plan=op_plan), module, trace=True) as rt:
            rt.run_many(inputs[:2], max_in_flight=2)                          # warm
            print("| round | wall (ms) | admitting (ms) | device | runs | busy (ms) | copying (ms) | waiting (ms) | "
                  "first start / last end (ms) | segment time by eighth of the run (ms) |")
            print("|---:|---:|---:|---|---:|---:|---:|---:|---|---|")
            for k in range(args.rounds):
                figures = trace_round(rt, inputs)
                for device, d in figures["devices"].items():
                    print(f"| {k} | {figures['wall_ms']:.1f} | {figures['admitting_ms']:.1f} | {device} | "
                          f"{d['runs']} | {d['busy_ms']:.1f} | {d['copy_ms']:.2f} | {d['waiting_ms']:.1f} | "
                          f"{d['first_start_ms']:.1f} / {d['last_end_ms']:.1f} | "
                          f"{', '.join(f'{v:.2f}' for v in d['segment_ms_by_eighth'])} |")
            print(f"\ncopies made between devices: {getattr(rt, 'copies_made', 'not counted by this tree')}")


if __name__ == "__main__":
    main()
