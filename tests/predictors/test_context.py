"""In-model terms: overhead, cold weights, spilled activations (fit recovers known terms, rules, JSON, latency)."""
import numpy as np
import pytest

from hetpart.errors import PredictorError
from hetpart.graph import OpNode
from predictors.context import (ContextTerms, core_cache_bytes, fit_context_terms, last_level_cache_bytes,
                                predict_in_context_us, predict_model_latency_us)
from predictors.device_predictor import DevicePredictor
from tests.predictors.synthetic_kernels import chain_graph, conv_node, matmul_node, random_kernels, \
    synthetic_latency_us


@pytest.fixture(scope="module")
def predictor():
    rng = np.random.default_rng(1)
    nodes = random_kernels(rng, 400, ("conv2d", "matmul", "pool", "elementwise"))
    return DevicePredictor(device="cpu").fit(nodes, synthetic_latency_us(nodes, rng, 0.02)), nodes


def _rnn_step(node: OpNode) -> OpNode:
    return OpNode(**{**node.to_dict(), "tags": {**node.tags, "rnn_phase": "step"}})


def test_cold_bytes_rules():
    terms = ContextTerms(0.0, 10.0, cache_bytes=4_000_000)
    small, big = matmul_node(0, 1, 512, 1000), matmul_node(1, 1, 4096, 4096)    # 2.05 MB, 67 MB of weights
    assert terms.cold_param_bytes(small) == small.param_bytes
    assert terms.cold_param_bytes(big) == 0.0                      # larger than the cache: cold in isolation too
    assert terms.cold_param_bytes(_rnn_step(small)) == 0.0         # re-read every step: warm
    gate = ContextTerms(0.0, 10.0, cache_bytes=4_000_000, cold_weight_rule="half_cache_gate")
    np.testing.assert_allclose(gate.extra_us([small, big]), [10.0 * small.param_bytes / 1e6, 0.0])
    # an embedding lookup reads the 128 rows it outputs (128 KB), not its 31 MB table
    lookup = OpNode(id=2, name="embed", op="relax.take", input_shapes=((30522, 256), (1, 128)),
                    input_dtypes=("float32", "int64"), output_shapes=((1, 128, 256),), output_dtypes=("float32",),
                    bytes_read=30522 * 256 * 4 + 128 * 8, bytes_written=128 * 256 * 4, param_bytes=30522 * 256 * 4)
    assert ContextTerms(0.0, 10.0).cold_param_bytes(lookup) == 128 * 256 * 4


def test_cache_share_rule_counts_what_the_cache_cannot_keep():
    terms = ContextTerms(0.0, 10.0, cache_bytes=10_000_000)
    two = [matmul_node(0, 1, 512, 1000), matmul_node(1, 1, 1000, 512)]        # 4.1 MB of weights, ~12 KB of rows
    np.testing.assert_array_equal(terms.cold_param_bytes_in_model(two), [0.0, 0.0])     # all of it stays cached
    assert terms.extra_us(two).sum() == 0.0
    five = two + [matmul_node(k, 1, 512, 1000) for k in (2, 3, 4)]                  # 10.25 MB > 10 MB
    weights = np.array([n.param_bytes for n in five], dtype=float)
    footprint = weights.sum() + sum(n.bytes_read + n.bytes_written - n.param_bytes for n in five)
    np.testing.assert_allclose(terms.cold_param_bytes_in_model(five), weights * (1 - 10_000_000 / footprint))
    # activation traffic evicts weights too: the same weights behind a large feature map are mostly cold
    big_activations = five + [conv_node(5, 4, 64, 64, 112, 3)]                      # + ~26 MB of activations
    share = terms.cold_param_bytes_in_model(big_activations)[:5] / weights
    assert share.min() == pytest.approx(share.max()) and 0.6 < share.min() < 1.0
    assert terms.extra_us(big_activations).sum() > 10 * terms.extra_us(five).sum()


