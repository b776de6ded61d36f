"""Kernel kinds and feature vectors of kernel-level OpNodes."""
import math

import pytest

from hetpart.graph import OpNode
from predictors.features import (FEATURE_SCHEMA, FEATURE_SCHEMA_VERSION, KIND_FEATURES, KINDS, SPECIALIST_KINDS,
                                 feature_matrix, feature_vector, kernel_kind, member_ops, model_kind, workload_key)
from tests.predictors.synthetic_kernels import conv_node, elementwise_node, matmul_node, pool_node, reshape_node


def _node(op, in_shapes=((1, 8),), out_shapes=((1, 8),), **kw):
    return OpNode(id=0, name="x", op=op, input_shapes=in_shapes, input_dtypes=("float32",) * len(in_shapes),
                  output_shapes=out_shapes, output_dtypes=("float32",) * len(out_shapes), **kw)


def test_kinds_follow_the_anchor_op():
    assert kernel_kind(conv_node(0, 1, 32, 64, 28, 3)) == "conv2d"
    assert kernel_kind(conv_node(0, 1, 32, 32, 28, 3, groups=32)) == "depthwise_conv2d"
    assert kernel_kind(conv_node(0, 1, 32, 64, 28, 3, groups=4)) == "conv2d"       # grouped, not depthwise
    assert kernel_kind(matmul_node(0, 8, 64, 32)) == "matmul"
    assert kernel_kind(pool_node(0, 1, 16, 28, 2, 2)) == "pool"
    assert kernel_kind(elementwise_node(0, (1, 8, 4, 4), 3)) == "elementwise"
    assert kernel_kind(reshape_node(0, (1, 8, 4, 4))) == "data_movement"
    assert kernel_kind(_node("relax.nn.softmax")) == "reduction"
    assert kernel_kind(_node("fused:nn.layer_norm+add")) == "reduction"
    assert kernel_kind(_node("relax.concat")) == "data_movement"
    assert kernel_kind(_node("fused:reshape+add")) == "elementwise"
    assert kernel_kind(_node("fused:add+nn.conv2d+nn.relu", in_shapes=((1, 8, 4, 4),),
                             out_shapes=((1, 8, 4, 4),), flops=10)) == "conv2d"
    assert kernel_kind(_node("relax.image.resize2d")) == "other"
    assert set(KIND_FEATURES) == set(KINDS) | set(SPECIALIST_KINDS)
    assert member_ops(_node("fused:nn.conv2d+add")) == ["nn.conv2d", "add"]


def test_feature_vector_is_complete_finite_and_matches_the_geometry():
    node = conv_node(0, 2, 20, 36, 28, 3, stride=2)
    f = feature_vector(node)
    assert set(f) == set(FEATURE_SCHEMA) and FEATURE_SCHEMA_VERSION >= 1
    assert all(math.isfinite(v) and v >= 0 for v in f.values())
    assert (f["batch"], f["in_channels"], f["out_channels"]) == (2, 20, 36)
    assert (f["out_height"], f["out_width"], f["out_spatial"]) == (14, 14, 196)
    assert (f["kernel_area"], f["stride"], f["groups"]) == (9, 2, 1)
    assert (f["in_channels_pad8"], f["in_channels_pad16"]) == (24, 32)
    assert (f["out_channels_pad8"], f["out_channels_pad16"]) == (40, 48)
    assert f["channel_pad_waste"] == 48 / 36
    assert f["bytes_total"] == node.bytes_read + node.bytes_written
    assert f["log_flops"] == math.log1p(node.flops)
    # reduction_size ~ Ci*Kh*Kw (+1 for the fused add)
    assert abs(f["reduction_size"] - (20 * 9 + 1)) < 1e-9


