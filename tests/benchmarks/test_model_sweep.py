"""benchmarks/model_sweep.py: export, compile and check one model outside the zoo; a refused export; the table."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def sweep():
    added = [str(BENCHMARKS), str(BENCHMARKS / "outside_models")]
    sys.path[:0] = added
    try:
        import model_sweep
        yield model_sweep
    finally:
        for path in added:
            sys.path.remove(path)


def test_every_architecture_runs_in_torch(sweep):
    import torch

    from architectures import MODELS

    assert len(MODELS) >= 20
    for name, (constructor, example_inputs) in MODELS.items():
        with torch.no_grad():
            constructor().eval()(*example_inputs())


def test_one_model_exported_compiled_checked_timed_and_tabulated(sweep, tmp_path):
    inputs, refused = sweep.export("einsum_attn", 17, tmp_path / "m.onnx")
    assert refused is None and inputs
    entry = sweep.check(tmp_path / "m.onnx", inputs)
    assert entry["status"] == "matches", entry
    timed = sweep.time_against_onnxruntime(tmp_path / "m.onnx", inputs, rounds=1, calls=1)
    assert timed["rules_ms"] > 0 and timed["onnxruntime_ms"] > 0
    _, refused_old = sweep.export("einsum_attn", 9, tmp_path / "old.onnx")     # einsum needs opset 12
    assert refused_old and "einsum" in refused_old.lower()
    result = {"meta": {"date": "d", "cpu": "c", "threads": "2", "models": ["einsum_attn"], "opsets": [9, 17],
                       "time_opset": 17, "rounds": 1, "calls_per_block": 1, "command": "cmd"},
              "rows": {"einsum_attn": {"9": {"export_error": refused_old}, "17": entry, "time": timed}}}
    table = sweep.markdown(result)
    assert "torch cannot export" in table and "matches" in table and "1 of 1 exported models" in table
