"""AnnotateDevicePlacement: vdevices, placement, copies (one per tensor and destination), issue order."""
from __future__ import annotations

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
tvm_ffi = pytest.importorskip("tvm_ffi")
from tvm import relax  # noqa: E402
from tvm.script import ir as I  # noqa: E402
from tvm.script import relax as R  # noqa: E402

from hetpart.devices import DeviceSet, cpu_device, gpu_from_preset, preset_links  # noqa: E402
from hetpart.errors import InvalidPlanError, UnknownDeviceError  # noqa: E402
from hetpart.plan import Plan  # noqa: E402
from tvm_passes.annotate import VDEVICE_NAMES_ATTR, AnnotateDevicePlacement  # noqa: E402
from tvm_passes.bindings import op_bindings  # noqa: E402

pytestmark = pytest.mark.tvm

DEVICES = DeviceSet((cpu_device(), gpu_from_preset("t4")), preset_links("t4"))
TO_VDEVICE = "relax.to_vdevice"


def make_plan(device_of, order=None) -> Plan:
    return Plan(device_of=tuple(device_of), order=tuple(order if order is not None else range(len(device_of))),
                devices=("cpu", "gpu"), method="hand-written")


def bindings_of(mod: tvm.IRModule) -> list:
    return [b for block in mod["main"].body.blocks for b in block.bindings]


def op_names(mod: tvm.IRModule) -> list[str]:
    return [b.value.op.name for b in op_bindings(mod["main"])]


def copies(mod: tvm.IRModule) -> list:
    return [b for b in op_bindings(mod["main"]) if b.value.op.name == TO_VDEVICE]


def kind_of(ty) -> str:
    return str(ty.vdevice.target.kind.name)


# ------------------------------------------------------------------------------------------ TVMScript pair
@I.ir_module
class MatmulReluAddBefore:
    @R.function
    def main(x: R.Tensor((2, 4), "float32"), y: R.Tensor((4, 3), "float32")) -> R.Tensor((2, 3), "float32"):
        with R.dataflow():
            lv = R.matmul(x, y)
            lv1 = R.nn.relu(lv)
            lv2 = R.add(lv1, lv)
            R.output(lv2)
        return lv2


@I.ir_module
class MatmulReluAddExpected:
    I.module_global_infos({"vdevice": [I.vdevice({"kind": "llvm"}, 0, "global"),
                                       I.vdevice({"kind": "cuda", "arch": "sm_75"}, 0, "global")]})

    @R.function
    def main(x: R.Tensor((2, 4), "float32", vdevice="llvm:0"),
             y: R.Tensor((4, 3), "float32", vdevice="llvm:0")) -> R.Tensor((2, 3), "float32", vdevice="llvm:0"):
        R.func_attr({"hetpart.vdevice_names": ["cpu", "gpu"]})
        with R.dataflow():
            x_to_gpu: R.Tensor((2, 4), "float32", vdevice="cuda:0") = R.to_vdevice(x, "cuda:0")
            y_to_gpu: R.Tensor((4, 3), "float32", vdevice="cuda:0") = R.to_vdevice(y, "cuda:0")
            lv: R.Tensor((2, 3), "float32", vdevice="cuda:0") = R.matmul(x_to_gpu, y_to_gpu)
            lv1: R.Tensor((2, 3), "float32", vdevice="cuda:0") = R.nn.relu(lv)
            lv1_to_cpu: R.Tensor((2, 3), "float32", vdevice="llvm:0") = R.to_vdevice(lv1, "llvm:0")
            lv_to_cpu: R.Tensor((2, 3), "float32", vdevice="llvm:0") = R.to_vdevice(lv, "llvm:0")
            lv2: R.Tensor((2, 3), "float32", vdevice="llvm:0") = R.add(lv1_to_cpu, lv_to_cpu)
            gv: R.Tensor((2, 3), "float32", vdevice="llvm:0") = lv2
            R.output(gv)
        return gv


def test_before_expected_tvmscript():
    after = AnnotateDevicePlacement(make_plan(["gpu", "gpu", "cpu"]), DEVICES)(MatmulReluAddBefore)
    assert tvm_ffi.structural_equal(after, MatmulReluAddExpected), after.script()


