"""CPU rule for batch-1 dense NCHW convs with prepacked weights: flattened, blocked output positions.

The conv rule (:mod:`.conv2d`) tiles output channels (vectors) x output *columns* (unrolled) and reduces over all
input channels and taps in one go. That fails three kinds of conv:

- one output column (a conv1d written as a ``(k, 1)`` Conv2d, a pitch tracker's ``(512, 1)`` and ``(64, 1)``
  convs): the tile keeps one or two accumulators and every multiply-add waits for the previous one;
- rows with no divisor near the tile (161 columns = 7 x 23): 7 accumulators;
- large maps: one tile reads a few values from the rows of every input-channel plane (planes tens of KB apart),
  so the reduction touches more pages than the first-level TLB holds, and it reads them through indices that
  involve the parallel loop, which LLVM cannot strength-reduce (int32 indices, sign-extended per load).

This rule flattens the output rows and columns into positions (``transform_block_layout``) and tiles output
channels (whole SIMD registers; the weights are stored output-channel-innermost, :mod:`.layout`) x ``reg``
consecutive positions, so every conv gets a full register tile whatever its width. Around it, it blocks like a
GEMM (M = output channels, N = positions, K = input channels x taps, :mod:`.conv_flat_plan`): blocks of output
channels x whole output rows run in parallel; their accumulators (an intermediate buffer laid out
``[n, f // vec, p, f % vec]``) stay in L2 while the reduction runs over ``rc_block`` input channels at a time; for
each of those the block stages its input rows (the padding, or a copy, computed there: a small buffer indexed
from the block's origin, read from L1); a weight-heavy conv also copies each channel tile's weights of the
reduction block into a contiguous buffer, and a conv with OIHW weights copies them transposed. The fused epilogue (bias, activation, residual) then runs over the
block, vectorised over the channels (stores to the NCHW output one lane at a time).

Measured against the conv rule alone (2 threads, AVX2, one interleaved run each; benchmarks/results/
cpu_kernels_conv_shapes.md and cpu_kernels_conv_models.md): a 256->512 (5,1) conv on 512x1 4.90x -> 0.54x
onnxruntime's time, 32->32 3x3 at 900x161 1.62x -> 1.15x, ResNet-18 1.75x -> 1.00x. Those runs timed onnxruntime
without its spinning threads right after TVM's pool, whose worker spins on a core for ~0.2 s after a run, which
slowed onnxruntime; timed in blocks on Zen 4 (benchmarks/results/cpu_kernels_conv_shapes_znver4_blocks.md) the same
convs take 0.81x and 1.33x onnxruntime's time.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx
from tvm.target import Target

from ..tile_plan import column_vector_factor
from .base import (
    CpuRule,
    _buffer_of,
    loop_extent,
    num_cores,
    product_loads,
    static_extents,
    summarize_blocks,
    vector_lanes,
)
from .contraction import _inline_epilogue_chain, inline_plain_copy_producers
from .conv2d import (
    _is_grouped,
    find_conv_block,
    operand_bytes,
    weight_is_channel_innermost,
)
from .conv_flat_plan import FlatConvPlan, flat_conv_plan
from .elementwise import parallel_vectorize_nest


class Conv2dFlat(CpuRule):
    """Batch-1 dense NCHW convs, tiled over flattened, blocked positions: those with output-channel-innermost
    (prepacked) weights, and those with OIHW weights (stride-1 1x1 convs :mod:`.layout` leaves as they are) whose
    rows are too short for the conv rule's column vectors to fill a register (AVX2: 28-, 14- and 7-column rows get
    7-lane vectors). Their weights are copied transposed per block and reduction block; MobileNetV2 1.75x ->
    1.44x onnxruntime's time, GoogLeNet 1.27x -> 1.16x (2 threads, AVX2, one interleaved run)."""

    name = "conv2d_flat"

    def apply(self, func: tirx.PrimFunc, target: Target) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        name = find_conv_block(sch)
        if name is None or _is_grouped(sch, name):
            return None
        packed = weight_is_channel_innermost(sch, name)
        extents = static_extents(sch, sch.get_loops(sch.get_sblock(name)))
        operands = operand_bytes(sch, name)
        if extents is None or operands is None or extents[0] != 1 or not stages_fit(sch, name, extents[:4]):
            return None
        _, channels, rows, cols, in_channels, kh, kw = extents
        lanes = vector_lanes(target)
        if not packed and not (column_vector_factor(cols, lanes) < lanes and _weights_are_oihw(sch, name)):
            return None  # OIHW weights: the conv rule's column vectors fill whole registers
        input_rows = _data_load(sch, sch.get_sblock(name)).source.shape[2]
        if not isinstance(input_rows, tirx.IntImm):
            return None
        plan = flat_conv_plan(channels, rows, cols, in_channels, kh, kw, int(input_rows), operands[0], operands[1],
                              vector_lanes(target), num_cores(target))
        if plan is None:
            return None
        schedule_flat_conv(sch, name, plan, cols, target, transpose_weights=not packed)
        return sch


