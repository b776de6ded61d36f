"""CPU rule for injective kernels (elementwise, broadcast, transpose, reshape, pad; concat has its own rule).

Every block is spatial.  Producers are inlined into the output block where possible; the output loop nest
is split into parallel leading loops and a vectorised trailing loop (see parallel_vectorize_nest).
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.target import Target

from .base import (CpuRule, inline_injective_producers, loop_extent, num_cores, static_extents,
                   summarize_blocks, vector_lanes)

MIN_PARALLEL_ELEMENTS = 4096  # below this a parallel launch costs more than it saves (~1-3 us/launch)


INNER_TARGET_ELEMENTS = 64  # fuse trailing dimensions until the inner loop has at least this many elements


def parallel_vectorize_nest(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, target: Target) -> None:
    """Parallelise the block's leading loops and vectorise its trailing ones.

    The trailing loops are fused until the inner extent reaches INNER_TARGET_ELEMENTS (for NCHW that is
    H*W, so per-channel operands such as a bias stay scalar inside the vector loop).  The inner loop is
    split to SIMD lanes and vectorised when its extent is a multiple of the lane count; otherwise it is left
    as one serial loop that LLVM's loop vectoriser handles with a scalar tail (TVM would scalarise a
    predicated vector loop).  The fused leading loops run in parallel when the nest is large enough.
    """
    loops = sch.get_loops(block)
    if not loops:
        return
    extents = static_extents(sch, loops)
    if extents is None:
        return
    split_at, inner_elements = len(loops), 1
    while split_at > 0 and inner_elements < INNER_TARGET_ELEMENTS:
        split_at -= 1
        inner_elements *= extents[split_at]
    inner = sch.fuse(*loops[split_at:]) if len(loops) - split_at > 1 else loops[split_at]
    outer_loops = loops[:split_at]
    lanes = vector_lanes(target)
    total = inner_elements
    for extent in extents[:split_at]:
        total *= extent
    if inner_elements % lanes == 0 and inner_elements >= lanes:
        inner_outer, vec = sch.split(inner, factors=[None, lanes])
        sch.vectorize(vec)
        if not outer_loops:
            outer_loops = [inner_outer]
    if total >= MIN_PARALLEL_ELEMENTS and num_cores(target) > 1 and outer_loops:
        fused = sch.fuse(*outer_loops) if len(outer_loops) > 1 else outer_loops[0]
        if (loop_extent(sch, fused) or 1) > 1:
            sch.parallel(fused)


class Elementwise(CpuRule):
    """Schedules PrimFuncs whose blocks are all spatial (no reduction)."""

    name = "elementwise"

    def apply(self, func: tirx.PrimFunc, target: Target) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        blocks = summarize_blocks(sch)
        if not blocks or any(summary.is_reduction for _, summary in blocks):
            return None
        if any("O" in summary.iter_kinds for _, summary in blocks):
            return None
        inline_injective_producers(sch, keep=set())
        for block_rv, _ in summarize_blocks(sch):
            parallel_vectorize_nest(sch, block_rv, target)
        return sch