# ------------------------------------------------------------------------------------------ BlockBuilder cases
def conv_module(weight: tvm.ir.GenericConst) -> tvm.IRModule:
    """x -> conv2d -> relu -> add(relu, conv) -> output; deterministic for a given weight constant."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 8, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv2d(x, weight, padding=1))
            relu = bb.emit(relax.op.nn.relu(conv))
            out = bb.emit_output(relax.op.add(relu, conv))
        bb.emit_func_output(out)
    return bb.get()


def conv_expected(weight: tvm.ir.GenericConst) -> tvm.IRModule:
    """conv_module with conv and relu on the GPU, add on the CPU, written out by hand."""
    vd_cpu = relax.VDevice(tvm.target.Target({"kind": "llvm"}), 0, "global")
    vd_gpu = relax.VDevice(tvm.target.Target({"kind": "cuda", "arch": "sm_75"}), 0, "global")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 8, 8), "float32", vd_cpu))
    with bb.function("main", [x], attrs={VDEVICE_NAMES_ATTR: ["cpu", "gpu"]}):
        with bb.dataflow():
            x_gpu = bb.emit(relax.op.to_vdevice(x, vd_gpu))
            # constants are typed as living on the host (where the VM loads them), then copied
            w_host = tvm.ir.GenericConst(weight.value, relax.TensorType(weight.ty.shape, "float32", vd_cpu))
            w_gpu = bb.emit(relax.op.to_vdevice(w_host, vd_gpu))
            conv = bb.emit(relax.op.nn.conv2d(x_gpu, w_gpu, padding=1))
            relu = bb.emit(relax.op.nn.relu(conv))
            relu_cpu = bb.emit(relax.op.to_vdevice(relu, vd_cpu))
            conv_cpu = bb.emit(relax.op.to_vdevice(conv, vd_cpu))
            add = bb.emit(relax.op.add(relu_cpu, conv_cpu))
            out = bb.emit_output(add)
        bb.emit_func_output(out)
    mod = bb.get()
    mod.update_global_info("vdevice", [vd_cpu, vd_gpu])
    return mod


@pytest.fixture(scope="module")
def weight():
    return relax.const(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype("float32"))


def test_before_expected_blockbuilder_with_weight_copy(weight):
    after = AnnotateDevicePlacement(make_plan(["gpu", "gpu", "cpu"]), DEVICES)(conv_module(weight))
    assert tvm_ffi.structural_equal(after, conv_expected(weight)), after.script()


def test_input_module_is_unchanged(weight):
    mod = conv_module(weight)
    text_before = mod.script(show_meta=True)
    AnnotateDevicePlacement(make_plan(["gpu", "cpu", "gpu"]), DEVICES)(mod)
    assert "vdevice" not in mod.global_infos
    assert mod.script(show_meta=True) == text_before
    assert tvm_ffi.structural_equal(mod, conv_module(weight))


def test_all_on_cpu_adds_no_copies_and_inputs_outputs_on_cpu(weight):
    after = AnnotateDevicePlacement(make_plan(["cpu"] * 3), DEVICES)(conv_module(weight))
    assert copies(after) == []
    main = after["main"]
    assert kind_of(main.params[0].ty) == "llvm"
    assert kind_of(main.body.body.ty) == "llvm"


def test_output_produced_on_gpu_is_returned_on_cpu(weight):
    after = AnnotateDevicePlacement(make_plan(["cpu", "cpu", "gpu"]), DEVICES)(conv_module(weight))
    main = after["main"]
    assert kind_of(main.body.body.ty) == "llvm"
    last_copy = copies(after)[-1]
    assert kind_of(last_copy.var.ty) == "llvm" and kind_of(last_copy.value.args[0].ty) == "cuda"


def test_every_op_output_carries_its_planned_vdevice(weight):
    plan = make_plan(["gpu", "cpu", "gpu"])
    after = AnnotateDevicePlacement(plan, DEVICES)(conv_module(weight))
    placed = [b for b in op_bindings(after["main"]) if b.value.op.name != TO_VDEVICE]
    assert [b.value.op.name for b in placed] == ["relax.nn.conv2d", "relax.nn.relu", "relax.add"]
    assert [kind_of(b.var.ty) for b in placed] == ["cuda", "llvm", "cuda"]
    for b in placed:   # every tensor operand is on the op's device
        for arg in b.value.args:
            if isinstance(arg, relax.Var):
                assert kind_of(arg.ty) == kind_of(b.var.ty)


def fanout_module() -> tvm.IRModule:
    """a = relu(x); b = exp(a); c = sigmoid(a); d = tanh(x); out = b + c + d  (a feeds two consumers)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.relu(x))
            b = bb.emit(relax.op.exp(a))
            c = bb.emit(relax.op.sigmoid(a))
            d = bb.emit(relax.op.tanh(x))
            e = bb.emit(relax.op.add(b, c))
            out = bb.emit_output(relax.op.add(e, d))
        bb.emit_func_output(out)
    return bb.get()


