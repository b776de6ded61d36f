"""Host calibration: a CPU predictor used on another CPU (or thread count) is scaled by a suite timed on the host;
only a sweep timed on a quiet host is kept or used, and a busy host leaves the predictor unscaled, never failing.
The sweep itself (the profiler) is tested in tests/predictors/profiling/test_calibration_sweep.py."""
import copy
import json
from types import SimpleNamespace

import numpy as np
import pytest

from hetpart.errors import PredictorError
from predictors import host_calibration, host_load, registry
from predictors.context import ContextTerms
from predictors.device_predictor import DevicePredictor
from predictors.host_calibration import (CALIBRATION_SUITE, CalibrationKernel, HostCalibration, HostScaledPredictor,
                                         SuiteTiming, scale_by_suite, suite_cache_path, suite_speed_ratio)
from predictors.host_load import SweepJudgement, judge_sweep
from tests.predictors.synthetic_kernels import random_kernels, synthetic_latency_us

from tests.predictors.calibration import SMALL_SUITE, private_cache  # noqa: F401 (autouse fixture)
MEASURED_AT = "2025-01-02T03:04:05+00:00"


@pytest.fixture(scope="module")
def fitted():
    rng = np.random.default_rng(4)
    nodes = random_kernels(rng, 300, ("conv2d", "matmul", "elementwise"))
    predictor = DevicePredictor(device="cpu", target={"kind": "llvm", "mcpu": "znver5"}, num_threads=2)
    predictor.fit(nodes, synthetic_latency_us(nodes, rng, 0.02))
    predictor.context = ContextTerms(1.5, 30.0, 2 ** 24)
    from predictors.versions import PIPELINE_VERSION

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


# ------------------------------------------------------------------------------------ judging a sweep
def _rows(*specs):
    return [SimpleNamespace(status=status, canary_us=canary) for status, canary in specs]


def test_a_sweep_is_clean_only_when_every_window_was_quiet():
    quiet = _rows(("ok", 100.0), ("ok", 104.0), ("ok", 99.0))
    assert judge_sweep(quiet, 100.0, 0.08, 0.05, cpus=2, threads=2).clean
    assert judge_sweep(quiet, 100.0, 0.08, None, cpus=2, threads=2).clean         # no /proc/stat: canary only
    # a timing the profiler rejected (contended in every window, or noisy)
    rejected = judge_sweep(_rows(("ok", 100.0), ("rejected_noisy", 180.0)), 100.0, 0.08, 0.0, 2, 2)
    assert not rejected.clean and "1 of 2 kernel timings were rejected" in rejected.reasons[0]
    # a window accepted early in the sweep whose canary the sweep's final reference shows was slow
    late = judge_sweep(_rows(("ok", 100.0), ("ok", 125.0)), 100.0, 0.08, 0.0, 2, 2)
    assert not late.clean and "ran the canary up to 1.25x the sweep's reference 100 us" in late.reasons[0]
    # busy all along: every canary equally slow passes the relative checks, the other processes' load does not
    busy = judge_sweep(quiet, 100.0, 0.08, 1.1, cpus=2, threads=2)
    assert not busy.clean and "other processes kept 1.10 of this host's 2 core(s) busy" in busy.reasons[0]
    # other processes on cores the suite's threads do not need leave it clean
    assert judge_sweep(quiet, 100.0, 0.08, 5.0, cpus=8, threads=2).clean
    assert not judge_sweep(quiet, 100.0, 0.08, 6.5, cpus=8, threads=2).clean


def test_other_processes_load_is_read_from_proc_stat(tmp_path, monkeypatch):
    cpus = sorted(host_load.os.sched_getaffinity(0))
    tick_s = 1.0 / host_load.os.sysconf("SC_CLK_TCK")

    def stat(busy_ticks_per_cpu):      # user nice system idle iowait irq softirq steal
        return "cpu  1 2 3 4 5 6 7 8 0 0\n" + "".join(
            f"cpu{c} {busy_ticks_per_cpu - 30} 0 20 999 7 4 3 3 0 0\n" for c in cpus)

    monkeypatch.setattr(host_load, "PROC_STAT", tmp_path / "stat")
    (tmp_path / "stat").write_text(stat(100))
    start = host_load.cpu_use_now()
    assert start is not None and start.cpus == len(cpus)
    assert start.busy_s == pytest.approx(len(cpus) * 100 * tick_s)        # idle and iowait are not busy
    end = host_load.CpuUse(start.wall_s + 2.0, start.busy_s + 3.0, start.own_s + 1.0, start.cpus)
    assert host_load.other_load_cores(start, end) == pytest.approx(1.0)   # 3 s busy, 1 s of it ours, over 2 s
    assert host_load.other_load_cores(None, end) is None
    (tmp_path / "stat").write_text("cpu  1 2 3 4 5 6 7 8 0 0\n")          # no per-CPU lines: cannot tell
    assert host_load.cpu_use_now() is None


