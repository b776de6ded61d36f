"""Small ONNX models built with onnx.helper for tests (opset 18, IR version 10 for onnxruntime 1.31)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 18
IR_VERSION = 10


def save(model: onnx.ModelProto, path: Path) -> Path:
    model.ir_version = IR_VERSION
    onnx.save(model, str(path))
    return path


def small_cnn(path: Path, *, batch: int | str = "N", seed: int = 0) -> Path:
    """conv-bn-relu, residual add, maxpool, a runtime-computed Reshape (Shape->Gather->Concat), Gemm, Split."""
    rng = np.random.default_rng(seed)
    inits: list = []

    def const(name, array):
        inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    nodes = [
        helper.make_node("Conv", ["x", const("w1", rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3),
                                  const("b1", rng.standard_normal(8).astype(np.float32))], ["c1"],
                         pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("BatchNormalization", ["c1", const("g", rng.uniform(0.5, 1.5, 8).astype(np.float32)),
                                                const("be", rng.standard_normal(8).astype(np.float32)),
                                                const("mu", rng.standard_normal(8).astype(np.float32)),
                                                const("var", rng.uniform(0.5, 2, 8).astype(np.float32))], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r1"]),
        helper.make_node("Conv", ["r1", const("w2", rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.2)],
                         ["c2"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("Add", ["c2", "r1"], ["res"]),
        helper.make_node("Relu", ["res"], ["r2"]),
        helper.make_node("MaxPool", ["r2"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Shape", ["p"], ["shp"]),
        helper.make_node("Gather", ["shp", const("zero", np.array(0, np.int64))], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", const("ax0", np.array([0], np.int64))], ["n1"]),
        helper.make_node("Concat", ["n1", const("minus1", np.array([-1], np.int64))], ["newshape"], axis=0),
        helper.make_node("Reshape", ["p", "newshape"], ["flat"]),
        helper.make_node("Gemm", ["flat", const("wfc", rng.standard_normal((10, 8 * 4 * 4)).astype(np.float32) * 0.1),
                                  const("bfc", rng.standard_normal(10).astype(np.float32))], ["logits"], transB=1),
        helper.make_node("Split", ["logits"], ["y1", "y2"], axis=1, num_outputs=2),
        helper.make_node("Sigmoid", ["y2"], ["y2s"]),
    ]
    graph = helper.make_graph(
        nodes, "small_cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
        [helper.make_tensor_value_info("y1", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("y2s", TensorProto.FLOAT, None)], inits)
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), path)


def with_unsupported_ops(path: Path) -> Path:
    """Two unknown custom ops (one used twice) next to supported ones."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("FancyOp", ["a"], ["b"], domain="com.example"),
        helper.make_node("FancyOp", ["b"], ["c"], domain="com.example"),
        helper.make_node("OtherOp", ["c"], ["y"], domain="com.example"),
    ]
    graph = helper.make_graph(nodes, "unsupported", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid("com.example", 1)])
    return save(model, path)
