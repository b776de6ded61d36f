"""Tests of the model zoo: architectures vs published figures, ONNX vs torch numerics, weight modes, caching."""
from __future__ import annotations

import collections
import dataclasses
import importlib
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

import models
from hetpart.errors import ModelLoadError
from models import ZOO, build_onnx, build_torch, list_models, param_input_names
from models import export as zoo_export

NEW_MODELS = ["conv1d_audio", "crnn_ocr", "yolo_detector", "gru_audio", "lstm_speaker"]
EXPECTED_NAMES = ["resnet18", "resnet50", "vgg16", "mobilenetv2", "squeezenet1_1", "densenet121", "googlenet",
                  "lstm_lm", "gru_lm", "bert_small"] + NEW_MODELS
# torchvision's published parameter counts (sum of parameter numels, no buffers; GoogLeNet without aux heads)
TORCHVISION_PARAMS = {"resnet18": 11_689_512, "resnet50": 25_557_032, "vgg16": 138_357_544,
                      "mobilenetv2": 3_504_872, "squeezenet1_1": 1_235_496, "densenet121": 7_978_856,
                      "googlenet": 6_624_904}
CNNS = list(TORCHVISION_PARAMS)  # the ImageNet classifiers
# the figures the project issue quotes (GMACs at 224x224, batch 1)
ISSUE_GMACS = {"resnet50": 4.1, "resnet18": 1.8, "vgg16": 15.5, "mobilenetv2": 0.30, "densenet121": 2.9}
# small shapes for the numerics tests: (batch, size), by kind and for the models added beyond the first ten
NUMERICS_SHAPES = {"cnn": (2, 64), "rnn": (2, 6), "transformer": (2, 16), "conv1d_audio": (2, 1024),
                   "crnn_ocr": (2, 32), "yolo_detector": (2, 64), "gru_audio": (2, 8), "lstm_speaker": (2, 8)}
BERT_OPS = {"Gather", "Add", "MatMul", "LayerNormalization", "Softmax", "Reshape", "Transpose", "Div", "Mul", "Erf",
            "Constant"}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory):
    return tmp_path_factory.mktemp("zoo_cache")


