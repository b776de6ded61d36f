"""Helpers for tests that check a pass or an extraction does not keep a model's weights alive."""
from __future__ import annotations

import ctypes
import gc

import numpy as np


def rss_mb() -> float:
    """Resident memory of this process after collecting garbage and trimming glibc's heap (MB)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):      # not glibc
        pass
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 1e6


def big_weight_module():
    """conv2d (38 MB constant weight) -> reshape -> matmul (32 MB constant weight); fresh constants per call."""
    from tvm import relax

    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 1024, 4, 4], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            conv_weight = relax.const(rng.standard_normal((1024, 1024, 3, 3)).astype("float32"))
            y = bb.emit(relax.op.nn.conv2d(x, conv_weight, padding=1))
            y = bb.emit(relax.op.reshape(y, [8, 2048]))
            matmul_weight = relax.const(rng.standard_normal((2048, 4096)).astype("float32"))
            y = bb.emit_output(relax.op.matmul(y, matmul_weight))
        bb.emit_func_output(y)
    return bb.get()


def growth_mb(step, warmup: int = 2, repeats: int = 4) -> float:
    """How much resident memory ``repeats`` calls of ``step`` keep, after ``warmup`` calls."""
    for _ in range(warmup):
        step()
    before = rss_mb()
    for _ in range(repeats):
        step()
    return rss_mb() - before


def run_under_address_space_limit(module: str, function: str, limit_bytes: int, timeout_s: float) -> tuple[str, str]:
    """Run ``module.function()`` in a child Python under an address-space limit: (its stdout, why it failed or "").

    The limit turns a runaway compile into a failed child (MemoryError, std::bad_alloc) instead of an OOM kill of
    the shared host; the timeout ends one that grows slowly. The child runs from the repository root."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    code = ("import resource, sys\n"
            "limit = int(sys.argv[1])\n"
            "resource.setrlimit(resource.RLIMIT_AS, (limit, limit))\n"
            f"from {module} import {function}\n"
            f"{function}()\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    try:
        done = subprocess.run([sys.executable, "-c", code, str(limit_bytes)], cwd=root, env=env,
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as timeout:
        stdout = timeout.stdout.decode() if isinstance(timeout.stdout, bytes) else (timeout.stdout or "")
        return stdout, f"timed out after {timeout_s} s"
    failure = "" if done.returncode == 0 else (
        f"exited {done.returncode} under a {limit_bytes / 1e9:.0f} GB address-space limit:\n{done.stderr[-3000:]}")
    return done.stdout, failure
