"""benchmarks/model_time_ab.py: per-tree medians and per-round ratios, and the other tree checked."""
from __future__ import annotations

import pytest

from tests.scripts import load_benchmark


@pytest.fixture(scope="module")
def model_time_ab():
    return load_benchmark("model_time_ab")


def _record(ms: float, diff: float = 1e-7) -> dict:
    return {"median_ms": ms, "max_abs_diff_vs_onnxruntime": diff}


def test_rows_pair_rounds_and_take_medians(model_time_ab):
    samples = {"lstm": {"this": [_record(8.0), _record(12.0), _record(9.0, 3e-7)],
                        "against": [_record(10.0), _record(10.0), _record(20.0)]}}
    (row,) = model_time_ab.summarize(samples)
    assert row["this_ms"] == 9.0 and row["against_ms"] == 10.0
    assert row["ratios"] == pytest.approx([0.8, 1.2, 0.45])       # round k of one tree against round k of the other
    assert row["ratio_median"] == pytest.approx(0.8)
    assert row["max_abs_diff"] == 3e-7
    text = model_time_ab._markdown({"meta": {"against_label": "../other", "measured_at": "now", "cpu": "x86_64",
                                             "tvm_threads": "2", "rounds": 3, "calls": 5, "command": "cmd"},
                                    "rows": [row]})
    assert "| lstm | 9.00 | 10.00 | 0.800, 1.200, 0.450 (median 0.800) | 3.0e-07 |" in text


def test_against_must_be_a_hetpart_checkout(model_time_ab, tmp_path):
    with pytest.raises(SystemExit):
        model_time_ab.main(["--models", "lstm_lm", "--against", str(tmp_path)])
