"""Features of one fused kernel (a kernel-level :class:`hetpart.graph.OpNode`) for latency prediction.

``kernel_kind(node)`` names the kind of work a kernel does, decided by its *anchor* op (the member that
dominates the kernel: a convolution beats a matmul beats a pool beats a reduction beats an unclassified op beats
elementwise beats data movement). ``feature_vector(node)`` returns the numbers listed in :data:`FEATURE_SCHEMA`
(schema version :data:`FEATURE_SCHEMA_VERSION`; bump it whenever a definition changes, fitted predictors store it).

Shapes: a fused node carries the *first* member's input shapes and the *last* member's output shapes
(``OpGraph.kernel_graph``). Convolution and matmul geometry is read from the operands when they are consistent
with the anchor (data/weight 4-D for conv2d, ``A[-1] == B[-2]`` for matmul) and otherwise derived from the
output shape and the FLOP count (``reduction_size = flops / (2 * output elements)`` is ``Ci/groups*Kh*Kw`` for a
convolution and ``K`` for a matmul), so every feature is defined for every node (never NaN).
"""
from __future__ import annotations

import json
import math
from typing import Any, Mapping

import numpy as np

from hetpart.graph import OpNode
from predictors.feature_schema import (FALLBACK_FEATURES, FEATURE_SCHEMA_VERSION, KIND_FEATURES,  # noqa: F401
                                       KIND_FEATURES_BY_SCHEMA, PER_SAMPLE_KINDS, RESIDUAL_EXCLUDED,
                                       SPECIALIST_KINDS)
from tvm_passes.tile_plan import conv_prepacks_weights, conv_register_tile, matmul_register_tile

# SIMD width (fp32 lanes) assumed by the schedule-derived features when the caller does not give its target's
# (AVX-512, the machine kind hetpart ships a CPU predictor for); DevicePredictor passes its own target's width.
DEFAULT_VECTOR_LANES = 16
# Combined L2 of the cores a kernel runs on, when the caller does not give its machine's (DevicePredictor records
# the L2 of the thread count its database's kernels ran with; predictors.context re-exports this default).
DEFAULT_CORE_CACHE_BYTES = 2 * 2 ** 20
# Addresses this far apart share an L1 data cache set (64 sets x 64-byte lines on Zen 4, Zen 5 and the Intel cores).
L1_SET_PERIOD_BYTES = 4096

KINDS = ("conv2d", "depthwise_conv2d", "matmul", "pool", "elementwise", "reduction", "data_movement", "other")

# Op names without the "relax." prefix.
_CONV_OPS = {"nn.conv1d", "nn.conv2d", "nn.conv3d", "nn.conv2d_transpose", "nn.conv1d_transpose"}
_MATMUL_OPS = {"matmul", "nn.dense", "linear", "nn.batch_matmul", "einsum"}
_POOL_OPS = {"nn.max_pool1d", "nn.max_pool2d", "nn.max_pool3d", "nn.avg_pool1d", "nn.avg_pool2d", "nn.avg_pool3d",
             "nn.adaptive_avg_pool1d", "nn.adaptive_avg_pool2d", "nn.adaptive_avg_pool3d"}
_REDUCTION_OPS = {"nn.softmax", "nn.log_softmax", "nn.layer_norm", "nn.group_norm", "nn.rms_norm", "nn.instance_norm",
                  "mean", "sum", "max", "min", "prod", "variance", "std", "argmax", "argmin", "cumsum", "cumprod"}
_DATA_MOVEMENT_OPS = {"reshape", "permute_dims", "concat", "stack", "take", "split", "strided_slice",
                      "dynamic_strided_slice", "squeeze", "expand_dims", "flatten", "broadcast_to", "repeat",
                      "tile", "flip", "gather_elements", "gather_nd", "scatter_elements", "scatter_nd",
                      "layout_transform", "nn.pad", "collapse_sum_to", "collapse_sum_like", "zeros", "ones", "full",
                      "zeros_like", "ones_like", "full_like", "shape_of", "tensor_to_shape", "shape_to_tensor",
                      "arange", "one_hot", "index_tensor"}
