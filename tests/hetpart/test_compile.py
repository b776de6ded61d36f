"""hetpart.compile end to end: mixed CPU+GPU plans built with the GPU emulated, numerics vs onnxruntime/torch,
the output directory, the runtime loader and the errors users hit."""
from __future__ import annotations

import fnmatch
import json
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest

import hetpart
from hetpart.errors import InputMismatchError, InvalidPlanError, PinError, UnknownDeviceError
from hetpart.plan import Plan

pytestmark = pytest.mark.tvm

CNNS = ["resnet18", "resnet50", "vgg16", "mobilenetv2", "squeezenet1_1", "densenet121", "googlenet"]
SMALL = {"resnet18": 64, "resnet50": 64, "vgg16": 32, "mobilenetv2": 64, "squeezenet1_1": 64,
         "densenet121": 64, "googlenet": 64}


def mixed_pins(name: str) -> dict[str, str]:
    """Everything on the GPU but pooling pinned to the CPU: forces copies both ways."""
    op_types = {n.op for n in hetpart.analyze(name, size=SMALL[name]).nodes}
    for pattern in ("relax.nn.*pool2d", "relax.mean"):
        if any(fnmatch.fnmatchcase(t, pattern) for t in op_types):
            return {f"op:{pattern}": "cpu"}
    raise AssertionError(f"{name} has no pooling op to pin")


def onnx_reference(compiled, x):
    session = ort.InferenceSession(compiled.source["onnx_path"], providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})


@pytest.mark.parametrize("name", CNNS)
def test_zoo_cnn_mixed_plan_matches_onnxruntime(name):
    compiled = hetpart.compile(name, size=SMALL[name], devices="cpu,gpu=t4", method="all_gpu", pins=mixed_pins(name))
    used = set(compiled.plan.device_of)
    assert used == {"cpu", "gpu"}, f"plan must use both devices, used {used}"
    assert compiled.timeline.copy_events(), "a mixed plan copies tensors between devices"
    assert compiled.build.manifest.emulated
    x = np.random.default_rng(0).standard_normal((1, 3, SMALL[name], SMALL[name])).astype(np.float32)
    ours = compiled(x)
    ref = onnx_reference(compiled, x)
    assert len(ours) == len(ref)
    for a, b in zip(ours, ref):
        # 1e-4 of the output's scale: with random weights ResNet-50's logits reach ~1e2-1e4, where float32
        # summation order alone moves them by more than 1e-4 absolute (TVM's default pipeline too)
        scale = max(1.0, float(np.max(np.abs(b))))
        assert float(np.max(np.abs(a - b))) <= 1e-4 * scale, (float(np.max(np.abs(a - b))), scale)


def test_lstm_language_model_mixed_plan_matches_onnxruntime(tmp_path):
    compiled = hetpart.compile("lstm_lm", size=8, devices="cpu,gpu=t4", method="all_gpu",
                               pins={"op:relax.take": "cpu", "rnn0*": "cpu"})
    assert set(compiled.plan.device_of) == {"cpu", "gpu"}
    session = ort.InferenceSession(compiled.source["onnx_path"], providers=["CPUExecutionProvider"])
    feeds = {}
    for spec in session.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in spec.shape]
        feeds[spec.name] = (np.random.default_rng(1).integers(0, 1000, shape).astype(np.int64)
                            if "int" in spec.type else np.random.default_rng(1).standard_normal(shape).astype(np.float32))
    ours = compiled(*feeds.values())
    for a, b in zip(ours, session.run(None, feeds)):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)
    # token ids past the vocabulary are refused (the compiled gather would read beyond the table), here and loaded
    (name, vocab), = compiled.index_bounds.items()
    bad = {k: (np.full_like(v, vocab) if k == name else v) for k, v in feeds.items()}
    with pytest.raises(InputMismatchError, match=f"'{name}' indexes a table of {vocab} rows"):
        compiled(*bad.values())
    compiled.save(tmp_path / "lm")
    with pytest.raises(InputMismatchError, match=f"found {vocab} at"):
        hetpart.load(tmp_path / "lm")(*bad.values())


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    out = tmp_path_factory.mktemp("c") / "sq"
    compiled = hetpart.compile("squeezenet1_1", size=64, devices="cpu,gpu=p2200", output_dir=out)
    return compiled, out


