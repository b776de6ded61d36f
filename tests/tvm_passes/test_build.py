"""build(): partitioned executables — emulated numerics, fusion at device boundaries, real CUDA code, export."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
from tvm import relax, topi  # noqa: E402

from hetpart.devices import DeviceSet, cpu_device, gpu_from_preset, preset_links  # noqa: E402
from hetpart.errors import BuildError, InputMismatchError, InvalidPlanError  # noqa: E402
from hetpart.plan import Plan  # noqa: E402
from tvm_passes import build as build_module  # noqa: E402
from tvm_passes.annotate import AnnotateDevicePlacement  # noqa: E402
from tvm_passes.bindings import op_bindings  # noqa: E402
from tvm_passes.artifact import BuildManifest, _all_modules, export  # noqa: E402
from tvm_passes.build import (build, check_cuda_kernels, compile_cuda_source_with_nvcc,  # noqa: E402
                              cuda_available, cuda_kernel_names)
from tvm_passes.kernel_targets import check_single_device_kernels, kernel_calls  # noqa: E402

pytestmark = pytest.mark.tvm

DEVICES = DeviceSet((cpu_device(), gpu_from_preset("t4")), preset_links("t4"))
RNG = np.random.default_rng(7)
WEIGHTS = {
    "w1": RNG.standard_normal((8, 3, 3, 3)).astype("float32") * 0.3,
    "b1": RNG.standard_normal((1, 8, 1, 1)).astype("float32") * 0.1,
    "w2": RNG.standard_normal((8, 8, 3, 3)).astype("float32") * 0.2,
    "b2": RNG.standard_normal((1, 8, 1, 1)).astype("float32") * 0.1,
    "wf": RNG.standard_normal((512, 10)).astype("float32") * 0.05,
    "bf": RNG.standard_normal((10,)).astype("float32") * 0.1,
}
X = RNG.standard_normal((1, 3, 16, 16)).astype("float32")
CNN_OPS = ["conv2d", "add", "relu", "conv2d", "add", "relu", "add", "max_pool2d", "reshape", "matmul", "add"]


def small_cnn() -> tvm.IRModule:
    """conv+bias+relu -> conv+bias+relu -> residual add -> 2x2 max-pool -> flatten -> matmul+bias (11 ops)."""
    c = {k: relax.const(v) for k, v in WEIGHTS.items()}
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(X.shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.nn.conv2d(x, c["w1"], padding=1))
            h = bb.emit(relax.op.add(h, c["b1"]))
            r1 = bb.emit(relax.op.nn.relu(h))
            h = bb.emit(relax.op.nn.conv2d(r1, c["w2"], padding=1))
            h = bb.emit(relax.op.add(h, c["b2"]))
            h = bb.emit(relax.op.nn.relu(h))
            h = bb.emit(relax.op.add(h, r1))
            h = bb.emit(relax.op.nn.max_pool2d(h, pool_size=2, strides=2))
            h = bb.emit(relax.op.reshape(h, (1, 512)))
            h = bb.emit(relax.op.matmul(h, c["wf"]))
            out = bb.emit_output(relax.op.add(h, c["bf"]))
        bb.emit_func_output(out)
    return bb.get()


def numpy_conv_same(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))   # n c h w kh kw
    return np.einsum("nchwij,ocij->nohw", windows, w)


def numpy_small_cnn(x: np.ndarray) -> np.ndarray:
    w = WEIGHTS
    r1 = np.maximum(numpy_conv_same(x, w["w1"]) + w["b1"], 0)
    h = np.maximum(numpy_conv_same(r1, w["w2"]) + w["b2"], 0) + r1
    h = h.reshape(1, 8, 8, 2, 8, 2).max(axis=(3, 5))
    return h.reshape(1, 512) @ w["wf"] + w["bf"]


def plan_of(device_of, order=None) -> Plan:
    return Plan(device_of=tuple(device_of), order=tuple(order if order is not None else range(len(device_of))),
                devices=("cpu", "gpu"), method="hand-written")


def built(device_of, *, emulate_gpu=True, module=None, **kw):
    mod = small_cnn() if module is None else module
    return build(AnnotateDevicePlacement(plan_of(device_of), DEVICES)(mod), DEVICES, emulate_gpu=emulate_gpu, **kw)


MIXED = ["gpu", "gpu", "gpu", "cpu", "cpu", "cpu", "gpu", "gpu", "cpu", "gpu", "cpu"]
INTERLEAVED = ["gpu" if i % 2 == 0 else "cpu" for i in range(len(CNN_OPS))]


@pytest.fixture(scope="module")
def all_cpu():
    return built(["cpu"] * len(CNN_OPS))


def test_small_cnn_has_the_ops_the_plans_assume():
    assert [b.value.op.name.split(".")[-1] for b in op_bindings(small_cnn()["main"])] == CNN_OPS


def test_all_cpu_build_matches_numpy(all_cpu):
    np.testing.assert_allclose(all_cpu.run(X)[0], numpy_small_cnn(X), rtol=1e-4, atol=1e-4)
    assert not all_cpu.manifest.emulated        # the gpu vdevice is declared but unused
    assert [d["used"] for d in all_cpu.manifest.devices] == [True, False]
    assert all_cpu.stats["plan_memory"]         # one device used: TVM's memory planning is safe


@pytest.mark.parametrize("device_of", [MIXED, INTERLEAVED, ["gpu"] * len(CNN_OPS)],
                         ids=["mixed", "interleaved", "all-gpu"])
def test_emulated_partitioned_cnn_matches_all_cpu_and_numpy(all_cpu, device_of):
    result = built(device_of)
    y = result.run(X)[0]
    assert np.abs(y - all_cpu.run(X)[0]).max() <= 1e-5
    np.testing.assert_allclose(y, numpy_small_cnn(X), rtol=1e-4, atol=1e-4)
    assert result.manifest.emulated
    gpu = next(d for d in result.manifest.devices if d["name"] == "gpu")
    assert gpu["emulated"] and gpu["runtime"] == "cpu" and gpu["index"] == 1
    assert any("EMULATED" in note for note in result.manifest.notes)


def test_annotating_with_deployment_vdevices_skips_retargeting_and_runs_the_same(all_cpu, caplog):
    from tvm_passes.annotate import annotate_module
    from tvm_passes.build import deployment_vdevices

    plan = plan_of(MIXED)
    vdevices = deployment_vdevices(plan, DEVICES, emulate_gpu=True)
    assert [(str(v.target.kind.name), int(v.vdevice_id)) for v in vdevices] == [("llvm", 0), ("llvm", 1)]
    with caplog.at_level("DEBUG", logger="tvm_passes.build"):
        result = build(annotate_module(small_cnn(), plan, DEVICES, vdevices), DEVICES, emulate_gpu=True)
    stages = [r.getMessage() for r in caplog.records if r.getMessage().startswith("build stage")]
    assert stages and not any("retarget" in s for s in stages)
    with caplog.at_level("DEBUG", logger="tvm_passes.build"):
        caplog.clear()
        built(MIXED)                                  # annotated for the GPU's own target: re-targeted
    assert any("retarget" in r.getMessage() for r in caplog.records)
    np.testing.assert_allclose(result.run(X)[0], numpy_small_cnn(X), rtol=1e-4, atol=1e-4)
    assert np.abs(result.run(X)[0] - all_cpu.run(X)[0]).max() <= 1e-5
    with pytest.raises(InvalidPlanError, match="one vdevice per device"):
        annotate_module(small_cnn(), plan, DEVICES, vdevices[:1])


def test_interleaved_plan_really_runs_on_two_devices():
    result = built(INTERLEAVED)
    devices_used = {vd for _, vds in kernel_calls(result.lowered) for vd in vds}
    assert devices_used == {("llvm", 0, "global"), ("llvm", 1, "global")}
    annotated = AnnotateDevicePlacement(plan_of(INTERLEAVED), DEVICES)(small_cnn())
    n_copies = sum(b.value.op.name == "relax.to_vdevice" for b in op_bindings(annotated["main"]))
    assert n_copies >= 10   # every op boundary crosses devices, plus weights copied to the emulated gpu
    gpu_weights = ("w1", "b2", "bf")   # read by ops 0, 4 and 10, which are on the gpu
    assert result.stats["weight_upload_bytes"] == sum(WEIGHTS[k].nbytes for k in gpu_weights)
    assert result.manifest.weights_function == "hetpart_upload_weights"


def test_gpu_weights_are_uploaded_once_outside_main():
    result = built(INTERLEAVED)
    main = result.lowered["main"]
    constant_copies = [b for block in main.body.blocks for b in block.bindings
                       if isinstance(b.value, relax.Call) and b.value.op.name == "relax.to_vdevice"
                       and isinstance(b.value.args[0], tvm.ir.GenericConst)]
    assert constant_copies == []
    vm = relax.VirtualMachine(result.executable, result.manifest.runtime_devices())
    weights = vm["hetpart_upload_weights"]()
    assert sorted(tuple(w.shape) for w in weights) == sorted(WEIGHTS[k].shape for k in ("w1", "b2", "bf"))
    assert all(w.device == tvm.cpu(1) for w in weights)          # the emulated gpu
    first = vm["main"](tvm.runtime.tensor(X), weights).numpy()
    second = vm["main"](tvm.runtime.tensor(X), weights).numpy()   # the same uploaded weights serve every call
    np.testing.assert_array_equal(first, second)
    np.testing.assert_allclose(first, numpy_small_cnn(X), rtol=1e-4, atol=1e-4)


def test_cpu_target_is_used_for_cpu_and_emulated_gpu_kernels():
    result = built(MIXED, cpu_target={"kind": "llvm", "num-cores": 2})
    kernels = [f for _, f in result.lowered.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert kernels and all(int(f.attrs["target"].attrs["num-cores"]) == 2 for f in kernels)


def test_ops_on_different_devices_never_fuse():
    together = built(["gpu"] * 3 + ["cpu"] * 8)      # conv, bias add, relu on one device: one fused kernel
    split = built(["gpu", "cpu", "gpu"] + ["cpu"] * 8)  # conv | add | relu on alternating devices
    assert "conv2d" in kernel_calls(together.lowered)[0][0] and "relu" in kernel_calls(together.lowered)[0][0]
    first_three = [name for name, _ in kernel_calls(split.lowered)[:3]]
    for name, op in zip(first_three, ["conv2d", "add", "relu"]):   # three kernels, one op each
        assert op in name and sum(other in name for other in ("conv2d", "add", "relu")) == 1, first_three
    # the second conv block (all on the cpu) still fuses: fusion is only stopped at device boundaries
    assert any("conv2d" in n and "relu" in n for n, _ in kernel_calls(split.lowered)[3:])
    for result in (together, split):
        assert all(len(vds) == 1 for _, vds in kernel_calls(result.lowered))


def test_kernel_mixing_devices_is_reported():
    vd0 = relax.VDevice(tvm.target.Target("llvm"), 0, "global")
    vd1 = relax.VDevice(tvm.target.Target("llvm"), 1, "global")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4,), "float32", vd0))
    y = relax.Var("y", relax.TensorType((4,), "float32", vd1))
    with bb.function("main", [x, y]):
        out = bb.emit(bb.call_te(topi.add, x, y))
        bb.emit_func_output(out)
    mod = bb.get()
    mod.update_global_info("vdevice", [vd0, vd1])
    with pytest.raises(BuildError, match="mix devices"):
        check_single_device_kernels(mod)


def split_module() -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            r = bb.emit(relax.op.nn.relu(x))
            s = bb.emit(relax.op.split(r, 2, axis=1))
            s0 = bb.emit(relax.TupleGetItem(s, 0))
            s1 = bb.emit(relax.TupleGetItem(s, 1))
            a = bb.emit(relax.op.subtract(s0, s1))
            e = bb.emit(relax.op.exp(s0))                 # s0 read by two consumers on the cpu
            out = bb.emit_output(relax.op.multiply(e, a))
        bb.emit_func_output(out)
    return bb.get()


def test_split_crossing_devices_with_reused_copy_runs_correctly():
    x = RNG.standard_normal((2, 8)).astype("float32")
    r = np.maximum(x, 0)
    expected = np.exp(r[:, :4]) * (r[:, :4] - r[:, 4:])
    result = built(["gpu", "gpu", "cpu", "cpu", "gpu"], module=split_module())
    np.testing.assert_allclose(result.run(x)[0], expected, rtol=1e-6)


def constant_operand_module() -> tvm.IRModule:
    """Ops whose tensor operands are all constants (take of a table) or absent (ones), as RNN imports have."""
    table = relax.const(WEIGHTS["wf"][:4, :8])
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 3), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            row = bb.emit(relax.op.take(table, relax.const(2, "int64"), axis=0, mode="clip"))   # (8,)
            ones = bb.emit(relax.op.ones(relax.ShapeExpr([8]), "float32"))
            h = bb.emit(relax.op.add(row, ones))
            h = bb.emit(relax.op.expand_dims(h, 0))
            out = bb.emit_output(relax.op.matmul(h, x))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("device_of", [["gpu", "gpu", "gpu", "cpu", "gpu"], ["cpu", "gpu", "cpu", "gpu", "cpu"]])
def test_ops_reading_only_constants_run_on_either_device(device_of):
    x = RNG.standard_normal((8, 3)).astype("float32")
    expected = ((WEIGHTS["wf"][2, :8] + 1.0)[None, :] @ x)
    result = built(device_of, module=constant_operand_module())
    np.testing.assert_allclose(result.run(x)[0], expected, rtol=1e-5, atol=1e-6)


def test_weights_can_stay_inside_main():
    result = built(INTERLEAVED, hoist_weight_uploads=False)
    assert result.manifest.weights_function is None and result.stats["weight_upload_bytes"] == 0
    vm = relax.VirtualMachine(result.executable, result.manifest.runtime_devices())
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(X)).numpy(), numpy_small_cnn(X), rtol=1e-4, atol=1e-4)


def test_export_writes_one_library_and_a_manifest_that_round_trips(tmp_path):
    result = export(built(MIXED), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json", "model.so"]
    manifest = BuildManifest.from_dict(json.loads(result.manifest_path.read_text()))
    assert manifest == result.manifest
    assert manifest.inputs[0] == {"name": "x", "shape": [1, 3, 16, 16], "dtype": "float32"}
    assert manifest.outputs[0] == {"name": "output0", "shape": [1, 10], "dtype": "float32"}
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(result.library_path)), manifest.runtime_devices())
    y = manifest.main_caller(vm)(tvm.runtime.tensor(X)).numpy()
    np.testing.assert_array_equal(y, result.run(X)[0])


def test_run_checks_input_shapes(all_cpu):
    with pytest.raises(InputMismatchError, match="shape"):
        all_cpu.run(X[:, :, :8])


def test_build_rejects_a_module_without_placement():
    with pytest.raises(BuildError, match="AnnotateDevicePlacement"):
        build(small_cnn(), DEVICES, emulate_gpu=True)


# ------------------------------------------------------------------------------------------ real CUDA code
@pytest.fixture(scope="module")
def cuda_build():
    return built(MIXED, emulate_gpu=False)


def test_cuda_build_turns_every_gpu_kernel_into_cuda(cuda_build, tmp_path):
    names = cuda_kernel_names(cuda_build)
    calls = kernel_calls(cuda_build.lowered)
    gpu_calls = {name for name, vds in calls if vds == {("cuda", 0, "global")}}
    cpu_calls = {name for name, vds in calls if vds == {("llvm", 0, "global")}}
    assert gpu_calls and cpu_calls and len(gpu_calls) + len(cpu_calls) == len({name for name, _ in calls})
    assert gpu_calls == set(names)          # every GPU-placed kernel, and only those, is compiled for CUDA
    kernels = check_cuda_kernels(cuda_build)
    assert all(any(k.startswith(n + "_kernel") for k in kernels) for n in names)
    assert not cuda_build.manifest.emulated
    assert {m.kind for m in _all_modules(cuda_build.executable.mod)} >= {"llvm", "cuda"}
    exported = export(cuda_build, tmp_path)          # the artifact a GPU machine would load
    assert exported.library_path.stat().st_size > 0


def test_generated_cuda_source_compiles_with_nvcc(cuda_build, nvcc_path):
    ptx = compile_cuda_source_with_nvcc(cuda_build, "ptx").decode(errors="replace")
    entries = set(re.findall(r"\.entry\s+(\w+)", ptx))
    assert set(check_cuda_kernels(cuda_build)) <= entries


def test_gpu_kernel_without_schedule_is_detected(monkeypatch):
    monkeypatch.setattr(build_module, "_apply_gpu_schedules", lambda mod, targets: mod)
    # without GPU schedules TVM compiles the GPU PrimFuncs silently as host code; build must refuse that
    with pytest.raises(BuildError, match="did not become CUDA kernels"):
        built(MIXED, emulate_gpu=False)


@pytest.mark.gpu
def test_cuda_build_runs_on_a_real_gpu(cuda_build):
    if not cuda_available():
        pytest.skip("no CUDA device")
    np.testing.assert_allclose(cuda_build.run(X)[0], numpy_small_cnn(X), rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------------ ResNet-18
@pytest.fixture(scope="module")
def resnet18():
    try:
        from models import build_onnx
        from tvm_passes.frontend import import_model
    except ImportError as exc:
        pytest.skip(f"zoo or frontend not importable yet ({exc})")
    path = build_onnx("resnet18", size=64)
    imported = import_model(path)
    n = len(op_bindings(imported.mod["main"]))
    # blocks of 5 ops alternate between the devices: convs, adds, relus, pools and the head on both
    plan = plan_of(["gpu" if (i // 5) % 2 == 0 else "cpu" for i in range(n)])
    return imported, AnnotateDevicePlacement(plan, DEVICES)(imported.mod), path


def test_mixed_resnet18_cuda_build_has_only_real_cuda_kernels(resnet18, nvcc_path):
    _, annotated, _ = resnet18
    result = build(annotated, DEVICES, emulate_gpu=False)
    names = cuda_kernel_names(result)
    assert len(names) >= 10 and any("conv2d" in n for n in names)
    check_cuda_kernels(result)
    ptx = compile_cuda_source_with_nvcc(result, "ptx")
    assert ptx.count(b".entry") >= len(names)


def test_mixed_resnet18_emulated_matches_onnxruntime(resnet18):
    ort = pytest.importorskip("onnxruntime")
    imported, annotated, path = resnet18
    spec = imported.inputs[0]
    x = np.random.default_rng(1).standard_normal(spec.shape).astype("float32")
    y = build(annotated, DEVICES, emulate_gpu=True).run(x)[0]
    session = ort.InferenceSession(str(imported.onnx_path or path))
    reference = session.run(None, {session.get_inputs()[0].name: x})[0]
    assert np.abs(y - reference).max() <= 1e-4 * max(1.0, float(np.abs(reference).max()))


# ------------------------------------------------------------------------------------------ unrolled LSTM
def test_unrolled_lstm_compiles_to_cuda_with_its_step_rows_on_the_gpu(nvcc_path, tmp_path):
    """The split tree that cuts an unrolled RNN's step rows (tvm_passes.rnn._step_rows) and the cell kernels get
    GPU schedules: the input projection and its splits on the GPU, steps alternating between the devices."""
    import onnx

    from hetpart.partition.slices import parse_rnn_tag
    from tests.tvm_passes.rnn_models import build_rnn_model
    from tvm_passes.frontend import import_model

    model, _ = build_rnn_model("LSTM", seq=20, batch=1, input_size=8, hidden=16, with_initial=False)
    onnx.save(model, tmp_path / "lstm.onnx")
    imported = import_model(tmp_path / "lstm.onnx")
    tags = [parse_rnn_tag(b.var.name) or {} for b in op_bindings(imported.mod["main"])]
    device_of = ["gpu" if t.get("rnn_phase") == "input_projection" or t.get("rnn_phase") == "step"
                 and t["rnn_step"] % 2 == 0 else "cpu" for t in tags]
    assert "gpu" in device_of and "cpu" in device_of
    result = build(AnnotateDevicePlacement(plan_of(device_of), DEVICES)(imported.mod), DEVICES, emulate_gpu=False)
    gpu_kernels = cuda_kernel_names(result)
    assert any("split" in n for n in gpu_kernels) and any("sigmoid" in n for n in gpu_kernels), gpu_kernels
    check_cuda_kernels(result)
    assert compile_cuda_source_with_nvcc(result, "ptx").count(b".entry") >= len(gpu_kernels)
