"""benchmarks/predictor_accuracy.py: profile runs read back from a ``hetpart profile`` log as rich writes it (long
lines wrapped, other log lines after the summary)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    saved = list(sys.path)
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import predictor_accuracy
        yield predictor_accuracy
    finally:
        sys.path[:] = saved


def test_a_wrapped_profile_summary_followed_by_other_lines_is_read(bench, tmp_path):
    log = tmp_path / "profile.log"
    log.write_text(
        '[02:22:25] INFO     profile summary: {"variants": 28, "kernels_measured": 2614,\n'
        '                    "failed_variants": {}, "elapsed_s": 1362.5}\n'
        "           WARNING  the canary takes 113.5 us now against 104.9 us: the host is slower {or busy}\n"
        "[02:22:26] INFO     padded the columns of 1 constant-weight matmul(s)\n"
        '[03:04:52] INFO     profile summary: {"variants": 2, "elapsed_s": 60.0}\n')
    runs = bench.logged_runs([log])
    assert [r["elapsed_s"] for r in runs] == [1362.5, 60.0]
    assert runs[0]["summary"]["kernels_measured"] == 2614 and runs[0]["summary"]["failed_variants"] == {}
