"""The Python API: orchestration only (the work happens in tvm_passes, predictors and hetpart.partition).

Model lookup and import live below the API, in :mod:`tvm_passes.sources`; they are re-exported here for users.

    import hetpart
    graph = hetpart.analyze("resnet50")                       # zoo name, ONNX path or torch.nn.Module
    graph = hetpart.analyze("model.onnx", input_shapes={"input": (1, 3, 224, 224)})
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping, Sequence

from hetpart.errors import ModelLoadError
from hetpart.graph import OpGraph
from hetpart.threads import ensure_tvm_threads

log = logging.getLogger(__name__)

ModelArg = Any  # str | Path | torch.nn.Module


def import_model(model: ModelArg, **kwargs: Any):
    """Resolve ``model`` (zoo name, path, torch module) and import it into Relax; see
    :func:`tvm_passes.sources.import_model`."""
    ensure_tvm_threads()
    from tvm_passes.sources import import_model as _import

    return _import(model, **kwargs)


def analyze(model: ModelArg, *, input_shapes: Sequence[str] | Mapping[str, Sequence[int]] | None = None,
            example_inputs: Sequence[Any] | None = None, batch: int | None = None, size: int | None = None,
            level: str = "op", outputs: str | Sequence[str] | None = None) -> OpGraph:
    """Import ``model`` and extract its OpGraph (``level="kernel"`` collapses TVM's fused kernels).

    Zoo models are analysed with weights as graph inputs (``weights="inputs"``): the analysis needs only
    their shapes, so e.g. VGG-16's 550 MB of weights are never generated. ``outputs`` keeps an ONNX model up to
    those tensors (``tvm_passes.onnx_cut``).
    """
    from tvm_passes.extract import extract_op_graph

    if level not in ("op", "kernel"):
        raise ModelLoadError(f"level must be 'op' or 'kernel'; found {level!r}")
    imported = import_model(model, input_shapes=input_shapes, example_inputs=example_inputs, batch=batch,
                            size=size, weights="inputs", outputs=outputs)
    graph = extract_op_graph(imported.mod, name=imported.name, source_hash=imported.source_hash,
                             param_inputs=imported.param_inputs)
    return graph.kernel_graph() if level == "kernel" else graph


def compile(model: ModelArg, **kwargs: Any):
    """Compile ``model`` for a CPU+GPU machine; see :func:`hetpart.driver.compiler.compile` for the options."""
    ensure_tvm_threads()
    from hetpart.driver.compiler import compile as _compile

    return _compile(model, **kwargs)


def load(directory: str | Path, mode: str = "sequential", **task_options: Any):
    """Load a compiled model directory (``hetpart compile -o DIR``) as a callable: ``mode="sequential"`` (one VM)
    or ``mode="tasks"`` (one worker thread per device; see :func:`hetpart.driver.runtime.load`)."""
    ensure_tvm_threads()
    from hetpart.driver.runtime import load as _load

    return _load(directory, mode, **task_options)
