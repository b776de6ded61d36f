"""A zoo model's kernel graph, cost table and plan stay exactly what they were when this golden file was written:
restructuring the packages must not change what a compile decides. Host-independent: the CPU predictor is the
shipped Zen 4 file, unscaled (its features use the target it records), the GPU the P2200 datasheet model.

Regenerate deliberately (after a change meant to alter costs or plans) with
``python tests/hetpart/test_golden_plan.py``."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.tvm

GOLDEN = Path(__file__).parent / "golden" / "googlenet_p2200_heft.json"
MODEL, PRESET, METHOD = "googlenet", "p2200", "heft"


def plan_now() -> dict:
    from hetpart.driver.compiler import parse_devices
    from hetpart.partition import get_method
    from predictors.analytic import AnalyticGpuModel
    from predictors.costs import build_cost_table
    from predictors.device_predictor import DevicePredictor
    from predictors.registry import shipped_cpu_predictor_path
    from tvm_passes import sources
    from tvm_passes.extract import extract_op_graph

    imported = sources.import_model(MODEL)
    graph = extract_op_graph(imported.mod, name=imported.name, source_hash=imported.source_hash,
                             param_inputs=imported.param_inputs).kernel_graph()
    choice = parse_devices(f"cpu,gpu={PRESET}")
    cpu = DevicePredictor.load(shipped_cpu_predictor_path("znver4"))
    costs = build_cost_table(graph, {"cpu": cpu, "gpu": AnalyticGpuModel(PRESET)}, choice.devices)
    plan = get_method(METHOD)(graph, costs, None)
    return {"graph_hash": graph.structure_hash(), "latency_us": costs.latency_us.tolist(),
            "device_of": list(plan.device_of), "order": list(plan.order), "makespan_us": plan.makespan_us}


def test_a_zoo_plan_is_unchanged():
    golden, now = json.loads(GOLDEN.read_text()), plan_now()
    assert now["graph_hash"] == golden["graph_hash"]
    np.testing.assert_allclose(now["latency_us"], golden["latency_us"], rtol=1e-9)
    assert now["device_of"] == golden["device_of"] and now["order"] == golden["order"]
    assert now["makespan_us"] == pytest.approx(golden["makespan_us"], rel=1e-9)


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(plan_now()))
    print(f"wrote {GOLDEN}")