def test_an_unreadable_or_unjudged_calibration_file_is_measured_again(tmp_path, caplog):
    path = suite_cache_path("somecpu", 2, SMALL_SUITE)
    path.parent.mkdir(parents=True)
    kernel = {"name": "k", "node": random_kernels(np.random.default_rng(0), 1, ("matmul",))[0].to_dict(),
              "host_us": 5.0}
    for content in ('{"kernels": [{"name": "x"}]}',
                    json.dumps({"kernels": [kernel]}),                                     # no time, no judgement
                    json.dumps({"format": host_calibration.CACHE_FORMAT, "measured_at": MEASURED_AT,
                                "judgement": {"clean": False}, "kernels": [kernel]})):   # never written, but refused
        path.write_text(content)
        caplog.clear()
        with caplog.at_level("WARNING", logger="predictors.host_calibration"):
            assert host_calibration._load_cached(path) is None
        assert "unreadable host calibration" in caplog.text


# ------------------------------------------------------------------------------------ compile-level behaviour
def _returns(timing):
    """A stand-in for :func:`time_suite` (cached or timed: the registry cannot tell) that gives ``timing``."""
    return lambda host, threads, time_fresh=None: timing


def _timing(suite, origin, clean=True):
    reasons = () if clean else ("other processes kept 1.40 of this host's 2 core(s) busy on average",)
    return SuiteTiming(tuple(suite), MEASURED_AT, origin, SweepJudgement(reasons, 100.0, 1.4 if reasons else 0.0))


@pytest.fixture
def foreign(fitted, tmp_path, monkeypatch):
    """A znver5 predictor loaded on a "znver4" host running 2 threads; returns (predictor, nodes, path, suite)."""
    predictor, nodes = fitted
    predictor.save(tmp_path / "cpu.json")
    suite = _calibration(DevicePredictor.load(tmp_path / "cpu.json"), nodes, [0.25, 1.0])   # twice as fast
    monkeypatch.setenv("TVM_NUM_THREADS", "2")
    monkeypatch.setattr(registry, "host_cpu_name", lambda: "znver4")
    return predictor, nodes, tmp_path / "cpu.json", suite


@pytest.mark.parametrize("origin", ["fresh", "cached"])
def test_compile_scales_a_foreign_predictor_by_a_clean_calibration_and_says_which(foreign, monkeypatch, caplog,
                                                                                 origin):
    predictor, nodes, path, suite = foreign
    monkeypatch.setattr(host_calibration, "time_suite", _returns(_timing(suite, origin)))
    with caplog.at_level("WARNING", logger="predictors.registry"):
        loaded = registry.load_host_cpu_predictor(path)
    assert isinstance(loaded.predictor, HostScaledPredictor)
    np.testing.assert_allclose(loaded.predictor.predict(nodes), 0.5 * predictor.predict(nodes))
    assert loaded.calibration == HostCalibration(origin, pytest.approx(0.5), MEASURED_AT)
    assert len(caplog.records) == 1 and "\n" not in caplog.text.strip()
    assert "measured on a znver5 CPU; this host is a znver4: its CPU costs are scaled x0.50 by a calibration " \
           f"suite timed here ({origin} calibration, suite timed {MEASURED_AT})" in caplog.text
    note = loaded.cost_note()
    assert "measured on a znver5 CPU" in note and "this host's CPU: znver4" in note
    assert f"scaled x0.50 to this host (calibration: {origin}, suite timed {MEASURED_AT}): the geometric mean" in note
    assert "over 2 calibration kernels timed here with 2 thread(s) (x0.25 to x1.00 per kernel)" in note
    assert registry.cpu_cost_note(loaded.predictor, path) == note     # the scaled predictor knows its calibration
    assert loaded.predictor.provenance()["host_scaling"]["measured_at"] == MEASURED_AT


def test_a_busy_host_leaves_the_predictor_unscaled_with_one_warning(foreign, monkeypatch, caplog):
    predictor, nodes, path, suite = foreign
    suite = _calibration(predictor, nodes, [4.0, 4.0])             # what contention would have made of the ratio
    monkeypatch.setattr(host_calibration, "time_suite", _returns(_timing(suite, "fresh", clean=False)))
    with caplog.at_level("WARNING", logger="predictors.registry"):
        loaded = registry.load_host_cpu_predictor(path)
    assert isinstance(loaded.predictor, DevicePredictor)
    np.testing.assert_allclose(loaded.predictor.predict(nodes), predictor.predict(nodes))
    assert loaded.calibration.status == "none-fallback" and loaded.calibration.speed_ratio == pytest.approx(4.0)
    [record] = caplog.records
    text = record.getMessage()
    assert "\n" not in text and "its CPU costs are not scaled, because the host was busy" in text
    assert "other processes kept 1.40" in text and "ratio x4.00 was neither used nor kept" in text
    assert "Compile again when the host is quiet" in text and "cpu_znver4.json" in text
    note = loaded.cost_note()
    assert (f"not scaled to this host (calibration: none-fallback, suite timed {MEASURED_AT}, its unused ratio "
            "x4.00): the host was busy") in note


