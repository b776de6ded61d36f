"""DevicePredictor: per-kind models, exact lookup of measured kernels, JSON with provenance, fallback for unseen
kinds, fit time."""
import dataclasses
import json
import time
import warnings

import numpy as np
import pytest

from hetpart.errors import ExtrapolationWarning, PredictorError, SchemaError
from predictors.features import (FEATURE_SCHEMA_VERSION, KIND_FEATURES, KIND_FEATURES_BY_SCHEMA, feature_matrix,
                                 workload_key)
from predictors.context import ContextTerms
from predictors.device_predictor import DevicePredictor, UnseenKindWarning
from tests.predictors.synthetic_kernels import conv_node, random_kernels, reshape_node, synthetic_latency_us


@pytest.fixture(scope="module")
def fitted_predictor():
    rng = np.random.default_rng(1)
    nodes = random_kernels(rng, 600, ("conv2d", "matmul", "pool", "elementwise"))
    return DevicePredictor(device="cpu").fit(nodes, synthetic_latency_us(nodes, rng, 0.02)), nodes


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
    lo, hi = prov["training_ranges"]["conv2d"]["flops_per_sample"]
    assert 0 < lo < hi


def test_thread_count_survives_json_and_a_mismatched_deployment_is_warned(fitted_predictor, tmp_path, monkeypatch,
                                                                          caplog):
    from predictors.registry import load_cpu_predictor

    predictor, nodes = fitted_predictor
    predictor.num_threads = 2
    predictor.fit_info["training"] = {"pipeline_versions": [_current_pipeline()]}     # kernels of today's rules
    predictor.save(tmp_path / "cpu.json")
    assert DevicePredictor.load(tmp_path / "cpu.json").provenance()["num_threads"] == 2
    monkeypatch.setenv("TVM_NUM_THREADS", "2")
    with caplog.at_level("WARNING", logger="predictors.registry"):
        load_cpu_predictor(tmp_path / "cpu.json")
    assert not caplog.records
    monkeypatch.setenv("TVM_NUM_THREADS", "1")
    with caplog.at_level("WARNING", logger="predictors.registry"):
        # not scaled: the host calibration would start TVM's thread pool with 1 thread for the rest of this process
        load_cpu_predictor(tmp_path / "cpu.json", scale_to_host=False)
    assert "timed with 2 TVM thread(s); this deployment runs 1" in caplog.text


def _current_pipeline() -> str:
    from predictors.versions import PIPELINE_VERSION

    return PIPELINE_VERSION


def test_a_predictor_fitted_on_kernels_of_older_cpu_rules_is_warned_and_noted(fitted_predictor, tmp_path, caplog):
    """Kernels compiled by older schedule rules ran at other speeds (v8 made unpadded convs faster): a predictor
    fitted on them says so in a warning and in the report's cost note; one of today's rules says nothing."""
    import copy

    from predictors import registry
    from tvm_passes.schedules import RULES_VERSION

    predictor = copy.deepcopy(fitted_predictor[0])
    predictor.num_threads = None
    cases = {"current": [_current_pipeline()], "older": [_current_pipeline().replace(
        f"rules-{RULES_VERSION}", f"rules-{RULES_VERSION - 1}")], "unrecorded": None}
    for name, pipelines in cases.items():
        predictor.fit_info["training"] = {} if pipelines is None else {"pipeline_versions": pipelines}
        predictor.save(tmp_path / f"{name}.json")
        caplog.clear()
        with caplog.at_level("WARNING", logger="predictors.registry"):
            loaded = registry.load_cpu_predictor(tmp_path / f"{name}.json", scale_to_host=False)
        note = registry.cpu_cost_note(loaded, tmp_path / f"{name}.json")
        stale = name != "current"
        assert ("this hetpart compiles v" in caplog.text) is stale and ("costs of the kernels" in note) is stale
        if name == "older":
            assert registry.predictor_rules_version(loaded) == RULES_VERSION - 1
            assert f"CPU rules v{RULES_VERSION - 1}" in note
    # a fit records the pipeline its database's kernels were compiled by
    import sqlite3

    from predictors.fitting.training import fit_from_db
    from tests.predictors.profiling.test_zoo_profile import build_fake_db

    build_fake_db(tmp_path / "p.sqlite")
    with sqlite3.connect(tmp_path / "p.sqlite") as conn:
        conn.execute("UPDATE hetpart_model_variants SET pipeline_version = ?", (_current_pipeline(),))
    fitted, info = fit_from_db(tmp_path / "p.sqlite")
    assert info["pipeline_versions"] == [_current_pipeline()]
    assert registry.predictor_rules_version(fitted) == RULES_VERSION


