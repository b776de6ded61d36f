"""benchmarks/ort_optimized.py: a model saved by onnxruntime's optimizer, its fused op types listed, checked by
hetpart against onnxruntime, and the table."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.tvm_passes.test_onnx_fused import _small_cnn

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import ort_optimized
        yield ort_optimized
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.mark.tvm
def test_an_optimized_model_is_listed_checked_and_tabled(bench, tmp_path):
    saved, ops = bench.optimized(_small_cnn(tmp_path), "extended", tmp_path)
    assert saved.exists() and ops.get("com.microsoft.FusedConv", 0) >= 1, ops
    outcome = bench.check(saved)
    assert outcome["status"] == "matches", outcome
    table = bench.markdown({"meta": {"date": "d", "onnxruntime": "v", "level": "extended", "command": "c"},
                            "rows": {"cnn": {"ops": ops, "check": outcome}}})
    assert "| cnn | com.microsoft.FusedConv x" in table and "matches (" in table and "1 matches." in table
