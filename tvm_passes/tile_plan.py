"""Tile decisions of hetpart's CPU schedule rules, as plain arithmetic on shapes (imports no TVM).

The rules in :mod:`tvm_passes.schedules` apply these decisions to PrimFuncs; :mod:`predictors.features` reads
the same decisions to describe a kernel (how many SIMD registers its register tile keeps, how full its vectors
are), so a latency model sees the steps the schedule puts into latency without importing TVM. One definition
serves both, so they cannot drift apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

AVX2_CPUS = frozenset({"haswell", "broadwell", "skylake", "znver1", "znver2", "znver3", "x86-64-v3", "alderlake"})
AVX512_CPUS = frozenset(
    {"skylake-avx512", "cascadelake", "cooperlake", "icelake-server", "icelake-client", "tigerlake",
     "rocketlake", "sapphirerapids", "znver4", "znver5", "x86-64-v4"}
)

CHANNEL_TILE = 8  # NCHW weights: 8 output channels share each input vector load (8 accumulators)
COLUMN_TILE = 8  # IHWO weights: 8 output columns share each weight vector load (8 accumulators)
# IHWO weights, deep layers (reduction C*kh*kw >= WIDE_MIN_REDUCTION): two SIMD registers of output channels
# per tile (~16 accumulators).  Measured interleaved (2 threads): 512ch 7x7 3x3 4.98 -> 2.30 ms, 256ch 14x14
# 3.30 -> 2.69 ms, 128->256 stride 2 1.63 -> 1.29 ms; 64ch 56x56 was faster with one register (4.54 vs 5.64).
WIDE_CHANNEL_VECTORS = 2
WIDE_MIN_REDUCTION = 1024
# Accumulator registers a register tile may keep where the ISA has 16 vector registers (SSE, AVX2: 8 float lanes or
# fewer); the others hold the weight vectors and the broadcast input. Measured on AVX2 (2 threads), flat conv
# rule: 2 vectors x 6 positions and 1 x 12 ran alike, 2 x 8 (16 accumulators) up to 2x slower. Beyond it LLVM spills
# accumulators to the stack, and the spilled tile's speed then depends on the caller's stack alignment: SqueezeNet's
# 512->1000 1x1 conv on 13-wide rows (13 accumulators) ran the whole model in 29-30 ms in the task runtime's worker
# and 22-23 ms when the same call went through one more Python frame; capped at 12, both 22-23 ms.
ACCUMULATORS_16_REGISTERS = 12


def vector_lanes_for(mcpu: str, mattr: Iterable[str] = (), dtype_bits: int = 32) -> int:
    """Elements of ``dtype_bits`` in one SIMD register of an llvm CPU (4 for generic x86-64)."""
    keys = {str(k) for k in mattr}
    width_bits = 128
    if mcpu in AVX512_CPUS or any("avx512f" in k for k in keys):
        width_bits = 512
    elif mcpu in AVX2_CPUS or any("avx2" in k for k in keys):
        width_bits = 256
    return max(1, width_bits // dtype_bits)


def pick_factor(extent: int, preferred: int, minimum: int = 1, multiple_of: int = 1) -> int:
    """A tile factor for a loop of ``extent``: ideally a divisor of it close to ``preferred``.

    Order of preference: ``extent`` itself when it is <= ``preferred``; the largest divisor <= ``preferred``
    that is a multiple of ``multiple_of`` (> 1 only for vector axes: whole SIMD registers); the divisor in
    ``[minimum, 2 * preferred]`` closest to ``preferred`` (ratio-wise); else ``preferred`` itself, leaving a
    tail that TVM guards with a predicate (correct, slower).
    """
    if extent <= preferred:
        return extent
    if multiple_of > 1:
        for factor in range(preferred - preferred % multiple_of, multiple_of - 1, -multiple_of):
            if factor >= minimum and extent % factor == 0:
                return factor
    divisors = [f for f in range(max(1, minimum), 2 * preferred + 1) if extent % f == 0]
    if divisors:
        return min(divisors, key=lambda f: (abs(math.log(f / preferred)), -f))
    return preferred


def largest_divisor(extent: int, most: int, least: int) -> int | None:
    """The largest divisor of ``extent`` in [least, most]; ``extent`` itself when it is <= most; None without one."""
    if extent <= most:
        return extent
    for factor in range(most, least - 1, -1):
        if extent % factor == 0:
            return factor
    return None


def column_vector_factor(out_width: int, lanes: int) -> int:
    """Vector length over output columns when the weights stay OIHW (one input row vector per channel tile).

    A divisor of the row when one exists near ``lanes``, so no predicated tail; it can exceed ``lanes`` when the
    width has no divisor in ``[lanes/2, lanes]`` (27 -> 27, 57 -> 19).  :func:`conv_prepacks_weights` sends such
    convs to channel vectors instead.
    """
    return pick_factor(out_width, lanes, minimum=max(4, lanes // 2), multiple_of=lanes)


def column_vector_has_tail(out_width: int, lanes: int) -> bool:
    """Whether :func:`column_vector_factor` leaves a predicated tail (the row is no multiple of it), which TVM
    runs as guarded scalar code."""
    return out_width % column_vector_factor(out_width, lanes) != 0


def conv_prepacks_weights(out_channels: int, groups: int, kernel_h: int, kernel_w: int, strides: Iterable[int],
                          out_width: int | None, lanes: int) -> bool:
    """Whether hetpart stores a constant NCHW conv2d weight output-channel-innermost (IHWO) for the CPU.

    Dense convs whose output channels fill whole vectors are prepacked, except stride-1 1x1 convs whose rows fit
    column vectors. Measured (interleaved, 2 threads): a stride-1 1x1 conv is a GEMM along the contiguous columns
    and is faster with column vectors (24->144 ch at 56x56: 0.10 vs 0.53 ms) unless its rows are too narrow to
    fill a vector (7x7 maps) or have no divisor near the vector width, so the column vector is longer than one
    register (AVX-512, 32->128 ch: width 27 -> 27-lane vectors 214 vs 40 us prepacked, 29: 244 vs 44, 31: 290 vs
    64, 57 -> 19 lanes: 1270 vs 229; widths 26/28/30/55/56 stay faster with columns, 0.67-0.95x). Every spatial or
    strided conv is faster with output-channel vectors (no strided input gathers, no lanes wasted on 7- or
    14-wide rows). ``out_width`` None (not static): a pointwise conv is left as it is.

    Rows with no divisor near the vector width (82, 73, 149: column vectors of 16 lanes with a predicated tail,
    which TVM runs as guarded scalar code) are prepacked too, and so are convs with half a register of output
    channels (24, 40, 56 on AVX-512) that would otherwise get such column vectors: the conv rule then vectorises
    half-register channel vectors instead (:func:`conv_register_tile`). Measured (2 threads, AVX-512): 64->16 1x1 at
    82x82 739 -> 75 us (80x80: 65), 64->64 at 73x73 2375 -> 237, 32->16 at 149x149 2080 -> 214, 64->24 1x1 at 82x82
    1162 -> 147 (80x80: 97), 32->24 3x3 at 82x82 4489 -> 536 (80x80: 377).

    With 8-lane vectors (AVX2) every pointwise conv with a static width and whole vectors of output channels is
    prepacked. Measured on Zen 3 (2 threads; each model's distinct kernels timed with both rules interleaved, 7
    rounds, median of the per-round sums): ResNet-50 0.94x and 0.97x the time of column vectors, DenseNet-121 0.92x,
    GoogLeNet 0.96x; MobileNetV2 0.99-1.01x, SqueezeNet 1.00-1.01x, the YOLO-style detector 1.02x and the CRNN 1.02x
    (within the host's noise). The AVX-512 measurements above keep 16-lane hosts on column vectors; 4-lane
    (generic x86-64) targets were not measured and keep them too.
    """
    if groups != 1 or out_channels % (lanes // 2 or 1) != 0:
        return False
    tail = out_width is not None and column_vector_has_tail(out_width, lanes)
    if out_channels % lanes != 0:
        return tail      # half-register channel vectors only where column vectors would carry a tail
    pointwise = kernel_h == 1 and kernel_w == 1 and all(int(s) == 1 for s in strides)
    if not pointwise:
        return True
    if out_width is None:
        return False
    if lanes == 8:
        return True
    return out_width <= lanes // 2 or column_vector_factor(out_width, lanes) > lanes or tail


@dataclass(frozen=True)
class ConvRegisterTile:
    """The conv rule's register tile: ``reg_factor`` unrolled outputs x a ``vec_factor``-element vector.

    ``over_channels``: vectors run over output channels (IHWO weights) and the unrolled axis is output columns;
    else vectors run over output columns and the unrolled axis is output channels.
    """

    over_channels: bool
    reg_factor: int
    vec_factor: int

    def accumulators(self, lanes: int) -> int:
        """SIMD registers the tile keeps as accumulators."""
        return self.reg_factor * math.ceil(self.vec_factor / lanes)

    def lane_fill(self, lanes: int) -> float:
        """Share of the vector registers' lanes that hold outputs (1 = whole vectors, no masked lanes)."""
        return self.vec_factor / (math.ceil(self.vec_factor / lanes) * lanes)


def conv_register_tile(out_channels: int, out_width: int, reduction: int, channel_innermost_weights: bool,
                       lanes: int) -> ConvRegisterTile:
    """The register tile the conv rule picks for an NCHW conv (``reduction`` = Ci/groups * kh * kw)."""
    if channel_innermost_weights and out_channels % lanes == 0:
        wide = out_channels % (lanes * WIDE_CHANNEL_VECTORS) == 0 and reduction >= WIDE_MIN_REDUCTION
        vectors, columns = (WIDE_CHANNEL_VECTORS if wide else 1), pick_factor(out_width, COLUMN_TILE, minimum=4)
        if lanes <= 8:
            vectors, columns = _fit_16_registers(out_width, vectors, columns)
        return ConvRegisterTile(over_channels=True, reg_factor=columns, vec_factor=lanes * vectors)
    if channel_innermost_weights and lanes > 1 and out_channels % (lanes // 2) == 0 \
            and column_vector_has_tail(out_width, lanes):
        # half-register channel vectors (see conv_prepacks_weights): better than a predicated column vector
        return ConvRegisterTile(over_channels=True, reg_factor=pick_factor(out_width, COLUMN_TILE, minimum=4),
                                vec_factor=lanes // 2)
    return ConvRegisterTile(over_channels=False, reg_factor=pick_factor(out_channels, CHANNEL_TILE, minimum=4),
                            vec_factor=column_vector_factor(out_width, lanes))


def _fit_16_registers(out_width: int, vectors: int, columns: int) -> tuple[int, int]:
    """(channel vectors, output columns) of a channel-vector tile within ACCUMULATORS_16_REGISTERS: as chosen when it
    fits; else the same vectors over the largest divisor of the row (>= 4 columns) that fits; else one vector over
    the largest such divisor (the whole row when it fits), or the fewest equal chunks that fit (the last chunk
    guarded)."""
    if vectors * columns <= ACCUMULATORS_16_REGISTERS:
        return vectors, columns
    for n_vectors in dict.fromkeys((vectors, 1)):
        fitting = largest_divisor(out_width, ACCUMULATORS_16_REGISTERS // n_vectors, 4)
        if fitting:
            return n_vectors, fitting
    return 1, math.ceil(out_width / math.ceil(out_width / ACCUMULATORS_16_REGISTERS))


# Batch-1 convs on several cores: bands of output rows (see conv_row_bands).
CONV_BAND_MIN_INPUT_TO_WEIGHTS = 2.0
CONV_BAND_INPUT_BYTES = 512 * 1024


def conv_row_bands(batch: int, out_rows: int, input_bytes: int, weight_bytes: int, cores: int) -> int:
    """How many bands of output rows the conv rule splits a conv into, outermost (1 = no bands).

    ``input_bytes``: one sample of the input as the conv reads it (padded when it has a pad stage);
    ``weight_bytes``: its weights. From ``cores`` samples up the rule gives each core whole samples. Below that it
    used to split the output channels, so every core read the whole input once per channel tile it computed, while
    the weights were split. When the input outweighs the weights (``CONV_BAND_MIN_INPUT_TO_WEIGHTS``), bands of rows
    are cheaper: each core reads its own rows of the input, in slabs of about ``CONV_BAND_INPUT_BYTES`` that stay in
    its L2 while every channel tile uses them, and all the weights. The band count is a multiple of ``cores``.

    Measured on the Intel host (2 threads), batch-1 convs of the zoo models: 1x1 convs from 160-512 to
    64-256 channels at 28-56 px 0.57-0.83x (192->128 at 56 px 1457 -> 910 us), 64->64 3x3 at 56 and 224 px 0.74x
    and 0.63x,
    ResNet-50's 128->128 3x3 stride 2 at 56 px 0.66x; 3 of 51 banded convs slower by more than 4% (at most 1.10x,
    64->256 1x1 at 28 px); summed over the zoo's batch-1 convs 0.946x. Bands for every conv whose input outweighs
    its weights (ratio 1) made ten convs 4-18% slower (128->256 3x3 at 56 px 1.18x) for 0.960x; slabs of 1 MiB gave
    0.949x.
    """
    if cores < 2 or batch >= cores or out_rows < 2 * cores:
        return 1
    if input_bytes <= CONV_BAND_MIN_INPUT_TO_WEIGHTS * weight_bytes:
        return 1
    return min(out_rows, cores * math.ceil(input_bytes / (cores * CONV_BAND_INPUT_BYTES)))


MATMUL_VECTORS_MAX = 4  # matmul column tile: up to 4 SIMD registers wide
MATMUL_TARGET_ACCUMULATORS = 16  # matmul rows x column-vectors kept in registers (32 zmm registers on AVX-512)
MATMUL_MAX_ROW_TILE = 8
GEMV_VECTORS = 8  # matrix-vector products: independent vector accumulators along the columns


def power_of_two_vector(extent: int, lanes: int, max_vectors: int) -> int:
    """Matmul column tile: the widest of lanes*{max_vectors, ..., 2, 1} (powers of two), lanes/2, lanes/4 dividing
    ``extent``.

    Measured: odd widths (e.g. 26 for N=2600) and non-dividing tiles (a predicated tail makes TVM scalarise
    the vector loop) are 3-10x slower than an 8-wide tile, and wider dividing tiles are faster
    (128x256x1024: 64 -> 0.51 ms, 32 -> 0.80 ms, 16 -> 1.21 ms).  Three vectors (48 lanes) are as bad:
    512x128x96 572 us with 48 vs 40 us with 32, 512x256x96 1130 vs 80, 512x128x48 522 vs 24 with 16.
    Extents no power-of-two width divides (e.g. 37) get the whole extent when it is small, else ``lanes``
    with a scalarised tail.
    """
    counts = [v for v in (8, 4, 2, 1) if v <= max_vectors]
    widths = [lanes * v for v in counts] + [lanes // 2, lanes // 4]
    for width in widths:
        if width >= 2 and extent % width == 0:
            return width
    return extent if extent <= 2 * lanes else lanes


@dataclass(frozen=True)
class MatmulRegisterTile:
    """The matmul rule's register tile: ``reg_factor`` rows x a ``vec_factor``-element column vector, or for a
    matrix-vector product (``gemv``: one row) ``reg_factor`` column vectors side by side."""

    reg_factor: int
    vec_factor: int
    gemv: bool

    def accumulators(self, lanes: int) -> int:
        """SIMD registers the tile keeps as accumulators."""
        return self.reg_factor * math.ceil(self.vec_factor / lanes)


def matmul_register_tile(rows: int, cols: int, lanes: int) -> MatmulRegisterTile:
    """The register tile the matmul rule picks for ``rows`` (the register-tiled axis: M, or a batch of
    matrix-vector products sharing B) x ``cols`` (N). With 16 vector registers (8 lanes or fewer) it keeps at
    most ACCUMULATORS_16_REGISTERS accumulators: fewer rows (matrix-vector products: fewer column vectors) of the
    same vectors. Measured interleaved (AVX2, whole models): BERT-small's 4 x 4-vector tiles (16 accumulators) ->
    2 x 4: 0.91x at 2 threads, 0.86x on one core; the LSTM LM's 7 x 2-vector tiles (14) -> 5 x 2: 0.81x, 0.91x."""
    if rows == 1:
        vec = power_of_two_vector(cols, lanes, max_vectors=1)
        unrolled, preferred, gemv = cols // vec, GEMV_VECTORS, True
    else:
        vec = power_of_two_vector(cols, lanes, max_vectors=MATMUL_VECTORS_MAX)
        unrolled, gemv = rows, False
        preferred = max(2, min(MATMUL_MAX_ROW_TILE, MATMUL_TARGET_ACCUMULATORS * lanes // max(vec, 1)))
    reg = pick_factor(unrolled, preferred, minimum=2)
    vectors = math.ceil(vec / lanes)
    if lanes <= 8 and reg * vectors > ACCUMULATORS_16_REGISTERS:
        most = max(1, ACCUMULATORS_16_REGISTERS // vectors)
        reg = largest_divisor(unrolled, most, 2) or most
    return MatmulRegisterTile(reg_factor=reg, vec_factor=vec, gemv=gemv)
