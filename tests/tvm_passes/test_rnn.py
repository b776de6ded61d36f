"""Unrolled ONNX LSTM/GRU/RNN converters: numerics vs onnxruntime, per-step tags, unsupported attributes."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import tvm
from onnx import TensorProto, helper
from tvm import relax

from hetpart.errors import UnsupportedOpError
from tvm_passes.rnn import (RNN_OP_TYPES, find_unsupported_rnn_nodes, install_onnx_rnn_converters,
                            parse_rnn_tag)

from .rnn_models import build_rnn_model, onnxruntime_reference

pytestmark = pytest.mark.tvm
TOLERANCE = 1e-5


@pytest.fixture(autouse=True, scope="module")
def _converters():
    install_onnx_rnn_converters()


def _import(model: onnx.ModelProto, keep_params: bool = False) -> tvm.IRModule:
    return relax.frontend.onnx.from_onnx(model, keep_params_in_input=keep_params)


def _run_tvm(model: onnx.ModelProto, feeds: dict[str, np.ndarray], keep_params: bool = False) -> list[np.ndarray]:
    mod, params = relax.frontend.detach_params(_import(model, keep_params))
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    args = [tvm.runtime.tensor(feeds[i.name]) for i in model.graph.input] + params.get("main", [])
    out = vm["main"](*args)
    return [o.numpy() for o in out] if isinstance(out, (list, tuple)) or hasattr(out, "__len__") \
        else [out.numpy()]


def _assert_matches_onnxruntime(op_type: str, keep_params: bool = False, **kwargs) -> None:
    model, feeds, expected = onnxruntime_reference(op_type, **kwargs)
    got = _run_tvm(model, feeds, keep_params)
    assert len(got) == len(expected)
    for name, g, e in zip([o.name for o in model.graph.output], got, expected):
        assert g.shape == e.shape, f"{name}: shape {g.shape} != onnxruntime {e.shape}"
        err = float(np.abs(g - e).max())
        assert err <= TOLERANCE, f"{name}: max |tvm - onnxruntime| = {err:.2e}"


DEFAULT_LSTM_ACTS = {"activations": ["Sigmoid", "Tanh", "Tanh"] * 2}

# (op_type, kwargs): 1- and 2-layer, every direction, both layouts, seq 1/3/7, with/without states and biases.
NUMERIC_CASES = [
    ("LSTM", dict(seq=1)),
    ("LSTM", dict(seq=3, num_layers=2, direction="bidirectional", layout=1, peephole=True)),
    ("LSTM", dict(seq=7, num_layers=2, direction="reverse", with_bias=False, with_initial=False)),
    ("LSTM", dict(seq=3, direction="bidirectional", sequence_lens=[3, 3], extra_attrs=DEFAULT_LSTM_ACTS)),
    ("GRU", dict(seq=7, num_layers=2, direction="bidirectional", linear_before_reset=0)),
    ("GRU", dict(seq=3, direction="reverse", layout=1, linear_before_reset=1, with_bias=False,
                 with_initial=False)),
    ("GRU", dict(seq=1, layout=1, linear_before_reset=0, with_initial=False)),
    ("GRU", dict(seq=7, num_layers=2, linear_before_reset=1)),
    ("RNN", dict(seq=3, num_layers=2, direction="bidirectional", layout=1)),
    ("RNN", dict(seq=7, direction="reverse", with_bias=False)),
    ("RNN", dict(seq=1, with_initial=False, sequence_lens=[1, 1], extra_attrs={"activations": ["Tanh"]})),
]


@pytest.mark.parametrize("op_type,kwargs", NUMERIC_CASES,
                         ids=[f"{op}-{'-'.join(f'{k}={v}' for k, v in kw.items() if k != 'extra_attrs')}"
                              for op, kw in NUMERIC_CASES])
def test_matches_onnxruntime(op_type, kwargs):
    _assert_matches_onnxruntime(op_type, **kwargs)


@pytest.mark.parametrize("op_type,kwargs", [
    ("LSTM", dict(direction="bidirectional", layout=1, peephole=True, sequence_lens=[3, 3])),
    ("GRU", dict(direction="bidirectional", linear_before_reset=0)),
    ("GRU", dict(direction="reverse", layout=1, linear_before_reset=1)),
    ("RNN", dict(direction="bidirectional")),
])
def test_weights_kept_as_function_inputs(op_type, kwargs):
    """keep_params_in_input=True turns W/R/B/P into Vars: weight slicing is then emitted as tagged ops."""
    _assert_matches_onnxruntime(op_type, keep_params=True, seq=3, **kwargs)


def _bindings(mod: tvm.IRModule):
    for block in mod["main"].body.blocks:
        yield from block.bindings


def _is_op(value) -> bool:
    return isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)


@pytest.mark.parametrize("keep_params", [False, True])
def test_every_op_binding_of_an_unrolled_model_is_tagged(keep_params):
    seq = 4
    model, _ = build_rnn_model("LSTM", seq=seq, direction="bidirectional", peephole=True, layout=1)
    tags = {}
    bindings = list(_bindings(_import(model, keep_params)))
    tagged_names = [b.var.name for b in bindings if parse_rnn_tag(b.var.name)]
    assert len(tagged_names) == len(set(tagged_names)), "tag names must be unique"
    for binding in bindings:
        tag = parse_rnn_tag(binding.var.name)
        if _is_op(binding.value):
            assert tag is not None, f"op binding {binding.var.name} = {binding.value.op.name} has no rnn tag"
        if tag is not None:
            tags[binding.var] = (tag, binding.value)
    steps = {}
    for tag, value in tags.values():
        assert tag["rnn_layer"] == 0
        steps.setdefault((tag["rnn_direction"], tag["rnn_phase"]), set()).add(tag["rnn_step"])
    assert steps[(0, "step")] == steps[(1, "step")] == set(range(seq))
    assert steps[(0, "input_projection")] == steps[(1, "input_projection")] == {-1}
    assert (-1, "output") in steps  # the bidirectional Y/Y_h/Y_c stack spans both directions
    # The input projection is hoisted: one matmul per direction over all steps, one h @ R^T per step.
    matmuls = [tag for tag, value in tags.values() if _is_op(value) and value.op.name == "relax.matmul"]
    assert sum(t["rnn_phase"] == "input_projection" for t in matmuls) == 2
    assert sum(t["rnn_phase"] == "step" for t in matmuls) == 2 * seq
    # Step T of a direction reads only its own step, step T-1 of the same direction, or the prologue.
    for tag, value in tags.values():
        if tag["rnn_phase"] != "step":
            continue
        for used in relax.analysis.free_vars(value):
            if used in tags:
                src = tags[used][0]
                assert src["rnn_direction"] == tag["rnn_direction"]
                assert src["rnn_phase"] == "input_projection" or \
                    src["rnn_step"] in (tag["rnn_step"], tag["rnn_step"] - 1), (tag, src)


def test_layer_index_follows_node_order_and_restarts_per_import():
    model, _ = build_rnn_model("GRU", seq=2, num_layers=2)
    names = [[b.var.name for b in _bindings(_import(model))] for _ in range(2)]
    assert names[0] == names[1]
    layers = [parse_rnn_tag(n)["rnn_layer"] for n in names[0] if parse_rnn_tag(n)]
    assert layers == sorted(layers) and set(layers) == {0, 1}
    untagged_ops = [b.value.op.name for b in _bindings(_import(model)) if _is_op(b.value)
                    and parse_rnn_tag(b.var.name) is None]
    assert untagged_ops == ["relax.permute_dims", "relax.reshape"]  # the Transpose+Reshape between layers


def test_parse_rnn_tag():
    assert parse_rnn_tag("rnn2_d1_t13_gates") == {"rnn_layer": 2, "rnn_direction": 1, "rnn_step": 13,
                                                  "rnn_phase": "step"}
    assert parse_rnn_tag("rnn0_d0_in_xproj") == {"rnn_layer": 0, "rnn_direction": 0, "rnn_step": -1,
                                                 "rnn_phase": "input_projection"}
    assert parse_rnn_tag("rnn3_dall_out_Y") == {"rnn_layer": 3, "rnn_direction": -1, "rnn_step": -1,
                                                "rnn_phase": "output"}
    for name in ("lv12", "conv1", "rnn_d0_t1_h", "rnn0_d0_t_h", "rnn0_dx_t1_h", "xrnn0_d0_t1_h"):
        assert parse_rnn_tag(name) is None, name


def test_install_is_idempotent():
    from tvm.relax.frontend.onnx import onnx_frontend

    install_onnx_rnn_converters()
    patched = onnx_frontend._get_convert_map
    install_onnx_rnn_converters()
    assert onnx_frontend._get_convert_map is patched
    assert all(op in patched() for op in RNN_OP_TYPES)


# activations and clip as other exporters write them: torch's nn.RNN(nonlinearity="relu"), Keras LSTMs with a
# hard-sigmoid recurrent activation (tf2onnx), and every other ONNX activation with and without its parameters
ACTIVATION_CASES = [
    ("RNN", dict(seq=5, extra_attrs={"activations": ["Relu"]})),
    ("RNN", dict(seq=4, direction="bidirectional", extra_attrs={"activations": ["Relu", "Tanh"]})),
    ("LSTM", dict(seq=5, extra_attrs={"activations": ["HardSigmoid", "Tanh", "Tanh"]})),
    ("LSTM", dict(seq=4, direction="bidirectional", peephole=True,
                  extra_attrs={"activations": ["HardSigmoid", "Tanh", "Softsign", "Sigmoid", "Elu", "Tanh"],
                               "activation_alpha": [0.3, 0.7], "activation_beta": [0.4]})),
    ("GRU", dict(seq=5, linear_before_reset=1, extra_attrs={"activations": ["Sigmoid", "LeakyRelu"],
                                                            "activation_alpha": [0.2]})),
    ("GRU", dict(seq=4, extra_attrs={"activations": ["HardSigmoid", "ScaledTanh"],
                                     "activation_alpha": [0.25, 1.5], "activation_beta": [0.45, 0.8]})),
    ("RNN", dict(seq=4, num_layers=2, extra_attrs={"activations": ["Affine"], "activation_alpha": [0.5],
                                                   "activation_beta": [0.1]})),
    ("RNN", dict(seq=4, extra_attrs={"activations": ["ThresholdedRelu"], "activation_alpha": [0.1]})),
    ("RNN", dict(seq=4, extra_attrs={"activations": ["Softplus"]})),
    ("LSTM", dict(seq=6, num_layers=2, extra_attrs={"clip": 0.4}, weight_range=1.5)),
    ("GRU", dict(seq=6, linear_before_reset=0, extra_attrs={"clip": 0.3}, weight_range=1.5)),
    ("RNN", dict(seq=6, extra_attrs={"clip": 0.5, "activations": ["Relu"]}, weight_range=1.5)),
    # input_forget couples the gates, f = 1 - i (the forget gate's weights and peephole go unused)
    ("LSTM", dict(seq=4, direction="bidirectional", peephole=True, sequence_lens=[4, 2],
                  extra_attrs={"input_forget": 1})),
]


@pytest.mark.parametrize("op_type,kwargs", ACTIVATION_CASES,
                         ids=[f"{t}-{'-'.join(map(str, k['extra_attrs'].get('activations', ['clip'])))}-{i}"
                              for i, (t, k) in enumerate(ACTIVATION_CASES)])
def test_activations_and_clip_match_onnxruntime(op_type, kwargs):
    model, _ = build_rnn_model(op_type, **kwargs)
    assert find_unsupported_rnn_nodes(model) == []
    _assert_matches_onnxruntime(op_type, **kwargs)


@pytest.mark.parametrize("op_type,extra,expected", [
    ("LSTM", {"clip": 0.0}, r"LSTM node 'lstm_0': clip=0.0 must be a positive threshold"),
    ("LSTM", {"input_forget": 2}, r"LSTM node 'lstm_0': input_forget=2 is not valid; supported: 0 or 1"),
    ("GRU", {"activations": ["Sigmoid", "Swish"]}, r"GRU node 'gru_0': activations \['swish'\] are not ONNX "
                                                   r"RNN activations; supported: \['affine'"),
    ("RNN", {"activations": ["Relu", "Tanh"]}, r"RNN node 'rnn_0': 2 activations given, but a RNN with 1 "
                                               r"direction\(s\) takes 1"),
])
def test_unsupported_attributes_raise(op_type, extra, expected):
    model, _ = build_rnn_model(op_type, seq=2, extra_attrs=extra)
    with pytest.raises(UnsupportedOpError, match=expected):
        _import(model)
    assert len(find_unsupported_rnn_nodes(model)) == 1


def _lengths_as_input(model: onnx.ModelProto, feeds: dict, lens: list[int], dtype=TensorProto.INT32) -> None:
    """Turn every layer's constant ``seq_lens`` initializer into a graph input fed ``lens``."""
    for tensor in [t for t in model.graph.initializer if t.name.startswith("seq_lens")]:
        model.graph.initializer.remove(tensor)
        model.graph.input.append(helper.make_tensor_value_info(tensor.name, dtype, [len(lens)]))
        feeds[tensor.name] = np.asarray(lens, onnx.helper.tensor_dtype_to_np_dtype(dtype))


