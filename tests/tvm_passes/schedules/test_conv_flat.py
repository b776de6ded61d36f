"""The flat conv rule (conv2d_flat): which convs it takes, that they match onnxruntime, and its tile arithmetic."""

from __future__ import annotations

import pytest

tvm = pytest.importorskip("tvm")
pytest.importorskip("onnxruntime")

from tests.tvm_passes.schedules.conv_models import check_conv  # noqa: E402
from tvm_passes.schedules.conv_flat_plan import (  # noqa: E402
    ACCUMULATORS_16_REGISTERS,
    MIN_TILE_ACCUMULATORS,
    REDUCTION_BLOCK_ROWS,
    flat_conv_plan,
)

pytestmark = pytest.mark.tvm


ACCEPTED = [
    pytest.param(dict(x_shape=(1, 16, 40, 1), w_shape=(32, 16, 5, 1), pads=(2, 0, 2, 0)), id="conv1d-(5,1)-width-1"),
    pytest.param(dict(x_shape=(1, 8, 37, 1), w_shape=(16, 8, 9, 1), strides=(2, 1), pads=(4, 0, 3, 0)),
                 id="(9,1)-stride-(2,1)-asymmetric-pads"),
    pytest.param(dict(x_shape=(1, 16, 30, 1), w_shape=(16, 16, 3, 1), dilations=(2, 1), pads=(2, 0, 2, 0)),
                 id="(3,1)-dilation-(2,1)"),
    pytest.param(dict(x_shape=(1, 1, 64, 1), w_shape=(16, 1, 32, 1), strides=(4, 1), pads=(14, 0, 14, 0)),
                 id="one-input-channel-(32,1)-stride-4"),
    pytest.param(dict(x_shape=(1, 16, 1, 40), w_shape=(32, 16, 1, 5), pads=(0, 2, 0, 2)), id="(1,5)-height-1"),
    pytest.param(dict(x_shape=(1, 8, 10, 13), w_shape=(16, 8, 3, 3), pads=(1, 1, 1, 1), activation="silu"),
                 id="3x3-ragged-width-13-silu"),
    pytest.param(dict(x_shape=(1, 16, 15, 15), w_shape=(32, 16, 3, 3), strides=(2, 2), pads=(1, 1, 1, 1)),
                 id="3x3-stride-2"),
    pytest.param(dict(x_shape=(1, 16, 6, 6), w_shape=(16, 16, 3, 3), pads=(1, 1, 1, 1), residual=True),
                 id="3x3-residual-add"),
    pytest.param(dict(x_shape=(1, 32, 3, 3), w_shape=(32, 32, 1, 1)), id="1x1-rows-too-narrow-for-columns"),
    pytest.param(dict(x_shape=(1, 32, 7, 7), w_shape=(32, 32, 1, 1), activation="silu"),
                 id="1x1-7-columns-weights-transposed-per-block"),
    pytest.param(dict(x_shape=(1, 16, 20, 1), w_shape=(32, 16, 5, 1), pads=(2, 0, 2, 0), weights_as_input=True),
                 id="weights-not-constant-one-column"),
    pytest.param(dict(x_shape=(1, 16, 24, 1), w_shape=(16, 16, 8, 1), bias=False, activation="none",
                      pad_node=(0, 0, 3, 0, 0, 0, 4, 0)), id="explicit-pad-node-no-bias-no-epilogue"),
]


@pytest.mark.parametrize("kwargs", ACCEPTED)
def test_flat_rule_takes_the_conv_and_matches_onnxruntime(tmp_path, kwargs):
    assert check_conv(tmp_path, **kwargs) == {"conv2d_flat"}


REFUSED = [
    pytest.param(dict(x_shape=(1, 16, 12, 12), w_shape=(32, 8, 3, 3), pads=(1, 1, 1, 1), group=2), id="grouped"),
    pytest.param(dict(x_shape=(2, 16, 20, 1), w_shape=(32, 16, 5, 1), pads=(2, 0, 2, 0)), id="batch-2"),
    pytest.param(dict(x_shape=(1, 16, 6, 16), w_shape=(32, 16, 3, 3), pads=(1, 1, 1, 1), weights_as_input=True),
                 id="weights-not-constant-whole-register-columns"),
    pytest.param(dict(x_shape=(1, 16, 17, 1), w_shape=(32, 16, 3, 1), pads=(1, 0, 1, 0)),
                 id="17-positions-no-register-tile-divides"),
    pytest.param(dict(x_shape=(1, 1, 20, 24), w_shape=(16, 1, 3, 3), pads=(1, 1, 1, 1)), id="9-taps-output-bound"),
    # 20 output channels: not prepacked with 8 or 16 lanes (tile_plan.conv_prepacks_weights), so OIHW weights
    pytest.param(dict(x_shape=(1, 32, 4, 32), w_shape=(20, 32, 1, 1)), id="1x1-whole-register-columns"),
]