_ELEMENTWISE_OPS = {"add", "subtract", "multiply", "divide", "floor_divide", "power", "maximum", "minimum", "mod",
                    "floor_mod", "nn.relu", "nn.relu6", "nn.gelu", "nn.gelu_tanh", "nn.silu", "nn.leakyrelu",
                    "nn.prelu", "nn.selu", "nn.softplus", "nn.dropout", "nn.batch_norm", "sigmoid", "tanh", "exp",
                    "log", "sqrt", "rsqrt", "clip", "negative", "abs", "erf", "astype", "where", "less",
                    "less_equal", "greater", "greater_equal", "equal", "not_equal", "logical_and", "logical_or",
                    "logical_not", "round", "floor", "ceil", "sin", "cos", "tan", "square", "sign", "isnan",
                    "isinf", "isfinite", "bitwise_and", "bitwise_or", "hard_sigmoid", "hard_swish", "trunc"}
# Members that cost tens of times an add per element: the ones the CPU compiles to a scalar libm call per element,
# and softmax, whose fast exp polynomial runs twice per element inside scalar row-reduction loops (212 µs for
# 128x1024, 40x an add). exp, tanh, sigmoid, erf and the elementwise ops built on them (gelu, silu) are not here:
# hetpart legalizes them to TVM's vectorised polynomials (tvm_passes.legalize). Measured, 128x1024 float32: add
# 5 µs, divide 6, sqrt 7, fast exp 10, fast tanh 9, fast erf 11; libm log 184, power 386 (as libm calls exp took
# 161, sigmoid 179, tanh 360).
_TRANSCENDENTAL_OPS = {"log", "power", "nn.softplus", "nn.selu", "sin", "cos", "tan", "nn.softmax",
                       "nn.log_softmax"}
# Data-movement members that change the memory layout (strided reads/writes instead of streaming copies).
_LAYOUT_OPS = {"permute_dims", "concat", "stack", "split", "take", "strided_slice", "dynamic_strided_slice",
               "layout_transform", "flip", "gather_elements", "gather_nd", "scatter_elements", "scatter_nd",
               "nn.pad", "repeat", "tile", "index_tensor"}
MAX_ALIGNMENT = 64
# Higher rank = more likely to dominate the kernel's time.
_KIND_RANK = {"conv2d": 6, "matmul": 5, "pool": 4, "reduction": 3, "other": 2, "elementwise": 1, "data_movement": 0}