def test_matmul_and_pool_geometry():
    f = feature_vector(matmul_node(0, 32, 100, 50))
    assert (f["m"], f["n"], f["k"], f["n_pad8"], f["n_pad16"], f["k_pad8"]) == (32, 50, 100, 56, 64, 104)
    p = feature_vector(pool_node(0, 1, 16, 28, 3, 2))
    assert (p["kernel_area"], p["stride"], p["out_channels"], p["out_height"]) == (9, 2, 16, 13)


def test_pool_bounds_checked_when_a_window_can_overhang_the_input():
    def with_attrs(node, out_hw=None, **attrs):
        out = node.output_shapes if out_hw is None else ((*node.output_shapes[0][:2], out_hw, out_hw),)
        return OpNode(**{**node.to_dict(), "attrs": {**node.attrs, **attrs}, "output_shapes": out})

    fits = pool_node(0, 1, 64, 112, 2, 2)                          # VGG: 2x2 / 2 over 112 px, no padding
    assert feature_vector(fits)["pool_bounds_checked"] == 0.0
    assert feature_vector(with_attrs(fits, padding=[1, 1, 1, 1], out_hw=57))["pool_bounds_checked"] == 1.0
    # ceil_mode: 3x3 / 2 over 111 px ends exactly on the edge (55 windows); over 112 px the 56th window overhangs
    exact = pool_node(1, 1, 64, 111, 3, 2)
    assert feature_vector(with_attrs(exact, ceil_mode=True))["pool_bounds_checked"] == 0.0
    overhang = with_attrs(pool_node(2, 1, 64, 112, 3, 2), ceil_mode=True, out_hw=56)
    assert feature_vector(overhang)["pool_bounds_checked"] == 1.0
    assert feature_vector(matmul_node(3, 32, 100, 50))["pool_bounds_checked"] == 0.0


def test_matmul_geometry_of_a_kernel_that_slices_off_padded_columns():
    """tvm_passes.pad_columns: the kernel computes 1952 columns and keeps 1950; its schedule runs N = 1952."""
    node = _node("fused:matmul+add+strided_slice", in_shapes=((35, 1, 650), (650, 1952)),
                 out_shapes=((35, 1, 1950),), flops=2 * 35 * 650 * 1952 + 35 * 1952)
    f = feature_vector(node)
    assert (f["m"], f["n"], f["k"], f["n_alignment"]) == (35, 1952, 650, 32)


def test_geometry_falls_back_to_flops_when_operands_belong_to_another_member():
    # first member is permute_dims of the weight: operands do not match the matmul
    mm = _node("fused:permute_dims+matmul+add", in_shapes=((50, 100),), out_shapes=((32, 50),),
               flops=2 * 32 * 50 * 100 + 32 * 50)
    f = feature_vector(mm)
    assert (f["m"], f["n"], f["k"]) == (32, 50, 100)
    dw = _node("fused:nn.conv2d+add", in_shapes=((1, 64, 14, 14),), out_shapes=((1, 64, 14, 14),),
               flops=2 * 64 * 14 * 14 * 9, attrs={"anchor_attrs": {"groups": 64, "strides": [1, 1]}})
    assert kernel_kind(dw) == "depthwise_conv2d"
    assert abs(feature_vector(dw)["kernel_area"] - 9) < 1e-9


def test_feature_matrix_and_workload_key():
    nodes = [conv_node(0, 1, 16, 16, 14, 3), conv_node(5, 1, 16, 16, 14, 3), conv_node(1, 1, 16, 32, 14, 3)]
    X = feature_matrix(nodes, KIND_FEATURES["conv2d"])
    assert X.shape == (3, len(KIND_FEATURES["conv2d"]))
    assert workload_key(nodes[0]) == workload_key(nodes[1])          # ids and names do not matter
    assert workload_key(nodes[0]) != workload_key(nodes[2])


