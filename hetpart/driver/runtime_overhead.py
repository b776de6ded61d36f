"""What one segment costs the task runtime beyond its kernels, measured here: the ``RuntimeModel`` the simulator
uses for a task-runtime plan (``hetpart.simulate_requests``).

A chain of tiny element-wise ops (1 x 16 float32) runs under two plans of one module on the deployment's devices,
interleaved: every op on the host (one segment) and the ops alternating between the host and another device (one
segment per op, a copy before each). The overhead per segment is the difference per added segment; the kernels
are the same in both plans, so they cancel. It is dispatch, the hand-off between worker threads and a 64-byte copy
(``benchmarks/dispatch_overhead.py`` is the long form, with its figures in ``benchmarks/results``).

The measurement takes about a second; a busy host inflates it (contention only adds time), so the result records
when it was measured, and the median of several interleaved rounds is kept.
"""
from __future__ import annotations

import datetime
import logging
import statistics
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from hetpart.errors import UsageError
from hetpart.simulate_requests import RuntimeModel

log = logging.getLogger(__name__)

CHAIN_OPS = 16


@dataclass(frozen=True)
class DispatchOverhead:
    """The measured overhead per segment (µs), the same for every device of the runtime."""

    overhead_us: float
    one_segment_us: float          # median per request, one segment
    alternating_us: float          # median per request, one segment per op
    segments_added: int
    measured_at: str

    def runtime_model(self, device_names: Sequence[str]) -> RuntimeModel:
        return RuntimeModel(dispatch_overhead_us_by_device={name: self.overhead_us for name in device_names},
                            copies="consumer")

    def to_dict(self) -> dict[str, Any]:
        return {"overhead_us": self.overhead_us, "one_segment_us": self.one_segment_us,
                "alternating_us": self.alternating_us, "segments_added": self.segments_added,
                "measured_at": self.measured_at}


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


def measure_dispatch_overhead(devices: Sequence[Mapping[str, Any]], *, requests: int = 40,
                              rounds: int = 5) -> DispatchOverhead:
    """Measure the overhead per segment of the task runtime on ``devices`` (name, kind, cores; the host first, at
    least two devices)."""
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
    runtimes = {}
    try:
        for name, device_of in plans.items():
            plan = Plan(device_of=device_of, order=range(graph.num_ops), devices=names, method="fixed",
                        graph_hash=graph.structure_hash(), level="op").validate(graph)
            runtimes[name] = TaskRuntime.from_module(chain_module(), graph, plan, gpu_devices=gpus,
                                                     devices=list(devices))
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
    finally:
        for rt in runtimes.values():
            rt.close()
    median = {name: statistics.median(values) for name, values in per_request.items()}
    added = segments["alternating"] - segments["one_segment"]
    overhead = max(0.0, (median["alternating"] - median["one_segment"]) / added)
    result = DispatchOverhead(overhead, median["one_segment"], median["alternating"], added,
                              datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    log.info("task runtime overhead per segment measured here: %.1f us (%s and %s)", overhead, host, other)
    return result
