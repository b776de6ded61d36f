"""An ONNX file run by hetpart's import and CPU pipeline and by onnxruntime, for the converter tests."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import tvm
from tvm import relax

from tvm_passes.frontend import import_model
from tvm_passes.schedules import cpu_pipeline, default_cpu_target


def cpu_outputs(path: Path | str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """``path`` imported with the feeds' shapes, compiled by the CPU pipeline and run on ``feeds``."""
    imported = import_model(path, input_shapes={k: v.shape for k, v in feeds.items()})
    target = default_cpu_target()
    vm = relax.VirtualMachine(tvm.compile(imported.mod, target=target, relax_pipeline=cpu_pipeline(target)),
                              tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(feeds[p.name]) for p in imported.mod["main"].params])
    return [got.numpy()] if hasattr(got, "numpy") else [g.numpy() for g in got]


def onnxruntime_outputs(path: Path | str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


def assert_matches_onnxruntime(path: Path | str, feeds: dict[str, np.ndarray], rtol: float = 1e-4,
                               atol: float = 1e-5) -> list[np.ndarray]:
    """hetpart's outputs equal onnxruntime's (every output, same shapes); returns hetpart's."""
    got, expected = cpu_outputs(path, feeds), onnxruntime_outputs(path, feeds)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)
    return got