def count_macs(module: nn.Module, example: torch.Tensor) -> int:
    """Multiply-accumulates of Conv2d, Linear and LSTM/GRU layers in one forward pass, counted with forward hooks
    (a recurrent layer: gates x (input + hidden) per step, direction and layer; biases not counted)."""
    total = 0

    def hook(layer: nn.Module, inputs, output: torch.Tensor) -> None:
        nonlocal total
        if isinstance(layer, nn.Conv2d):
            kh, kw = layer.kernel_size
            total += output.numel() * (layer.in_channels // layer.groups) * kh * kw
        elif isinstance(layer, nn.Linear):
            total += output.numel() * layer.in_features
        elif isinstance(layer, (nn.LSTM, nn.GRU)):
            gates = 4 if isinstance(layer, nn.LSTM) else 3
            rows = inputs[0].shape[0] * inputs[0].shape[1]   # steps x batch
            directions = 2 if layer.bidirectional else 1
            for index in range(layer.num_layers):
                width = layer.input_size if index == 0 else directions * layer.hidden_size
                total += rows * directions * gates * layer.hidden_size * (width + layer.hidden_size)

    handles = [layer.register_forward_hook(hook) for layer in module.modules()]
    try:
        with torch.no_grad():
            module(example)
    finally:
        for handle in handles:
            handle.remove()
    return total


def run_onnx(path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def assert_close(actual: np.ndarray, expected: np.ndarray) -> None:
    """Max abs error <= 1e-4, relative to the output's magnitude when that exceeds 1."""
    assert actual.shape == expected.shape
    scale = max(1.0, float(np.abs(expected).max()))
    error = float(np.abs(actual - expected).max())
    assert error <= 1e-4 * scale, f"max abs error {error:.3g} > 1e-4 x {scale:.3g}"


def test_zoo_lists_the_agreed_models():
    assert list_models() == EXPECTED_NAMES
    families = {name: info.family for name, info in ZOO.items()}
    assert families["lstm_lm"] == "lstm" and families["gru_lm"] == "gru" and families["bert_small"] == "bert"
    assert {info.kind for info in ZOO.values()} == {"cnn", "rnn", "crnn", "transformer"}
    assert ZOO["resnet50"].default_input_shape == (1, 3, 224, 224)
    assert ZOO["lstm_lm"].default_input_shape == (35, 1)
    assert ZOO["bert_small"].default_input_shape == (1, 128)
    assert ZOO["gru_lm"].default_input_shapes == {"tokens": (35, 1)}
    assert ZOO["resnet18"].input_shapes(4, 96) == {"input": (4, 3, 96, 96)}
    for name in CNNS:
        assert ZOO[name].published_gmacs is not None and "torchvision" in ZOO[name].citation


def test_input_layouts_of_every_model():
    """The first ten models keep the shapes their kind gave them; the others place batch and size by layout."""
    shapes = {name: info.input_shape(3, 64 if info.size_multiple > 1 else 1024) for name, info in ZOO.items()}
    assert all(shapes[name] == (3, 3, 1024, 1024) for name in CNNS)
    assert shapes["lstm_lm"] == shapes["gru_lm"] == (1024, 3) and shapes["bert_small"] == (3, 1024)
    assert shapes["conv1d_audio"] == (3, 1, 1024, 1) and shapes["crnn_ocr"] == (3, 1, 32, 1024)
    assert shapes["yolo_detector"] == (3, 3, 64, 64) and shapes["gru_audio"] == (3, 1, 1024, 161)
    assert shapes["lstm_speaker"] == (1024, 3, 40)
    assert {name for name, info in ZOO.items() if info.batch_axis != 0} == {"lstm_lm", "gru_lm", "lstm_speaker"}
    assert all((info.batch_axis == 1) == (info.kind == "rnn") for info in ZOO.values())
    assert {info.size_meaning for name, info in ZOO.items() if name not in NEW_MODELS} == {
        "image side", "sequence length"}
    assert ZOO["crnn_ocr"].size_meaning == "image width" and ZOO["yolo_detector"].size_meaning == "image side"
    for name in NEW_MODELS:
        assert ZOO[name].published_params is None and ZOO[name].published_gmacs is None
        assert ZOO[name].citation and ZOO[name].input_dtype == "float32" and ZOO[name].vocab_size is None


@pytest.mark.parametrize("changes, fragment", [
    ({"kind": "gnn"}, "kind must be one of"),
    ({"kind": "crnn"}, "no default input layout"),
    ({"input_layout": ("size", 3)}, "input_layout must hold"),
    ({"input_layout": ("batch", "batch", "size")}, "input_layout must hold"),
    ({"input_layout": ("batch", 0, "size")}, "input_layout must hold"),
    ({"input_layout": ("batch", 3)}, "input_layout must hold"),
    ({"size_multiple": 3}, "multiples of size_multiple"),
    ({"size_multiple": 0}, "multiples of size_multiple"),
])
def test_model_info_rejects_bad_layouts(changes, fragment):
    fields = dataclasses.asdict(ZOO["resnet18"]) | changes
    with pytest.raises(ModelLoadError, match=fragment):
        models.ModelInfo(**fields)


@pytest.mark.parametrize("call", [lambda: build_torch("resnet51"), lambda: build_onnx("resnet51")])
def test_unknown_model_name_lists_known_names(call):
    with pytest.raises(ModelLoadError) as excinfo:
        call()
    message = str(excinfo.value)
    assert "resnet51" in message and all(name in message for name in EXPECTED_NAMES)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"name": "resnet18", "size": 16}, "image side"),
    ({"name": "bert_small", "size": 513}, "sequence length"),
    ({"name": "yolo_detector", "size": 100}, "image side must be an int in \\[64, inf\\] and a multiple of 32"),
    ({"name": "conv1d_audio", "size": 512}, "number of audio samples"),
    ({"name": "crnn_ocr", "size": 4}, "image width"),
    ({"name": "resnet18", "batch": 0}, "batch"),
    ({"name": "resnet18", "weights": "lazy"}, "weights"),
])
def test_bad_arguments_raise_model_load_error(kwargs, fragment, tmp_path):
    with pytest.raises(ModelLoadError, match=fragment):
        build_onnx(cache_dir=tmp_path, **kwargs)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", CNNS)
