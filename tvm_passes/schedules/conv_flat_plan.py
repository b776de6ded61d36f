"""Tile decisions of the flat conv rule (:mod:`.conv_flat`), as plain arithmetic on shapes (imports no TVM).

Kept apart from the schedule so the decisions can be read (and tested) without building a kernel, like
:mod:`tvm_passes.tile_plan` does for the other rules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..tile_plan import ACCUMULATORS_16_REGISTERS, largest_divisor

# Accumulator registers a tile keeps on 16-register ISAs (SSE/AVX2): tvm_passes.tile_plan.ACCUMULATORS_16_REGISTERS
# (2 x 8 was up to 2x slower here: 256->64 (64,1) conv 0.48 -> 1.11 of onnxruntime's time, spilling).
# AVX-512 (32 registers): the conv rule's widest tile, 2 vectors x 8 columns (not measured with this rule).
ACCUMULATORS_32_REGISTERS = 16
MIN_POSITION_TILE = 4
MIN_TILE_ACCUMULATORS = 8  # fewer independent multiply-add chains than this leave the FMA units waiting
# Convs reducing over fewer taps (input channels x kernel taps) stay with the conv rule: their time is writing the
# output, which the conv rule's column vectors do in whole rows. 1->32 3x3 convs (9 taps), 2 threads: 100x161
# 2.21x onnxruntime's time with this rule, 1.53x with the conv rule; 900x161 1.51x vs 1.32x. 12->32 (108 taps) at
# 208x208: 0.74x vs 1.37x.
MIN_REDUCTION_TAPS = 32
# One parallel block's accumulators (output channels x positions), kept in L2 while the reduction runs over the
# input-channel blocks.
BLOCK_ACCUMULATOR_BYTES = 128 * 1024
# Input rows (input channels x kernel rows) one register tile reads within a reduction block. A 32->32 3x3 conv at
# 100x161 (1 thread, interleaved, CPU time): all 32 channels at once (96 rows) 1.45x onnxruntime's time, 8 channels
# (24 rows) 1.07-1.12x, 4 channels 1.10-1.18x.
REDUCTION_BLOCK_ROWS = 32
# Multiply-adds per accumulator in one reduction block: each block loads and stores the tile's accumulators once.
MIN_REDUCTION_BLOCK_MACS = 32
FLOAT_BYTES = 4


@dataclass(frozen=True)
class FlatConvPlan:
    """Register tile ``vec`` output channels x ``reg`` positions; parallel blocks of ``block_channels`` x
    ``block_rows`` output rows; the reduction over input channels in blocks of ``rc_block``; channel tiles outside
    the position tiles (``channels_outer``: weight-heavy convs, a tile's weights stay in cache across the positions)
    or inside them (the input tile stays in L1 across the channel tiles)."""

    vec: int
    reg: int
    block_channels: int
    block_rows: int
    rc_block: int
    channels_outer: bool

    def accumulators(self, lanes: int) -> int:
        """SIMD registers the register tile keeps as accumulators."""
        return self.reg * math.ceil(self.vec / lanes)


def flat_conv_plan(out_channels: int, out_rows: int, out_width: int, in_channels: int, kernel_rows: int,
                   kernel_cols: int, input_rows: int, input_bytes: int, weight_bytes: int, lanes: int,
                   cores: int) -> FlatConvPlan | None:
    """The tiles for a batch-1 NCHW conv with ``out_rows x out_width`` outputs per channel.

    ``input_rows`` and ``input_bytes``: the input as the conv reads it (padded when it has a pad stage);
    ``weight_bytes``: its weights. The register tile keeps at least MIN_TILE_ACCUMULATORS accumulators (or as many
    as the positions allow); among such tiles and their parallel blocks the one reading the least wins.
    None when the output channels are no whole vectors, the reduction is shorter than MIN_REDUCTION_TAPS, or no
    register tile of at least MIN_POSITION_TILE positions divides the positions (a tail would put a bounds check on
    every unrolled multiply-add)."""
    if lanes < 1 or out_channels % lanes != 0 or in_channels * kernel_rows * kernel_cols < MIN_REDUCTION_TAPS:
        return None
    positions = out_rows * out_width
    budget = ACCUMULATORS_32_REGISTERS if lanes >= 16 else ACCUMULATORS_16_REGISTERS
    tiles = [(vectors, reg) for vectors in (2, 1) if out_channels % (vectors * lanes) == 0
             for reg in _position_tiles(positions, budget // vectors)]
    if not tiles:
        return None
    least_accumulators = min(MIN_TILE_ACCUMULATORS, max(vectors * reg for vectors, reg in tiles))
    best = None
    for vectors, reg in tiles:
        if vectors * reg < least_accumulators:
            continue
        vec = vectors * lanes
        traffic, block_channels, block_rows = parallel_blocks(out_channels, out_rows, out_width, vec, reg, kernel_rows,
                                                              input_rows, input_bytes, weight_bytes, cores)
        key = (traffic, -vectors * reg, -vectors)  # ties: more accumulators, then fewer broadcasts per multiply-add
        if best is None or key < best[0]:
            best = (key, vec, reg, block_channels, block_rows)
    _, vec, reg, block_channels, block_rows = best
    rows_per_channel = kernel_rows if out_width > 1 else 1  # a one-column conv reads one contiguous run per channel
    taps = kernel_rows * kernel_cols
    least = min(in_channels, math.ceil(MIN_REDUCTION_BLOCK_MACS / taps))
    most = max(least, REDUCTION_BLOCK_ROWS // rows_per_channel)
    rc_block = largest_divisor(in_channels, most, least) or in_channels
    return FlatConvPlan(vec=vec, reg=reg, block_channels=block_channels, block_rows=block_rows, rc_block=rc_block,
                        channels_outer=weight_bytes > input_bytes)


def _position_tiles(positions: int, most: int) -> list[int]:
    """Register tiles of positions: the divisors of ``positions`` in [MIN_POSITION_TILE, most], or all positions when
    they fit one tile."""
    if positions <= most:
        return [positions]
    return [reg for reg in range(MIN_POSITION_TILE, most + 1) if positions % reg == 0]


def parallel_blocks(channels: int, rows: int, width: int, vec: int, reg: int, kernel_rows: int, input_rows: int,
                    input_bytes: int, weight_bytes: int, cores: int) -> tuple[tuple, int, int]:
    """Parallel block (output channels, output rows) and its cost: whole vectors of channels and whole rows holding
    whole register tiles, accumulators within BLOCK_ACCUMULATOR_BYTES (or one channel vector), at least ``cores``
    blocks when there are that many, reading the least: the weights once per block of rows, the input rows a block
    needs (its own and the kernel's halo) once per block of channels, scaled up by the cores left idle in the last
    round of blocks; ties: taller blocks. The cost is comparable across register tiles."""
    candidates = []  # one channel vector x all rows always qualifies: the reg tile divides the positions
    for n_channel_blocks in divisors(channels // vec):
        for n_row_blocks in divisors(rows):
            block_channels, block_rows = channels // n_channel_blocks, rows // n_row_blocks
            fits = block_channels * block_rows * width * FLOAT_BYTES <= BLOCK_ACCUMULATOR_BYTES \
                or block_channels == vec
            if (block_rows * width) % reg != 0 or not fits:
                continue
            blocks = n_channel_blocks * n_row_blocks
            staged_rows = min(input_rows, math.ceil(block_rows * input_rows / rows) + kernel_rows - 1)
            input_read = input_bytes * n_channel_blocks * n_row_blocks * staged_rows / input_rows
            traffic = (weight_bytes * n_row_blocks + input_read) * math.ceil(blocks / cores) * cores / blocks
            candidates.append(((blocks < cores, traffic, -block_rows), block_channels, block_rows))
    return min(candidates)


def divisors(extent: int) -> list[int]:
    """Every divisor of ``extent`` (>= 1), ascending."""
    return [d for d in range(1, extent + 1) if extent % d == 0]
