"""Real pipeline runs (gloo, one process per stage, CPU): loss, gradients and parameters equal a single process;
every stage timed. Only numerics and structure are asserted, never absolute times."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

pytest.importorskip("torch")

from hetpart.training_torch.errors import TrainingPlanFileError  # noqa: E402
from hetpart.training_torch.run import rank_layout, run_plan  # noqa: E402

pytestmark = pytest.mark.tvm       # the plans are costed through TVM (one fixture per test run)


def _assert_equal_to_one_process(report, n_stages: int, steps: int) -> None:
    assert report.check is not None and report.check.ok, report.check
    # the toy model is small enough for float32 to stay within the absolute tolerance (no noise-floor allowance)
    assert report.check.grad_max_abs_diff <= 1e-5 and report.check.loss_max_abs_diff <= 1e-5
    assert report.check.param_max_abs_diff <= 1e-5
    assert report.check.params_compared == 22
    assert report.losses == pytest.approx(report.check.reference_losses, abs=1e-5)
    assert len(report.losses) == steps and len(report.stages) == n_stages
    for stage in report.stages:
        assert stage.measured_forward_us > 0 and stage.measured_backward_us > 0 and stage.predicted_us > 0
    assert sum(m for m, _ in report.shares()) == pytest.approx(1.0)
    assert math.isfinite(report.measured_imbalance) and report.measured_imbalance >= 1.0
    assert math.isfinite(report.predicted_imbalance) and report.predicted_imbalance >= 1.0


def test_two_stage_run_equals_one_process(toy_plan_2):
    report = run_plan(toy_plan_2, steps=2, check=True, timeout_s=300)
    assert report.check.pipeline_dtype == "float32" and report.check.float32_reference_grad_diff >= 0
    _assert_equal_to_one_process(report, n_stages=2, steps=2)
    assert [s.units for s in report.stages] == [s.unit_names for s in toy_plan_2.plan.stages]
    assert report.world == 2 and report.threads_per_rank == 1


@pytest.mark.slow
def test_four_stage_gpipe_run_equals_one_process(toy_units):
    from hetpart.training_torch.api import plan_from_units

    source, units = toy_units
    planned = plan_from_units(units.with_cluster("cpu:4"), source, method="pipedream_dp", microbatches=4,
                              schedule="gpipe", options={"allow_fewer_devices": False})
    assert planned.plan.num_stages == 4
    report = run_plan(planned, steps=2, check=True, timeout_s=600, dtype="float64")
    _assert_equal_to_one_process(report, n_stages=4, steps=2)
    assert report.check.pipeline_dtype == "float64" and report.check.grad_max_abs_diff <= 1e-7


@pytest.mark.slow
def test_interleaved_1f1b_with_two_stages_per_rank(toy_units):
    """The planners put one stage on each device; a loop layout (stage s on rank s % 2) built by hand runs under
    torch's ScheduleInterleaved1F1B."""
    import time

    from hetpart.training.common import PlannerConfig, build_plan
    from hetpart.training_torch.plan_file import TrainingPlanFile

    source, units = toy_units
    n = units.graph.num_ops
    bounds = [0, n // 4, n // 2, 3 * n // 4, n]
    stage_ops = [list(range(bounds[k], bounds[k + 1])) for k in range(4)]
    plan = build_plan(units.graph, units.train_costs, units.cluster, stage_ops, [["cpu0"], ["cpu1"]] * 2,
                      PlannerConfig(microbatches=4, schedule="interleaved_1f1b"), "manual", started=time.perf_counter())
    planned = TrainingPlanFile(source=source, plan=units.name_stages(plan), graph=units.graph,
                               train_costs=units.train_costs, split_points=tuple(units.split_points(plan)),
                               loss="cross_entropy").validate()
    assert rank_layout(planned, "interleaved_1f1b")[1] == [(0, 2), (1, 3)]
    report = run_plan(planned, steps=2, check=True, timeout_s=600)
    _assert_equal_to_one_process(report, n_stages=4, steps=2)
    assert report.world == 2


def test_layouts_torch_cannot_run_are_refused_before_any_process_starts(toy_units, toy_plan_2):
    from hetpart.training_torch.api import plan_from_units

    plan = toy_plan_2.plan
    replicated = replace(toy_plan_2, plan=replace(plan, stages=(replace(plan.stages[0], devices=("cpu0", "cpu1")),
                                                                 plan.stages[1])))
    with pytest.raises(TrainingPlanFileError, match="replicated"):
        rank_layout(replicated, "1f1b")
    with pytest.raises(TrainingPlanFileError, match="schedule must be"):
        rank_layout(toy_plan_2, "dualpipe")
    from hetpart.training_torch.plan_file import ModelSource

    with pytest.raises(TrainingPlanFileError, match="dimension 0"):      # [sequence, batch] inputs
        run_plan(replace(toy_plan_2, source=ModelSource("lstm_lm", 8)), steps=1)
    # ranks follow the stages: whichever device holds stage 0 is rank 0
    swapped = replace(toy_plan_2, plan=replace(plan, stages=(replace(plan.stages[0], devices=("cpu1",)),
                                                              replace(plan.stages[1], devices=("cpu0",)))))
    assert rank_layout(swapped, "gpipe") == (["cpu1", "cpu0"], [(0,), (1,)])
    source, units = toy_units
    four = plan_from_units(units.with_cluster("cpu:4"), source, method="pipedream_dp", microbatches=4,
                           options={"allow_fewer_devices": False}).plan
    folded = [replace(s, devices=(d,)) for s, d in zip(four.stages, ("cpu0", "cpu1", "cpu1", "cpu0"))]
    not_a_loop = replace(toy_plan_2, plan=replace(four, schedule="interleaved_1f1b", stages=tuple(folded)))
    with pytest.raises(TrainingPlanFileError, match="loop layout"):
        rank_layout(not_a_loop, "interleaved_1f1b")
    with pytest.raises(TrainingPlanFileError, match="one stage per rank"):
        rank_layout(not_a_loop, "1f1b")


def test_the_check_allows_float32_noise_but_not_more():
    from hetpart.training_torch.run import CheckResult

    def check(grad: float, dtype: str) -> CheckResult:
        return CheckResult(loss_max_abs_diff=1e-7, grad_max_abs_diff=grad, param_max_abs_diff=1e-7,
                           reference_losses=(1.0,), params_compared=1, tolerance=1e-5,
                           float32_reference_grad_diff=1.5e-4, float32_reference_loss_diff=1e-7,
                           float32_reference_param_diff=1e-7, pipeline_dtype=dtype)

    assert check(2.9e-4, "float32").ok                 # within twice the float32 single-process run's own error
    assert not check(4e-4, "float32").ok
    assert not check(2e-5, "float64").ok and check(1e-6, "float64").ok


def test_torchrun_ranks_use_the_gpu_their_plan_names():
    from types import SimpleNamespace

    from hetpart.training import Cluster
    from hetpart.training_torch.errors import PipelineRunError
    from hetpart.training_torch.torchrun_main import gpu_indices

    plan_file = SimpleNamespace(plan=SimpleNamespace(cluster=Cluster.parse("gpu=a100x8,per_node=4")))
    stage_devices = ["gpu2", "gpu0", "gpu5", "gpu4"]          # stage r on these devices: rank r runs stage r
    assert gpu_indices(plan_file, stage_devices, rank=0, node=0) == (2, 0, 1, 0)
    assert gpu_indices(plan_file, stage_devices, rank=3, node=1) == (2, 0, 1, 0)
    with pytest.raises(PipelineRunError, match="node"):
        gpu_indices(plan_file, stage_devices, rank=2, node=0)


@pytest.mark.slow
def test_the_torchrun_entry_point_with_gloo_on_cpu(toy_plan_2, tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    plan = toy_plan_2.save(tmp_path / "plan.json")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             "-m", "hetpart.training_torch.torchrun_main", str(plan), "--steps", "2", "--check",
                             "--backend", "gloo", "--device", "cpu", "--report", str(tmp_path / "report.json")],
                            capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["check"]["ok"] and report["world"] == 2 and len(report["stages"]) == 2
