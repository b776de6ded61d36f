"""benchmarks/half_precision.py: the float32 twin of a float16 file, one model measured end to end, its table."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from tests.tvm_passes.test_half_accumulate import SHAPE, half_model

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import half_precision
        yield half_precision
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_float32_twin_computes_the_same_weights_in_float32(bench, tmp_path):
    half = half_model(tmp_path / "m_float16.onnx")
    twin = bench.float32_twin(half)
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float16)
    run = {p: ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (half, twin)}
    single = run[twin].run(None, {"x": x.astype(np.float32)})[0]
    assert single.dtype == np.float32
    assert np.abs(run[half].run(None, {"x": x})[0] - single).max() <= 2e-3 * np.abs(single).max()


def test_one_model_is_measured_and_tabulated(bench, tmp_path):
    record = bench.measure("squeezenet1_1", tmp_path, rounds=1, threads=2)
    assert set(record["errors"]) == {"float32_sums", "float16_sums"} and not record["build_errors"]
    assert record["errors"]["float32_sums"] < record["errors"]["float16_sums"]
    assert set(record["ms"]) == {"onnxruntime", "float32_sums", "float16_sums"}
    meta = {"date": "now", "cpu": "cpu", "threads": 2, "rounds": 1, "wall_s": 1.0, "command": "python ..."}
    table = bench.markdown({"meta": meta, "records": [record]})
    assert "| squeezenet1_1 |" in table and "does not build" not in table
