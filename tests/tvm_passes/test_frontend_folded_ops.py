"""An op type without a converter that onnxslim folds away for the bound shapes does not stop the import."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.tvm

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from hetpart.errors import UnsupportedOpError  # noqa: E402
from tvm_passes.frontend import import_model  # noqa: E402


class _PadConvSqueeze(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pad = torch.nn.ZeroPad2d((0, 0, 2, 2))
        self.conv = torch.nn.Conv2d(1, 4, (5, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(self.pad(x)).squeeze(3)


def test_if_on_a_shape_test_folds_away_and_imports(tmp_path):
    path = tmp_path / "pad_conv_squeeze.onnx"
    torch.onnx.export(_PadConvSqueeze().eval(), (torch.randn(1, 1, 16, 1),), str(path), input_names=["x"],
                      opset_version=17, dynamo=False, do_constant_folding=False)
    assert "If" in {n.op_type for n in onnx.load(str(path)).graph.node}      # the exporter wrote an If
    imported = import_model(path, work_dir=tmp_path)
    ops = {str(b.value.op.name) for block in imported.mod["main"].body.blocks for b in block.bindings
           if hasattr(b.value, "op") and hasattr(b.value.op, "name")}
    assert "relax.nn.conv2d" in ops


def test_an_op_type_that_stays_is_still_reported(tmp_path):
    from onnx import TensorProto, helper

    node = helper.make_node("Frobnicate", ["a"], ["y"], domain="com.example")    # no converter, nothing folds it
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    path = tmp_path / "frobnicate.onnx"
    onnx.save(model, str(path))
    with pytest.raises(UnsupportedOpError, match="com.example.Frobnicate x1"):
        import_model(path, work_dir=tmp_path)