def test_measured_kernels_are_predicted_by_their_label_and_others_by_the_models(tmp_path):
    rng = np.random.default_rng(11)
    nodes = list({workload_key(n): n for n in random_kernels(rng, 300, ("conv2d", "matmul", "elementwise"))}.values())
    labels = synthetic_latency_us(nodes, rng, 0.05)                 # 5% noise: the models cannot fit it exactly
    again = dataclasses.replace(nodes[1], id=999, name="same_workload_other_model")
    lookup = DevicePredictor().fit(nodes + [again], list(labels) + [labels[1] * 1.2])
    models_only = DevicePredictor(exact_lookup=False).fit(nodes + [again], list(labels) + [labels[1] * 1.2])
    measured = lookup.predict(nodes[:50])
    assert not np.array_equal(models_only.predict(nodes[:50]), labels[:50])   # the models only approximate
    assert measured[1] == pytest.approx(np.median([labels[1], labels[1] * 1.2]))   # measured twice: median
    np.testing.assert_array_equal(measured[[0] + list(range(2, 50))], labels[[0] + list(range(2, 50))])
    known = {workload_key(n) for n in nodes}
    unseen = [n for n in random_kernels(np.random.default_rng(12), 40, ("conv2d", "matmul"))
              if workload_key(n) not in known]
    assert len(unseen) >= 10
    np.testing.assert_array_equal(lookup.predict(unseen), models_only.predict(unseen))
    lookup.save(tmp_path / "p.json")
    np.testing.assert_array_equal(DevicePredictor.load(tmp_path / "p.json").predict(nodes[:50]), measured)


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


def test_thousands_of_samples_of_six_kinds_fit_and_record_their_fit_time():
    rng = np.random.default_rng(3)
    nodes = random_kernels(rng, 3000, ("conv2d", "depthwise_conv2d", "matmul", "pool", "elementwise", "reshape"))
    y = synthetic_latency_us(nodes, rng, 0.03)
    start = time.perf_counter()
    predictor = DevicePredictor().fit(nodes, y)
    elapsed = time.perf_counter() - start
    assert 0 < predictor.fit_info["fit_seconds"] <= elapsed      # no wall-clock bound: hosts differ and get busy
    # the six kinds, plus the matrix-vector specialist (a fifth of the random matmuls have one row)
    assert set(predictor.models) == {"conv2d", "depthwise_conv2d", "matmul", "gemv", "pool", "elementwise",
                                     "data_movement"}


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
        expected = predictor.models["conv2d"].predict(
            feature_matrix([node], KIND_FEATURES["conv2d"], predictor.vector_lanes))[0]
    assert value == expected


@pytest.mark.parametrize("batch_exponent", [1.0, 0.6])
def test_convolutions_are_modelled_per_batch_element_with_the_batch_as_a_feature(batch_exponent):
    """Per sample, with the batch among the features: a law linear in the batch is predicted linear, and one where
    bigger batches run faster per sample (small convs on the Intel host: 1.9x for 4x the work) is learned too --
    the schema-6 model, linear in the batch by construction, predicted such convs up to 2x off."""
    rng = np.random.default_rng(5)
    channels = (16, 32, 64, 128, 256)
    shapes = [(int(rng.choice(channels)), int(rng.choice(channels)), int(rng.choice([7, 14, 28, 56])),
               int(rng.choice([1, 3]))) for _ in range(400)]
    batches = rng.choice([1, 2, 4], size=len(shapes))
    nodes = [conv_node(i, int(b), *shape) for i, (b, shape) in enumerate(zip(batches, shapes))]
    per_sample = synthetic_latency_us([conv_node(i, 1, *shape) for i, shape in enumerate(shapes)], rng, 0.02)
    predictor = DevicePredictor().fit(nodes, per_sample * batches ** batch_exponent)
    single, quad = conv_node(0, 1, 48, 96, 28, 3), conv_node(1, 4, 48, 96, 28, 3)    # channels never seen
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExtrapolationWarning)
        one, four = predictor.predict([single, quad])
    assert four / one == pytest.approx(4 ** batch_exponent, rel=0.1)