@pytest.mark.parametrize("kwargs", REFUSED)
def test_flat_rule_refuses_and_the_conv_rule_still_matches_onnxruntime(tmp_path, kwargs):
    assert check_conv(tmp_path, **kwargs) == {"conv2d_nchw"}


@pytest.mark.parametrize("rows,width,in_channels,kh,kw", [
    (512, 1, 256, 5, 1), (64, 1, 64, 64, 1), (16, 1, 128, 64, 1), (100, 161, 32, 3, 3), (26, 26, 256, 1, 1),
])
def test_plan_keeps_a_full_register_tile_whole_rows_per_block_and_enough_blocks(rows, width, in_channels, kh, kw):
    for lanes, cores in ((8, 2), (16, 2), (8, 8)):
        channels = 256
        input_rows = rows + kh - 1
        plan = flat_conv_plan(channels, rows, width, in_channels, kh, kw, input_rows=input_rows,
                              input_bytes=in_channels * input_rows * (width + kw - 1) * 4,
                              weight_bytes=channels * in_channels * kh * kw * 4, lanes=lanes, cores=cores)
        assert plan is not None
        assert MIN_TILE_ACCUMULATORS <= plan.accumulators(lanes) <= (ACCUMULATORS_16_REGISTERS if lanes == 8 else 16)
        assert plan.vec % lanes == 0 and channels % plan.block_channels == 0 and plan.block_channels % plan.vec == 0
        assert rows % plan.block_rows == 0 and (plan.block_rows * width) % plan.reg == 0
        assert (channels // plan.block_channels) * (rows // plan.block_rows) >= cores
        assert in_channels % plan.rc_block == 0
        rows_read = plan.rc_block * (kh if width > 1 else 1)
        assert rows_read <= REDUCTION_BLOCK_ROWS or plan.rc_block * kh * kw <= 32


def test_plan_refuses_ragged_channels_positions_no_tile_divides_and_short_reductions():
    common = dict(kernel_rows=3, kernel_cols=1, input_rows=66, input_bytes=4096, weight_bytes=4096, cores=2)
    assert flat_conv_plan(24, 64, 1, in_channels=16, lanes=16, **common) is None   # 1.5 AVX-512 vectors of channels
    assert flat_conv_plan(32, 17, 1, in_channels=16, lanes=8, **common) is None    # 17 positions: prime, above a tile
    assert flat_conv_plan(32, 11, 1, in_channels=16, lanes=8, **common).reg == 11  # one tile holds all 11 positions
    assert flat_conv_plan(32, 64, 1, in_channels=10, lanes=8, **common) is None    # 30 taps: writing the output rules


@pytest.mark.parametrize("x_shape,w_shape,weights_staged", [
    pytest.param((1, 16, 20, 30), (16, 16, 3, 3), False, id="input-heavy-3x3"),
    pytest.param((1, 64, 12, 1), (64, 64, 5, 1), True, id="weight-heavy-(5,1)"),
])
def test_each_parallel_block_stages_its_input_rows_and_weight_heavy_convs_their_weights(tmp_path, x_shape, w_shape,
                                                                                      weights_staged):
    """The padding is computed inside the parallel loop, per block and reduction block (a small buffer indexed from
    the block's origin); a conv whose weights outweigh its input also copies each channel tile's weights there."""
    from tvm import tirx

    from tests.tvm_passes.schedules.conv_models import conv_onnx
    from tvm_passes.frontend import import_model
    from tvm_passes.schedules import RULE_ATTR, cpu_schedule_pass, default_cpu_target
    from tvm_passes.tuning_db import kernel_lowering_passes

    path, _ = conv_onnx(tmp_path / "conv.onnx", x_shape=x_shape, w_shape=w_shape,
                        pads=(w_shape[2] // 2, w_shape[3] // 2) * 2)
    target = default_cpu_target()
    with target:
        scheduled = tvm.transform.Sequential(kernel_lowering_passes(target) + [cpu_schedule_pass(target)])(
            import_model(path).mod)
    (script,) = [f.script() for _, f in scheduled.functions_items()
                 if isinstance(f, tirx.PrimFunc) and f.attrs.get(RULE_ATTR) == "conv2d_flat"]
    assert script.index("T.parallel(") < script.index('T.sblock("pad_temp")')
    assert ('T.sblock("param_0_global")' in script) is weights_staged
