"""Where a model comes from: a zoo name built (once) into a cached ONNX file, an ONNX path, or a torch module.

Below the driver, so the profiler's model timing and the compile share one lookup: :func:`resolve_model_path` and
:func:`import_model` (which calls :func:`tvm_passes.frontend.import_model`). Built models and imported files go
under :func:`cache_dir` (``$HETPART_CACHE_DIR`` or ``~/.cache/hetpart``), never into the repository.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from hetpart.errors import ModelLoadError
from hetpart.paths import cache_root


def cache_dir() -> Path:
    """Where built models and intermediate files go (outside the repo): $HETPART_CACHE_DIR or ~/.cache/hetpart."""
    path = cache_root()
    path.mkdir(parents=True, exist_ok=True)
    return path


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


def import_model(model: Any, *, input_shapes: Sequence[str] | Mapping[str, Sequence[int]] | None = None,
                 example_inputs: Sequence[Any] | None = None, batch: int | None = None, size: int | None = None,
                 weights: str = "random", rnn_options: Any = None, outputs: str | Sequence[str] | None = None):
    """Resolve ``model`` (zoo name, path, torch module) and import it into Relax (tvm_passes.frontend);
    ``rnn_options``: how ONNX RNN nodes are unrolled (``tvm_passes.rnn.RnnImportOptions``); ``outputs``: tensor
    names of an ONNX model to keep it up to (``tvm_passes.onnx_cut``; the cut copy goes under :func:`cache_dir`)."""
    from tvm_passes.frontend import import_model as _import

    if isinstance(model, (str, Path)):
        path = resolve_model_path(model, batch=batch, size=size, weights=weights)
        name = str(model) if not Path(model).exists() else path.stem
        if outputs is not None:
            from tvm_passes.onnx_cut import cut_onnx_model

            path = cut_onnx_model(path, outputs, cache_dir() / "cut")
        return _import(path, input_shapes=input_shapes, name=name, work_dir=cache_dir() / "imported",
                       rnn_options=rnn_options)
    if outputs is not None:
        raise ModelLoadError("outputs cuts ONNX models; a torch module is cut by returning the tensors wanted "
                             "from its forward()")
    return _import(model, input_shapes=input_shapes, example_inputs=example_inputs)