FEATURE_SCHEMA: dict[str, str] = {
    "flops": "floating-point operations of the kernel (multiply-add = 2)",
    "bytes_read": "bytes of every operand read (activations + parameters; a slice or take reads only its part)",
    "bytes_written": "bytes of every output written",
    "param_bytes": "bytes of parameter / constant operands",
    "bytes_total": "bytes_read + bytes_written",
    "arithmetic_intensity": "flops / max(bytes_total, 1)",
    "out_elems": "elements of the (first) output",
    "in_elems": "elements of the first input operand",
    "n_members": "number of ops fused into the kernel",
    "batch": "batch size (N of the output, or the matmul batch)",
    "in_channels": "input channels of a convolution (0 otherwise)",
    "out_channels": "output channels of a convolution / pool (C of the output)",
    "out_height": "output height (conv/pool), 1 otherwise",
    "out_width": "output width (conv/pool), 1 otherwise",
    "out_spatial": "out_height * out_width",
    "kernel_h": "window height (conv weight or pool_size), 1 otherwise",
    "kernel_w": "window width, 1 otherwise",
    "kernel_area": "kernel_h * kernel_w",
    "stride": "largest stride (conv/pool), 1 otherwise",
    "groups": "convolution groups, 1 otherwise",
    "channels_per_group": "in_channels / groups",
    "reduction_size": "flops / (2 * out_elems): Ci/groups*Kh*Kw for conv, K for matmul",
    "m": "matmul rows (all leading dims of the output folded in, including the batch)",
    "n": "matmul columns (last output dim)",
    "k": "matmul reduction length",
    "in_channels_pad8": "in_channels rounded up to a multiple of 8 (AVX2 fp32 vector width)",
    "in_channels_pad16": "in_channels rounded up to a multiple of 16 (AVX-512 fp32 / GPU warp half)",
    "out_channels_pad8": "out_channels rounded up to a multiple of 8",
    "out_channels_pad16": "out_channels rounded up to a multiple of 16",
    "out_width_pad8": "out_width rounded up to a multiple of 8",
    "n_pad8": "matmul n rounded up to a multiple of 8",
    "n_pad16": "matmul n rounded up to a multiple of 16",
    "k_pad8": "matmul k rounded up to a multiple of 8",
    "channel_pad_waste": "out_channels_pad16 / max(out_channels, 1) (1 = no padding waste)",
    "n_inputs": "number of input tensors of the kernel",
    "transcendental_ops": "members costing tens of adds per element (libm calls: log, power, sin, ...; softmax)",
    "elementwise_ops": "elementwise members (including the transcendental ones)",
    "layout_ops": "members that change the memory layout (permute_dims, concat, split, take, slices, pad, ...)",
    "transcendental_elems": "out_elems * transcendental_ops (work of the costly elementwise members)",
    "elementwise_elems": "out_elems * elementwise_ops",
    "concat_chain_elems": "out_elems * n_inputs when a member is concat/stack (0 otherwise): TVM computes each "
                          "output element of a concat through a chain of selects over its inputs",
    "n_alignment": "largest power of two (<= 64) dividing the matmul n: the CPU schedule's column vector tile "
                   "(a non-dividing tile leaves a scalar tail)",
    "channel_alignment": "largest power of two (<= 64) dividing the output channels",
    "width_alignment": "largest power of two (<= 64) dividing the output width",
    "conv_tile_accumulators": "SIMD registers in the register tile hetpart's CPU conv rule gives the kernel "
                              "(tvm_passes.tile_plan; 0 for other kinds): few accumulators starve the FMA units",
    "conv_lane_fill": "share of the conv tile's vector lanes that hold outputs (1 = whole vectors; 1 for other "
                      "kinds)",
    "matmul_tile_accumulators": "SIMD registers in the register tile hetpart's CPU matmul rule gives the kernel "
                                "(tvm_passes.tile_plan; 0 for other kinds)",
    "matmul_vector_width": "elements of the matmul tile's column vector (a power-of-two number of registers, half or "
                           "quarter of one, or the whole N when small and ragged; 0 for other kinds)",
    "bytes_beyond_core_cache": "bytes_total minus the combined L2 of the cores the kernel runs on (0 when it "
                               "fits): what a kernel that streams its operands once reads from L3 or DRAM",
    "pool_bounds_checked": "1 when a pool window can reach outside its input (padding, or ceil_mode rounding the "
                           "output up), so every load is guarded; 0 otherwise (and for other kinds)",
    "aliased_weight_share": "for a conv2d whose output channels span a multiple of 4 KiB (fp32: a multiple of 1024 "
                            "channels), its weights' share of its per-sample bytes (param_bytes / bytes_per_sample); "
                            "0 otherwise. Its weight rows then sit 4 KiB apart, the L1 set-index period, so the "
                            "reduction over input channels maps every row to the same cache set",
    "flops_per_sample": "flops / batch",
    "bytes_per_sample": "activation bytes (bytes_total - param_bytes) / batch + param_bytes: the bytes of the "
                        "same kernel at batch 1",
    "log_flops": "log(1 + flops)",
    "log_bytes_total": "log(1 + bytes_total)",
    "log_out_elems": "log(1 + out_elems)",
    "log_arithmetic_intensity": "log(1 + arithmetic_intensity)",
}



def member_ops(node: OpNode) -> list[str]:
    """Member op names without the ``relax.`` prefix ("fused:nn.conv2d+add" -> ["nn.conv2d", "add"])."""
    if node.op.startswith("fused:"):
        return [m for m in node.op.removeprefix("fused:").split("+") if m]
    return [node.op.removeprefix("relax.")]


