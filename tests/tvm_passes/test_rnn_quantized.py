"""onnxruntime's com.microsoft DynamicQuantizeLSTM (what quantize_dynamic writes for an LSTM): imported as the float
LSTM of its dequantized weights, equal to onnxruntime's run of that float LSTM, and within onnxruntime's own
activation-rounding distance of its integer kernel; per-channel and per-tensor weights, both directions, through
``hetpart.compile`` for cpu+gpu."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from tests.tvm_passes.onnx_numerics import cpu_outputs, onnxruntime_outputs
from tests.tvm_passes.rnn_models import build_rnn_model

pytestmark = pytest.mark.tvm
quantization = pytest.importorskip("onnxruntime.quantization")


def _quantized_lstm(tmp_path, per_channel: bool, direction: str = "forward"):
    model, feeds = build_rnn_model("LSTM", seq=6, batch=2, input_size=8, hidden=16, direction=direction, peephole=True)
    source, path = tmp_path / "lstm.onnx", tmp_path / f"lstm_dynamic_{per_channel}_{direction}.onnx"
    onnx.save(model, str(source))
    quantization.quantize_dynamic(str(source), str(path), weight_type=quantization.QuantType.QInt8,
                                  per_channel=per_channel)
    assert "DynamicQuantizeLSTM" in {n.op_type for n in onnx.load(str(path)).graph.node}
    return path, feeds


def _dequantized_float_model(path, tmp_path):
    """The quantized file with its DynamicQuantizeLSTM turned back into a float LSTM of the dequantized weights."""
    model = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type != "DynamicQuantizeLSTM":
            continue
        names = list(node.input) + [""] * (12 - len(node.input))
        floats = []
        for w, scale, zero in ((names[1], names[8], names[9]), (names[2], names[10], names[11])):
            q, s, z = inits[w].astype(np.float64), inits[scale], inits[zero]
            shape = (q.shape[0], 1, q.shape[2]) if s.size > 1 else (1, 1, 1)
            f = ((q - z.reshape(shape)) * s.reshape(shape)).transpose(0, 2, 1).astype(np.float32)
            model.graph.initializer.append(numpy_helper.from_array(f, f"{w}_float"))
            floats.append(f"{w}_float")
        node.op_type, node.domain = "LSTM", ""
        del node.input[8:]
        node.input[1], node.input[2] = floats
    out = tmp_path / "dequantized.onnx"
    onnx.save(model, str(out))
    return out


@pytest.mark.parametrize("per_channel,direction", [(True, "forward"), (False, "forward"), (True, "bidirectional")])
def test_equals_the_float_lstm_of_its_dequantized_weights(tmp_path, per_channel, direction):
    path, feeds = _quantized_lstm(tmp_path, per_channel, direction)
    got = cpu_outputs(path, feeds)
    for g, e in zip(got, onnxruntime_outputs(_dequantized_float_model(path, tmp_path), feeds)):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)
    # onnxruntime's integer kernel rounds the input and hidden state to uint8 at every step
    for g, e in zip(got, onnxruntime_outputs(path, feeds)):
        assert np.abs(g - e).max() <= 0.02 * np.abs(e).max()     # measured 0.4-0.5%


def test_compiles_for_cpu_and_gpu(tmp_path):
    import hetpart

    path, feeds = _quantized_lstm(tmp_path, per_channel=True)
    expected = ort.InferenceSession(str(_dequantized_float_model(path, tmp_path)),
                                    providers=["CPUExecutionProvider"]).run(None, feeds)
    compiled = hetpart.compile(path, devices="cpu,gpu=p2200")
    for got, want in zip(compiled(**feeds), expected):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
