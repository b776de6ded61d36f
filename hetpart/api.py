"""The Python API: orchestration only (the work happens in tvm_passes, predictors and hetpart.partition).

    import hetpart
    graph = hetpart.analyze("resnet50")                       # zoo name, ONNX path or torch.nn.Module
    graph = hetpart.analyze("model.onnx", input_shapes={"input": (1, 3, 224, 224)})
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from hetpart.errors import ModelLoadError
from hetpart.graph import OpGraph
from hetpart.paths import cache_root
from hetpart.threads import ensure_tvm_threads

log = logging.getLogger(__name__)

ModelArg = Any  # str | Path | torch.nn.Module


def cache_dir() -> Path:
    """Where built models and intermediate files go (outside the repo): $HETPART_CACHE_DIR or ~/.cache/hetpart."""
    path = cache_root()
    path.mkdir(parents=True, exist_ok=True)
    return path


def tuning_database_dir() -> Path:
    """The persistent MetaSchedule database `hetpart tune` writes and compiles read."""
    return cache_dir() / "tuning"


def resolve_model_path(model: str | Path, *, batch: int | None = None, size: int | None = None,
                       weights: str = "random") -> Path:
    """An existing file path as is; a zoo name (``resnet50``) built (and cached) as an ONNX file."""
    for what, value in (("batch", batch), ("size", size)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ModelLoadError(f"{what} must be a positive integer; found {value!r}")
    path = Path(model)
    if path.exists() or path.suffix.lower() == ".onnx" or os.sep in str(model):
        return path
    import models

    if str(model) not in models.ZOO:
        raise ModelLoadError(f"{model!r} is neither a file nor a zoo model; zoo models: "
                             f"{', '.join(sorted(models.ZOO))}")
    return models.build_onnx(str(model), batch=batch or 1, size=size, weights=weights)


def import_model(model: ModelArg, *, input_shapes: Sequence[str] | Mapping[str, Sequence[int]] | None = None,
                 example_inputs: Sequence[Any] | None = None, batch: int | None = None, size: int | None = None,
                 weights: str = "random"):
    """Resolve ``model`` (zoo name, path, torch module) and import it into Relax (tvm_passes.frontend)."""
    ensure_tvm_threads()
    from tvm_passes.frontend import import_model as _import

    if isinstance(model, (str, Path)):
        path = resolve_model_path(model, batch=batch, size=size, weights=weights)
        name = str(model) if not Path(model).exists() else path.stem
        return _import(path, input_shapes=input_shapes, name=name, work_dir=cache_dir() / "imported")
    return _import(model, input_shapes=input_shapes, example_inputs=example_inputs)


def analyze(model: ModelArg, *, input_shapes: Sequence[str] | Mapping[str, Sequence[int]] | None = None,
            example_inputs: Sequence[Any] | None = None, batch: int | None = None, size: int | None = None,
            level: str = "op") -> OpGraph:
    """Import ``model`` and extract its OpGraph (``level="kernel"`` collapses TVM's fused kernels).

    Zoo models are analysed with weights as graph inputs (``weights="inputs"``): the analysis needs only
    their shapes, so e.g. VGG-16's 550 MB of weights are never generated.
    """
    from tvm_passes.extract import extract_op_graph

    if level not in ("op", "kernel"):
        raise ModelLoadError(f"level must be 'op' or 'kernel'; found {level!r}")
    imported = import_model(model, input_shapes=input_shapes, example_inputs=example_inputs, batch=batch,
                            size=size, weights="inputs")
    graph = extract_op_graph(imported.mod, name=imported.name, source_hash=imported.source_hash,
                             param_inputs=imported.param_inputs)
    return graph.kernel_graph() if level == "kernel" else graph


def compile(model: ModelArg, **kwargs: Any):
    """Compile ``model`` for a CPU+GPU machine; see :func:`hetpart.compiler.compile` for the options."""
    ensure_tvm_threads()
    from hetpart.compiler import compile as _compile

    return _compile(model, **kwargs)


def load(directory: str | Path):
    """Load a compiled model directory (``hetpart compile -o DIR``) as a callable."""
    ensure_tvm_threads()
    from hetpart.runtime import load as _load

    return _load(directory)
