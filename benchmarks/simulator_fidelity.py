"""How well the simulator predicts the task runtime: zoo models planned for two CPU devices with one core each
(``--devices cpu:A,cpu:B``), run by the task runtime, predicted by ``hetpart.simulate_requests``.

Per model, in one process:

1. ``hetpart.compile(model, devices="cpu:A,cpu:B", method=..., segments=True, requests=R)``: the plan, made for
   the task runtime (its overhead per segment measured first; chosen by the simulated makespan of ``--requests``
   requests), its costs (the CPU predictor at one thread, scaled to this host when a clean calibration exists)
   and the segment executable;
2. the runtime's overheads, measured here (``hetpart.driver.runtime_overhead``): per segment, which the simulation
   adds to every segment, and per request (admission and completion, after a request as long as the model's);
3. measured: the latency of one request (median of repeated single requests) and the steady-state period of
   ``--requests`` requests in flight (median of rounds), both with ``TaskRuntime``; the kernels' own time per
   request (the sum of the segment runs in the runtime's trace);
4. predicted: ``simulate_requests`` with 1 and ``--requests`` requests: the makespan and the period, from the
   predicted costs, from each segment's measured time alone (the runtime model) and, for the period, from each
   segment's time measured in flight (beside the other core's segments, which slow it through shared caches and
   memory: the part of the runtime model's error that is the costs', not the scheduling's);
5. baselines, measured in the same run with the sequential executable of the all-CPU plan: one device with one
   core (the calling thread's TVM pool restricted to core A) and one device with two threads (the default pool);
6. the host's speed now (:class:`HostSpeedNow`, skipped with ``--no-host-speed``): the calibration suite timed
   again on core A, against the cached timing the compile's costs were scaled by; the simulation is repeated with
   the costs multiplied by that drift ("predicted at the host speed now").

Records go to ``<out>.json`` beside the ``--out`` directory, ``simulator_fidelity.json`` by default (one per case
with ``predicted_us``, ``measured_us``, ``rel_error`` = predicted / measured - 1), a table to ``README.md``, and
the summary the report shows for CPU-core device sets to ``hetpart/driver/data/simulator_fidelity.json``::

    python benchmarks/simulator_fidelity.py --out benchmarks/results/simulator_fidelity
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace
import time
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))

import numpy as np  # noqa: E402

MODELS = ("googlenet", "squeezenet1_1", "densenet121", "bert_small", "resnet18", "lstm_lm")
KINDS = {"googlenet": "branches", "squeezenet1_1": "branches", "densenet121": "branches", "bert_small": "branches",
         "resnet18": "chain", "lstm_lm": "chain"}
log = logging.getLogger("simulator_fidelity")
DEFAULT_OUT = Path("benchmarks/results/simulator_fidelity")


def inputs_for(specs, graph, seed: int) -> list[np.ndarray]:
    from hetpart.driver.check import sample_inputs

    return list(sample_inputs(specs, graph, seed=seed).values())


def median_latency_us(call, args, min_calls: int, min_seconds: float) -> float:
    call(*args)
    times, started = [], time.perf_counter()
    while len(times) < min_calls or time.perf_counter() - started < min_seconds:
        t0 = time.perf_counter()
        call(*args)
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


class HostSpeedNow:
    """The host calibration suite timed now, on one pinned core, against the timing the compile's calibration used.

    A predictor fitted on another CPU or at another thread count is scaled by the compile by a calibration suite
    timed once and cached; one fitted on this CPU at one thread (``cpu_<mcpu>_threads1.json``) is used as it is,
    priced at the host's speed when its kernels were timed. This host's speed drifts by a third over hours with
    nothing else running (the profiler's canary: 450 -> 630 us), so either reference taken in a fast hour
    under-predicts a run made in a slow one. ``drift`` = (suite now / predictor) over (cached suite / predictor)
    for a scaled predictor, and (suite now / predictor) for one used as it is, geometric means: what the compile's
    costs must be multiplied by to price this hour, measured in the same run as the runtime (the brief's
    ratios-in-one-run rule)."""

    def __init__(self, core: int) -> None:
        from hetpart.errors import PredictorError
        from predictors.device_predictor import DevicePredictor
        from predictors.host_calibration import CALIBRATION_SUITE, suite_speed_ratio, time_suite
        from predictors.profiling.calibration_sweep import suite_workloads
        from predictors.profiling.model_timing import BestWindowProfiler
        from predictors.registry import default_cpu_predictor_path, host_cpu_name

        self.core = core
        self.profiler = BestWindowProfiler("cpu", windows=2)
        self.workloads = suite_workloads(CALIBRATION_SUITE, self.profiler)
        self.base_path = default_cpu_predictor_path(threads=1)
        self.base = DevicePredictor.load(self.base_path)
        if self.base.num_threads == 1 and self.base.target.get("mcpu") == host_cpu_name():
            # the compile uses it unscaled: its reference is its own kernels' timing
            self.cached_measured_at = f"the predictor's own kernel timings ({self.base_path.name})"
            self.ratio_cached, self.reference = 1.0, "predictor"
            return
        self.reference = "calibration"
        advice = "compile once with --devices cpu:A,cpu:B on a quiet host first (it times and caches the suite)"
        try:
            cached = time_suite(host_cpu_name(), 1)    # what the compile read (a cached, clean sweep)
        except PredictorError as err:                  # nothing cached: this benchmark never times it itself
            raise SystemExit(f"no cached calibration suite at one thread on this host; {advice}") from err
        if not cached.kernels:
            reasons = "; ".join(cached.judgement.reasons)
            raise SystemExit(f"no cached calibration suite at one thread on this host ({reasons}); {advice}")
        self.cached_measured_at = f"the cached calibration suite, timed {cached.measured_at}"
        self.ratio_cached, _ = suite_speed_ratio(self.base, cached.kernels)

    def drift(self) -> dict:
        """Time the suite now; the drift against the cached timing the compile used."""
        from hetpart.graph import OpNode
        from predictors.host_calibration import CalibrationKernel, suite_speed_ratio
        from tvm_passes.thread_pool import restricted_pool

        with restricted_pool(1, (self.core,)):
            now = [CalibrationKernel(name, OpNode.from_dict(w.features), float(self.profiler.measure(w).median_us))
                   for name, w in self.workloads]
        ratio_now, _ = suite_speed_ratio(self.base, now)
        return {"predictor": self.base_path.name, "suite_ratio_now": ratio_now, "suite_ratio_cached": self.ratio_cached,
                "cached_measured_at": self.cached_measured_at, "drift": ratio_now / self.ratio_cached,
                "reference": self.reference}


def scaled_costs(costs, factor: float, graph):
    """``costs`` with every latency multiplied by ``factor`` (all devices are CPU core groups here)."""
    from hetpart.costs import CostTable

    return CostTable.from_arrays(np.array(costs.latency_us, dtype=np.float64) * factor, costs.devices,
                                 supported=costs.supported, source="predicted", graph=graph)


def measure_tasks(rt, args, requests: int, rounds: int, min_calls: int, min_seconds: float) -> dict:
    from hetpart.simulate_requests import steady_state_period_us

    one = median_latency_us(lambda *a: rt(*a), args, min_calls, min_seconds)
    rt.trace.clear()
    kernel_us, per_segment = [], {}
    for _ in range(max(3, min_calls // 2)):
        rt.trace.clear()
        rt(*args)
        # a segment's own time excludes the copies its worker made first: the runtime model adds those itself
        kernel_us.append(sum(run.end_s - run.start_s - run.copy_s for run in rt.trace) * 1e6)
        for run in rt.trace:
            per_segment.setdefault(run.segment, []).append((run.end_s - run.start_s - run.copy_s) * 1e6)
    periods, in_flight = [], {}
    for _ in range(rounds):
        rt.trace.clear()
        _, latency_us = rt.run_many([list(args)] * requests, max_in_flight=requests)
        periods.append(steady_state_period_us(latency_us))      # all admitted at once: latency = completion
        for run in rt.trace:    # the same segments, now beside the other core's: shared caches and memory
            in_flight.setdefault(run.segment, []).append((run.end_s - run.start_s - run.copy_s) * 1e6)
    return {"one_request_us": one, "period_us": statistics.median(periods), "periods_us": periods,
            "segment_runs_us": statistics.median(kernel_us),
            "segment_us": {k: statistics.median(v) for k, v in per_segment.items()},
            "segment_us_in_flight": {k: statistics.median(v) for k, v in in_flight.items()}}


def median_interval(n: int, confidence: float = 0.95) -> tuple[int, int]:
    """Indices (0-based, into n sorted values) of a distribution-free confidence interval of the median: the order
    statistics whose binomial(n, 1/2) coverage is at least ``confidence``."""
    from scipy.stats import binom

    low = max(0, int(binom.ppf((1 - confidence) / 2, n, 0.5)) - 1)
    return low, min(n - 1, n - 1 - low)


def paired_tasks_vs_sequential(rt, compiled, args, core: int, pairs: int) -> dict:
    """One request through the task runtime against the same plan's sequential executable with the calling thread's
    pool on one core (what each of the runtime's one-core workers has), alternated call by call (ABBA) so that the
    host's drift falls on both: the median of the paired differences is the runtime's cost or gain over running
    the same kernels one after another."""
    from tvm_passes.thread_pool import restricted_pool

    def sequential_us() -> float:
        with restricted_pool(1, (core,)):
            t0 = time.perf_counter()
            compiled(*args)
            return (time.perf_counter() - t0) * 1e6

    def tasks_us() -> float:
        t0 = time.perf_counter()
        rt(*args)
        return (time.perf_counter() - t0) * 1e6

    sequential_us(), tasks_us()
    tasks, sequential = [], []
    for k in range(pairs):
        if k % 2:
            sequential.append(sequential_us())
            tasks.append(tasks_us())
        else:
            tasks.append(tasks_us())
            sequential.append(sequential_us())
    differences = sorted(t - s for t, s in zip(tasks, sequential))
    low, high = median_interval(len(differences))
    return {"difference_median_95ci_us": [differences[low], differences[high]], "differences_us": differences,
            "pairs": pairs, "tasks_us": statistics.median(tasks),
            "sequential_one_core_us": statistics.median(sequential),
            "difference_us": statistics.median(differences),
            "difference_quartiles_us": [differences[len(differences) // 4], differences[3 * len(differences) // 4]]}


def costs_from_measured_segments(compiled, segment_us: dict) -> object:
    """The plan's cost table with each kernel's latency on its planned device scaled so that every runtime segment's
    kernels add up to that segment's measured time: the simulator then sees measured work, and what is left of its
    error is the runtime model's (overheads, copies, concurrency)."""
    from hetpart.costs import CostTable

    segment_of = compiled.segments.program.segment_of
    costs, plan = compiled.costs, compiled.plan
    latency = np.array(costs.latency_us, dtype=np.float64)
    kernel_segment = [segment_of[min(node.tags.get("op_ids", [node.id]))] for node in compiled.graph.nodes]
    device_index = [costs.devices.index(d) for d in plan.device_of]
    predicted: dict[int, float] = {}
    for k, s in enumerate(kernel_segment):
        predicted[s] = predicted.get(s, 0.0) + latency[k, device_index[k]]
    for k, s in enumerate(kernel_segment):
        if predicted[s] > 0 and s in segment_us:
            latency[k, device_index[k]] *= segment_us[s] / predicted[s]
    return CostTable.from_arrays(latency, costs.devices, supported=costs.supported, source="measured",
                                 graph=compiled.graph)


def run_model(name: str, spec: str, cores: tuple[int, int], method: str, args,
              speed: HostSpeedNow | None = None) -> tuple[list[dict], dict]:
    import hetpart
    from hetpart.driver.runtime_overhead import measure_dispatch_overhead, single_device_request_us
    from hetpart.driver.task_runtime import TaskRuntime
    from hetpart.simulate_requests import simulate_requests
    from tvm_passes.thread_pool import restricted_pool

    started = time.perf_counter()
    sharing = not args.no_work_sharing
    compiled = hetpart.compile(name, devices=spec, method=method, segments=True, size=args.size,
                               requests=args.requests,      # planned for the runtime, R requests in flight
                               partition_options=None if sharing else {"work_sharing": False})
    single = hetpart.compile(name, devices="cpu", method="all_cpu", size=args.size)
    compile_s = time.perf_counter() - started
    devices = [{"name": d.name, "kind": d.kind, "cores": list(d.cores)} for d in compiled.costs.devices.devices]
    overhead = measure_dispatch_overhead(devices, request_us=single_device_request_us(compiled.costs))
    runtime_model = replace(overhead.runtime_model(compiled.costs.device_names), continuation=sharing,
                            sharing=sharing)
    x = inputs_for(compiled.build.manifest.inputs, compiled.op_graph, seed=0)
    with TaskRuntime(compiled.segments, trace=True, continuation=sharing, sharing=sharing) as rt:
        measured = measure_tasks(rt, x, args.requests, args.rounds, args.min_calls, args.min_seconds)
        paired = paired_tasks_vs_sequential(rt, compiled, x, cores[0], args.pairs)
    with restricted_pool(1, (cores[0],)):
        one_core_us = median_latency_us(single, x, args.min_calls, args.min_seconds)
    two_threads_us = median_latency_us(single, x, args.min_calls, args.min_seconds)
    same_plan_sequential_us = median_latency_us(compiled, x, args.min_calls, args.min_seconds)
    one = simulate_requests(compiled.graph, compiled.costs, compiled.plan, n_requests=1, runtime=runtime_model)
    many = simulate_requests(compiled.graph, compiled.costs, compiled.plan, n_requests=args.requests,
                             runtime=runtime_model)
    measured_costs = costs_from_measured_segments(compiled, measured["segment_us"])
    one_m = simulate_requests(compiled.graph, measured_costs, compiled.plan, n_requests=1, runtime=runtime_model)
    many_m = simulate_requests(compiled.graph, measured_costs, compiled.plan, n_requests=args.requests,
                               runtime=runtime_model)
    in_flight_costs = costs_from_measured_segments(compiled, measured["segment_us_in_flight"])
    many_f = simulate_requests(compiled.graph, in_flight_costs, compiled.plan, n_requests=args.requests,
                               runtime=runtime_model)
    alone_us, beside_us = (sum(measured[key].get(k, 0.0) for k in measured["segment_us_in_flight"])
                           for key in ("segment_us", "segment_us_in_flight"))
    host = speed.drift() if speed is not None else None
    if host is not None:
        now_costs = scaled_costs(compiled.costs, host["drift"], compiled.graph)
        one_n = simulate_requests(compiled.graph, now_costs, compiled.plan, n_requests=1, runtime=runtime_model)
        many_n = simulate_requests(compiled.graph, now_costs, compiled.plan, n_requests=args.requests,
                                   runtime=runtime_model)
    kernel_predicted_us = float(sum(compiled.costs.latency(k, compiled.plan.device_of[k])
                                    for k in range(compiled.graph.num_ops)))
    segments = len(compiled.segments.program.functions)
    common = {"model": name, "kind": KINDS.get(name, "?"), "method": compiled.plan.method, "devices": spec,
              "segments": segments, "overhead_per_segment_us": overhead.overhead_us,
              "kernels_on": {d: compiled.plan.device_of.count(d) for d in compiled.costs.device_names}}
    records = []
    for metric, predicted, from_segments, from_in_flight, got, at_now in (
            ("one_request", one.makespan_us, one_m.makespan_us, one_m.makespan_us, measured["one_request_us"],
             one_n.makespan_us if host else None),
            (f"period_{args.requests}", many.period_us, many_m.period_us, many_f.period_us, measured["period_us"],
             many_n.period_us if host else None)):
        record = {**common, "metric": metric, "predicted_us": predicted, "measured_us": got,
                  "rel_error": predicted / got - 1.0, "predicted_from_measured_segments_us": from_segments,
                  "runtime_model_rel_error": from_segments / got - 1.0,
                  # segment times measured in flight (for one request, alone as above): the runtime model without
                  # the slowdown two cores cause each other, which the costs do not model
                  "predicted_from_in_flight_segments_us": from_in_flight,
                  "runtime_model_in_flight_rel_error": from_in_flight / got - 1.0}
        if host is not None:
            record.update({"predicted_at_host_speed_now_us": at_now, "host_speed_now_rel_error": at_now / got - 1.0,
                           "host_speed_drift": host["drift"]})
        records.append(record)
    extra = {"model": name, "segments": segments, "one_core_us": one_core_us, "two_threads_us": two_threads_us,
             "sequential_same_plan_us": same_plan_sequential_us,
             # the goal: one request never slower than the same kernels run one after another on one core by more
             # than the runtime's measured overhead (per segment, plus admission and completion once)
             "tasks_vs_sequential_one_core": paired,
             "overhead_allowance_us": segments * overhead.overhead_us + overhead.admission_us
             + overhead.completion_us,
             "tasks_one_request_us": measured["one_request_us"], "tasks_period_us": measured["period_us"],
             "periods_us": measured["periods_us"], "segment_runs_us": measured["segment_runs_us"],
             "kernels_predicted_us": kernel_predicted_us,
             "segments_in_flight_vs_alone": beside_us / alone_us if alone_us else None,
             "cost_rel_error": kernel_predicted_us / measured["segment_runs_us"] - 1.0,
             "speedup_one_request_vs_one_core": one_core_us / measured["one_request_us"],
             "throughput_vs_one_core": one_core_us / measured["period_us"],
             "throughput_vs_two_threads": two_threads_us / measured["period_us"],
             "compile_s": compile_s, "cost_notes": compiled.source.get("cost_notes", []), "host_speed": host}
    log.info("%s: %s", name, json.dumps({**records[0], **extra}, default=str)[:400])
    return records, extra


def table(records: list[dict], extras: list[dict], requests: int) -> list[str]:
    now = all("host_speed_now_rel_error" in r for r in records)
    lines = ["| model | kind | segments | metric | measured (µs) | predicted (µs) | error | "
             + ("host speed now | predicted at it (µs) | error | " if now else "")
             + "predicted from measured segments (µs) | error | from in-flight segments (µs) | error |",
             "|---|---|---:|---|---:|---:|---:|" + ("---:|---:|---:|" if now else "") + "---:|---:|---:|---:|"]
    for r in records:
        at_now = (f"x{r['host_speed_drift']:.2f} | {r['predicted_at_host_speed_now_us']:,.0f} | "
                  f"{r['host_speed_now_rel_error']:+.1%} | ") if now else ""
        lines.append(f"| {r['model']} | {r['kind']} | {r['segments']} | {r['metric']} | {r['measured_us']:,.0f} | "
                     f"{r['predicted_us']:,.0f} | {r['rel_error']:+.1%} | {at_now}"
                     f"{r['predicted_from_measured_segments_us']:,.0f} | {r['runtime_model_rel_error']:+.1%} | "
                     f"{r['predicted_from_in_flight_segments_us']:,.0f} | "
                     f"{r['runtime_model_in_flight_rel_error']:+.1%} |")
    lines += ["", "| model | 1 core, sequential (µs) | 2 threads, sequential (µs) | "
              "same plan, sequential, 2 threads (µs) | "
              f"tasks, 1 request (µs) | tasks, period of {requests} (µs) | 1 request vs 1 core | "
              "throughput vs 1 core | throughput vs 2 threads | kernels predicted / measured |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for e in extras:
        lines.append(f"| {e['model']} | {e['one_core_us']:,.0f} | {e['two_threads_us']:,.0f} | "
                     f"{e['sequential_same_plan_us']:,.0f} | "
                     f"{e['tasks_one_request_us']:,.0f} | {e['tasks_period_us']:,.0f} | "
                     f"{e['speedup_one_request_vs_one_core']:.2f}x | {e['throughput_vs_one_core']:.2f}x | "
                     f"{e['throughput_vs_two_threads']:.2f}x | "
                     f"{1 + e['cost_rel_error']:.2f} |")
    lines += ["", "One request, the task runtime against the same plan's sequential executable on one core (the "
              "calling thread's pool on the first core: what each worker has), alternated call by call; the goal is a "
              "difference no larger than the runtime's measured overhead (per segment, plus admission and completion); "
              "'yes' when the whole 95% interval of the median difference is within it, 'no' when all of it is above:",
              "", "| model | segments | pairs | tasks (µs) | sequential, 1 core (µs) | tasks - sequential, median "
              "(quartiles) (µs) | 95% interval of that median (µs) | overhead allowance (µs) | within |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for e in extras:
        p = e["tasks_vs_sequential_one_core"]
        low, high = p["difference_quartiles_us"]
        ci_low, ci_high = p["difference_median_95ci_us"]
        allowance = e["overhead_allowance_us"]
        within = ("yes" if ci_high <= allowance else "no" if ci_low > allowance
                  else "at noise: " + ("median within" if p["difference_us"] <= allowance else "median above"))
        lines.append(f"| {e['model']} | {e['segments']} | {p['pairs']} | {p['tasks_us']:,.0f} | "
                     f"{p['sequential_one_core_us']:,.0f} | {p['difference_us']:+,.0f} ({low:+,.0f} .. {high:+,.0f}) | "
                     f"{ci_low:+,.0f} .. {ci_high:+,.0f} | {allowance:,.0f} | {within} |")
    return lines


def run_in_child(name: str, argv: list[str], attempts: int = 2) -> tuple[list[dict], dict]:
    """One model's records, measured by this script in a process of its own (tried ``attempts`` times)."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        for attempt in range(1, attempts + 1):
            done = subprocess.run([sys.executable, __file__, *argv, "--one-model", name, "--result-file", str(result)],
                                  check=False)
            if done.returncode == 0 and result.exists():
                data = json.loads(result.read_text())
                return data["records"], data["extra"]
            log.warning("%s: the measuring process ended with status %s (attempt %d of %d)", name, done.returncode,
                        attempt, attempts)
    raise SystemExit(f"{name}: no result after {attempts} attempts")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--method", default="portfolio")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--min-calls", type=int, default=10)
    parser.add_argument("--pairs", type=int, default=60,
                        help="alternated single requests, task runtime vs the same plan sequential on one core")
    parser.add_argument("--min-seconds", type=float, default=2.0)
    parser.add_argument("--size", type=int, default=None, help="model size option (zoo default when omitted)")
    parser.add_argument("--no-work-sharing", action="store_true",
                        help="plan and run the static placement: no continuation or work sharing between the two "
                        "core groups (the runtime's default shares work)")
    parser.add_argument("--no-host-speed", action="store_true",
                        help="skip timing the calibration suite per model (the 'host speed now' columns)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--summary", default="hetpart/driver/data/simulator_fidelity.json",
                        help="where the report's summary goes ('' to skip)")
    parser.add_argument("--one-model", default="", help=argparse.SUPPRESS)      # a child: one model, then exit
    parser.add_argument("--result-file", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from hetpart.driver.report_fidelity import host_cpu_label

    cores = tuple(sorted(os.sched_getaffinity(0))[:2])
    if len(cores) < 2:
        raise SystemExit("two one-core CPU devices need a process allowed on two cores")
    spec = f"cpu:{cores[0]},cpu:{cores[1]}"
    records, extras = [], []
    if args.one_model:
        speed = None if args.no_host_speed else HostSpeedNow(cores[0])
        got, extra = run_model(args.one_model, spec, cores, args.method, args, speed)
        args.result_file.write_text(json.dumps({"records": got, "extra": extra}, default=str))
        sys.stdout.flush()
        # each model runs in a process of its own, left without the interpreter's teardown: the segfaults once
        # seen there (VMExecutable::~VMExecutable) came from two workers making their VMs at once, which
        # tvm_passes.virtual_machine now prevents; the separate processes keep one model's memory off the next
        os._exit(0)
    for name in [m for m in args.models.split(",") if m]:
        got, extra = run_in_child(name, sys.argv[1:])
        records += got
        extras.append(extra)
    errors = [abs(r["rel_error"]) for r in records]
    model_errors = [abs(r["runtime_model_rel_error"]) for r in records]
    in_flight_errors = [abs(r["runtime_model_in_flight_rel_error"]) for r in records]
    command = ("python benchmarks/simulator_fidelity.py --models " + args.models + f" --method {args.method} "
               f"--requests {args.requests} --rounds {args.rounds}" + (f" --size {args.size}" if args.size else "")
               + (" --no-host-speed" if args.no_host_speed else "")
               + (" --no-work-sharing" if args.no_work_sharing else "")
               + (f" --out {args.out.as_posix()}" if args.out != DEFAULT_OUT else ""))
    summary = {"config": "cpu-core-devices", "devices": "two CPU devices, one core each", "host_cpu": host_cpu_label(),
               "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cases": len(records),
               "median_abs_rel_error": statistics.median(errors), "worst_abs_rel_error": max(errors),
               "runtime_model_median_abs_rel_error": statistics.median(model_errors),
               "runtime_model_worst_abs_rel_error": max(model_errors),
               "runtime_model_in_flight_median_abs_rel_error": statistics.median(in_flight_errors),
               "runtime_model_in_flight_worst_abs_rel_error": max(in_flight_errors),
               "command": command}
    speed_measured = not args.no_host_speed
    if speed_measured:
        now_errors = [abs(r["host_speed_now_rel_error"]) for r in records]
        summary.update({"host_speed_now_median_abs_rel_error": statistics.median(now_errors),
                        "host_speed_now_worst_abs_rel_error": max(now_errors),
                        "host_speed_drift": [e["host_speed"]["drift"] for e in extras],
                        "host_speed_reference": extras[0]["host_speed"]["reference"]})
    slowdowns = [e["segments_in_flight_vs_alone"] or 1.0 for e in extras]
    args.out.mkdir(parents=True, exist_ok=True)
    records_path = args.out.parent / f"{args.out.name}.json"    # simulator_fidelity/ -> simulator_fidelity.json
    records_path.write_text(json.dumps(
        {"summary": summary, "records": records, "measurements": extras,
         "tvm_num_threads": int(os.environ["TVM_NUM_THREADS"]), "platform": platform.platform()}, indent=1))
    lines = ["# Simulator fidelity: the task runtime on two one-core CPU devices", "",
             f"Command: `{command}` ({summary['measured_at']}, {summary['host_cpu']}, TVM_NUM_THREADS="
             f"{os.environ['TVM_NUM_THREADS']}). Records: `{records_path.name}` beside this directory.", "",
             f"Over {len(records)} cases, with predicted costs: median |error| **{summary['median_abs_rel_error']:.1%}**, "
             f"worst **{summary['worst_abs_rel_error']:.1%}**; with each segment's measured time (the runtime model "
             f"alone): median **{summary['runtime_model_median_abs_rel_error']:.1%}**, worst "
             f"**{summary['runtime_model_worst_abs_rel_error']:.1%}** (goal: median <= 10%, worst <= 20%); with the "
             f"periods simulated from the segment times measured in flight (beside the other core's segments: "
             f"x{min(slowdowns):.2f}-x{max(slowdowns):.2f} their time alone): median "
             f"**{summary['runtime_model_in_flight_median_abs_rel_error']:.1%}**, worst "
             f"**{summary['runtime_model_in_flight_worst_abs_rel_error']:.1%}**.", ""]
    if speed_measured:
        drift = summary["host_speed_drift"]
        lines += [f"With the predicted costs re-scaled to the host's speed in the same run (the calibration suite "
                  f"timed again before each model's predictions; x{min(drift):.2f}-x{max(drift):.2f} against the "
                  f"reference the compile's costs had, {extras[0]['host_speed']['cached_measured_at']}): median "
                  f"**{summary['host_speed_now_median_abs_rel_error']:.1%}**, worst "
                  f"**{summary['host_speed_now_worst_abs_rel_error']:.1%}**.", ""]
    lines += table(records, extras, args.requests)
    lines += ["", "error = predicted / measured - 1. 'kernels predicted / measured' compares the predicted kernel "
              "time of one request with the time the runtime spent inside segment calls (its trace): the part of "
              "the error that comes from the cost predictions rather than from the runtime model."]
    (args.out / "README.md").write_text("\n".join(lines) + "\n")
    if args.summary:
        Path(args.summary).parent.mkdir(parents=True, exist_ok=True)
        Path(args.summary).write_text(json.dumps(summary, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
