"""CPU rule for kernels made of several reduction/spatial blocks over rows (softmax, layer norm, mean, sum).

Injective producers (e.g. ``exp`` inside softmax, casts, the subtract-mean inside a norm) are inlined into
their consumers where TVM allows it.  Each remaining block then gets its leading spatial loops (the ones
outside every reduction loop) fused and run in parallel, and its innermost loop vectorised when it is a
spatial loop whose extent divides the vector width.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.target import Target

from .base import (CpuRule, inline_injective_producers, loop_extent, num_cores, static_extents,
                   summarize_blocks, vector_lanes)

MIN_PARALLEL_WORK = 4096  # iterations (spatial x reduction) below which a parallel region does not pay


def _iter_kind_of_loops(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> list[str] | None:
    """Per loop, 'S' or 'R', for an unscheduled block whose loops map one-to-one onto its block iters.

    Legalized TOPI kernels have exactly this shape; anything else returns None (rule does not apply).
    """
    loops = sch.get_loops(block)
    block_stmt = sch.get(block)
    if len(loops) != len(block_stmt.iter_vars):
        return None
    return ["R" if int(iv.iter_type) == 2 else "S" for iv in block_stmt.iter_vars]


def parallelize_outer_spatial(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, target: Target) -> bool:
    """Parallelise the block's leading spatial loops; vectorise an innermost spatial loop. True if changed."""
    loops = sch.get_loops(block)
    if not loops:
        return False
    kinds = _iter_kind_of_loops(sch, block)
    if kinds is None:
        return False
    extents = static_extents(sch, loops)
    if extents is None:
        return False
    changed = False
    lanes = vector_lanes(target)
    if kinds[-1] == "S" and len(loops) > 1 and extents[-1] % lanes == 0 and "R" not in kinds:
        _, vec = sch.split(loops[-1], factors=[None, lanes])
        sch.vectorize(vec)
        changed = True
        loops = sch.get_loops(block)
    lead = 0
    while lead < len(kinds) and kinds[lead] == "S" and lead < len(loops) - (1 if changed else 0):
        lead += 1
    if lead == 0:
        return changed
    total = 1
    for extent in extents:
        total *= extent
    outer = sch.fuse(*loops[:lead]) if lead > 1 else loops[0]
    outer_extent = loop_extent(sch, outer)
    if total >= MIN_PARALLEL_WORK and num_cores(target) > 1 and outer_extent and outer_extent > 1:
        sch.parallel(outer)
        changed = True
    return changed


class RowReduction(CpuRule):
    """Schedules PrimFuncs that contain reduction blocks but no multiply-accumulate contraction."""

    name = "row_reduction"

    def apply(self, func: tirx.PrimFunc, target: Target) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        blocks = summarize_blocks(sch)
        if not any(summary.is_reduction for _, summary in blocks):
            return None
        if any("O" in summary.iter_kinds for _, summary in blocks):
            return None  # opaque iterators: no safe way to tell which loops are parallel
        keep = {summary.name for _, summary in blocks if summary.is_reduction}
        inline_injective_producers(sch, keep=keep)
        changed = False
        for block_rv, _ in summarize_blocks(sch):
            changed |= parallelize_outer_spatial(sch, block_rv, target)
        return sch if changed else None
