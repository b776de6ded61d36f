"""ONNX Scan and Loop with trip counts fixed by the input shapes, unrolled before import: numerics against
onnxruntime through hetpart's whole import, nested loops and If branches in the body, and the typed refusals."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from hetpart.errors import UnsupportedOpError
from tvm_passes.frontend import import_model
from tvm_passes.onnx_loops import count_loop_nodes, unroll_loops

pytestmark = pytest.mark.tvm

RNG = np.random.default_rng(0)
F32 = TensorProto.FLOAT


def _value(name, shape, dtype=F32):
    return helper.make_tensor_value_info(name, dtype, shape)


def _save(tmp_path, nodes, inputs, outputs, initializers=(), opset=17, name="model"):
    graph = helper.make_graph(nodes, name, inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    return path


def _assert_matches_onnxruntime(path, feeds, atol=1e-5):
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    imported = import_model(path, input_shapes={k: v.shape for k, v in feeds.items()})
    mod, params = relax.frontend.detach_params(imported.mod)
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(feeds[p.name]) for p in mod["main"].params])
    got = [got.numpy()] if hasattr(got, "numpy") else [g.numpy() for g in got]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape
        np.testing.assert_allclose(g, e, atol=atol, rtol=1e-5)


def _rnn_body(hidden: int, width: int, name: str = "body") -> tuple[onnx.GraphProto, list]:
    """Scan body: (h, x_t) -> (h' = tanh(x_t W + h U), y_t = 2 h')."""
    w = numpy_helper.from_array(RNG.standard_normal((width, hidden)).astype(np.float32) * 0.3, f"{name}_W")
    u = numpy_helper.from_array(RNG.standard_normal((hidden, hidden)).astype(np.float32) * 0.3, f"{name}_U")
    nodes = [helper.make_node("MatMul", ["x_t", f"{name}_W"], ["xw"]),
             helper.make_node("MatMul", ["h", f"{name}_U"], ["hu"]),
             helper.make_node("Add", ["xw", "hu"], ["pre"]),
             helper.make_node("Tanh", ["pre"], ["h_next"]),
             helper.make_node("Add", ["h_next", "h_next"], ["y_t"])]
    body = helper.make_graph(nodes, name, [_value("h", [3, hidden]), _value("x_t", [3, width])],
                             [_value("h_next", [3, hidden]), _value("y_t", [3, hidden])], [w, u])
    return body, []


@pytest.mark.parametrize("in_axis,in_dir,out_axis,out_dir,opset", [(0, 0, 0, 0, 17), (1, 1, 1, 0, 17),
                                                                   (0, 0, -1, 1, 17), (1, 0, 1, 1, 11)])
def test_scan_matches_onnxruntime(tmp_path, in_axis, in_dir, out_axis, out_dir, opset):
    body, _ = _rnn_body(hidden=4, width=5)
    steps = 6
    x_shape = [steps, 3, 5] if in_axis == 0 else [3, steps, 5]
    node = helper.make_node("Scan", ["h0", "x"], ["h_last", "ys"], body=body, num_scan_inputs=1,
                            scan_input_axes=[in_axis], scan_input_directions=[in_dir],
                            scan_output_axes=[out_axis], scan_output_directions=[out_dir])
    path = _save(tmp_path, [node], [_value("h0", [3, 4]), _value("x", x_shape)],
                 [_value("h_last", [3, 4]), _value("ys", None)], opset=opset)
    feeds = {"h0": RNG.standard_normal((3, 4)).astype(np.float32),
             "x": RNG.standard_normal(x_shape).astype(np.float32)}
    _assert_matches_onnxruntime(path, feeds)


def _loop_model(tmp_path, trip: str, cond_out_node: onnx.NodeProto, extra_nodes=(), extra_inputs=(),
                initializers=(), body_if: bool = False, opset: int = 17):
    """Loop: v <- v * 0.5 + i (the iteration number as float) + x, scanning out v each iteration."""
    body_nodes = [helper.make_node("Cast", ["i"], ["i_f"], to=F32),
                  helper.make_node("Mul", ["v", "half"], ["v_half"]),
                  helper.make_node("Add", ["v_half", "i_f"], ["v_i"]),
                  helper.make_node("Add", ["v_i", "x"], ["v_next" if not body_if else "v_pre"]),
                  cond_out_node]
    if body_if:     # an If whose branches read body tensors (v_pre, i_f) from their enclosing scope
        then_branch = helper.make_graph([helper.make_node("Neg", ["v_pre"], ["then_out"])], "then", [],
                                        [_value("then_out", [2, 3])])
        else_branch = helper.make_graph([helper.make_node("Sub", ["v_pre", "i_f"], ["else_out"])], "else", [],
                                        [_value("else_out", [2, 3])])
        body_nodes += [helper.make_node("Greater", ["i", "two"], ["late"]),
                       helper.make_node("If", ["late"], ["v_next"], then_branch=then_branch,
                                        else_branch=else_branch)]
    body = helper.make_graph(
        body_nodes, "loop_body",
        [_value("i", [], TensorProto.INT64), _value("cond_in", [], TensorProto.BOOL), _value("v", [2, 3])],
        [_value("cond_out", [], TensorProto.BOOL), _value("v_next", [2, 3]), _value("v_scan", [2, 3])],
        [numpy_helper.from_array(np.array(0.5, np.float32), "half"),
         numpy_helper.from_array(np.array(2, np.int64), "two")])
    body.node.append(helper.make_node("Identity", ["v_next"], ["v_scan"]))
    loop = helper.make_node("Loop", [trip, "cond", "v0"], ["v_final", "vs"], body=body)
    inits = [numpy_helper.from_array(np.array(True), "cond"), *initializers]
    return _save(tmp_path, [*extra_nodes, loop], [_value("v0", [2, 3]), _value("x", [2, 3]), *extra_inputs],
                 [_value("v_final", [2, 3]), _value("vs", None)], inits, opset=opset)


@pytest.mark.parametrize("variant", ["constant_trip", "trip_from_shape", "constant_true_cond", "if_in_body",
                                     "opset_11"])
def test_loop_with_a_fixed_trip_count_matches_onnxruntime(tmp_path, variant):
    passes_cond = helper.make_node("Identity", ["cond_in"], ["cond_out"])
    feeds = {"v0": RNG.standard_normal((2, 3)).astype(np.float32), "x": RNG.standard_normal((2, 3)).astype(np.float32)}
    if variant == "trip_from_shape":       # M = len(steps): onnxslim folds Shape -> Gather for the bound shapes
        nodes = [helper.make_node("Shape", ["steps"], ["steps_shape"]),
                 helper.make_node("Gather", ["steps_shape", "zero"], ["M"], axis=0)]
        path = _loop_model(tmp_path, "M", passes_cond, nodes, [_value("steps", [5, 1])],
                           [numpy_helper.from_array(np.array(0, np.int64), "zero")])
        feeds["steps"] = np.zeros((5, 1), np.float32)
    else:
        cond_out = passes_cond if variant != "constant_true_cond" else helper.make_node(
            "Constant", [], ["cond_out"], value=numpy_helper.from_array(np.array(True), "t"))
        path = _loop_model(tmp_path, "M", cond_out, initializers=[numpy_helper.from_array(np.array(4, np.int64),
                                                                                        "M")],
                           body_if=variant == "if_in_body", opset=11 if variant == "opset_11" else 17)
    _assert_matches_onnxruntime(path, feeds)


def test_nested_scan_inside_a_loop_matches_onnxruntime(tmp_path):
    """The inner Scan is unrolled in the body first, then the Loop around it."""
    inner, _ = _rnn_body(hidden=4, width=4, name="inner")
    scan = helper.make_node("Scan", ["v", "xs"], ["v_next", "ys"], body=inner, num_scan_inputs=1)
    body = helper.make_graph(
        [scan, helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("ReduceSum", ["ys"], ["y_sum"], keepdims=0)],
        "outer", [_value("i", [], TensorProto.INT64), _value("cond_in", [], TensorProto.BOOL), _value("v", [3, 4])],
        [_value("cond_out", [], TensorProto.BOOL), _value("v_next", [3, 4]), _value("y_sum", [])])
    loop = helper.make_node("Loop", ["M", "", "v0"], ["v_final", "sums"], body=body)
    path = _save(tmp_path, [loop], [_value("v0", [3, 4]), _value("xs", [5, 3, 4])],
                 [_value("v_final", [3, 4]), _value("sums", None)],
                 [numpy_helper.from_array(np.array(3, np.int64), "M")])
    model = unroll_loops(onnx.load(str(path)), "nested")
    assert model is not None and count_loop_nodes(model.graph) == 0
    assert sum(n.op_type == "Tanh" for n in model.graph.node) == 3 * 5
    _assert_matches_onnxruntime(path, {"v0": RNG.standard_normal((3, 4)).astype(np.float32),
                                       "xs": RNG.standard_normal((5, 3, 4)).astype(np.float32)})


def test_loops_that_depend_on_the_data_are_refused_with_the_reason(tmp_path):
    stops = helper.make_node("Less", ["i", "two"], ["cond_out"])      # the body decides when to stop
    path = _loop_model(tmp_path, "M", stops, initializers=[numpy_helper.from_array(np.array(4, np.int64), "M")])
    with pytest.raises(UnsupportedOpError, match="Loop node 'v_final': the body computes whether to go on"):
        import_model(path, input_shapes={"v0": (2, 3), "x": (2, 3)})
    passes_cond = helper.make_node("Identity", ["cond_in"], ["cond_out"])
    path = _loop_model(tmp_path, "M", passes_cond, extra_inputs=[_value("M", [], TensorProto.INT64)])
    with pytest.raises(UnsupportedOpError, match="its trip count is computed at run time"):
        import_model(path, input_shapes={"v0": (2, 3), "x": (2, 3), "M": ()})


def test_models_without_loops_are_left_alone(tmp_path):
    path = _save(tmp_path, [helper.make_node("Relu", ["x"], ["y"])], [_value("x", [2])], [_value("y", [2])])
    assert unroll_loops(onnx.load(str(path)), "plain") is None


def test_torch_scripted_loop_compiles_and_matches_torch(tmp_path):
    """torch.jit.script keeps a Python loop over the sequence as an ONNX Loop (trip count from x.size(0), a
    sequence of step outputs carried through it); it compiles for a CPU and an emulated GPU and matches torch."""
    torch = pytest.importorskip("torch")
    import warnings

    import hetpart

    class ScriptedRnn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.rec = torch.nn.Linear(8, 16), torch.nn.Linear(16, 16)

        def forward(self, x):
            h = torch.zeros(x.size(1), 16)
            outs = []
            for t in range(x.size(0)):
                h = torch.tanh(self.inp(x[t]) + self.rec(h))
                outs.append(h)
            return torch.stack(outs), h

    torch.manual_seed(0)
    module = torch.jit.script(ScriptedRnn().eval())
    x = torch.randn(6, 2, 8)
    path = tmp_path / "scripted.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x,), str(path), dynamo=False, opset_version=17, input_names=["x"])
    assert "Loop" in {n.op_type for n in onnx.load(str(path)).graph.node}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # tiny kernels below the predictor's training range
        compiled = hetpart.compile(str(path), devices="cpu,gpu=t4", method="all_gpu", pins={"op:relax.tanh": "cpu"})
    assert set(compiled.plan.device_of) == {"cpu", "gpu"}
    with torch.no_grad():
        expected = [t.numpy() for t in module(x)]
    for got, want in zip(compiled(x.numpy()), expected):
        np.testing.assert_allclose(got, want, atol=1e-5)


@settings(max_examples=10, deadline=None, derandomize=True)
@given(steps=st.integers(1, 5), in_axis=st.sampled_from([0, 1]), in_dir=st.sampled_from([0, 1]),
       out_axis=st.sampled_from([0, 1, -1, -3]), out_dir=st.sampled_from([0, 1]), opset=st.sampled_from([11, 17]))
def test_any_scan_layout_matches_onnxruntime(tmp_path_factory, steps, in_axis, in_dir, out_axis, out_dir, opset):
    """Scan over any input axis and direction, stacking its outputs on any axis and in either direction."""
    body, _ = _rnn_body(hidden=4, width=5)
    x_shape = [steps, 3, 5] if in_axis == 0 else [3, steps, 5]
    node = helper.make_node("Scan", ["h0", "x"], ["h_last", "ys"], body=body, num_scan_inputs=1,
                            scan_input_axes=[in_axis], scan_input_directions=[in_dir],
                            scan_output_axes=[out_axis], scan_output_directions=[out_dir])
    path = _save(tmp_path_factory.mktemp("scan"), [node], [_value("h0", [3, 4]), _value("x", x_shape)],
                 [_value("h_last", [3, 4]), _value("ys", None)], opset=opset)
    rng = np.random.default_rng(steps)
    _assert_matches_onnxruntime(path, {"h0": rng.standard_normal((3, 4)).astype(np.float32),
                                       "x": rng.standard_normal(x_shape).astype(np.float32)})
