"""ONNX files for the zoo models, built from the torch modules and cached outside the repository.

How the files are made (decided by experiment with torch 2.13): ``torch.onnx.export(..., dynamo=False)``, the
TorchScript exporter, because the default dynamo exporter needs ``onnxscript``, which is not installed. Inputs have
static shapes (no dynamic axes), so every Reshape gets a constant shape. Opset 17, IR version 10.

* CNNs are exported with ``do_constant_folding=False``: BatchNormalization stays a separate node after each Conv,
  as in real exported models (hetpart's importer folds it, via onnxslim). Initializer names are the torch
  ``state_dict`` names (``layer1.0.conv1.weight``).
* The language models and the encoder are exported with constant folding, so that the exporter's re-ordering of
  the LSTM/GRU gate weights (torch i,f,g,o -> ONNX i,o,f,c; torch r,z,n -> ONNX z,r,h) is folded into the
  ``W``/``R``/``B`` initializers of the ONNX ``LSTM``/``GRU`` nodes (one node per layer).

``weights="inputs"`` turns every floating-point initializer into a graph input named ``param:<initializer name>``
with the same fixed shape, and lists those names (JSON) in the model's ``metadata_props`` key
``hetpart.param_inputs``. The file is then a few hundred kB even for VGG-16 (whose weights are ~550 MB), which is
what analysis-only work needs; to run such a model, feed the parameters as inputs. ``weights="random"`` keeps them
as initializers holding the seeded random values of :func:`models.zoo.build_torch`.
"""
from __future__ import annotations

import io
import json
import logging
import os
import tempfile
import warnings
from pathlib import Path

import onnx

from hetpart.errors import ModelLoadError
from hetpart.paths import cache_root

from .zoo import build_torch, check_shape_args, get_info

logger = logging.getLogger(__name__)

BUILDER_VERSION = 2  # bump whenever the exported graphs change
OPSET = 17
IR_VERSION = 10
WEIGHT_MODES = ("random", "inputs")
PARAM_INPUT_PREFIX = "param:"
PARAM_INPUTS_KEY = "hetpart.param_inputs"
_FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                onnx.TensorProto.BFLOAT16)


def default_cache_dir() -> Path:
    """``$HETPART_CACHE_DIR/models`` when that variable is set, else ``~/.cache/hetpart/models``."""
    return cache_root() / "models"


def cache_key(name: str, batch: int, size: int, weights: str) -> str:
    """File stem identifying one build: model, batch, size, weight mode and builder version."""
    return f"{name}_b{batch}_s{size}_{weights}_v{BUILDER_VERSION}"


def build_onnx(name: str, batch: int = 1, size: int | None = None, cache_dir: str | os.PathLike | None = None,
               weights: str = "random") -> Path:
    """Path of the ONNX file of zoo model ``name`` at ``batch`` x ``size``, building it on a cache miss.

    The file lives in ``cache_dir`` (default :func:`default_cache_dir`) under :func:`cache_key`; it is written to
    a temporary file in the same directory and renamed into place, so a reader never sees a partial file and an
    existing file is always complete. Raises ModelLoadError for an unknown name, bad batch/size or weight mode.
    """
    info = get_info(name)
    size = check_shape_args(info, batch, size)
    if weights not in WEIGHT_MODES:
        raise ModelLoadError(f"weights must be one of {WEIGHT_MODES}, got {weights!r}")
    directory = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = directory / f"{cache_key(name, batch, size, weights)}.onnx"
    if path.is_file():
        logger.debug("zoo cache hit: %s", path)
        return path
    logger.info("building %s (batch %d, size %d, weights %s) -> %s", name, batch, size, weights, path)
    model = export_model(name, batch, size, weights)
    directory.mkdir(parents=True, exist_ok=True)
    _atomic_save(model, path)
    return path


def export_model(name: str, batch: int, size: int, weights: str = "random") -> onnx.ModelProto:
    """Export zoo model ``name`` to an in-memory ONNX model (opset 17, IR 10) with the given weight mode."""
    import torch  # only needed on a cache miss

    info = get_info(name)
    module, inputs = build_torch(name, batch, size)
    fold = info.kind != "cnn"
    # Unfolded graphs with weights as inputs need no weight values at all: skip serialising them.
    export_params = fold or weights == "random"
    buffer = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # legacy-exporter deprecation notice, tracer notes on static shapes
        torch.onnx.export(module, inputs, buffer, dynamo=False, opset_version=OPSET, export_params=export_params,
                          input_names=[info.input_name], output_names=[info.output_name],
                          do_constant_folding=fold, training=torch.onnx.TrainingMode.EVAL)
    del module
    model = onnx.load_from_string(buffer.getvalue())
    del buffer
    model.ir_version = IR_VERSION
    params = _params_to_prefixed_inputs(model, info.input_name) if weights == "inputs" else []
    _set_metadata(model, {"hetpart.model": name, "hetpart.batch": str(batch), "hetpart.size": str(size),
                          "hetpart.weights": weights, "hetpart.builder_version": str(BUILDER_VERSION),
                          PARAM_INPUTS_KEY: json.dumps(params)})
    onnx.checker.check_model(model)
    return model


def param_input_names(model: onnx.ModelProto) -> list[str]:
    """The graph inputs that hold parameters (from ``hetpart.param_inputs``); empty for weights="random"."""
    for prop in model.metadata_props:
        if prop.key == PARAM_INPUTS_KEY:
            return list(json.loads(prop.value))
    return []


def _params_to_prefixed_inputs(model: onnx.ModelProto, data_input: str) -> list[str]:
    """Make every parameter a fixed-shape graph input named ``param:<name>``; return those names in order.

    Parameters are the floating-point initializers, and the graph inputs other than ``data_input`` (which the
    exporter creates for the weights when ``export_params=False``).
    """
    graph = model.graph
    renamed: dict[str, str] = {}
    for graph_input in graph.input:
        if graph_input.name != data_input:
            renamed[graph_input.name] = graph_input.name = PARAM_INPUT_PREFIX + graph_input.name
    kept = []
    for init in graph.initializer:
        if init.data_type not in _FLOAT_TYPES:
            kept.append(init)
            continue
        renamed[init.name] = PARAM_INPUT_PREFIX + init.name
        graph.input.append(onnx.helper.make_tensor_value_info(renamed[init.name], init.data_type, list(init.dims)))
    del graph.initializer[:]
    graph.initializer.extend(kept)
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in renamed:
                node.input[i] = renamed[name]
    assert not any(out.name in renamed for out in graph.output), "a parameter is also a graph output"
    return [graph_input.name for graph_input in graph.input if graph_input.name != data_input]


def _set_metadata(model: onnx.ModelProto, values: dict[str, str]) -> None:
    for key, value in values.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value


def _atomic_save(model: onnx.ModelProto, path: Path) -> None:
    """Write ``model`` to a temporary file next to ``path`` and rename it into place; clean up on failure."""
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        onnx.save_model(model, tmp_name)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