# (op_type, kwargs, lengths): every cell, direction and layout; lengths shorter than the sequence, full, and 0 (the
# final states of an empty sequence are zero in onnxruntime, not the initial ones)
LENGTH_CASES = [
    ("LSTM", dict(direction="bidirectional", peephole=True), [5, 2, 0]),
    ("LSTM", dict(num_layers=2, direction="reverse", layout=1), [1, 5, 3]),
    ("GRU", dict(direction="bidirectional", linear_before_reset=1), [4, 5, 1]),
    ("GRU", dict(num_layers=2, linear_before_reset=0, with_initial=False), [0, 3, 5]),
    ("RNN", dict(direction="reverse"), [2, 2, 5]),
    ("RNN", dict(num_layers=2, direction="bidirectional", layout=1), [5, 0, 4]),
]


@pytest.mark.parametrize("op_type,kwargs,lens", LENGTH_CASES,
                         ids=[f"{op}-{'-'.join(f'{k}={v}' for k, v in kw.items())}-lens={lens}"
                              for op, kw, lens in LENGTH_CASES])
@pytest.mark.parametrize("given", ["constant", "at_run_time"])
def test_sequence_lens_match_onnxruntime(op_type, kwargs, lens, given):
    """Each batch entry's sequence ends at its own length: outputs beyond it are zero, the final states are those
    of its last step, and a reverse direction starts at its own last position."""
    import onnxruntime as ort

    model, feeds = build_rnn_model(op_type, seq=5, batch=3, sequence_lens=lens, **kwargs)
    if given == "at_run_time":
        _lengths_as_input(model, feeds, lens)
    if kwargs.get("layout", 0) == 1:      # onnxruntime runs layout 0 only: compare with the layout-0 twin's outputs
        reference, ref_feeds = build_rnn_model(op_type, seq=5, batch=3, sequence_lens=lens,
                                               **{**kwargs, "layout": 0})
        if given == "at_run_time":
            _lengths_as_input(reference, ref_feeds, lens)
        ref_feeds = {k: v if k.startswith("seq_lens") else v.transpose(1, 0, 2) for k, v in feeds.items()}
    else:
        reference, ref_feeds = model, feeds
    expected = ort.InferenceSession(reference.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, ref_feeds)
    if kwargs.get("layout", 0) == 1:
        expected = [y.transpose(2, 0, 1, 3) if y.ndim == 4 else y.transpose(1, 0, 2) for y in expected]
    got = _run_tvm(model, feeds)
    for name, g, e in zip([o.name for o in model.graph.output], got, expected):
        assert g.shape == e.shape
        err = float(np.abs(g - e).max())
        assert err <= TOLERANCE, f"{name}: max |tvm - onnxruntime| = {err:.2e}"


