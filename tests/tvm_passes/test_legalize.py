"""hetpart's LegalizeOps: exp/tanh/sigmoid/erf (and the ops built on them) become TVM's vectorisable fast versions
everywhere hetpart compiles, with the numerics of the exact functions."""
from __future__ import annotations

import contextlib
import re

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
from scipy import special  # noqa: E402
from tvm import relax  # noqa: E402

from hetpart.devices import DeviceSet, cpu_device, gpu_from_preset, preset_links  # noqa: E402
from hetpart.plan import Plan  # noqa: E402
from tvm_passes.annotate import AnnotateDevicePlacement  # noqa: E402
from tvm_passes.bindings import op_bindings  # noqa: E402
from tvm_passes.build import build  # noqa: E402
from tvm_passes.legalize import LEGALIZE_OVERRIDES, legalize_ops, with_hetpart_legalization  # noqa: E402
from tvm_passes.schedules import cpu_pipeline, default_cpu_target  # noqa: E402

pytestmark = pytest.mark.tvm
SHAPE = (128, 1024)   # BERT-small's GELU at sequence length 128
LIBM_CALLS = {"exp", "tanh", "sigmoid", "erf"}     # TIR intrinsics the llvm backend emits as scalar libm calls


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# op -> (relax builder, float64 reference)
OPS = {
    "exp": (relax.op.exp, np.exp),
    "tanh": (relax.op.tanh, np.tanh),
    "sigmoid": (relax.op.sigmoid, special.expit),
    "erf": (relax.op.erf, special.erf),
    "nn.gelu": (relax.op.nn.gelu, lambda x: x * 0.5 * (1 + special.erf(x / np.sqrt(2)))),
    "nn.gelu_tanh": (relax.op.nn.gelu_tanh,
                     lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))),
    "nn.silu": (relax.op.nn.silu, lambda x: x * special.expit(x)),
    "nn.softmax": (lambda x: relax.op.nn.softmax(x, axis=-1), _softmax),
}


