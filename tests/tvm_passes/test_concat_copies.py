"""Wide concatenations become a tree of copy kernels; narrow stacks are partitioned by the concat rule."""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.tvm

tvm = pytest.importorskip("tvm")
from tvm import relax, tirx  # noqa: E402

from tvm_passes.concat_copies import MAX_KERNEL_INPUTS, WIDE_CONCAT_MIN_INPUTS  # noqa: E402
from tvm_passes.legalize import legalize_ops  # noqa: E402
from tvm_passes.schedules import cpu_pipeline, default_cpu_target  # noqa: E402


def _module(n_inputs: int, shape: tuple[int, ...], op: str, axis: int) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    xs = [relax.Var(f"x{i}", relax.TensorType(shape, "float32")) for i in range(n_inputs)]
    with bb.function("main", xs):
        with bb.dataflow():
            y = bb.emit(relax.op.stack(xs, axis=axis) if op == "stack" else relax.op.concat(xs, axis=axis))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _run(mod: tvm.IRModule, inputs: list[np.ndarray]) -> np.ndarray:
    target = default_cpu_target()
    executable = tvm.compile(mod, target=target, relax_pipeline=cpu_pipeline(target))
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(x) for x in inputs]).numpy()


def _primfuncs(mod: tvm.IRModule) -> list[tirx.PrimFunc]:
    return [f for _, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)]


@pytest.mark.parametrize("op, axis, shape", [("stack", 0, (1, 16)), ("stack", 1, (2, 8)), ("stack", 2, (2, 3)),
                                             ("concat", 0, (1, 16)), ("concat", 1, (2, 3))])
def test_wide_concatenations_are_copy_trees_with_exact_numerics(op, axis, shape):
    n_inputs = 2 * MAX_KERNEL_INPUTS * MAX_KERNEL_INPUTS + 3       # two levels of groups, uneven last group
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(shape).astype("float32") for _ in range(n_inputs)]
    mod = _module(n_inputs, shape, op, axis)
    legal = legalize_ops()(mod)
    funcs = _primfuncs(legal)
    assert funcs and all(len(f.params) - 1 <= MAX_KERNEL_INPUTS for f in funcs)   # last parameter: the output
    assert all("if_then_else" not in f.script() for f in funcs)                  # plain copies, no select chain
    expected = np.stack(inputs, axis) if op == "stack" else np.concatenate(inputs, axis)
    np.testing.assert_array_equal(_run(mod, inputs), expected)


def test_narrow_concatenations_keep_tvm_legalization():
    mod = _module(WIDE_CONCAT_MIN_INPUTS - 1, (1, 8), "stack", 0)
    funcs = _primfuncs(legalize_ops()(mod))
    assert len(funcs) == 1 and len(funcs[0].params) == WIDE_CONCAT_MIN_INPUTS      # one TOPI stack kernel


def test_concat_rule_partitions_a_narrow_stack():
    from tvm_passes.schedules.concat import Concat, stack_segments

    n_inputs = 12
    mod = legalize_ops()(_module(n_inputs, (1, 64), "stack", 0))
    func = _primfuncs(mod)[0]
    sch = tvm.s_tir.Schedule(func)
    block = sch.get(sch.get_sblock("T_stack"))
    assert stack_segments(block, 0) == [(k, 1) for k in range(n_inputs)]
    assert stack_segments(block, 1) is None                                        # the chain tests axis 0 only
    target = default_cpu_target()
    assert Concat().apply(func.with_attr("target", target), target) is not None
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((1, 64)).astype("float32") for _ in range(n_inputs)]
    np.testing.assert_array_equal(_run(_module(n_inputs, (1, 64), "stack", 0), inputs), np.stack(inputs, 0))