def test_shipped_cpu_predictor_loads_with_this_feature_schema():
    """The predictor in predictors/data must be refitted whenever the features or the file format change."""
    from predictors.registry import default_cpu_predictor_path
    from tests.predictors.synthetic_kernels import conv_node

    shipped = DevicePredictor.load(default_cpu_predictor_path())
    prov = shipped.provenance()
    assert prov["device"] == "cpu" and prov["n_samples"] > 500
    node = conv_node(0, 1, 64, 64, 56, 3)
    latency_us = float(shipped.predict_in_context([node])[0])
    assert 10.0 < latency_us < 10_000.0      # a 64->64 3x3 conv at 56x56 (231 MFLOP) on a 2-core CPU


def test_a_predictor_of_an_earlier_feature_schema_predicts_with_its_own_features(fitted_predictor, tmp_path):
    """Schema 7 added the batch to conv2d's features; schema-6 files (the shipped Zen 5 predictor, whose database
    is gone) keep predicting with the 9 conv features they were fitted on, and stay schema 6 when saved again."""
    from predictors.registry import shipped_cpu_predictor_path
    from tests.predictors.synthetic_kernels import conv_node

    assert "batch" in KIND_FEATURES["conv2d"] and "batch" not in KIND_FEATURES_BY_SCHEMA[6]["conv2d"]
    # schema 11 added the aliased weight share; schema-10 files predict without it
    assert KIND_FEATURES["conv2d"][-1] == "aliased_weight_share"
    assert all("aliased_weight_share" not in KIND_FEATURES_BY_SCHEMA[v]["conv2d"] for v in (6, 7, 8, 9, 10))
    # schema 8 added the pool guard; schemas 6 and 7 keep the pool features they were fitted with
    assert "pool_bounds_checked" in KIND_FEATURES["pool"]
    assert all("pool_bounds_checked" not in KIND_FEATURES_BY_SCHEMA[v]["pool"] for v in (6, 7))
    fresh = fitted_predictor[0]
    assert fresh.provenance()["feature_schema_version"] == FEATURE_SCHEMA_VERSION
    assert "batch" in fresh.provenance()["training_ranges"]["conv2d"]
    old = DevicePredictor.load(shipped_cpu_predictor_path("znver5"))
    assert old.feature_schema_version == 6 and "batch" not in old.provenance()["training_ranges"]["conv2d"]
    nodes = [conv_node(0, batch, 64, 64, 56, 3) for batch in (1, 4)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExtrapolationWarning)
        before = old.predict(nodes)
        old.save(tmp_path / "old.json")
        again = DevicePredictor.load(tmp_path / "old.json")
        assert again.feature_schema_version == 6
        np.testing.assert_array_equal(again.predict(nodes), before)
    assert np.all(before > 0) and before[1] == pytest.approx(4 * before[0])   # schema 6: linear in the batch


def test_every_shipped_cpu_predictor_is_named_for_the_cpu_it_was_measured_on():
    """predictors/data/cpu_<mcpu>.json is chosen on a host whose CPU is <mcpu>: the name must be the truth."""
    from predictors.registry import cpu_predictor_filename as registry_filename
    from predictors.registry import default_cpu_predictor_path, shipped_cpu_predictor_path

    shipped = sorted(shipped_cpu_predictor_path("x").parent.glob("cpu_*.json"))
    assert len(shipped) >= 2
    for path in shipped:
        predictor = DevicePredictor.load(path)
        assert predictor.provenance()["feature_schema_version"] in KIND_FEATURES_BY_SCHEMA
        mcpu = predictor.target["mcpu"]
        if path.name != "cpu_default.json":
            threads = predictor.num_threads if path.stem.rpartition("_")[2].startswith("threads") else None
            assert path.name == registry_filename(mcpu, threads)
            assert default_cpu_predictor_path(mcpu, threads) == path
    assert default_cpu_predictor_path("no-such-cpu").name == "cpu_default.json"