def _op_kind(op: str) -> str:
    if op in _CONV_OPS:
        return "conv2d"
    if op in _MATMUL_OPS:
        return "matmul"
    if op in _POOL_OPS:
        return "pool"
    if op in _REDUCTION_OPS:
        return "reduction"
    if op in _ELEMENTWISE_OPS:
        return "elementwise"
    if op in _DATA_MOVEMENT_OPS:
        return "data_movement"
    return "other"


def anchor_attrs(node: OpNode) -> Mapping[str, Any]:
    """Attributes of the anchor op (``attrs["anchor_attrs"]`` of a fused kernel, else the op's own attrs)."""
    inner = node.attrs.get("anchor_attrs")
    return inner if isinstance(inner, Mapping) else node.attrs


def _pair(value: Any, default: int) -> tuple[int, int]:
    if value is None:
        return default, default
    if isinstance(value, (int, float)):
        return int(value), int(value)
    vals = [int(v) for v in value]
    if not vals:
        return default, default
    return (vals[0], vals[-1]) if len(vals) <= 2 else (vals[0], vals[1])


def _base_kind(node: OpNode) -> str:
    kinds = [_op_kind(m) for m in member_ops(node)]
    return max(kinds, key=lambda k: _KIND_RANK[k])


def _conv_geometry(node: OpNode) -> dict[str, float]:
    """Batch, channels, output size, window and groups of a convolution-anchored kernel."""
    attrs = anchor_attrs(node)
    layout = str(attrs.get("data_layout", "NCHW"))
    kernel_layout = str(attrs.get("kernel_layout", "OIHW"))
    groups = max(1, int(attrs.get("groups", 1) or 1))
    out = node.output_shapes[0] if node.output_shapes else ()
    geo = {"batch": 1.0, "out_channels": 0.0, "out_height": 1.0, "out_width": 1.0, "in_channels": 0.0,
           "kernel_h": 1.0, "kernel_w": 1.0, "groups": float(groups)}
    if len(out) == 4 and len(layout) == 4 and set(layout) == set("NCHW"):
        geo.update(batch=out[layout.index("N")], out_channels=out[layout.index("C")],
                   out_height=out[layout.index("H")], out_width=out[layout.index("W")])
    elif len(out) >= 3:      # conv1d NCW: treat width as spatial
        geo.update(batch=out[0], out_channels=out[1], out_width=int(np.prod(out[2:])))
    shapes = node.input_shapes
    if len(shapes) >= 2 and len(shapes[0]) == 4 and len(shapes[1]) == 4 and set(kernel_layout) == set("OIHW"):
        data, weight = shapes[0], shapes[1]
        geo.update(in_channels=data[layout.index("C")] if set(layout) == set("NCHW") else data[1],
                   kernel_h=weight[kernel_layout.index("H")], kernel_w=weight[kernel_layout.index("W")])
    else:                    # operands unknown: Ci/groups*Kh*Kw from the FLOPs
        out_elems = max(1.0, float(np.prod(out))) if out else 1.0
        per_output = max(1.0, node.flops / (2.0 * out_elems))
        if groups > 1 and groups == geo["out_channels"]:   # depthwise: the window is all of it
            side = math.sqrt(per_output)
            geo.update(in_channels=groups, kernel_h=side, kernel_w=side)
        else:                                            # assume a 1x1 window
            geo["in_channels"] = per_output * groups
    return {k: float(v) for k, v in geo.items()}


def kernel_kind(node: OpNode) -> str:
    """One of :data:`KINDS`, from the anchor op (a grouped convolution with groups == in_channels is depthwise)."""
    kind = _base_kind(node)
    if kind == "conv2d":
        geo = _conv_geometry(node)
        if geo["groups"] > 1 and geo["groups"] >= geo["in_channels"] > 0:
            return "depthwise_conv2d"
    return kind


