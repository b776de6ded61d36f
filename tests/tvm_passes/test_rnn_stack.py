"""An unrolled RNN's per-step outputs are stacked as a tree of small stacks; the concat rule partitions them."""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.tvm

tvm = pytest.importorskip("tvm")
from tvm import relax, tirx  # noqa: E402

from tvm_passes.rnn_slices import MAX_STACK_INPUTS, stack_steps  # noqa: E402
from tvm_passes.schedules import cpu_pipeline, default_cpu_target  # noqa: E402


def _stacked_module(n_parts: int, shape: tuple[int, ...], axis: int) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    xs = [relax.Var(f"x{i}", relax.TensorType(shape, "float32")) for i in range(n_parts)]
    with bb.function("main", xs):
        with bb.dataflow():
            y = stack_steps(lambda expr, what: bb.emit(expr, what), xs, axis, "y")
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _run(mod: tvm.IRModule, inputs: list[np.ndarray]) -> np.ndarray:
    target = default_cpu_target()
    executable = tvm.compile(mod, target=target, relax_pipeline=cpu_pipeline(target))
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(x) for x in inputs]).numpy()


def _calls(mod: tvm.IRModule) -> list[relax.Call]:
    return [b.value for block in mod["main"].body.blocks for b in block.bindings
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)]


@pytest.mark.parametrize("n_parts, shape, axis", [(5, (1, 8), 0), (40, (1, 8), 0), (37, (2, 4), 1)])
def test_stack_steps_equals_a_flat_stack_with_small_ops(n_parts, shape, axis):
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(shape).astype("float32") for _ in range(n_parts)]
    mod = _stacked_module(n_parts, shape, axis)
    calls = _calls(mod)
    assert all(len(call.args[0].fields) <= MAX_STACK_INPUTS for call in calls)
    assert (len(calls) == 1) == (n_parts <= MAX_STACK_INPUTS)
    np.testing.assert_array_equal(_run(mod, inputs), np.stack(inputs, axis))


def test_stack_steps_nests_concatenations_for_very_long_sequences():
    n_parts = MAX_STACK_INPUTS ** 2 + 1                       # 17 groups: two levels of concatenation
    calls = _calls(_stacked_module(n_parts, (1, 3), 2))
    assert all(len(call.args[0].fields) <= MAX_STACK_INPUTS for call in calls)
    assert [c.op.name for c in calls].count("relax.stack") == MAX_STACK_INPUTS + 1
    assert calls[-1].ty.shape.values[2] == n_parts


def test_concat_rule_partitions_a_stack():
    from tvm_passes.legalize import legalize_ops
    from tvm_passes.schedules.concat import Concat, stack_segments

    n_parts = 12
    legal = legalize_ops()(_stacked_module(n_parts, (1, 64), 0))
    func = next(f for _, f in legal.functions_items() if isinstance(f, tirx.PrimFunc))
    sch = tvm.s_tir.Schedule(func)
    block = sch.get(sch.get_sblock("T_stack"))
    assert stack_segments(block, 0) == [(k, 1) for k in range(n_parts)]
    assert stack_segments(block, 1) is None                                       # the chain tests axis 0 only
    target = default_cpu_target()
    scheduled = Concat().apply(func.with_attr("target", target), target)
    assert scheduled is not None and "if_then_else" not in scheduled.mod["main"].script().split("T_stack_ax00")[0]


def test_fusion_keeps_step_stacks_apart_so_no_kernel_takes_every_step():
    from tvm_passes.fusion import MIN_UNFUSED_STACK_INPUTS, fusion_passes
    from tvm_passes.legalize import legalize_ops

    n_steps = 40
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8), "float32"))
    w = relax.const(np.eye(8, dtype="float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h, outputs = x, []
            for _ in range(n_steps):                         # a recurrence: each step's matmul reads the last
                h = bb.emit(relax.op.tanh(relax.op.add(relax.op.matmul(h, w), x)))
                outputs.append(h)
            y = stack_steps(lambda expr, what: bb.emit(expr, what), outputs, 0, "y")
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    fused = tvm.transform.Sequential([*fusion_passes(), relax.transform.FuseTIR()])(legalize_ops()(bb.get()))
    widest = max(len(f.params) for _, f in fused.functions_items() if isinstance(f, tirx.PrimFunc))
    assert MIN_UNFUSED_STACK_INPUTS <= MAX_STACK_INPUTS
    assert widest <= n_steps // MAX_STACK_INPUTS + 2 + MAX_STACK_INPUTS   # a group stack, or the groups' concat
    unfused = tvm.transform.Sequential([relax.transform.AnnotateTIROpPattern(), relax.transform.FuseOps(),
                                        relax.transform.FuseTIR()])(legalize_ops()(bb.get()))
    assert max(len(f.params) for _, f in unfused.functions_items() if isinstance(f, tirx.PrimFunc)) > n_steps