def test_cnn_parameter_count_matches_torchvision(name):
    module, _ = build_torch(name, size=32)
    assert sum(p.numel() for p in module.parameters()) == TORCHVISION_PARAMS[name] == ZOO[name].published_params


@pytest.mark.parametrize("name, cell_gates", [("lstm_lm", 4), ("gru_lm", 3)])
def test_rnn_language_model_parameter_count(name, cell_gates):
    vocab, hidden = 10_000, 650
    rnn = 2 * (cell_gates * hidden * (hidden + hidden) + 2 * cell_gates * hidden)
    expected = vocab * hidden + rnn + hidden * vocab + vocab
    module, _ = build_torch(name)
    assert sum(p.numel() for p in module.parameters()) == expected


def test_speaker_encoder_parameter_count():
    hidden, mels, layers = 256, 40, 3
    lstm = 4 * hidden * (mels + hidden) + (layers - 1) * 4 * hidden * 2 * hidden + layers * 2 * 4 * hidden
    module, _ = build_torch("lstm_speaker", size=4)
    assert sum(p.numel() for p in module.parameters()) == lstm + hidden * hidden + hidden


# output shape, parameters and multiply-accumulates (conv, linear, LSTM/GRU gates) at batch 1 and the default size:
# the figures the module docstrings state
NEW_MODEL_FIGURES = {
    "conv1d_audio": ((1, 1, 360), 2_284_104, 545_443_840),
    "crnn_ocr": ((1, 33, 37), 8_723_749, 910_526_976),
    "yolo_detector": ((1, 3549, 85), 912_159, 522_553_408),
    "gru_audio": ((1, 100, 161), 1_656_017, 241_294_400),
    "lstm_speaker": ((1, 256), 1_423_616, 216_334_336),
}


@pytest.mark.parametrize("name", NEW_MODELS)
def test_new_model_figures_match_their_docstrings(name):
    info = ZOO[name]
    shape, params, macs = NEW_MODEL_FIGURES[name]
    module = info.construct().eval()  # on the CPU: the meta device runs an LSTM step by step, 10x slower
    example = torch.zeros(info.default_input_shape)
    assert count_macs(module, example) == macs
    with torch.no_grad():
        assert tuple(module(example).shape) == shape
    assert sum(p.numel() for p in module.parameters()) == params
    doc = importlib.import_module(f"models.{info.constructor.split(':')[0]}").__doc__
    assert f"{params:,} parameters" in doc and f"{macs / 1e9:.4f} GMACs" in doc


def test_yolo_detector_matches_the_published_yolox_nano_figures():
    """YOLOX README: 0.91M parameters, 1.08 GFLOPs = 2 x thop's count (MACs + 2 per BatchNorm output element + 1
    per conv-bias output element) at 416 x 416."""
    counts = collections.Counter()

    def hook(layer: nn.Module, _inputs, output: torch.Tensor) -> None:
        if isinstance(layer, nn.BatchNorm2d):
            counts["batch_norm"] += output.numel()
        elif isinstance(layer, nn.Conv2d):
            counts["macs"] += output.numel() * layer.in_channels // layer.groups * math.prod(layer.kernel_size)
            counts["bias"] += output.numel() if layer.bias is not None else 0

    with torch.device("meta"):
        module = ZOO["yolo_detector"].construct().eval()
        for layer in module.modules():
            layer.register_forward_hook(hook)
        with torch.no_grad():
            module(torch.empty(1, 3, 416, 416))
    assert round(sum(p.numel() for p in module.parameters()) / 1e6, 2) == 0.91
    assert round(2 * (counts["macs"] + 2 * counts["batch_norm"] + counts["bias"]) / 1e9, 2) == 1.08


# output shapes at the NUMERICS_SHAPES sizes (plus a conv1d_audio input of 9 x 128 samples: two windows)
NEW_MODEL_OUTPUTS = {"conv1d_audio": (2, 1, 360), "crnn_ocr": (2, 9, 37), "yolo_detector": (2, 84, 85),
                     "gru_audio": (2, 8, 161), "lstm_speaker": (2, 256)}