def test_half_cache_gate_rule_of_older_predictors():
    terms = ContextTerms(0.0, 10.0, cache_bytes=10_000_000, cold_weight_rule="half_cache_gate")
    two = [matmul_node(0, 1, 512, 1000), matmul_node(1, 1, 1000, 512)]            # 4.1 MB <= 5 MB: warm
    np.testing.assert_array_equal(terms.cold_param_bytes_in_model(two), [0.0, 0.0])
    three = two + [matmul_node(2, 1, 512, 1000)]                                    # 6.15 MB > 5 MB: all cold
    np.testing.assert_array_equal(terms.cold_param_bytes_in_model(three), [n.param_bytes for n in three])
    assert terms.extra_us(three).sum() == pytest.approx(10.0 * sum(n.param_bytes for n in three) / 1e6)
    # a file saved before the rule existed was fitted with the gate and keeps it; a new fit round-trips its rule
    old = {k: v for k, v in terms.to_dict().items() if k != "cold_weight_rule"}
    assert ContextTerms.from_dict(old) == terms
    assert ContextTerms.from_dict(ContextTerms(0.0, 10.0).to_dict()).cold_weight_rule == "cache_share"
    with pytest.raises(PredictorError, match="cold_weight_rule"):
        ContextTerms(0.0, 10.0, cold_weight_rule="lru").validate()


def test_spilled_activation_rules():
    terms = ContextTerms(0.0, 0.0, cache_bytes=32 * 2 ** 20, spilled_activation_us_per_mb=30.0,
                         core_cache_bytes=2 * 2 ** 20)
    small = conv_node(0, 1, 64, 64, 28, 3)          # 0.4 MB of activations: stays in the cores' caches
    mid = conv_node(1, 4, 64, 64, 112, 3)           # 25.7 MB: L3 in isolation, partly DRAM in a model
    huge = conv_node(2, 16, 64, 64, 112, 3)         # 103 MB: DRAM in isolation too
    activation = mid.bytes_read + mid.bytes_written - mid.param_bytes
    assert terms.spilled_activation_bytes(small) == 0.0
    assert terms.spilled_activation_bytes(mid) == activation - 2 * 2 ** 20 > 0
    assert terms.spilled_activation_bytes(huge) == 0.0
    np.testing.assert_allclose(terms.extra_us([small, mid, huge]), [0.0, 30.0 * (activation - 2 ** 21) / 1e6, 0.0])
    assert core_cache_bytes(threads=1) <= core_cache_bytes(threads=2) and core_cache_bytes() > 0


def test_fit_recovers_known_terms(predictor):
    pred, nodes = predictor
    pred = DevicePredictor.from_dict(pred.to_dict())
    cache, core = 8 * 2 ** 20, 2 ** 20
    graphs = [chain_graph(nodes[i:i + 30], name=f"m{i}") for i in range(0, 300, 30)]
    truth = ContextTerms(4.0, 25.0, cache, 12.0, core)
    # the share of its weights the cache cannot keep differs between models (else the rates would not separate)
    shares = [truth.cold_param_bytes_in_model(g.nodes).sum() / sum(truth.cold_param_bytes(n) for n in g.nodes)
              for g in graphs]
    assert min(shares) < max(shares) - 0.1
    assert sum(truth.spilled_activation_bytes(n) > 0 for n in nodes[:300]) >= 10     # the term is exercised
    measured = [(g.nodes, float(pred.predict(g.nodes).sum() + truth.extra_us(g.nodes).sum())) for g in graphs]
    fitted = fit_context_terms(pred, measured, cache_bytes=cache, core_cache=core)
    assert fitted.per_kernel_overhead_us == pytest.approx(4.0, rel=1e-6)
    assert fitted.cold_param_us_per_mb == pytest.approx(25.0, rel=1e-6)
    assert fitted.spilled_activation_us_per_mb == pytest.approx(12.0, rel=1e-6)
    assert fitted.core_cache_bytes == core
    assert pred.fit_context(measured, cache_bytes=cache, core_cache=core) == fitted and pred.context == fitted
    g = graphs[0]
    expected = pred.predict(g.nodes) + fitted.extra_us(g.nodes)
    np.testing.assert_allclose(pred.predict_in_context(g.nodes), expected)
    np.testing.assert_allclose(predict_in_context_us(g.nodes, pred), expected)
    assert predict_model_latency_us(g, pred) == pytest.approx(float(expected.sum()))
    op_level = g.__class__(nodes=g.nodes, edges=g.edges, level="op")
    with pytest.raises(PredictorError, match="kernel-level"):
        predict_model_latency_us(op_level, pred)


