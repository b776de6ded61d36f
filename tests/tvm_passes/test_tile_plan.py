"""tvm_passes.tile_plan: the CPU rules' tile decisions as plain arithmetic, importable without TVM."""
import subprocess
import sys

import pytest

from tvm_passes.tile_plan import (ACCUMULATORS_16_REGISTERS, column_vector_factor, conv_prepacks_weights,
                                  conv_register_tile, conv_row_bands, matmul_register_tile, pick_factor,
                                  vector_lanes_for)


def test_importing_the_tile_plan_loads_no_tvm():
    code = "import sys, tvm_passes.tile_plan, predictors.features; print('tvm' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize("extent, preferred, minimum, multiple_of, expected", [
    (7, 8, 4, 1, 7),          # fits: the whole loop
    (56, 8, 4, 1, 8),         # a divisor equal to the preference
    (28, 8, 4, 1, 7),         # closest divisor ratio-wise
    (64, 16, 8, 16, 16),      # whole vectors
    (23, 8, 4, 1, 8),         # prime: the preference, with a predicated tail
])
def test_pick_factor(extent, preferred, minimum, multiple_of, expected):
    assert pick_factor(extent, preferred, minimum, multiple_of) == expected


def test_column_vectors_are_row_divisors_near_the_lanes():
    assert column_vector_factor(56, 16) == 14
    assert column_vector_factor(112, 16) == 16
    assert column_vector_factor(27, 16) == 27      # no divisor in [8, 16]: longer than one register
    assert column_vector_factor(57, 16) == 19


@pytest.mark.parametrize("out_channels, groups, k, strides, width, prepacked", [
    (64, 1, 3, (1, 1), 56, True),     # spatial conv
    (256, 1, 1, (2, 2), 14, True),    # strided 1x1
    (256, 1, 1, (1, 1), 56, False),   # stride-1 1x1 with rows that fit column vectors
    (256, 1, 1, (1, 1), 7, True),     # rows narrower than half a vector
    (128, 1, 1, (1, 1), 27, True),    # no row divisor near the vector width
    (24, 1, 3, (1, 1), 56, False),    # channels not whole vectors
    (16, 1, 1, (1, 1), 82, True),     # column vectors of 82-wide rows would carry a predicated tail
    (24, 1, 3, (1, 1), 82, True),     # ... so half-register channel vectors are better
    (20, 1, 3, (1, 1), 82, False),    # not even half registers of channels
    (16, 1, 1, (1, 1), 80, False),    # 80 = 5 x 16: whole column vectors
    (64, 64, 3, (1, 1), 56, False),   # depthwise
    (64, 1, 1, (1, 1), None, False),  # width not static
])
def test_which_conv_weights_are_prepacked(out_channels, groups, k, strides, width, prepacked):
    assert conv_prepacks_weights(out_channels, groups, k, k, strides, width, lanes=16) is prepacked


@pytest.mark.parametrize("out_channels, width, prepacked", [
    (256, 56, True),      # 8 lanes: output-channel vectors for pointwise convs too
    (144, 56, True),
    (20, 56, False),      # outputs not whole vectors
    (256, None, False),   # width not static
])
def test_eight_lane_pointwise_convs_are_prepacked(out_channels, width, prepacked):
    assert conv_prepacks_weights(out_channels, 1, 1, 1, (1, 1), width, lanes=8) is prepacked
    # 16 lanes: a pointwise conv on 56-wide rows keeps its column vectors
    assert conv_prepacks_weights(out_channels, 1, 1, 1, (1, 1), 56, lanes=16) is False


def test_conv_register_tiles():
    deep = conv_register_tile(out_channels=512, out_width=7, reduction=4608, channel_innermost_weights=True,
                              lanes=16)
    assert (deep.over_channels, deep.reg_factor, deep.vec_factor) == (True, 7, 32)
    assert deep.accumulators(16) == 14 and deep.lane_fill(16) == 1.0
    tiny = conv_register_tile(out_channels=2048, out_width=4, reduction=512, channel_innermost_weights=True,
                              lanes=16)
    assert (tiny.reg_factor, tiny.vec_factor, tiny.accumulators(16)) == (4, 16, 4)
    columns = conv_register_tile(out_channels=256, out_width=56, reduction=64, channel_innermost_weights=False,
                                 lanes=16)
    assert (columns.over_channels, columns.reg_factor, columns.vec_factor) == (False, 8, 14)
    assert columns.accumulators(16) == 8 and columns.lane_fill(16) == pytest.approx(14 / 16)
    # channel vectors need whole vectors of output channels, whatever the weight layout
    odd = conv_register_tile(out_channels=24, out_width=56, reduction=64, channel_innermost_weights=True, lanes=16)
    assert not odd.over_channels
    # ... unless column vectors would carry a predicated tail: then half-register channel vectors
    half = conv_register_tile(out_channels=24, out_width=82, reduction=288, channel_innermost_weights=True, lanes=16)
    assert (half.over_channels, half.vec_factor, half.reg_factor) == (True, 8, 8)
    assert half.lane_fill(16) == 0.5