def test_lengths_given_as_int64_and_per_slice_projection_match_onnxruntime():
    """torch exports its lengths as int64 casts; the per-slice input projection masks the same steps."""
    import onnxruntime as ort

    from tvm_passes.rnn import RnnImportOptions, rnn_import_options

    model, feeds = build_rnn_model("LSTM", seq=6, batch=3, num_layers=2, sequence_lens=[6, 4, 1])
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    _lengths_as_input(model, feeds, [6, 4, 1], TensorProto.INT64)
    with rnn_import_options(RnnImportOptions("per_slice", 2)):
        got = _run_tvm(model, feeds)
    for g, e in zip(got, expected):
        assert float(np.abs(g - e).max()) <= TOLERANCE


@pytest.mark.parametrize("lens,expected", [
    ([3, 4], r"sequence_lens must hold 2 lengths \(the batch\) in \[0, 3\].*found \[3, 4\]"),
    ([3, -1], r"in \[0, 3\].*found \[3, -1\]"),
    ([3, 3, 3], r"must hold 2 lengths.*found \[3, 3, 3\]"),
])
def test_constant_sequence_lens_out_of_range_raise(lens, expected):
    model, _ = build_rnn_model("LSTM", seq=3, sequence_lens=lens)
    with pytest.raises(UnsupportedOpError, match=expected):
        _import(model)