def test_output_directory_contents_and_runtime(saved):
    compiled, out = saved
    for name in ("model.so", "manifest.json", "plan.json", "op_plan.json", "costs.json", "report.md", "report.html",
                 "gantt.png", "graph.png", "compile.json", "timeline.json"):
        assert (out / name).exists(), name
    text = (out / "report.md").read_text()
    assert "all_cpu" in text and "Per-kernel decisions" in text and "analytic" in text
    assert "EMULATED" in text
    from hetpart.threads import deployment_threads
    from predictors.registry import default_cpu_predictor_path, host_cpu_name
    # which predictor priced the CPU, and for which CPU: costs from another CPU's predictor can be off 2x
    assert f"CPU costs: {default_cpu_predictor_path().name}, measured on a " in text
    assert f"this host's CPU: {host_cpu_name()}" in text
    # a predictor from another CPU (or thread count) is scaled by a calibration suite timed here when the host is
    # quiet, and left unscaled when it is busy; the report says which, on any host
    provenance = json.loads(default_cpu_predictor_path().read_text())["provenance"]
    foreign = (provenance["target"]["mcpu"] != host_cpu_name()
               or provenance.get("num_threads") not in (None, deployment_threads()))
    assert any(f"(calibration: {c}," in text for c in ("cached", "fresh", "none-fallback")) is foreign
    runtime = hetpart.load(out)
    x = np.random.default_rng(3).standard_normal((1, 3, 64, 64)).astype(np.float32)
    np.testing.assert_allclose(runtime(x)[0], compiled(x)[0], atol=1e-5)
    np.testing.assert_allclose(runtime(**{runtime.input_names[0]: x})[0], compiled(x)[0], atol=1e-5)
    with pytest.raises(InputMismatchError, match=r"must have shape \[1, 3, 64, 64\]"):
        runtime(np.zeros((1, 3, 32, 32), np.float32))
    with pytest.raises(InputMismatchError, match="takes 1 input"):
        runtime(x, x)
    assert "EMULATED" in repr(runtime)


def test_edited_plan_is_compiled_as_edited(saved, tmp_path):
    compiled, out = saved
    data = json.loads((out / "plan.json").read_text())
    data["device_of"] = ["cpu"] * len(data["device_of"])
    data["device_of"][3] = "gpu"
    (tmp_path / "edited.json").write_text(json.dumps(data))
    again = hetpart.compile("squeezenet1_1", size=64, devices="cpu,gpu=p2200", plan=tmp_path / "edited.json")
    assert list(again.plan.device_of) == data["device_of"]
    member_ops = again.graph.nodes[3].tags["op_ids"]
    assert {again.op_plan.device_of[i] for i in member_ops} == {"gpu"}


def test_a_plan_keeps_the_devices_it_was_made_for(saved, tmp_path):
    compiled, out = saved
    assert json.loads((out / "plan.json").read_text())["device_spec"] == "cpu,gpu=p2200"
    with pytest.raises(InvalidPlanError, match="made for --devices cpu,gpu=p2200, not cpu,gpu=t4"):
        hetpart.compile("squeezenet1_1", size=64, devices="cpu,gpu=t4", plan=out / "plan.json")
    again = hetpart.compile("squeezenet1_1", size=64, plan=out / "plan.json")      # no --devices: the plan's
    assert again.plan.device_spec == "cpu,gpu=p2200"
    assert "P2200" in again.costs.devices.device("gpu").citation
    assert list(again.plan.device_of) == list(compiled.plan.device_of)


def test_arguments_are_checked_before_the_model_is_imported(monkeypatch, tmp_path):
    from hetpart.errors import OutputDirError
    from tvm_passes import sources

    def no_import(*args, **kwargs):
        raise AssertionError("the model was imported before the arguments were checked")

    monkeypatch.setattr(sources, "import_model", no_import)
    with pytest.raises(InvalidPlanError, match="unknown partitioning method 'fastest'"):
        hetpart.compile("squeezenet1_1", method="fastest")
    with pytest.raises(UnknownDeviceError, match="known presets"):
        hetpart.compile("squeezenet1_1", devices="cpu,gpu=h900")
    with pytest.raises(InvalidPlanError, match="cannot read plan file"):
        hetpart.compile("squeezenet1_1", plan=tmp_path / "missing.json")
    user_dir = tmp_path / "project"
    user_dir.mkdir()
    (user_dir / "model.onnx").write_bytes(b"the user's model")
    with pytest.raises(OutputDirError, match="not a hetpart output"):
        hetpart.compile(user_dir / "model.onnx", output_dir=user_dir, overwrite=True)
    with pytest.raises(OutputDirError, match="existing file"):
        hetpart.compile(user_dir / "model.onnx", output_dir=user_dir / "model.onnx")
    assert [p.name for p in user_dir.iterdir()] == ["model.onnx"]
    assert (user_dir / "model.onnx").read_bytes() == b"the user's model"


def test_saving_again_needs_overwrite_and_keeps_users_files(saved, tmp_path):
    from hetpart.errors import OutputDirError

    compiled, out = saved
    target = tmp_path / "copy"
    compiled.save(target)
    with pytest.raises(OutputDirError, match="--force"):
        compiled.save(target)
    (target / "my_notes.txt").write_text("keep me")
    with pytest.raises(OutputDirError, match="my_notes.txt"):
        compiled.save(target, overwrite=True)
    (target / "my_notes.txt").unlink()
    compiled.save(target, overwrite=True)
    assert (target / "model.so").exists() and not (target / "my_notes.txt").exists()


