"""The core (hetpart.graph/devices/costs/plan/simulate/partition) must not import tvm, sklearn or torch."""
from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import hetpart.partition

CORE = ["hetpart", "hetpart.errors", "hetpart.graph", "hetpart.graph_elements", "hetpart.devices", "hetpart.costs",
        "hetpart.plan", "hetpart.simulate", "hetpart.threads"]
FORBIDDEN = ("tvm", "tvm_ffi", "sklearn", "torch", "tvm_passes", "predictors", "onnx", "onnxruntime")


def core_modules() -> list[str]:
    partition_dir = Path(hetpart.partition.__file__).parent
    return CORE + ["hetpart.partition"] + [f"hetpart.partition.{m.name}" for m in pkgutil.iter_modules([str(partition_dir)])]


def test_core_modules_import_no_frameworks():
    modules = core_modules()
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"core modules pulled in: {result.stdout.strip()}"
    assert len(modules) > len(CORE)  # the partition package really was scanned
