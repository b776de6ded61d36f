"""tvm_passes.frontend: ONNX / torch import, shape binding, error messages; numerics vs onnxruntime / torch."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from hetpart.errors import HetpartError, MissingInputShapeError, ModelLoadError, UnsupportedOpError
from tests import onnx_builders
from tvm_passes.frontend import import_model, parse_input_shapes

pytestmark = pytest.mark.tvm


def run_relax(mod, *arrays):
    import tvm
    from tvm import relax

    ex = tvm.compile(mod, target="llvm", relax_pipeline=relax.get_default_pipeline(tvm.target.Target("llvm")))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in arrays])
    if hasattr(out, "numpy"):
        return [out.numpy()]
    return [o.numpy() for o in out]


@pytest.fixture(scope="module")
def cnn_path(tmp_path_factory):
    return onnx_builders.small_cnn(tmp_path_factory.mktemp("m") / "cnn.onnx")


def test_parse_input_shapes_forms():
    assert parse_input_shapes(["x=1,3,224,224", "m=2x5"]) == {"x": (1, 3, 224, 224), "m": (2, 5)}
    assert parse_input_shapes({"x": [1, 2]}) == {"x": (1, 2)}
    for bad in (["x"], ["x=1,a"], ["x=0,3"], ["=1,2"]):
        with pytest.raises(ModelLoadError):
            parse_input_shapes(bad)


def test_symbolic_input_without_shape_lists_inputs_and_flag(cnn_path):
    with pytest.raises(MissingInputShapeError) as info:
        import_model(cnn_path)
    msg = str(info.value)
    assert "x has dims ['N', 3, 8, 8]" in msg and "--input-shape x=1,3,8,8" in msg


def test_wrong_input_name_and_rank(cnn_path):
    with pytest.raises(ModelLoadError, match=r"model's inputs are \['x'\]"):
        import_model(cnn_path, input_shapes={"y": (1, 3, 8, 8)})
    with pytest.raises(ModelLoadError, match="rank"):
        import_model(cnn_path, input_shapes={"x": (1, 3, 8)})
    with pytest.raises(ModelLoadError, match="contradicts"):
        import_model(cnn_path, input_shapes={"x": (1, 4, 8, 8)})


def test_onnx_numerics_match_onnxruntime_with_folded_reshape(cnn_path):
    imported = import_model(cnn_path, input_shapes={"x": (2, 3, 8, 8)})
    ops = {b.value.op.name for blk in imported.mod["main"].body.blocks for b in blk.bindings
           if hasattr(b.value, "op") and hasattr(b.value.op, "name")}
    assert "relax.shape_of" not in ops  # the Shape->Gather->Concat chain was folded for the bound shape
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    expected = ort.InferenceSession(str(cnn_path)).run(None, {"x": x})
    got = run_relax(imported.mod, x)
    assert len(got) == len(expected) == 2
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, atol=1e-5, rtol=1e-5)
    assert imported.inputs[0].shape == (2, 3, 8, 8) and imported.output_names == ("y1", "y2s")


def test_source_hash_depends_on_bound_shapes(cnn_path):
    a = import_model(cnn_path, input_shapes={"x": (1, 3, 8, 8)})
    b = import_model(cnn_path, input_shapes={"x": (2, 3, 8, 8)})
    assert a.source_hash != b.source_hash


def test_truncated_and_non_onnx_files(tmp_path, cnn_path):
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(cnn_path.read_bytes()[: len(cnn_path.read_bytes()) // 3])
    text = tmp_path / "notes.onnx"
    text.write_text("this is not a model\n" * 20)
    for path in (truncated, text, tmp_path / "missing.onnx"):
        with pytest.raises(ModelLoadError) as info:
            import_model(path, input_shapes={"x": (1, 3, 8, 8)})
        assert path.name in str(info.value)


def test_unsupported_ops_all_listed_with_counts(tmp_path):
    path = onnx_builders.with_unsupported_ops(tmp_path / "u.onnx")
    with pytest.raises(UnsupportedOpError) as info:
        import_model(path)
    msg = str(info.value)
    assert "com.example.FancyOp x2" in msg and "com.example.OtherOp x1" in msg
    assert isinstance(info.value, (HetpartError, NotImplementedError))


def test_torch_cnn_matches_torch():
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(8)
            self.fc = torch.nn.Linear(8, 5)

        def forward(self, x):
            y = torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3))
            return self.fc(y)

    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(2, 3, 8, 8)
    imported = import_model(net, example_inputs=(x,))
    got = run_relax(imported.mod, x.numpy())[0]
    np.testing.assert_allclose(got, net(x).detach().numpy(), atol=1e-5)


@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
def test_torch_stacked_rnn_last_step_matches_torch(cell):
    """y[:, -1] used to become an out-of-bounds take(mode='fast') (errors 8e-2, NaN, 6e16)."""
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = getattr(torch.nn, cell)(6, 12, num_layers=2, batch_first=True)
            self.head = torch.nn.Linear(12, 3)

        def forward(self, x):
            out, _ = self.rnn(x)
            return self.head(out[:, -1])

    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(2, 5, 6)
    imported = import_model(net, example_inputs=(x,))
    got = run_relax(imported.mod, x.numpy())[0]
    np.testing.assert_allclose(got, net(x).detach().numpy(), atol=1e-5)


def test_torch_module_needs_example_inputs():
    torch = pytest.importorskip("torch")
    with pytest.raises(ModelLoadError, match="example inputs"):
        import_model(torch.nn.Linear(2, 2))


def test_other_objects_are_rejected():
    with pytest.raises(ModelLoadError, match="cannot import a int"):
        import_model(42)


def test_data_dependent_shape_is_named_with_the_fix(tmp_path):
    """NonZero's output size depends on the input values: binding input shapes cannot make it static, so the
    error must not advise that (it did: "bind input shapes (--input-shape NAME=DIMS)")."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("NonZero", ["r"], ["y"])],
                              "nz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    path = onnx_builders.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]),
                              tmp_path / "nonzero.onnx")
    with pytest.raises(UnsupportedOpError) as info:
        import_model(path)
    message = str(info.value)
    assert message.startswith("nonzero.onnx: nonzero (binding") and "depends on the input values" in message
    assert "end the model before this op (NonZero node" in message and "--input-shape" not in message
    assert "reads ['r']: --outputs r, or outputs=['r'] in the Python API" in message and "\n" not in message