@pytest.mark.parametrize("name", NEW_MODELS)
def test_new_models_are_deterministic_and_shape_their_outputs(name):
    batch, size = NUMERICS_SHAPES[name]
    first, (x1,) = build_torch(name, batch=batch, size=size)
    second, (x2,) = build_torch(name, batch=batch, size=size)
    assert tuple(x1.shape) == ZOO[name].input_shape(batch, size) and torch.equal(x1, x2)
    for (key, a), b in zip(first.state_dict().items(), second.state_dict().values()):
        assert torch.equal(a, b), key
    assert not first.training
    with torch.no_grad():
        y1, y2 = first(x1), second(x2)
    assert tuple(y1.shape) == NEW_MODEL_OUTPUTS[name] and torch.equal(y1, y2) and bool(torch.isfinite(y1).all())
    if name == "lstm_speaker":  # L2-normalised embeddings
        assert torch.allclose(y1.norm(dim=1), torch.ones(batch), atol=1e-4)
    elif name == "yolo_detector":  # columns 4: are sigmoid scores
        assert bool(((y1[..., 4:] > 0) & (y1[..., 4:] < 1)).all())
    elif name != "crnn_ocr":  # pitch activations and suppression gains are sigmoids
        assert bool(((y1 > 0) & (y1 < 1)).all())
    if name == "conv1d_audio":  # a longer input: one 360-bin vector per 1024-sample window hopped by 128
        with torch.no_grad():
            assert first(torch.randn(1, 1, 9 * 128, 1)).shape == (1, 2, 360)


@pytest.mark.parametrize("name", CNNS)
def test_cnn_macs_at_224_match_published(name):
    info = ZOO[name]
    with torch.device("meta"):  # shapes only: no weights, no arithmetic
        module = info.construct().eval()
        macs = count_macs(module, torch.empty(1, 3, 224, 224))
    assert macs / 1e9 == pytest.approx(info.published_gmacs, rel=0.03)
    if name in ISSUE_GMACS:
        assert macs / 1e9 == pytest.approx(ISSUE_GMACS[name], rel=0.03)


def test_build_torch_is_deterministic_and_parameterised():
    first, (x1,) = build_torch("squeezenet1_1", batch=3, size=48)
    second, (x2,) = build_torch("squeezenet1_1", batch=3, size=48)
    assert x1.shape == (3, 3, 48, 48) and torch.equal(x1, x2)
    for (key, a), b in zip(first.state_dict().items(), second.state_dict().values()):
        assert torch.equal(a, b), key
    assert not first.training
    with torch.no_grad():
        assert first(x1).shape == (3, 1000)
    _, (tokens,) = build_torch("lstm_lm", batch=4, size=7)
    assert tokens.shape == (7, 4) and tokens.dtype == torch.int64 and int(tokens.max()) < 10_000
    _, (ids,) = build_torch("bert_small", batch=2, size=9)
    assert ids.shape == (2, 9)


