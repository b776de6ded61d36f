"""Recurrent models over sequences of different lengths in one batch, as torch exports them
(``pack_padded_sequence``: ONNX LSTM/GRU nodes whose ``sequence_lens`` is computed from an input), compiled for a
CPU and an emulated GPU and checked against torch itself."""
from __future__ import annotations

import logging

import numpy as np
import pytest

import hetpart
from hetpart.driver.check import integer_input_ranges, sample_inputs

pytestmark = pytest.mark.tvm


def _packed_model(torch, cell: str):
    class Packed(torch.nn.Module):
        """A bidirectional 2-layer recurrent encoder over padded sequences of the lengths given, and a linear head
        on every step (zero beyond each sequence's end, as pad_packed_sequence pads)."""

        def __init__(self):
            super().__init__()
            rnn = {"LSTM": torch.nn.LSTM, "GRU": torch.nn.GRU}[cell]
            self.rnn = rnn(8, 16, num_layers=2, bidirectional=True)
            self.head = torch.nn.Linear(32, 5)

        def forward(self, x, lengths):
            packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
            out, state = self.rnn(packed)
            padded, _ = torch.nn.utils.rnn.pad_packed_sequence(out, total_length=x.shape[0])
            return self.head(padded), (state[0] if isinstance(state, tuple) else state)

    torch.manual_seed(0)
    return Packed().eval()


def _export(torch, module, example_inputs, path):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # the exporter's notes on pack/pad shape inference
        torch.onnx.export(module, example_inputs, str(path), dynamo=False, opset_version=17,
                          input_names=["x", "lengths"])
    return path


@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
def test_packed_sequences_compile_and_match_torch(cell, tmp_path, caplog):
    torch = pytest.importorskip("torch")
    module = _packed_model(torch, cell)
    path = _export(torch, module, (torch.randn(10, 3, 8), torch.tensor([10, 6, 2])), tmp_path / "packed.onnx")
    with caplog.at_level(logging.WARNING):
        compiled = hetpart.compile(str(path), devices="cpu,gpu=t4", method="all_gpu",
                                   pins={"op:relax.matmul": "cpu"})
    assert set(compiled.plan.device_of) == {"cpu", "gpu"}
    assert not [r.getMessage() for r in caplog.records if r.name.startswith("tvm")], \
        "TVM's scatter kernels warn of nothing"
    rng = np.random.default_rng(1)
    for lens in ([10, 6, 2], [1, 10, 7], [10, 10, 10], [3, 3, 1]):
        x = rng.standard_normal((10, 3, 8)).astype(np.float32)
        lens_array = np.asarray(lens, np.int64)
        with torch.no_grad():
            expected = [t.numpy() for t in module(torch.from_numpy(x), torch.from_numpy(lens_array))]
        got = compiled(x, lens_array)
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, atol=2e-5, err_msg=f"lengths {lens}")
        beyond = np.arange(10)[:, None] >= lens_array[None, :]        # [time, batch]: past the sequence's end
        np.testing.assert_allclose(got[0][beyond], np.broadcast_to(module.head.bias.detach().numpy(),
                                                                   got[0][beyond].shape), atol=1e-6)
    # `hetpart run --check` draws the lengths from [0, 10], not only 0 and 1
    assert integer_input_ranges(compiled.op_graph) == {"lengths": (0, 11)}
    drawn = sample_inputs(compiled.build.manifest.inputs, compiled.op_graph)["lengths"]
    assert drawn.dtype == np.int64 and drawn.min() >= 0 and drawn.max() <= 10 and drawn.max() > 1


def test_a_module_torch_export_cannot_trace_gets_the_onnx_route():
    torch = pytest.importorskip("torch")
    from hetpart.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match=r"torch.export could not trace Packed: .*torch.onnx.export\(module, "
                                             r"example_inputs, 'model.onnx', dynamo=False\)") as info:
        hetpart.compile(_packed_model(torch, "GRU"), example_inputs=(torch.randn(4, 2, 8), torch.tensor([4, 2])))
    assert "\n" not in str(info.value)