def stages_fit(sch: s_tir.Schedule, name: str, out_extents: list[int]) -> bool:
    """At most one block before the conv, writing the data operand (its padding or a copy of it), and every block
    after it spatial over exactly the conv's output domain (bias, activation, residual)."""
    blocks = summarize_blocks(sch)
    names = [summary.name for _, summary in blocks]
    at = names.index(name)
    if at > 1:
        return False
    if at == 1:
        written = _buffer_of(sch.get(blocks[0][0]).writes[0])
        if not written.same_as(_data_load(sch, sch.get_sblock(name)).source):
            return False
    for block_rv, summary in blocks[at + 1:]:
        if summary.is_reduction or summary.iter_kinds != ("S",) * 4:
            return False
        extents = [int(iv.dom.extent) if isinstance(iv.dom.extent, tirx.IntImm) else None
                   for iv in sch.get(block_rv).iter_vars]
        if extents != out_extents:
            return False
    return True


def _data_load(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> tvm.ir.TensorLoad:
    """The conv's load of its data operand (the operand indexed by the batch; :func:`.conv2d.operand_bytes` has
    checked there is exactly one)."""
    stmt = sch.get(block)
    product = stmt.body.value.b
    batch = stmt.iter_vars[0].var
    return next(op for op in product_loads(product) if op.indices and op.indices[0].same_as(batch))


def _operand_read_index(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, data: bool) -> int:
    """Index among the block's read regions (what cache_read takes) of its data operand, or of its weights."""
    stmt = sch.get(block)
    product = stmt.body.value.b
    data_buffer = _data_load(sch, block).source
    loads = [op.source for op in product_loads(product)]
    buffer = data_buffer if data else next(load for load in loads if not load.same_as(data_buffer))
    return next(index for index, region in enumerate(stmt.reads) if _buffer_of(region).same_as(buffer))


def schedule_flat_conv(sch: s_tir.Schedule, name: str, plan: FlatConvPlan, width: int, target: Target,
                       transpose_weights: bool = False) -> None:
    """Apply the flattened, blocked schedule (module docstring) to the batch-1 conv block ``name``."""
    main = sch.get_sblock(name)
    pads = inline_plain_copy_producers(sch, name)   # an unpadded conv's input copy is staged by a cache_read
    epilogue, later_stages = _inline_epilogue_chain(sch, name)
    if epilogue is None:
        epilogue = sch.cache_write(main, 0, "global")
    vec, band = plan.vec, plan.block_rows
    # (row block, position within the block): a tile's index arithmetic then never involves the parallel loop.
    sch.transform_block_layout(main, lambda n, f, y, x, rc, ry, rx: (n, f, y // band, y % band * width + x, rc, ry,
                                                                      rx))
    sch.transform_block_layout(epilogue, lambda n, f, y, x: (n, f, y // band, y % band * width + x))
    sch.transform_layout(main, ("write", 0), lambda n, f, y, x: (n, f // vec, y * width + x, f % vec))

    n, f, rows, p, rc, ry, rx = sch.get_loops(main)
    f_block, f_o, f_i = sch.split(f, factors=[None, plan.block_channels // vec, vec])
    p_o, p_i = sch.split(p, factors=[None, plan.reg])
    rc_o, rc_i = sch.split(rc, factors=[None, plan.rc_block])
    tiles = [f_o, p_o] if plan.channels_outer else [p_o, f_o]
    sch.reorder(n, f_block, rows, rc_o, *tiles, rc_i, ry, rx, p_i, f_i)
    block_loop = sch.fuse(n, f_block, rows)
    if num_cores(target) > 1 and (loop_extent(sch, block_loop) or 1) > 1:
        sch.parallel(block_loop)
    if pads:
        sch.compute_at(pads[0], rc_o, preserve_unit_loops=True)
    else:
        sch.compute_at(sch.cache_read(main, _operand_read_index(sch, main, data=True), "global"), rc_o,
                       preserve_unit_loops=True)
    if plan.channels_outer or transpose_weights:
        # Weight-heavy convs: each channel tile copies its weights of the reduction block into a contiguous buffer
        # (read with a stride of all output channels, once) that every position tile then reads from cache.
        # (k,1) convs, 2 threads: 256->512 (5,1) 0.79 -> 0.51 of onnxruntime's time, 1->256 (512,1) 0.44 -> 0.33.
        weights = sch.cache_read(main, _operand_read_index(sch, main, data=False), "global")
        if transpose_weights:
            sch.transform_layout(weights, ("write", 0), lambda f, c, y, x: (c, y, x, f))
        sch.compute_at(weights, f_o if plan.channels_outer else rc_o, preserve_unit_loops=True)

    sch.reverse_compute_at(epilogue, block_loop, preserve_unit_loops=True)
    epi_n, epi_f, epi_rows, epi_p = sch.get_loops(epilogue)[-4:]
    epi_f_o, epi_f_i = sch.split(epi_f, factors=[None, vec])
    sch.reorder(epi_n, epi_f_o, epi_rows, epi_p, epi_f_i)
    sch.vectorize(epi_f_i)

    sch.unroll(p_i)
    sch.vectorize(f_i)
    sch.decompose_reduction(main, rc_o)
    for stage in later_stages:
        parallel_vectorize_nest(sch, stage, target)


def _weights_are_oihw(sch: s_tir.Schedule, name: str) -> bool:
    """The weight operand is read ``w[f, rc, ry, rx]`` (TOPI's OIHW conv)."""
    stmt = sch.get(sch.get_sblock(name))
    data = _data_load(sch, sch.get_sblock(name)).source
    product = stmt.body.value.b
    loads = [op for op in product_loads(product) if not op.source.same_as(data)]
    if len(loads) != 1 or len(loads[0].indices) != 4:
        return False
    expected = [stmt.iter_vars[i].var for i in (1, 4, 5, 6)]
    return all(index.same_as(var) for index, var in zip(loads[0].indices, expected))
