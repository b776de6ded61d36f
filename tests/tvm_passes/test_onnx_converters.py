"""hetpart's converters for ONNX ops TVM 0.27 lacks (STFT, DFT, ReverseSequence, Celu, LpNormalization): numerics
against onnxruntime, typed errors, idempotent registration, and an exported torch STFT front end end to end."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend

from hetpart.errors import UnsupportedOpError
from tvm_passes.onnx_converters import CONVERTED_OP_TYPES, install_onnx_converters
from tvm_passes.rnn import install_onnx_rnn_converters

pytestmark = pytest.mark.tvm


@pytest.fixture(autouse=True, scope="module")
def _converters():
    install_onnx_converters()


def _model(node: onnx.NodeProto, inputs: dict[str, np.ndarray], initializers: dict[str, np.ndarray],
           opset: int) -> onnx.ModelProto:
    graph = helper.make_graph(
        [node], node.op_type.lower(),
        [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for name, v in inputs.items()],
        [helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, name) for name, v in initializers.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _assert_matches_onnxruntime(node, inputs, initializers=None, opset=17, rtol=1e-4, atol=1e-4):
    model = _model(node, inputs, initializers or {}, opset)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)[0]
    mod, params = relax.frontend.detach_params(relax.frontend.onnx.from_onnx(model))
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(v) for v in inputs.values()]).numpy()
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol * max(1.0, float(np.abs(expected).max())))


RNG = np.random.default_rng(0)


def _hann(n: int) -> np.ndarray:
    return (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / n)).astype(np.float32)


@pytest.mark.parametrize("case", ["window_onesided", "window_full", "frame_length_only", "complex",
                                  "window_and_frame_length", "signal_without_channel_axis"])
def test_stft_matches_onnxruntime(case):
    shape = (2, 1000) if case == "signal_without_channel_axis" else (2, 1000, 2 if case == "complex" else 1)
    signal = RNG.standard_normal(shape).astype(np.float32)
    inits = {"step": np.array(96, np.int64)}
    names = ["signal", "step"]
    if case != "frame_length_only":
        inits["window"] = _hann(256)
        names.append("window")
    if case in ("frame_length_only", "window_and_frame_length"):
        inits["length"] = np.array(256, np.int64)
        names += [""] * (3 - len(names)) + ["length"]
    onesided = 0 if case in ("window_full", "complex") else 1
    node = helper.make_node("STFT", names, ["y"], onesided=onesided)
    _assert_matches_onnxruntime(node, {"signal": signal}, inits)


@pytest.mark.parametrize("opset,attrs,shape,length,axis", [
    (17, {"axis": 1, "onesided": 1}, (2, 64, 1), None, None),
    (17, {"axis": 1}, (3, 50, 2), None, None),
    (17, {"axis": 1, "inverse": 1}, (3, 50, 2), None, None),
    (17, {"axis": 2}, (2, 5, 40, 1), 48, None),                 # zero-padded to 48
    (17, {"axis": 1}, (2, 40, 3, 2), 32, None),                 # cut to 32, a batch axis after the signal axis
    (20, {}, (2, 5, 40, 2), None, None),                        # the default axis -2
    (20, {"onesided": 1}, (2, 30, 4, 1), None, 1),
])
def test_dft_matches_onnxruntime(opset, attrs, shape, length, axis):
    x = RNG.standard_normal(shape).astype(np.float32)
    inits, names = {}, ["x"]
    if length is not None or axis is not None:
        names.append("length" if length is not None else "")
        if length is not None:
            inits["length"] = np.array(length, np.int64)
    if axis is not None:
        names.append("axis")
        inits["axis"] = np.array(axis, np.int64)
    _assert_matches_onnxruntime(helper.make_node("DFT", names, ["y"], **attrs), {"x": x}, inits, opset=opset)


@pytest.mark.parametrize("time_axis,shape", [(0, (6, 3, 4)), (1, (3, 6, 4, 2)), (0, (5, 2))])
def test_reverse_sequence_matches_onnxruntime(time_axis, shape):
    x = RNG.standard_normal(shape).astype(np.float32)
    batch = shape[1 - time_axis]
    lens = np.array([shape[time_axis], 1, 3][:batch], np.int64)
    node = helper.make_node("ReverseSequence", ["x", "lens"], ["y"], time_axis=time_axis, batch_axis=1 - time_axis)
    _assert_matches_onnxruntime(node, {"x": x, "lens": lens}, rtol=0, atol=0)


@pytest.mark.parametrize("op_type,attrs", [("Celu", {}), ("Celu", {"alpha": 0.5}),
                                           ("LpNormalization", {"p": 2, "axis": 1}),
                                           ("LpNormalization", {"p": 1, "axis": -1})])
def test_elementwise_and_normalization_match_onnxruntime(op_type, attrs):
    x = (RNG.standard_normal((2, 7, 5)) * 2).astype(np.float32)
    _assert_matches_onnxruntime(helper.make_node(op_type, ["x"], ["y"], **attrs), {"x": x}, opset=17)


def test_what_sets_a_shape_must_be_a_constant():
    signal = np.zeros((1, 500, 1), np.float32)
    node = helper.make_node("STFT", ["signal", "step", "window"], ["y"], name="spec")
    model = _model(node, {"signal": signal, "step": np.array(64, np.int64)}, {"window": _hann(128)}, 17)
    with pytest.raises(UnsupportedOpError, match="STFT node 'spec': frame_step must be a constant scalar"):
        relax.frontend.onnx.from_onnx(model)
    node = helper.make_node("STFT", ["signal", "step", "window"], ["y"], name="spec")
    model = _model(node, {"signal": np.zeros((1, 500, 2), np.float32)},
                   {"step": np.array(64, np.int64), "window": _hann(128)}, 17)
    with pytest.raises(UnsupportedOpError, match="onesided=1 takes a real signal"):
        relax.frontend.onnx.from_onnx(model)


def test_registration_is_idempotent_with_the_rnn_converters():
    install_onnx_rnn_converters()
    for _ in range(3):
        install_onnx_converters()
        install_onnx_rnn_converters()
    wrapper = onnx_frontend._get_convert_map
    assert {"rnn", "converters"} <= wrapper._hetpart_installed
    convert_map = wrapper()
    assert all(op in convert_map for op in (*CONVERTED_OP_TYPES, "LSTM", "GRU", "RNN"))
    install_onnx_converters()
    assert onnx_frontend._get_convert_map is wrapper, "a second install wraps nothing more"


def test_torch_stft_front_end_compiles_and_matches_torch(tmp_path):
    """torch.stft(return_complex=False), as older audio code writes it, exports to ONNX STFT (TorchScript
    exporter, opset 17); a log-power spectrogram and a conv head on it compile for a CPU and an emulated GPU."""
    torch = pytest.importorskip("torch")
    import warnings

    import hetpart

    class Spectrogram(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("window", torch.hann_window(400))
            self.conv = torch.nn.Conv1d(201, 32, 3, padding=1)

        def forward(self, wave):
            spec = torch.stft(wave, n_fft=400, hop_length=160, window=self.window, center=False,
                              return_complex=False)
            power = torch.log(spec.pow(2).sum(-1) + 1e-6)
            return torch.relu(self.conv(power))

    torch.manual_seed(0)
    module = Spectrogram().eval()
    wave = torch.randn(2, 4000)
    path = tmp_path / "spectrogram.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (wave,), str(path), dynamo=False, opset_version=17)
    assert "STFT" in {n.op_type for n in onnx.load(str(path)).graph.node}
    compiled = hetpart.compile(str(path), devices="cpu,gpu=t4", method="all_gpu", pins={"op:relax.matmul": "cpu"})
    assert set(compiled.plan.device_of) == {"cpu", "gpu"}
    with torch.no_grad():
        expected = module(wave).numpy()
    np.testing.assert_allclose(compiled(wave.numpy())[0], expected, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("scales,antialias,refused", [([1, 1, 0.5, 0.5], 1, True), ([1, 1, 2, 1.5], 1, False),
                                                      ([1, 1, 0.5, 0.5], 0, False)])
def test_resize_antialias_that_tvm_would_ignore_is_refused(scales, antialias, refused):
    """TVM's resize ignores antialias, which changes a shrinking resize (torch's interpolate(antialias=True)):
    refused there, and left to TVM where it changes nothing (growing) or is off."""
    x = RNG.standard_normal((1, 2, 8, 8)).astype(np.float32)
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear", antialias=antialias, name="rs")
    inits = {"scales": np.array(scales, np.float32)}
    if refused:
        with pytest.raises(UnsupportedOpError, match="Resize node 'rs': antialias=1 on a resize that shrinks"):
            relax.frontend.onnx.from_onnx(_model(node, {"x": x}, inits, 18))
    else:
        _assert_matches_onnxruntime(node, {"x": x}, inits, opset=18)


@pytest.mark.parametrize("attrs,shape", [
    (dict(kernel_shape=[2, 2], strides=[2, 2]), (2, 3, 8, 8)),
    (dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), (1, 2, 9, 7)),
    (dict(kernel_shape=[3, 2], strides=[2, 2], ceil_mode=1), (1, 2, 8, 7)),
    (dict(kernel_shape=[2, 2], strides=[1, 1], dilations=[2, 2]), (1, 2, 7, 7)),
    (dict(kernel_shape=[2, 2], strides=[2, 2], storage_order=1), (1, 2, 6, 4)),
])
def test_max_pool_indices_match_onnxruntime(attrs, shape):
    """MaxPool's second output (SegNet-style unpooling): TVM's converter has none. Ties included (rounded
    inputs): the first maximum in the window, as onnxruntime picks it."""
    x = np.round(RNG.standard_normal(shape) * 2).astype(np.float32)
    node = helper.make_node("MaxPool", ["x"], ["y", "indices"], **attrs)
    graph = helper.make_graph([node], "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("indices", TensorProto.INT64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)], ir_version=10)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    mod, _ = relax.frontend.detach_params(relax.frontend.onnx.from_onnx(model))
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    values, indices = (t.numpy() for t in vm["main"](tvm.runtime.tensor(x)))
    np.testing.assert_array_equal(values, expected[0])
    np.testing.assert_array_equal(indices, expected[1])


def test_segnet_style_unpooling_compiles_and_matches_onnxruntime(tmp_path):
    import hetpart

    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["c"], ["p", "i"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Relu", ["p"], ["r"]),
             helper.make_node("MaxUnpool", ["r", "i"], ["u"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["u", "w2"], ["y"], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "segnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])],
                              [numpy_helper.from_array(RNG.standard_normal((8, 3, 3, 3)).astype(np.float32), "w"),
                               numpy_helper.from_array(RNG.standard_normal((4, 8, 3, 3)).astype(np.float32), "w2")])
    path = tmp_path / "segnet.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)], ir_version=10), str(path))
    compiled = hetpart.compile(str(path), devices="cpu,gpu=t4", method="all_gpu", pins={"op:relax.nn.conv2d": "cpu"})
    x = RNG.standard_normal((1, 3, 16, 16)).astype(np.float32)
    (expected,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(compiled(x)[0], expected, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("image,block,attrs", [
    ((5, 5), (2, 2), {}),                                                        # overlapping, stride 1
    ((8, 6), (3, 2), {"strides": [2, 2], "pads": [1, 0, 1, 1]}),
    ((9, 9), (3, 3), {"dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    ((7, 6), (3, 3), {"strides": [2, 3]}),                                       # a last partial stride
    ((4, 4), (2, 2), {"strides": [2, 2]}),                                       # disjoint blocks
])
def test_col2im_matches_onnxruntime(image, block, attrs):
    spans = [d * (k - 1) + 1 for d, k in zip(attrs.get("dilations", [1, 1]), block)]
    pads, strides = attrs.get("pads", [0, 0, 0, 0]), attrs.get("strides", [1, 1])
    positions = np.prod([(image[a] + pads[a] + pads[a + 2] - spans[a]) // strides[a] + 1 for a in range(2)])
    x = RNG.standard_normal((2, 3 * block[0] * block[1], int(positions))).astype(np.float32)
    node = helper.make_node("Col2Im", ["x", "image", "block"], ["y"], **attrs)
    _assert_matches_onnxruntime(node, {"x": x}, {"image": np.array(image, np.int64),
                                                 "block": np.array(block, np.int64)}, opset=18)


def test_torch_fold_compiles_and_matches_torch(tmp_path):
    """nn.Unfold -> a linear map of each patch -> nn.Fold (a tokens-to-token step; torch exports Fold as Col2Im at
    opset 18), compiled for a CPU and an emulated GPU."""
    torch = pytest.importorskip("torch")
    import warnings

    import hetpart

    class Refold(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.unfold = torch.nn.Unfold(3, padding=1, stride=2)
            self.mix = torch.nn.Linear(8 * 9, 8 * 9)
            self.fold = torch.nn.Fold((15, 15), 3, padding=1, stride=2)

        def forward(self, x):
            return self.fold(self.mix(self.unfold(x).transpose(1, 2)).transpose(1, 2))

    torch.manual_seed(0)
    module = Refold().eval()
    x = torch.randn(1, 8, 15, 15)
    path = tmp_path / "refold.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x,), str(path), dynamo=False, opset_version=18)
    assert "Col2Im" in {n.op_type for n in onnx.load(str(path)).graph.node}
    compiled = hetpart.compile(str(path), devices="cpu,gpu=t4", method="all_gpu", pins={"op:relax.matmul": "cpu"})
    assert set(compiled.plan.device_of) == {"cpu", "gpu"}
    with torch.no_grad():
        expected = module(x).numpy()
    np.testing.assert_allclose(compiled(x.numpy())[0], expected, rtol=1e-4, atol=1e-4)
