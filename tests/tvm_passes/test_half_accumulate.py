"""float16 models: reductions, normalisations and transcendental functions computed in float32 (half_accumulate)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.onnx_builders import OPSET, save

tvm = pytest.importorskip("tvm")
ort = pytest.importorskip("onnxruntime")
from tvm import relax  # noqa: E402

import hetpart  # noqa: E402
from hetpart.driver.check import compare_outputs, computes_in_half  # noqa: E402
from tvm_passes import frontend  # noqa: E402
from tvm_passes.frontend import import_model  # noqa: E402
from tvm_passes.half_accumulate import accumulate_half_in_float32  # noqa: E402

pytestmark = pytest.mark.tvm

SHAPE = (1, 8, 24, 24)


def half_model(path, dtype=np.float16, keep_io_types=False):
    """conv + bias + ReLU, global mean, layer norm, matmul, erf GELU, softmax (every op in ``dtype``), written by
    onnx.helper: a model exported in half precision, as published for GPUs (``keep_io_types``: with float32 input
    and output cast to and from float16 inside, as float16 converters write when asked to keep them)."""
    rng = np.random.default_rng(0)
    elem = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    inits = []

    def const(name, array):
        inits.append(numpy_helper.from_array(np.asarray(array, dtype=dtype), name))
        return name

    nodes = [
        helper.make_node("Conv", ["x", const("w", rng.standard_normal((32, 8, 3, 3)) * 0.2),
                                  const("b", rng.standard_normal(32) * 0.1)], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("ReduceMean", ["r", "axes"], ["m"], keepdims=0),
        helper.make_node("LayerNormalization", ["m", const("g", rng.uniform(0.5, 1.5, 32)),
                                                const("be", rng.standard_normal(32) * 0.1)], ["n"], axis=-1),
        helper.make_node("MatMul", ["n", const("wf", rng.standard_normal((32, 16)) * 0.3)], ["f"]),
        helper.make_node("Div", ["f", const("sqrt2", 2 ** 0.5)], ["fs"]),
        helper.make_node("Erf", ["fs"], ["e"]),
        helper.make_node("Add", ["e", const("one", 1.0)], ["e1"]),
        helper.make_node("Mul", ["f", "e1"], ["g2"]),
        helper.make_node("Mul", ["g2", const("half", 0.5)], ["gelu"]),
        helper.make_node("Softmax", ["gelu"], ["y"], axis=-1),
    ]
    inits.append(numpy_helper.from_array(np.array([2, 3], np.int64), "axes"))
    io = elem
    if keep_io_types:
        io = TensorProto.FLOAT
        nodes[0].input[0] = "x_half"
        nodes[-1].output[0] = "y_half"
        nodes = [helper.make_node("Cast", ["x"], ["x_half"], to=elem), *nodes,
                 helper.make_node("Cast", ["y_half"], ["y"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "half", [helper.make_tensor_value_info("x", io, list(SHAPE))],
                              [helper.make_tensor_value_info("y", io, [1, 16])], inits)
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), path)


def reference(path, x):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def normwise_error(ours, exact):
    return float(np.abs(ours.astype(np.float64) - exact).max() / np.abs(exact).max())


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("half")
    return half_model(root / "half.onnx"), half_model(root / "single.onnx", np.float32)


def test_half_ops_that_accumulate_or_approximate_compute_in_float32(models):
    mod = import_model(str(models[0])).mod
    calls = {}
    for binding in mod["main"].body.blocks[0].bindings:
        value = binding.value
        if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
            dtypes = [str(arg.ty.dtype) for arg in value.args if isinstance(getattr(arg, "ty", None),
                                                                            relax.TensorType)]
            calls.setdefault(value.op.name.removeprefix("relax."), []).append((dtypes, str(binding.var.ty.dtype)))
    # conv and matmul keep their float16 operands and sum in float32
    assert calls["nn.conv2d"] == [(["float16", "float16"], "float32")]
    assert calls["matmul"] == [(["float16", "float16"], "float32")]
    for name in ("mean", "nn.layer_norm", "erf", "nn.softmax"):
        assert calls[name] == [(["float32"] * len(calls[name][0][0]), "float32")], name
    # exact float16 arithmetic stays as written, and the model's interface is float16
    assert all(out == "float16" for _, out in calls["multiply"] + calls["nn.relu"])
    assert str(mod["main"].ret_ty.dtype) == "float16"


def test_single_precision_models_are_unchanged(models):
    mod = import_model(str(models[1]), pad_columns=False).mod
    assert accumulate_half_in_float32(mod) == (mod, 0)


def test_half_model_is_as_accurate_as_onnxruntime_on_a_mixed_plan(models, tmp_path, monkeypatch):
    """On a CPU + emulated GPU plan, hetpart's float16 run is within a small factor of onnxruntime's float16 error
    (both against the model in float32); summing in float16 was ~20x onnxruntime's error, and its erf (float16 GELU)
    did not build for the CPU at all."""
    half, single = models
    x = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float16)
    exact = reference(single, x.astype(np.float32)).astype(np.float64)
    ort_half = reference(half, x)
    compiled = hetpart.compile(str(half), devices="cpu,gpu=p2200", method="all_gpu", output_dir=tmp_path / "out",
                               pins={"op:relax.matmul": "cpu", "op:relax.nn.softmax": "cpu"})
    assert set(compiled.plan.device_of) == {"cpu", "gpu"}
    ours = np.asarray(hetpart.load(tmp_path / "out")(x)[0])
    assert ours.dtype == np.float16
    assert normwise_error(ours, exact) <= 3 * normwise_error(ort_half, exact) + 1e-4
    assert compare_outputs([ours], [ort_half]).ok

    monkeypatch.setattr(frontend, "accumulate_half_in_float32", lambda mod: (mod, 0))
    with pytest.raises(hetpart.errors.BuildError, match="erf"):
        hetpart.compile(str(half), devices="cpu", output_dir=tmp_path / "float16_sums")


def test_half_check_is_normwise_and_catches_real_differences():
    reference_out = np.array([[8.0, -0.01, 3.0]], np.float16)
    rounded = (reference_out.astype(np.float32) + np.float32(0.05)).astype(np.float16)   # 0.6% of the magnitude
    result = compare_outputs([rounded], [reference_out])
    assert result.ok and result.max_half_error == pytest.approx(0.05 / 8, rel=0.05)
    assert "half-precision outputs" in result.describe()
    wrong = reference_out[:, ::-1].copy()
    assert not compare_outputs([wrong], [reference_out]).ok
    assert not compare_outputs([rounded], [reference_out], half_tolerance=1e-3).ok


def test_half_conv_and_matmul_compile_to_cuda(models, nvcc_path):
    from tvm_passes.build import check_cuda_kernels, compile_cuda_source_with_nvcc

    compiled = hetpart.compile(str(models[0]), devices="cpu,gpu=t4", method="all_gpu", emulate_gpu=False)
    kernels = check_cuda_kernels(compiled.build)
    assert any("conv2d" in name for name in kernels) and any("matmul" in name for name in kernels)
    assert compile_cuda_source_with_nvcc(compiled.build, "ptx").count(b".entry") >= len(kernels)


def test_cpu_conv_rules_take_half_convs_summing_in_float32(models, tmp_path):
    """The conv rules look through the operands' casts: a float16 conv gets the flat-position tiling its float32
    twin gets (ResNet-18 in float16: 133 -> 25 ms on 2 threads, onnxruntime 20 ms), and computes the same."""
    from tvm_passes.outline import deployment_pipeline, outline_kernels
    from tvm_passes.schedules import RULE_ATTR

    pipeline, target = deployment_pipeline(None, None)
    rules = {}
    for path in models:
        for kernel in outline_kernels(import_model(str(path)).mod, target):
            if "conv2d" in kernel.name:
                rules[path.stem] = {str(f.attrs[RULE_ATTR]) for f in kernel.mod.functions.values()
                                    if isinstance(f, tvm.tirx.PrimFunc) and f.attrs and RULE_ATTR in f.attrs}
    assert rules["half"] == rules["single"] == {"conv2d_flat"}
    x = np.random.default_rng(3).standard_normal(SHAPE).astype(np.float16)
    compiled = hetpart.compile(str(models[0]), devices="cpu", output_dir=tmp_path / "cpu")
    assert compare_outputs([compiled(x)[0]], [reference(models[0], x)]).ok


def test_a_half_model_with_single_precision_inputs_and_outputs_is_checked_as_half(tmp_path):
    """A model converted to float16 inside, its float32 input and output kept: its output carries float16 errors, so
    the check holds it to the half-precision bound (the elementwise float32 bound fails on it)."""
    path = half_model(tmp_path / "kept.onnx", keep_io_types=True)
    compiled = hetpart.compile(str(path), devices="cpu", output_dir=tmp_path / "out")
    x = np.random.default_rng(4).standard_normal(SHAPE).astype(np.float32)
    ours, theirs = [compiled(x)[0]], [reference(path, x)]
    assert ours[0].dtype == np.float32 and computes_in_half(compiled.op_graph)
    assert compare_outputs(ours, theirs, half_precision=True).ok
    assert not compare_outputs(ours, theirs).ok
    assert not computes_in_half(hetpart.compile(str(half_model(tmp_path / "f32.onnx", np.float32)),
                                                devices="cpu").op_graph)


def test_a_half_precision_torch_module_gets_the_onnx_route_which_compiles(tmp_path):
    """TVM's torch importer sums convs in float32 and then adds a float16 bias, which it refuses: the error names the
    ONNX route (one line, typed), and the module's ONNX export compiles and matches torch's half run."""
    torch = pytest.importorskip("torch")
    import warnings

    from hetpart.errors import ModelLoadError

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                                 torch.nn.Linear(8 * 6 * 6, 4)).eval().half()
    x = torch.randn(1, 3, 6, 6).half()
    with pytest.raises(ModelLoadError, match=r"torch\.onnx\.export\(module, example_inputs, 'model\.onnx', "
                                             r"dynamo=False\)") as info:
        hetpart.compile(module, example_inputs=(x,), devices="cpu")
    assert "\n" not in str(info.value)
    path = tmp_path / "half.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x,), str(path), dynamo=False, opset_version=17)
    with torch.no_grad():
        expected = module(x).numpy()
    got = hetpart.compile(str(path), devices="cpu")(x.numpy())[0]
    assert compare_outputs([got], [expected]).ok


@pytest.mark.parametrize("op_type,attrs", [("Elu", {"alpha": 0.5}), ("Selu", {}), ("LRN", {"size": 3}),
                                           ("InstanceNormalization", {}), ("Softplus", {}), ("Mish", {})])
def test_one_op_half_models_match_onnxruntime(tmp_path, op_type, attrs):
    """float16 one-op models; TVM's Elu, Selu and LRN converters built float32 constants and refused a float16
    input (they now run in float32 and round once, as onnxruntime does)."""
    shape = (1, 4, 6, 6)
    inputs = ["x", "scale", "bias"] if op_type == "InstanceNormalization" else ["x"]
    inits = [numpy_helper.from_array(np.full(4, v, np.float16), n) for n, v in (("scale", 1.5), ("bias", 0.1))] \
        if op_type == "InstanceNormalization" else []
    graph = helper.make_graph([helper.make_node(op_type, inputs, ["y"], **attrs)], "one",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT16, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, list(shape))], inits)
    path = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), tmp_path / "one.onnx")
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float16)
    got = hetpart.compile(str(path), devices="cpu")(x)[0]
    assert got.dtype == np.float16 and compare_outputs([got], [reference(path, x)]).ok
