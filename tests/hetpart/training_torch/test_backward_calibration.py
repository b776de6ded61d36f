"""The shipped backward/forward ratio table (schema, provenance, plausible values) and the measurement itself
(structure only: no wall-clock threshold in any assertion)."""
from __future__ import annotations

import json

import pytest

from hetpart.training.cost_model import BackwardRatios
from hetpart.training_torch.backward_calibration import SHIPPED_RATIOS, load_ratios

# kinds hetpart graphs are full of; the table must measure each of them
REQUIRED_KINDS = {"conv2d", "matmul", "batch_norm", "relu", "add", "max_pool2d", "avg_pool2d", "layer_norm",
                  "softmax", "take", "tanh", "sigmoid"}
# compute-bound kinds: backward computes two products (input and weight gradients) per forward product
COMPUTE_BOUND = ("conv2d", "matmul")


def test_the_shipped_table_loads_and_says_where_it_was_measured():
    data = json.loads(SHIPPED_RATIOS.read_text())
    assert {"kind_ratio", "default_ratio", "source", "host", "settings", "cases", "definition"} <= set(data)
    ratios = load_ratios()
    assert isinstance(ratios, BackwardRatios) and ratios.is_measured
    assert ratios.source.startswith("measured on ") and "torch" in ratios.source
    assert data["host"]["torch"] and data["host"]["threads"] >= 1 and data["host"]["cpu"]
    assert REQUIRED_KINDS <= set(ratios.kind_ratio)
    assert "GPU" in data["definition"]          # the GPU ratios are assumed equal, and the file says so


def test_the_shipped_ratios_are_plausible():
    ratios = load_ratios()
    for kind in COMPUTE_BOUND:
        assert 1.0 <= ratios.kind_ratio[kind] <= 4.0, kind
    assert 1.0 <= ratios.default_ratio <= 4.0
    # memory-bound kinds may be below 1 on torch's CPU kernels (a max-pool's forward searches every window, its
    # backward only scatters the winners), never zero, never absurd
    assert all(0.02 <= r <= 10.0 for r in ratios.kind_ratio.values())
    cases = json.loads(SHIPPED_RATIOS.read_text())["cases"]
    for case in cases:
        assert case["forward_us"] > 0 and case["backward_us"] > 0 and case["ratio"] > 0
        assert len(case["round_ratios"]) == json.loads(SHIPPED_RATIOS.read_text())["settings"]["rounds"]


def test_a_measurement_has_the_table_schema(tmp_path):
    pytest.importorskip("torch")
    from hetpart.training_torch.backward_calibration import measure_backward_ratios

    result = measure_backward_ratios(kinds=["relu", "Linear"], repeats=2, warmup=1, rounds=2)
    assert set(result.kind_ratio) == {"relu", "matmul"}
    assert {c.name for c in result.cases} == {"relu", "dense", "lstm_cell_gates", "ffn"}
    assert all(c.ratio > 0 and len(c.round_ratios) == 2 for c in result.cases)
    path = result.save(tmp_path / "ratios.json")
    assert BackwardRatios.load(path).kind_ratio == pytest.approx(result.kind_ratio, rel=1e-3)