def test_sequence_lens_of_the_wrong_shape_or_type_raise():
    model, feeds = build_rnn_model("GRU", seq=3, sequence_lens=[3, 3])
    _lengths_as_input(model, feeds, [3, 3, 3])
    with pytest.raises(UnsupportedOpError, match=r"sequence_lens must be an integer tensor of shape \[2\].*"
                                                 r"found int32 of shape \[3\]"):
        _import(model)
    model, feeds = build_rnn_model("GRU", seq=3, sequence_lens=[3, 3])
    _lengths_as_input(model, feeds, [3, 3], TensorProto.FLOAT)
    with pytest.raises(UnsupportedOpError, match="found float32 of shape"):
        _import(model)


def test_symbolic_sequence_length_raises():
    model, _ = build_rnn_model("RNN", seq=3)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "seq"
    with pytest.raises(UnsupportedOpError, match="symbolic shape"):
        _import(model)


def test_find_unsupported_rnn_nodes_lists_every_problem():
    model, _ = build_rnn_model("LSTM", seq=2, num_layers=2, extra_attrs={"clip": -1.0, "input_forget": 2})
    problems = find_unsupported_rnn_nodes(model)
    assert len(problems) == 4
    assert {p.split(":")[0] for p in problems} == {"LSTM node 'lstm_0'", "LSTM node 'lstm_1'"}
    clean, _ = build_rnn_model("LSTM", seq=2, direction="bidirectional", extra_attrs=DEFAULT_LSTM_ACTS)
    assert find_unsupported_rnn_nodes(clean) == []


