"""``hetpart train-plan`` -> plan.json -> ``hetpart train-run --steps 2 --check`` on a zoo model, as a user would."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[3]


def _hetpart(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "hetpart", *args], capture_output=True, text=True, timeout=900,
                          cwd=cwd, env=env)


@pytest.mark.tvm
def test_train_plan_then_train_run_with_check(tmp_path):
    plan = tmp_path / "plan.json"
    made = _hetpart("train-plan", "squeezenet1_1", "--size", "32", "--devices", "cpu:2", "--microbatches", "2",
                    "--batch", "4", "--method", "antichain_dp", "--all-devices", "-o", str(plan), cwd=tmp_path)
    assert made.returncode == 0, made.stderr[-3000:]
    data = json.loads(plan.read_text())
    assert data["kind"] == "hetpart.training_torch.plan" and len(data["plan"]["stages"]) == 2
    assert data["split_points"] == [data["plan"]["stages"][1]["unit_names"][0]]
    assert "features.0" in data["plan"]["stages"][0]["unit_names"]
    assert "split points" in made.stdout and "features." in made.stdout

    ran = _hetpart("train-run", str(plan), "--steps", "2", "--check", cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert "step 0: loss" in ran.stdout and "step 1: loss" in ran.stdout
    assert "stage-time imbalance" in ran.stdout and "measured" in ran.stdout and "predicted" in ran.stdout
    assert "equal" in ran.stdout and "DIFFERENT" not in ran.stdout


def test_help_lists_the_training_commands_without_importing_torch():
    code = ("import sys; from hetpart.driver.cli import build_parser; p = build_parser(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'tvm')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
    shown = _hetpart("--help", cwd=REPO)
    assert all(cmd in shown.stdout for cmd in ("train-plan", "train-run", "train-calibrate"))


def test_a_bad_plan_file_is_one_typed_error_line(tmp_path):
    bad = tmp_path / "plan.json"
    bad.write_text(json.dumps({"schema_version": 1, "kind": "something else"}))
    result = _hetpart("train-run", str(bad), cwd=tmp_path)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("hetpart: error")]
    assert len(errors) == 1 and "SchemaError" in errors[0]
