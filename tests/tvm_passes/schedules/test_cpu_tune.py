"""tvm_passes.tune: persistent database, database application in cpu_pipeline, keep-only-if-faster, interrupts.

The MetaSchedule search itself costs ~10 s per trial on this machine, so the default tests replace it by a
hand-made record (monkeypatched ``_tune_one``); one slow test runs a real 2-trial search.
"""

from __future__ import annotations

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
from tvm import relax, tirx  # noqa: E402
from tvm.s_tir import meta_schedule as ms  # noqa: E402

from tvm_passes import tune  # noqa: E402
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


def _kernel(mod, target):
    lowered = tune.lower_for_tuning(mod, target)
    (func,) = [f for _, f in lowered.functions_items() if isinstance(f, tirx.PrimFunc)]
    return func


def _record_for(func, target, split_factor=4):
    """A tuning record with a recognisable (and untuned) schedule: the first spatial loop split by 4."""
    task_mod = tune.normalize_mod(func)
    sch = tvm.s_tir.Schedule(task_mod)
    block = [b for b in sch.get_child_blocks(sch.get_sblock("root")) if "matmul" in sch.get(b).name_hint][0]
    sch.split(sch.get_loops(block)[0], factors=[None, split_factor])
    args_info = ms.arg_info.ArgInfo.from_prim_func(task_mod["main"])
    return task_mod, sch.trace, args_info


def test_open_database_is_none_until_created(tmp_path):
    assert tune.open_database(tmp_path / "db", create=False) is None
    assert tune.open_database(tmp_path / "db", create=True) is not None
    assert (tmp_path / "db" / tune.WORKLOAD_FILE).exists()
    assert tune.open_database(tmp_path / "db", create=False) is not None


def test_cpu_pipeline_applies_a_database_record_and_rules_elsewhere(tmp_path):
    target = default_cpu_target()
    mod, w = _dense_module()
    func = _kernel(mod, target)
    task_mod, trace, args_info = _record_for(func, target)
    database = tune.open_database(tmp_path, create=True)
    workload = database.commit_workload(task_mod)
    database.commit_tuning_record(ms.database.TuningRecord(trace, workload, [1e-3], target, args_info))

    from tvm_passes.schedules.pipeline import tuning_database_passes, cpu_schedule_pass

    lowered = tune.lower_for_tuning(mod, target)
    with target:
        applied = tvm.transform.Sequential(tuning_database_passes(tmp_path, target) + [cpu_schedule_pass(target)])(
            lowered
        )
    (scheduled,) = [f for _, f in applied.functions_items() if isinstance(f, tirx.PrimFunc)]
    assert RULE_ATTR not in scheduled.attrs  # came from the database, not from a rule
    assert "T.parallel(" not in scheduled.script()  # the record's schedule, not the rule's

    x = np.random.default_rng(1).standard_normal((16, 64)).astype("float32")
    ex = tvm.compile(mod, target=target, relax_pipeline=cpu_pipeline(target, database_dir=tmp_path))
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, np.maximum(x @ w, 0), rtol=1e-4, atol=1e-4)


class _FakeRecord:
    def __init__(self, trace, args_info):
        self.trace, self.args_info, self.run_secs = trace, args_info, [1e-3]


def test_tuned_schedule_slower_than_the_rules_is_not_kept(tmp_path, monkeypatch):
    target = default_cpu_target()
    mod, _ = _dense_module(64, 256, 256)
    func = _kernel(mod, target)
    task_mod, trace, args_info = _record_for(func, target)  # serial, unvectorised: slower than the rules

    monkeypatch.setattr(tune, "_tune_one", lambda *args, **kwargs: _FakeRecord(trace, args_info))
    seen = []
    report = tune.tune_model(mod, target, trials=8, budget_minutes=1, database_dir=tmp_path, progress=seen.append)
    assert [k.kept for k in report.kernels] == [False]
    assert report.kernels[0].tuned_latency_us > report.kernels[0].rule_latency_us
    assert seen[0].done_kernels == 0 and seen[-1].done_kernels == 1
    database = tune.open_database(tmp_path, create=False)
    assert len(database.get_all_tuning_records()) == 0


def test_interrupt_during_tuning_returns_a_report_and_keeps_the_database(tmp_path, monkeypatch):
    target = default_cpu_target()
    mod, _ = _dense_module()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(tune, "_tune_one", interrupted)
    report = tune.tune_model(mod, target, trials=8, budget_minutes=1, database_dir=tmp_path)
    assert report.interrupted and report.kernels == () and report.trials_used == 0
    assert tune.open_database(tmp_path, create=False) is not None


def test_invalid_budget_is_rejected(tmp_path):
    from hetpart.errors import HetpartError

    mod, _ = _dense_module()
    with pytest.raises(HetpartError, match="trials >= 1"):
        tune.tune_model(mod, default_cpu_target(), trials=0, budget_minutes=1, database_dir=tmp_path)


@pytest.mark.slow
def test_real_metaschedule_search_runs_and_records_outcome(tmp_path):
    target = default_cpu_target()
    mod, _ = _dense_module(8, 32, 16)
    report = tune.tune_model(mod, target, trials=2, budget_minutes=5, database_dir=tmp_path)
    assert report.trials_used == 2 and len(report.kernels) == 1
    kernel = report.kernels[0]
    assert kernel.tuned_latency_us is not None  # the builder/runner produced a measured candidate
    records = tune.open_database(tmp_path, create=False).get_all_tuning_records()
    assert len(records) == (1 if kernel.kept else 0)