def test_schedule_alignment_and_member_composition_features():
    # N = 1950 leaves a scalar tail after any power-of-two vector tile; N = 2600 takes an 8-wide tile
    assert feature_vector(matmul_node(0, 35, 650, 1950))["n_alignment"] == 2
    assert feature_vector(matmul_node(0, 35, 650, 2600))["n_alignment"] == 8
    assert feature_vector(matmul_node(0, 35, 650, 4096))["n_alignment"] == 64       # capped
    conv = feature_vector(conv_node(0, 1, 32, 128, 27, 1))
    assert (conv["channel_alignment"], conv["width_alignment"]) == (64, 1)
    gelu = _node("fused:reshape+divide+erf+add+multiply+multiply+reshape", in_shapes=((512, 1024),),
                 out_shapes=((512, 1024),))
    f = feature_vector(gelu)
    # neither divide nor erf is costly: hetpart compiles erf to TVM's vectorised fast_erf (tvm_passes.legalize)
    assert (f["transcendental_ops"], f["elementwise_ops"], f["layout_ops"]) == (0, 5, 0)
    assert f["transcendental_elems"] == 0 and f["n_inputs"] == 1
    log_chain = feature_vector(_node("fused:log+multiply", in_shapes=((64, 100),), out_shapes=((64, 100),)))
    assert log_chain["transcendental_ops"] == 1 and log_chain["transcendental_elems"] == 6400
    cell = _node("fused:split+sigmoid+tanh+multiply+stack", in_shapes=((1, 2600), (1, 650)), out_shapes=((1, 650),))
    assert kernel_kind(cell) == "elementwise" and feature_vector(cell)["layout_ops"] == 2


def test_conv_tile_features_follow_the_cpu_rule():
    """The register tile of hetpart's conv rule (tvm_passes.tile_plan), at the target's SIMD width."""
    deep = feature_vector(conv_node(0, 1, 512, 512, 7, 3))              # prepacked, 7 columns x 2 channel vectors
    assert (deep["conv_tile_accumulators"], deep["conv_lane_fill"]) == (14.0, 1.0)
    tiny = feature_vector(conv_node(1, 1, 1024, 2048, 8, 1, stride=2))  # 4x4 output: 4 columns x 2 vectors
    assert tiny["conv_tile_accumulators"] == 8.0
    pointwise = feature_vector(conv_node(2, 1, 64, 256, 56, 1))         # column vectors of 14 of 16 lanes
    assert pointwise["conv_tile_accumulators"] == 8.0 and pointwise["conv_lane_fill"] == 14 / 16
    avx2 = feature_vector(conv_node(2, 1, 64, 256, 56, 1), vector_lanes=8)
    assert avx2["conv_lane_fill"] == 1.0                                # 56 = 7 whole 8-lane vectors
    assert feature_vector(matmul_node(3, 64, 64, 64))["conv_tile_accumulators"] == 0.0


def test_aliased_weight_share_marks_output_channels_spanning_4_kib_and_weighs_the_weights_traffic():
    """ResNet-50's 256->1024 1x1 conv ran 7.4 µs/MFLOP at 7x7 against 5.2 for 768 or 1280 output channels."""
    small_map = feature_vector(conv_node(0, 1, 256, 1024, 7, 1))
    weights, per_sample = 1024 * 256 * 4, small_map["bytes_per_sample"]
    assert small_map["aliased_weight_share"] == pytest.approx(small_map["param_bytes"] / per_sample)
    assert 0.6 < small_map["aliased_weight_share"] < 1 and small_map["param_bytes"] >= weights
    large_map = feature_vector(conv_node(1, 1, 256, 1024, 28, 1))      # same weights, 16x the activations
    assert 0 < large_map["aliased_weight_share"] < small_map["aliased_weight_share"] / 3
    assert feature_vector(conv_node(2, 1, 256, 2048, 4, 1))["aliased_weight_share"] > 0.8
    for co in (768, 1000, 1280, 1536):                                  # rows not 4 KiB apart
        assert feature_vector(conv_node(3, 1, 256, co, 7, 1))["aliased_weight_share"] == 0.0
    assert feature_vector(conv_node(4, 1, 1024, 1024, 7, 3, groups=1024))["aliased_weight_share"] == 0.0  # depthwise
    assert feature_vector(matmul_node(5, 64, 1024, 1024))["aliased_weight_share"] == 0.0

