"""hetpart.training imports no framework (the import-linter contract checks the same statically)."""
from __future__ import annotations

import subprocess
import sys

MODULES = ["antichain_dp", "baselines", "brute_force", "cluster", "common", "cost_model", "dp_core", "gropipe",
           "hetero", "pipedream_dp", "schedule_search", "schedules", "stage_plan"]
FORBIDDEN = ["torch", "tvm", "tvm_ffi", "sklearn", "onnx", "onnxruntime", "matplotlib", "hetpart.driver",
             "tvm_passes", "predictors"]


def test_training_package_imports_no_framework():
    code = ("import sys\n" + "".join(f"import hetpart.training.{m}\n" for m in MODULES)
            + f"bad = [m for m in {FORBIDDEN!r} if m in sys.modules]\nassert not bad, bad\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
