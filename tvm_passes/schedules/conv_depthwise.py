"""CPU rule for depthwise NCHW convs (one input channel per output channel): whole column vectors plus a tail.

The conv rule (:mod:`.conv2d`) vectorises a depthwise conv over output columns with a vector as long as the
largest divisor of the row near the SIMD width: 13 lanes for 52-column rows, 7 for 161, which LLVM splits into a
full register, a half one and single lanes on every load, multiply-add and store. This rule partitions each row
(``loop_partition``) into whole SIMD vectors and a tail, so the bulk of the row runs in full registers and only the
tail (fewer lanes than a register) runs narrower. Register tile: ``reg`` channels (independent accumulators; a
depthwise conv shares no input between channels) x one vector of columns. The padding is computed per channel
tile inside the parallel loop (while the tile's planes are hot), the epilogue per output row, partitioned the same
way. Stride-2 convs still gather their inputs lane by lane (see the benchmark results).
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.target import Target

from ..tile_plan import pick_factor
from .base import (
    CpuRule,
    loop_extent,
    num_cores,
    static_extents,
    vector_lanes,
)
from .contraction import _inline_epilogue_chain, inline_plain_copy_producers
from .conv2d import _is_grouped, find_conv_block, operand_bytes
from .conv_flat import stages_fit
from .elementwise import parallel_vectorize_nest

# Output channels per register tile. Measured (2 threads, AVX2, one interleaved run): 4 ran 0.62-0.94x the time of 8
# (32 channels at 208x208 and 100x161, 128 at 52x52, 64 at 104x104 stride 2).
CHANNEL_TILE = 4


class Conv2dDepthwise(CpuRule):
    """Depthwise NCHW convs: column vectors in whole registers plus a partitioned tail, ``CHANNEL_TILE`` channels."""

    name = "conv2d_depthwise"

    def apply(self, func: tirx.PrimFunc, target: Target) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        name = find_conv_block(sch)
        if name is None:
            return None
        extents = static_extents(sch, sch.get_loops(sch.get_sblock(name)))
        if extents is None or extents[4] != 1 or operand_bytes(sch, name) is None \
                or not _reads_one_channel_per_group(sch, name) or not stages_fit(sch, name, extents[:4]):
            return None
        schedule_depthwise(sch, name, vector_lanes(target), target)
        return sch


def _reads_one_channel_per_group(sch: s_tir.Schedule, name: str) -> bool:
    """The data operand has more channels than the reduction covers (grouped), and the reduction covers one."""
    return _is_grouped(sch, name) and int(sch.get(sch.get_sblock(name)).iter_vars[4].dom.extent) == 1


def schedule_depthwise(sch: s_tir.Schedule, name: str, lanes: int, target: Target) -> None:
    """Apply the schedule of the module docstring to the depthwise conv block ``name``."""
    main = sch.get_sblock(name)
    pads = inline_plain_copy_producers(sch, name)
    epilogue, later_stages = _inline_epilogue_chain(sch, name)
    if epilogue is None:
        epilogue = sch.cache_write(main, 0, "global")
    epilogue_name = sch.get(epilogue).name_hint

    n, f, y, x, rc, ry, rx = sch.get_loops(main)
    f_o, f_i = sch.split(f, factors=[None, pick_factor(loop_extent(sch, f) or 1, CHANNEL_TILE)])
    sch.reorder(n, f_o, y, x, f_i, rc, ry, rx)
    tiles = sch.fuse(n, f_o)
    if num_cores(target) > 1 and (loop_extent(sch, tiles) or 1) > 1:
        sch.parallel(tiles)
    for pad in pads:
        sch.compute_at(pad, tiles, preserve_unit_loops=True)
    sch.reverse_compute_at(epilogue, y, preserve_unit_loops=True)

    for block in _partitioned(sch, x, lanes, name):
        x_loop, f_loop, rc_loop, ry_loop, rx_loop = sch.get_loops(block)[-5:]
        columns = loop_extent(sch, x_loop) or 1
        if columns % lanes == 0 and columns > lanes:
            x_outer, x_loop = sch.split(x_loop, factors=[None, lanes])
            sch.reorder(x_outer, rc_loop, ry_loop, rx_loop, f_loop, x_loop)
        else:
            sch.reorder(rc_loop, ry_loop, rx_loop, f_loop, x_loop)
        sch.unroll(f_loop)
        if columns > 1:
            sch.vectorize(x_loop)
        sch.decompose_reduction(block, rc_loop)

    for block in _partitioned(sch, sch.get_loops(epilogue)[-1], lanes, epilogue_name):
        x_loop = sch.get_loops(block)[-1]
        columns = loop_extent(sch, x_loop) or 1
        if columns % lanes == 0 and columns > lanes:
            x_loop = sch.split(x_loop, factors=[None, lanes])[1]
        if columns > 1:
            sch.vectorize(x_loop)
    for stage in later_stages:
        parallel_vectorize_nest(sch, stage, target)


def _partitioned(sch: s_tir.Schedule, loop: s_tir.schedule.LoopRV, lanes: int,
                 name: str) -> list[s_tir.schedule.SBlockRV]:
    """Split ``loop`` (a row of columns) into whole vectors and a tail, each with its copy of block ``name``; the
    blocks to schedule, in program order (block ``name`` itself when the row is whole vectors or shorter than one)."""
    columns = loop_extent(sch, loop) or 1
    whole = columns // lanes * lanes
    if whole in (0, columns):
        return [sch.get_sblock(name)]
    before = set(_block_names(sch))
    sch.loop_partition(loop, [whole, None])
    # the copies of the block; loop_partition also wraps them in opaque "..._common"/"..._partition" blocks
    return [sch.get_sblock(hint) for hint in _block_names(sch)
            if hint not in before and not hint.endswith(("_common", "_partition"))]


def _block_names(sch: s_tir.Schedule) -> list[str]:
    """Every block's name, nested ones included, in program order."""
    names: list[str] = []

    def walk(block: s_tir.schedule.SBlockRV) -> None:
        for child in sch.get_child_blocks(block):
            names.append(sch.get(child).name_hint)
            walk(child)

    walk(sch.get_sblock("root"))
    return names
