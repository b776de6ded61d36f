"""Host calibration: a CPU predictor used on another CPU (or thread count) is scaled by a suite timed on the host."""
import copy
import json

import numpy as np
import pytest

from hetpart.errors import PredictorError
from predictors import host_calibration
from predictors.context import ContextTerms
from predictors.device_predictor import DevicePredictor
from predictors.host_calibration import (CalibrationKernel, HostScaledPredictor, measure_suite, scale_by_suite,
                                         suite_cache_path, suite_speed_ratio)
from predictors.sampling import SyntheticSpec
from tests.predictors.synthetic_kernels import random_kernels, synthetic_latency_us


@pytest.fixture(scope="module")
def fitted():
    rng = np.random.default_rng(4)
    nodes = random_kernels(rng, 300, ("conv2d", "matmul", "elementwise"))
    predictor = DevicePredictor(device="cpu", target={"kind": "llvm", "mcpu": "znver5"}, num_threads=2)
    predictor.fit(nodes, synthetic_latency_us(nodes, rng, 0.02))
    predictor.context = ContextTerms(1.5, 30.0, 2 ** 24)
    from predictors.zoo_profile import PIPELINE_VERSION

    # kernels of today's CPU rules: no stale-rules warning mixes with the ones these tests look for
    predictor.fit_info["training"] = {"canary_reference_us": 70.0, "pipeline_versions": [PIPELINE_VERSION]}
    return predictor, nodes


def _calibration(predictor, nodes, factors):
    """Calibration kernels whose host latency is ``factor`` x the predictor's own prediction."""
    predicted = predictor.predict(nodes[:len(factors)])
    return [CalibrationKernel(f"k{i}", node, float(p * f))
            for i, (node, p, f) in enumerate(zip(nodes, predicted, factors))]


def test_the_ratio_is_the_geometric_mean_of_measured_over_predicted(fitted):
    predictor, nodes = fitted
    ratio, rows = suite_speed_ratio(predictor, _calibration(predictor, nodes, [0.5, 2.0, 4.0, 4.0]))
    assert ratio == pytest.approx(2.0)                   # (0.5 * 2 * 4 * 4) ** (1/4)
    assert [r["host_us"] / r["predicted_us"] for r in rows] == pytest.approx([0.5, 2.0, 4.0, 4.0])
    with pytest.raises(PredictorError, match="at least one"):
        suite_speed_ratio(predictor, [])


def test_every_prediction_is_multiplied_by_the_ratio(fitted):
    predictor, nodes = fitted
    scaled = scale_by_suite(predictor, _calibration(predictor, nodes, [3.0, 3.0, 3.0]), "znver4", 2)
    assert isinstance(scaled, HostScaledPredictor) and scaled.speed_ratio == pytest.approx(3.0)
    np.testing.assert_allclose(scaled.predict(nodes), 3.0 * predictor.predict(nodes))
    # the in-model terms (per-kernel overhead, cold weights) scale too, so whole models scale by exactly the ratio
    np.testing.assert_allclose(scaled.predict_in_context(nodes), 3.0 * predictor.predict_in_context(nodes))
    prov = scaled.provenance()["host_scaling"]
    assert prov["speed_ratio"] == pytest.approx(3.0) and prov["n_kernels"] == 3
    assert prov["predictor_cpu"] == "znver5" and prov["host_cpu"] == "znver4" and prov["predictor_threads"] == 2
    assert scaled.provenance()["target"]["mcpu"] == "znver5"      # still says where the coefficients were measured
    with pytest.raises(PredictorError, match="positive number"):
        HostScaledPredictor(predictor, 0.0, {})


SMALL_SUITE = (SyntheticSpec.of("add_relu", n=1, c=16, hw=28), SyntheticSpec.of("matmul", m=8, k=64, n=64))


@pytest.mark.tvm
def test_the_suite_is_timed_once_per_host_and_kept(tmp_path, monkeypatch):
    from predictors.profiler import num_threads

    monkeypatch.setenv("HETPART_CACHE_DIR", str(tmp_path))
    measure_suite.cache_clear()
    threads = num_threads()
    kernels = measure_suite("somecpu", threads, SMALL_SUITE)
    assert [k.name.split("/")[0] for k in kernels] == [s.name for s in SMALL_SUITE]
    assert all(0.05 < k.host_us < 1e5 for k in kernels)
    assert kernels[1].node.flops == 2 * 8 * 64 * 64 + 8 * 64       # the kernel's features, as profiled (bias add)
    path = suite_cache_path("somecpu", threads, SMALL_SUITE)
    assert path.parent == tmp_path / "calibration" and json.loads(path.read_text())["num_threads"] == threads
    # a new process reads the file instead of timing again
    measure_suite.cache_clear()
    monkeypatch.setattr("predictors.profiler.KernelProfiler.measure", lambda *a: pytest.fail("timed again"))
    assert measure_suite("somecpu", threads, SMALL_SUITE) == kernels
    # another thread count than TVM's pool cannot be timed here
    with pytest.raises(PredictorError, match="TVM's pool runs"):
        measure_suite("somecpu", threads + 1, SMALL_SUITE)
    measure_suite.cache_clear()


