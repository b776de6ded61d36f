"""1-D convolutions are imported as (1, k) 2-D convolutions: numerics against onnxruntime, fusion, rule choice."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.onnx_builders import OPSET, save

CHANNELS, LENGTH = 12, 40


def _conv1d_model(path, *, out_channels=16, kernel=3, stride=1, dilation=1, pads=(1, 1), group=1, bias=True,
                  tail=("Relu",), shared_weight=False, seed=0):
    """x[1, CHANNELS, LENGTH] -> Conv (1-D) -> the ``tail`` ops; "Residual" adds the conv's input back,
    "BatchNorm" is an unfolded BatchNormalization, "Clip" clips to [0, 6], "Conv" a second conv sharing or not the
    first one's weight."""
    rng = np.random.default_rng(seed)
    inits = []

    def const(name, array):
        inits.append(numpy_helper.from_array(np.asarray(array, dtype=np.float32), name))
        return name

    weight = const("w", rng.standard_normal((out_channels, CHANNELS // group, kernel)) * 0.3)
    inputs = ["x", weight] + ([const("b", rng.standard_normal(out_channels))] if bias else [])
    attrs = dict(kernel_shape=[kernel], strides=[stride], dilations=[dilation], pads=list(pads), group=group)
    nodes = [helper.make_node("Conv", inputs, ["y0"], **attrs)]
    last = "y0"
    for k, op in enumerate(tail):
        out = f"y{k + 1}"
        if op == "Residual":
            nodes.append(helper.make_node("Add", [last, "x"], [out]))
        elif op == "BatchNorm":
            nodes.append(helper.make_node("BatchNormalization", [
                last, const("g", rng.uniform(0.5, 1.5, out_channels)), const("be", rng.standard_normal(out_channels)),
                const("mu", rng.standard_normal(out_channels)),
                const("var", rng.uniform(0.5, 2, out_channels))], [out]))
        elif op == "Clip":
            nodes.append(helper.make_node("Clip", [last, const("lo", 0.0), const("hi", 6.0)], [out]))
        elif op == "Conv":
            w2 = weight if shared_weight else const("w2", rng.standard_normal((out_channels, out_channels, kernel)))
            nodes.append(helper.make_node("Conv", [last, w2], [out], kernel_shape=[kernel], pads=list(pads)))
        else:
            nodes.append(helper.make_node(op, [last], [out]))
        last = out
    graph = helper.make_graph(nodes, "conv1d", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                              [1, CHANNELS, LENGTH])],
                              [helper.make_tensor_value_info(last, TensorProto.FLOAT, None)], inits)
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), path)


