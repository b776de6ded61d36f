"""The CPU rules bound what compute_inline may duplicate, so fused chains of activations compile.

TVM's fast tanh reads its input 19 times and fast exp 40 times. Inlining every injective producer into its
consumer copied each producer's whole expression into every load, so a fused chain of n such ops grew as k^n:
sigmoid/tanh x4 took four minutes and 2.3 GB to compile, x5 ran out of a 4 GB address space, longer chains
exhaust the host. The chains are compiled in a child process under an address-space limit, so a regression
fails the test instead of taking the machine down. Single activations must still become one loop nest.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
from tvm import relax, s_tir, tirx  # noqa: E402

from tests.memory import run_under_address_space_limit  # noqa: E402
from tvm_passes import tuning_db  # noqa: E402
from tvm_passes.schedules import base, cpu_pipeline, cpu_schedule_pass, default_cpu_target  # noqa: E402

pytestmark = pytest.mark.tvm

CHILD_ADDRESS_SPACE_BYTES = 3_000_000_000   # a fixed compile peaks near 1.1 GB of address space
CHILD_TIMEOUT_S = 180                       # a fixed compile takes a few seconds
CONV_CHANNELS = 8
RTOL = ATOL = 1e-4


def _mish(y: relax.Expr) -> relax.Expr:
    """ONNX Mish as TVM's frontend converts it: x * tanh(log(1 + exp(x)))."""
    one = relax.const(1.0, "float32")
    return relax.op.multiply(y, relax.op.tanh(relax.op.log(relax.op.add(one, relax.op.exp(y)))))


def _np_mish(y: np.ndarray) -> np.ndarray:
    return y * np.tanh(np.log1p(np.exp(y)))


def _np_sigmoid(y: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-y))