def model_kind(node: OpNode) -> str:
    """The model that predicts a kernel: its :func:`kernel_kind`, or the specialist kind of
    :data:`SPECIALIST_KINDS` it falls in -- ``"gemv"`` for a matmul hetpart's CPU rule schedules as matrix-vector
    products (one output row per product: ``tvm_passes.tile_plan.matmul_register_tile`` with ``gemv=True``)."""
    kind = kernel_kind(node)
    if kind == "matmul" and _matmul_tile_rows(node) == 1:
        return "gemv"
    return kind


def _round_up(x: float, multiple: int) -> float:
    return float(math.ceil(x / multiple) * multiple) if x > 0 else 0.0


def _pow2_divisor(x: float) -> float:
    """Largest power of two <= MAX_ALIGNMENT dividing ``x`` (1 for 0 or non-integers)."""
    value = int(x)
    if value <= 0 or value != x:
        return 1.0
    return float(min(MAX_ALIGNMENT, value & -value))


def _matmul_geometry(node: OpNode, out_elems: float) -> dict[str, float]:
    """m (rows, leading dims folded in), n, k and batch of a matmul-anchored kernel.

    From the operands when they are consistent (``A[-1] == B[-2]``): the kernel may end in a slice of the product
    (``tvm_passes.pad_columns`` computes N padded to whole vectors, then drops the padding), and its schedule runs
    the operands' N, not the output's. Otherwise from the output shape and the FLOPs."""
    out = node.output_shapes[0] if node.output_shapes else (1,)
    batch = float(np.prod(out[:-2])) if len(out) > 2 else 1.0
    m = max(1.0, out_elems / max(float(out[-1]) if out else 1.0, 1.0))     # rows: a column slice keeps them
    shapes = node.input_shapes
    if len(shapes) >= 2 and len(shapes[0]) >= 1 and len(shapes[1]) >= 2 and shapes[0][-1] == shapes[1][-2]:
        return {"m": m, "n": float(shapes[1][-1]), "k": float(shapes[0][-1]), "batch": batch}
    n = float(out[-1]) if out else 1.0
    return {"m": m, "n": n, "k": max(1.0, round(node.flops / (2.0 * max(out_elems, 1.0)))), "batch": batch}


def _pool_bounds_checked(node: OpNode, attrs: Mapping[str, Any], kh: int, kw: int) -> float:
    """1.0 when a window of this pool can reach outside its input: explicit padding, or ceil_mode making the last
    window overhang (``(out - 1) * stride + window > in``); 0.0 for windows that always fit (and global pools)."""
    if "pool_size" not in attrs:
        return 0.0
    if any(int(p) > 0 for p in (attrs.get("padding") or ())):
        return 1.0
    shapes, out = node.input_shapes, node.output_shapes[0] if node.output_shapes else ()
    if not attrs.get("ceil_mode") or not shapes or len(shapes[0]) != 4 or len(out) != 4:
        return 0.0
    sh, sw = _pair(attrs.get("strides"), 1)
    dh, dw = _pair(attrs.get("dilation"), 1)
    over_h = (out[2] - 1) * sh + (kh - 1) * dh + 1 > shapes[0][2]
    over_w = (out[3] - 1) * sw + (kw - 1) * dw + 1 > shapes[0][3]
    return float(over_h or over_w)


def _conv_tile(node: OpNode, f: Mapping[str, float], vector_lanes: int) -> tuple[float, float]:
    """(accumulators, lane fill) of the register tile hetpart's CPU conv rule gives a conv-anchored kernel.

    Weights count as constants (prepackable) when the kernel has parameter operands, as in deployed models."""
    out_channels, out_width = int(f["out_channels"]), int(f["out_width"])
    kh, kw, groups = int(f["kernel_h"]), int(f["kernel_w"]), int(f["groups"])
    prepacked = node.param_bytes > 0 and conv_prepacks_weights(
        out_channels, groups, kh, kw, _pair(anchor_attrs(node).get("strides"), 1), out_width, vector_lanes)
    tile = conv_register_tile(out_channels=max(out_channels, 1), out_width=max(out_width, 1),
                              reduction=int(round(f["channels_per_group"] * kh * kw)),
                              channel_innermost_weights=prepacked, lanes=vector_lanes)
    return float(tile.accumulators(vector_lanes)), tile.lane_fill(vector_lanes)