def unary_module(op: str, dtype: str = "float32") -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(SHAPE, dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(OPS[op][0](x))
        bb.emit_func_output(out)
    return bb.get()


def gelu_onnx_module() -> tvm.IRModule:
    """GELU as the ONNX importer writes it: x * 0.5 * (1 + erf(x / sqrt 2)) (the zoo's BERT)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(SHAPE, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.erf(relax.op.divide(x, relax.const(np.sqrt(2.0), "float32"))))
            h = bb.emit(relax.op.multiply(relax.op.multiply(x, relax.const(0.5, "float32")),
                                          relax.op.add(h, relax.const(1.0, "float32"))))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    return bb.get()


def _libm_calls(mod: tvm.IRModule) -> set[str]:
    src = "\n".join(str(f) for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc))
    return set(re.findall(r"T\.(\w+)\(", src)) & LIBM_CALLS


def test_every_op_in_the_table_has_an_override():
    assert {f"relax.{op}" for op in OPS} == set(LEGALIZE_OVERRIDES)


@pytest.mark.parametrize("op", sorted(OPS))
def test_float32_ops_legalize_without_libm_calls_other_dtypes_keep_them(op):
    assert _libm_calls(relax.transform.LegalizeOps()(unary_module(op)))     # TVM's own: a libm call per element
    assert not _libm_calls(legalize_ops()(unary_module(op)))
    assert _libm_calls(legalize_ops()(unary_module(op, "float64")))


@pytest.mark.parametrize("op", sorted(OPS))
def test_kernel_names_stay_those_of_tvms_legalization(op):
    names = lambda mod: sorted(gv.name_hint for gv, f in mod.functions_items()   # noqa: E731
                               if isinstance(f, tvm.tirx.PrimFunc))
    assert names(legalize_ops()(unary_module(op))) == names(relax.transform.LegalizeOps()(unary_module(op)))


def test_stock_pass_lists_get_hetpart_legalization():
    passes = [relax.transform.LegalizeOps(), relax.transform.FuseOps()]
    replaced = with_hetpart_legalization(passes)
    assert [p.info.name for p in replaced] == ["LegalizeOps", "FuseOps"]
    assert replaced[0] is not passes[0] and replaced[1] is passes[1]


def _compiled(mod: tvm.IRModule, pipeline, x: np.ndarray):
    """(the result, a timer of ``main``, its argument)."""
    exe = tvm.compile(mod, target=default_cpu_target(), relax_pipeline=pipeline)
    vm = relax.VirtualMachine(exe, tvm.cpu())
    arg = tvm.runtime.tensor(x, tvm.cpu())
    return vm["main"](arg).numpy(), vm.time_evaluator("main", tvm.cpu(), number=20, repeat=1), arg


def _input(seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal(SHAPE).astype("float32") * 4.0
    x[0, :6] = [-90.0, -30.0, -9.5, 9.5, 30.0, 80.0]           # saturated / clamped ranges of the approximations
    return x


@pytest.mark.parametrize("op", sorted(OPS))
def test_cpu_pipeline_matches_the_exact_function(op):
    x = _input(0)
    y = _compiled(unary_module(op), cpu_pipeline(default_cpu_target()), x)[0]
    expected = OPS[op][1](x.astype("float64"))
    scale = np.maximum(np.abs(expected), 1.0)                      # relative for large values, absolute near 0
    # softmax sums 1024 float32 terms: TVM's exact softmax is off by the same 4.2e-6 here
    tolerance = 1e-5 if op == "nn.softmax" else 2e-6
    assert np.all(np.isfinite(y)) and np.max(np.abs(y - expected) / scale) <= tolerance


@contextlib.contextmanager
def one_tvm_thread():
    """Run TVM's CPU kernels on one thread: timings then do not depend on what the other pytest-xdist worker
    runs on the second core (two 2-thread pools on 2 cores made hetpart's parallel kernels 100x slower, while
    TVM's default pipeline compiles serial kernels)."""
    import tvm_ffi

    config = tvm_ffi.get_global_func("runtime.config_threadpool")
    threads = tvm_ffi.get_global_func("runtime.NumThreads")
    before = threads()
    config(1, 1)
    try:
        yield
    finally:
        config(1, before)


@pytest.mark.parametrize("make", [gelu_onnx_module, lambda: unary_module("sigmoid")], ids=["gelu-erf", "sigmoid"])
def test_fast_kernels_are_much_faster_than_the_libm_ones(make):
    x = _input(1)
    target = default_cpu_target()
    with one_tvm_thread():
        ours, ours_timer, arg = _compiled(make(), cpu_pipeline(target), x)
        stock, stock_timer, _ = _compiled(make(), relax.get_default_pipeline(target), x)
        # interleaved windows, the fastest of each kept: another process on the core only adds time
        ours_windows, stock_windows = [], []
        for _ in range(7):
            ours_windows.append(float(ours_timer(arg).results[0]))
            stock_windows.append(float(stock_timer(arg).results[0]))
        ours_s, stock_s = min(ours_windows), min(stock_windows)
    np.testing.assert_allclose(ours, stock, rtol=2e-6, atol=2e-6)
    # one thread, measured here: GELU 23 vs 1863 µs, sigmoid 22 vs 212 µs; ratios (one run, same process)
    assert ours_s * 5 < stock_s, (ours_s, stock_s)


def test_heterogeneous_build_uses_the_overrides(monkeypatch):
    from tvm_passes import legalize

    calls = []
    original = legalize.LEGALIZE_OVERRIDES["relax.erf"]
    monkeypatch.setitem(legalize.LEGALIZE_OVERRIDES, "relax.erf",
                        lambda bb, call: calls.append(call) or original(bb, call))
    devices = DeviceSet((cpu_device(), gpu_from_preset("t4")), preset_links("t4"))
    mod = gelu_onnx_module()
    n = len(op_bindings(mod["main"]))
    plan = Plan(device_of=tuple("gpu" if i == 1 else "cpu" for i in range(n)), order=tuple(range(n)),
                devices=("cpu", "gpu"), method="hand-written")
    result = build(AnnotateDevicePlacement(plan, devices)(mod), devices, emulate_gpu=True)
    x = _input(2)
    y = result.run(x)[0]
    assert calls, "build() did not legalize erf with hetpart's override"
    expected = OPS["nn.gelu"][1](x.astype("float64"))
    assert np.max(np.abs(y - expected) / np.maximum(np.abs(expected), 1.0)) <= 2e-6
