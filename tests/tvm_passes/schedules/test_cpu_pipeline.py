"""cpu_schedule_pass / cpu_pipeline / default_cpu_target: which PrimFuncs get scheduled, input modules stay
unchanged, and a whole small CNN compiled with cpu_pipeline matches onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from tvm import relax, tirx  # noqa: E402

from tvm_passes.schedules import (  # noqa: E402
    RULE_ATTR,
    SCHEDULED_ATTR,
    cpu_pipeline,
    cpu_schedule_pass,
    default_cpu_target,
)
from tvm_passes.schedules.pipeline import cpu_generic  # noqa: E402

pytestmark = pytest.mark.tvm


def _legalized_conv_module(target):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 10, 10), "float32"))
    w = relax.const(np.ones((16, 8, 3, 3), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(relax.op.nn.conv2d(x, w, padding=1)))
        bb.emit_func_output(out)
    with target:
        return tvm.transform.Sequential(cpu_generic.legalize_passes(target))(bb.get())


def _prim_funcs(mod):
    return {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)}


def test_default_cpu_target_is_llvm_for_this_host():
    target = default_cpu_target()
    assert target.kind.name == "llvm"
    assert str(target.attrs["mcpu"]) == str(tvm.target.Target.from_device(tvm.cpu()).attrs["mcpu"])
    assert int(target.attrs["num-cores"]) >= 1


def test_schedule_pass_does_not_mutate_its_input():
    target = default_cpu_target()
    mod = _legalized_conv_module(target)
    before = mod.script()
    scheduled = cpu_schedule_pass(target)(mod)
    assert mod.script() == before
    funcs = _prim_funcs(scheduled)
    assert funcs and all(bool(f.attrs[SCHEDULED_ATTR]) for f in funcs.values())
    # Which conv rule takes it depends on the host's vector width (conv2d_flat when a 10-wide row would not fill
    # whole registers); either way a conv rule scheduled it.
    assert {str(f.attrs[RULE_ATTR]) for f in funcs.values()} & {"conv2d_nchw", "conv2d_flat"}


def test_gpu_and_already_scheduled_prim_funcs_are_left_alone():
    target = default_cpu_target()
    mod = _legalized_conv_module(target)
    gpu_target = tvm.target.Target({"kind": "cuda", "arch": "sm_80"})
    (name, conv), *_ = [(n, f) for n, f in _prim_funcs(mod).items() if "conv" in n]
    gv = mod.get_global_var(name)
    mixed = mod.clone()
    mixed[gv] = conv.with_attr("target", gpu_target)
    out = _prim_funcs(cpu_schedule_pass(target)(mixed))
    assert out[name].same_as(mixed[gv])  # GPU function untouched
    assert all(SCHEDULED_ATTR in f.attrs for n, f in out.items() if n != name)

    # No target attribute + a GPU pass target: not a CPU function either.
    assert all(SCHEDULED_ATTR not in f.attrs for f in _prim_funcs(cpu_schedule_pass(gpu_target)(mod)).values())

    # Already scheduled: left exactly as is.
    marked = mod.clone()
    marked[gv] = conv.with_attr(SCHEDULED_ATTR, True)
    assert _prim_funcs(cpu_schedule_pass(target)(marked))[name].same_as(marked[gv])


def _small_cnn_onnx(path):
    """conv3x3(16)+BN+relu, depthwise 3x3 stride 2 + clip, 1x1 conv(32), residual, GAP, Gemm, softmax."""
    rng = np.random.default_rng(0)
    inits = []

    def const(name, array):
        inits.append(numpy_helper.from_array(np.asarray(array, dtype=np.float32), name))
        return name

    nodes = [
        helper.make_node("Conv", ["x", const("w1", rng.standard_normal((16, 3, 3, 3)) * 0.3),
                                  const("b1", rng.standard_normal(16))], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", const("g", rng.uniform(0.5, 1.5, 16)),
                                                const("be", rng.standard_normal(16)),
                                                const("mu", rng.standard_normal(16)),
                                                const("var", rng.uniform(0.5, 2, 16))], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r1"]),
        helper.make_node("Conv", ["r1", const("wd", rng.standard_normal((16, 1, 3, 3)) * 0.3)], ["dw"],
                         pads=[1, 1, 1, 1], strides=[2, 2], group=16),
        helper.make_node("Clip", ["dw", const("lo", 0.0), const("hi", 6.0)], ["r2"]),
        helper.make_node("Conv", ["r2", const("w3", rng.standard_normal((32, 16, 1, 1)) * 0.2)], ["c3"]),
        helper.make_node("Conv", ["c3", const("w4", rng.standard_normal((32, 32, 3, 3)) * 0.1)], ["c4"],
                         pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c3", "c4"], ["res"]),
        helper.make_node("GlobalAveragePool", ["res"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"]),
        helper.make_node("Gemm", ["flat", const("wfc", rng.standard_normal((10, 32)) * 0.1),
                                  const("bfc", rng.standard_normal(10))], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 17, 17])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    onnx.save(model, str(path))
    return path


def test_cpu_pipeline_matches_onnxruntime_and_uses_the_rules(tmp_path):
    from tvm.relax.frontend.onnx import from_onnx

    path = _small_cnn_onnx(tmp_path / "cnn.onnx")
    x = np.random.default_rng(1).standard_normal((1, 3, 17, 17)).astype(np.float32)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    mod = from_onnx(onnx.load(str(path)), keep_params_in_input=False)
    target = default_cpu_target()
    ex = tvm.compile(mod, target=target, relax_pipeline=cpu_pipeline(target))
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)

    # The compiled library's kernels are the scheduled ones: parallel loops made it to the LLVM module.
    source = ex.mod.imports[0].inspect_source("ll") if ex.mod.imports else ""
    assert "TVMBackendParallelLaunch" in source


def test_cpu_pipeline_without_a_database_directory_falls_back_to_rules(tmp_path):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.softmax(x))
        bb.emit_func_output(out)
    target = default_cpu_target()
    ex = tvm.compile(bb.get(), target=target, relax_pipeline=cpu_pipeline(target, database_dir=tmp_path / "none"))
    data = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(data)).numpy()
    ref = np.exp(data - data.max(-1, keepdims=True))
    np.testing.assert_allclose(got, ref / ref.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
