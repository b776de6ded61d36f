"""What one segment costs the task runtime beyond its kernels, measured here: the ``RuntimeModel`` the simulator
uses for a task-runtime plan (``hetpart.simulate_requests``).

A chain of tiny element-wise ops (1 x 16 float32) runs under two plans of one module on the deployment's devices,
interleaved: every op on the host (one segment) and the ops alternating between the host and another device (one
segment per op, a copy before each). The overhead per segment is the difference per added segment; the kernels
are the same in both plans, so they cancel. It is dispatch, the hand-off between worker threads and a 64-byte copy
(``benchmarks/dispatch_overhead.py`` is the long form, with its figures in ``benchmarks/results``). The runtime's
continuation and work sharing are off for it (two CPU core groups would otherwise run the whole chain on one worker):
the simulator charges this overhead to every segment, including those a worker runs by continuation, which cost less.

Per request, one at a time on the host device (a one-segment module that streams a constant of
``rows`` x 16 float32 values, sized to last about as long as the model's request): the time from ``submit()`` to
the start of its segment (``admission_us``: checking and converting the inputs, waking the worker) and from the
segment's end to its future's result (``completion_us``: reading the outputs back). Both grow with the request:
the caller has slept through it and the runtime's own code runs on cold caches afterwards. On a 2-core Zen 3 guest,
admission + completion measured 81 µs after a 0.07 ms segment, 114 µs after 0.8 ms, 252 µs after 3 ms and 427 µs
after 10 ms.

The measurement takes a second or two; a busy host inflates it (contention only adds time), so the result records
when it was measured, and the median of several interleaved rounds is kept.
"""
from __future__ import annotations

import datetime
import logging
import math
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from hetpart.errors import UsageError
from hetpart.simulate_requests import RuntimeModel

log = logging.getLogger(__name__)

CHAIN_OPS = 16
STREAM_ROWS = 32768                       # the streaming module's default size (~0.8 ms on one Zen 3 core)
STREAM_ROWS_PER_US = 40                   # about how many rows one core streams per µs (sizes the probe)
STREAM_ROWS_RANGE = (2048, 262144)        # 0.07-10 ms on that core


@dataclass(frozen=True)
class DispatchOverhead:
    """The measured overhead per segment (µs), the same for every device of the runtime."""

    overhead_us: float
    one_segment_us: float          # median per request, one segment
    alternating_us: float          # median per request, one segment per op
    segments_added: int
    measured_at: str
    admission_us: float = 0.0      # median, submit() to the start of the request's segment
    completion_us: float = 0.0     # median, the end of its segment to its future's result
    request_probe_us: float = 0.0  # median time of the segment those two were measured around

    def runtime_model(self, device_names: Sequence[str]) -> RuntimeModel:
        return RuntimeModel(dispatch_overhead_us_by_device={name: self.overhead_us for name in device_names},
                            copies="consumer", admission_us=self.admission_us, completion_us=self.completion_us)

    def to_dict(self) -> dict[str, Any]:
        return {"overhead_us": self.overhead_us, "one_segment_us": self.one_segment_us,
                "alternating_us": self.alternating_us, "segments_added": self.segments_added,
                "measured_at": self.measured_at, "admission_us": self.admission_us,
                "completion_us": self.completion_us, "request_probe_us": self.request_probe_us}


def chain_module(n_ops: int = CHAIN_OPS) -> Any:
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            value = x
            scale, shift = relax.const(np.float32(0.5)), relax.const(np.float32(0.25))
            for k in range(n_ops):
                op = relax.op.multiply(value, scale) if k % 2 else relax.op.add(value, shift)
                value = bb.emit(op, name_hint=f"v{k}")
            out = bb.emit_output(value)
        bb.emit_func_output(out)
    return bb.get()


def streaming_module(rows: int = STREAM_ROWS) -> Any:
    """A request's worth of time and cache traffic on a small input: ``x`` (1 x 16) broadcast over a ``rows`` x 16
    float32 constant (2 MiB by default, beyond a core's L2), three element-wise ops over the result, and its column
    sums (1 x 16) out. Like a model's request, it leaves the caches cold for the runtime's own code."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16), "float32"))
    table = relax.const(np.random.default_rng(0).standard_normal((rows, 16)).astype(np.float32))
    with bb.function("main", [x]):
        with bb.dataflow():
            value = bb.emit(relax.op.add(table, x), name_hint="v0")
            value = bb.emit(relax.op.multiply(value, relax.const(np.float32(0.5))), name_hint="v1")
            value = bb.emit(relax.op.add(value, relax.const(np.float32(0.25))), name_hint="v2")
            value = bb.emit(relax.op.multiply(value, value), name_hint="v3")
            out = bb.emit_output(relax.op.sum(value, axis=[0], keepdims=True))
        bb.emit_func_output(out)
    return bb.get()


def stream_rows_for(request_us: float | None) -> int:
    """The streaming module's rows for a request of about ``request_us`` (None: the default size)."""
    if request_us is None or not math.isfinite(request_us):
        return STREAM_ROWS
    low, high = STREAM_ROWS_RANGE
    return int(min(high, max(low, round(request_us * STREAM_ROWS_PER_US / 1024) * 1024)))