def test_one_copy_per_tensor_and_destination_reused_by_two_consumers():
    # relu on cpu; exp and sigmoid (both read relu's output) on gpu -> exactly one copy of relu's output
    plan = make_plan(["cpu", "gpu", "gpu", "cpu", "cpu", "cpu"])
    after = AnnotateDevicePlacement(plan, DEVICES)(fanout_module())
    to_gpu = [c for c in copies(after) if kind_of(c.var.ty) == "cuda"]
    assert len(to_gpu) == 1
    readers = [b for b in op_bindings(after["main"]) if b.value.op.name in ("relax.exp", "relax.sigmoid")]
    assert all(b.value.args[0].same_as(to_gpu[0].var) for b in readers)
    # exp and sigmoid both come back to the cpu: two different tensors, two copies
    assert len([c for c in copies(after) if kind_of(c.var.ty) == "llvm"]) == 2


def test_bindings_follow_plan_order_gpu_first():
    # issue the GPU branch (tanh, op 3) before the CPU chain
    plan = make_plan(["cpu", "cpu", "cpu", "gpu", "cpu", "cpu"], order=[3, 0, 1, 2, 4, 5])
    after = AnnotateDevicePlacement(plan, DEVICES)(fanout_module())
    names = [n for n in op_names(after) if n != TO_VDEVICE]
    assert names == ["relax.tanh", "relax.nn.relu", "relax.exp", "relax.sigmoid", "relax.add", "relax.add"]
    first_ops = op_names(after)[:2]
    assert first_ops == [TO_VDEVICE, "relax.tanh"]


def split_module() -> tvm.IRModule:
    """s = split(relu(x), 2); out = s[0] * (s[0] + s[1]) -- a tuple-producing op feeding two devices."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            r = bb.emit(relax.op.nn.relu(x))
            s = bb.emit(relax.op.split(r, 2, axis=1))
            s0 = bb.emit(relax.TupleGetItem(s, 0))
            s1 = bb.emit(relax.TupleGetItem(s, 1))
            a = bb.emit(relax.op.add(s0, s1))
            out = bb.emit_output(relax.op.multiply(s0, a))
        bb.emit_func_output(out)
    return bb.get()


def test_split_outputs_cross_devices_through_tuple_get_item():
    plan = make_plan(["gpu", "gpu", "cpu", "gpu"])
    after = AnnotateDevicePlacement(plan, DEVICES)(split_module())
    split = next(b for b in op_bindings(after["main"]) if b.value.op.name == "relax.split")
    assert all(kind_of(f) == "cuda" for f in split.var.ty.fields)
    to_cpu = [c for c in copies(after) if kind_of(c.var.ty) == "llvm"]
    # both halves go to the cpu for the add; the add result goes back to the gpu for the multiply,
    # and the multiply result returns to the cpu; s0 is not copied twice
    assert len(to_cpu) == 3
    assert len([c for c in copies(after) if kind_of(c.var.ty) == "cuda"]) == 2   # x in, add result back


def test_op_bindings_skip_non_op_bindings():
    ops = op_bindings(split_module()["main"])
    assert [b.value.op.name for b in ops] == ["relax.nn.relu", "relax.split", "relax.add", "relax.multiply"]


# ------------------------------------------------------------------------------------------ errors
def test_plan_for_another_model_is_rejected(weight):
    with pytest.raises(InvalidPlanError, match="op bindings"):
        AnnotateDevicePlacement(make_plan(["cpu"] * 5), DEVICES)(conv_module(weight))


def test_non_topological_order_is_rejected(weight):
    with pytest.raises(InvalidPlanError, match="topological"):
        AnnotateDevicePlacement(make_plan(["cpu"] * 3, order=[1, 0, 2]), DEVICES)(conv_module(weight))


def test_unknown_device_is_rejected(weight):
    plan = Plan(device_of=("cpu", "npu", "cpu"), order=(0, 1, 2), devices=("cpu", "npu"), method="hand")
    with pytest.raises(UnknownDeviceError, match="npu"):
        AnnotateDevicePlacement(plan, DEVICES)(conv_module(weight))


def test_kernel_level_plan_is_rejected():
    plan = Plan(device_of=("cpu",), order=(0,), devices=("cpu", "gpu"), method="hand", level="kernel")
    with pytest.raises(InvalidPlanError, match="op-level"):
        AnnotateDevicePlacement(plan, DEVICES)
