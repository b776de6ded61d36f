"""Error metrics (hand-computed), held-out splits, noise floor, baselines and the honest report."""
import json
import warnings

import numpy as np
import pytest

from hetpart.errors import PredictorError
from predictors.device_predictor import DevicePredictor
from predictors.features import kernel_kind
from predictors.fitting.baselines import BASELINES
from predictors.fitting.evaluate import (ModelRecord, cross_validate, default_methods, error_metrics, evaluate,
                                         kernel_report, model_level_floor, noise_floor, plot_predicted_vs_measured,
                                         spearman)
from tests.predictors.synthetic_kernels import random_kernels, synthetic_latency_us

FAMILY_KINDS = {"cnn": ("conv2d", "pool", "elementwise"), "mobile": ("depthwise_conv2d", "conv2d", "elementwise"),
                "mlp": ("matmul", "elementwise")}


def _dataset(n_models=6, kernels=40, seed=0):
    rng = np.random.default_rng(seed)
    data = {}
    for i in range(n_models):
        family = sorted(FAMILY_KINDS)[i % len(FAMILY_KINDS)]
        nodes = random_kernels(rng, kernels, FAMILY_KINDS[family])
        nodes = [n.__class__(**{**n.to_dict(), "name": f"{family}{i}/{n.name}"}) for n in nodes]
        lat = synthetic_latency_us(nodes, rng, 0.02)
        data[f"{family}{i}"] = (nodes, lat, float(lat.sum() + 2.0 * len(nodes)), family)
    return data


def test_error_metrics_match_hand_computed_values():
    m = error_metrics([100.0, 200.0, 50.0, 10.0], [110.0, 150.0, 50.0, 10.5])
    # APEs 0.10, 0.25, 0, 0.05; signed 0.10, -0.25, 0, 0.05
    assert m["n"] == 4
    assert m["mape"] == pytest.approx(0.10)
    assert m["median_ape"] == pytest.approx(0.075)
    assert m["within_10pct"] == pytest.approx(0.75)
    assert m["signed_bias"] == pytest.approx(-0.025)
    assert m["max_ape"] == pytest.approx(0.25)
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2], [1, 2]) is None
    with pytest.raises(PredictorError):
        error_metrics([0.0], [1.0])


def test_kernel_report_buckets_and_kinds():
    rep = kernel_report([5.0, 50.0, 500.0, 600.0], [5.5, 50.0, 400.0, 600.0], ["a", "a", "b", "b"])
    assert rep["lt_10us"]["n"] == 1 and rep["lt_10us"]["mape"] == pytest.approx(0.1)
    assert rep["10_to_100us"]["mape"] == 0.0
    assert rep["ge_100us"]["n"] == 2 and rep["ge_100us"]["mape"] == pytest.approx(0.1)
    assert rep["by_kind"]["b"]["n"] == 2 and rep["by_kind"]["a"]["spearman"] is None


def test_noise_floor_against_hand_computed_values():
    nf = noise_floor([[100.0, 110.0], [10.0, 10.0, 12.0]])
    # pairs (measured=median of others, repeat): (110,100) (100,110) (11,10) (11,10) (10,12)
    apes = [10 / 110, 10 / 100, 1 / 11, 1 / 11, 2 / 10]
    assert nf["n_kernels"] == 2 and nf["n"] == 5 and nf["mape"] == pytest.approx(np.mean(apes))
    with pytest.raises(PredictorError):
        noise_floor([[1.0]])


class _Recorder:
    """Wraps DevicePredictor and records the kernel names it was trained on."""
    trained_on: list = []

    def fit(self, nodes, latencies_us):
        _Recorder.trained_on.append({n.name.split("/")[0] for n in nodes})
        self.inner = DevicePredictor().fit(nodes, latencies_us)
        return self

    def predict(self, nodes):
        return self.inner.predict(nodes)


def test_held_out_models_and_families_are_never_trained_on():
    records = {k: ModelRecord(tuple(v[0]), tuple(v[1]), v[2], v[3]) for k, v in _dataset().items()}
    _Recorder.trained_on = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lomo = cross_validate(records, {n: n for n in records}, {"rec": _Recorder}, split_name="lomo")
    assert len(_Recorder.trained_on) == len(records)
    for held, seen in zip(sorted(records), _Recorder.trained_on):
        assert held not in seen and seen == set(records) - {held}
    assert set(lomo["rec"]["model"]["per_model"]) == set(records)
    _Recorder.trained_on = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cross_validate(records, {n: r.family for n, r in records.items()}, {"rec": _Recorder}, split_name="lofo")
    for family, seen in zip(sorted(FAMILY_KINDS), _Recorder.trained_on):
        assert not any(n.startswith(family) for n in seen)


class _Oracle:
    """Cheats on purpose (knows the true law): the report must say the polynomial loses to it."""

    def fit(self, nodes, latencies_us):
        return self

    def predict(self, nodes):
        return synthetic_latency_us(list(nodes))


