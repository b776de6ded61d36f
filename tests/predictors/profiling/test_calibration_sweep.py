"""The host calibration's fresh sweep: the suite's kernels compiled and timed now with the profiler's protocol,
judged clean only when every window was quiet, and kept (by :func:`predictors.host_calibration.time_suite`) only
then."""
import datetime
import json

import pytest

from hetpart.errors import PredictorError
from predictors import host_calibration
from predictors.host_calibration import measure_suite, suite_cache_path, time_suite
from predictors.profiling import calibration_sweep
from predictors.profiling.calibration_sweep import time_fresh

from tests.predictors.calibration import SMALL_SUITE, private_cache  # noqa: F401 (autouse fixture)


@pytest.fixture(scope="module")
def small_workloads():
    """The deployment kernels of SMALL_SUITE (built once; nothing is timed)."""
    from predictors.profiling.profiler import KernelProfiler

    return calibration_sweep.suite_workloads(SMALL_SUITE, KernelProfiler("cpu"))


class FakeSweep:
    """Injects the profiler's verdicts and the other processes' load into :func:`time_fresh`."""

    def __init__(self, monkeypatch, workloads):
        from predictors.profiling.profiler import KernelProfiler

        self.status, self.canary_us, self.other_cores, self.measured = "ok", 100.0, 0.05, 0
        self.busy_before = None
        monkeypatch.setattr(calibration_sweep, "busy_reason_now", lambda threads: self.busy_before)
        monkeypatch.setattr(calibration_sweep, "suite_workloads", lambda specs, profiler: workloads)
        monkeypatch.setattr(host_calibration, "_pool_threads", lambda: 2)
        monkeypatch.setattr(calibration_sweep, "host_cpus", lambda: 2)
        monkeypatch.setattr(calibration_sweep, "other_load_cores", lambda start, end: self.other_cores)
        monkeypatch.setattr(KernelProfiler, "canary_reference_us", property(lambda profiler: 100.0))
        monkeypatch.setattr(KernelProfiler, "measure", lambda profiler, workload: self._row(workload))

    def _row(self, workload):
        from predictors.profiling.store import Measurement

        self.measured += 1
        status = self.status(workload) if callable(self.status) else self.status
        timed = status != "failed"
        median_us = 10.0 * self.measured if timed else None
        return Measurement(key_hash=workload.key_hash, workload_key=workload.workload_key, kernel_name=workload.name,
                           device="cpu", target="llvm", tvm_version="x", num_threads=2, canary_kernel="c",
                           features=workload.features, session_id="s", canary_us=self.canary_us if timed else None,
                           median_us=median_us, mad_us=0.0 if timed else None, spread=0.0 if timed else None,
                           n_repeats=7 if timed else 0, number=1, samples_us=(median_us,) * 7 if timed else (),
                           status=status, error="" if status == "ok" else "contended", timestamp_s=0.0)


@pytest.fixture
def sweep(monkeypatch, small_workloads):
    return FakeSweep(monkeypatch, small_workloads)


@pytest.mark.tvm
def test_a_clean_sweep_is_cached_with_when_it_was_measured_and_reused(sweep, monkeypatch):
    before = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    timing = time_suite("somecpu", 2, SMALL_SUITE, time_fresh=time_fresh)
    assert timing.clean and timing.origin == "fresh" and sweep.measured == 2 * len(SMALL_SUITE)
    assert [k.name.split("/")[0] for k in timing.kernels] == [s.name for s in SMALL_SUITE]
    assert [k.host_us for k in timing.kernels] == [10.0, 20.0]          # each kernel's lower pass
    assert timing.kernels[1].node.flops == 2 * 8 * 64 * 64 + 8 * 64      # the kernel's features (bias add)
    saved = json.loads(suite_cache_path("somecpu", 2, SMALL_SUITE).read_text())
    measured_at = datetime.datetime.fromisoformat(saved["measured_at"])
    assert measured_at.utcoffset() == datetime.timedelta(0) and measured_at >= before
    assert saved["measured_at"] == timing.measured_at and saved["num_threads"] == 2
    assert saved["judgement"] == {"clean": True, "reasons": [], "canary_reference_us": 100.0,
                                  "other_load_cores": 0.05}
    assert time_suite("somecpu", 2, SMALL_SUITE, time_fresh=time_fresh) is timing      # kept for the process
    # a new process reads the file instead of timing again
    host_calibration.forget_timings()
    sweep.status = lambda workload: pytest.fail("timed again")
    again = time_suite("somecpu", 2, SMALL_SUITE, time_fresh=time_fresh)
    assert again.origin == "cached" and again.kernels == timing.kernels and again.measured_at == timing.measured_at
    assert measure_suite("somecpu", 2, SMALL_SUITE, time_fresh=time_fresh) == timing.kernels


