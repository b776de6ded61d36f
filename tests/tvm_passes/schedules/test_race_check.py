"""A rule's schedule whose parallel iterations read each other's output is refused (tvm_passes.schedules.race_check)."""
from __future__ import annotations

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
from tvm import relax, s_tir, tirx  # noqa: E402

from tvm_passes.schedules import default_cpu_target  # noqa: E402
from tvm_passes.schedules.base import RULE_ATTR, CpuRule, apply_first_rule, summarize_blocks  # noqa: E402
from tvm_passes.schedules.pipeline import cpu_generic, default_rules  # noqa: E402
from tvm_passes.schedules.pooling import Pooling  # noqa: E402
from tvm_passes.schedules.race_check import parallel_write_conflicts  # noqa: E402

pytestmark = pytest.mark.tvm


@pytest.fixture(scope="module")
def target():
    return default_cpu_target()


def _fused_kernels(params, body, target):
    """The fused PrimFuncs of ``body(*vars)`` (batch norm decomposed, parameters left as inputs: not folded)."""
    bb = relax.BlockBuilder()
    args = [relax.Var(name, relax.TensorType(shape, "float32")) for name, shape in params]
    with bb.function("main", args):
        with bb.dataflow():
            out = bb.emit_output(body(*args))
        bb.emit_func_output(out)
    with target:
        mod = tvm.transform.Sequential([relax.transform.DecomposeOpsForInference()]
                                       + cpu_generic.legalize_passes(target))(bb.get())
    return {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)}


def _conv1d_relu_batch_norm(x, w, gamma, beta, mean, var):
    y = relax.op.nn.relu(relax.op.nn.conv1d(x, w))
    return relax.TupleGetItem(relax.op.nn.batch_norm(y, gamma, beta, mean, var, axis=1), 0)


CONV1D_BN = [("x", (1, 8, 40)), ("w", (16, 8, 3)), ("gamma", (16,)), ("beta", (16,)), ("mean", (16,)),
             ("var", (16,))]


class _ChannelsInParallel(CpuRule):
    """The schedule the pooling rule once gave a conv1d + ReLU + unfolded batch norm: the conv's leading loops in
    parallel and every later block moved under them, unnarrowed."""

    name = "channels_in_parallel"

    def apply(self, func, target):
        sch = s_tir.Schedule(func)
        blocks = summarize_blocks(sch)
        position = next(i for i, (_, summary) in enumerate(blocks) if summary.is_reduction)
        loops = sch.get_loops(blocks[position][0])
        outer = sch.fuse(loops[0], loops[1])
        sch.parallel(outer)
        for producer, _ in reversed(blocks[:position]):
            sch.compute_at(producer, outer, preserve_unit_loops=True)
        for consumer, _ in blocks[position + 1:]:
            sch.reverse_compute_at(consumer, outer, preserve_unit_loops=True)
        return sch


def _conv1d_kernel(target):
    kernels = _fused_kernels(CONV1D_BN, _conv1d_relu_batch_norm, target)
    (func,) = [f for n, f in kernels.items() if "conv1d" in n]
    return func


def test_a_schedule_reading_other_iterations_output_is_reported(target):
    sch = _ChannelsInParallel().apply(_conv1d_kernel(target), target)
    conflicts = parallel_write_conflicts(sch.mod["main"])
    assert conflicts and "in every iteration of parallel loop" in conflicts[0]


def test_the_pooling_rule_leaves_convolutions_alone(target):
    assert Pooling().apply(_conv1d_kernel(target), target) is None


def test_first_rule_skips_a_racing_schedule_and_the_kernel_computes_the_reference(target):
    func = _conv1d_kernel(target)
    scheduled = apply_first_rule(func, target, [_ChannelsInParallel(), *default_rules()])
    rule = None if scheduled is None else str(scheduled.attrs[RULE_ATTR])
    assert rule != _ChannelsInParallel.name
    chosen = scheduled if scheduled is not None else func
    assert parallel_write_conflicts(chosen) == []

    rng = np.random.default_rng(0)
    arrays = [np.abs(rng.standard_normal([int(d) for d in buf.shape])).astype(np.float32) + 0.5
              for buf in func.params]

    def run(prim_func):      # the last parameter is the output
        lib = tvm.compile(tvm.IRModule({"main": prim_func.with_attr("global_symbol", "main")}), target=target)
        tensors = [tvm.runtime.tensor(a) for a in arrays]
        lib["main"](*tensors)
        return tensors[-1].numpy()

    np.testing.assert_allclose(run(chosen), run(func), rtol=1e-5, atol=1e-5)     # the serial definition


def test_pools_and_their_epilogues_have_no_conflict(target):
    def pool_relu(x):
        return relax.op.nn.relu(relax.op.nn.max_pool2d(x, pool_size=3, strides=2, padding=1))

    kernels = _fused_kernels([("x", (1, 32, 28, 28))], pool_relu, target)
    (func,) = [f for n, f in kernels.items() if "pool" in n]
    sch = Pooling().apply(func, target)
    assert sch is not None and parallel_write_conflicts(sch.mod["main"]) == []


def test_redundant_copies_of_inputs_and_one_iteration_loops_are_not_conflicts():
    from tvm.script import tirx as T

    @T.prim_func(private=True, s_tir=True)
    def copies(a: T.Buffer((4, 8), "float32"), b: T.Buffer((4, 8), "float32")):
        staged = T.sblock_alloc_buffer((8,))
        for i in T.parallel(4):
            for j in range(8):
                with T.sblock("stage"):       # every iteration copies the same constant row: redundant, not racing
                    vj = T.axis.remap("S", [j])
                    staged[vj] = a[0, vj]
            for j in range(8):
                with T.sblock("out"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    b[vi, vj] = a[vi, vj] + staged[vj]

    @T.prim_func(private=True, s_tir=True)
    def racing(a: T.Buffer((4, 8), "float32"), b: T.Buffer((4, 8), "float32")):
        part = T.sblock_alloc_buffer((4, 8))
        for i in T.parallel(4):
            for j in range(8):
                with T.sblock("part"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    part[vi, vj] = a[vi, vj] * T.float32(2)
            for r, j in T.grid(4, 8):
                with T.sblock("all"):         # reads every iteration's part: a race
                    vr, vj = T.axis.remap("SS", [r, j])
                    b[vr, vj] = part[vr, vj] + T.float32(1)

    @T.prim_func(private=True, s_tir=True)
    def single(a: T.Buffer((8,), "float32"), b: T.Buffer((8,), "float32")):
        part = T.sblock_alloc_buffer((8,))
        for i in T.parallel(1):
            for j in range(8):
                with T.sblock("part"):
                    vj = T.axis.spatial(8, i * 8 + j)
                    part[vj] = a[vj]
            for j in range(8):
                with T.sblock("all"):
                    vj = T.axis.remap("S", [j])
                    b[vj] = part[vj]

    assert parallel_write_conflicts(copies) == []
    assert parallel_write_conflicts(single) == []
    conflicts = parallel_write_conflicts(racing)
    assert len(conflicts) == 1 and "part" in conflicts[0] and "all" in conflicts[0]
