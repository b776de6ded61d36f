"""The core (hetpart.graph/devices/costs/plan/simulate/partition) must not import tvm, sklearn or torch."""
from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import hetpart.partition

CORE = ["hetpart", "hetpart.errors", "hetpart.graph", "hetpart.graph_elements", "hetpart.devices", "hetpart.costs",
        "hetpart.plan", "hetpart.simulate", "hetpart.threads", "hetpart.segments", "hetpart.simulate_requests",
        "hetpart.request_program", "hetpart.request_timeline", "hetpart.cross_sharing"]
FORBIDDEN = ("tvm", "tvm_ffi", "sklearn", "torch", "tvm_passes", "predictors", "onnx", "onnxruntime")


def core_modules() -> list[str]:
    partition_dir = Path(hetpart.partition.__file__).parent
    return CORE + ["hetpart.partition"] + [f"hetpart.partition.{m.name}"
                                           for m in pkgutil.iter_modules([str(partition_dir)])]


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


def test_a_compiles_cost_path_imports_no_profiler():
    """What a compile prices kernels with (the predictor registry, the host calibration, cost tables) imports neither
    the profiler nor the fitting code, nor the compiler: the host calibration's sweep is injected by the driver."""
    cost_path = ["predictors.registry", "predictors.costs", "predictors.host_calibration",
                 "predictors.device_predictor", "predictors.analytic", "predictors.versions"]
    code = (
        "import importlib, sys\n"
        f"for m in {cost_path!r}: importlib.import_module(m)\n"
        "bad = sorted(m for m in sys.modules if m.startswith(('predictors.profiling', 'predictors.fitting')) "
        "or m in ('hetpart.driver.api', 'hetpart.driver.compiler'))\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"the cost path pulled in: {result.stdout.strip()}"


def test_import_linter_contracts_hold():
    """Layers and interfaces (pyproject.toml [tool.importlinter]); imports inside functions count too."""
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command; "
                             "lint_imports_command()"], capture_output=True, text=True, timeout=300, cwd=root)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_no_import_cycles():
    """No two modules of hetpart's packages import each other, directly or through others (any import statement,
    including those inside functions and under TYPE_CHECKING)."""
    import grimp
    import networkx as nx

    graph = grimp.build_graph("hetpart", "tvm_passes", "predictors", "models")
    imports = nx.DiGraph()
    for module in graph.modules:
        imports.add_node(module)
        imports.add_edges_from((module, imported) for imported in graph.find_modules_directly_imported_by(module))
    cycles = [sorted(c) for c in nx.strongly_connected_components(imports) if len(c) > 1]
    assert len(imports) > 100
    assert not cycles, f"import cycles: {cycles}"
