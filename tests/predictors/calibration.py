"""Shared by the host-calibration tests: a two-kernel suite and a private calibration cache per test."""
from __future__ import annotations

import pytest

from predictors import host_calibration
from predictors.synthetic_spec import SyntheticSpec

SMALL_SUITE = (SyntheticSpec.of("add_relu", n=1, c=16, hw=28), SyntheticSpec.of("matmul", m=8, k=64, n=64))


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Every test keeps calibrations in its own directory and starts with none in the process."""
    monkeypatch.setenv("HETPART_CACHE_DIR", str(tmp_path / "cache"))
    host_calibration.forget_timings()
    yield
    host_calibration.forget_timings()
