"""--outputs: keep an ONNX model up to chosen tensors (a detector without its data-dependent post-processing)."""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from hetpart.errors import ModelLoadError, UnsupportedOpError
from tests.onnx_builders import OPSET, save
from tvm_passes.onnx_cut import cut_onnx_model, parse_output_names

X = np.random.default_rng(0).standard_normal((1, 3, 10, 10)).astype(np.float32)


def _detector(path, with_post_processing=True):
    """conv -> relu ("features") -> a 1x1 head ("scores"); then NonZero of the scores above 0 (data-dependent)."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array((rng.standard_normal((4, 8, 1, 1)) * 0.3).astype(np.float32), "w_head"),
             numpy_helper.from_array(np.zeros((), np.float32), "zero")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["conv"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["conv"], ["features"]),
             helper.make_node("Conv", ["features", "w_head"], ["scores"])]
    outputs = [helper.make_tensor_value_info("scores", TensorProto.FLOAT, None)]
    if with_post_processing:
        nodes += [helper.make_node("Greater", ["scores", "zero"], ["keep"]),
                  helper.make_node("NonZero", ["keep"], ["found"], name="nms_like")]
        outputs = [helper.make_tensor_value_info("found", TensorProto.INT64, None)]
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 10, 10])
    graph = helper.make_graph(nodes, "detector", [x_info], outputs, inits)
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), path)


def test_parse_output_names_forms():
    assert parse_output_names("a, b") == ("a", "b")
    assert parse_output_names(["a", "b,c"]) == ("a", "b", "c")       # the CLI's repeatable --outputs
    assert parse_output_names(None) == ()
    with pytest.raises(ModelLoadError, match="at least one tensor"):
        parse_output_names(" , ")


def test_whole_model_is_refused_and_the_cut_compiles_and_matches_onnxruntime(tmp_path):
    import hetpart

    path = _detector(tmp_path / "det.onnx")
    original = path.read_bytes()
    with pytest.raises(UnsupportedOpError, match="NonZero node 'nms_like' reads \\['keep'\\]"):
        hetpart.compile(str(path), devices="cpu,gpu=p2200")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # the CPU predictor extrapolates for such tiny kernels
        compiled = hetpart.compile(str(path), devices="cpu,gpu=p2200", outputs="scores")
    reference_path = _detector(tmp_path / "reference.onnx", with_post_processing=False)
    expected = ort.InferenceSession(str(reference_path)).run(None, {"x": X})[0]
    (got,) = compiled(x=X)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert compiled.source["outputs"] == ["scores"]
    assert path.read_bytes() == original                   # the user's file is never changed


def test_cut_keeps_only_what_the_outputs_need_and_is_written_once(tmp_path):
    path = _detector(tmp_path / "det.onnx")
    cut = cut_onnx_model(path, ["features"], tmp_path / "cut")
    model = onnx.load(str(cut))
    assert [n.op_type for n in model.graph.node] == ["Conv", "Relu"]
    assert [o.name for o in model.graph.output] == ["features"] and [i.name for i in model.graph.input] == ["x"]
    mtime = cut.stat().st_mtime_ns
    assert cut_onnx_model(path, "features", tmp_path / "cut") == cut and cut.stat().st_mtime_ns == mtime


def test_unknown_output_names_the_closest_tensors(tmp_path):
    path = _detector(tmp_path / "det.onnx")
    with pytest.raises(ModelLoadError) as info:
        cut_onnx_model(path, ["score"], tmp_path / "cut")
    message = str(info.value)
    assert "'score' (close: 'scores'" in message and "\n" not in message


def test_cli_takes_outputs_for_analyze(tmp_path, capsys, monkeypatch):
    from hetpart.driver import cli

    monkeypatch.setenv("COLUMNS", "200")
    path = _detector(tmp_path / "det.onnx")
    args = cli.build_parser().parse_args(["analyze", str(path), "--outputs", "features"])
    assert args.outputs == ["features"]
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "conv2d" in out and "greater" not in out