@pytest.mark.parametrize("name", [name for name in EXPECTED_NAMES if name != "vgg16"])
def test_onnx_matches_torch(name, cache_dir):
    info = ZOO[name]
    batch, size = NUMERICS_SHAPES[name if name in NUMERICS_SHAPES else info.kind]
    path = build_onnx(name, batch=batch, size=size, cache_dir=cache_dir)
    model = onnx.load(str(path))
    assert model.ir_version == 10
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    assert [i.name for i in model.graph.input] == [info.input_name]
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert tuple(dims) == info.input_shape(batch, size)
    assert param_input_names(model) == []

    module, (example,) = build_torch(name, batch=batch, size=size)
    with torch.no_grad():
        expected = module(example).numpy()
    assert_close(run_onnx(path, {info.input_name: example.numpy()}), expected)

    ops = collections.Counter(node.op_type for node in model.graph.node)
    assert ops["Loop"] == ops["Scan"] == ops["If"] == 0
    if info.kind == "cnn":
        batch_norms = sum(isinstance(m, nn.BatchNorm2d) for m in module.modules())
        assert ops["BatchNormalization"] == batch_norms
        assert ops["Conv"] == sum(isinstance(m, nn.Conv2d) for m in module.modules())
    elif name in NEW_MODELS:  # constant folding: BatchNorm folded into the convs, one ONNX node per RNN layer
        assert ops["BatchNormalization"] == 0
        assert ops["Conv"] == sum(isinstance(m, nn.Conv2d) for m in module.modules())
        (rnn,) = [m for m in module.modules() if isinstance(m, (nn.LSTM, nn.GRU))]
        cell = type(rnn).__name__
        assert ops[cell] == rnn.num_layers
        for node in (n for n in model.graph.node if n.op_type == cell):
            attrs = {a.name: a for a in node.attribute}
            assert attrs["hidden_size"].i == 256
            direction = attrs["direction"].s if "direction" in attrs else b"forward"
            assert direction == (b"bidirectional" if rnn.bidirectional else b"forward")
    elif info.kind == "rnn":
        cell = info.family.upper()
        assert ops[cell] == 2 and ops["Gather"] >= 1 and ops["Loop"] == ops["Scan"] == 0
        for node in (n for n in model.graph.node if n.op_type == cell):
            assert {a.name: a.i for a in node.attribute}["hidden_size"] == 650
    else:
        assert set(ops) <= BERT_OPS and ops["LayerNormalization"] == 9 and ops["Erf"] == 4


def test_rnn_onnx_handles_the_ptb_sequence_length(cache_dir):
    path = build_onnx("gru_lm", batch=1, size=None, cache_dir=cache_dir)
    module, (tokens,) = build_torch("gru_lm")
    assert tokens.shape == (35, 1)
    with torch.no_grad():
        expected = module(tokens).numpy()
    assert_close(run_onnx(path, {"tokens": tokens.numpy()}), expected)


@pytest.mark.parametrize("name, batch, size", [("bert_small", 2, 16), ("lstm_lm", 2, 6), ("resnet18", 2, 64),
                                               ("gru_audio", 2, 8)])
def test_weights_as_inputs_compute_the_same_model(name, batch, size, cache_dir):
    random_path = build_onnx(name, batch=batch, size=size, cache_dir=cache_dir)
    inputs_path = build_onnx(name, batch=batch, size=size, cache_dir=cache_dir, weights="inputs")
    assert inputs_path != random_path
    random_model, inputs_model = onnx.load(str(random_path)), onnx.load(str(inputs_path))
    params = param_input_names(inputs_model)
    graph_inputs = [i.name for i in inputs_model.graph.input]
    assert graph_inputs == [ZOO[name].input_name] + params
    assert params and all(p.startswith("param:") for p in params)
    assert not any(init.data_type == onnx.TensorProto.FLOAT for init in inputs_model.graph.initializer)
    assert inputs_path.stat().st_size < random_path.stat().st_size / 20

    weights = {init.name: onnx.numpy_helper.to_array(init) for init in random_model.graph.initializer}
    _, (example,) = build_torch(name, batch=batch, size=size)
    data = {ZOO[name].input_name: example.numpy()}
    feeds = data | {p: weights[p.removeprefix("param:")] for p in params}
    # onnxruntime fuses differently when weights are constants (e.g. Conv+BN), so not bit-identical
    assert_close(run_onnx(inputs_path, feeds), run_onnx(random_path, data))


def test_vgg16_with_weights_as_inputs_is_small_and_matches_torch(cache_dir):
    path = build_onnx("vgg16", batch=1, size=32, cache_dir=cache_dir, weights="inputs")
    assert path.stat().st_size < 1_000_000  # the weights themselves are ~553 MB
    model = onnx.load(str(path))
    module, (example,) = build_torch("vgg16", batch=1, size=32)
    state = module.state_dict()
    params = param_input_names(model)
    assert sorted(params) == sorted("param:" + key for key in state)
    feeds = {"input": example.numpy()}
    feeds.update({p: state[p.removeprefix("param:")].numpy() for p in params})
    with torch.no_grad():
        expected = module(example).numpy()
    assert_close(run_onnx(path, feeds), expected)