def _fused(model: onnx.ModelProto) -> tvm.IRModule:
    """The imported model after LegalizeOps, hetpart's fusion passes and FuseTIR: one PrimFunc per kernel."""
    from tvm_passes.fusion import fusion_passes

    return tvm.transform.Sequential([relax.transform.LegalizeOps(), *fusion_passes(), relax.transform.FuseTIR()])(
        _import(model))


@pytest.mark.parametrize("op_type,lbr,kernels_per_step", [("LSTM", 0, 3), ("GRU", 0, 4), ("GRU", 1, 2), ("RNN", 0, 1)])
def test_gates_fuse_into_the_cell_kernels(op_type, lbr, kernels_per_step):
    """No step runs a split kernel of its own: gates read by different kernels are cut by single-use slices, which
    FuseOps fuses into them (a tuple-producing split cannot fuse there); a GRU with linear_before_reset=1 reads every
    gate in one cell kernel, where its split fuses. The steps' input rows come from one split of the projection
    (``_step_rows``), not a take per step. Per step: the recurrent matmul with the row added (GRU with
    linear_before_reset=0: two, and one slice the second matmul's epilogue cannot absorb), and the cell kernels: an
    LSTM step ran five kernels with a split and a take."""
    seq = 6
    model, _ = build_rnn_model(op_type, seq=seq, batch=1, input_size=8, hidden=16, with_initial=False,
                               linear_before_reset=lbr)
    fused = _fused(model)
    kernels: list[str] = []
    relax.analysis.post_order_visit(fused["main"], lambda e: kernels.append(e.args[0].name_hint) if _is_op(e) and
                                    e.op.name == "relax.call_tir" else None)
    assert not any(name.startswith(("split", "take")) for name in kernels), kernels
    assert kernels.count("fused_reshape_split") == 1, kernels           # the six step rows, in one kernel
    # The last step also feeds the stacked outputs; the steps before it are the repeating pattern.
    repeating = [name for name in kernels if name not in ("fused_matmul_add", "fused_stack_expand_dims",
                                                          "fused_reshape_split")
                 and not name.startswith(("expand_dims", "add"))]
    assert len(repeating) == pytest.approx(seq * kernels_per_step, abs=kernels_per_step), kernels


