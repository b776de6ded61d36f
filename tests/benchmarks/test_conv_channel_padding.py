"""benchmarks/conv_channel_padding.py: its models, one case timed end to end (one round), its table."""
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
        import conv_channel_padding
        yield conv_channel_padding
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_case_models_have_the_stated_shapes(bench, tmp_path):
    for name, c_in, c_out, kh, kw, sh, sw, height, width in bench.CASES:
        assert (c_out % 8 and c_out >= 33) != ("control" in name), name    # the pass pads all but the control
        path = bench.conv_onnx(tmp_path / "m.onnx", c_in, c_out, kh, kw, sh, sw, height, width)
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        out = session.run(None, {"x": np.ones((1, c_in, height, width), np.float32)})[0]
        assert out.shape == tuple(session.get_outputs()[0].shape) == (1, c_out, (height - kh) // sh + 1,
                                                                      (width - kw) // sw + 1), name


def test_one_case_is_checked_timed_and_tabulated(bench, tmp_path):
    row = bench.bench_case(("small", 8, 36, 3, 3, 2, 2, 12, 12), tmp_path, rounds=1, calls=1)
    assert row["as_written_max_rel_diff"] < 1e-4 and row["padded_max_rel_diff"] < 1e-4
    assert any("pad_conv_channels" in note for note in row["padded_notes"]) and not row["as_written_notes"]
    assert row["as_written_rounds"] == row["padded_rounds"] == 1 and row["onnxruntime_ms"] > 0
    table = bench.markdown([row], {"date": "d", "cpu": "c", "threads": "2", "rounds": 1, "calls_per_block": 1,
                                   "command": "cmd"})
    assert "| small |" in table and "median" in table
