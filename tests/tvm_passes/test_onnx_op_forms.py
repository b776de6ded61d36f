"""Less common ONNX op forms third-party models carry (resize and grid-sample modes, RoiAlign, 3-D convs and
pools, transposed convs with output padding, pad modes, negative-step slices, old-opset softmax, integer ops,
per-axis dequantization, ...), each a one-node (or few-node) model imported by hetpart and compiled by its CPU
pipeline, against onnxruntime. A regression guard for the import path: TVM's converters, hetpart's own and its
frontend passes."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from hetpart.errors import UnsupportedOpError
from tvm_passes.frontend import import_model
from tvm_passes.schedules import cpu_pipeline, default_cpu_target

pytestmark = pytest.mark.tvm

F, I64 = TensorProto.FLOAT, TensorProto.INT64
CASES: dict[str, tuple] = {}


def _case(name, nodes, inputs, outputs, inits=(), opset=18, feeds=None, rtol=1e-4):
    CASES[name] = (nodes, inputs, outputs, list(inits), opset, feeds, rtol)


def _build() -> None:
    rng = np.random.default_rng(0)
    vi = lambda n, s, d=F: helper.make_tensor_value_info(n, d, s)  # noqa: E731
    N = helper.make_node  # noqa: N806
    C = lambda name, arr: numpy_helper.from_array(np.asarray(arr), name)  # noqa: E731
    x4 = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    _case(
        "resize_cubic",
        [N("Resize", ["x", "", "sc"], ["y"], mode="cubic")],
        [vi("x", [1, 3, 8, 8])],
        [vi("y", None)],
        [C("sc", np.array([1, 1, 2, 2], np.float32))],
        feeds={"x": x4},
    )
    _case(
        "resize_half_pixel_sym",
        [N("Resize", ["x", "", "", "sz"], ["y"], mode="linear", coordinate_transformation_mode="pytorch_half_pixel")],
        [vi("x", [1, 3, 8, 8])],
        [vi("y", None)],
        [C("sz", np.array([1, 3, 5, 13], np.int64))],
        feeds={"x": x4},
    )
    _case(
        "gridsample_bicubic",
        [N("GridSample", ["x", "g"], ["y"], mode="cubic", align_corners=0)],
        [vi("x", [1, 3, 8, 8]), vi("g", [1, 6, 6, 2])],
        [vi("y", None)],
        opset=20,
        feeds={"x": x4, "g": rng.uniform(-1, 1, (1, 6, 6, 2)).astype(np.float32)},
    )
    _case(
        "roialign",
        [
            N(
                "RoiAlign",
                ["x", "rois", "bi"],
                ["y"],
                output_height=3,
                output_width=3,
                sampling_ratio=2,
                spatial_scale=1.0,
            )
        ],
        [vi("x", [1, 3, 8, 8])],
        [vi("y", None)],
        [C("rois", np.array([[0, 0, 4, 4], [2, 2, 7, 6]], np.float32)), C("bi", np.array([0, 0], np.int64))],
        opset=16,
        feeds={"x": x4},
    )
    _case(
        "depth_to_space_crd",
        [N("DepthToSpace", ["x"], ["y"], blocksize=2, mode="CRD")],
        [vi("x", [1, 12, 4, 4])],
        [vi("y", None)],
        feeds={"x": rng.standard_normal((1, 12, 4, 4)).astype(np.float32)},
    )
    _case(
        "space_to_depth",
        [N("SpaceToDepth", ["x"], ["y"], blocksize=2)],
        [vi("x", [1, 3, 8, 8])],
        [vi("y", None)],
        feeds={"x": x4},
    )
    _case(
        "lppool",
        [N("LpPool", ["x"], ["y"], kernel_shape=[2, 2], p=2, strides=[2, 2])],
        [vi("x", [1, 3, 8, 8])],
        [vi("y", None)],
        feeds={"x": x4},
    )
    _case("hardmax", [N("Hardmax", ["x"], ["y"], axis=-1)], [vi("x", [1, 3, 8, 8])], [vi("y", None)], feeds={"x": x4})
    _case(
        "mish_hardswish",
        [N("Mish", ["x"], ["m"]), N("HardSwish", ["m"], ["y"])],
        [vi("x", [1, 3, 8, 8])],
        [vi("y", None)],
        feeds={"x": x4},
    )
    _case(
        "shrink_thresh",
        [N("Shrink", ["x"], ["s"], lambd=0.5, bias=0.1), N("ThresholdedRelu", ["s"], ["y"], alpha=0.2)],
        [vi("x", [1, 3, 8, 8])],
        [vi("y", None)],
        feeds={"x": x4},
    )
    _case(
        "trig",
        [N("Sinh", ["x"], ["a"]), N("Atan", ["a"], ["b"]), N("Cosh", ["b"], ["c"]), N("Asinh", ["c"], ["y"])],
        [vi("x", [1, 3, 8, 8])],
        [vi("y", None)],
        feeds={"x": x4},
    )
    _case(
        "round_sign_mod",
        [
            N("Round", ["x"], ["r"]),
            N("Sign", ["r"], ["s"]),
            N("Mod", ["x", "k"], ["m"], fmod=1),
            N("Add", ["s", "m"], ["y"]),
        ],
        [vi("x", [1, 3, 8, 8])],
        [vi("y", None)],
        [C("k", np.array(0.7, np.float32))],
        feeds={"x": x4},
    )
    _case(
        "isnan_where",
        [
            N("IsNaN", ["x"], ["n"]),
            N("IsInf", ["x"], ["i"]),
            N("Or", ["n", "i"], ["b"]),
            N("Where", ["b", "z", "x"], ["y"]),
        ],
        [vi("x", [1, 3, 8, 8])],
        [vi("y", None)],
        [C("z", np.array(0, np.float32))],
        feeds={"x": x4},
    )
    _case(
        "einsum_bilinear",
        [N("Einsum", ["a", "w", "b"], ["y"], equation="bi,oij,bj->bo")],
        [vi("a", [2, 5]), vi("b", [2, 6])],
        [vi("y", None)],
        [C("w", rng.standard_normal((3, 5, 6)).astype(np.float32))],
        feeds={
            "a": rng.standard_normal((2, 5)).astype(np.float32),
            "b": rng.standard_normal((2, 6)).astype(np.float32),
        },
    )
    _case(
        "instnorm_lrn",
        [N("InstanceNormalization", ["x", "s", "b"], ["n"]), N("LRN", ["n"], ["y"], size=3)],
        [vi("x", [1, 3, 8, 8])],
        [vi("y", None)],
        [C("s", np.ones(3, np.float32)), C("b", np.zeros(3, np.float32))],
        feeds={"x": x4},
    )
    _case(
        "meanvar_norm",
        [N("MeanVarianceNormalization", ["x"], ["y"])],
        [vi("x", [1, 3, 8, 8])],
        [vi("y", None)],
        feeds={"x": x4},
    )
    _case(
        "reduce_logsumexp_l1",
        [
            N("ReduceLogSumExp", ["x", "ax"], ["a"], keepdims=1),
            N("ReduceL1", ["x", "ax"], ["b"], keepdims=1),
            N("Add", ["a", "b"], ["y"]),
        ],
        [vi("x", [1, 3, 8, 8])],
        [vi("y", None)],
        [C("ax", np.array([2, 3], np.int64))],
        feeds={"x": x4},
    )
    _case(
        "argmin_keep_last",
        [N("ArgMin", ["x"], ["y"], axis=1, keepdims=0, select_last_index=1)],
        [vi("x", [1, 3, 8, 8])],
        [vi("y", None, I64)],
        feeds={"x": np.round(x4)},
    )
    _case(
        "topk_smallest",
        [N("TopK", ["x", "k"], ["v", "i"], axis=-1, largest=0)],
        [vi("x", [1, 3, 8, 8])],
        [vi("v", None), vi("i", None, I64)],
        [C("k", np.array([3], np.int64))],
        feeds={"x": x4},
    )
    _case(
        "gather_nd_batch",
        [N("GatherND", ["x", "idx"], ["y"], batch_dims=1)],
        [vi("x", [2, 4, 5])],
        [vi("y", None)],
        [C("idx", np.array([[[1], [3]], [[0], [2]]], np.int64))],
        feeds={"x": rng.standard_normal((2, 4, 5)).astype(np.float32)},
    )
    _case(
        "scatter_elements_add",
        [N("ScatterElements", ["x", "idx", "u"], ["y"], axis=1, reduction="add")],
        [vi("x", [2, 5])],
        [vi("y", None)],
        [C("idx", np.array([[0, 0, 3], [1, 4, 4]], np.int64)), C("u", np.ones((2, 3), np.float32))],
        feeds={"x": rng.standard_normal((2, 5)).astype(np.float32)},
    )
    _case(
        "bitshift_int",
        [N("BitShift", ["a", "b"], ["y"], direction="LEFT")],
        [vi("a", [4], TensorProto.UINT32)],
        [vi("y", None, TensorProto.UINT32)],
        [C("b", np.array([1, 2, 3, 4], np.uint32))],
        feeds={"a": np.array([1, 2, 3, 4], np.uint32)},
    )
    _case(
        "affine_grid",
        [N("AffineGrid", ["t", "sz"], ["y"], align_corners=0)],
        [vi("t", [1, 2, 3])],
        [vi("y", None)],
        [C("sz", np.array([1, 3, 4, 5], np.int64))],
        opset=20,
        feeds={"t": rng.standard_normal((1, 2, 3)).astype(np.float32)},
    )
    x4 = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    x3 = rng.standard_normal((2, 6, 16)).astype(np.float32)
    _case(
        "conv_transpose_outpad",
        [N("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2], output_padding=[1, 1], pads=[1, 1, 1, 1])],
        [vi("x", [1, 4, 8, 8])],
        [vi("y", None)],
        [C("w", rng.standard_normal((4, 3, 3, 3)).astype(np.float32))],
        feeds={"x": x4},
    )
    _case(
        "conv_transpose_group_dil",
        [N("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2], group=2, dilations=[2, 2])],
        [vi("x", [1, 4, 8, 8])],
        [vi("y", None)],
        [C("w", rng.standard_normal((4, 2, 3, 3)).astype(np.float32))],
        feeds={"x": x4},
    )
    _case(
        "conv_autopad_same",
        [N("Conv", ["x", "w"], ["y"], auto_pad="SAME_UPPER", strides=[2, 2])],
        [vi("x", [1, 4, 8, 8])],
        [vi("y", None)],
        [C("w", rng.standard_normal((5, 4, 3, 3)).astype(np.float32))],
        feeds={"x": x4},
    )
    _case(
        "conv3d",
        [N("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1, 1, 1])],
        [vi("x", [1, 2, 4, 6, 6])],
        [vi("y", None)],
        [C("w", rng.standard_normal((3, 2, 3, 3, 3)).astype(np.float32))],
        feeds={"x": rng.standard_normal((1, 2, 4, 6, 6)).astype(np.float32)},
    )
    _case(
        "maxpool3d",
        [N("MaxPool", ["x"], ["y"], kernel_shape=[2, 2, 2], strides=[2, 2, 2])],
        [vi("x", [1, 2, 4, 6, 6])],
        [vi("y", None)],
        feeds={"x": rng.standard_normal((1, 2, 4, 6, 6)).astype(np.float32)},
    )
    _case(
        "avgpool_count_pad",
        [
            N(
                "AveragePool",
                ["x"],
                ["y"],
                kernel_shape=[3, 3],
                pads=[1, 1, 1, 1],
                count_include_pad=1,
                ceil_mode=1,
                strides=[2, 2],
            )
        ],
        [vi("x", [1, 4, 8, 8])],
        [vi("y", None)],
        feeds={"x": x4},
    )
    _case(
        "gemm_trans_alpha",
        [N("Gemm", ["a", "b", "c"], ["y"], transA=1, transB=1, alpha=0.5, beta=2.0)],
        [vi("a", [6, 2])],
        [vi("y", None)],
        [C("b", rng.standard_normal((5, 6)).astype(np.float32)), C("c", rng.standard_normal((5,)).astype(np.float32))],
        feeds={"a": rng.standard_normal((6, 2)).astype(np.float32)},
    )
    _case(
        "layernorm_axis1",
        [N("LayerNormalization", ["x", "s", "b"], ["y"], axis=1, epsilon=1e-3)],
        [vi("x", [2, 6, 16])],
        [vi("y", None)],
        [
            C("s", rng.standard_normal((6, 16)).astype(np.float32)),
            C("b", rng.standard_normal((6, 16)).astype(np.float32)),
        ],
        feeds={"x": x3},
    )
    _case(
        "groupnorm18",
        [N("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2, epsilon=1e-5)],
        [vi("x", [1, 4, 8, 8])],
        [vi("y", None)],
        [C("s", rng.standard_normal(4).astype(np.float32)), C("b", rng.standard_normal(4).astype(np.float32))],
        opset=21,
        feeds={"x": x4},
    )
    _case(
        "softmax_axis1_old",
        [N("Softmax", ["x"], ["y"], axis=1)],
        [vi("x", [2, 6, 16])],
        [vi("y", None)],
        opset=11,
        feeds={"x": x3},
    )
    _case(
        "logsoftmax_old",
        [N("LogSoftmax", ["x"], ["y"], axis=1)],
        [vi("x", [2, 6, 16])],
        [vi("y", None)],
        opset=11,
        feeds={"x": x3},
    )
    _case(
        "split_uneven18",
        [N("Split", ["x"], ["a", "b", "c"], axis=2, num_outputs=3), N("Concat", ["c", "a", "b"], ["y"], axis=2)],
        [vi("x", [2, 6, 16])],
        [vi("y", None)],
        opset=18,
        feeds={"x": x3},
    )
    _case(
        "pad_reflect_axes",
        [N("Pad", ["x", "p", "", "ax"], ["y"], mode="reflect")],
        [vi("x", [2, 6, 16])],
        [vi("y", None)],
        [C("p", np.array([2, 3], np.int64)), C("ax", np.array([2], np.int64))],
        opset=18,
        feeds={"x": x3},
    )
    _case(
        "pad_edge",
        [N("Pad", ["x", "p"], ["y"], mode="edge")],
        [vi("x", [2, 6, 16])],
        [vi("y", None)],
        [C("p", np.array([0, 1, 2, 0, 2, 1], np.int64))],
        feeds={"x": x3},
    )
    _case(
        "pad_wrap",
        [N("Pad", ["x", "p"], ["y"], mode="wrap")],
        [vi("x", [2, 6, 16])],
        [vi("y", None)],
        [C("p", np.array([0, 1, 2, 0, 2, 1], np.int64))],
        opset=19,
        feeds={"x": x3},
    )
    _case(
        "slice_neg_step",
        [N("Slice", ["x", "st", "en", "ax", "sp"], ["y"])],
        [vi("x", [2, 6, 16])],
        [vi("y", None)],
        [
            C("st", np.array([-1, 14], np.int64)),
            C("en", np.array([-100, 1], np.int64)),
            C("ax", np.array([1, 2], np.int64)),
            C("sp", np.array([-1, -3], np.int64)),
        ],
        feeds={"x": x3},
    )
    _case(
        "expand_tile",
        [N("Expand", ["x", "sh"], ["e"]), N("Tile", ["e", "rep"], ["y"])],
        [vi("x", [2, 1, 16])],
        [vi("y", None)],
        [C("sh", np.array([2, 3, 16], np.int64)), C("rep", np.array([1, 2, 1], np.int64))],
        feeds={"x": rng.standard_normal((2, 1, 16)).astype(np.float32)},
    )
    _case(
        "cumsum_excl_rev",
        [N("CumSum", ["x", "ax"], ["y"], exclusive=1, reverse=1)],
        [vi("x", [2, 6, 16])],
        [vi("y", None)],
        [C("ax", np.array(2, np.int64))],
        feeds={"x": x3},
    )
    _case(
        "clip_int",
        [N("Clip", ["x", "lo", "hi"], ["y"])],
        [vi("x", [6], I64)],
        [vi("y", None, I64)],
        [C("lo", np.array(-2, np.int64)), C("hi", np.array(3, np.int64))],
        feeds={"x": np.array([-5, -2, 0, 2, 3, 9], np.int64)},
    )
    _case(
        "prelu_bcast",
        [N("PRelu", ["x", "s"], ["y"])],
        [vi("x", [1, 4, 8, 8])],
        [vi("y", None)],
        [C("s", rng.standard_normal((4, 1, 1)).astype(np.float32))],
        feeds={"x": x4},
    )
    _case(
        "selu_elu_celu",
        [N("Selu", ["x"], ["a"]), N("Elu", ["a"], ["b"], alpha=0.3), N("Softsign", ["b"], ["y"])],
        [vi("x", [1, 4, 8, 8])],
        [vi("y", None)],
        feeds={"x": x4},
    )
    _case(
        "matmul_batched_bcast",
        [N("MatMul", ["a", "b"], ["y"])],
        [vi("a", [2, 1, 3, 4]), vi("b", [1, 5, 4, 6])],
        [vi("y", None)],
        feeds={
            "a": rng.standard_normal((2, 1, 3, 4)).astype(np.float32),
            "b": rng.standard_normal((1, 5, 4, 6)).astype(np.float32),
        },
    )
    _case(
        "reduce_noop_empty_axes",
        [N("ReduceSum", ["x", "ax"], ["y"], keepdims=0, noop_with_empty_axes=1)],
        [vi("x", [2, 6, 16])],
        [vi("y", None)],
        [C("ax", np.array([], np.int64))],
        feeds={"x": x3},
    )
    _case(
        "gather_elements_neg",
        [N("GatherElements", ["x", "i"], ["y"], axis=1)],
        [vi("x", [2, 6, 16])],
        [vi("y", None)],
        [C("i", rng.integers(-6, 6, (2, 3, 16)).astype(np.int64))],
        feeds={"x": x3},
    )
    _case(
        "dequant_per_axis",
        [N("DequantizeLinear", ["q", "s", "z"], ["y"], axis=1)],
        [vi("q", [2, 3, 4], TensorProto.UINT8)],
        [vi("y", None)],
        [C("s", np.array([0.1, 0.2, 0.3], np.float32)), C("z", np.array([1, 2, 3], np.uint8))],
        feeds={"q": rng.integers(0, 255, (2, 3, 4)).astype(np.uint8)},
    )
    _case(
        "where_bcast_int",
        [N("Greater", ["x", "z"], ["m"]), N("Where", ["m", "x", "z"], ["y"])],
        [vi("x", [2, 6, 16])],
        [vi("y", None)],
        [C("z", np.zeros((1, 16), np.float32))],
        feeds={"x": x3},
    )
    _case(
        "nonmax_free_topk_gather",
        [N("TopK", ["x", "k"], ["v", "i"], axis=2), N("Gather", ["x", "i0"], ["y"], axis=0)],
        [vi("x", [2, 6, 16])],
        [vi("v", None), vi("y", None)],
        [C("k", np.array([4], np.int64)), C("i0", np.array([1, 0, 1], np.int64))],
        feeds={"x": x3},
    )



def _build_attribute_forms() -> None:
    """Attribute forms TVM's converters computed wrong (tvm_passes.onnx_padding, onnx_converters' IsInf and Pow)."""
    rng = np.random.default_rng(1)
    vi = lambda n, s, d=F: helper.make_tensor_value_info(n, d, s)  # noqa: E731
    N = helper.make_node  # noqa: N806
    C = lambda name, arr: numpy_helper.from_array(np.asarray(arr), name)  # noqa: E731
    odd = rng.standard_normal((2, 3, 5, 7)).astype(np.float32)
    for mode in ("SAME_LOWER", "SAME_UPPER"):          # SAME_LOWER lost the last strided output column
        _case(f"maxpool_{mode.lower()}_strided_odd", [N("MaxPool", ["x"], ["y"], kernel_shape=[3, 2], strides=[2, 2],
                                                       auto_pad=mode)],
              [vi("x", [2, 3, 5, 7])], [vi("y", None)], feeds={"x": odd})
    weights = C("w", rng.standard_normal((3, 2, 3, 3)).astype(np.float32))
    for name, attrs in (("convtranspose_output_shape", dict(strides=[2, 2], output_shape=[10, 12])),
                        ("convtranspose_output_shape_same_upper", dict(strides=[2, 2], output_shape=[10, 13],
                                                                       auto_pad="SAME_UPPER"))):
        _case(name, [N("ConvTranspose", ["x", "w"], ["y"], **attrs)], [vi("x", [2, 3, 5, 7])], [vi("y", None)],
              [weights], feeds={"x": odd})
    infinities = np.array([[np.inf, -np.inf, 1.0, -2.0, np.nan, 0.0]], np.float32)
    for positive, negative in ((1, 0), (0, 1)):
        _case(f"isinf_positive{positive}_negative{negative}",
              [N("IsInf", ["x"], ["y"], detect_positive=positive, detect_negative=negative)],
              [vi("x", [1, 6])], [vi("y", None, TensorProto.BOOL)], feeds={"x": infinities})
    _case("pow_integer_exponent", [N("Pow", ["x", "e"], ["y"])], [vi("x", [2, 3, 5, 7])], [vi("y", None)],
          [C("e", np.array(3, np.int64))], feeds={"x": odd})


def _build_statistics_and_new_converters() -> None:
    """LayerNormalization's Mean/InvStdDev (TVM returned scalar zeros), Det, Swish and CenterCropPad (no TVM
    converter)."""
    rng = np.random.default_rng(2)
    vi = lambda n, s, d=F: helper.make_tensor_value_info(n, d, s)  # noqa: E731
    N = helper.make_node  # noqa: N806
    C = lambda name, arr: numpy_helper.from_array(np.asarray(arr), name)  # noqa: E731
    x = rng.standard_normal((2, 3, 8)).astype(np.float32) * 3 + 1
    for axis in (-1, 1):
        shape = [2, 3, 8][axis:]
        _case(f"layer_norm_statistics_axis{axis}",
              [N("LayerNormalization", ["x", "s", "b"], ["y", "mean", "inv_std"], axis=axis, epsilon=1e-3)],
              [vi("x", [2, 3, 8])], [vi("y", None), vi("mean", None), vi("inv_std", None)],
              [C("s", rng.random(shape).astype(np.float32)), C("b", rng.random(shape).astype(np.float32))],
              opset=17, feeds={"x": x})
    # the statistics read downstream, by a node after the norm (not only as graph outputs)
    _case("layer_norm_statistics_consumed",
          [N("LayerNormalization", ["x", "s"], ["y", "mean", "inv_std"]), N("Mul", ["mean", "inv_std"], "m"),
           N("Add", ["y", "m"], ["z"])],
          [vi("x", [2, 3, 8])], [vi("z", None)], [C("s", rng.random(8).astype(np.float32))], opset=17, feeds={"x": x})
    half = x.astype(np.float16)
    _case("layer_norm_statistics_float16_stashed_in_float32",     # Mean/InvStdDev float32 (stash_type 1)
          [N("LayerNormalization", ["x", "s", "b"], ["y", "mean", "inv_std"])],
          [vi("x", [2, 3, 8], TensorProto.FLOAT16)],
          [vi("y", None, TensorProto.FLOAT16), vi("mean", None), vi("inv_std", None)],
          [C("s", rng.random(8).astype(np.float16)), C("b", rng.random(8).astype(np.float16))], opset=17,
          feeds={"x": half}, rtol=1e-2)
    singular = rng.standard_normal((4, 4)).astype(np.float32)
    singular[3] = singular[0] + singular[1]
    needs_pivot = np.array([[0, 2, 1], [1, 0, 3], [4, 1, 0]], np.float32)
    for name, matrices in (("det_batch", rng.standard_normal((2, 3, 5, 5)).astype(np.float32)),
                           ("det_single_2x2", rng.standard_normal((2, 2)).astype(np.float32)),
                           ("det_1x1", rng.standard_normal((3, 1, 1)).astype(np.float32)),
                           ("det_zero_pivot", np.stack([needs_pivot, needs_pivot[[1, 0, 2]]])),
                           ("det_singular", np.stack([rng.standard_normal((4, 4)).astype(np.float32) + 2 * np.eye(4,
                                     dtype=np.float32), singular, np.zeros((4, 4), np.float32)]))):
        _case(name, [N("Det", ["a"], ["d"])], [vi("a", list(matrices.shape))], [vi("d", None)], opset=17,
              feeds={"a": matrices})
    for name, attrs in (("swish_default_alpha", {}), ("swish_alpha", {"alpha": 1.5})):      # opset 24
        _case(name, [N("Swish", ["x"], ["y"], **attrs)], [vi("x", [2, 3, 8])], [vi("y", None)], opset=24,
              feeds={"x": x})
    image = rng.standard_normal((3, 10, 7)).astype(np.float32)
    _case("center_crop_pad_all_axes", [N("CenterCropPad", ["x", "s"], ["y"])], [vi("x", [3, 10, 7])], [vi("y", None)],
          [C("s", np.array([3, 5, 12], np.int64))], feeds={"x": image})
    _case("center_crop_pad_negative_axes", [N("CenterCropPad", ["x", "s"], ["y"], axes=[-1, -2])],
          [vi("x", [3, 10, 7])], [vi("y", None)], [C("s", np.array([4, 13], np.int64))], feeds={"x": image})


_build()
_build_attribute_forms()
_build_statistics_and_new_converters()


@pytest.mark.parametrize("name", list(CASES))
def test_op_form_matches_onnxruntime(tmp_path, name):
    nodes, inputs, outputs, inits, opset, feeds, rtol = CASES[name]
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10), str(path))
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    imported = import_model(path, input_shapes={k: v.shape for k, v in feeds.items()})
    target = default_cpu_target()
    vm = relax.VirtualMachine(tvm.compile(imported.mod, target=target, relax_pipeline=cpu_pipeline(target)), tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(feeds[p.name]) for p in imported.mod["main"].params])
    got = [got.numpy()] if hasattr(got, "numpy") else [g.numpy() for g in got]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype, name
        scale = float(np.abs(e).max()) + 1e-9 if e.size else 1.0
        assert float(np.abs(g.astype(np.float64) - e).max()) / scale < rtol, name


def test_det_of_non_square_matrices_is_refused_naming_the_shape(tmp_path):
    node = helper.make_node("Det", ["a"], ["d"], name="det0")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", F, [2, 4, 3])],
                              [helper.make_tensor_value_info("d", F, None)])
    path = tmp_path / "det.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), str(path))
    with pytest.raises(UnsupportedOpError, match=r"Det node 'det0'.*square.*\[2, 4, 3\]"):
        import_model(path, input_shapes={"a": (2, 4, 3)})
