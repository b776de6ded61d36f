"""CPU rule for sliding-window reductions: max and average pooling (1-D, 2-D, 3-D, NCHW-like layouts).

TOPI legalizes a pool into a padding block (when the pool pads, or rounds its output up), one reduction block
``out[n, c, oh, ow] = max/sum over (rh, rw) of in[n, c, oh*s + rh, ow*s + rw]`` and, for average pooling, a
division block.  The row-reduction rule ran it as one parallel loop over every output element, the padding
inlined as a bounds test on every load and each element's indices recovered by division from the fused loop.
On a 2-core Zen 4 guest that ran 3-8x behind onnxruntime's pooling (SqueezeNet's three pools: 774 against 133 us).

This rule runs the output planes in parallel (every leading loop that is not a window axis, e.g. batch and
channel) and materialises the padded input of one plane at a time inside the parallel loop, so the window loops
read it without a bounds test; epilogues (the average's division, fused activations) run per plane too.  When
the planes are too few to keep every core busy, the output rows join the parallel loop.  The window stays the
innermost loop: moving it outside the output row (so the inner loop walks a row) measured slower for 2x2/3x3
windows of stride 2, whose row loop then reads every other element.
"""

from __future__ import annotations

import tvm_ffi
from tvm import s_tir, tirx
from tvm.target import Target

from .base import CpuRule, num_cores, static_extents, summarize_blocks

# The window (product of the reduction loops' extents) above which a reduction is not taken for a pool but left to
# the row-reduction rule, whatever its indices. YOLO's spatial pyramid pools reach 13x13 = 169.
MAX_WINDOW_ELEMENTS = 1024
# Parallel chunks per core below which output rows join the parallel loop (load balance across cores).
MIN_CHUNKS_PER_CORE = 4
# Iterations (outputs x window) below which a parallel launch costs more than it saves.
MIN_PARALLEL_WORK = 4096


def _vars_in(expr: tirx.PrimExpr) -> set:
    found: set = set()
    tvm_ffi.structural_walk(expr, (tirx.Var, found.add))
    return found


def _windowed_spatial_positions(block: tirx.stmt.SBlock) -> list[int] | None:
    """Positions (among the block's spatial iterators) of the window axes: spatial iterators that some read
    indexes together with a reduction iterator (``oh*s + rh``). None when the block reads no such index, or when
    some read indexes a reduction iterator alone (a convolution's input channels or weight taps, not a pool)."""
    spatial = [iv.var for iv in block.iter_vars if int(iv.iter_type) == 0]
    reduction = {iv.var for iv in block.iter_vars if int(iv.iter_type) == 2}
    windowed: set[int] = set()
    for region in block.reads:
        for index_range in region.region:
            used = _vars_in(index_range.min)
            if used & reduction:
                positions = {i for i, var in enumerate(spatial) if var in used}
                if not positions:
                    return None
                windowed |= positions
    return sorted(windowed) or None


class Pooling(CpuRule):
    """Schedules PrimFuncs made of one sliding-window reduction plus spatial producers (padding) and
    consumers (division, activations)."""

    name = "pooling"

    def apply(self, func: tirx.PrimFunc, target: Target) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        blocks = summarize_blocks(sch)
        reductions = [(rv, summary) for rv, summary in blocks if summary.is_reduction]
        if len(reductions) != 1 or any("O" in summary.iter_kinds for _, summary in blocks):
            return None
        block_rv, summary = reductions[0]
        kinds = summary.iter_kinds
        spatial_count = kinds.count("S")
        if kinds != ("S",) * spatial_count + ("R",) * (len(kinds) - spatial_count) or spatial_count < 2:
            return None
        loops = sch.get_loops(block_rv)
        if len(loops) != len(kinds):
            return None
        extents = static_extents(sch, loops)
        if extents is None:
            return None
        window = 1
        for extent in extents[spatial_count:]:
            window *= extent
        if window > MAX_WINDOW_ELEMENTS:
            return None
        windowed = _windowed_spatial_positions(sch.get(block_rv))
        # The innermost output axis must be a window axis (NCHW-like), and some leading axis must not be: the
        # planes (the axes before the first window axis) then read disjoint inputs and run in parallel.
        if windowed is None or windowed[-1] != spatial_count - 1 or windowed[0] == 0:
            return None
        block_position = next(i for i, (rv, _) in enumerate(blocks) if rv.same_as(block_rv))
        producers = [rv for rv, _ in blocks[:block_position]]
        consumers = [rv for rv, _ in blocks[block_position + 1:]]

        spatial_loops = loops[:spatial_count]
        first_window = windowed[0]
        planes = 1
        for extent in extents[:first_window]:
            planes *= extent
        parallel_count = first_window
        if planes < MIN_CHUNKS_PER_CORE * num_cores(target) and first_window < spatial_count - 1:
            parallel_count += 1   # too few planes to balance the cores: output rows run in parallel too
        outer = sch.fuse(*spatial_loops[:parallel_count]) if parallel_count > 1 else spatial_loops[0]
        work = window
        for extent in extents[:spatial_count]:
            work *= extent
        if num_cores(target) > 1 and work >= MIN_PARALLEL_WORK and (static_extents(sch, [outer]) or [1])[0] > 1:
            sch.parallel(outer)
        for producer in reversed(producers):
            sch.compute_at(producer, outer, preserve_unit_loops=True)
        for consumer in consumers:
            sch.reverse_compute_at(consumer, outer, preserve_unit_loops=True)
        return sch
