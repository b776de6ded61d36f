"""Sort and scan ops (tvm_passes.sort_scan): TVM 0.27 legalizes them nowhere but in its CUDA pipelines, so a model
with CumSum or TopK failed to build. Numerics against numpy and onnxruntime, on the CPU, on an emulated GPU, and as
real CUDA kernels through nvcc."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

tvm = pytest.importorskip("tvm")
from tvm import relax  # noqa: E402

from hetpart.devices import DeviceSet, cpu_device, gpu_from_preset, preset_links  # noqa: E402
from hetpart.plan import Plan  # noqa: E402
from tests import onnx_builders  # noqa: E402
from tvm_passes.annotate import AnnotateDevicePlacement  # noqa: E402
from tvm_passes.bindings import op_bindings  # noqa: E402
from tvm_passes.build import (build, check_cuda_kernels, compile_cuda_source_with_nvcc,  # noqa: E402
                              cuda_kernel_names)
from tvm_passes.frontend import import_model  # noqa: E402
from tvm_passes.legalize import legalize_ops  # noqa: E402

pytestmark = pytest.mark.tvm

DEVICES = DeviceSet((cpu_device(), gpu_from_preset("t4")), preset_links("t4"))
X = np.random.default_rng(3).standard_normal((3, 7)).astype("float32")


def sort_scan_module() -> tvm.IRModule:
    """Every sort/scan op on a 3x7 input, each result an output (7 ops)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(X.shape, "float32"))
    op = relax.op
    with bb.function("main", [x]):
        with bb.dataflow():
            outs = [bb.emit(op.cumsum(x, axis=1)), bb.emit(op.cumsum(x, axis=0, exclusive=True)),
                    bb.emit(op.cumprod(x, axis=1)), bb.emit(op.sort(x, axis=1, descending=True)),
                    bb.emit(op.argsort(x, axis=0, dtype="int64"))]
            top = bb.emit(op.topk(x, 3, axis=1, ret_type="both", largest=False, dtype="int64"))
            outs += [bb.emit(relax.TupleGetItem(top, 0)), bb.emit(relax.TupleGetItem(top, 1))]
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    return bb.get()


def expected(x: np.ndarray) -> list[np.ndarray]:
    exclusive = np.concatenate([np.zeros((1, x.shape[1]), x.dtype), np.cumsum(x, 0)[:-1]], 0)
    smallest = np.argsort(x, axis=1, kind="stable")[:, :3]
    return [np.cumsum(x, 1), exclusive, np.cumprod(x, 1), -np.sort(-x, 1), np.argsort(x, 0, kind="stable"),
            np.take_along_axis(x, smallest, 1), smallest]


def check(got, want) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_stock_tvm_leaves_them_unlegalized_and_hetpart_does_not():
    """The reason for the module: without it these calls reach VM codegen untouched."""
    stock = relax.transform.LegalizeOps()(sort_scan_module())
    assert {b.value.op.name for b in op_bindings(stock["main"])} >= {"relax.cumsum", "relax.topk", "relax.sort"}
    ours = legalize_ops()(sort_scan_module())
    assert {b.value.op.name for b in op_bindings(ours["main"])} == {"relax.call_tir"}


@pytest.mark.parametrize("device", ["cpu", "gpu"], ids=["on_cpu", "on_emulated_gpu"])   # not the gpu marker
def test_sort_scan_numerics_on_cpu_and_emulated_gpu(device):
    mod = sort_scan_module()
    n_ops = len(op_bindings(mod["main"]))
    plan = Plan(device_of=(device,) * n_ops, order=tuple(range(n_ops)), devices=("cpu", "gpu"), method="test")
    result = build(AnnotateDevicePlacement(plan, DEVICES)(mod), DEVICES, emulate_gpu=True)
    check(result.run(X), expected(X))
    assert result.cpu_schedules_applied      # the rules leave TOPI's hand-written loops alone


def test_rules_leave_hand_written_primfuncs_alone(caplog):
    """TOPI writes these kernels as one opaque block (a scan loop, a call into tvm.contrib.sort): every CPU rule
    failed on them with a warning ("get-block") before the rules skipped such PrimFuncs."""
    from tvm_passes.schedules import default_cpu_target
    from tvm_passes.schedules.base import apply_first_rule, is_hand_written
    from tvm_passes.schedules.pipeline import default_rules

    legal = legalize_ops()(sort_scan_module())
    kernels = {gv.name_hint: f for gv, f in legal.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    assert {"cumsum", "cumprod", "sort", "argsort", "topk"} <= set(kernels)
    with caplog.at_level("WARNING"):
        for func in kernels.values():
            assert is_hand_written(func)
            assert apply_first_rule(func, default_cpu_target(), default_rules()) is None
    assert not caplog.records


def test_sort_scan_become_cuda_kernels(nvcc_path):
    mod = sort_scan_module()
    n_ops = len(op_bindings(mod["main"]))
    plan = Plan(device_of=("gpu",) * n_ops, order=tuple(range(n_ops)), devices=("cpu", "gpu"), method="test")
    result = build(AnnotateDevicePlacement(plan, DEVICES)(mod), DEVICES, emulate_gpu=False)
    names = cuda_kernel_names(result)
    ops = {n.split("_cuda")[0].rstrip("0123456789") for n in names}
    assert {"cumsum", "cumprod", "sort", "argsort", "topk"} <= ops, names
    check_cuda_kernels(result)
    assert compile_cuda_source_with_nvcc(result, "ptx").count(b".entry") >= len(names)


def test_onnx_cumsum_and_topk_match_onnxruntime(tmp_path):
    """Position ids from a mask (CumSum, exclusive and reversed) and a detector's candidates (TopK), imported and
    compiled by hetpart.compile for cpu+gpu (GPU emulated)."""
    import hetpart

    N = helper.make_node
    nodes = [N("CumSum", ["x", "axis1"], ["c"]), N("CumSum", ["x", "axis1"], ["c_rev"], exclusive=1, reverse=1),
             N("TopK", ["c", "k"], ["values", "indices"], axis=1, largest=1),
             N("Add", ["c", "c_rev"], ["total"])]
    graph = helper.make_graph(
        nodes, "sort_scan", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(X.shape))],
        [helper.make_tensor_value_info(n, t, None) for n, t in
         (("values", TensorProto.FLOAT), ("indices", TensorProto.INT64), ("total", TensorProto.FLOAT))],
        [numpy_helper.from_array(np.array(1, np.int64), "axis1"),
         numpy_helper.from_array(np.array([4], np.int64), "k")])
    path = onnx_builders.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]),
                              tmp_path / "sort_scan.onnx")
    reference = ort.InferenceSession(str(path)).run(None, {"x": X})
    imported = import_model(path, work_dir=tmp_path / "work")
    assert {"relax.cumsum", "relax.topk"} <= {b.value.op.name for b in op_bindings(imported.mod["main"])}
    compiled = hetpart.compile(str(path), devices="cpu,gpu=p2200", output_dir=tmp_path / "out")
    check(compiled(x=X), reference)