def test_matmul_features_describe_the_rules_register_tile():
    step = feature_vector(matmul_node(0, 1, 650, 2608), vector_lanes=16)      # an LSTM step: 8 column vectors
    assert (step["matmul_tile_accumulators"], step["matmul_vector_width"]) == (8, 16)
    batch4 = feature_vector(matmul_node(0, 4, 650, 2608), vector_lanes=16)    # 4 rows x 1 vector
    assert (batch4["matmul_tile_accumulators"], batch4["matmul_vector_width"]) == (4, 16)
    wide = feature_vector(matmul_node(0, 128, 256, 1024), vector_lanes=16)    # 4 rows x 4 vectors
    assert (wide["matmul_tile_accumulators"], wide["matmul_vector_width"]) == (16, 64)
    # a batch of matrix-vector products sharing one matrix is tiled over the batch, as the rule does
    hoisted = OpNode(id=0, name="k0", op="fused:matmul+add", input_shapes=((35, 1, 650), (650, 2608)),
                     input_dtypes=("float32", "float32"), output_shapes=((35, 1, 2608),), output_dtypes=("float32",),
                     flops=2 * 35 * 650 * 2608, bytes_read=4 * (35 * 650 + 650 * 2608), bytes_written=4 * 35 * 2608)
    assert feature_vector(hoisted, vector_lanes=16)["matmul_tile_accumulators"] == 7     # 7 of the 35 rows
    conv = feature_vector(conv_node(0, 1, 32, 128, 27, 1))
    assert conv["matmul_tile_accumulators"] == conv["matmul_vector_width"] == 0


def test_matrix_vector_products_are_the_gemv_specialist_s_and_the_rules():
    """model_kind: "gemv" exactly for the matmuls the CPU rule schedules as matrix-vector products."""
    step = matmul_node(0, 1, 650, 2608)                  # an LSTM step at batch 1
    assert (kernel_kind(step), model_kind(step)) == ("matmul", "gemv")
    assert model_kind(matmul_node(0, 4, 650, 2608)) == "matmul"      # 4 rows: a register-tiled product
    hoisted = OpNode(id=0, name="k0", op="fused:matmul+add", input_shapes=((35, 1, 650), (650, 2608)),
                     input_dtypes=("float32", "float32"), output_shapes=((35, 1, 2608),), output_dtypes=("float32",),
                     flops=2 * 35 * 650 * 2608, bytes_read=4 * (35 * 650 + 650 * 2608), bytes_written=4 * 35 * 2608)
    assert model_kind(hoisted) == "matmul"                # 35 products sharing B: tiled over the 35
    for node in (conv_node(0, 1, 32, 64, 28, 3), pool_node(0, 1, 16, 28, 2, 2), reshape_node(0, (1, 8))):
        assert model_kind(node) == kernel_kind(node)
    assert SPECIALIST_KINDS == {"gemv": "matmul"}
    assert set(KIND_FEATURES["matmul"]) < set(KIND_FEATURES["gemv"])


def test_bytes_beyond_the_cores_cache_is_what_the_kernel_moves_past_their_l2():
    step = matmul_node(0, 1, 650, 2608)
    total = step.bytes_read + step.bytes_written                        # 6.8 MB
    assert feature_vector(step, core_cache_bytes=4 * 2 ** 20)["bytes_beyond_core_cache"] == total - 4 * 2 ** 20
    assert feature_vector(step, core_cache_bytes=8 * 2 ** 20)["bytes_beyond_core_cache"] == 0.0
    small = feature_vector(matmul_node(0, 1, 64, 64))
    assert small["bytes_beyond_core_cache"] == 0.0 and small["bytes_total"] > 0
