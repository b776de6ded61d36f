"""Each CPU schedule rule: it is applied (parallel / vectorised loops in the scheduled PrimFunc) and the
compiled kernel matches a numpy reference to 1e-4, including shapes that do not divide the tile sizes."""

from __future__ import annotations

import re

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
from tvm import relax, tirx  # noqa: E402

from tvm_passes.schedules import cpu_pipeline, cpu_schedule_pass, default_cpu_target, vector_lanes  # noqa: E402
from tvm_passes.schedules.layout import PREPACKED_KERNEL_LAYOUT, prepack_conv_weights  # noqa: E402
from tvm_passes.schedules.pipeline import cpu_generic  # noqa: E402

pytestmark = pytest.mark.tvm

TOL = 1e-4
RNG = np.random.RandomState(0)


@pytest.fixture(scope="module")
def target():
    return default_cpu_target()


def _module(params, body):
    """Relax module ``main(params) = body(*param_vars)``; params are (name, shape, dtype) or numpy constants."""
    bb = relax.BlockBuilder()
    variables = [relax.Var(name, relax.TensorType(shape, dtype)) for name, shape, dtype in params]
    with bb.function("main", variables):
        with bb.dataflow():
            out = bb.emit_output(body(*variables))
        bb.emit_func_output(out)
    return bb.get()


def _scheduled_funcs(mod, target, rules=None):
    """PrimFuncs after the pipeline's legalize+fuse stage and hetpart's schedule pass (with ``rules``, by default
    hetpart's): {name: func}."""
    with target:
        legal = tvm.transform.Sequential(
            [prepack_conv_weights()] + cpu_generic.legalize_passes(target) + [cpu_schedule_pass(target, rules)]
        )(mod)
    return {gv.name_hint: f for gv, f in legal.functions_items() if isinstance(f, tirx.PrimFunc)}


def _loop_kinds(func):
    """Kinds of the loops in a PrimFunc ("parallel", "vectorized", "unroll"), read from its TVMScript."""
    text = func.script()
    return {kind for kind in ("parallel", "vectorized", "unroll") if f"T.{kind}(" in text}


def _run(mod, target, inputs):
    ex = tvm.compile(mod, target=target, relax_pipeline=cpu_pipeline(target))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(x) for x in inputs]).numpy()


def _assert_rule(funcs, rule, *, parallel=True, vectorized=True):
    rules = {rule} if isinstance(rule, str) else set(rule)
    matching = [f for f in funcs.values() if f.attrs.get("hetpart.cpu_rule") in rules]
    assert matching, f"rule {rule} was applied to none of {list(funcs)}"
    kinds = set().union(*(_loop_kinds(f) for f in matching))
    if parallel:
        assert "parallel" in kinds, kinds
    if vectorized:
        assert "vectorized" in kinds, kinds


def _conv_ref(x, w, b, stride, pad, groups):
    n, c, h, wd = x.shape
    f, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ho, wo = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    out = np.zeros((n, f, ho, wo), dtype=np.float64)
    fg = f // groups
    for g in range(groups):
        xs = xp[:, g * cg : (g + 1) * cg]
        ws = w[g * fg : (g + 1) * fg]
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i : i + stride * ho : stride, j : j + stride * wo : stride]
                out[:, g * fg : (g + 1) * fg] += np.einsum("nchw,fc->nfhw", patch, ws[:, :, i, j])
    return np.maximum(out + b.reshape(1, f, 1, 1), 0.0)


CONV_CASES = [
    # (cin, cout, size, kernel, stride, groups) -- chosen to hit both conv variants and ragged tiles
    pytest.param(16, 32, 14, 3, 1, 1, id="3x3-prepacked"),
    pytest.param(24, 32, 9, 3, 1, 1, id="3x3-width9-ragged"),
    pytest.param(16, 32, 15, 3, 2, 1, id="3x3-stride2-odd"),
    pytest.param(20, 24, 13, 1, 1, 1, id="1x1-ragged-channels"),
    pytest.param(16, 32, 27, 1, 1, 1, id="1x1-width27-prepacked"),
    pytest.param(32, 64, 14, 1, 2, 1, id="1x1-stride2"),
    pytest.param(16, 16, 41, 1, 1, 1, id="1x1-width41-tail-prepacked"),
    pytest.param(8, 24, 41, 3, 1, 1, id="3x3-width41-half-register-channels"),
    pytest.param(8, 16, 63, 3, 2, 1, id="3x3-stride2-row-bands"),
    pytest.param(8, 16, 29, 3, 1, 1, id="3x3-row-bands-ragged"),
    pytest.param(20, 20, 15, 3, 2, 20, id="depthwise-stride2"),
    pytest.param(16, 24, 11, 3, 1, 4, id="grouped"),
]