@pytest.mark.parametrize("op_type,layout", [("LSTM", 0), ("GRU", 1)])
def test_variable_lengths_add_no_kernel_per_step(op_type, layout):
    """Over a padded batch (``sequence_lens``) a step runs as many kernels as over full sequences: the state's mask
    fuses into the cell kernels and the outputs are zeroed past each length once, in the kernel that stacks the
    steps (a mask per step was a kernel of its own every step: the kept state has other readers)."""
    seq = 20

    def step_kernels(model: onnx.ModelProto) -> int:
        fused = _fused(model)
        kernels: list[str] = []
        relax.analysis.post_order_visit(fused["main"], lambda e: kernels.append(e.args[0].name_hint)
                                        if _is_op(e) and e.op.name == "relax.call_tir" else None)
        return len(kernels)

    common = dict(seq=seq, batch=3, input_size=8, hidden=16, with_initial=False, layout=layout)
    full, _ = build_rnn_model(op_type, **common)
    padded, _ = build_rnn_model(op_type, sequence_lens=[20, 7, 1], **common)
    # the padded model adds the lengths' cast and reshape and the one output mask, never a kernel per step
    assert step_kernels(padded) - step_kernels(full) <= 3


@pytest.mark.parametrize("seq,time_major,batch", [(1, True, 2), (7, True, 3), (40, False, 2), (300, True, 1)])
def test_step_rows_are_the_projection_rows(seq, time_major, batch):
    """The split tree gives row t of the projection for every t, time- or batch-major, with at most
    MAX_SPLIT_OUTPUTS outputs per split (300 steps: 2 levels, 1 + 2 + 19 splits)."""
    from tvm_passes.rnn import MAX_SPLIT_OUTPUTS, _step_rows
    from tvm_passes.rnn_cells import Emitter

    shape = [seq, batch, 12] if time_major else [batch, seq, 12]
    bb = relax.BlockBuilder()
    proj = relax.Var("proj", relax.TensorType(shape, "float32"))
    with bb.function("main", [proj]):
        with bb.dataflow():
            rows = _step_rows(Emitter(bb, 0), proj, 0 if time_major else 1)
            out = bb.emit_output(relax.Tuple(rows))
        bb.emit_func_output(out)
    mod = bb.get()
    bindings = mod["main"].body.blocks[0].bindings
    splits = [b.value for b in bindings if isinstance(b.value, relax.Call) and b.value.op.name == "relax.split"]
    assert seq > 1 or len(bindings) == 2           # one step (a per-slice projection of one step): one reshape
    assert all(len(s.ty.fields) <= MAX_SPLIT_OUTPUTS for s in splits)
    assert len(splits) == {1: 0, 7: 1, 40: 4, 300: 22}[seq]
    data = np.random.default_rng(0).standard_normal(shape).astype("float32")
    got = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())["main"](tvm.runtime.tensor(data))
    expected = data if time_major else data.transpose(1, 0, 2)
    assert len(got) == seq
    for t in range(seq):
        np.testing.assert_array_equal(got[t].numpy(), expected[t])


