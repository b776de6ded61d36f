"""The pooling rule: sliding-window max/average pools, numerics against torch and the schedule's shape."""
from __future__ import annotations

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
torch = pytest.importorskip("torch")
from tvm import relax, tirx  # noqa: E402

from tvm_passes.schedules import cpu_pipeline, cpu_schedule_pass, default_cpu_target  # noqa: E402
from tvm_passes.schedules.pipeline import cpu_generic  # noqa: E402

pytestmark = pytest.mark.tvm

RNG = np.random.default_rng(0)


@pytest.fixture(scope="module")
def target():
    return default_cpu_target()


def _module(shape, body):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(body(x))
        bb.emit_func_output(out)
    return bb.get()


def _scheduled(mod, target):
    with target:
        legal = tvm.transform.Sequential(cpu_generic.legalize_passes(target) + [cpu_schedule_pass(target)])(mod)
    return [f for _, f in legal.functions_items() if isinstance(f, tirx.PrimFunc)]


def _run(mod, target, x):
    ex = tvm.compile(mod, target=target, relax_pipeline=cpu_pipeline(target))
    return relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


# (input shape, kind, window, stride, padding, ceil mode, count_include_pad)
CASES = [
    pytest.param((1, 64, 27, 27), "max", 3, 2, 0, True, True, id="squeezenet-ceil"),
    pytest.param((1, 16, 28, 28), "max", 3, 2, 1, False, True, id="resnet-stem-pad"),
    pytest.param((2, 3, 13, 13), "max", 5, 1, 2, False, True, id="few-planes-rows-in-parallel"),
    pytest.param((1, 24, 14, 14), "max", 3, 1, 1, True, True, id="inception-branch-s1"),
    pytest.param((1, 32, 28, 28), "avg", 2, 2, 0, False, True, id="densenet-transition"),
    pytest.param((1, 8, 15, 17), "avg", 3, 2, 1, True, False, id="avg-pad-excluded-ceil"),
    pytest.param((1, 8, 15, 17), "avg", 3, 2, 1, False, True, id="avg-pad-included"),
    pytest.param((1, 20, 9, 31), "max", (2, 1), (2, 1), 0, False, True, id="crnn-tall-window"),
]


@pytest.mark.parametrize("shape,kind,window,stride,padding,ceil,include_pad", CASES)
def test_pooling_rule_matches_torch_and_hoists_the_padding(target, shape, kind, window, stride, padding, ceil,
                                                           include_pad):
    x = RNG.standard_normal(shape).astype("float32")
    if kind == "max":
        mod = _module(shape, lambda v: relax.op.nn.max_pool2d(v, pool_size=window, strides=stride, padding=padding,
                                                              ceil_mode=ceil))
        ref = torch.nn.functional.max_pool2d(torch.from_numpy(x), window, stride, padding, ceil_mode=ceil)
    else:
        mod = _module(shape, lambda v: relax.op.nn.avg_pool2d(v, pool_size=window, strides=stride, padding=padding,
                                                              ceil_mode=ceil, count_include_pad=include_pad))
        ref = torch.nn.functional.avg_pool2d(torch.from_numpy(x), window, stride, padding, ceil_mode=ceil,
                                             count_include_pad=include_pad)
    funcs = _scheduled(mod, target)
    pools = [f for f in funcs if f.attrs.get("hetpart.cpu_rule") == "pooling"]
    assert len(pools) == 1, [f.attrs.get("hetpart.cpu_rule") for f in funcs]
    text = pools[0].script()
    assert "T.parallel(" in text
    window = text[text.index(f'T.sblock("pool_{"max" if kind == "max" else "sum"}")'):].split("T.sblock(")[1]
    # The padding is materialised per plane: the window loop reads it without a bounds test.
    assert "T.if_then_else" not in window
    np.testing.assert_allclose(_run(mod, target, x), ref.numpy(), rtol=1e-5, atol=1e-5)


def test_pooling_rule_covers_1d_and_3d_pools(target):
    x1 = RNG.standard_normal((1, 12, 40)).astype("float32")
    mod = _module(x1.shape, lambda v: relax.op.nn.max_pool1d(v, pool_size=3, strides=2, padding=1))
    assert [f.attrs.get("hetpart.cpu_rule") for f in _scheduled(mod, target)] == ["pooling"]
    ref = torch.nn.functional.max_pool1d(torch.from_numpy(x1), 3, 2, 1).numpy()
    np.testing.assert_allclose(_run(mod, target, x1), ref, rtol=1e-5, atol=1e-5)

    x3 = RNG.standard_normal((1, 4, 6, 10, 10)).astype("float32")
    mod = _module(x3.shape, lambda v: relax.op.nn.avg_pool3d(v, pool_size=2, strides=2))
    assert [f.attrs.get("hetpart.cpu_rule") for f in _scheduled(mod, target)] == ["pooling"]
    ref = torch.nn.functional.avg_pool3d(torch.from_numpy(x3), 2, 2).numpy()
    np.testing.assert_allclose(_run(mod, target, x3), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("body", [
    pytest.param(lambda v: relax.op.nn.softmax(v, axis=-1), id="softmax"),
    pytest.param(lambda v: relax.op.mean(v, axis=[2, 3], keepdims=True), id="global-mean"),
    pytest.param(lambda v: relax.op.nn.max_pool2d(v, pool_size=3, strides=1, padding=1, layout="NHWC"),
                 id="channels-last-pool"),
])
def test_pooling_rule_leaves_other_reductions_to_the_row_reduction_rule(target, body):
    """Reductions over a whole axis, and pools whose innermost axis is not a window axis, are not claimed."""
    mod = _module((1, 16, 12, 12), body)
    rules = [f.attrs.get("hetpart.cpu_rule") for f in _scheduled(mod, target)]
    assert "pooling" not in rules and rules, rules
