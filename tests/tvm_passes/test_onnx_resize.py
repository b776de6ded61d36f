"""ONNX Resize with scales that do not give whole output lengths (tvm_passes.onnx_resize), against onnxruntime."""
from __future__ import annotations

import itertools

import numpy as np
import onnxruntime as ort
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax
from tvm.relax.frontend import onnx as relax_onnx

from tvm_passes.onnx_converters import install_onnx_converters
from tvm_passes.onnx_resize import source_weights

RNG = np.random.default_rng(0)
X = RNG.standard_normal((1, 2, 5, 7)).astype(np.float32)


@pytest.fixture(autouse=True, scope="module")
def _converters():
    install_onnx_converters()


def _resize_model(attrs: dict, scales=None, sizes=None, shape=X.shape):
    inputs = ["x", "", "scales" if scales is not None else ""] + (["sizes"] if sizes is not None else [])
    inits = ([numpy_helper.from_array(np.array(scales, np.float32), "scales")] if scales is not None else []) + \
        ([numpy_helper.from_array(np.array(sizes, np.int64), "sizes")] if sizes is not None else [])
    graph = helper.make_graph([helper.make_node("Resize", inputs, ["y"], name="rs", **attrs)], "resize",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def _ours_and_theirs(model, x=X):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"x": x})[0]
    mod = relax_onnx.from_onnx(model)
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy(), expected, mod


TRANSFORMS = ["half_pixel", "pytorch_half_pixel", "asymmetric", "tf_half_pixel_for_nn", "align_corners"]
CASES = [dict(mode="nearest", coordinate_transformation_mode=t, nearest_mode=n) for t, n in itertools.product(
    TRANSFORMS, ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])] + \
    [dict(mode=m, coordinate_transformation_mode=t) for m, t in itertools.product(["linear", "cubic"], TRANSFORMS)] + \
    [dict(mode="cubic", cubic_coeff_a=-0.5, exclude_outside=1)]


@pytest.mark.parametrize("attrs", CASES, ids=lambda a: "-".join(str(v) for v in a.values()))
@pytest.mark.parametrize("scales", [[1, 1, 2, 1.5], [1, 1, 0.6, 0.5], [1, 1, 1.7, 2.3]])
def test_scales_that_do_not_give_whole_lengths_match_onnxruntime(attrs, scales):
    """In*scale not whole on some axis (7 x 1.5, 7 x 0.5, 5 x 1.7): TVM mapped coordinates with out/in instead of the
    scale and was off by up to 2.9 (on N(0, 1) inputs) in every mode but align_corners."""
    ours, theirs, _ = _ours_and_theirs(_resize_model(attrs, scales=scales))
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


def test_whole_lengths_stay_with_tvms_resize():
    for model in (_resize_model(dict(mode="linear"), scales=[1, 1, 2, 2]),
                  _resize_model(dict(mode="linear"), sizes=[1, 2, 9, 4])):
        ours, theirs, mod = _ours_and_theirs(model)
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
        assert "image.resize2d" in mod.script()
    _, _, mod = _ours_and_theirs(_resize_model(dict(mode="linear"), scales=[1, 1, 0.5, 0.5]))
    assert "image.resize2d" not in mod.script() and "take" in mod.script()


def test_weights_of_every_tap_sum_to_one():
    for attrs in CASES:
        for length, scale in ((7, 1.5), (5, 0.6), (9, 0.3)):
            index, weights = source_weights(int(np.floor(np.float32(length) * np.float32(scale))), length, scale, attrs)
            assert index.min() >= 0 and index.max() < length
            np.testing.assert_allclose(weights.sum(1), 1.0, rtol=1e-12)


def test_torch_interpolate_with_a_scale_factor_compiles_and_matches_torch(tmp_path):
    """torch's interpolate(scale_factor=...) exports the factor as Resize scales; on odd sizes (a feature pyramid's
    halving of 15 rows) the output length is not in * scale, the case TVM computed wrong."""
    torch = pytest.importorskip("torch")
    import warnings

    import hetpart

    class Pyramid(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(4, 8, 3, padding=1)

        def forward(self, x):
            y = torch.relu(self.conv(x))
            down = torch.nn.functional.interpolate(y, scale_factor=0.5, mode="bilinear", align_corners=False)
            up = torch.nn.functional.interpolate(down, scale_factor=1.5, mode="nearest")
            return up.mean(dim=(2, 3)), down

    torch.manual_seed(0)
    module = Pyramid().eval()
    x = torch.randn(1, 4, 15, 11)
    path = tmp_path / "pyramid.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x,), str(path), dynamo=False, opset_version=17)
    compiled = hetpart.compile(str(path), devices="cpu,gpu=t4", method="all_gpu", pins={"op:relax.nn.conv2d": "cpu"})
    assert set(compiled.plan.device_of) == {"cpu", "gpu"}
    with torch.no_grad():
        expected = [t.numpy() for t in module(x)]
    for got, want in zip(compiled(x.numpy()), expected):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("scales,sizes", [([1, 1, 2, 1.5], None), ([1, 1, 0.6, 0.5], None), (None, [1, 2, 8, 4])])
def test_half_pixel_symmetric_matches_onnxruntime(mode, scales, sizes):
    """The opset-19 coordinate mode TVM's converter refused: half_pixel shifted to keep the output centred."""
    model = _resize_model(dict(mode=mode, coordinate_transformation_mode="half_pixel_symmetric"), scales=scales,
                          sizes=sizes)
    model.opset_import[0].version = 19
    ours, theirs, _ = _ours_and_theirs(model)
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attrs,scales,sizes", [
    (dict(mode="linear", axes=[2, 3]), [2.0, 1.5], None),
    (dict(mode="nearest", axes=[-1]), [0.5], None),
    (dict(mode="cubic", axes=[2]), None, [9]),
    (dict(mode="linear", axes=[3, 2]), None, [4, 8]),
    (dict(mode="linear", keep_aspect_ratio_policy="not_larger"), None, [1, 2, 9, 9]),
    (dict(mode="nearest", keep_aspect_ratio_policy="not_smaller", axes=[2, 3]), None, [9, 9]),
    (dict(mode="linear", keep_aspect_ratio_policy="not_smaller", axes=[2, 3],
          coordinate_transformation_mode="align_corners"), None, [3, 3]),
])
def test_opset18_axes_and_aspect_ratio_policies_match_onnxruntime(attrs, scales, sizes):
    """Resize's opset-18 ``axes`` and ``keep_aspect_ratio_policy``, which TVM's converter refused."""
    ours, theirs, _ = _ours_and_theirs(_resize_model(attrs, scales=scales, sizes=sizes))
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
