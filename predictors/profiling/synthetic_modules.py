"""Synthetic single-kernel workloads: :func:`build_synthetic_module` builds the Relax module a
:class:`~predictors.synthetic_spec.SyntheticSpec` names. Which specs are measured, and why, is
:mod:`predictors.profiling.sampling`'s business."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from predictors.synthetic_spec import SyntheticSpec


def build_synthetic_module(spec: SyntheticSpec, seed: int = 0) -> Any:
    """The Relax module of one synthetic workload; weights are constants, as in an imported zoo model."""
    import tvm
    from tvm import relax

    spec.validate()
    p, rng = dict(spec.params), np.random.default_rng(seed)

    def const(shape: Sequence[int]) -> Any:
        return relax.const(rng.standard_normal(shape).astype("float32") * 0.1, "float32")

    bb = relax.BlockBuilder()
    dense_conv = spec.op in ("conv2d", "conv2d_residual")
    params = []
    if spec.op in ("conv2d", "conv2d_residual", "depthwise_conv2d", "max_pool2d", "add_relu"):
        c_in = p["ci"] if dense_conv else p["c"]
        x = relax.Var("x", relax.TensorType([p["n"], c_in, p["hw"], p["hw"]], "float32"))
        if spec.op == "conv2d_residual":     # the residual is an activation (a kernel input), not a constant
            side = (p["hw"] - 1) // p["stride"] + 1           # padding k // 2 keeps odd windows centred
            params = [relax.Var("residual", relax.TensorType([p["n"], p["co"], side, side], "float32"))]
    elif spec.op == "matmul":
        x = relax.Var("x", relax.TensorType([p["m"], p["k"]], "float32"))
    else:
        x = relax.Var("x", relax.TensorType([p["m"], p["n"]], "float32"))
    with bb.function("main", [x, *params]):
        with bb.dataflow():
            if spec.op in ("conv2d", "conv2d_residual", "depthwise_conv2d"):
                groups = 1 if dense_conv else p["c"]
                co = p["co"] if dense_conv else p["c"]
                ci_per_group = p["ci"] if dense_conv else 1
                y = bb.emit(relax.op.nn.conv2d(x, const([co, ci_per_group, p["k"], p["k"]]), strides=p["stride"],
                                               padding=p["k"] // 2, groups=groups))
                y = bb.emit(relax.op.add(y, const([1, co, 1, 1])))
                if params:
                    y = bb.emit(relax.op.add(y, params[0]))
                y = bb.emit(relax.op.nn.relu(y) if dense_conv else relax.op.clip(y, 0.0, 6.0))
            elif spec.op == "matmul":
                y = bb.emit(relax.op.matmul(x, const([p["k"], p["n"]])))
                y = bb.emit(relax.op.add(y, const([p["n"]])))
            elif spec.op == "gates":      # t transcendental gates of the input, combined as in an RNN cell
                # Each gate reads the input (as an LSTM's gates read slices of one projection, or GELU's erf):
                # chained (sigmoid(tanh(erf(x)))) the inlined members recompute each other's operands and ran
                # 10x slower per element than the sum of the single ops (5 members at 70x650: 3.8 ms vs 0.45),
                # a kernel no zoo model contains, which pulled the elementwise model up 4x on BERT's GELU.
                y = bb.emit(relax.op.sigmoid(x))
                for i in range(1, p["t"]):
                    y = bb.emit(relax.op.multiply(y, (relax.op.sigmoid, relax.op.tanh, relax.op.erf)[i % 3](x)))
                y = bb.emit(relax.op.add(y, x))
            elif spec.op == "layer_norm":
                y = bb.emit(relax.op.nn.layer_norm(x, const([p["n"]]), const([p["n"]]), axes=[-1]))
            elif spec.op == "softmax":
                y = bb.emit(relax.op.nn.softmax(x, axis=-1))
            elif spec.op == "max_pool2d":
                y = bb.emit(relax.op.nn.max_pool2d(x, pool_size=p["k"], strides=p["stride"], padding=p["k"] // 2))
            else:
                y = bb.emit(relax.op.nn.relu(relax.op.add(x, const([1, p["c"], p["hw"], p["hw"]]))))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    mod = bb.get()
    assert isinstance(mod, tvm.IRModule)
    return mod
