"""Suite-wide settings: TVM threads, a private cache dir, and the gpu marker's skip."""
from __future__ import annotations

import os
import shutil

import pytest

os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))
os.environ.setdefault("CUDA_PATH", "/usr/local/cuda")


def _cuda_available() -> bool:
    try:
        import tvm

        return bool(tvm.cuda(0).exist)
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if any("gpu" in item.keywords for item in items) and not _cuda_available():
        skip = pytest.mark.skip(reason="no CUDA device on this machine (GPU code is compiled, not run)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def nvcc_path() -> str:
    path = shutil.which("nvcc")
    if path is None:
        pytest.skip("nvcc is not installed")
    return path
