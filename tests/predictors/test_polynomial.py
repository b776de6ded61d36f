"""PolynomialLatencyModel (sklearn contract, law recovery, clamping) and DevicePredictor (JSON, fallback)."""
import json
import time
import warnings

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from hetpart.errors import ExtrapolationWarning, PredictorError, SchemaError
from predictors.features import FEATURE_SCHEMA_VERSION, KIND_FEATURES, feature_matrix
from predictors.context import ContextTerms
from predictors.polynomial import DevicePredictor, PolynomialLatencyModel, UnseenKindWarning
from tests.predictors.synthetic_kernels import conv_node, random_kernels, reshape_node, synthetic_latency_us


def _law(X):
    """A degree-2 polynomial in log(1 + x): the model class can represent it exactly."""
    a, b = np.log1p(X[:, 0]), np.log1p(X[:, 1])
    return np.exp(0.5 + 0.8 * a + 0.3 * b + 0.04 * a * b - 0.02 * a * a)


@pytest.fixture(scope="module")
def xy():
    rng = np.random.default_rng(0)
    X = np.exp(rng.uniform(np.log(10), np.log(1e6), size=(600, 2)))
    return X, _law(X) * np.exp(rng.normal(0, 0.01, 600))


@pytest.fixture(scope="module")
def fitted_predictor():
    rng = np.random.default_rng(1)
    nodes = random_kernels(rng, 600, ("conv2d", "matmul", "pool", "elementwise"))
    return DevicePredictor(device="cpu").fit(nodes, synthetic_latency_us(nodes, rng, 0.02)), nodes


def test_estimator_contract(xy):
    X, y = xy
    model = PolynomialLatencyModel(degrees=(1, 2), cv=3)
    assert model.get_params()["degrees"] == (1, 2) and not hasattr(model, "coef_")
    with pytest.raises(NotFittedError):
        model.predict(X)
    assert model.fit(X, y) is model
    assert clone(model).get_params() == model.get_params() and not hasattr(clone(model), "coef_")
    with pytest.raises(ValueError):
        model.predict(X[:, :1])
    with pytest.raises(PredictorError):
        PolynomialLatencyModel().fit(X, -y)


def test_fit_recovers_a_polynomial_law_in_log_space(xy):
    X, y = xy
    model = PolynomialLatencyModel().fit(X, y)
    assert model.degree_ >= 2                      # degree 1 cannot represent the cross/square terms
    rng = np.random.default_rng(5)
    Xt = np.exp(rng.uniform(np.log(20), np.log(5e5), size=(200, 2)))
    rel = np.abs(model.predict(Xt) / _law(Xt) - 1)
    assert rel.mean() < 0.01 and rel.max() < 0.05
    assert model.score(Xt, _law(Xt)) > 0.99


def test_extrapolation_clamps_warns_and_stays_bounded(xy):
    X, y = xy
    model = PolynomialLatencyModel(feature_names=("flops", "bytes")).fit(X, y)
    edge = X[np.argmax(X[:, 0])].copy()
    far = edge.copy()
    far[0] *= 100
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        at_edge = model.predict(edge[None])[0]             # inside the range: no warning
    with pytest.warns(ExtrapolationWarning, match="flops"):
        beyond = model.predict(far[None])[0]
    # beyond the maximum: nearest training point scaled linearly by the work (feature 0) ratio, never exploding
    assert np.isfinite(beyond) and 10 * at_edge < beyond <= 100 * at_edge * 1.01
    with pytest.warns(ExtrapolationWarning):
        huge = model.predict(np.array([[1e30, 1e30]]))[0]
    assert np.isfinite(huge) and huge <= y.max() * model.extrapolation_limit * (1 + 1e-9)
    with pytest.warns(ExtrapolationWarning):
        tiny = model.predict(np.array([[1e-3, 1e-3]]))[0]
    assert np.isfinite(tiny) and tiny >= y.min() / 10


def test_device_predictor_round_trips_json_exactly(fitted_predictor, tmp_path):
    predictor, nodes = fitted_predictor
    predictor.context = ContextTerms(1.25, 20.0, 2 ** 25)
    path = tmp_path / "cpu.json"
    predictor.save(path)
    text = path.read_text()
    assert "pickle" not in text and json.loads(text)["format"] == "hetpart.device_predictor"
    loaded = DevicePredictor.load(path)
    assert np.array_equal(loaded.predict(nodes), predictor.predict(nodes))
    assert loaded.context == ContextTerms(1.25, 20.0, 2 ** 25)
    np.testing.assert_array_equal(loaded.predict_in_context(nodes), predictor.predict_in_context(nodes))
    prov = loaded.provenance()
    assert prov["device"] == "cpu" and prov["feature_schema_version"] == FEATURE_SCHEMA_VERSION
    assert prov["n_samples"] == 600 and prov["fit_date"] and prov["tvm_version"]
    lo, hi = prov["training_ranges"]["conv2d"]["flops"]
    assert 0 < lo < hi


def test_loading_a_foreign_or_stale_file_fails_clearly(fitted_predictor, tmp_path):
    predictor, _ = fitted_predictor
    data = predictor.to_dict()
    data["provenance"]["feature_schema_version"] = FEATURE_SCHEMA_VERSION + 1
    with pytest.raises(PredictorError, match="feature schema"):
        DevicePredictor.from_dict(data)
    with pytest.raises(SchemaError):
        DevicePredictor.from_dict({"format": "something else"})
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(PredictorError):
        DevicePredictor.load(tmp_path / "bad.json")


