"""PolynomialLatencyModel: sklearn contract, law recovery, clamping, residual correction, support guards."""
import json
import warnings

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from hetpart.errors import ExtrapolationWarning, PredictorError
from predictors.polynomial import PolynomialLatencyModel


def _law(X):
    """A degree-2 polynomial in log(1 + x): the model class can represent it exactly."""
    a, b = np.log1p(X[:, 0]), np.log1p(X[:, 1])
    return np.exp(0.5 + 0.8 * a + 0.3 * b + 0.04 * a * b - 0.02 * a * a)


@pytest.fixture(scope="module")
def xy():
    rng = np.random.default_rng(0)
    X = np.exp(rng.uniform(np.log(10), np.log(1e6), size=(600, 2)))
    return X, _law(X) * np.exp(rng.normal(0, 0.01, 600))


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
        at_edge = model.predict(edge[None])[0]             # inside the range: no warning (a twin: its label)
    with pytest.warns(ExtrapolationWarning, match="flops"):
        beyond = model.predict(far[None])[0]
    # beyond the maximum: nearest training point scaled linearly by the work (feature 0) ratio, never exploding
    # (the label at the edge carries 1% noise the scaled polynomial does not)
    assert np.isfinite(beyond) and 10 * at_edge < beyond <= 100 * at_edge * 1.05
    with pytest.warns(ExtrapolationWarning):
        huge = model.predict(np.array([[1e30, 1e30]]))[0]
    assert np.isfinite(huge) and huge <= y.max() * model.extrapolation_limit * (1 + 1e-9)
    with pytest.warns(ExtrapolationWarning):
        tiny = model.predict(np.array([[1e-3, 1e-3]]))[0]
    assert np.isfinite(tiny) and tiny >= y.min() / 10


@pytest.mark.filterwarnings("ignore::hetpart.errors.ExtrapolationWarning")
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


def test_a_twin_of_a_training_kernel_takes_its_measured_label():
    """A kernel off the smooth law (a schedule quirk): the polynomial cannot follow it, its twin gets its label."""
    rng = np.random.default_rng(8)
    X = np.exp(rng.uniform(np.log(10), np.log(1e6), size=(400, 2)))
    y = _law(X) * np.exp(rng.normal(0, 0.01, 400))
    y[17] *= 2.5
    X = np.vstack([X, X[17:18]])                       # measured twice (e.g. in two models): 2.5x and 2.7x
    y = np.append(y, y[17] * 1.08)
    model = PolynomialLatencyModel(residual_bandwidths=()).fit(X, y)
    assert model.predict(X[17:18])[0] == pytest.approx(np.sqrt(y[17] * y[-1]), rel=1e-9)   # geometric mean
    near = X[17:18] * 1.01                                # not a twin: the polynomial (near the smooth law)
    assert model.predict(near)[0] / _law(near)[0] < 1.5
    np.testing.assert_allclose(model.predict(X[:10]), y[:10], rtol=1e-9)


def test_combinations_never_measured_fall_back_to_the_nearest_kernel():
    """Training kernels on a diagonal (x0 ~ x1); a query in the empty corner is inside both feature ranges."""
    rng = np.random.default_rng(7)
    base = np.exp(rng.uniform(np.log(10), np.log(1e6), size=400))
    X = np.stack([base, base * np.exp(rng.normal(0, 0.05, 400))], axis=1)
    y = np.exp(0.5 + 0.8 * np.log1p(X[:, 0]) + 0.3 * np.log1p(X[:, 1]) ** 2 / 10)
    model = PolynomialLatencyModel().fit(X, y)
    corner = np.array([[1e6 * 0.9, 20.0]])
    with pytest.warns(ExtrapolationWarning, match="farther than 2.0 standard deviations"):
        value = model.predict(corner)[0]
    # nearest training kernel in standardised log space, scaled by the work (feature 0) ratio, within 3x
    z = (np.log1p(X) - model.log_mean_) / model.log_scale_
    zq = (np.log1p(corner) - model.log_mean_) / model.log_scale_
    i = int(np.argmin(((z - zq) ** 2).sum(axis=1)))
    neighbour = y[i] * (corner[0, 0] + 1) / (X[i, 0] + 1)
    assert neighbour / model.max_departure * 0.99 <= value <= neighbour * model.max_departure * 1.01
    inside = X[200:201] * 1.001
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # on the data: no warning, the polynomial's own value
        assert model.predict(inside)[0] == pytest.approx(y[200], rel=0.05)


@pytest.mark.filterwarnings("ignore::hetpart.errors.ExtrapolationWarning")
def test_a_feature_left_out_of_the_correction_distance_lets_residuals_cross_it():
    """conv2d's batch is left out of the residual distance (predictors.feature_schema.RESIDUAL_EXCLUDED): a quirk
    measured only at batch 2 (2x slower than the smooth law) reaches the same kernel at batch 1."""
    rng = np.random.default_rng(9)
    X = np.exp(rng.uniform(np.log(10), np.log(1e6), size=(600, 2)))
    batch = rng.choice([1.0, 1.0, 1.0, 1.0, 8.0], size=600)
    quirk = np.array([[3e4, 3e4]]) * np.exp(rng.uniform(-0.05, 0.05, size=(12, 2)))   # a tight cluster
    X = np.vstack([np.column_stack([X, batch]), np.column_stack([quirk, np.full(12, 2.0)])])
    y = _law(X[:, :2]) * np.r_[np.ones(600), np.full(12, 2.0)]
    query = np.array([[3e4, 3e4, 1.0]])
    truth = 2.0 * _law(query[:, :2])[0]
    kwargs = dict(residual_bandwidths=(0.3,), degrees=(1,))
    across = PolynomialLatencyModel(residual_columns=(0, 1), **kwargs).fit(X, y)
    within = PolynomialLatencyModel(**kwargs).fit(X, y)
    assert across.residual_bandwidth_ == within.residual_bandwidth_ == 0.3
    assert across.predict(query)[0] / truth == pytest.approx(1.0, abs=0.1)
    assert within.predict(query)[0] / truth < 0.8
