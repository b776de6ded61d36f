"""Canary scaling: a CPU predictor used on another CPU is multiplied by the canary's speed ratio, everywhere."""
import copy

import numpy as np
import pytest

from hetpart.errors import PredictorError
from predictors.canary_scaling import CanaryScaledPredictor, host_canary_us, predictor_canary_us
from predictors.context import ContextTerms
from predictors.device_predictor import DevicePredictor
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


def test_every_prediction_is_multiplied_by_the_canary_ratio(fitted):
    predictor, nodes = fitted
    scaled = CanaryScaledPredictor(predictor, 140.0, "znver4", 2)
    assert scaled.speed_ratio == pytest.approx(2.0)
    np.testing.assert_allclose(scaled.predict(nodes), 2.0 * predictor.predict(nodes))
    # the in-model terms (per-kernel overhead, cold weights) scale too, so whole models scale by exactly the ratio
    np.testing.assert_allclose(scaled.predict_in_context(nodes), 2.0 * predictor.predict_in_context(nodes))
    prov = scaled.provenance()
    assert prov["canary_scaling"]["speed_ratio"] == pytest.approx(2.0)
    assert prov["canary_scaling"]["predictor_cpu"] == "znver5" and prov["canary_scaling"]["host_cpu"] == "znver4"
    assert prov["target"]["mcpu"] == "znver5"           # still says where the coefficients were measured


def test_the_canary_survives_json_and_a_predictor_without_one_cannot_be_scaled(fitted, tmp_path):
    predictor, _ = fitted
    predictor.save(tmp_path / "cpu.json")
    assert predictor_canary_us(DevicePredictor.load(tmp_path / "cpu.json")) == 70.0
    bare = copy.deepcopy(predictor)
    del bare.fit_info["training"]
    assert predictor_canary_us(bare) is None
    with pytest.raises(PredictorError, match="records no canary latency"):
        CanaryScaledPredictor(bare, 100.0, "znver4", 2)
    with pytest.raises(PredictorError, match="positive latency"):
        CanaryScaledPredictor(predictor, 0.0, "znver4", 2)


def test_the_host_canary_is_timed_once_per_process():
    from predictors.profiler import num_threads

    threads = num_threads()
    first = host_canary_us(threads)
    assert 1.0 < first < 1e5                               # a 256^3 matmul: tens to hundreds of µs on a CPU
    assert host_canary_us(threads) == first                # cached, not re-timed
    with pytest.raises(PredictorError, match="TVM's pool runs"):
        host_canary_us(threads + 1)


def test_compile_scales_a_foreign_predictor_and_says_so(fitted, tmp_path, monkeypatch, caplog):
    import hetpart.compiler as compiler
    from predictors import canary_scaling

    predictor, nodes = fitted
    predictor.save(tmp_path / "cpu.json")
    monkeypatch.setattr(canary_scaling, "host_canary_us", lambda threads: 35.0)   # a host twice as fast
    monkeypatch.setenv("TVM_NUM_THREADS", "2")
    for host, scaled in (("znver5", False), ("znver4", True)):
        monkeypatch.setattr(compiler, "host_cpu_name", lambda host=host: host)
        caplog.clear()
        with caplog.at_level("WARNING", logger="hetpart.compiler"):
            loaded = compiler.load_cpu_predictor(tmp_path / "cpu.json")
        assert isinstance(loaded, CanaryScaledPredictor) is scaled
        if scaled:
            np.testing.assert_allclose(loaded.predict(nodes), 0.5 * predictor.predict(nodes))
            assert "its CPU costs are scaled x0.50 by the canary" in caplog.text
            note = compiler.cpu_cost_note(loaded, tmp_path / "cpu.json")
            assert "measured on a znver5 CPU" in note and "scaled x0.50 to this host" in note
            assert "35.0 µs here with 2 thread(s), 70.0 µs where it was measured" in note
        else:
            assert not caplog.records
    caplog.clear()
    with caplog.at_level("WARNING", logger="hetpart.compiler"):
        unscaled = compiler.load_cpu_predictor(tmp_path / "cpu.json", scale_to_host=False)
    assert isinstance(unscaled, DevicePredictor) and "its CPU costs are not scaled" in caplog.text