def _reference(path, x):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _run_cpu_pipeline(mod, x):
    import tvm
    from tvm import relax

    from tvm_passes.schedules import cpu_pipeline, default_cpu_target

    target = default_cpu_target()
    vm = relax.VirtualMachine(tvm.compile(mod, target=target, relax_pipeline=cpu_pipeline(target)), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def _ops(mod):
    from tvm import relax

    names = []

    @relax.expr_functor.visitor
    class _Ops(relax.PyExprVisitor):
        def visit_call_(self, call):
            if hasattr(call.op, "name"):
                names.append(str(call.op.name))
            super().visit_call_(call)

    _Ops().visit_expr(mod["main"])
    return names


CASES = {
    "k3 pad 1 relu": dict(),
    "k5 stride 2 no bias": dict(kernel=5, stride=2, pads=(2, 2), bias=False, tail=()),
    "k3 dilation 4 residual": dict(out_channels=CHANNELS, dilation=4, pads=(4, 4), tail=("Relu", "Residual")),
    "asymmetric pads clip": dict(kernel=4, pads=(1, 2), tail=("Clip",)),
    "depthwise k7 sigmoid": dict(out_channels=CHANNELS, kernel=7, pads=(3, 3), group=CHANNELS, tail=("Sigmoid",)),
    "grouped k1 tanh": dict(out_channels=24, kernel=1, pads=(0, 0), group=3, tail=("Tanh",)),
    "relu then batch norm": dict(tail=("Relu", "BatchNorm")),
    "two convs, shared weight": dict(out_channels=CHANNELS, tail=("Relu", "Conv"), shared_weight=True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rewritten_conv1d_matches_onnxruntime(tmp_path, case):
    from tvm_passes.frontend import import_model

    path = _conv1d_model(tmp_path / "m.onnx", **CASES[case])
    imported = import_model(path)
    ops = _ops(imported.mod)
    assert "relax.nn.conv1d" not in ops and "relax.nn.conv2d" in ops
    assert any("conv1d" in note for note in imported.notes)
    x = np.random.default_rng(1).standard_normal((1, CHANNELS, LENGTH)).astype(np.float32)
    np.testing.assert_allclose(_run_cpu_pipeline(imported.mod, x), _reference(path, x), rtol=1e-4, atol=1e-4)


def test_shared_weight_becomes_one_constant(tmp_path):
    from tvm import relax

    from tvm_passes.frontend import import_model

    imported = import_model(_conv1d_model(tmp_path / "m.onnx", **CASES["two convs, shared weight"]))
    weights = []

    @relax.expr_functor.visitor
    class _Weights(relax.PyExprVisitor):
        def visit_call_(self, call):
            if getattr(call.op, "name", "") == "relax.nn.conv2d":
                weights.append(call.args[1])
            super().visit_call_(call)

    _Weights().visit_expr(imported.mod["main"])
    assert len(weights) == 2 and weights[0].same_as(weights[1])
    assert tuple(int(d) for d in weights[0].ty.shape) == (CHANNELS, CHANNELS, 1, 3)


def test_bias_and_activation_fuse_into_the_conv_kernel_a_conv_rule_schedules(tmp_path):
    import tvm

    from tvm_passes import tuning_db
    from tvm_passes.frontend import import_model
    from tvm_passes.schedules import cpu_schedule_pass, default_cpu_target

    imported = import_model(_conv1d_model(tmp_path / "m.onnx", out_channels=32))
    target = default_cpu_target()
    with target:
        mod = cpu_schedule_pass(target)(tvm.transform.Sequential(tuning_db.kernel_lowering_passes(target))(
            imported.mod))
    rules = {gv.name_hint: str(f.attrs["hetpart.cpu_rule"]) for gv, f in mod.functions_items()
             if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and "hetpart.cpu_rule" in f.attrs}
    conv_kernels = [name for name in rules if "conv2d" in name]
    assert len(conv_kernels) == 1 and "add" in conv_kernels[0] and "relu" in conv_kernels[0], rules
    assert rules[conv_kernels[0]].startswith("conv2d"), rules


def test_conv_relu_batch_norm_compiles_to_onnxruntime_numerics(tmp_path):
    """The heterogeneous build path (unfolded batch norm parameters after a ReLU): once 1e8 off."""
    import hetpart

    path = _conv1d_model(tmp_path / "m.onnx", tail=("Relu", "BatchNorm"))
    compiled = hetpart.compile(str(path), devices="cpu", method="all_cpu")
    x = np.random.default_rng(2).standard_normal((1, CHANNELS, LENGTH)).astype(np.float32)
    np.testing.assert_allclose(compiled(x)[0], _reference(path, x), rtol=1e-4, atol=1e-4)


def test_models_without_conv1d_are_left_alone(tmp_path):
    from tests.onnx_builders import small_cnn
    from tvm_passes.conv1d_as_conv2d import conv1d_as_conv2d
    from tvm_passes.frontend import import_model

    imported = import_model(small_cnn(tmp_path / "cnn.onnx", batch=1))
    mod, count = conv1d_as_conv2d(imported.mod)
    assert count == 0 and mod.same_as(imported.mod)
    assert not any("conv1d" in note for note in imported.notes)
