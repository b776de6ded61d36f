"""Tests of the model zoo: architectures vs published figures, ONNX vs torch numerics, weight modes, caching."""
from __future__ import annotations

import collections
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

CNNS = [name for name, info in ZOO.items() if info.kind == "cnn"]
EXPECTED_NAMES = ["resnet18", "resnet50", "vgg16", "mobilenetv2", "squeezenet1_1", "densenet121", "googlenet",
                  "lstm_lm", "gru_lm", "bert_small"]
# torchvision's published parameter counts (sum of parameter numels, no buffers; GoogLeNet without aux heads)
TORCHVISION_PARAMS = {"resnet18": 11_689_512, "resnet50": 25_557_032, "vgg16": 138_357_544,
                      "mobilenetv2": 3_504_872, "squeezenet1_1": 1_235_496, "densenet121": 7_978_856,
                      "googlenet": 6_624_904}
# the figures the project issue quotes (GMACs at 224x224, batch 1)
ISSUE_GMACS = {"resnet50": 4.1, "resnet18": 1.8, "vgg16": 15.5, "mobilenetv2": 0.30, "densenet121": 2.9}
# small shapes for the numerics tests: (batch, size)
NUMERICS_SHAPES = {"cnn": (2, 64), "rnn": (2, 6), "transformer": (2, 16)}
BERT_OPS = {"Gather", "Add", "MatMul", "LayerNormalization", "Softmax", "Reshape", "Transpose", "Div", "Mul", "Erf",
            "Constant"}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory):
    return tmp_path_factory.mktemp("zoo_cache")


def count_macs(module: nn.Module, example: torch.Tensor) -> int:
    """Multiply-accumulates of Conv2d and Linear layers in one forward pass, counted with forward hooks."""
    total = 0

    def hook(layer: nn.Module, _inputs, output: torch.Tensor) -> None:
        nonlocal total
        if isinstance(layer, nn.Conv2d):
            kh, kw = layer.kernel_size
            total += output.numel() * (layer.in_channels // layer.groups) * kh * kw
        elif isinstance(layer, nn.Linear):
            total += output.numel() * layer.in_features

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
    assert {info.kind for info in ZOO.values()} == {"cnn", "rnn", "transformer"}
    assert ZOO["resnet50"].default_input_shape == (1, 3, 224, 224)
    assert ZOO["lstm_lm"].default_input_shape == (35, 1)
    assert ZOO["bert_small"].default_input_shape == (1, 128)
    assert ZOO["gru_lm"].default_input_shapes == {"tokens": (35, 1)}
    assert ZOO["resnet18"].input_shapes(4, 96) == {"input": (4, 3, 96, 96)}
    for name in CNNS:
        assert ZOO[name].published_gmacs is not None and "torchvision" in ZOO[name].citation


@pytest.mark.parametrize("call", [lambda: build_torch("resnet51"), lambda: build_onnx("resnet51")])
def test_unknown_model_name_lists_known_names(call):
    with pytest.raises(ModelLoadError) as excinfo:
        call()
    message = str(excinfo.value)
    assert "resnet51" in message and all(name in message for name in EXPECTED_NAMES)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"name": "resnet18", "size": 16}, "image side"),
    ({"name": "bert_small", "size": 513}, "sequence length"),
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
    batch, size = NUMERICS_SHAPES[info.kind]
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
    if info.kind == "cnn":
        batch_norms = sum(isinstance(m, nn.BatchNorm2d) for m in module.modules())
        assert ops["BatchNormalization"] == batch_norms
        assert ops["Conv"] == sum(isinstance(m, nn.Conv2d) for m in module.modules())
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


@pytest.mark.parametrize("name, batch, size", [("bert_small", 2, 16), ("lstm_lm", 2, 6), ("resnet18", 2, 64)])
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
        "assert len(models.list_models()) == 10 and models.ZOO['vgg16'].default_input_shape == (1, 3, 224, 224)\n"
        f"path = models.build_onnx('squeezenet1_1', batch=1, size=32, cache_dir={str(tmp_path)!r}, weights='inputs')\n"
        f"assert str(path) == {str(path)!r}, path\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=Path(models.__file__).parent.parent,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
