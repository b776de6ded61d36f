"""tvm_passes.pad_columns: which matmuls are padded, identical numerics, shared weights, the speed-up it exists for."""
from __future__ import annotations

import re
import time

import numpy as np
import onnx
import pytest
import tvm
from tvm import relax, tirx

from tvm_passes.frontend import import_model
from tvm_passes.pad_columns import COLUMN_MULTIPLE, pad_matmul_columns, padded_columns
from tvm_passes.schedules import cpu_pipeline, default_cpu_target
from tvm_passes.schedules.base import vector_lanes

from .rnn_models import onnxruntime_reference

pytestmark = pytest.mark.tvm
RNG = np.random.default_rng(0)


def _const(*shape: int) -> relax.Constant:
    return relax.const(RNG.standard_normal(shape).astype("float32"))


def _module(rows: int, k: int, n: int, *, bias: str | None = "after", shared_use: bool = False,
            weight_as_input: bool = False) -> tvm.IRModule:
    """``[rows, k] @ W[k, n]`` (+ bias: "after" = add(y, b), "before" = add(b, y), "full" = a [rows, n] add)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([rows, k], "float32"))
    params = [x]
    if weight_as_input:
        weight = relax.Var("w", relax.TensorType([k, n], "float32"))
        params.append(weight)
    else:
        weight = _const(k, n)
    with bb.function("main", params):
        with bb.dataflow():
            y = product = bb.emit(relax.op.matmul(x, weight))
            if bias == "after":
                y = bb.emit(relax.op.add(product, _const(n)))
            elif bias == "before":
                y = bb.emit(relax.op.add(_const(1, n), product))
            elif bias == "full":
                y = bb.emit(relax.op.add(product, _const(rows, n)))
            if shared_use:
                y = bb.emit(relax.op.multiply(y, product))
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    return bb.get()


def _ops(mod: tvm.IRModule) -> list[tuple[str, tuple[int, ...]]]:
    return [(b.value.op.name, tuple(int(d) for d in b.var.ty.shape))
            for block in mod["main"].body.blocks for b in block.bindings
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)]


def _run(mod: tvm.IRModule, *arrays: np.ndarray) -> np.ndarray:
    target = default_cpu_target()
    vm = relax.VirtualMachine(tvm.compile(mod, target=target, relax_pipeline=cpu_pipeline(target)), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()


def test_padded_columns_rule():
    assert padded_columns(1950) == 1952 and padded_columns(2600) == 2608 and padded_columns(1000) == 1008
    assert padded_columns(1024) == 1024                        # already whole vectors
    assert padded_columns(2 * COLUMN_MULTIPLE) == 2 * COLUMN_MULTIPLE and padded_columns(10) == 10   # narrow


@pytest.mark.parametrize("bias", ["after", "before", "full", None])
@pytest.mark.parametrize("shared_use", [False, True])
def test_padded_module_computes_the_same(bias, shared_use):
    mod = _module(5, 24, 50, bias=bias, shared_use=shared_use)
    padded, count = pad_matmul_columns(mod)
    assert count == 1
    ops = _ops(padded)
    assert ("relax.matmul", (5, 64)) in ops and ("relax.matmul", (5, 50)) not in ops
    assert ("relax.strided_slice", (5, 50)) in ops and ops[-1] == ("relax.nn.relu", (5, 50))
    # a constant bias along the columns is padded with the matmul (stays fused with it); other adds follow the slice
    absorbed = bias in ("after", "before") and not shared_use
    assert (("relax.add", (5, 64)) in ops) == absorbed
    x = RNG.standard_normal((5, 24)).astype("float32")
    np.testing.assert_allclose(_run(padded, x), _run(mod, x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("n, weight_as_input", [(64, False), (30, False), (50, True)])
def test_left_alone(n, weight_as_input):
    """Whole vectors, narrow outputs and weights that are not constants are not padded."""
    mod = _module(3, 8, n, weight_as_input=weight_as_input)
    padded, count = pad_matmul_columns(mod)
    assert count == 0 and padded is mod


def test_an_unrolled_rnn_shares_one_padded_weight(tmp_path):
    """Every step of an unrolled GRU reads the same recurrent weight: one padded copy, not one per step."""
    model, feeds, expected = onnxruntime_reference("GRU", seq=6, batch=1, input_size=20, hidden=50,
                                                     linear_before_reset=1)
    path = tmp_path / "gru.onnx"
    onnx.save(model, str(path))
    imported = import_model(path)
    assert any("padded the columns of" in note for note in imported.notes)
    constants = []
    for block in imported.mod["main"].body.blocks:
        for binding in block.bindings:
            for arg in getattr(binding.value, "args", ()):
                if isinstance(arg, tvm.ir.GenericConst) and not any(arg.value.same_as(c.value) for c in constants):
                    constants.append(arg)
    shapes = [tuple(c.value.shape) for c in constants]
    assert (50, 160) in shapes                                     # 3 gates x 50 = 150 columns -> 160
    assert shapes.count((50, 160)) == 1 and (50, 150) not in shapes
    unpadded = import_model(path, pad_columns=False)
    assert not unpadded.notes
    args = [feeds[i.name] for i in model.graph.input]
    for mod in (imported.mod, unpadded.mod):
        target = default_cpu_target()
        vm = relax.VirtualMachine(tvm.compile(mod, target=target, relax_pipeline=cpu_pipeline(target)), tvm.cpu())
        got = vm["main"](*[tvm.runtime.tensor(a) for a in args])
        np.testing.assert_allclose(got[0].numpy(), expected[0], rtol=1e-5, atol=1e-5)


def _update_lanes(mod: tvm.IRModule) -> int:
    """Width of the vectorized column loop of the scheduled matmul's update block (1 if it has none)."""
    target = default_cpu_target()
    with target:
        lowered = cpu_pipeline(target)(mod)
    (func,) = [f for f in lowered.functions.values() if isinstance(f, tirx.PrimFunc)]
    before_update = func.script().split('T.sblock("matmul_update")')[0]
    widths = re.findall(r"T\.vectorized\(T\.int64\((\d+)\)\)", before_update.rsplit("for k in", 1)[-1])
    return int(widths[-1]) if widths else 1


