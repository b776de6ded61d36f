"""benchmarks/links.py: the copy link model ``latency_us + bytes / bandwidth`` fitted to timed copies."""
from __future__ import annotations

import pytest

from hetpart.errors import PredictorError
from tests.scripts import load_benchmark

tvm = pytest.importorskip("tvm")


@pytest.fixture(scope="module")
def links():
    return load_benchmark("links")


def test_fit_link_recovers_exact_parameters_and_rejects_noise(links):
    sizes = [4096 * 4 ** k for k in range(6)]
    times = [10.0 + s / 10e9 * 1e6 for s in sizes]                  # 10 us + bytes at 10 GB/s
    fit = links.fit_link(sizes, times, "cpu", "gpu")
    assert fit.link.latency_us == pytest.approx(10.0) and fit.link.bandwidth_bytes_per_s == pytest.approx(10e9)
    assert fit.link.source == "measured" and fit.max_relative_residual < 1e-9
    with pytest.raises(PredictorError, match="did not get slower"):
        links.fit_link(sizes, [50.0 - i for i in range(6)], "cpu", "gpu")


@pytest.mark.tvm
def test_copy_link_between_two_cpu_devices_is_measured(links):
    fit = links.measure_link(tvm.cpu(0), tvm.cpu(1), "cpu0", "cpu1", sizes_bytes=[4096 * 4 ** k for k in range(7)],
                             repeat=5)
    assert fit.link.bandwidth_bytes_per_s > 0 and fit.link.latency_us >= 0 and fit.link.source == "measured"
    assert fit.median_us[-1] > fit.median_us[0]          # 16 MiB takes longer than 4 KiB


@pytest.mark.gpu
def test_pcie_link(links):
    if not tvm.cuda(0).exist:
        pytest.skip("no CUDA device")
    fit = links.measure_link(tvm.cpu(0), tvm.cuda(0), "cpu", "gpu")
    assert fit.link.bandwidth_bytes_per_s > 0
