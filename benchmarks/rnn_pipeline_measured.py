"""RNN time-slice pipeline, measured: the ``timeslice`` plan run by the task runtime on two CPU devices of one core
each (``--devices cpu:A,cpu:B``), against one core and against request-level load balancing on both cores, and
against its own simulation. Run through ``python benchmarks/rnn_pipeline.py --measured ...``.

Per configuration (stacked ONNX LSTM/GRU built by ``rnn_pipeline.build_onnx``, batch 1) in one process:

1. ``hetpart.compile(model, devices="cpu:A,cpu:B")``: the kernel graph, its costs (the CPU predictor at one
   thread, scaled to this host when a clean calibration exists) and the op graph; the task runtime's overhead per
   segment measured here (``measure_dispatch_overhead``), which planning and simulation add to every segment;
2. per request count R: ``timeslice`` planned for R requests (``timeslice_segments="slices"``: one segment per
   (layer, slice) task allowed) as ``hetpart.compile`` plans it, run by ``TaskRuntime.from_compiled`` with the
   plan's segments (``hetpart.driver.task_segments.runtime_segmentation``): all R requests admitted at once (``run_many(max_in_flight=R)``); measured makespan (wall time),
   steady-state period (``steady_state_period_us`` of the completions) and p50/p99 latency;
3. baselines, measured in the same rounds with the sequential VM of the all-CPU build of the default import: one
   core (R requests back to back on a thread whose TVM pool is one thread pinned to core A) and request-level load
   balancing on both cores (two threads, each with its own VM and a one-thread pool pinned to its core, each taking
   the next request when it is free);
4. predicted: ``simulate_requests`` of the plan with its segments (kernel-level ``kernel_segmentation``), with the
   predicted costs and with each segment's measured time (``runtime model``: what is left is the model's error);
   ``rel_error`` = predicted / measured - 1.

Every measurement is repeated ``--rounds`` times, interleaved, and the median kept; a ratio of two throughputs
(``vs one core``, ``vs balance``) is the median of the per-round ratios. The host's load (``uptime``) is
recorded before and after every configuration: figures from a busy host are not evidence for or against the goals.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shlex
import statistics
import subprocess
import threading
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from predictors.host_load import cpu_use_now, other_load_cores

logger = logging.getLogger("benchmarks.rnn_pipeline_measured")

HEADING = "## Measured: the task runtime on two one-core CPU devices"
DEFAULT_CONFIGS = "LSTM,2,256,35,1;GRU,2,256,35,1;LSTM,2,650,35,1;GRU,2,512,64,1"
QUIET_OTHER_CORES = 0.2     # cores other processes may keep busy on average during a configuration for it to count
                            # as measured on a quiet host (/proc/stat minus this process; the load average counts
                            # this benchmark's own previous configuration)
GOAL_VS_ONE_CORE = 1.7      # measured throughput over one core, R >= 16
GOAL_REL_ERROR = 0.10       # executor within 10% of its own simulation


def host_load() -> dict[str, Any]:
    """The load averages and ``uptime``'s line now."""
    try:
        line = subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        line = f"uptime unavailable: {exc}"
    one, five, fifteen = os.getloadavg()
    return {"load_1min": one, "load_5min": five, "load_15min": fifteen, "uptime": line,
            "at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}


def _percentiles(latency_us: Sequence[float]) -> dict[str, float]:
    return {"p50_us": float(np.percentile(latency_us, 50)), "p99_us": float(np.percentile(latency_us, 99))}


def _figures(makespan_us: float, completed_us: Sequence[float], latency_us: Sequence[float], n: int) -> dict[str, Any]:
    from hetpart.simulate_requests import steady_state_period_us

    return {"makespan_us": makespan_us, "period_us": steady_state_period_us(completed_us),
            "throughput_per_s": n / makespan_us * 1e6, **_percentiles(latency_us)}


class SequentialModel:
    """The sequential VM of a single-device build, one VM per calling thread (a VM is not thread-safe)."""

    def __init__(self, build: Any) -> None:
        import tvm
        from tvm import relax

        self.build, self._tvm, self._relax = build, tvm, relax

    def caller(self) -> Callable[..., Any]:
        vm = self._relax.VirtualMachine(self.build.executable, self.build.manifest.runtime_devices())
        return self.build.manifest.main_caller(vm)

    def tensors(self, inputs: Sequence[Sequence[np.ndarray]]) -> list[list[Any]]:
        host = self._tvm.cpu(0)
        return [[self._tvm.runtime.tensor(np.ascontiguousarray(x), host) for x in xs] for xs in inputs]


def run_one_core(model: SequentialModel, inputs: list[list[Any]], core: int) -> dict[str, Any]:
    """Every request back to back on this thread, its TVM pool one thread pinned to ``core``."""
    from tvm_passes.thread_pool import restricted_pool

    with restricted_pool(1, (core,)):
        call = model.caller()
        call(*inputs[0])                                      # warm: the first call loads the kernels
        completed, started = [], time.perf_counter()
        for xs in inputs:
            call(*xs)
            completed.append((time.perf_counter() - started) * 1e6)
    return _figures(completed[-1], completed, completed, len(inputs))


def run_balanced(model: SequentialModel, inputs: list[list[Any]], cores: Sequence[int]) -> dict[str, Any]:
    """Request-level load balancing: one thread per core, each with its own VM and a one-thread pool pinned to its
    core, each taking the next request when it is free; all requests wait at t = 0."""
    from tvm_passes.thread_pool import restricted_pool

    completed = [0.0] * len(inputs)
    taken = iter(range(len(inputs)))
    lock, errors = threading.Lock(), []
    began = [0.0]
    start = threading.Barrier(len(cores) + 1, action=lambda: began.__setitem__(0, time.perf_counter()))

    def worker(core: int) -> None:
        try:
            with restricted_pool(1, (core,)):
                call = model.caller()
                call(*inputs[0])
                start.wait()
                while True:
                    with lock:
                        k = next(taken, None)
                    if k is None:
                        return
                    call(*inputs[k])
                    completed[k] = (time.perf_counter() - began[0]) * 1e6
        except threading.BrokenBarrierError:   # another worker failed
            pass
        except BaseException as exc:  # noqa: BLE001 (re-raised by the caller)
            errors.append(exc)
            start.abort()

    threads = [threading.Thread(target=worker, args=(c,), name=f"balance-core{c}") for c in cores]
    for t in threads:
        t.start()
    try:
        start.wait()
    except threading.BrokenBarrierError:       # a worker failed before the start; its error is raised below
        pass
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return _figures(max(completed), completed, completed, len(inputs))


def run_tasks(rt: Any, inputs: Sequence[Sequence[np.ndarray]]) -> tuple[dict[str, Any], dict[int, float]]:
    """All requests admitted at once; the figures and each segment's median run time (µs) from the trace. A
    request completes when its last segment ends (the trace's clock: the calling thread's wake-up on a busy host
    is not the runtime's time)."""
    rt.trace.clear()
    started = time.perf_counter()
    _, latency_us = rt.run_many(inputs, max_in_flight=len(inputs))
    completed = [0.0] * len(inputs)
    per_segment: dict[int, list[float]] = {}
    first = min(run.request for run in rt.trace)     # the runtime numbers requests from its start
    for run in rt.trace:      # a segment's own time excludes its copies: the runtime model adds those itself
        per_segment.setdefault(run.segment, []).append((run.end_s - run.start_s - run.copy_s) * 1e6)
        completed[run.request - first] = max(completed[run.request - first], (run.end_s - started) * 1e6)
    return (_figures(max(completed), completed, latency_us, len(inputs)),
            {s: statistics.median(v) for s, v in per_segment.items()})


def predicted_segment_us(graph: Any, costs: Any, plan: Any, op_segment_of: Sequence[int]) -> dict[int, float]:
    """Each runtime segment's predicted kernel time (µs): its kernels' latencies on their planned devices."""
    latency = np.array(costs.latency_us, dtype=np.float64)
    predicted: dict[int, float] = {}
    for k, node in enumerate(graph.nodes):
        s = op_segment_of[min(node.tags.get("op_ids", [node.id]))]
        predicted[s] = predicted.get(s, 0.0) + latency[k, costs.devices.index(plan.device_of[k])]
    return predicted


def costs_from_segments(graph: Any, costs: Any, plan: Any, op_segment_of: Sequence[int],
                        segment_us: dict[int, float]) -> Any:
    """``costs`` with each kernel's latency on its planned device scaled so that every segment's kernels add up to
    its measured time (the simulator then sees measured work)."""
    from hetpart.costs import CostTable

    latency = np.array(costs.latency_us, dtype=np.float64)
    device = [costs.devices.index(d) for d in plan.device_of]
    segment = [op_segment_of[min(node.tags.get("op_ids", [node.id]))] for node in graph.nodes]
    predicted = predicted_segment_us(graph, costs, plan, op_segment_of)
    for k, s in enumerate(segment):
        if predicted[s] > 0 and s in segment_us:
            latency[k, device[k]] *= segment_us[s] / predicted[s]
    return CostTable.from_arrays(latency, costs.devices, supported=costs.supported, source="measured", graph=graph)


def _simulated(graph: Any, costs: Any, plan: Any, n: int, runtime: Any, segmentation: Any) -> dict[str, Any]:
    from hetpart.simulate_requests import simulate_requests

    timeline = simulate_requests(graph, costs, plan, n_requests=n, runtime=runtime, segmentation=segmentation)
    return {"makespan_us": timeline.makespan_us, "period_us": timeline.period_us,
            "throughput_per_s": n / timeline.makespan_us * 1e6, **_percentiles(timeline.latency_us)}


def _median_figures(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    out = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    out["throughput_per_s_rounds"] = [r["throughput_per_s"] for r in rounds]
    return out


def _errors(predicted: dict[str, Any], measured: dict[str, Any]) -> dict[str, float]:
    return {f"{key}_rel_error": predicted[key] / measured[key] - 1.0 for key in ("makespan_us", "period_us")}


def measure_config(config: Any, onnx_path: Path, args: argparse.Namespace, cores: tuple[int, int]) -> list[dict]:
    import hetpart
    from hetpart.driver.compiler import expand_plan
    from hetpart.driver.runtime_overhead import measure_dispatch_overhead, single_device_request_us
    from hetpart.driver.task_runtime import TaskRuntime
    from hetpart.driver.task_segments import kernel_segmentation, runtime_segmentation
    from hetpart.partition import partition
    from hetpart.partition.request_balance import simulate_request_balance
    from tvm_passes.rnn import RnnImportOptions
    from tvm_passes.sources import import_model

    spec = f"cpu:{cores[0]},cpu:{cores[1]}"
    load_before, use_before = host_load(), cpu_use_now()
    started = time.perf_counter()
    rnn = None if args.projection == "hoisted" else RnnImportOptions(args.projection, args.slice_steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # predictor extrapolation, degenerate single-device baselines
        compiled = hetpart.compile(str(onnx_path), devices=spec, method="all_cpu", slice_steps=args.slice_steps,
                                   rnn_projection=None if rnn is None else args.projection)   # graph and costs
        single = hetpart.compile(str(onnx_path), devices="cpu", method="all_cpu")
    module = import_model(str(onnx_path), rnn_options=rnn).mod
    overhead = measure_dispatch_overhead([{"name": d.name, "kind": d.kind, "cores": list(d.cores)}
                                          for d in compiled.costs.devices.devices],
                                         request_us=single_device_request_us(compiled.costs))
    # measured completions are the last segments' ends (the trace's clock, run_tasks), so the model's completion
    # overhead (outputs handed back after that end) is left out of the comparison; its admission overhead stays
    runtime_model = replace(overhead.runtime_model(compiled.costs.device_names), completion_us=0.0)
    compile_s = time.perf_counter() - started
    rng = np.random.default_rng(0)
    shape = [int(d) for d in compiled.build.manifest.inputs[0]["shape"]]
    sequential = SequentialModel(single.build)
    records = []
    for n in args.requests:
        inputs = [[rng.uniform(-1, 1, shape).astype(np.float32)] for _ in range(n)]
        options = {"requests": n, "slice_steps": args.slice_steps, "timeslice_segments": args.segments,
                   "dispatch_overhead_us_by_device": dict(runtime_model.dispatch_overhead_us_by_device)}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plan = partition(compiled.graph, compiled.costs, "timeslice", options)
        op_plan = expand_plan(plan, compiled.graph, compiled.op_graph)
        segmentation = runtime_segmentation(compiled.op_graph, op_plan, compiled.graph, plan)
        per_task = kernel_segmentation(compiled.graph, plan)
        tensors = sequential.tensors(inputs)
        rounds: dict[str, list[dict[str, Any]]] = {"timeslice": [], "one_core": [], "balance": []}
        segment_us: dict[int, list[float]] = {}
        with TaskRuntime.from_compiled(replace(compiled, plan=plan, op_plan=op_plan), module, trace=True) as rt:
            if tuple(rt.program.segment_of) != segmentation.segment_of:
                raise RuntimeError("the task runtime built other segments than the plan's runtime_segmentation")
            outputs, _ = rt.run_many(inputs[:2], max_in_flight=2)           # warm, and check the numerics
            reference = sequential.caller()(*tensors[0])
            reference = [reference.numpy()] if hasattr(reference, "numpy") else [o.numpy() for o in reference]
            max_abs_diff = max(float(np.max(np.abs(a - b))) for a, b in zip(outputs[0], reference))
            for _ in range(args.rounds):
                figures, per_segment = run_tasks(rt, inputs)
                rounds["timeslice"].append(figures)
                for s, us in per_segment.items():
                    segment_us.setdefault(s, []).append(us)
                rounds["one_core"].append(run_one_core(sequential, tensors, cores[0]))
                rounds["balance"].append(run_balanced(sequential, tensors, cores))
        measured = {name: _median_figures(r) for name, r in rounds.items()}
        segment_median_us = {s: statistics.median(v) for s, v in segment_us.items()}
        measured_costs = costs_from_segments(compiled.graph, compiled.costs, plan, segmentation.segment_of,
                                             segment_median_us)
        segment_predicted_us = predicted_segment_us(compiled.graph, compiled.costs, plan, segmentation.segment_of)
        predicted = _simulated(compiled.graph, compiled.costs, plan, n, runtime_model, per_task)
        from_segments = _simulated(compiled.graph, measured_costs, plan, n, runtime_model, per_task)
        balance = simulate_request_balance(compiled.graph, compiled.costs, n_requests=n, runtime=runtime_model)

        def per_round(a: str, b: str) -> float:
            """The median over rounds of the ratio of two throughputs measured in the same round: the host's slow
            spells, which come and go within minutes here, fall on both."""
            return statistics.median(x["throughput_per_s"] / y["throughput_per_s"]
                                     for x, y in zip(rounds[a], rounds[b]))

        record = {
            "config": config.name, "requests": n, "devices": spec, "slice_steps": args.slice_steps,
            "projection": args.projection, "kernels": compiled.graph.num_ops, "segments": len(segmentation),
            "plan_segments": plan.stats["segments"], "chosen": plan.stats["chosen"],
            "overhead_per_segment_us": overhead.overhead_us, "max_abs_diff_vs_one_core": max_abs_diff,
            "measured": measured, "predicted": predicted, "predicted_from_measured_segments": from_segments,
            # per runtime segment (id: device), its kernels' predicted time and its median measured run in flight
            "segments_us": {f"{s}:{segmentation.segments[s].device}": {"predicted": segment_predicted_us.get(s),
                                                                      "measured": segment_median_us.get(s)}
                            for s in sorted(segment_median_us)},
            "predicted_balance": {"makespan_us": balance.makespan_us,
                                  "throughput_per_s": n / balance.makespan_us * 1e6},
            "rel_error": _errors(predicted, measured["timeslice"]),
            "runtime_model_rel_error": _errors(from_segments, measured["timeslice"]),
            "throughput_vs_one_core": per_round("timeslice", "one_core"),
            "balance_vs_one_core": per_round("balance", "one_core"),
            "throughput_vs_balance": per_round("timeslice", "balance"),
            "compile_s": compile_s, "cost_notes": compiled.source.get("cost_notes", [])}
        records.append(record)
        logger.info("%s R=%d: timeslice %.0f/s (%.2fx one core, balance %.2fx), period error %+.1f%% (runtime model "
                    "%+.1f%%), %d segments", config.name, n, measured["timeslice"]["throughput_per_s"],
                    record["throughput_vs_one_core"], record["balance_vs_one_core"],
                    100 * record["rel_error"]["period_us_rel_error"],
                    100 * record["runtime_model_rel_error"]["period_us_rel_error"], len(segmentation))
    load_after, others = host_load(), other_load_cores(use_before, cpu_use_now())
    for record in records:
        record["load_before"], record["load_after"] = load_before, load_after
        record["other_load_cores"] = others
        record["quiet"] = others is not None and others < QUIET_OTHER_CORES
    return records


def summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    many = [r for r in records if r["requests"] >= 16]
    quiet = all(r["quiet"] for r in records)
    errors = [abs(r["runtime_model_rel_error"]["period_us_rel_error"]) for r in records]
    predicted_errors = [abs(r["rel_error"]["period_us_rel_error"]) for r in records]
    return {"quiet": quiet, "vs_one_core_r16_min": min((r["throughput_vs_one_core"] for r in many), default=None),
            "vs_one_core_r16_met": sum(r["throughput_vs_one_core"] >= GOAL_VS_ONE_CORE for r in many),
            "r16_rows": len(many),
            "period_runtime_model_abs_rel_error_median": statistics.median(errors) if errors else None,
            "period_runtime_model_abs_rel_error_max": max(errors, default=None),
            "period_runtime_model_within_10pct": sum(e <= GOAL_REL_ERROR for e in errors),
            "period_predicted_abs_rel_error_median": statistics.median(predicted_errors) if errors else None,
            "rows": len(records)}


def _row(r: dict[str, Any]) -> str:
    m, chosen = r["measured"], r["chosen"]
    if chosen["candidate"] != "cut":
        what = chosen["candidate"]
    elif chosen["kind"] in ("empty", "all"):
        what = f"all on {chosen['second_device' if chosen['kind'] == 'empty' else 'first_device']}"
    else:
        what = f"{chosen['kind']} {chosen['cut']} {chosen['first_device']} first"
    return (f"| {r['config']} | {r['requests']} | {what}, {r['plan_segments']} ({r['segments']} segments) | "
            f"{m['timeslice']['throughput_per_s']:,.0f} | {m['one_core']['throughput_per_s']:,.0f} | "
            f"{m['balance']['throughput_per_s']:,.0f} | {r['throughput_vs_one_core']:.2f}x | "
            f"{r['balance_vs_one_core']:.2f}x | {m['timeslice']['period_us'] / 1e3:,.2f} | "
            f"{r['predicted']['period_us'] / 1e3:,.2f} ({r['rel_error']['period_us_rel_error']:+.0%}) | "
            f"{r['predicted_from_measured_segments']['period_us'] / 1e3:,.2f} "
            f"({r['runtime_model_rel_error']['period_us_rel_error']:+.0%}) | "
            f"{r['runtime_model_rel_error']['makespan_us_rel_error']:+.0%} | "
            f"{m['timeslice']['p50_us'] / 1e3:,.1f} / {m['timeslice']['p99_us'] / 1e3:,.1f} | "
            f"{m['balance']['p50_us'] / 1e3:,.1f} / {m['balance']['p99_us'] / 1e3:,.1f} | "
            f"{'?' if r.get('other_load_cores') is None else format(r['other_load_cores'], '.2f')} |")


def markdown(result: dict[str, Any]) -> str:
    meta, records, summ = result["meta"], result["records"], result["summary"]
    others = [r.get("other_load_cores") for r in records]
    worst = max((o for o in others if o is not None), default=None)
    status = (f"the host was quiet (other processes kept at most {worst:.2f} of its cores busy during any "
              f"configuration; threshold {QUIET_OTHER_CORES})" if summ["quiet"] else
              f"**the host was busy** (other processes kept up to "
              f"{'an unknown share' if worst is None else f'{worst:.2f}'} of its cores busy during a configuration; "
              f"1-minute load {meta['load_start']['load_1min']:.2f} at the start, "
              f"{meta['load_end']['load_1min']:.2f} at the end): these figures check "
              "that the benchmark works and are no evidence for or against the goals; re-run it on a quiet host")
    lines = [HEADING, "",
             f"Command: `{meta['command']}` ({meta['date']}, {meta['host']}, TVM_NUM_THREADS={meta['tvm_num_threads']}, "
             f"{meta['wall_s']:.0f} s). Records: `benchmarks/results/{meta['name']}.json`. Host: {status}.", "",
             "Each configuration is planned by `timeslice` for R requests on `cpu:A,cpu:B` (one core each, one segment "
             "per (layer, slice) task allowed, the task runtime's overhead per segment measured in the same run) and run "
             "by the task runtime with all R requests admitted at once. `one core`: the all-CPU build's sequential VM, "
             "R requests back to back, its TVM pool one thread pinned to core A. `balance`: request-level load "
             "balancing measured on both cores (one VM and one pinned thread per core, each taking the next request). "
             "Throughput = R / makespan; the period is the mean interval between completions over the second half of "
             "the requests. `predicted`: `simulate_requests` with the predicted costs; `runtime model`: with each "
             "segment's measured time (error = predicted / measured - 1). Medians of "
             f"{meta['rounds']} interleaved rounds; the `vs one core` ratios are medians of the per-round ratios.", "",
             f"Goals: throughput >= {GOAL_VS_ONE_CORE}x one core at R >= 16: **{summ['vs_one_core_r16_met']} of "
             f"{summ['r16_rows']}** rows (lowest {summ['vs_one_core_r16_min'] or 0:.2f}x); period within "
             f"{GOAL_REL_ERROR:.0%} of its own simulation (runtime model): **{summ['period_runtime_model_within_10pct']} "
             f"of {summ['rows']}** rows (median |error| {summ['period_runtime_model_abs_rel_error_median'] or 0:.1%}, "
             f"worst {summ['period_runtime_model_abs_rel_error_max'] or 0:.1%}; with predicted costs median "
             f"{summ['period_predicted_abs_rel_error_median'] or 0:.1%}).", "",
             "| config | R | plan, segments | timeslice req/s | one core req/s | balance req/s | timeslice vs one core | "
             "balance vs one core | period measured (ms) | predicted (ms) | runtime model (ms) | makespan error, "
             "runtime model | timeslice p50 / p99 (ms) | balance p50 / p99 (ms) | other processes (cores) |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [_row(r) for r in records]
    return "\n".join(lines) + "\n"


def write_section(readme: Path, section: str) -> None:
    """Replace this benchmark's section of ``readme`` (from its heading to the end) or append it; keep the rest."""
    text = readme.read_text() if readme.exists() else ""
    kept = text.split(HEADING)[0].rstrip("\n")
    readme.parent.mkdir(parents=True, exist_ok=True)
    readme.write_text((kept + "\n\n" if kept else "") + section)


def kept_section(readme: Path) -> str:
    """This benchmark's section of ``readme`` ("" when absent), for the simulated benchmark to keep."""
    text = readme.read_text() if readme.exists() else ""
    return "\n\n" + HEADING + text.split(HEADING, 1)[1] if HEADING in text else ""


def main(argv: Sequence[str], config_type: Any, build_onnx: Callable[[Any, Path], Path], results: Path) -> int:
    from hetpart.paths import cache_root

    parser = argparse.ArgumentParser(prog="rnn_pipeline.py --measured", description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default=DEFAULT_CONFIGS, help="cell,layers,hidden,seq,batch; separated by ;")
    parser.add_argument("--requests", default="1,16,64")
    parser.add_argument("--slice-steps", type=int, default=5)
    parser.add_argument("--projection", choices=("hoisted", "per_slice"), default="hoisted")
    parser.add_argument("--segments", choices=("runtime", "slices"), default="slices",
                        help="the segmentations timeslice may choose from")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=results)
    parser.add_argument("--name", default="rnn_pipeline_measured")
    parser.add_argument("--readme", type=Path, default=results / "rnn_pipeline" / "README.md")
    args = parser.parse_args(list(argv))
    args.requests = [int(n) for n in args.requests.split(",") if n]
    cores = tuple(sorted(os.sched_getaffinity(0))[:2])
    if len(cores) < 2:
        raise SystemExit("two one-core CPU devices need a process allowed on two cores")
    load_start, started = host_load(), time.time()
    work = cache_root() / "benchmarks" / args.name               # the built ONNX models, outside the repository
    work.mkdir(parents=True, exist_ok=True)
    records = []
    for text in [c for c in args.configs.split(";") if c]:
        cell, layers, hidden, seq, batch = text.split(",")
        config = config_type(cell, int(layers), int(hidden), int(seq), int(batch))
        records += measure_config(config, build_onnx(config, work / f"{config.name}.onnx"), args, cores)
    meta = {"command": "python benchmarks/rnn_pipeline.py --measured " + " ".join(shlex.quote(a) for a in argv),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "host": platform.node() or "unknown",
            "platform": platform.platform(), "tvm_num_threads": os.environ.get("TVM_NUM_THREADS"), "cores": cores,
            "wall_s": time.time() - started, "rounds": args.rounds, "name": args.name,
            "load_start": load_start, "load_end": host_load()}
    result = {"meta": meta, "summary": summary(records), "records": records}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=1, default=float))
    write_section(args.readme, markdown(result))
    logger.info("wrote %s and the measured section of %s in %.0f s", args.out / f"{args.name}.json", args.readme,
                time.time() - started)
    return 0