def _distinct_kernels(model: onnx.ModelProto) -> int:
    """Structurally distinct TIR functions after hetpart's legalization and fusion: what the build compiles."""
    import tvm_ffi

    return len({tvm_ffi.structural_hash(func) for _, func in _fused(model).functions.items()
                if isinstance(func, tvm.tirx.PrimFunc)})


@pytest.mark.parametrize("op_type,lbr,lengths", [("LSTM", 0, False), ("GRU", 1, False), ("GRU", 0, False),
                                               ("RNN", 0, False), ("LSTM", 0, True), ("GRU", 1, True)])
def test_steps_share_their_compiled_kernels(op_type, lbr, lengths):
    """Every step runs the same kernels, so the number of distinct functions to compile does not grow with the
    sequence: a step-dependent constant in a kernel (a slice offset, say) would make each step's kernels distinct and
    multiply the build time of long sequences (a 600-step GRU built in 519 s instead of 16 s that way)."""
    # 9 and 16 steps: both stack their outputs the same way (one stack of >= 8 inputs, kept out of fusion)
    # with lengths given at run time, the mask of each step must not bake the step's time into its kernels either
    models = []
    for seq in (9, 16):
        model, feeds = build_rnn_model(op_type, seq=seq, batch=2, input_size=8, hidden=16, with_initial=False,
                                       linear_before_reset=lbr, sequence_lens=[seq, 3] if lengths else None)
        if lengths:
            _lengths_as_input(model, feeds, [seq, 3])
        models.append(model)
    short, long = models
    assert _distinct_kernels(long) == _distinct_kernels(short)


@settings(max_examples=12, deadline=None, derandomize=True)
@given(op_type=st.sampled_from(["LSTM", "GRU", "RNN"]), direction=st.sampled_from(["forward", "reverse",
                                                                                     "bidirectional"]),
       layout=st.sampled_from([0, 1]), layers=st.integers(1, 2), seq=st.integers(1, 6), data=st.data())
def test_any_lengths_match_onnxruntime(op_type, direction, layout, layers, seq, data):
    """Lengths drawn anywhere in [0, seq] per batch entry, given at run time, for any cell, direction, layout and
    stack depth: the unrolled, masked recurrence equals onnxruntime's."""
    import onnxruntime as ort

    lens = data.draw(st.lists(st.integers(0, seq), min_size=3, max_size=3), label="lengths")
    kwargs = dict(seq=seq, batch=3, num_layers=layers, direction=direction, sequence_lens=lens,
                  linear_before_reset=int(op_type == "GRU" and seq % 2 == 0))
    model, feeds = build_rnn_model(op_type, layout=layout, **kwargs)
    _lengths_as_input(model, feeds, lens)
    reference, ref_feeds = build_rnn_model(op_type, layout=0, **kwargs)     # onnxruntime runs layout 0 only
    _lengths_as_input(reference, ref_feeds, lens)
    if layout == 1:
        ref_feeds = {k: v if k.startswith("seq_lens") else v.transpose(1, 0, 2) for k, v in feeds.items()}
    expected = ort.InferenceSession(reference.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, ref_feeds)
    if layout == 1:
        expected = [y.transpose(2, 0, 1, 3) if y.ndim == 4 else y.transpose(1, 0, 2) for y in expected]
    for got, want in zip(_run_tvm(model, feeds), expected):
        assert got.shape == want.shape
        assert float(np.abs(got - want).max()) <= TOLERANCE, (lens, op_type, direction, layout, layers)
