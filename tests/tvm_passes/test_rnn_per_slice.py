"""Input projections per time slice: exact against onnxruntime, and slice s of a layer reads slice s below only."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from tvm import relax

from hetpart.errors import UsageError
from hetpart.partition.slices import parse_rnn_tag
from tvm_passes.rnn import RnnImportOptions, install_onnx_rnn_converters, rnn_import_options

from .rnn_models import build_rnn_model, onnxruntime_reference

pytestmark = pytest.mark.tvm
TOLERANCE = 1e-4


@pytest.fixture(autouse=True, scope="module")
def _converters():
    install_onnx_rnn_converters()


def _import(model: onnx.ModelProto, options: RnnImportOptions | None) -> tvm.IRModule:
    with rnn_import_options(options):
        return relax.frontend.onnx.from_onnx(model, keep_params_in_input=False)


def _bindings(mod: tvm.IRModule):
    for block in mod["main"].body.blocks:
        yield from block.bindings


CASES = [
    ("LSTM", 2, dict(seq=5, num_layers=2)),
    ("LSTM", 4, dict(seq=6, num_layers=2, direction="bidirectional", peephole=True)),
    ("LSTM", 1, dict(seq=3, layout=1, num_layers=2, with_initial=False)),
    ("GRU", 3, dict(seq=7, num_layers=2, direction="bidirectional", layout=1, linear_before_reset=1)),
    ("GRU", 2, dict(seq=4, num_layers=3, direction="reverse", linear_before_reset=0)),
    ("GRU", 8, dict(seq=5, num_layers=2)),
    ("RNN", 1, dict(seq=4, num_layers=3, direction="reverse")),
    ("RNN", 3, dict(seq=5, num_layers=2, layout=1, with_bias=False)),
]


@pytest.mark.parametrize("op_type,slice_steps,kwargs", CASES,
                         ids=[f"{op}-k{k}-{'-'.join(f'{a}={b}' for a, b in kw.items())}" for op, k, kw in CASES])
def test_per_slice_projection_matches_onnxruntime(op_type, slice_steps, kwargs):
    model, feeds, expected = onnxruntime_reference(op_type, **kwargs)
    mod, params = relax.frontend.detach_params(_import(model, RnnImportOptions("per_slice", slice_steps)))
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(feeds[i.name]) for i in model.graph.input], *params.get("main", []))
    got = [o.numpy() for o in out]
    assert len(got) == len(expected)
    for name, g, e in zip([o.name for o in model.graph.output], got, expected):
        assert g.shape == e.shape, name
        np.testing.assert_allclose(g, e, rtol=TOLERANCE, atol=TOLERANCE, err_msg=name)


def _producers(mod: tvm.IRModule) -> dict[str, set[str]]:
    """Per bound var: every tagged var it depends on, transitively."""
    deps: dict[str, set[str]] = {}
    for binding in _bindings(mod):
        found: set[str] = set()
        for var in relax.analysis.free_vars(binding.value):
            found |= {var.name} | deps.get(var.name, set())
        deps[binding.var.name] = found
    return deps


def test_slice_s_of_a_layer_reads_slice_s_of_the_layer_below_only():
    seq, k = 6, 2
    model, _ = build_rnn_model("LSTM", seq=seq, num_layers=2)
    mod = _import(model, RnnImportOptions("per_slice", k))
    deps = _producers(mod)
    projections = [b.var.name for b in _bindings(mod) if b.var.name.startswith("rnn1_d0_p")
                   and b.var.name.endswith("_xproj")]
    assert [parse_rnn_tag(n)["rnn_step"] for n in projections] == [0, 2, 4]
    for name in projections:
        first = parse_rnn_tag(name)["rnn_step"]
        below = {parse_rnn_tag(v)["rnn_step"] for v in deps[name]
                 if parse_rnn_tag(v) and parse_rnn_tag(v)["rnn_layer"] == 0 and parse_rnn_tag(v)["rnn_phase"] == "step"}
        assert below == set(range(first + k)), name          # steps of the slice and the recurrence before them
        assert not any(v.startswith("rnn0_d0_out") for v in deps[name])
    matmuls = [b for b in _bindings(mod) if isinstance(b.value, relax.Call) and b.value.op.name == "relax.matmul"]
    assert sum(1 for b in matmuls if "_p" in b.var.name) == 2 * seq // k


def test_default_is_the_hoisted_projection_and_options_are_checked():
    model, _ = build_rnn_model("GRU", seq=4, num_layers=2)
    names = [b.var.name for b in _bindings(_import(model, None))]
    assert names == [b.var.name for b in _bindings(_import(model, RnnImportOptions()))]
    assert not any(parse_rnn_tag(n) and "_p" in n.split("_")[2] for n in names)
    with pytest.raises(UsageError, match="input_projection"):
        RnnImportOptions("sliced")
    with pytest.raises(UsageError, match="slice_steps"):
        RnnImportOptions("per_slice", 0)


def test_the_frontend_passes_the_options_and_hashes_them(tmp_path):
    from tvm_passes.frontend import import_model

    model, _ = build_rnn_model("RNN", seq=4, num_layers=2, with_initial=False)
    path = tmp_path / "rnn.onnx"
    onnx.save(model, str(path))
    default = import_model(path, pad_columns=False)
    sliced = import_model(path, pad_columns=False, rnn_options=RnnImportOptions("per_slice", 2))
    assert default.source_hash == import_model(path, pad_columns=False,
                                               rnn_options=RnnImportOptions()).source_hash
    assert sliced.source_hash != default.source_hash
    assert any("_p2_" in b.var.name for b in _bindings(sliced.mod))
    assert not any("_p2_" in b.var.name for b in _bindings(default.mod))