def test_a_predictor_from_another_cpu_is_warned_and_fit_writes_one_for_this_cpu(fitted_predictor, tmp_path,
                                                                                monkeypatch, caplog):
    import argparse
    import copy

    from hetpart.driver import cli_predictors
    from predictors import host_calibration, registry
    from tests.predictors.profiling.test_zoo_profile import build_fake_db

    predictor = copy.deepcopy(fitted_predictor[0])                    # the fixture is shared by the module
    predictor.target, predictor.num_threads = {"kind": "llvm", "mcpu": "znver5"}, None   # no thread warning
    predictor.fit_info["training"] = {"pipeline_versions": [_current_pipeline()]}      # nor a rules warning
    predictor.save(tmp_path / "cpu.json")
    # the calibration suite is not timed here (tests/predictors/test_host_calibration.py covers it)
    monkeypatch.setattr(host_calibration, "calibrate_to_host", lambda base, host, threads, time_fresh=None: (
        base, host_calibration.HostCalibration("none-fallback", None, None, "not timed in this test")))
    for host, warned in (("znver5", False), ("znver4", True)):
        monkeypatch.setattr(registry, "host_cpu_name", lambda host=host: host)
        caplog.clear()
        with caplog.at_level("WARNING", logger="predictors.registry"):
            registry.load_cpu_predictor(tmp_path / "cpu.json")
        assert ("measured on a znver5 CPU; this host is a znver4" in caplog.text) is warned
        assert ("cpu_znver4.json" in caplog.text) is warned           # where `hetpart fit` will put this host's
    # `hetpart fit` without -o writes the file the loader picks on this host
    monkeypatch.setenv("HETPART_CACHE_DIR", str(tmp_path))
    db = tmp_path / "p.sqlite"
    build_fake_db(db)
    parser = argparse.ArgumentParser()
    cli_predictors.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["fit", "--db", str(db)])
    assert args.func(args) == 0
    assert (tmp_path / "predictors" / "cpu_znver4.json").exists()
    assert registry.default_cpu_predictor_path("znver4") == tmp_path / "predictors" / "cpu_znver4.json"


def test_kind_models_leave_the_schema_s_excluded_features_out_of_the_correction():
    from predictors.device_predictor import _kind_model

    conv = _kind_model("conv2d", (1,), (1.0,))
    assert KIND_FEATURES["conv2d"].index("batch") not in conv.residual_columns
    assert len(conv.residual_columns) == len(KIND_FEATURES["conv2d"]) - 1
    assert _kind_model("matmul", (1,), (1.0,)).residual_columns is None


def _gemv_and_gemm_kernels(rng, count=300):
    """Matmuls half of which are matrix-vector products (one row), with a bandwidth cliff at 4 MiB for those."""
    from tests.predictors.synthetic_kernels import matmul_node

    nodes = [matmul_node(i, 1 if i % 2 else int(rng.choice([4, 32, 128])), int(rng.integers(128, 4096)),
                         int(rng.integers(128, 8192))) for i in range(count)]
    core = 4 * 2 ** 20

    def latency_us(node):
        nbytes = node.bytes_read + node.bytes_written
        if node.output_shapes[0][0] == 1:
            return 1.5 + min(nbytes, core) / 200e3 + max(0, nbytes - core) / 55e3
        return 2.0 + node.flops / 60e3 + nbytes / 100e3

    return nodes, np.array([latency_us(n) for n in nodes]) * rng.lognormal(0.0, 0.02, count), core