def _np_conv3x3(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """NCHW 3x3 convolution with padding 1 and stride 1, in float64."""
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
    return np.einsum("nchwij,ocij->nohw", windows, w)


RelaxOp = Callable[[relax.Expr], relax.Expr]
Reference = Callable[[np.ndarray], np.ndarray]


def _case(name: str) -> tuple[tuple[int, ...], list[RelaxOp], Reference]:
    """(input shape, Relax ops applied in order, float64 reference) of a named chain."""
    if name == "sigmoid_tanh_x6":
        ops = [relax.op.sigmoid if i % 2 == 0 else relax.op.tanh for i in range(6)]
        return (4, 256), ops, lambda x: _alternate(x, 6)
    if name == "mish_x4":
        return (4, 256), [_mish] * 4, lambda x: _repeat(_np_mish, x, 4)
    if name == "conv_mish_x3":
        weight = _conv_weight()

        def conv(y: relax.Expr) -> relax.Expr:
            return relax.op.nn.conv2d(y, relax.const(weight), padding=1)

        return (1, CONV_CHANNELS, 8, 8), [conv] + [_mish] * 3, \
            lambda x: _repeat(_np_mish, _np_conv3x3(x, weight.astype("float64")), 3)
    raise KeyError(name)


def _alternate(x: np.ndarray, length: int) -> np.ndarray:
    for i in range(length):
        x = _np_sigmoid(x) if i % 2 == 0 else np.tanh(x)
    return x


def _repeat(fn: Reference, x: np.ndarray, times: int) -> np.ndarray:
    for _ in range(times):
        x = fn(x)
    return x


def _conv_weight() -> np.ndarray:
    return (np.random.default_rng(1).standard_normal((CONV_CHANNELS, CONV_CHANNELS, 3, 3)) * 0.2).astype("float32")


def _module(shape: tuple[int, ...], ops: list[RelaxOp]) -> tvm.IRModule:
    """``main(x)`` applying ``ops`` in order, each bound in the dataflow block (FuseOps fuses them all)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = x
            for op in ops:
                y = bb.emit(op(y))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def compile_and_check_case(name: str) -> dict:
    """Compile chain ``name`` with hetpart's CPU pipeline, run it and compare with float64 numpy.

    Runs in the child process; returns the compile time and the largest error over the tolerance scale.
    """
    shape, ops, reference = _case(name)
    target = default_cpu_target()
    start_s = time.perf_counter()
    executable = tvm.compile(_module(shape, ops), target=target, relax_pipeline=cpu_pipeline(target))
    compile_s = time.perf_counter() - start_s
    x = (np.random.default_rng(0).standard_normal(shape) * 2).astype("float32")
    vm = relax.VirtualMachine(executable, tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    expected = reference(x.astype("float64"))
    scaled_error = float(np.max(np.abs(got - expected) / (ATOL + RTOL * np.abs(expected))))
    return {"compile_s": compile_s, "scaled_error": scaled_error}


CHAIN_CASES = ("sigmoid_tanh_x6", "mish_x4", "conv_mish_x3")


def chain_reports() -> None:
    """Child process: compile and check every chain of CHAIN_CASES, printing one JSON line per case as it ends.

    The sigmoid/tanh chain's line also carries the scheduled kernel's blocks and their expression sizes.
    """
    for name in CHAIN_CASES:
        report = compile_and_check_case(name)
        if name == "sigmoid_tanh_x6":
            report["blocks"], report["block_nodes"] = _scheduled_blocks(_case(name)[1])
        print(json.dumps({"case": name, **report}), flush=True)


def _run_chains_in_child() -> tuple[dict[str, dict], str]:
    """Reports of :func:`chain_reports` run in one child process under the address-space limit (one child for all
    cases: importing TVM takes most of a child's time), and why the child failed ("" if it did not)."""
    stdout, failure = run_under_address_space_limit("tests.tvm_passes.test_schedule_inline_growth", "chain_reports",
                                                    CHILD_ADDRESS_SPACE_BYTES, CHILD_TIMEOUT_S)
    return _parse_reports(stdout), failure


def _parse_reports(stdout: str) -> dict[str, dict]:
    reports = [json.loads(line) for line in stdout.splitlines() if line.startswith('{"case"')]
    return {report["case"]: report for report in reports}


def test_fused_activation_chains_compile_in_bounded_memory_with_exact_numerics():
    reports, failure = _run_chains_in_child()
    missing = [name for name in CHAIN_CASES if name not in reports]
    assert not missing, f"compiling {missing[0]} failed ({failure})"
    for name in CHAIN_CASES:
        assert reports[name]["scaled_error"] <= 1.0, reports[name]
        assert reports[name]["compile_s"] < 60, reports[name]
    # The long chain keeps several stages, none of them exponential in the chain length.
    chain = reports["sigmoid_tanh_x6"]
    assert len(chain["blocks"]) > 1
    assert max(chain["block_nodes"]) <= base.MAX_INLINE_GROWTH_NODES, chain


def _scheduled_blocks(ops: list[RelaxOp], shape: tuple[int, ...] = (4, 256)) -> tuple[list[str], list[int]]:
    """Block names and expression sizes of the one fused kernel of ``ops`` after hetpart's CPU rules."""
    target = default_cpu_target()
    with target:
        mod = tvm.transform.Sequential(tuning_db.kernel_lowering_passes(target))(_module(shape, ops))
        mod = cpu_schedule_pass(target)(mod)
    funcs = [f for _, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)]
    assert len(funcs) == 1
    sch = s_tir.Schedule(funcs[0])
    names, sizes = [], []
    for block_rv, summary in base.summarize_blocks(sch):
        names.append(summary.name)
        sizes.append(base.expr_tree_nodes(sch.get(block_rv).body.value, 10**7))
    return names, sizes


@pytest.mark.parametrize("op", [relax.op.sigmoid, relax.op.tanh, relax.op.nn.gelu, relax.op.nn.silu, _mish],
                         ids=["sigmoid", "tanh", "gelu", "silu", "mish"])
def test_single_activation_still_collapses_into_one_loop_nest(op):
    names, _ = _scheduled_blocks([op])
    assert len(names) == 1, names


def test_lstm_cell_activations_still_collapse_into_one_loop_nest():
    """c' = sigmoid(f) * c + sigmoid(i) * tanh(g); h = sigmoid(o) * tanh(c'): the largest inline of the zoo's
    LSTM (about 15,000 nodes) must stay under the budget."""
    def cell(y: relax.Expr) -> relax.Expr:
        one = relax.const(1.0, "float32")
        op = relax.op
        c_new = op.add(op.multiply(op.sigmoid(y), y), op.multiply(op.sigmoid(op.add(y, one)), op.tanh(y)))
        return op.multiply(op.sigmoid(op.subtract(y, one)), op.tanh(c_new))

    names, _ = _scheduled_blocks([cell])
    assert len(names) == 1, names


def test_growth_counts_the_copies_beyond_the_first():
    """fast tanh reads its clamped input many times: inlining the clamp adds (loads - 1) copies of it, while
    the single-use min feeding the clamp adds nothing."""
    target = default_cpu_target()
    with target:
        mod = tvm.transform.Sequential(tuning_db.kernel_lowering_passes(target))(_module((4, 256), [relax.op.tanh]))
    func = next(f for _, f in mod.functions_items() if isinstance(f, tirx.PrimFunc))
    sch = s_tir.Schedule(func)
    clamp = sch.get_sblock("T_maximum")
    clamp_nodes = base.expr_tree_nodes(sch.get(clamp).body.value, 10**6)
    tanh = sch.get(sch.get_sblock("T_fast_tanh"))
    loads = base.count_loads(tanh.body, sch.get(clamp).writes[0].source, 10**6)
    assert loads > 10
    assert base.inline_growth_nodes(sch, clamp, 10**6) == (loads - 1) * clamp_nodes
    assert base.inline_growth_nodes(sch, sch.get_sblock("T_minimum"), 10**6) == 0
    assert base.inline_growth_nodes(sch, clamp, 5) > 5


def test_zero_budget_keeps_multi_read_producers_and_inlines_single_use_ones():
    target = default_cpu_target()
    with target:
        mod = tvm.transform.Sequential(tuning_db.kernel_lowering_passes(target))(_module((4, 256), [relax.op.tanh]))
    func = next(f for _, f in mod.functions_items() if isinstance(f, tirx.PrimFunc))
    sch = s_tir.Schedule(func)
    base.inline_injective_producers(sch, keep=set(), max_growth_nodes=0)
    assert [summary.name for _, summary in base.summarize_blocks(sch)] == ["T_maximum", "T_fast_tanh"]
