"""Load a script of benchmarks/ as a module (its folder is not a package)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` imported under the module name ``bench_<name>``."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module