def test_a_suite_that_cannot_be_timed_leaves_the_predictor_unscaled(foreign, monkeypatch, caplog):
    predictor, nodes, path, suite = foreign

    def fails(host, threads, time_fresh=None):
        raise PredictorError("TVM's pool runs 1 thread(s).")

    monkeypatch.setattr(host_calibration, "time_suite", fails)
    with caplog.at_level("WARNING", logger="predictors.registry"):
        loaded = registry.load_host_cpu_predictor(path)
    assert isinstance(loaded.predictor, DevicePredictor) and len(caplog.records) == 1
    assert "not scaled, because the calibration suite could not be timed: TVM's pool runs 1 thread(s). " \
           "Profile and fit on this host" in caplog.text
    assert "(calibration: none-fallback, no suite timed): the calibration suite could not be timed" in \
           loaded.cost_note()


def test_a_predictor_of_this_cpu_needs_no_calibration_and_scaling_can_be_declined(foreign, monkeypatch, caplog):
    predictor, nodes, path, suite = foreign
    monkeypatch.setattr(host_calibration, "time_suite", _returns(_timing(suite, "fresh")))
    monkeypatch.setattr(registry, "host_cpu_name", lambda: "znver5")
    with caplog.at_level("WARNING", logger="predictors.registry"):
        native = registry.load_host_cpu_predictor(path)
    assert isinstance(native.predictor, DevicePredictor) and native.calibration is None and not caplog.records
    assert "calibration" not in native.cost_note() and "scaled" not in native.cost_note()
    # kernels timed with another thread count than the deployment's are scaled as well, on the same CPU
    single = copy.deepcopy(predictor)
    single.num_threads = 1
    single.save(path.with_name("cpu_1thread.json"))
    assert isinstance(registry.load_cpu_predictor(path.with_name("cpu_1thread.json")), HostScaledPredictor)
    caplog.clear()
    monkeypatch.setattr(registry, "host_cpu_name", lambda: "znver4")
    with caplog.at_level("WARNING", logger="predictors.registry"):
        unscaled = registry.load_cpu_predictor(path, scale_to_host=False)
    assert isinstance(unscaled, DevicePredictor) and "its CPU costs are not scaled." in caplog.text


# ------------------------------------------------------------------------------------ the injected sweep
def test_the_callers_sweep_times_the_suite_once_and_a_clean_one_is_reused_without_it(foreign, monkeypatch):
    """What a compile does on a foreign CPU: the sweep it passes (the profiler's, in the driver) times the suite
    when no clean calibration is cached; later loads read the cache and need no sweep."""
    predictor, nodes, path, _ = foreign
    calls = []

    def sweep(num_threads, specs):
        calls.append((num_threads, specs))
        kernels = _calibration(DevicePredictor.load(path), nodes, [0.5] * len(specs))
        return SuiteTiming(tuple(kernels), MEASURED_AT, "fresh", SweepJudgement((), 100.0, 0.0))

    monkeypatch.setattr(host_calibration, "_pool_threads", lambda: 2)
    fresh = registry.load_host_cpu_predictor(path, time_fresh=sweep)
    assert calls == [(2, CALIBRATION_SUITE)]
    assert fresh.calibration == HostCalibration("fresh", pytest.approx(0.5), MEASURED_AT)
    np.testing.assert_allclose(fresh.predictor.predict(nodes), 0.5 * predictor.predict(nodes))
    host_calibration.forget_timings()                           # a new process: the clean sweep was kept on disk
    cached = registry.load_host_cpu_predictor(path)
    assert calls == [(2, CALIBRATION_SUITE)] and cached.calibration.status == "cached"
    np.testing.assert_allclose(cached.predictor.predict(nodes), 0.5 * predictor.predict(nodes))


def test_without_a_sweep_and_no_cached_calibration_the_predictor_stays_unscaled(foreign, caplog):
    predictor, nodes, path, _ = foreign
    with caplog.at_level("WARNING", logger="predictors.registry"):
        loaded = registry.load_host_cpu_predictor(path)
    assert isinstance(loaded.predictor, DevicePredictor) and loaded.calibration.status == "none-fallback"
    assert "no sweep was given to time the suite" in loaded.calibration.reason
    assert "its CPU costs are not scaled, because the calibration suite could not be timed" in caplog.text