@pytest.mark.slow
def test_vgg16_random_weights_at_224_match_torch(tmp_path):
    path = build_onnx("vgg16", batch=1, size=224, cache_dir=tmp_path)
    module, (example,) = build_torch("vgg16", batch=1, size=224)
    with torch.no_grad():
        expected = module(example).numpy()
    assert_close(run_onnx(path, {"input": example.numpy()}), expected)


def test_second_build_is_a_cache_hit(tmp_path, monkeypatch):
    path = build_onnx("squeezenet1_1", batch=1, size=32, cache_dir=tmp_path)
    assert path.parent == tmp_path and path.name == models.cache_key("squeezenet1_1", 1, 32, "random") + ".onnx"
    stamp = path.stat().st_mtime_ns

    def no_export(*args, **kwargs):
        raise AssertionError("export ran on a cache hit")

    monkeypatch.setattr(zoo_export, "export_model", no_export)
    assert build_onnx("squeezenet1_1", batch=1, size=32, cache_dir=tmp_path) == path
    assert path.stat().st_mtime_ns == stamp
    with pytest.raises(AssertionError, match="cache hit"):  # another batch is another file
        build_onnx("squeezenet1_1", batch=2, size=32, cache_dir=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_cache_dir_defaults_to_env_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("HETPART_CACHE_DIR", str(tmp_path))
    assert models.default_cache_dir() == tmp_path / "models"
    path = build_onnx("squeezenet1_1", batch=1, size=32, weights="inputs")
    assert path.parent == tmp_path / "models" and path.is_file()
    monkeypatch.delenv("HETPART_CACHE_DIR")
    assert models.default_cache_dir() == Path.home() / ".cache" / "hetpart" / "models"


def test_failed_write_leaves_no_file(tmp_path, monkeypatch):
    real_save = onnx.save_model

    def save_then_crash(model, target, *args, **kwargs):
        real_save(model, target, *args, **kwargs)
        with open(target, "r+b") as handle:
            handle.truncate(100)
        raise OSError("disk full")

    monkeypatch.setattr(onnx, "save_model", save_then_crash)
    with pytest.raises(OSError, match="disk full"):
        build_onnx("squeezenet1_1", batch=1, size=32, cache_dir=tmp_path, weights="inputs")
    assert os.listdir(tmp_path) == []
    monkeypatch.setattr(onnx, "save_model", real_save)
    path = build_onnx("squeezenet1_1", batch=1, size=32, cache_dir=tmp_path, weights="inputs")
    assert os.listdir(tmp_path) == [path.name]
    onnx.checker.check_model(onnx.load(str(path)))


def test_onnx_batch_and_size_parameterisation(cache_dir):
    path = build_onnx("squeezenet1_1", batch=3, size=48, cache_dir=cache_dir, weights="inputs")
    model = onnx.load(str(path))
    shape = lambda value: tuple(d.dim_value for d in value.type.tensor_type.shape.dim)  # noqa: E731
    assert shape(model.graph.input[0]) == (3, 3, 48, 48)
    assert shape(model.graph.output[0]) == (3, 1000)
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["hetpart.model"] == "squeezenet1_1" and meta["hetpart.batch"] == "3" and meta["hetpart.size"] == "48"
    tokens = onnx.load(str(build_onnx("lstm_lm", batch=3, size=5, cache_dir=cache_dir, weights="inputs")))
    assert shape(tokens.graph.input[0]) == (5, 3) and shape(tokens.graph.output[0]) == (5, 3, 10_000)


def test_metadata_and_cache_hits_do_not_import_torch(tmp_path):
    path = build_onnx("squeezenet1_1", batch=1, size=32, cache_dir=tmp_path, weights="inputs")
    script = (
        "import sys, models\n"
        "assert len(models.list_models()) == 15 and models.ZOO['vgg16'].default_input_shape == (1, 3, 224, 224)\n"
        f"path = models.build_onnx('squeezenet1_1', batch=1, size=32, cache_dir={str(tmp_path)!r}, weights='inputs')\n"
        f"assert str(path) == {str(path)!r}, path\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=Path(models.__file__).parent.parent,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