@pytest.mark.parametrize("rows, k, n", [(35, 650, 1950), (1, 650, 1950), (35, 256, 750)])
def test_padding_gives_ragged_gate_projections_whole_vectors(rows, k, n):
    """The mechanism behind the speed-up: padded to a multiple of COLUMN_MULTIPLE, the ragged columns are written
    in whole SIMD vectors, never narrower than before. With 8-lane vectors (AVX2) 1950 = 2 x 975 columns leave the
    CPU matmul rule a 2-lane column vector; 16-lane targets (AVX-512) already tile them in whole registers."""
    mod = _module(rows, k, n)
    padded, _ = pad_matmul_columns(mod)
    lanes = vector_lanes(default_cpu_target())
    assert n % lanes != 0                                  # the shape is ragged on this target
    unpadded_lanes, padded_lanes = _update_lanes(mod), _update_lanes(padded)
    assert padded_lanes >= lanes and padded_lanes >= unpadded_lanes, (unpadded_lanes, padded_lanes)
    if lanes == 8:
        assert unpadded_lanes < lanes


@pytest.mark.slow
def test_padding_is_what_makes_ragged_gate_projections_fast():
    """The speed-up as a ratio in one run, over three GRU gate shapes. Measured padded/unpadded: 10-21x on one
    host, 2.8x and 1.2x on CI hosts for 35 x 650 x 1950; 2.0-3.3x (1 x 650 x 1950) and 2.5-2.7x (35 x 256 x 750)
    at 1 and 2 threads on a Zen 3 host -- so the test asks for 1.3x on the median shape, which an ineffective
    pad (ratio ~1) fails."""
    target = default_cpu_target()
    ratios = []
    for rows, k, n in [(35, 650, 1950), (1, 650, 1950), (35, 256, 750)]:
        mod = _module(rows, k, n)
        padded, _ = pad_matmul_columns(mod)
        x = tvm.runtime.tensor(RNG.standard_normal((rows, k)).astype("float32"))
        runners = []
        for m in (mod, padded):
            vm = relax.VirtualMachine(tvm.compile(m, target=target, relax_pipeline=cpu_pipeline(target)),
                                      tvm.cpu())
            vm["main"](x)
            runners.append(vm["main"])
        times: list[list[float]] = [[], []]
        for _ in range(15):                                        # interleaved
            for which, run in enumerate(runners):
                start = time.perf_counter()
                run(x)
                times[which].append(time.perf_counter() - start)
        ratios.append(min(times[0]) / min(times[1]))              # best of 15: the least disturbed run of each
    assert sorted(ratios)[1] > 1.3, f"padded/unpadded speed-ups {[round(r, 2) for r in ratios]}"


def test_padded_bindings_keep_unique_tagged_names_and_kernel_groups(tmp_path):
    """extract maps fused kernels back to ops by binding name and reads RNN step tags from it: the padded
    bindings must neither repeat a name nor lose the tag, and the kernels must group as before."""
    from tvm_passes.extract import extract_op_graph

    model, _, _ = onnxruntime_reference("GRU", seq=4, batch=1, input_size=20, hidden=50, linear_before_reset=1)
    path = tmp_path / "gru.onnx"
    onnx.save(model, str(path))
    graphs = {pad: extract_op_graph(import_model(path, pad_columns=pad).mod) for pad in (False, True)}
    names = [n.name for n in graphs[True].nodes]
    assert len(names) == len(set(names))
    untagged = {pad: [n.name for n in g.nodes if "rnn_phase" not in n.tags] for pad, g in graphs.items()}
    assert untagged[True] == untagged[False]
    assert graphs[True].num_ops > graphs[False].num_ops                 # the slices
    kernels = {pad: g.kernel_graph() for pad, g in graphs.items()}
    assert kernels[True].num_ops == kernels[False].num_ops
    ops = [n.op for n in kernels[True].nodes]
    assert "fused:matmul+add+strided_slice" in ops and "fused:matmul+add" not in ops


def test_extract_refuses_repeated_binding_names():
    """Two bindings named alike would silently swap kernel groups: extract says so instead."""
    from hetpart.errors import InvalidGraphError
    from tvm_passes.extract import extract_op_graph

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([4, 8], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y, z = (relax.DataflowVar("same", relax.TensorType([4, 8], "float32")) for _ in range(2))
            bb.emit_normalized(relax.VarBinding(y, bb.normalize(relax.op.nn.relu(x))))
            bb.emit_normalized(relax.VarBinding(z, bb.normalize(relax.op.exp(y))))
            out = bb.emit_output(relax.op.add(y, z))
        bb.emit_func_output(out)
    with pytest.raises(InvalidGraphError, match="unique var name"):
        extract_op_graph(bb.get())
    assert extract_op_graph(bb.get(), with_kernels=False).num_ops == 3