def _matmul_tile_rows(node: OpNode) -> int:
    """The axis hetpart's CPU matmul rule register-tiles: M, or for M = 1 the batch of matrix-vector products when
    they share one matrix B (a 2-D operand; e.g. an LSTM's hoisted input projection)."""
    out = node.output_shapes[0] if node.output_shapes else (1,)
    rows = int(out[-2]) if len(out) >= 2 else 1
    shapes = node.input_shapes
    if rows == 1 and len(out) > 2 and len(shapes) >= 2 and len(shapes[1]) == 2:
        rows = int(np.prod(out[:-2]))
    return max(rows, 1)


def feature_vector(node: OpNode, vector_lanes: int = DEFAULT_VECTOR_LANES,
                   core_cache_bytes: int = DEFAULT_CORE_CACHE_BYTES) -> dict[str, float]:
    """Every feature of :data:`FEATURE_SCHEMA` for one kernel, as finite non-negative floats.

    ``vector_lanes``: fp32 SIMD lanes of the CPU the kernel is compiled for (the schedule-derived conv and matmul
    features depend on it); ``core_cache_bytes``: combined L2 of the cores it runs on."""
    kind = kernel_kind(node)
    out_elems = float(np.prod(node.output_shapes[0])) if node.output_shapes else 0.0
    in_elems = float(np.prod(node.input_shapes[0])) if node.input_shapes else 0.0
    bytes_total = float(node.bytes_read + node.bytes_written)
    f: dict[str, float] = {
        "flops": float(node.flops), "bytes_read": float(node.bytes_read), "bytes_written": float(node.bytes_written),
        "param_bytes": float(node.param_bytes), "bytes_total": bytes_total,
        "arithmetic_intensity": node.flops / max(bytes_total, 1.0), "out_elems": out_elems, "in_elems": in_elems,
        "n_members": float(len(member_ops(node))), "batch": 1.0, "in_channels": 0.0, "out_channels": 0.0,
        "out_height": 1.0, "out_width": 1.0, "kernel_h": 1.0, "kernel_w": 1.0, "stride": 1.0, "groups": 1.0,
        "reduction_size": node.flops / (2.0 * max(out_elems, 1.0)), "m": 0.0, "n": 0.0, "k": 0.0,
        "pool_bounds_checked": 0.0, "bytes_beyond_core_cache": max(0.0, bytes_total - float(core_cache_bytes)),
    }
    attrs = anchor_attrs(node)
    if kind in ("conv2d", "depthwise_conv2d"):
        f.update(_conv_geometry(node))
        f["stride"] = float(max(_pair(attrs.get("strides"), 1)))
    elif kind == "pool":
        out = node.output_shapes[0] if node.output_shapes else ()
        if len(out) == 4:
            f.update(batch=float(out[0]), out_channels=float(out[1]), out_height=float(out[2]),
                     out_width=float(out[3]))
        if "pool_size" in attrs:
            kh, kw = _pair(attrs.get("pool_size"), 1)
        elif node.input_shapes and len(node.input_shapes[0]) == 4 and len(out) == 4:   # adaptive / global pool
            kh = max(1, node.input_shapes[0][2] // max(out[2], 1))
            kw = max(1, node.input_shapes[0][3] // max(out[3], 1))
        else:
            kh = kw = 1
        f.update(kernel_h=float(kh), kernel_w=float(kw), stride=float(max(_pair(attrs.get("strides"), 1))),
                 pool_bounds_checked=_pool_bounds_checked(node, attrs, kh, kw))
    elif kind == "matmul":
        f.update(_matmul_geometry(node, out_elems))
    f["out_spatial"] = f["out_height"] * f["out_width"]
    f["kernel_area"] = f["kernel_h"] * f["kernel_w"]
    f["channels_per_group"] = f["in_channels"] / max(f["groups"], 1.0)
    f.update(in_channels_pad8=_round_up(f["in_channels"], 8), in_channels_pad16=_round_up(f["in_channels"], 16),
             out_channels_pad8=_round_up(f["out_channels"], 8), out_channels_pad16=_round_up(f["out_channels"], 16),
             out_width_pad8=_round_up(f["out_width"], 8), n_pad8=_round_up(f["n"], 8),
             n_pad16=_round_up(f["n"], 16), k_pad8=_round_up(f["k"], 8))
    members = member_ops(node)
    transcendental = sum(m in _TRANSCENDENTAL_OPS for m in members)
    elementwise = sum(m in _ELEMENTWISE_OPS for m in members)
    f.update(n_inputs=float(len(node.input_shapes)), transcendental_ops=float(transcendental),
             elementwise_ops=float(elementwise), layout_ops=float(sum(m in _LAYOUT_OPS for m in members)),
             transcendental_elems=out_elems * transcendental, elementwise_elems=out_elems * elementwise,
             concat_chain_elems=out_elems * len(node.input_shapes) if {"concat", "stack"} & set(members) else 0.0,
             n_alignment=_pow2_divisor(f["n"]), channel_alignment=_pow2_divisor(f["out_channels"]),
             width_alignment=_pow2_divisor(f["out_width"]))
    f["channel_pad_waste"] = f["out_channels_pad16"] / max(f["out_channels"], 1.0) if f["out_channels"] else 1.0
    f["conv_tile_accumulators"], f["conv_lane_fill"] = 0.0, 1.0
    if kind in ("conv2d", "depthwise_conv2d"):
        f["conv_tile_accumulators"], f["conv_lane_fill"] = _conv_tile(node, f, vector_lanes)
    f["matmul_tile_accumulators"] = f["matmul_vector_width"] = 0.0
    if kind == "matmul":
        tile = matmul_register_tile(_matmul_tile_rows(node), max(int(f["n"]), 1), vector_lanes)
        f["matmul_tile_accumulators"], f["matmul_vector_width"] = float(tile.accumulators(vector_lanes)), \
            float(tile.vec_factor)
    batch = max(f["batch"], 1.0)
    f.update(flops_per_sample=f["flops"] / batch,
             bytes_per_sample=(bytes_total - f["param_bytes"]) / batch + f["param_bytes"])
    aliased = kind == "conv2d" and f["out_channels"] >= 1 and (int(f["out_channels"]) * 4) % L1_SET_PERIOD_BYTES == 0
    f["aliased_weight_share"] = f["param_bytes"] / max(f["bytes_per_sample"], 1.0) if aliased else 0.0
    f.update(log_flops=math.log1p(f["flops"]), log_bytes_total=math.log1p(bytes_total),
             log_out_elems=math.log1p(out_elems), log_arithmetic_intensity=math.log1p(f["arithmetic_intensity"]))
    assert set(f) == set(FEATURE_SCHEMA), sorted(set(f) ^ set(FEATURE_SCHEMA))
    return f


def feature_matrix(nodes: list[OpNode] | tuple[OpNode, ...], names: tuple[str, ...],
                   vector_lanes: int = DEFAULT_VECTOR_LANES,
                   core_cache_bytes: int = DEFAULT_CORE_CACHE_BYTES) -> np.ndarray:
    """Rows = nodes, columns = the named features (float64)."""
    return vectors_to_matrix([feature_vector(n, vector_lanes, core_cache_bytes) for n in nodes], names)


def vectors_to_matrix(rows: list[Mapping[str, float]], names: tuple[str, ...]) -> np.ndarray:
    """Rows = feature vectors (from :func:`feature_vector`), columns = the named features (float64)."""
    return np.array([[r[name] for name in names] for r in rows], dtype=np.float64).reshape(len(rows), len(names))


def workload_key(node: OpNode) -> str:
    """Identifies a kernel's workload: ops, shapes, dtypes and attributes (not names or ids)."""
    return json.dumps([node.op, [list(s) for s in node.input_shapes], list(node.input_dtypes),
                       [list(s) for s in node.output_shapes], list(node.output_dtypes), node.flops,
                       node.bytes_read, node.bytes_written, dict(anchor_attrs(node))], sort_keys=True, default=str)