def single_device_request_us(costs: Any) -> float:
    """The predicted time of one request on the fastest single device that runs every op (inf: none does): what
    sizes the per-request probe of :func:`measure_dispatch_overhead`."""
    latency, supported = np.asarray(costs.latency_us, dtype=np.float64), np.asarray(costs.supported, dtype=bool)
    totals = [float(latency[:, d].sum()) for d in range(latency.shape[1]) if supported[:, d].all()]
    return min(totals, default=math.inf)


def measure_dispatch_overhead(devices: Sequence[Mapping[str, Any]], *, requests: int = 40,
                              rounds: int = 5, request_us: float | None = None) -> DispatchOverhead:
    """Measure the overhead per segment of the task runtime on ``devices`` (name, kind, cores; the host first, at
    least two devices), and per request after a request of about ``request_us`` (e.g. the model's predicted time
    on the host; None: about 0.8 ms)."""
    from hetpart.driver.task_runtime import TaskRuntime
    from hetpart.plan import Plan
    from tvm_passes.extract import extract_op_graph

    if len(devices) < 2:
        raise UsageError(f"the dispatch overhead is measured between two devices; found {len(devices)} "
                         "(offer two, e.g. --devices cpu:0,cpu:1 or cpu,gpu)")
    host, other = str(devices[0]["name"]), str(devices[1]["name"])
    names = tuple(str(d["name"]) for d in devices)
    graph = extract_op_graph(chain_module(), with_kernels=False)
    plans = {
        "one_segment": [host] * graph.num_ops,
        "alternating": [host if k % 2 == 0 else other for k in range(graph.num_ops)],
    }
    gpus = [str(d["name"]) for d in devices if d["kind"] == "gpu"]

    def start(module: Any, op_graph: Any, device_of: Sequence[str], trace: bool = False) -> Any:
        plan = Plan(device_of=device_of, order=range(op_graph.num_ops), devices=names, method="fixed",
                    graph_hash=op_graph.structure_hash(), level="op").validate(op_graph)
        return TaskRuntime.from_module(module, op_graph, plan, gpu_devices=gpus, devices=list(devices), trace=trace,
                                       continuation=False, sharing=False)   # every segment handed over

    runtimes = {}
    try:
        for name, device_of in plans.items():
            runtimes[name] = start(chain_module(), graph, device_of)
        streaming = streaming_module(stream_rows_for(request_us))
        streaming_graph = extract_op_graph(streaming, with_kernels=False)
        runtimes["streaming"] = start(streaming, streaming_graph, [host] * streaming_graph.num_ops, trace=True)
        segments = {name: len(rt.program.functions) for name, rt in runtimes.items()}
        x = np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32)
        for rt in runtimes.values():
            rt(x)
        per_request: dict[str, list[float]] = {name: [] for name in plans}
        for round_index in range(rounds):
            for name in (plans if round_index % 2 == 0 else reversed(list(plans))):
                started = time.perf_counter()
                for _ in range(requests):
                    runtimes[name](x)
                per_request[name].append((time.perf_counter() - started) / requests * 1e6)
        admission_us, completion_us, probe_us = _request_overheads(runtimes["streaming"], x, requests)
    finally:
        for rt in runtimes.values():
            rt.close()
    median = {name: statistics.median(values) for name, values in per_request.items()}
    added = segments["alternating"] - segments["one_segment"]
    overhead = max(0.0, (median["alternating"] - median["one_segment"]) / added)
    result = DispatchOverhead(overhead, median["one_segment"], median["alternating"], added,
                              datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                              admission_us, completion_us, probe_us)
    log.info("task runtime overhead measured here: %.1f us per segment (%s and %s); %.1f us to admit a request and "
             "%.1f us to complete it (after a %.0f us request)", overhead, host, other, admission_us, completion_us,
             probe_us)
    return result


def _request_overheads(runtime: Any, x: np.ndarray, requests: int) -> tuple[float, float, float]:
    """Medians over ``requests`` one-at-a-time requests of a one-segment runtime with a trace: from ``submit()``
    to the segment's start, from its end to the future's result (stamped by a done-callback, in the thread
    that resolves it: the caller's own wake-up is not the runtime's), and the segment's own time."""
    admission, completion, segment = [], [], []
    for _ in range(requests):
        runtime.trace.clear()
        resolved: list[float] = []
        stamped = threading.Event()
        submitted = time.perf_counter()
        future = runtime.submit(x)
        future.add_done_callback(lambda _f: (resolved.append(time.perf_counter()), stamped.set()))
        future.result()
        stamped.wait()       # a future's callbacks run after its waiters are woken: result() can return first
        (run,) = runtime.trace
        admission.append((run.start_s - submitted) * 1e6)
        completion.append((resolved[0] - run.end_s) * 1e6)
        segment.append((run.end_s - run.start_s) * 1e6)
    return (max(0.0, statistics.median(admission)), max(0.0, statistics.median(completion)),
            statistics.median(segment))
