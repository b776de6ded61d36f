"""predictors.profiling.model_timing: the least contended of several windows, for kernels and for whole models."""
from __future__ import annotations

import pytest

from tests.predictors.profiling.test_zoo_profile import tiny_cnn


@pytest.mark.tvm
def test_best_window_profiler_keeps_the_least_contended_window():
    from predictors.profiling.profiler import KernelProfiler
    from predictors.profiling.synthetic_modules import build_synthetic_module
    from predictors.profiling.workloads import kernels_of_module
    from predictors.profiling.model_timing import BestWindowProfiler

    (workload,) = kernels_of_module(build_synthetic_module(SyntheticSpec_add()))
    calls = {"kernel": 0}

    def timer(kernel, number, repeat):
        if kernel.workload.name.startswith("matmul"):            # the canary: always clean
            return [100e-6] * repeat
        calls["kernel"] += 1
        contended = calls["kernel"] <= 2                         # probe + first attempt: the first window
        return [4e-3 if contended else 25e-6] * repeat

    profiler = BestWindowProfiler("cpu", timer=timer, windows=3)
    row = profiler.measure(workload)
    assert row.status == "ok" and row.median_us == pytest.approx(25.0)
    assert calls["kernel"] == 6                                  # 3 windows of probe + 1 attempt (spread 0)
    plain = KernelProfiler("cpu", timer=lambda k, n, r: [100e-6 if k.workload.name.startswith("matmul") else 4e-3] * r)
    assert plain.measure(workload).median_us == pytest.approx(4000.0)   # one window keeps the contended time


def SyntheticSpec_add():
    from predictors.synthetic_spec import SyntheticSpec

    return SyntheticSpec.of("add_relu", n=1, c=4, hw=8)


@pytest.mark.tvm
@pytest.mark.parametrize("canaries, expected_median, expected_clean", [
    ([72, 73, 95, 96, 72, 74], 40.0, True),      # windows 1 and 3 clean: the lower of their medians
    ([95, 96, 90, 99, 92, 93], 30.0, False),     # every window contended: the lowest, flagged
])
def test_whole_model_timing_prefers_clean_windows(canaries, expected_median, expected_clean):
    from predictors.profiling import sampling
    from predictors.profiling.profiler import KernelProfiler, TimingStats
    from predictors.profiling.model_timing import measure_model

    class ScriptedProfiler(KernelProfiler):
        """Canaries and model medians follow a script: window 2 (median 30 us) is always contended."""
        def __init__(self):
            super().__init__("cpu")
            self.canary_script, self.medians = list(canaries), [50.0, 30.0, 40.0]

        def canary_us(self):
            return float(self.canary_script.pop(0))

        @property
        def canary_reference_us(self):
            return 72.0

        def time_kernel(self, kernel):
            m = self.medians.pop(0)
            return [TimingStats((m - 0.1, m, m + 0.1), 1)]

    median, spread, canary, clean = measure_model(tiny_cnn(sampling.ModelVariant("tiny", 1, 8, "tiny", 0)),
                                                  ScriptedProfiler(), windows=3)
    assert (median, clean) == (expected_median, expected_clean) and spread < 0.01