def test_evaluate_report_is_json_honest_and_plots(tmp_path):
    calls = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rep = evaluate(_dataset(), repeats=[[10.0, 10.2], [50.0, 49.0]],
                       methods={"polynomial": DevicePredictor, "oracle": _Oracle,
                                "flops_constant": BASELINES["flops_constant"]},
                       progress=lambda stage, done, total: calls.append((stage, done, total)),
                       plot_path=tmp_path / "pvm.png")
    json.dumps(rep)
    lomo = rep["splits"]["leave_one_model_out"]
    assert set(lomo) == {"polynomial", "oracle", "flops_constant"}
    assert lomo["polynomial"]["kernel"]["all"]["n"] == rep["n_kernels"] == 240
    assert any("polynomial LOSES to oracle" in v for v in rep["verdicts"])
    assert not any("LOSES to flops_constant on kernel MAPE" in v and "leave_one_model_out" in v
                   for v in rep["verdicts"])
    assert set(rep["goals_polynomial_lomo"]) >= {"model_mape", "kernel_ge_100us_mape"}
    assert rep["noise_floor"]["n_kernels"] == 2
    assert isinstance(lomo["polynomial"]["warnings"], dict) and lomo["polynomial"]["fit_seconds"]["n_fits"] == 6
    assert ("leave_one_model_out", 6, 6) in calls and ("leave_one_family_out", 3, 3) in calls
    assert (tmp_path / "pvm.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_baselines_fit_and_predict_reasonably(name):
    data = _dataset(n_models=3, kernels=60, seed=4)
    nodes = [n for v in data.values() for n in v[0]]
    lat = np.concatenate([v[1] for v in data.values()])
    model = BASELINES[name]().fit(nodes[:120], lat[:120])
    pred = model.predict(nodes[120:])
    assert pred.shape == (60,) and np.all(np.isfinite(pred)) and np.all(pred > 0)
    if name == "lookup":      # exact workload match returns the measured median
        assert model.predict(nodes[:1])[0] == pytest.approx(np.median(
            [v for n, v in zip(nodes[:120], lat[:120]) if n.op == nodes[0].op
             and n.input_shapes == nodes[0].input_shapes and n.output_shapes == nodes[0].output_shapes]))


def test_plot_writes_png(tmp_path):
    path = plot_predicted_vs_measured([1.0, 10.0, 100.0], [1.1, 9.0, 120.0], ["a", "b", "a"], tmp_path / "p.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_calibrated_roofline_and_flops_constant_recover_their_own_laws():
    from predictors.fitting.baselines import CalibratedRooflineBaseline, FlopsConstantBaseline
    rng = np.random.default_rng(9)
    nodes = random_kernels(rng, 120, ("conv2d", "elementwise"))
    flops = np.array([n.flops for n in nodes], float)
    nbytes = np.array([n.bytes_read + n.bytes_written for n in nodes], float)
    roofline = 2.0 + np.maximum(flops / 5e3, nbytes / 2e3)          # 5 GFLOP/s, 2 GB/s, 2 us overhead
    fitted = CalibratedRooflineBaseline().fit(nodes, roofline)
    assert np.allclose(fitted.predict(nodes), roofline, rtol=1e-3)
    nodes = random_kernels(rng, 90, ("conv2d", "elementwise", "reshape"))      # reshapes have 0 FLOPs: bytes
    law = {"conv2d": 3e-4, "elementwise": 1e-3, "data_movement": 2e-5}
    linear = np.array([law[kernel_kind(n)] * (n.flops or n.bytes_read + n.bytes_written) for n in nodes])
    assert np.allclose(FlopsConstantBaseline().fit(nodes, linear).predict(nodes), linear, rtol=1e-9)


def test_model_level_floor_is_zero_when_models_compose_exactly_and_reports_the_gap_otherwise():
    # every model = sum of its kernels + 2 µs per kernel: the overhead term explains it (up to the few kernels
    # two models share with different noisy labels)
    # Caches given, not this host's: with a last-level cache smaller than these models' weights (32 MiB on a Zen 4
    # host) the skewed model teaches the cold-weight term to add 44% to another model, which is the fit working as
    # designed but not what this test is about.
    data = _dataset()
    records = {k: ModelRecord(tuple(v[0]), tuple(v[1]), v[2], v[3]) for k, v in data.items()}
    caches = {"cache_bytes": 512 * 2 ** 20, "core_cache": 4 * 2 ** 20}
    exact = model_level_floor(records, {n: n for n in records}, **caches)
    assert exact["mape"] < 2e-3 and set(exact["signed_error_per_model"]) == set(records)
    skewed = dict(records)
    name = sorted(records)[0]
    rec = records[name]
    skewed[name] = ModelRecord(rec.nodes, rec.kernel_latencies_us, rec.model_latency_us * 1.3, rec.family)
    gap = model_level_floor(skewed, {n: n for n in skewed}, **caches)
    assert gap["signed_error_per_model"][name] == pytest.approx(1 / 1.3 - 1, abs=0.02)
    assert gap["max_ape"] == pytest.approx(1 - 1 / 1.3, abs=0.02)


def test_the_default_polynomial_is_built_for_the_measured_target():
    """Its schedule-derived features depend on the target's SIMD width (16 fp32 lanes on an AVX-512 CPU)."""
    assert default_methods({"kind": "llvm", "mcpu": "znver5"})["polynomial"]().vector_lanes == 16
    assert default_methods({"kind": "llvm", "mcpu": "haswell"})["polynomial"]().vector_lanes == 8