def test_device_predictor_accuracy_and_hundredfold_flops(fitted_predictor):
    predictor, _ = fitted_predictor
    rng = np.random.default_rng(2)
    test_nodes = [n for n in random_kernels(rng, 200, ("conv2d", "matmul", "pool", "elementwise"))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExtrapolationWarning)
        rel = np.abs(predictor.predict(test_nodes) / synthetic_latency_us(test_nodes) - 1)
    assert np.median(rel) < 0.05
    big = conv_node(0, 200, 256, 256, 56, 3)                 # ~100x the FLOPs of the largest training conv
    with pytest.warns(ExtrapolationWarning):
        value = predictor.predict([big])[0]
    assert np.isfinite(value) and 0 < value < 1e3 * synthetic_latency_us([big])[0]


def test_a_kernel_larger_than_any_trained_one_is_scaled_from_its_nearest_neighbour():
    rng = np.random.default_rng(7)
    train = [conv_node(i, 1, c, c, hw, 3) for i, (c, hw) in enumerate(
        (c, hw) for c in (16, 32, 64, 128) for hw in (7, 14, 28, 56) for _ in range(3))]
    predictor = DevicePredictor().fit(train, synthetic_latency_us(train, rng, 0.01))
    big = conv_node(0, 1, 256, 256, 56, 3)                  # 4x the FLOPs of the largest training conv
    with pytest.warns(ExtrapolationWarning):
        value = predictor.predict([big])[0]
    assert abs(value / synthetic_latency_us([big])[0] - 1) < 0.25


def test_unseen_kind_uses_the_fallback_with_a_warning(fitted_predictor):
    predictor, _ = fitted_predictor
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = predictor.predict([reshape_node(0, (1, 32, 14, 14))])
    assert any(issubclass(w.category, UnseenKindWarning) and "data_movement" in str(w.message) for w in caught)
    assert issubclass(UnseenKindWarning, ExtrapolationWarning)
    assert np.isfinite(value).all() and (value > 0).all()


def test_no_data_and_unfitted_raise():
    with pytest.raises(PredictorError):
        DevicePredictor().fit([], [])
    with pytest.raises(PredictorError):
        DevicePredictor().predict([conv_node(0, 1, 8, 8, 8, 3)])
    with pytest.raises(PredictorError):
        DevicePredictor().fit([conv_node(0, 1, 8, 8, 8, 3)], [1.0, 2.0])


def test_fit_time_for_thousands_of_samples_is_far_below_a_minute():
    rng = np.random.default_rng(3)
    nodes = random_kernels(rng, 3000, ("conv2d", "depthwise_conv2d", "matmul", "pool", "elementwise", "reshape"))
    y = synthetic_latency_us(nodes, rng, 0.03)
    start = time.perf_counter()
    predictor = DevicePredictor().fit(nodes, y)
    elapsed = time.perf_counter() - start
    assert elapsed < 60, f"fit of 3000 samples took {elapsed:.1f} s"
    assert predictor.fit_info["fit_seconds"] <= elapsed and len(predictor.models) == 6


def test_a_depthwise_kernel_without_its_own_model_uses_the_conv2d_model(fitted_predictor):
    predictor, _ = fitted_predictor
    assert "depthwise_conv2d" not in predictor.models and "conv2d" in predictor.models
    node = conv_node(0, 1, 64, 64, 28, 3, groups=64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = predictor.predict([node])[0]
    assert any("conv2d model" in str(w.message) for w in caught if issubclass(w.category, UnseenKindWarning))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = predictor.models["conv2d"].predict(feature_matrix([node], KIND_FEATURES["conv2d"]))[0]
    assert value == expected


def test_residual_correction_follows_a_step_the_polynomial_cannot():
    """A schedule-like step (3x slower above a size) : the local residual correction learns it, picked by CV."""
    rng = np.random.default_rng(5)
    X = np.exp(rng.uniform(np.log(10), np.log(1e6), size=(900, 2)))
    y = _law(X) * np.where(X[:, 1] > 3e3, 3.0, 1.0) * np.exp(rng.normal(0, 0.01, 900))
    train, test = slice(0, 700), slice(700, None)
    plain = PolynomialLatencyModel(residual_bandwidths=()).fit(X[train], y[train])
    local = PolynomialLatencyModel().fit(X[train], y[train])
    assert plain.residual_bandwidth_ == 0.0 and local.residual_bandwidth_ > 0
    assert local.anchor_residuals_.shape == (len(local.anchors_),)
    ape = lambda m: np.mean(np.abs(m.predict(X[test]) - y[test]) / y[test])   # noqa: E731
    assert ape(local) < 0.5 * ape(plain)
    assert any(key.startswith("residual_bandwidth:") for key in local.cv_rmse_log_)
    again = PolynomialLatencyModel.from_dict(json.loads(json.dumps(local.to_dict())))
    np.testing.assert_array_equal(again.predict(X[test]), local.predict(X[test]))


def test_cross_validation_keeps_repeated_kernels_on_one_side():
    """The same kernel measured in many models must not be both trained on and scored against."""
    rng = np.random.default_rng(6)
    base = np.exp(rng.uniform(np.log(10), np.log(1e6), size=(60, 2)))
    X = np.repeat(base, 10, axis=0)                    # every kernel 10 times
    y = _law(X) * np.exp(np.repeat(rng.normal(0, 0.3, 60), 10))   # one (noisy) label per distinct kernel
    model = PolynomialLatencyModel().fit(X, y)
    # with duplicates split across folds, a tiny bandwidth would look perfect (it reproduces the label)
    assert model.cv_rmse_log_["residual_bandwidth:0.1"] > 0.1
