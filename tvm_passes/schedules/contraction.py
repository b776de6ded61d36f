"""Register-tiled schedule for one multiply-accumulate block plus its fused epilogue (shared by conv2d/matmul).

The contraction block ``C[s0, ..., sn] += A[...] * B[...]`` is tiled so that its innermost work is an
``reg x vec`` tile of outputs kept in registers: the *vector* spatial axis is split to SIMD lanes and
vectorised, the *register* spatial axis is split by a small factor and unrolled, and all reduction loops sit
between the tile loops and the outer loops.  One vector load of the operand that does not depend on the
register axis then feeds ``reg`` fused multiply-adds.  The outer spatial loops are fused and run in parallel.

The epilogue (bias add, residual add, relu/clip, batch-norm scale/shift) that FuseOps put into the kernel is
first collapsed into a single block (``compute_inline`` of the intermediate injective blocks), then moved
into the tile (``reverse_compute_at``), so it runs on each tile while it is still in registers/L1 and the
full-size intermediate buffer disappears.  An intermediate block whose inlining would copy a large value into
many loads (stacked activations, see :func:`.base.inline_injective_producers`) stays: the epilogue then ends at
the first such block, and the blocks after it run as full-size parallel, vectorised stages.

Padding blocks feeding the contraction stay separate stages (parallel, vectorised copies); inlining them would put
a bounds check in the innermost loop.  A pad of width 0 (TOPI gives every unpadded conv one: a full copy of its
input) is inlined instead: it has no bounds to check, and the copy, split over the cores by channel, left each
core's half of the input in the other core's L2 when the conv then read all of it.  On the 2-core Intel host a
64->16 1x1 conv at 55x55 went from 203 to 76 µs (it had run 155 µs on one thread), 128->32 at 27x27 from 93 to
25 µs; whole models 1.03-1.10x faster (ResNet-50, DenseNet-121, GoogLeNet, MobileNetV2, SqueezeNet at 224 px).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import tvm
from tvm import s_tir, tirx
from tvm.target import Target

from ..tile_plan import pick_factor  # noqa: F401  (re-exported: the rules import it from here)
from .base import (MAX_INLINE_GROWTH_NODES, _buffer_of, inline_growth_nodes, loop_extent, num_cores,
                   summarize_blocks)
from .elementwise import parallel_vectorize_nest

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TilePlan:
    """Which spatial loops of the contraction block form the register tile, and their factors."""

    reg_axis: int  # index among the block's loops (all spatial loops come first, reductions after)
    reg_factor: int
    vec_axis: int
    vec_factor: int
    n_spatial: int
    n_reduction: int
    vec_outer_first: bool = False  # order the vec axis' tile loop before the reg axis' (matmul: B panel reuse)
    row_bands: int = 1  # split spatial loop ``band_axis`` into this many bands, outermost after loop 0 (the batch)
    band_axis: int = 2


def _inline_epilogue_chain(sch: s_tir.Schedule, main_name: str
                           ) -> tuple[s_tir.schedule.SBlockRV | None, list[s_tir.schedule.SBlockRV]]:
    """Collapse the spatial blocks after the contraction into as few blocks as the inline budget allows.

    Returns the epilogue (the first block left after the contraction, None without one) and the blocks left
    after it, in program order.  Every intermediate block is inlined unless that would add more than
    :data:`.base.MAX_INLINE_GROWTH_NODES` expression nodes, so the usual epilogue (bias, batch norm, residual,
    one activation) still becomes one block.
    """
    names = [summary.name for _, summary in summarize_blocks(sch)]
    after = names[names.index(main_name) + 1 :]
    left = []
    for name in after[:-1]:
        block = sch.get_sblock(name)
        growth = inline_growth_nodes(sch, block, MAX_INLINE_GROWTH_NODES)
        if growth > MAX_INLINE_GROWTH_NODES:
            logger.debug("epilogue block %s stays a stage: inlining it would add over %d expression nodes",
                         name, MAX_INLINE_GROWTH_NODES)
            left.append(name)
            continue
        sch.compute_inline(block)
    left += after[-1:]
    blocks = [sch.get_sblock(name) for name in left]
    return (blocks[0], blocks[1:]) if blocks else (None, [])


def schedule_producer(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, target: Target) -> None:
    """Padding (or other injective producer) stage: parallel over all but the last two loops, which stay
    as plain nested loops.  The bounds check of a pad is then a function of the row/column only and LLVM
    vectorises the column loop; fusing rows and columns would turn every lane's index into a div/mod.
    """
    loops = sch.get_loops(block)
    if len(loops) <= 2:
        parallel_vectorize_nest(sch, block, target)
        return
    outer = loops[:-2]
    fused = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    if num_cores(target) > 1 and (loop_extent(sch, fused) or 1) > 1:
        sch.parallel(fused)


def _is_plain_copy(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> bool:
    """A producer that copies its input element for element (a pad of width 0): ``out[i...] = in[i...]``."""
    stmt = sch.get(block)
    body = stmt.body
    if not isinstance(body, tirx.BufferStore) or not isinstance(body.value, tvm.ir.TensorLoad):
        return False
    load = body.value
    return len(load.indices) == len(body.indices) and all(
        a.same_as(b) for a, b in zip(load.indices, body.indices))


def _move_vector_axis_innermost(sch: s_tir.Schedule, main: s_tir.schedule.SBlockRV, plan: TilePlan) -> None:
    """Relayout the contraction's (intermediate) output so ``vec_axis % vec_factor`` is the last dimension."""
    axis, lanes = plan.vec_axis, plan.vec_factor

    def index_map(*indices):
        return (*indices[:axis], indices[axis] // lanes, *indices[axis + 1 :], indices[axis] % lanes)

    sch.transform_layout(main, ("write", 0), index_map)


def inline_plain_copy_producers(sch: s_tir.Schedule, main_name: str) -> list[s_tir.schedule.SBlockRV]:
    """Inline the plain copies before block ``main_name`` (an unpadded conv's copy of its input); returns the
    other producers (pads, layout transforms) in program order."""
    names = [summary.name for _, summary in summarize_blocks(sch)]
    others = []
    for name in names[: names.index(main_name)]:
        block = sch.get_sblock(name)
        if _is_plain_copy(sch, block):
            sch.compute_inline(block)
        else:
            others.append(block)
    return others


def inline_side_producers(sch: s_tir.Schedule, main_name: str) -> int:
    """Inline the blocks before ``main_name`` that it does not read (an attention mask's expand_dims feeding the
    epilogue's ``where``) into their readers; returns how many. ``reverse_compute_at`` of an epilogue into the
    contraction's tile needs every producer of the epilogue under that tile, and such a block is not."""
    names = [summary.name for _, summary in summarize_blocks(sch)]
    read_by_main = [_buffer_of(region) for region in sch.get(sch.get_sblock(main_name)).reads]
    inlined = 0
    for name in names[: names.index(main_name)]:
        block = sch.get_sblock(name)
        if any(_buffer_of(region).same_as(read) for region in sch.get(block).writes for read in read_by_main):
            continue
        sch.compute_inline(block)
        inlined += 1
    return inlined


def schedule_contraction(sch: s_tir.Schedule, main_name: str, plan: TilePlan, target: Target) -> None:
    """Apply the register-tiled schedule described in the module docstring to block ``main_name``."""
    main = sch.get_sblock(main_name)
    for block in inline_plain_copy_producers(sch, main_name):
        schedule_producer(sch, block, target)
    epilogue, later_stages = _inline_epilogue_chain(sch, main_name)
    if plan.vec_axis != plan.n_spatial - 1:
        # Vectorising a non-innermost output axis: accumulate in an intermediate buffer whose layout puts
        # the vector lanes innermost, so the register tile is contiguous; the epilogue writes the output.
        if epilogue is None:
            epilogue = sch.cache_write(main, 0, "global")
        _move_vector_axis_innermost(sch, main, plan)

    loops = sch.get_loops(main)
    spatial = loops[: plan.n_spatial]
    reduction = loops[plan.n_spatial :]
    if plan.reg_axis == plan.vec_axis:
        # Matrix-vector product: the register tile is several vectors along the same (column) axis.
        vec_outer, reg_inner, vec_inner = sch.split(
            spatial[plan.vec_axis], factors=[None, plan.reg_factor, plan.vec_factor]
        )
        reg_outer = None
    else:
        reg_outer, reg_inner = sch.split(spatial[plan.reg_axis], factors=[None, plan.reg_factor])
        vec_outer, vec_inner = sch.split(spatial[plan.vec_axis], factors=[None, plan.vec_factor])
    others = [loop for index, loop in enumerate(spatial) if index not in (plan.reg_axis, plan.vec_axis)]
    if reg_outer is None:
        outer = [vec_outer, *others]
    elif plan.vec_outer_first:
        # Column panel outermost: one panel of B stays in cache while every row tile (and batch) uses it.
        outer = [vec_outer, *others, reg_outer]
    else:
        outer = []
        for index, loop in enumerate(spatial):
            outer.append(reg_outer if index == plan.reg_axis else vec_outer if index == plan.vec_axis else loop)
    if plan.row_bands > 1 and plan.band_axis in range(1, plan.n_spatial) \
            and plan.band_axis not in (plan.reg_axis, plan.vec_axis):
        # Bands of rows outermost (after the batch): the parallel loop then gives each core whole bands.
        rows = loop_extent(sch, spatial[plan.band_axis]) or 1
        band_outer, band_inner = sch.split(spatial[plan.band_axis], factors=[None, -(-rows // plan.row_bands)])
        outer = [outer[0], band_outer] + [band_inner if loop.same_as(spatial[plan.band_axis]) else loop
                                          for loop in outer[1:]]
    sch.reorder(*outer, *reduction, reg_inner, vec_inner)

    # Parallelise enough outer loops to give every core several chunks of work.
    cores = num_cores(target)
    n_par, work = 0, 1
    while n_par < len(outer) and work < cores * 4:
        work *= loop_extent(sch, outer[n_par]) or 1
        n_par += 1
    tile_loop = outer[-1]
    if n_par == len(outer):
        n_par -= 1  # keep the innermost outer loop serial: it anchors the epilogue
    if n_par >= 1 and cores > 1:
        fused = sch.fuse(*outer[:n_par]) if n_par > 1 else outer[0]
        sch.parallel(fused)

    if epilogue is not None:
        sch.reverse_compute_at(epilogue, tile_loop, preserve_unit_loops=True)
        epi_loops = sch.get_loops(epilogue)
        tile_depth = len(sch.get_loops(main)) - (plan.n_reduction + 2)
        inner = epi_loops[tile_depth:]
        if inner and loop_extent(sch, inner[-1]) == plan.vec_factor:
            sch.vectorize(inner[-1])

    sch.unroll(reg_inner)
    sch.vectorize(vec_inner)
    sch.decompose_reduction(main, reduction[0])
    for stage in later_stages:
        parallel_vectorize_nest(sch, stage, target)
