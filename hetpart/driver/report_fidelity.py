"""The report's section on the task runtime: what the simulator predicts for it, and how far the simulator was from
measurements for this kind of device set.

The simulator's error is measured by ``benchmarks/simulator_fidelity.py`` (two one-core CPU devices running the
task runtime), the one device set this project can run for real; its summary ships as
``hetpart/driver/data/simulator_fidelity.json``. For a device set with a GPU no measurement exists (no CUDA where
hetpart is developed), and the report says so instead of quoting a figure.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Mapping, Sequence

from hetpart.devices import DeviceSet

log = logging.getLogger(__name__)

FIDELITY_FILE = Path(__file__).parent / "data" / "simulator_fidelity.json"
CPU_CORE_DEVICES = "cpu-core-devices"


def host_cpu_label() -> str:
    """This host's CPU as LLVM names it (e.g. ``znver4``), the name predictors are filed under."""
    from predictors.registry import host_cpu_name

    return host_cpu_name()


def device_set_config(devices: DeviceSet) -> str | None:
    """The measured configuration a device set belongs to: several CPU devices on their own cores, or None."""
    if len(devices.devices) > 1 and all(d.kind == "cpu" and d.cores for d in devices.devices):
        return CPU_CORE_DEVICES
    return None


def measured_fidelity(devices: DeviceSet, path: Path = FIDELITY_FILE) -> Mapping[str, Any] | None:
    """The shipped summary of the simulator's measured error for this kind of device set, if there is one."""
    config = device_set_config(devices)
    if config is None or not path.exists():
        return None
    try:
        summary = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        log.warning("cannot read the simulator's measured error from %s: %s", path, exc)
        return None
    return summary if summary.get("config") == config else None


def fidelity_note(devices: DeviceSet, path: Path = FIDELITY_FILE) -> str:
    """One sentence for the report: the simulator's measured error for this device set, or why none is known."""
    summary = measured_fidelity(devices, path)
    if summary is not None:
        return (f"Simulator error measured for {summary['devices']} against the task runtime, over "
                f"{summary['cases']} cases (one request and the steady-state period of many, zoo models; "
                f"{summary['host_cpu']} host, {summary['measured_at']}; `{summary['command']}`): with predicted "
                f"costs median {summary['median_abs_rel_error']:.0%}, worst {summary['worst_abs_rel_error']:.0%}; "
                f"given each segment's measured time (the runtime model alone) median "
                f"{summary['runtime_model_median_abs_rel_error']:.0%}, worst "
                f"{summary['runtime_model_worst_abs_rel_error']:.0%}" + _drift_clause(summary) + ".")
    if any(d.kind == "gpu" for d in devices.devices):
        return ("The simulator's error is not measured for device sets with a GPU (no CUDA GPU was available to "
                "run them); for two one-core CPU devices it is, see benchmarks/results/simulator_fidelity.")
    return ("The simulator's error is measured for several CPU devices on their own cores (e.g. --devices "
            "cpu:0,cpu:1); see benchmarks/results/simulator_fidelity.")


def _drift_clause(summary: Mapping[str, Any]) -> str:
    """How much of the predicted-cost error was the host's speed drifting since its calibration, when measured."""
    if "host_speed_now_median_abs_rel_error" not in summary:
        return ""
    drift = summary.get("host_speed_drift") or [1.0]
    since = ("since the CPU predictor's kernels were timed" if summary.get("host_speed_reference") == "predictor"
             else "since the cached calibration")
    return (f"; with the costs re-scaled to the host's speed at the time of the run (it had drifted "
            f"x{min(drift):.2f}-x{max(drift):.2f} {since}) median "
            f"{summary['host_speed_now_median_abs_rel_error']:.0%}, worst "
            f"{summary['host_speed_now_worst_abs_rel_error']:.0%}")


def _per_request_clause(prediction: Mapping[str, Any]) -> str:
    if "admission_us" not in prediction:        # predicted before per-request overheads were measured
        return ""
    return (f"; per request {prediction['admission_us']:,.0f} µs to admit it and {prediction['completion_us']:,.0f} µs "
            "to hand its outputs back")


def task_runtime_section(devices: DeviceSet, prediction: Mapping[str, Any] | None) -> list[str]:
    """Markdown lines: the predicted task-runtime figures (when the compile built segments) and the error note."""
    lines = ["## Task runtime (many requests)", ""]
    if prediction:
        n = prediction["requests"]
        groups = devices.interchangeable_groups()
        sharing = (" Equal CPU core groups (" + "; ".join(", ".join(g) for g in groups) + ") share work: a worker with "
                   "nothing of its own runs the others' ready segments, so requests in flight spread over all of "
                   "them whatever the placement (`--no-work-sharing` keeps it).") if groups else ""
        if prediction.get("cross_device_sharing"):
            sharing += (" Every segment is built for every device (cross-device sharing): a free worker takes another "
                        "device's ready segment when it is predicted to end it sooner, so whole requests also balance "
                        "across the devices (`--no-work-sharing` keeps the placement).")
        lines += [f"With `hetpart run DIR --mode tasks` the plan's {prediction['segments']} segments run on one worker "
                  f"thread per device.{sharing} Predicted with the runtime's overheads measured at compile time "
                  f"({prediction['overhead_per_segment_us']:,.1f} µs per segment" + _per_request_clause(prediction)
                  + "):", "",
                  f"- one request: {prediction['one_request_us']:,.0f} µs;",
                  f"- {n} requests in flight: one completes every {prediction['period_us']:,.0f} µs "
                  f"({1e6 / prediction['period_us']:,.1f} inferences/s), p50 latency "
                  f"{prediction['p50_latency_us']:,.0f} µs.", ""]
    else:
        lines += ["Compile with `--segments` to run the plan with one worker thread per device "
                  "(`hetpart run DIR --mode tasks`) and to see its predicted throughput here.", ""]
    return lines + [fidelity_note(devices), ""]


def predict_task_runtime(graph: Any, costs: Any, plan: Any, overhead: Any, segments: int,
                         requests: int = 16, model: Any = None) -> dict[str, Any]:
    """The numbers :func:`task_runtime_section` shows: ``simulate_requests`` for one and ``requests`` requests
    (``model``: the runtime model, by default ``overhead.runtime_model``)."""
    import numpy as np

    from hetpart.simulate_requests import simulate_requests

    model = model or overhead.runtime_model(costs.device_names)
    one = simulate_requests(graph, costs, plan, n_requests=1, runtime=model)
    many = simulate_requests(graph, costs, plan, n_requests=requests, runtime=model)
    return {"requests": requests, "segments": segments, "overhead_per_segment_us": overhead.overhead_us,
            "cross_device_sharing": model.cross_device_sharing,
            "admission_us": model.admission_us, "completion_us": model.completion_us,
            "overhead_measured_at": overhead.measured_at, "one_request_us": one.makespan_us,
            "period_us": many.period_us, "p50_latency_us": float(np.median(many.latency_us))}


def device_dicts(devices: DeviceSet) -> Sequence[dict[str, Any]]:
    return [{"name": d.name, "kind": d.kind, "cores": list(d.cores)} for d in devices.devices]
