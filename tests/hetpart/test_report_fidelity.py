"""The report's sentence on the simulator's measured error, from the fidelity benchmark's summary."""
from __future__ import annotations

import json

from hetpart.devices import DeviceSet, cpu_device, gpu_from_preset, preset_links, shared_memory_link
from hetpart.driver.report_fidelity import fidelity_note

SUMMARY = {"config": "cpu-core-devices", "devices": "two CPU devices, one core each", "host_cpu": "znver3",
           "measured_at": "2026-01-01 00:00 UTC", "cases": 12, "median_abs_rel_error": 0.314,
           "worst_abs_rel_error": 0.48, "runtime_model_median_abs_rel_error": 0.051,
           "runtime_model_worst_abs_rel_error": 0.209, "command": "python benchmarks/simulator_fidelity.py"}


def _core_devices() -> DeviceSet:
    return DeviceSet((cpu_device(name="cpu0", cores=(0,)), cpu_device(name="cpu1", cores=(1,))),
                     (shared_memory_link("cpu0", "cpu1"), shared_memory_link("cpu1", "cpu0"))).validate()


def test_the_note_quotes_the_measured_errors_and_the_host_drift_when_measured(tmp_path):
    path = tmp_path / "fidelity.json"
    path.write_text(json.dumps(SUMMARY))
    note = fidelity_note(_core_devices(), path)
    assert "median 31%, worst 48%" in note and "median 5%, worst 21%" in note and "drifted" not in note
    path.write_text(json.dumps({**SUMMARY, "host_speed_now_median_abs_rel_error": 0.15,
                                "host_speed_now_worst_abs_rel_error": 0.379, "host_speed_drift": [1.17, 1.32, 1.2]}))
    note = fidelity_note(_core_devices(), path)
    assert "drifted x1.17-x1.32 since the cached calibration) median 15%, worst 38%." in note
    path.write_text(json.dumps({**SUMMARY, "host_speed_now_median_abs_rel_error": 0.033,
                                "host_speed_now_worst_abs_rel_error": 0.13, "host_speed_drift": [1.12, 1.29],
                                "host_speed_reference": "predictor"}))     # a predictor used unscaled
    note = fidelity_note(_core_devices(), path)
    assert "drifted x1.12-x1.29 since the CPU predictor's kernels were timed) median 3%, worst 13%." in note


def test_a_device_set_with_a_gpu_gets_no_figure(tmp_path):
    path = tmp_path / "fidelity.json"
    path.write_text(json.dumps(SUMMARY))
    devices = DeviceSet((cpu_device(), gpu_from_preset("t4")), preset_links("t4")).validate()
    assert "not measured for device sets with a GPU" in fidelity_note(devices, path)


def test_the_task_runtime_section_says_equal_core_groups_share_work():
    from hetpart.driver.report_fidelity import task_runtime_section

    prediction = {"requests": 16, "segments": 1, "overhead_per_segment_us": 30.0, "one_request_us": 1000.0,
                  "period_us": 500.0, "p50_latency_us": 4000.0}
    shared = "\n".join(task_runtime_section(_core_devices(), prediction))
    assert "Equal CPU core groups (cpu0, cpu1) share work" in shared and "--no-work-sharing" in shared
    gpu = DeviceSet((cpu_device(), gpu_from_preset("t4")), preset_links("t4"))
    assert "share work" not in "\n".join(task_runtime_section(gpu, prediction))
    across = "\n".join(task_runtime_section(gpu, {**prediction, "cross_device_sharing": True}))
    assert "built for every device (cross-device sharing)" in across
    assert "cross-device" not in "\n".join(task_runtime_section(gpu, {**prediction, "cross_device_sharing": False}))
