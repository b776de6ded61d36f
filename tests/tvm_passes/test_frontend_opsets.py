"""tvm_passes.onnx_opsets + frontend: ONNX models at opsets 7-12 with attribute-form ops, imported and run through
TVM and compared with onnxruntime on the original model; the upgrade rule; the error messages."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from hetpart.errors import ModelLoadError, UnsupportedOpError
from tests import onnx_builders
from tests.tvm_passes.test_frontend import run_relax
from tvm_passes import onnx_opsets
from tvm_passes.frontend import import_model

pytestmark = pytest.mark.tvm

N = helper.make_node


def _model(path: Path, nodes, x_shape, opset: int, *, inits=(), outputs=("y",)) -> Path:
    graph = helper.make_graph(nodes, path.stem, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info(o, TensorProto.INT64 if o == "idx" else TensorProto.FLOAT,
                                                             None) for o in outputs],
                              list(inits))
    return onnx_builders.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), path)


def _const(name: str, values, dtype) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, dtype), name)


# name: (opset, nodes, input shape, initializers, outputs, opset after import (None: not upgraded))
CASES = {
    "slice_opset7": (7, [N("Slice", ["x"], ["y"], starts=[1, 0], ends=[3, -1], axes=[1, 2], name="sl")],
                     (2, 4, 6), (), ("y",), 10),
    "slice_opset9": (9, [N("Slice", ["x"], ["y"], starts=[-3], ends=[100], axes=[2], name="sl")],
                     (2, 4, 6), (), ("y",), 10),
    "pad_constant_opset7": (7, [N("Pad", ["x"], ["y"], pads=[0, 1, 2, 0, 2, 1], value=0.5)], (2, 3, 4), (), ("y",),
                            None),
    "pad_reflect_opset10": (10, [N("Pad", ["x"], ["y"], pads=[0, 0, 1, 2, 0, 0, 2, 1], mode="reflect")],
                            (1, 2, 4, 4), (), ("y",), None),
    "upsample_opset7": (7, [N("Upsample", ["x"], ["y"], scales=[1.0, 1.0, 2.0, 3.0], mode="nearest", name="up")],
                        (1, 2, 3, 4), (), ("y",), 11),
    "upsample_opset9": (9, [N("Upsample", ["x", "sc"], ["y"], mode="nearest", name="up")], (1, 2, 3, 4),
                        (_const("sc", [1, 1, 2, 2], np.float32),), ("y",), 11),
    "split_opset7": (7, [N("Split", ["x"], ["y0", "y1"], axis=1, split=[1, 3])], (2, 4, 3), (), ("y0", "y1"), None),
    "split_opset11": (11, [N("Split", ["x"], ["y0", "y1", "y2"], axis=-1, split=[2, 1, 3])], (2, 3, 6), (),
                      ("y0", "y1", "y2"), None),
    "reducesum_opset11": (11, [N("ReduceSum", ["x"], ["y"], axes=[1], keepdims=0)], (2, 4, 3), (), ("y",), None),
    "reducemean_opset9": (9, [N("ReduceMean", ["x"], ["y"], axes=[0, 2], keepdims=1)], (2, 4, 3), (), ("y",), None),
    "reducemax_opset12": (12, [N("ReduceMax", ["x"], ["y"], axes=[-1], keepdims=0)], (2, 4, 3), (), ("y",), None),
    "squeeze_unsqueeze_opset7": (7, [N("Squeeze", ["x"], ["a"], axes=[1]), N("Unsqueeze", ["a"], ["y"], axes=[0, 3])],
                                 (2, 1, 3), (), ("y",), None),
    "squeeze_unsqueeze_opset11": (11, [N("Squeeze", ["x"], ["a"], axes=[-2]),
                                       N("Unsqueeze", ["a"], ["y"], axes=[-1])], (2, 1, 3), (), ("y",), None),
    # Resize-10 has scales at input 1, where TVM's only converter (_impl_v18) reads roi
    "resize_opset10": (10, [N("Resize", ["x", "sc"], ["y"], mode="nearest", name="rs")], (1, 2, 3, 4),
                       (_const("sc", [1, 1, 2, 3], np.float32),), ("y",), 11),
    # linear: Resize-10's x / scale coordinates, which the upgrade to Resize-11 (default half_pixel) must keep
    "upsample_linear_opset7": (7, [N("Upsample", ["x"], ["y"], scales=[1.0, 1.0, 2.0, 3.0], mode="linear")],
                               (1, 2, 3, 4), (), ("y",), 11),
    "upsample_linear_opset9": (9, [N("Upsample", ["x", "sc"], ["y"], mode="linear")], (1, 2, 5),
                               (_const("sc", [1, 1, 2], np.float32),), ("y",), 11),
    "resize_linear_opset10": (10, [N("Resize", ["x", "sc"], ["y"], mode="linear")], (1, 2, 3, 4),
                              (_const("sc", [1, 1, 2, 2], np.float32),), ("y",), 11),
    # sizes with an empty scales constant (torch's interpolate(size=...) at opsets 11-12): TVM asserted on both
    "resize_sizes_empty_scales_opset11": (11, [N("Resize", ["x", "roi", "sc", "sz"], ["y"], mode="linear")],
                                          (1, 2, 3, 4), (_const("roi", np.zeros(0), np.float32),
                                                         _const("sc", np.zeros(0), np.float32),
                                                         _const("sz", [1, 2, 6, 7], np.int64)), ("y",), None),
    "resize_sizes_empty_scales_opset13": (13, [N("Resize", ["x", "", "sc", "sz"], ["y"], mode="nearest")],
                                          (1, 2, 3, 4), (_const("sc", np.zeros(0), np.float32),
                                                         _const("sz", [1, 2, 6, 8], np.int64)), ("y",), None),
    # axes counted from the end below opset 11 (torch writes dim=-1 so): TVM's ArgMax-1 converter asserted; the ops
    # whose picked converter predates opset 11 are upgraded to 11, the others are imported as they are
    "argmax_negative_axis_opset9": (9, [N("ArgMax", ["x"], ["idx"], axis=-1, keepdims=0, name="am")], (2, 3, 5), (),
                                    ("idx",), 11),
    "argmin_negative_axis_opset7": (7, [N("ArgMin", ["x"], ["idx"], axis=-2, name="am")], (2, 3, 5), (), ("idx",),
                                    11),
    "softmax_split_negative_axis_opset9": (9, [N("LogSoftmax", ["x"], ["a"], axis=-1),
                                               N("Split", ["a"], ["y0", "y1"], axis=-1, split=[2, 3])],
                                           (2, 3, 5), (), ("y0", "y1"), 11),
    "squeeze_unsqueeze_negative_opset9": (9, [N("Squeeze", ["x"], ["a"], axes=[-2]),
                                              N("Unsqueeze", ["a"], ["y"], axes=[-1])], (2, 1, 3), (), ("y",), 11),
    "concat_reduce_negative_opset9": (9, [N("Concat", ["x", "x"], ["a"], axis=-1),
                                          N("ReduceMean", ["a"], ["y"], axes=[-1], keepdims=1)], (2, 3, 4), (),
                                      ("y",), None),
    # TopK-10 takes K as an input; TVM's _impl_v1 would read the k attribute and silently return the top 1
    "topk_opset10": (10, [N("TopK", ["x", "k"], ["y", "idx"], axis=-1, name="tk")], (2, 5),
                     (_const("k", [3], np.int64),), ("y", "idx"), 11),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_attribute_form_ops_match_onnxruntime(case, tmp_path):
    opset, nodes, shape, inits, outputs, upgraded_to = CASES[case]
    path = _model(tmp_path / f"{case}.onnx", nodes, list(shape), opset, inits=inits, outputs=outputs)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    expected = ort.InferenceSession(str(path)).run(None, {"x": x})
    imported = import_model(path, work_dir=tmp_path / "work")
    got = run_relax(imported.mod, x)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype
        np.testing.assert_allclose(g, e, atol=1e-5, rtol=1e-5)
    # the reference file later runs (`run --check`) use is the upgraded, slimmed model: same numerics
    reference = ort.InferenceSession(str(imported.onnx_path)).run(None, {"x": x})
    for r, e in zip(reference, expected):
        np.testing.assert_allclose(r, e, atol=1e-6, rtol=1e-6)
    slim_opset = onnx_opsets.default_opset(onnx.load(str(imported.onnx_path)))
    if upgraded_to is None:
        assert imported.notes == () and slim_opset == opset
    else:
        assert slim_opset == upgraded_to
        assert len(imported.notes) == 1
        assert f"from opset {opset} to {upgraded_to}" in imported.notes[0]


def test_picked_converter_version_is_tvms_choice():
    from tvm.relax.frontend.onnx import onnx_frontend

    for op_type, cls in onnx_frontend._get_convert_map().items():
        versions = onnx_opsets.converter_versions(cls)
        if not versions:
            continue
        for opset in range(1, 26):
            picked = onnx_opsets.picked_converter_version(versions, opset)
            assert cls.get_converter(opset) == getattr(cls, f"_impl_v{picked}"), (op_type, opset)


def test_mismatch_rule_on_the_known_cases():
    from tvm.relax.frontend.onnx import onnx_frontend

    convert_map = onnx_frontend._get_convert_map()
    assert "Slice-13" in onnx_opsets.form_difference("Slice", 9, 13)
    assert onnx_opsets.form_difference("Slice", 10, 13) is None          # Slice-10 already takes inputs
    assert "TopK-1" in onnx_opsets.form_difference("TopK", 10, 1)
    assert "#2" in onnx_opsets.form_difference("Resize", 10, 18)          # scales moved behind roi
    assert onnx_opsets.form_difference("Split", 11, 1) is None           # Split-1 had `split` as attribute too
    assert onnx_opsets.form_difference("ReduceSum", 11, 11) is None
    assert onnx_opsets.form_difference("Squeeze", 11, 1) is None
    assert onnx_opsets.lowest_matching_opset("Slice", 9, convert_map) == 10
    assert onnx_opsets.lowest_matching_opset("Upsample", 9, convert_map) == 10   # deprecated: becomes Resize
    assert onnx_opsets.lowest_matching_opset("Upsample", 11, convert_map) is None
    # opset 11 and later: no converter of TVM 0.27 reads another form (but the deprecated Upsample)
    for opset in (11, 12, 13, 17):
        for op_type, cls in convert_map.items():
            versions = onnx_opsets.converter_versions(cls)
            if versions and op_type != "Upsample":
                picked = onnx_opsets.picked_converter_version(versions, opset)
                assert onnx_opsets.form_difference(op_type, opset, picked) is None, (op_type, opset)


def test_importer_failure_names_op_node_and_opset(tmp_path):
    pads = helper.make_tensor_value_info("pads", TensorProto.INT64, [6])
    graph = helper.make_graph([N("Pad", ["x", "pads"], ["y"], name="pad_dyn")], "dynpad",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4]), pads],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    path = onnx_builders.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)]),
                              tmp_path / "dynpad.onnx")
    with pytest.raises(ModelLoadError) as info:
        import_model(path)
    msg = str(info.value)
    assert "Pad node 'pad_dyn'" in msg and "model opset 11" in msg and "Dynamic pads" in msg
    assert "opset >= 13" in msg and "\n" not in msg


def test_failed_upgrade_names_op_node_and_opset(tmp_path):
    """Upsample-9 takes scales as an input; given as the opset-7 attribute, the version converter rejects it."""
    path = _model(tmp_path / "bad_upsample.onnx",
                  [N("Upsample", ["x"], ["y"], scales=[1.0, 1.0, 2.0, 2.0], name="up")], [1, 2, 3, 4], 9)
    with pytest.raises(ModelLoadError) as info:
        import_model(path)
    msg = str(info.value)
    assert "Upsample-9 node 'up'" in msg and "model opset 9" in msg and "version_converter failed" in msg
    assert "\n" not in msg


def test_deprecated_upsample_after_opset_10_is_named(tmp_path):
    path = _model(tmp_path / "up11.onnx", [N("Upsample", ["x", "sc"], ["y"], name="up")], [1, 2, 3, 4], 11,
                  inits=(_const("sc", [1, 1, 2, 2], np.float32),))
    with pytest.raises(ModelLoadError, match=r"Upsample-10 node 'up'.*opset 11.*deprecated since opset 10"):
        import_model(path)


def test_unsupported_ops_are_still_listed_before_any_upgrade(tmp_path):
    nodes = [N("Slice", ["x"], ["a"], starts=[0], ends=[1], axes=[0]),
             N("FancyOp", ["a"], ["y"], domain="com.example")]
    graph = helper.make_graph(nodes, "u", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9), helper.make_opsetid("com.example", 1)])
    with pytest.raises(UnsupportedOpError, match="com.example.FancyOp x1"):
        import_model(onnx_builders.save(model, tmp_path / "u.onnx"))


def test_upgrade_keeps_external_data(tmp_path):
    weight = np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32)
    nodes = [N("Mul", ["x", "w"], ["m"]), N("Slice", ["m"], ["y"], starts=[1], ends=[5], axes=[1])]
    graph = helper.make_graph(nodes, "ext", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    model.ir_version = onnx_builders.IR_VERSION
    path = tmp_path / "ext.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="ext.bin", size_threshold=0)
    assert (tmp_path / "ext.bin").stat().st_size == weight.nbytes
    x = np.random.default_rng(3).standard_normal((4, 6)).astype(np.float32)
    imported = import_model(path, work_dir=tmp_path / "work")
    np.testing.assert_allclose(run_relax(imported.mod, x)[0], (x * weight)[:, 1:5], atol=1e-6)
    assert "from opset 9 to 10" in imported.notes[0]


@pytest.mark.filterwarnings("ignore::UserWarning")   # the CPU predictor extrapolates for such tiny kernels
def test_compile_opset9_model_end_to_end(tmp_path, monkeypatch):
    import hetpart

    monkeypatch.setenv("HETPART_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(4)
    nodes = [
        N("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        N("Relu", ["c"], ["r"]),
        N("Slice", ["r"], ["s"], starts=[1, 1], ends=[7, 7], axes=[2, 3]),
        N("Pad", ["s"], ["p"], pads=[0, 0, 1, 1, 0, 0, 1, 1], mode="edge"),
        N("Upsample", ["p", "sc"], ["u"], mode="nearest"),
        N("ReduceMean", ["u"], ["y"], axes=[2, 3], keepdims=0),
    ]
    path = _model(tmp_path / "opset9.onnx", nodes, [1, 3, 8, 8], 9,
                  inits=(_const("w", rng.standard_normal((4, 3, 3, 3)) * 0.3, np.float32),
                         _const("sc", [1, 1, 2, 2], np.float32)))
    compiled = hetpart.compile(str(path), devices="cpu", output_dir=tmp_path / "out")
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    (got,) = compiled(x)
    (expected,) = ort.InferenceSession(str(path)).run(None, {"x": x})
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)
    assert any("from opset 9 to 11" in n for n in compiled.source["import_notes"])
    assert (tmp_path / "out" / "report.md").exists()
