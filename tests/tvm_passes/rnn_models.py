"""Small ONNX LSTM/GRU/RNN models built with onnx.helper (random weights, fixed seed) for the RNN tests."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def build_rnn_model(op_type: str, *, seq: int, batch: int = 2, input_size: int = 5, hidden: int = 4,
                    num_layers: int = 1, direction: str = "forward", layout: int = 0, with_bias: bool = True,
                    with_initial: bool = True, linear_before_reset: int = 0, peephole: bool = False,
                    sequence_lens: list[int] | None = None, extra_attrs: dict | None = None,
                    weight_range: float | None = None, seed: int = 0) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """``num_layers`` chained ``op_type`` nodes; returns the model and a feed dict for its graph inputs.

    Layer k > 0 reads layer k-1's Y reshaped to [seq, batch, dirs*H] (layout 0) / [batch, seq, dirs*H].
    Outputs: Y, Y_h (and Y_c for LSTM) of the last layer, plus Y_h of every earlier layer.
    Weights are uniform in +-``weight_range``, by default 1/sqrt(hidden) as torch initialises them (much
    larger recurrent weights make the recurrence chaotic: float rounding differences then grow step by step).
    """
    rng = np.random.default_rng(seed)
    nd = 2 if direction == "bidirectional" else 1
    gates = GATES[op_type]

    bound = 1.0 / np.sqrt(hidden) if weight_range is None else weight_range

    def rand(*shape: int) -> np.ndarray:
        return rng.uniform(-bound, bound, size=shape).astype(np.float32)

    state_shape = [nd, batch, hidden] if layout == 0 else [batch, nd, hidden]
    x_shape = [seq, batch, input_size] if layout == 0 else [batch, seq, input_size]
    feeds = {"X": rng.standard_normal(x_shape).astype(np.float32)}
    graph_inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_shape)]
    inits, nodes, outputs = [], [], []
    layer_input, in_size = "X", input_size
    for layer in range(num_layers):
        def init(name: str, value: np.ndarray) -> str:
            inits.append(numpy_helper.from_array(value, f"{name}{layer}"))
            return f"{name}{layer}"

        names = [layer_input, init("W", rand(nd, gates * hidden, in_size)),
                 init("R", rand(nd, gates * hidden, hidden)),
                 init("B", rand(nd, 2 * gates * hidden)) if with_bias else "",
                 init("seq_lens", np.asarray(sequence_lens, np.int32)) if sequence_lens is not None else ""]
        for state in (("h0", "c0") if op_type == "LSTM" else ("h0",)):
            if with_initial:
                name = f"{state}_{layer}"
                feeds[name] = rand(*state_shape)
                graph_inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, state_shape))
                names.append(name)
            else:
                names.append("")
        if op_type == "LSTM" and peephole:
            names.append(init("P", rand(nd, 3 * hidden)))
        while names[-1] == "":
            names.pop()
        attrs = {"hidden_size": hidden, "direction": direction, "layout": layout, **(extra_attrs or {})}
        if op_type == "GRU":
            attrs["linear_before_reset"] = linear_before_reset
        out_names = [f"Y_{layer}", f"Y_h_{layer}"] + ([f"Y_c_{layer}"] if op_type == "LSTM" else [])
        nodes.append(helper.make_node(op_type, names, out_names, name=f"{op_type.lower()}_{layer}", **attrs))
        last = layer == num_layers - 1
        outputs += out_names if last else [out_names[1]]
        if not last:
            y = out_names[0]
            if layout == 0:  # [seq, nd, batch, H] -> [seq, batch, nd, H]
                nodes.append(helper.make_node("Transpose", [y], [f"Yt_{layer}"], perm=[0, 2, 1, 3]))
                y = f"Yt_{layer}"
            flat = [seq, batch, nd * hidden] if layout == 0 else [batch, seq, nd * hidden]
            shape_name = init("flat_shape", np.asarray(flat, np.int64))
            nodes.append(helper.make_node("Reshape", [y, shape_name], [f"Yflat_{layer}"]))
            layer_input, in_size = f"Yflat_{layer}", nd * hidden
    y_shape = [seq, nd, batch, hidden] if layout == 0 else [batch, seq, nd, hidden]
    graph_outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, y_shape if n.startswith("Y_") and
                                                   n.count("_") == 1 else state_shape) for n in outputs]
    graph = helper.make_graph(nodes, f"{op_type.lower()}_test", graph_inputs, graph_outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    return model, feeds


def onnxruntime_reference(op_type: str, **kwargs) -> tuple[onnx.ModelProto, dict[str, np.ndarray],
                                                            list[np.ndarray]]:
    """The model of :func:`build_rnn_model`, its feeds, and onnxruntime's outputs for them.

    onnxruntime's CPU kernels reject ``layout=1``, so a layout-1 model is checked against its layout-0 twin
    (same seed, hence the same weights -- asserted): feeds are transposed in and outputs transposed back.
    """
    import onnxruntime as ort  # only the tests need it

    model, feeds = build_rnn_model(op_type, **kwargs)
    if kwargs.get("layout", 0) == 0:
        ref_model, ref_feeds = model, feeds
    else:
        ref_model, _ = build_rnn_model(op_type, **{**kwargs, "layout": 0})
        weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if "shape" not in t.name}
        for t in ref_model.graph.initializer:
            if t.name in weights:
                np.testing.assert_array_equal(numpy_helper.to_array(t), weights[t.name])
        ref_feeds = {name: value.transpose(1, 0, 2) for name, value in feeds.items()}  # batch <-> seq/dirs
    session = ort.InferenceSession(ref_model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, ref_feeds)
    if kwargs.get("layout", 0) == 1:
        expected = [y.transpose(2, 0, 1, 3) if y.ndim == 4 else y.transpose(1, 0, 2) for y in expected]
    return model, feeds, expected
