"""tvm_passes.tune + the database in cpu_pipeline/build: records applied, unreadable databases ignored with one
warning, keep-only-if-faster, atomic commits across interrupts, the wall-clock budget and progress reporting.

The MetaSchedule search costs ~10 s per trial on this machine, so the default tests replace it
(monkeypatched ``tune_one``) and, for the budget, also the rule timing and the clock; one slow test runs a
real 2-trial search.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
from tvm import relax, tirx  # noqa: E402
from tvm.s_tir import meta_schedule as ms  # noqa: E402

from tvm_passes import tune, tuning_db  # noqa: E402
from tvm_passes.schedules import RULE_ATTR, cpu_pipeline, default_cpu_target  # noqa: E402

pytestmark = pytest.mark.tvm


def _dense_module(m=16, k=64, n=48):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((k, n)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((m, k), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(relax.op.matmul(x, relax.const(w))))
        bb.emit_func_output(out)
    return bb.get(), w


def _four_kernel_module():
    """matmul -> softmax -> matmul -> softmax: four distinct kernels, each called once."""
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((16, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.matmul(x, relax.const(rng.standard_normal((64, 48)).astype("float32"))))
            h = bb.emit(relax.op.nn.softmax(h))
            h = bb.emit(relax.op.matmul(h, relax.const(rng.standard_normal((48, 32)).astype("float32"))))
            out = bb.emit_output(relax.op.nn.softmax(h))
        bb.emit_func_output(out)
    return bb.get()


def _kernel(mod, target):
    lowered = tune.lower_for_tuning(mod, target)
    (func,) = [f for _, f in lowered.functions_items() if isinstance(f, tirx.PrimFunc)]
    return func


def _record_for(func, split_factor=4):
    """A tuning record with a recognisable (and untuned) schedule: the first spatial loop split by 4."""
    task_mod = tuning_db.workload_module(func)
    sch = tvm.s_tir.Schedule(task_mod)
    block = next(b for b in sch.get_child_blocks(sch.get_sblock("root")) if "matmul" in sch.get(b).name_hint)
    sch.split(sch.get_loops(block)[0], factors=[None, split_factor])
    args_info = ms.arg_info.ArgInfo.from_prim_func(task_mod["main"])
    return task_mod, sch.trace, args_info


def _commit(directory, func, target):
    task_mod, trace, args_info = _record_for(func)
    record = ms.database.TuningRecord(trace, ms.database.MemoryDatabase().commit_workload(task_mod), [1e-3], target,
                                      args_info)
    tuning_db.commit_record(directory, task_mod, record, target)


def _run_dense(ex, w):
    x = np.random.default_rng(1).standard_normal((16, 64)).astype("float32")
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, np.maximum(x @ w, 0), rtol=1e-4, atol=1e-4)


def test_cpu_pipeline_applies_a_database_record_and_rules_elsewhere(tmp_path):
    target = default_cpu_target()
    mod, w = _dense_module()
    _commit(tmp_path, _kernel(mod, target), target)

    from tvm_passes.schedules.pipeline import cpu_schedule_pass, tuning_database_passes

    lowered = tune.lower_for_tuning(mod, target)
    with target:
        applied = tvm.transform.Sequential(tuning_database_passes(tmp_path, target) + [cpu_schedule_pass(target)])(
            lowered
        )
    (scheduled,) = [f for _, f in applied.functions_items() if isinstance(f, tirx.PrimFunc)]
    assert RULE_ATTR not in scheduled.attrs  # came from the database, not from a rule
    assert "T.parallel(" not in scheduled.script()  # the record's schedule, not the rule's
    _run_dense(tvm.compile(mod, target=target, relax_pipeline=cpu_pipeline(target, database_dir=tmp_path)), w)


def _build_device_annotated(mod, database_dir):
    """tvm_passes.build.build (the `hetpart compile` path) of ``mod`` placed on the CPU of a CPU+GPU pair."""
    from hetpart.devices import DeviceSet, cpu_device, gpu_from_preset, preset_links
    from hetpart.plan import Plan
    from tvm_passes.annotate import AnnotateDevicePlacement
    from tvm_passes.build import build

    devices = DeviceSet((cpu_device(), gpu_from_preset("t4")), preset_links("t4"))
    plan = Plan(device_of=("cpu", "cpu"), order=(0, 1), devices=("cpu", "gpu"), method="hand-written")
    return build(AnnotateDevicePlacement(plan, devices)(mod), devices, emulate_gpu=True, tuning_database=database_dir)


def _check_dense_result(result, w):
    x = np.random.default_rng(1).standard_normal((16, 64)).astype("float32")
    np.testing.assert_allclose(result.run(x)[0], np.maximum(x @ w, 0), rtol=1e-4, atol=1e-4)


def test_build_of_a_device_annotated_module_applies_the_database_and_keeps_its_vdevices(tmp_path):
    target = default_cpu_target()
    mod, w = _dense_module()
    _commit(tmp_path, _kernel(mod, target), target)
    result = _build_device_annotated(mod, tmp_path)
    kernels = [f for _, f in result.lowered.functions_items() if isinstance(f, tirx.PrimFunc) and "matmul" in str(f)]
    assert kernels and all(RULE_ATTR not in f.attrs for f in kernels)  # the record matched the device-bound kernel
    assert "vdevice" in result.lowered.global_infos
    _check_dense_result(result, w)


def test_build_with_empty_database_files_warns_once_and_uses_the_rules(tmp_path, caplog):
    for path in tuning_db.database_files(tmp_path):
        path.write_text("")
    mod, w = _dense_module()
    with caplog.at_level(logging.WARNING):
        result = _build_device_annotated(mod, tmp_path)
    _check_dense_result(result, w)
    kernels = [f for _, f in result.lowered.functions_items() if isinstance(f, tirx.PrimFunc) and "matmul" in str(f)]
    assert kernels and all(RULE_ATTR in f.attrs for f in kernels)
    (warning,) = [r for r in _warnings(caplog) if "tuning database" in r.getMessage()]
    assert str(tmp_path) in warning.getMessage() and "hetpart tune" in warning.getMessage()


def _warnings(caplog):
    return [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("contents", [("", ""), ("{not json\n", "[[[garbage\n")], ids=["empty-files", "garbage-json"])
def test_compile_with_an_unreadable_database_warns_once_and_uses_the_rules(tmp_path, caplog, contents):
    for path, text in zip(tuning_db.database_files(tmp_path), contents):
        path.write_text(text)
    target = default_cpu_target()
    mod, w = _dense_module()
    with caplog.at_level(logging.WARNING):
        ex = tvm.compile(mod, target=target, relax_pipeline=cpu_pipeline(target, database_dir=tmp_path))
    _run_dense(ex, w)
    (warning,) = _warnings(caplog)
    assert str(tmp_path) in warning.getMessage() and "hetpart tune" in warning.getMessage()


def test_a_record_whose_trace_does_not_fit_its_workload_warns_once_and_uses_the_rules(tmp_path, caplog):
    target = default_cpu_target()
    mod, w = _dense_module()
    _commit(tmp_path, _kernel(mod, target), target)
    record_path = tuning_db.database_files(tmp_path)[1]
    text = record_path.read_text()
    assert '["root","main"]' in text
    record_path.write_text(text.replace('["root","main"]', '["no_such_block","main"]'))
    with caplog.at_level(logging.WARNING):
        ex = tvm.compile(mod, target=target, relax_pipeline=cpu_pipeline(target, database_dir=tmp_path))
    _run_dense(ex, w)
    (warning,) = _warnings(caplog)
    assert str(tmp_path) in warning.getMessage() and "hetpart tune" in warning.getMessage()


class _FailingDatabase:
    """Claims a record for every kernel, then fails to produce its schedule."""

    def has_workload(self, _mod) -> bool:
        return True

    def query_schedule(self, _mod, _target, _name):
        raise RuntimeError("trace does not apply")


def test_records_failing_at_build_time_leave_their_kernels_to_the_rules_with_one_warning(caplog):
    from tvm_passes.schedules.pipeline import apply_database_pass, cpu_schedule_pass

    target = default_cpu_target()
    lowered = tune.lower_for_tuning(_four_kernel_module(), target)
    with caplog.at_level(logging.WARNING), target:
        applied = tvm.transform.Sequential([apply_database_pass(_FailingDatabase(), target, "/db"),
                                            cpu_schedule_pass(target)])(lowered)
    (warning,) = _warnings(caplog)
    assert "4 kernel(s)" in warning.getMessage() and "/db" in warning.getMessage()
    assert all(RULE_ATTR in f.attrs for _, f in applied.functions_items() if isinstance(f, tirx.PrimFunc))


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


class _FakeRecord:
    def __init__(self, trace, args_info):
        self.trace, self.args_info, self.run_secs = trace, args_info, [1e-3]


def test_tuned_schedule_slower_than_the_rules_is_not_kept(tmp_path, monkeypatch):
    target = default_cpu_target()
    mod, _ = _dense_module(64, 256, 256)
    _, trace, args_info = _record_for(_kernel(mod, target))  # serial, unvectorised: slower than the rules

    def one_batch(task_mod, name, target, trials, work_dir, on_batch):
        on_batch(trials, None)
        return _FakeRecord(trace, args_info)

    monkeypatch.setattr(tune, "tune_one", one_batch)
    seen = []
    report = tune.tune_model(mod, target, trials=8, budget_minutes=1, database_dir=tmp_path, progress=seen.append,
                             clock=FakeClock())  # real timings, but the budget never runs out
    assert [k.kept for k in report.kernels] == [False]
    assert report.kernels[0].tuned_latency_us > report.kernels[0].rule_latency_us
    assert report.trials_used == report.kernels[0].trials >= 1
    assert seen[-1].phase == "done" and seen[-1].done_kernels == 1
    assert not tuning_db.has_database(tmp_path)  # nothing kept: no (empty) files either


def _fake_timings(monkeypatch, clock, rule_timing_s, rule_us=100.0, tuned_us=50.0):
    """Rule timings advance ``clock`` by ``rule_timing_s`` and report ``rule_us``; tuned schedules ``tuned_us``."""

    def fake_time_us(func, target, args, repeat=5):
        clock.now_s += rule_timing_s
        return rule_us if RULE_ATTR in func.attrs else tuned_us

    monkeypatch.setattr(tune, "_time_us", fake_time_us)


def _fake_search(monkeypatch, clock, seconds_per_trial, started):
    """A search measuring TRIALS_PER_ITER-sized batches until told to stop; the k-th search started takes
    ``seconds_per_trial[k]`` (fake clock) per trial."""

    def fake_tune_one(task_mod, name, target, trials, work_dir, on_batch):
        per_trial_s = seconds_per_trial[min(len(started), len(seconds_per_trial) - 1)]
        started.append(trials)
        done = 0
        while done < trials:
            batch = min(tune.TRIALS_PER_ITER, trials - done)
            clock.now_s += batch * per_trial_s
            done += batch
            if not on_batch(batch, 42.0):
                break

    monkeypatch.setattr(tune, "tune_one", fake_tune_one)


def test_budget_estimates_come_from_priors_until_work_is_measured():
    clock = FakeClock()
    budget = tune.TuningBudget(deadline_s=clock() + 100.0, clock=clock, prior_seconds_per_trial=20.0,
                               prior_rule_timing_s=2.0)
    assert budget.trials_to_start(64, 8) == 4  # (100 - 2 x 2) // 20
    budget.record_rule_timing(1.0)
    budget.record_batch(8, 40.0, first=True)
    assert budget.seconds_per_trial() == 5.0 and budget.rule_timing_s() == 1.0
    assert budget.trials_to_start(64, 8) == 19 and budget.trials_to_start(3, 8) == 3
    # A batch costs at least what measured batches cost: one trial is not 5 s when a batch took 40 s.
    assert budget.batch_s(1, first=True) == 40.0 and budget.batch_s(16, first=True) == 80.0
    budget.record_batch(8, 24.0, first=False)
    assert budget.batch_s(1, first=False) == 24.0 and budget.batch_s(1, first=True) == 40.0
    clock.now_s += 60.0  # 40 s left, 2 s kept for timing the result
    assert budget.batch_fits(8, first=False) and not budget.batch_fits(8, first=True)
    assert budget.trials_to_start(64, 8) == 0
    clock.now_s += 39.5
    assert not budget.can_time_rule()


def test_the_budget_stops_rule_timing_and_never_starts_tuning_that_cannot_fit(tmp_path, monkeypatch):
    clock, started, seen = FakeClock(), [], []
    _fake_timings(monkeypatch, clock, rule_timing_s=10.0)
    _fake_search(monkeypatch, clock, [5.0], started)
    report = tune.tune_model(_four_kernel_module(), default_cpu_target(), trials=64, budget_minutes=0.5,
                             database_dir=tmp_path, progress=seen.append, clock=clock)
    assert started == [] and report.kernels == () and report.trials_used == 0
    assert report.stopped_by_budget and report.elapsed_s <= 30.0
    assert [s.reason for s in report.skipped].count("budget: not timed, not tuned") == 1
    assert [s.reason for s in report.skipped].count("budget: not tuned") == 3
    assert any("budget stopped work" in note for note in report.notes)
    assert [p.done_kernels for p in seen if p.phase == "timing rules"] == [1, 2, 3]
    assert seen[0].phase == "lowering" and seen[-1].phase == "done"


def test_the_budget_sizes_each_kernel_from_measured_trials_and_cuts_a_search_short(tmp_path, monkeypatch):
    clock, started, seen = FakeClock(), [], []
    _fake_timings(monkeypatch, clock, rule_timing_s=1.0)
    _fake_search(monkeypatch, clock, [5.0, 8.0], started)
    report = tune.tune_model(_four_kernel_module(), default_cpu_target(), trials=64, budget_minutes=100 / 60,
                             database_dir=tmp_path, progress=seen.append, trials_per_kernel=16, clock=clock)
    # 4 s of rule timings (1 s each); the first search gets what the 20 s/trial prior allows: (96 - 2) // 20.
    # Measured at 5 s/trial, the second is offered (76 - 2) // 5 = 14 trials, but they take 8 s: after its
    # first batch of 8 (88 s in; 7 s/trial and 42 s per batch measured) the other 6 no longer fit and the
    # search is cut.  The 12 s left cannot hold a batch, so the last two kernels are not started.
    assert started == [4, 14]
    assert [(k.trials, k.stopped_by_budget) for k in report.kernels] == [(4, False), (8, True)]
    assert report.trials_used == 12 and report.stopped_by_budget
    assert [s.reason for s in report.skipped] == ["budget: not tuned", "budget: not tuned"]
    assert report.elapsed_s <= 100.0
    assert any("after 8 of 14 trials" in note for note in report.notes)
    assert any("budget stopped work" in note and "2 kernel(s) not tuned" in note for note in report.notes)
    assert len([p for p in seen if p.phase == "tuning" and "trials, best" in p.detail]) == 2  # one per batch


def test_records_of_finished_kernels_survive_an_interrupt_and_no_empty_files_are_left(tmp_path, monkeypatch):
    target = default_cpu_target()
    mod, w = _dense_module()
    _, trace, args_info = _record_for(_kernel(mod, target))
    clock = FakeClock()
    _fake_timings(monkeypatch, clock, rule_timing_s=0.0)  # tuned 50 us < rules 100 us: kept

    calls = []

    def first_then_interrupt(task_mod, name, target, trials, work_dir, on_batch):
        calls.append(name)
        if len(calls) > 1:
            raise KeyboardInterrupt
        on_batch(trials, 50.0)
        return _FakeRecord(trace, args_info)

    monkeypatch.setattr(tune, "tune_one", first_then_interrupt)
    report = tune.tune_model(mod, target, trials=8, budget_minutes=1, database_dir=tmp_path, clock=clock)
    assert [k.kept for k in report.kernels] == [True] and not report.interrupted
    two = _four_kernel_module()
    report = tune.tune_model(two, target, trials=64, budget_minutes=1, database_dir=tmp_path, clock=clock)
    assert report.interrupted and report.kernels == ()
    assert all(path.stat().st_size > 0 for path in tmp_path.iterdir())
    assert len(tuning_db.read_database(tmp_path).get_all_tuning_records()) == 1
    _run_dense(tvm.compile(mod, target=target, relax_pipeline=cpu_pipeline(target, database_dir=tmp_path)), w)


def test_tuning_sets_an_unreadable_database_aside_and_starts_a_new_one(tmp_path, monkeypatch, caplog):
    workload_path, record_path = tuning_db.database_files(tmp_path)
    workload_path.write_text("")
    record_path.write_text("[[[garbage\n")
    target = default_cpu_target()
    mod, _ = _dense_module()
    _, trace, args_info = _record_for(_kernel(mod, target))
    clock = FakeClock()
    _fake_timings(monkeypatch, clock, rule_timing_s=0.0)

    def one_batch(task_mod, name, target, trials, work_dir, on_batch):
        on_batch(trials, 50.0)
        return _FakeRecord(trace, args_info)

    monkeypatch.setattr(tune, "tune_one", one_batch)
    with caplog.at_level(logging.WARNING):
        report = tune.tune_model(mod, target, trials=8, budget_minutes=1, database_dir=tmp_path, clock=clock)
    assert [k.kept for k in report.kernels] == [True]
    assert any("set aside" in note for note in report.notes) and len(_warnings(caplog)) == 1
    assert (tmp_path / (record_path.name + tuning_db.UNREADABLE_SUFFIX)).read_text() == "[[[garbage\n"
    assert len(tuning_db.read_database(tmp_path).get_all_tuning_records()) == 1


def test_heartbeat_reports_while_a_blocking_step_runs():
    beats, enough = [], threading.Event()

    def beat():
        beats.append(1)
        if len(beats) >= 2:
            enough.set()

    with tune.heartbeat(0.01, beat):
        assert enough.wait(timeout=60)  # a long, silent step: the heartbeat still reports
    count = len(beats)
    assert count >= 2
    threading.Event().wait(0.05)
    assert len(beats) == count  # stopped with the block


def test_tuning_context_needs_only_the_host_cpu_tensor_intrinsics():
    code = (
        "import sys\n"
        "import numpy as np\n"
        "from tvm import relax, tirx\n"
        "from tvm.s_tir import meta_schedule as ms\n"
        "from tvm_passes import tune, tune_search, tuning_db\n"
        "from tvm_passes.schedules import default_cpu_target\n"
        "bb = relax.BlockBuilder()\n"
        "x = relax.Var('x', relax.TensorType((16, 64), 'float32'))\n"
        "with bb.function('main', [x]):\n"
        "    with bb.dataflow():\n"
        "        out = bb.emit_output(relax.op.matmul(x, relax.const(np.ones((64, 48), 'float32'))))\n"
        "    bb.emit_func_output(out)\n"
        "target = default_cpu_target()\n"
        "lowered = tune.lower_for_tuning(bb.get(), target)\n"
        "(func,) = [f for _, f in lowered.functions_items() if isinstance(f, tirx.PrimFunc)]\n"
        "with tune_search.cpu_tensor_intrinsics_only(target):\n"
        "    context = ms.TuneContext(mod=tuning_db.workload_module(func), target=target,\n"
        "                             space_generator='post-order-apply', search_strategy='evolutionary',\n"
        "                             task_name='t', num_threads=1)\n"
        "    assert context.generate_design_space()\n"
        "    loaded = sorted(m for m in sys.modules if m.startswith('tvm.s_tir.tensor_intrin.'))\n"
        "assert 'tvm.s_tir.tensor_intrin' not in sys.modules\n"
        "print(','.join(loaded))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    loaded = result.stdout.strip().splitlines()[-1].split(",")
    assert loaded != [""] and "tvm.s_tir.tensor_intrin.cuda" not in loaded


def test_invalid_budget_is_rejected(tmp_path):
    from hetpart.errors import HetpartError

    mod, _ = _dense_module()
    with pytest.raises(HetpartError, match="trials >= 1"):
        tune.tune_model(mod, default_cpu_target(), trials=0, budget_minutes=1, database_dir=tmp_path)


@pytest.mark.slow
def test_real_metaschedule_search_runs_and_records_outcome(tmp_path):
    target = default_cpu_target()
    mod, _ = _dense_module(8, 32, 16)
    seen = []
    report = tune.tune_model(mod, target, trials=2, budget_minutes=5, database_dir=tmp_path, progress=seen.append)
    assert report.trials_used == 2 and len(report.kernels) == 1
    kernel = report.kernels[0]
    assert kernel.tuned_latency_us is not None  # the builder/runner produced a measured candidate
    assert any("2/2 trials" in p.detail for p in seen)  # the measure callback reported the batch
    database = tuning_db.read_database(tmp_path)
    assert (len(database.get_all_tuning_records()) if database else 0) == (1 if kernel.kept else 0)