@pytest.mark.parametrize("cin,cout,size,kernel,stride,groups", CONV_CASES)
def test_conv2d_rule_matches_numpy(target, cin, cout, size, kernel, stride, groups):
    x = RNG.randn(1, cin, size, size).astype("float32")
    w = RNG.randn(cout, cin // groups, kernel, kernel).astype("float32")
    b = RNG.randn(1, cout, 1, 1).astype("float32")
    pad = kernel // 2

    def body(xv):
        conv = relax.op.nn.conv2d(xv, relax.const(w), strides=stride, padding=pad, groups=groups)
        return relax.op.nn.relu(relax.op.add(conv, relax.const(b)))

    mod = _module([("x", x.shape, "float32")], body)
    funcs = _scheduled_funcs(mod, target)
    _assert_rule(funcs, ("conv2d_nchw", "conv2d_flat", "conv2d_depthwise"))
    got = _run(mod, target, [x])
    np.testing.assert_allclose(got, _conv_ref(x, w, b, stride, pad, groups), rtol=TOL, atol=TOL)


def _parallel_loops(func):
    return re.findall(r"for (\w+) in T\.parallel\(", func.script())


@pytest.mark.parametrize("batch, banded", [(1, True), (2, False)])
def test_batch_1_convs_whose_input_outweighs_their_weights_split_rows_across_cores(target, batch, banded):
    """On several cores a batch-1 conv whose input outweighs its weights runs in bands of output rows, outermost,
    so each core reads its own rows (tile_plan.conv_row_bands); from one sample per core up, each core gets whole
    samples, and weight-bound convs keep splitting output channels. (The conv2d_nchw rule alone: hetpart's rules
    give batch-1 prepacked convs to the flat rule, which blocks rows its own way.)"""
    from tvm_passes.schedules.conv2d import Conv2dNCHW

    light = RNG.randn(32, 64, 1, 1).astype("float32")       # 8 KB of weights, 800 KB of input
    heavy = RNG.randn(256, 64, 3, 3).astype("float32")      # 590 KB of weights, 21 KB of (padded) input
    for weights, size, bands_expected in ((light, 56, banded), (heavy, 7, False)):
        mod = _module([("x", (batch, 64, size, size), "float32")],
                      lambda x, w=weights: relax.op.nn.conv2d(x, relax.const(w), padding=w.shape[2] // 2))
        (conv,) = [f for f in _scheduled_funcs(mod, target, [Conv2dNCHW()]).values()
                   if f.attrs.get("hetpart.cpu_rule") == "conv2d_nchw"]
        loops = _parallel_loops(conv)
        assert loops and loops[-1].startswith("nn_yy_0") is bands_expected, (size, loops)


def test_a_zero_width_pad_is_read_in_place_not_copied(target):
    """TOPI gives an unpadded conv a "pad" stage that copies its input; the rule inlines it (the conv reads its
    input directly), while a real pad stays a separate stage (inlined, it would bounds-check every load)."""
    x_shape = (1, 64, 28, 28)
    for kernel, copied in ((1, False), (3, True)):
        w = RNG.randn(32, 64, kernel, kernel).astype("float32")
        mod = _module([("x", x_shape, "float32")],
                      lambda xv: relax.op.nn.conv2d(xv, relax.const(w), padding=kernel // 2))
        (conv,) = [f for f in _scheduled_funcs(mod, target).values()
                   if f.attrs.get("hetpart.cpu_rule") in ("conv2d_nchw", "conv2d_flat")]
        assert ("pad_temp" in conv.script()) == copied, kernel


def _kernel_layouts(mod):
    layouts = []

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == "relax.nn.conv2d":
            layouts.append(str(expr.attrs.kernel_layout))

    relax.analysis.post_order_visit(mod["main"], visit)
    return sorted(layouts)


def test_ragged_rows_get_half_register_channel_vectors_not_a_predicated_column_vector(target):
    """41-wide rows have no divisor near 16 lanes: a column vector would carry a predicated tail, which TVM runs as
    guarded scalar code (8x slower). A conv with 24 output channels vectorises them in half registers (8 of
    AVX-512's 16 lanes) instead. (With whole registers of channels the weights are prepacked: see the next test.)"""
    cin, cout, kernel, lanes = 8, 24, 3, 8
    if vector_lanes(target) != 16:
        pytest.skip(f"the lane counts asserted here are AVX-512's; this host's target has {vector_lanes(target)}")
    w = relax.const(RNG.randn(cout, cin, kernel, kernel).astype("float32"))
    mod = _module([("x", (1, cin, 41, 41), "float32")], lambda x: relax.op.nn.conv2d(x, w, padding=kernel // 2))
    (conv,) = [f for f in _scheduled_funcs(mod, target).values() if f.attrs.get("hetpart.cpu_rule") == "conv2d_nchw"]
    extents = set(re.findall(r"T\.vectorized\((?:T\.int64\()?(\d+)", conv.script()))
    assert extents == {str(lanes)}


@pytest.mark.parametrize("width,pointwise_layout", [
    pytest.param(28, "OIHW", id="columns-fit-28->14-lanes"),
    pytest.param(32, "OIHW", id="columns-fit-32->16-lanes"),
    pytest.param(6, PREPACKED_KERNEL_LAYOUT, id="narrow"),
    pytest.param(27, PREPACKED_KERNEL_LAYOUT, id="ragged-27->27-lanes"),
    pytest.param(20, PREPACKED_KERNEL_LAYOUT, id="ragged-20->20-lanes"),
    pytest.param(41, PREPACKED_KERNEL_LAYOUT, id="tail-41->16-lanes-and-a-predicated-tail"),
])
def test_prepack_rewrites_spatial_narrow_and_ragged_pointwise_convs_only(width, pointwise_layout):
    """3x3 convs always get channel vectors, depthwise never; a stride-1 1x1 conv only when its rows are too
    narrow for a column vector or have no divisor near 16 lanes (a longer, multi-register column vector, or one
    with a predicated tail)."""
    w3 = relax.const(RNG.randn(32, 16, 3, 3).astype("float32"))
    w1 = relax.const(RNG.randn(32, 32, 1, 1).astype("float32"))
    depthwise = relax.const(RNG.randn(32, 1, 3, 3).astype("float32"))

    def body(x):
        return relax.op.nn.conv2d(relax.op.nn.conv2d(relax.op.nn.conv2d(x, w3, padding=1), w1), depthwise,
                                  padding=1, groups=32)

    packed = prepack_conv_weights(16)(_module([("x", (1, 16, width, width), "float32")], body))
    assert _kernel_layouts(packed) == sorted([PREPACKED_KERNEL_LAYOUT, pointwise_layout, "OIHW"])


@pytest.mark.parametrize(
    "a_shape,w_shape",
    [
        pytest.param((1, 96), (40, 96), id="gemv"),
        pytest.param((5, 19), (37, 19), id="ragged"),
        pytest.param((8, 64), (48, 64), id="dividing"),
        pytest.param((16, 64), (96, 64), id="width-96-two-vectors"),
    ],
)
def test_dense_rule_fuses_bias_and_matches_numpy(target, a_shape, w_shape):
    a = RNG.randn(*a_shape).astype("float32")
    w = RNG.randn(*w_shape).astype("float32")
    b = RNG.randn(w_shape[0]).astype("float32")
    mod = _module(
        [("a", a.shape, "float32")],
        lambda av: relax.op.nn.relu(
            relax.op.add(relax.op.matmul(av, relax.op.permute_dims(relax.const(w))), relax.const(b))
        ),
    )
    funcs = _scheduled_funcs(mod, target)
    _assert_rule(funcs, "matmul", parallel=a_shape[0] * w_shape[0] >= 64)
    dense = [f for f in funcs.values() if f.attrs.get("hetpart.cpu_rule") == "matmul"]
    assert "T_add" in dense[0].script() or "compute" in dense[0].script()  # epilogue lives in the kernel
    np.testing.assert_allclose(_run(mod, target, [a]), np.maximum(a @ w.T + b, 0), rtol=TOL, atol=TOL)


def test_batch_matmul_of_activations_matches_numpy(target):
    q = RNG.randn(2, 7, 11).astype("float32")
    k = RNG.randn(2, 13, 11).astype("float32")
    mod = _module(
        [("q", q.shape, "float32"), ("k", k.shape, "float32")],
        lambda qv, kv: relax.op.matmul(qv, relax.op.permute_dims(kv, [0, 2, 1])),
    )
    funcs = _scheduled_funcs(mod, target)
    _assert_rule(funcs, "matmul", parallel=False)
    np.testing.assert_allclose(_run(mod, target, [q, k]), q @ k.transpose(0, 2, 1), rtol=TOL, atol=TOL)


def test_matmul_with_a_masked_epilogue_keeps_the_matmul_rule(target, caplog):
    """Scores masked by another input (a padding mask): the mask's expand_dims is computed before the matmul and
    read by the epilogue's where, and the rule failed ("reverse-compute-at") until it inlined such blocks."""
    q, kt = RNG.randn(2, 20, 64).astype("float32"), RNG.randn(2, 64, 20).astype("float32")
    mask = (RNG.rand(2, 20) > 0.3).astype("int64")

    def body(qv, kv, mv):
        scores = relax.op.divide(relax.op.matmul(qv, kv), relax.const(8.0, "float32"))
        masked = relax.op.equal(relax.op.expand_dims(mv, 1), relax.const(0, "int64"))
        return relax.op.where(masked, relax.const(-1e4, "float32"), scores)

    mod = _module([("q", q.shape, "float32"), ("kt", kt.shape, "float32"), ("mask", mask.shape, "int64")], body)
    with caplog.at_level("WARNING"):
        funcs = _scheduled_funcs(mod, target)
    assert not [r for r in caplog.records if "failed" in r.getMessage()]
    _assert_rule(funcs, "matmul", parallel=False)
    expected = np.where(mask[:, None, :] == 0, np.float32(-1e4), (q @ kt) / np.float32(8.0))
    np.testing.assert_allclose(_run(mod, target, [q, kt, mask]), expected, rtol=TOL, atol=TOL)


def test_pooling_matches_numpy(target):
    x = RNG.randn(1, 20, 15, 15).astype("float32")
    mod = _module(
        [("x", x.shape, "float32")],
        lambda xv: relax.op.nn.max_pool2d(xv, pool_size=3, strides=2, padding=1),
    )
    funcs = _scheduled_funcs(mod, target)
    assert any(f.attrs.get("hetpart.cpu_rule") is not None for f in funcs.values())
    kinds = set().union(*(_loop_kinds(f) for f in funcs.values()))
    assert "parallel" in kinds
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    ref = np.full((1, 20, 8, 8), -np.inf, dtype=np.float32)
    for i in range(3):
        for j in range(3):
            ref = np.maximum(ref, xp[:, :, i : i + 16 : 2, j : j + 16 : 2])
    np.testing.assert_allclose(_run(mod, target, [x]), ref, rtol=TOL, atol=TOL)


def test_softmax_and_layer_norm_match_numpy(target):
    x = RNG.randn(67, 96).astype("float32")
    gamma, beta = RNG.randn(96).astype("float32"), RNG.randn(96).astype("float32")

    def body(xv):
        norm = relax.op.nn.layer_norm(xv, relax.const(gamma), relax.const(beta), axes=[-1])
        return relax.op.nn.softmax(norm, axis=-1)

    mod = _module([("x", x.shape, "float32")], body)
    funcs = _scheduled_funcs(mod, target)
    _assert_rule(funcs, "row_reduction", vectorized=False)
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    norm = (x - mean) / np.sqrt(var + 1e-5) * gamma + beta
    ref = np.exp(norm - norm.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    np.testing.assert_allclose(_run(mod, target, [x]), ref, rtol=TOL, atol=TOL)


def test_elementwise_rule_vectorises_and_matches_numpy(target):
    x = RNG.randn(1, 24, 28, 28).astype("float32")
    y = RNG.randn(1, 24, 1, 1).astype("float32")
    mod = _module(
        [("x", x.shape, "float32"), ("y", y.shape, "float32")],
        lambda xv, yv: relax.op.clip(relax.op.multiply(relax.op.add(xv, yv), xv), 0.0, 6.0),
    )
    funcs = _scheduled_funcs(mod, target)
    _assert_rule(funcs, "elementwise")
    np.testing.assert_allclose(_run(mod, target, [x, y]), np.clip((x + y) * x, 0, 6), rtol=TOL, atol=TOL)


@pytest.mark.parametrize("shapes,axis", [
    pytest.param([(1, 24, 7, 7)] + [(1, 8, 7, 7)] * 6, 1, id="densenet-like-7-inputs"),
    pytest.param([(2, 5, 9), (2, 3, 9), (2, 7, 9)], 1, id="batch2-ragged-segments"),
    pytest.param([(6, 5), (6, 11), (6, 16)], 1, id="last-axis"),
    pytest.param([(3, 40), (5, 40)], 0, id="first-axis"),
])
def test_concat_rule_partitions_the_axis_and_matches_numpy(target, shapes, axis):
    """concat + BatchNorm-like epilogue + ReLU: the concat rule applies and the result matches numpy."""
    xs = [RNG.randn(*s).astype("float32") for s in shapes]
    channels = sum(s[axis] for s in shapes)
    scale = RNG.rand(channels).astype("float32") + 0.5
    bshape = [1] * len(shapes[0])
    bshape[axis] = channels

    def body(*vs):
        cat = relax.op.concat(list(vs), axis=axis)
        return relax.op.nn.relu(relax.op.multiply(cat, relax.const(scale.reshape(bshape))))

    mod = _module([(f"x{i}", s, "float32") for i, s in enumerate(shapes)], body)
    funcs = _scheduled_funcs(mod, target)
    _assert_rule(funcs, "concat", parallel=False, vectorized=False)
    (func,) = [f for f in funcs.values() if f.attrs.get("hetpart.cpu_rule") == "concat"]
    assert func.script().count("T.sblock(") >= len(shapes), "one partition (block copy) per input"
    ref = np.maximum(np.concatenate(xs, axis=axis) * scale.reshape(bshape), 0.0)
    np.testing.assert_allclose(_run(mod, target, xs), ref, rtol=TOL, atol=TOL)


def test_concat_chunk_runs_are_whole_vectors_or_long():
    from tvm_passes.schedules.concat import MIN_RUN_ELEMENTS, _chunks

    assert _chunks(14 * 14, 1, 2, 16) == 1        # 196: runs of 49 or 98 (49-element runs were 8x slower)
    assert _chunks(28 * 28, 1, 2, 16) == 4        # 784: runs of 196
    assert _chunks(56 * 56, 1, 2, 16) == 4        # 3136 = 4 x 49 vectors
    assert _chunks(64 * 64, 4, 2, 16) == 1        # enough parallel work in the leading axes already
    assert _chunks(224, 1, 2, 16) == 2            # runs of 56 are 3.5 AVX-512 vectors...
    assert _chunks(224, 1, 2, 8) == 4             # ...but 7 whole AVX2 vectors
    for lanes in (4, 8, 16):
        for inner in range(16, 5000, 7):
            chunks = _chunks(inner, 1, 2, lanes)
            run = inner // chunks
            assert inner % chunks == 0 and (chunks == 1 or run % lanes == 0 or run >= MIN_RUN_ELEMENTS)


@pytest.mark.parametrize("mcpu, chunks", [("znver5", 2), ("haswell", 4)])
def test_concat_chunks_follow_the_targets_vector_width(mcpu, chunks):
    # 224-element rows, 2 cores: AVX-512 (16 lanes) takes 2 chunks of 112, AVX2 (8 lanes) 4 chunks of 56
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
    mod = _module([("a", (1, 64, 224), "float32"), ("b", (1, 64, 224), "float32")],
                  lambda a, b: relax.op.concat([a, b], axis=1))
    (func,) = [f for f in _scheduled_funcs(mod, target).values() if f.attrs.get("hetpart.cpu_rule") == "concat"]
    text = func.script()
    assert f"T.parallel(T.int64({chunks}))" in text and f"T.int64({224 // chunks})" in text, text


def test_concat_rule_leaves_other_injective_kernels_alone(target):
    from tvm_passes.schedules.concat import Concat

    shape = (1, 8, 5, 5)
    plain = _module([("x", shape, "float32"), ("y", (1, 8, 1, 1), "float32")], lambda a, b: relax.op.add(a, b))
    with target:
        legal = tvm.transform.Sequential(cpu_generic.legalize_passes(target))(plain)
    (func,) = [f for _, f in legal.functions_items() if isinstance(f, tirx.PrimFunc)]
    assert Concat().apply(func, target) is None     # reads at v (and a broadcast), never at v - offset


def test_matmul_column_tiles_are_power_of_two_vector_counts():
    """1, 2 or 4 SIMD registers (or a half/quarter register), never 3: a 48-lane tile ran 14x slower."""
    from tvm_passes.schedules.matmul import power_of_two_vector

    assert power_of_two_vector(1024, 16, 4) == 64
    assert power_of_two_vector(96, 16, 4) == 32 and power_of_two_vector(48, 16, 4) == 16
    assert power_of_two_vector(2600, 16, 4) == 8 and power_of_two_vector(1950, 16, 4) == 16
    assert power_of_two_vector(96, 16, 1) == 16