def test_an_unreadable_calibration_file_is_measured_again(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("HETPART_CACHE_DIR", str(tmp_path))
    path = suite_cache_path("somecpu", 2, SMALL_SUITE)
    path.parent.mkdir(parents=True)
    path.write_text('{"kernels": [{"name": "x"}]}')
    with caplog.at_level("WARNING", logger="predictors.host_calibration"):
        assert host_calibration._load_cached(path) is None
    assert "unreadable host calibration" in caplog.text


def test_too_few_clean_timings_refuse_to_scale(tmp_path, monkeypatch):
    from predictors.profiler import num_threads
    from predictors.store import Measurement

    monkeypatch.setenv("HETPART_CACHE_DIR", str(tmp_path))
    measure_suite.cache_clear()

    def contended(self, workload):
        return Measurement(key_hash=workload.key_hash, workload_key=workload.workload_key, kernel_name=workload.name,
                           device="cpu", target="llvm", tvm_version="x", num_threads=num_threads(),
                           canary_kernel="c", features=workload.features, session_id="s", canary_us=None,
                           median_us=None, mad_us=None, spread=None, n_repeats=0, number=0, samples_us=(),
                           status="rejected_noisy", error="contended", timestamp_s=0.0)

    monkeypatch.setattr("predictors.profiler.KernelProfiler.measure", contended)
    with pytest.raises(PredictorError, match="only 0 of the 2 calibration kernels"):
        measure_suite("busycpu", num_threads(), SMALL_SUITE)
    assert not suite_cache_path("busycpu", num_threads(), SMALL_SUITE).exists()
    measure_suite.cache_clear()


def test_compile_scales_a_foreign_predictor_and_says_so(fitted, tmp_path, monkeypatch, caplog):
    import hetpart.compiler as compiler

    predictor, nodes = fitted
    predictor.save(tmp_path / "cpu.json")
    loaded_base = DevicePredictor.load(tmp_path / "cpu.json")
    suite = _calibration(loaded_base, nodes, [0.25, 1.0])                            # a host twice as fast
    monkeypatch.setattr(host_calibration, "measure_suite", lambda host, threads: suite)
    monkeypatch.setenv("TVM_NUM_THREADS", "2")
    for host, scaled in (("znver5", False), ("znver4", True)):
        monkeypatch.setattr(compiler, "host_cpu_name", lambda host=host: host)
        caplog.clear()
        with caplog.at_level("WARNING", logger="hetpart.compiler"):
            loaded = compiler.load_cpu_predictor(tmp_path / "cpu.json")
        assert isinstance(loaded, HostScaledPredictor) is scaled
        if scaled:
            np.testing.assert_allclose(loaded.predict(nodes), 0.5 * predictor.predict(nodes))
            assert "its CPU costs are scaled x0.50 by a calibration suite" in caplog.text
            note = compiler.cpu_cost_note(loaded, tmp_path / "cpu.json")
            assert "measured on a znver5 CPU" in note and "scaled x0.50 to this host" in note
            assert "over 2 calibration kernels timed here with 2 thread(s) (x0.25 to x1.00 per kernel)" in note
        else:
            assert not caplog.records
    # kernels timed with another thread count than the deployment's are scaled as well, on the same CPU
    single = copy.deepcopy(predictor)
    single.num_threads = 1
    single.save(tmp_path / "cpu_1thread.json")
    monkeypatch.setattr(compiler, "host_cpu_name", lambda: "znver5")
    assert isinstance(compiler.load_cpu_predictor(tmp_path / "cpu_1thread.json"), HostScaledPredictor)
    caplog.clear()
    monkeypatch.setattr(compiler, "host_cpu_name", lambda: "znver4")
    with caplog.at_level("WARNING", logger="hetpart.compiler"):
        unscaled = compiler.load_cpu_predictor(tmp_path / "cpu.json", scale_to_host=False)
    assert isinstance(unscaled, DevicePredictor) and "its CPU costs are not scaled" in caplog.text