def test_bad_inputs_are_typed_errors(saved, tmp_path):
    compiled, out = saved
    with pytest.raises(UnknownDeviceError, match="known presets"):
        hetpart.compile("squeezenet1_1", size=64, devices="cpu,gpu=h900")
    with pytest.raises(PinError, match="names no op"):
        hetpart.compile("squeezenet1_1", size=64, devices="cpu,gpu", pins={"no_such_op*": "gpu"})
    other = hetpart.analyze("resnet18", size=64).kernel_graph()
    foreign = Plan(device_of=["cpu"] * other.num_ops, order=range(other.num_ops), devices=("cpu", "gpu"),
                   method="all_cpu", graph_hash=other.structure_hash(), level="kernel")
    foreign.save(tmp_path / "foreign.json")
    with pytest.raises(InvalidPlanError, match="another model|re-plan"):
        hetpart.compile("squeezenet1_1", size=64, devices="cpu,gpu", plan=tmp_path / "foreign.json")


def test_cli_errors_are_one_line_and_leave_no_output(tmp_path):
    out = tmp_path / "never"
    result = subprocess.run([sys.executable, "-m", "hetpart", "compile", "squeezenet1_1", "--size", "64",
                             "--devices", "cpu,gpu=h900", "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("hetpart: error")]
    assert len(errors) == 1 and "UnknownDeviceError" in errors[0]
    assert not out.exists() and not list(tmp_path.glob(".never*"))


def test_cli_never_writes_into_a_users_directory(tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"the user's model")
    (tmp_path / "notes.txt").write_text("mine")
    for out in (".", "model.onnx"):
        result = subprocess.run([sys.executable, "-m", "hetpart", "compile", "model.onnx", "-o", out, "--force"],
                                capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        errors = [line for line in result.stderr.splitlines() if line.startswith("hetpart: error")]
        assert len(errors) == 1 and "OutputDirError" in errors[0], result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "notes.txt"]
    assert (tmp_path / "model.onnx").read_bytes() == b"the user's model"


def test_torch_modules_compile_and_match_torch():
    torch = pytest.importorskip("torch")

    class Cnn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Conv2d(3, 16, 3, padding=1)
            self.b = torch.nn.Conv2d(16, 16, 3, padding=1)
            self.fc = torch.nn.Linear(16, 4)

        def forward(self, x):
            y = torch.relu(self.a(x))
            y = torch.relu(self.b(torch.nn.functional.max_pool2d(y, 2))) + 1.0
            return self.fc(y.mean(dim=(2, 3)))

    class Lstm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = torch.nn.LSTM(8, 16, num_layers=2, batch_first=True)
            self.fc = torch.nn.Linear(16, 3)

        def forward(self, x):
            out, _ = self.rnn(x)
            return self.fc(out[:, -1])

    torch.manual_seed(0)
    for module, x in ((Cnn().eval(), torch.randn(1, 3, 16, 16)), (Lstm().eval(), torch.randn(1, 6, 8))):
        compiled = hetpart.compile(module, example_inputs=(x,), devices="cpu,gpu=t4", method="all_gpu",
                                   pins={"op:relax.matmul": "cpu"})
        assert set(compiled.plan.device_of) == {"cpu", "gpu"}
        np.testing.assert_allclose(compiled(x.numpy())[0], module(x).detach().numpy(), atol=1e-5)


def test_scalar_inputs_and_outputs_keep_their_shape(tmp_path):
    """A 0-D input (a temperature, a threshold) and a 0-D output (a squeezed constant plus it) stay 0-D through
    import, constant folding, the mixed build, both runtimes and --check's sampled inputs."""
    from onnx import TensorProto, helper, numpy_helper

    import onnx

    nodes = [helper.make_node("Mul", ["x", "scale"], ["y"]),
             helper.make_node("Squeeze", ["one", "axes"], ["one_0d"]),
             helper.make_node("Add", ["one_0d", "scale"], ["z"])]
    graph = helper.make_graph(
        nodes, "scalars", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                           helper.make_tensor_value_info("scale", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(np.array([1.5], np.float32), "one"),
         numpy_helper.from_array(np.array([0], np.int64), "axes")])
    path = tmp_path / "scalars.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), str(path))
    compiled = hetpart.compile(str(path), devices="cpu,gpu=t4", pins={"op:relax.multiply": "gpu"})
    assert [tuple(i["shape"]) for i in compiled.build.manifest.inputs] == [(2, 3), ()]
    y, z = compiled(np.ones((2, 3), np.float32), np.array(2.5, np.float32))
    np.testing.assert_array_equal(y, np.full((2, 3), 2.5, np.float32))
    assert z.shape == () and float(z) == 4.0
    out = tmp_path / "out"
    compiled.save(out)
    run = subprocess.run([sys.executable, "-m", "hetpart", "run", str(out), "--check"], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0 and "OK" in run.stdout, run.stdout + run.stderr
