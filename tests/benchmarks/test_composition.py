"""benchmarks/composition.py on a tiny CNN: every kernel call is captured in order and replayed in every mode."""
from __future__ import annotations

import numpy as np
import pytest

from tests.predictors.profiling.test_zoo_profile import tiny_cnn
from tests.scripts import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("composition")


@pytest.mark.tvm
def test_replay_captures_the_kernel_calls_and_times_every_mode(bench):
    from predictors.profiling import sampling
    from predictors.profiling.profiler import KernelProfiler

    profiler = KernelProfiler("cpu")
    calls, model_us = bench.capture_calls(tiny_cnn(sampling.ModelVariant("tiny", 1, 8, "tiny", 0)), profiler)
    names = [name for name, _, _ in calls]
    assert len(names) >= 4 and not any(n.startswith("vm.builtin") for n in names)      # conv, pool, conv, matmul
    assert any("conv2d" in n for n in names) and any("matmul" in n for n in names)
    assert model_us > 0
    unrelated, evict = bench._vector_add_kernel(profiler, 16), bench._vector_add_kernel(profiler, 2 ** 16)
    for mode in bench.MODES:
        per_call = bench.replay(calls, mode, 2, unrelated, evict)
        assert per_call.shape == (len(calls),) and np.all(per_call > 0), mode
    report = {"command": "test", "host": "test", "target": profiler.target, "threads": 1, "evict_bytes": 2 ** 18,
              "models": [{"model": "tiny", "n_calls": len(calls), "model_us": model_us, "python_call_us": 1.0,
                          "sum_us": {m: 1.0 for m in bench.MODES}, "largest_gaps": []}]}
    assert "| tiny |" in bench.render_markdown(report)