def test_matrix_vector_products_get_a_specialist_model_and_still_train_the_matmul_model(tmp_path):
    nodes, latencies_us, core = _gemv_and_gemm_kernels(np.random.default_rng(5))
    predictor = DevicePredictor(core_cache_bytes=core, exact_lookup=False).fit(nodes, latencies_us)
    gemvs = [n for n in nodes if n.output_shapes[0][0] == 1]
    counts = predictor.fit_info["samples_per_kind"]
    assert counts["gemv"] == len(gemvs) and counts["matmul"] == len(nodes)
    specialist, matmul = predictor.models["gemv"], predictor.models["matmul"]
    assert specialist.feature_names[-1] == "bytes_beyond_core_cache" == KIND_FEATURES["gemv"][-1]
    m_column = KIND_FEATURES["gemv"].index("m")
    assert specialist.feature_max_[m_column] == 1 and matmul.feature_max_[m_column] == 128
    span = predictor.provenance()["training_ranges"]["gemv"]["bytes_beyond_core_cache"]
    assert span[0] == 0 and span[1] > 0       # kernels on both sides of the cores' L2
    # the specialist predicts the products; the matmul model, fitted on them too, predicts them otherwise
    specialist_us = predictor.predict(gemvs)
    assert np.allclose(specialist_us, specialist.predict(feature_matrix(gemvs, KIND_FEATURES["gemv"],
                                                                        predictor.vector_lanes, core)))
    # the cache size is part of the predictor's JSON: a loaded one computes the same feature
    predictor.save(tmp_path / "cpu.json")
    loaded = DevicePredictor.load(tmp_path / "cpu.json")
    assert loaded.core_cache_bytes_ == core and loaded.provenance()["core_cache_bytes"] == core
    assert np.array_equal(loaded.predict(gemvs), specialist_us)


def test_a_predictor_without_the_gemv_specialist_predicts_matrix_vector_products_with_its_matmul_model():
    """Predictors of schema 9 and older (and fits with too few products) have no gemv model: the matmul model
    predicts the products, as it did before the specialist, and that is not an unseen kind."""
    nodes, latencies_us, core = _gemv_and_gemm_kernels(np.random.default_rng(6))
    predictor = DevicePredictor(core_cache_bytes=core, exact_lookup=False).fit(nodes, latencies_us)
    gemvs = [n for n in nodes if n.output_shapes[0][0] == 1]
    del predictor.models["gemv"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnseenKindWarning)
        by_matmul = predictor.predict(gemvs)
    expected = predictor.models["matmul"].predict(feature_matrix(gemvs, KIND_FEATURES["matmul"],
                                                                 predictor.vector_lanes, core))
    np.testing.assert_allclose(by_matmul, expected)
    few = DevicePredictor(core_cache_bytes=core, min_samples_per_kind=len(gemvs) + 1).fit(nodes, latencies_us)
    assert "gemv" not in few.models and "matmul" in few.models


def test_a_pool_window_beyond_the_training_windows_scales_with_its_reads():
    """Schema 12: beyond the training windows a pool is priced from its nearest training pool scaled by the window
    reads (its FLOPs), not by its bytes, which a 13x13 stride-1 pool shares with a 3x3 one."""
    from tests.predictors.synthetic_kernels import pool_node

    rng = np.random.default_rng(3)
    nodes = [pool_node(i, 1, int(rng.choice([32, 64, 128, 256])), int(rng.choice([13, 26, 52, 104])),
                       int(rng.choice([2, 3])), int(rng.choice([1, 2]))) for i in range(120)]
    latency = [0.5 + n.flops * 2e-4 for n in nodes]          # made up: time in proportion to the window reads
    predictor = DevicePredictor().fit(nodes, latency)
    small, large = pool_node(1000, 1, 128, 26, 3, 1), pool_node(1001, 1, 128, 26, 13, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExtrapolationWarning)       # the 13x13 window is outside the training range
        small_us, large_us = predictor.predict([small, large])
    reads_ratio = large.flops / small.flops
    assert large_us / small_us > 0.5 * reads_ratio, (small_us, large_us, reads_ratio)
