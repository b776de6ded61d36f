"""benchmarks/conv1d_rewrite.py: its models, one case timed end to end (one round), its table."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import conv1d_rewrite
        yield conv1d_rewrite
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.mark.parametrize("transposed", [False, True])
def test_case_models_have_the_stated_shapes(bench, tmp_path, transposed):
    for name, c_in, c_out, kernel, stride, dilation, pad, groups, length in (
            bench.TRANSPOSED_CASES if transposed else bench.CASES):
        path = bench.conv1d_onnx(tmp_path / "m.onnx", c_in, c_out, kernel, stride, dilation, pad, groups, length,
                                 transposed=transposed)
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        out = session.run(None, {"x": np.ones((1, c_in, length), np.float32)})[0]
        assert out.shape == tuple(session.get_outputs()[0].shape), name
        assert out.shape[1] == c_out


@pytest.mark.parametrize("transposed", [False, True])
def test_one_case_is_checked_timed_and_tabulated(bench, tmp_path, transposed):
    row = bench.bench_case(("small", 8, 16, 3, 2 if transposed else 1, 1, 1, 1, 32), tmp_path, rounds=1, calls=1,
                           transposed=transposed)
    assert row["as_imported_max_rel_diff"] < 1e-4 and row["rewritten_max_rel_diff"] < 1e-4
    assert row["as_imported_rounds"] == row["rewritten_rounds"] == 1 and row["onnxruntime_ms"] > 0
    table = bench.markdown([row], {"date": "d", "cpu": "c", "threads": "2", "rounds": 1, "calls_per_block": 1,
                                   "command": "cmd", "transposed": transposed})
    assert "| small |" in table and "median" in table