@pytest.mark.parametrize("out_channels, out_width, reduction, vectors, columns", [
    (1000, 13, 512, 1, 7),     # SqueezeNet's classifier: 13 columns would spill; two chunks of 7, the last guarded
    (512, 7, 4608, 1, 7),      # a wide (2-vector) tile of 7 columns is 14 accumulators: one vector instead
    (128, 28, 1152, 2, 4),     # ... unless a smaller divisor of the row keeps both vectors
    (64, 56, 576, 1, 8),       # within the budget already: unchanged
    (128, 55, 64, 1, 11),
])
def test_conv_tiles_keep_at_most_12_accumulators_with_16_vector_registers(out_channels, out_width, reduction,
                                                                         vectors, columns):
    tile = conv_register_tile(out_channels=out_channels, out_width=out_width, reduction=reduction,
                              channel_innermost_weights=True, lanes=8)
    assert (tile.vec_factor // 8, tile.reg_factor) == (vectors, columns)
    assert tile.accumulators(8) <= ACCUMULATORS_16_REGISTERS
    # 32 registers (AVX-512) keep the measured wide tiles
    assert conv_register_tile(out_channels=512, out_width=7, reduction=4608, channel_innermost_weights=True,
                              lanes=16).accumulators(16) == 14


MIB = 2 ** 20


@pytest.mark.parametrize("batch, out_rows, input_bytes, weight_bytes, cores, bands", [
    (1, 56, 2_408_448, 98_304, 2, 6),     # 192->128 1x1 at 56 px: input 24x the weights, 2.3 MiB in ~0.5 MiB slabs
    (1, 28, 1_722_368, 589_824, 2, 4),    # 128->128 3x3 stride 2 at 56 px (padded input 58 x 58)
    (1, 224, 13 * MIB, 147_456, 2, 26),   # 64->64 3x3 at 224 px
    (1, 56, 3 * MIB, 2 * MIB, 2, 1),      # input less than twice the weights: channel tiles per core
    (1, 7, 1 * MIB, 10 * MIB, 2, 1),      # weight-bound
    (2, 56, 2 * MIB, 98_304, 2, 1),       # a sample per core already
    (1, 56, 2 * MIB, 98_304, 1, 1),       # one core: nothing to split
    (1, 3, 2 * MIB, 98_304, 2, 1),        # too few rows for two bands per core
    (1, 5, 8 * MIB, 98_304, 2, 5),        # never more bands than rows
    (1, 41, 107_584, 1_024, 2, 2),        # a small input still gives each core its own band
    (1, 64, 3 * MIB, 98_304, 4, 8),       # a multiple of the cores
])
def test_conv_row_bands(batch, out_rows, input_bytes, weight_bytes, cores, bands):
    assert conv_row_bands(batch, out_rows, input_bytes, weight_bytes, cores) == bands


def test_vector_lanes():
    assert vector_lanes_for("znver5") == 16
    assert vector_lanes_for("haswell") == 8
    assert vector_lanes_for("", ["+avx512f"]) == 16
    assert vector_lanes_for("x86-64") == 4
    assert vector_lanes_for("znver5", dtype_bits=16) == 32


def test_matmul_register_tiles():
    gemv = matmul_register_tile(rows=1, cols=2608, lanes=16)      # 163 vectors: no divisor, 8 with a tail
    assert (gemv.gemv, gemv.reg_factor, gemv.vec_factor, gemv.accumulators(16)) == (True, 8, 16, 8)
    wide = matmul_register_tile(rows=128, cols=1024, lanes=16)    # 4-register column vectors, 4 rows
    assert (wide.gemv, wide.reg_factor, wide.vec_factor, wide.accumulators(16)) == (False, 4, 64, 16)
    ragged = matmul_register_tile(rows=35, cols=2600, lanes=16)   # 2600 = 8 x 325: half-register vectors
    assert (ragged.reg_factor, ragged.vec_factor, ragged.accumulators(16)) == (7, 8, 7)


@pytest.mark.parametrize("rows, cols, reg, vectors", [
    (128, 1024, 2, 4),    # BERT-small's FFN: 4 x 4 vectors would be 16 accumulators
    (35, 10000, 5, 2),    # the LSTM LM's decoder: 7 x 2 would be 14
    (1, 10000, 10, 1),    # a matrix-vector product within the budget: unchanged
])
def test_matmul_tiles_keep_at_most_12_accumulators_with_16_vector_registers(rows, cols, reg, vectors):
    tile = matmul_register_tile(rows, cols, lanes=8)
    assert (tile.reg_factor, tile.vec_factor // 8) == (reg, vectors)
    assert tile.accumulators(8) <= ACCUMULATORS_16_REGISTERS
    assert matmul_register_tile(128, 1024, lanes=16).accumulators(16) == 16    # 32 registers: as measured there
