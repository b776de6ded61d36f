"""One-conv ONNX models compiled with hetpart's CPU pipeline and checked against onnxruntime (shared by the conv
rule tests)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax, tirx

from tvm_passes.frontend import import_model
from tvm_passes.schedules import (
    RULE_ATTR,
    cpu_pipeline,
    cpu_schedule_pass,
    default_cpu_target,
)
from tvm_passes.tuning_db import kernel_lowering_passes


def conv_onnx(path, x_shape, w_shape, *, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group=1,
               activation="relu", bias=True, pad_node=None, residual=False, weights_as_input=False):
    """One Conv (+ bias) (+ relu / silu) (+ a residual add of the input) ONNX model; ``pad_node``: an explicit
    zero Pad (ONNX order begin..., end...) in front of the conv, as torch's ZeroPad2d exports."""
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(np.float32)
    inits = [] if weights_as_input else [numpy_helper.from_array(weight, "w")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))]
    if weights_as_input:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, list(w_shape)))
    nodes, data = [], "x"
    if pad_node is not None:
        inits.append(numpy_helper.from_array(np.asarray(pad_node, np.int64), "pads"))
        nodes.append(helper.make_node("Pad", ["x", "pads"], ["xp"]))
        data = "xp"
    conv_inputs = [data, "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(w_shape[0]).astype(np.float32), "b"))
        conv_inputs.append("b")
    nodes.append(helper.make_node("Conv", conv_inputs, ["c"], strides=list(strides), pads=list(pads),
                                  dilations=list(dilations), group=group, kernel_shape=list(w_shape[2:])))
    out = "c"
    if residual:
        nodes.append(helper.make_node("Add", [out, "x"], ["res"]))
        out = "res"
    if activation == "relu":
        nodes.append(helper.make_node("Relu", [out], ["y"]))
    elif activation == "silu":
        nodes += [helper.make_node("Sigmoid", [out], ["g"]), helper.make_node("Mul", [out, "g"], ["y"])]
    else:
        nodes.append(helper.make_node("Identity", [out], ["y"]))
    graph = helper.make_graph(nodes, "conv", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    onnx.save(model, str(path))
    feeds = {"x": np.random.default_rng(1).standard_normal(x_shape).astype(np.float32)}
    if weights_as_input:
        feeds["w"] = weight
    return path, feeds


def conv_rules(mod, target) -> set[str]:
    with target:
        scheduled = tvm.transform.Sequential(kernel_lowering_passes(target) + [cpu_schedule_pass(target)])(mod)
    return {str(f.attrs.get(RULE_ATTR)) for _, f in scheduled.functions_items()
            if isinstance(f, tirx.PrimFunc) and "conv" in str(f.attrs.get(RULE_ATTR, ""))}


def check_conv(tmp_path, **kwargs) -> set[str]:
    """Compile the model with hetpart's CPU pipeline, compare with onnxruntime; return the conv rules applied."""
    path, feeds = conv_onnx(tmp_path / "conv.onnx", **kwargs)
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    imported = import_model(path)
    target = default_cpu_target()
    executable = tvm.compile(imported.mod, target=target, relax_pipeline=cpu_pipeline(target))
    args = [tvm.runtime.tensor(feeds[p.name]) for p in imported.mod["main"].params]
    got = relax.VirtualMachine(executable, tvm.cpu())["main"](*args).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    return conv_rules(imported.mod, target)