def test_fit_finds_the_cache_a_model_keeps(predictor):
    """Models measured on a host whose LLC keeps 8 MiB between inferences, fitted with a 16 MiB measured LLC: the
    fit picks the 0.5 share and recovers the rates; with the share fixed at 1 it cannot."""
    pred, nodes = predictor
    graphs = [chain_graph(nodes[i:i + 30], name=f"m{i}") for i in range(0, 300, 30)]
    truth = ContextTerms(4.0, 25.0, 8 * 2 ** 20, 12.0, 2 ** 20)
    measured = [(g.nodes, float(pred.predict(g.nodes).sum() + truth.extra_us(g.nodes).sum())) for g in graphs]
    fitted = fit_context_terms(pred, measured, cache_bytes=16 * 2 ** 20, core_cache=2 ** 20)
    assert fitted.cache_bytes == 8 * 2 ** 20
    assert fitted.cold_param_us_per_mb == pytest.approx(25.0, rel=1e-6)
    assert fitted.per_kernel_overhead_us == pytest.approx(4.0, rel=1e-6)
    fixed = fit_context_terms(pred, measured, cache_bytes=16 * 2 ** 20, core_cache=2 ** 20, cache_shares=(1.0,))
    assert fixed.cache_bytes == 16 * 2 ** 20 and fixed.cold_param_us_per_mb != pytest.approx(25.0, rel=1e-3)
    with pytest.raises(PredictorError, match="cache_shares"):
        fit_context_terms(pred, measured, cache_bytes=2 ** 24, cache_shares=(0.0, 1.0))


def test_terms_never_go_negative(predictor):
    pred, nodes = predictor
    graphs = [chain_graph(nodes[i:i + 20]) for i in (0, 40)]
    # models measured faster than their kernels' sum: the bounded fit stops at 0 instead of going negative
    measured = [(g.nodes, 0.5 * float(pred.predict(g.nodes).sum())) for g in graphs]
    fitted = fit_context_terms(pred, measured, cache_bytes=2 ** 25)
    assert 0.0 <= fitted.per_kernel_overhead_us < 1e-9 and 0.0 <= fitted.cold_param_us_per_mb < 1e-9
    assert 0.0 <= fitted.spilled_activation_us_per_mb < 1e-9


def test_errors_and_json():
    with pytest.raises(PredictorError, match="at least one"):
        fit_context_terms(None, [], cache_bytes=1)
    with pytest.raises(PredictorError, match=">= 1 kernel"):
        fit_context_terms(None, [([], 10.0)], cache_bytes=1)
    with pytest.raises(PredictorError, match=">= 0"):
        ContextTerms(-1.0, 0.0).validate()
    with pytest.raises(PredictorError, match="malformed"):
        ContextTerms.from_dict({"per_kernel_overhead_us": 1.0})
    with pytest.raises(PredictorError, match=">= 0"):
        ContextTerms(0.0, 0.0, spilled_activation_us_per_mb=float("nan")).validate()
    terms = ContextTerms(1.5, 20.0, 123456, 7.5, 65536)
    assert ContextTerms.from_dict(terms.to_dict()) == terms
    # a predictor saved before the activation term loads with the term off: same predictions as before
    old = {k: v for k, v in terms.to_dict().items() if k not in ("spilled_activation_us_per_mb", "core_cache_bytes")}
    assert ContextTerms.from_dict(old).spilled_activation_us_per_mb == 0.0
    assert last_level_cache_bytes() > 0


def test_conv_weights_count_as_cold():
    node = conv_node(0, 1, 512, 512, 7, 3)
    assert ContextTerms(0.0, 1.0).cold_param_bytes(node) == node.param_bytes > 9e6