@pytest.mark.tvm
@pytest.mark.parametrize("busy", ["busy_before", "other_load", "rejected", "late_canary"])
def test_a_busy_sweep_is_neither_kept_nor_accepted(sweep, busy):
    if busy == "busy_before":
        sweep.busy_before = "other processes kept 1.90 of this host's 2 core(s) busy before the suite started"
    elif busy == "other_load":
        sweep.other_cores = 1.4                       # every canary equally slow: only the load shows it
    elif busy == "rejected":
        sweep.status = lambda workload: "rejected_noisy" if "matmul" in workload.name else "ok"
    else:
        sweep.canary_us = 140.0                       # above the sweep's final reference (100 us)
    timing = time_suite("busycpu", 2, SMALL_SUITE, time_fresh=time_fresh)
    assert not timing.clean and timing.origin == "fresh" and timing.judgement.reasons
    assert not suite_cache_path("busycpu", 2, SMALL_SUITE).exists()
    timed = sweep.measured
    expected = {"busy_before": 0, "rejected": calibration_sweep.ATTEMPTS + [s.name for s in SMALL_SUITE].index(
        next(s.name for s in SMALL_SUITE if "matmul" in s.name))}.get(busy, 2 * len(SMALL_SUITE))
    assert timed == expected, "a busy host is not timed further than needed to know it is busy"
    with pytest.raises(PredictorError, match="is not clean"):
        # the busy verdict is reused for a while, not timed again
        measure_suite("busycpu", 2, SMALL_SUITE, time_fresh=time_fresh)
    assert sweep.measured == timed
    host_calibration.forget_timings()
    assert not time_suite("busycpu", 2, SMALL_SUITE, time_fresh=time_fresh).clean and sweep.measured == 2 * timed


@pytest.mark.tvm
def test_a_window_rejected_once_is_timed_again_and_the_sweep_stays_clean(sweep):
    """A quiet host still has spells of a few seconds: one contended window is retried, as the profiler does."""
    rejected = []

    def once(workload):
        if "matmul" in workload.name and not rejected:
            rejected.append(workload.name)
            return "rejected_noisy"
        return "ok"

    sweep.status = once
    timing = time_suite("spellcpu", 2, SMALL_SUITE, time_fresh=time_fresh)
    assert rejected and timing.clean and sweep.measured == 2 * len(SMALL_SUITE) + 1
    assert len(timing.kernels) == len(SMALL_SUITE) and suite_cache_path("spellcpu", 2, SMALL_SUITE).exists()


@pytest.mark.tvm
def test_too_few_kernels_built_refuse_to_scale(sweep):
    sweep.status = "failed"                           # a build failure is not contention: the sweep stays clean
    with pytest.raises(PredictorError, match="only 0 of the 2 calibration kernels could be built"):
        time_suite("brokencpu", 2, SMALL_SUITE, time_fresh=time_fresh)
    assert not suite_cache_path("brokencpu", 2, SMALL_SUITE).exists()


@pytest.mark.tvm
def test_the_real_suite_is_timed_and_kept_only_when_clean(monkeypatch):
    """Really times two small kernels: on a busy host the sweep is unclean and not kept, which is right too."""
    from predictors.profiling.profiler import num_threads

    threads = num_threads()
    timing = time_suite("somecpu", threads, SMALL_SUITE, time_fresh=time_fresh)
    assert set(k.name.split("/")[0] for k in timing.kernels) <= {s.name for s in SMALL_SUITE}
    assert all(k.host_us > 0 for k in timing.kernels)
    path = suite_cache_path("somecpu", threads, SMALL_SUITE)
    assert path.exists() is timing.clean
    if timing.clean:
        assert len(timing.kernels) == len(SMALL_SUITE) and json.loads(path.read_text())["num_threads"] == threads
        host_calibration.forget_timings()
        monkeypatch.setattr("predictors.profiling.profiler.KernelProfiler.measure",
                            lambda *a: pytest.fail("timed again"))
        assert time_suite("somecpu", threads, SMALL_SUITE, time_fresh=time_fresh).kernels == timing.kernels
    else:
        assert timing.judgement.reasons
    # another thread count than TVM's pool cannot be timed here
    with pytest.raises(PredictorError, match="TVM's pool runs"):
        time_suite("somecpu", threads + 1, SMALL_SUITE, time_fresh=time_fresh)
