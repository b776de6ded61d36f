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
