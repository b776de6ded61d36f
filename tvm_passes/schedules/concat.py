"""CPU rule for concatenations (and the elementwise epilogue fused into them, e.g. DenseNet's concat+BN+ReLU).

TOPI writes ``concat(x_0, ..., x_k)`` along axis ``a`` as one block whose value is a chain of
``if_then_else(offset_k <= v_a, x_k[v_a - offset_k], ...)``. The generic elementwise schedule keeps that chain
inside the innermost loop: every element walks up to k comparisons, and the selects between different buffers
keep the loop from being vectorised (a fused BatchNorm then pays a scalar divide per element). Measured on this
2-core EPYC, DenseNet-121's 25-input concat+BN+ReLU (1x1024x14x14) took 214 µs, 50x its memory traffic.

This rule partitions the concat axis's loop at the segment boundaries (``Schedule.loop_partition``): within one
partition the condition is known, TVM's simplifier removes the chain, and each partition is a plain copy (plus
epilogue) that LLVM vectorises. Loops after the concat axis are fused into one contiguous inner run, split
into a few chunks so that one parallel loop -- over the leading axes and the chunks -- encloses all partitions
(a parallel loop per partition would pay a thread-pool launch per input).

The segments are read from the block's read regions: input ``k`` is read at ``v_a - offset_k`` and covers
``[offset_k, offset_k + extent_k)``; the rule applies only when those segments tile the axis exactly.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx
from tvm.target import Target

from .base import CpuRule, inline_injective_producers, num_cores, static_extents, summarize_blocks, vector_lanes
from .elementwise import MIN_PARALLEL_ELEMENTS

MIN_SEGMENTS = 2
MIN_RUN_ELEMENTS = 128      # a chunk's contiguous run: whole vectors, or at least this long (see _chunks)
CHUNKS_PER_CORE = 2         # a few chunks per core balance the load without shortening the runs much


def concat_segments(block: tirx.stmt.SBlock, axis: int) -> list[tuple[int, int]] | None:
    """(offset, extent) of each input along ``axis`` if the block's reads tile the axis as a concat does."""
    var = block.iter_vars[axis].var
    extent = block.iter_vars[axis].dom.extent
    if not isinstance(extent, tirx.IntImm):
        return None
    segments = set()
    for region in block.reads:
        ranges = region.region
        if len(ranges) != len(block.iter_vars):
            continue
        start = ranges[axis].min
        length = region.source.shape[axis]
        if not isinstance(length, tirx.IntImm):
            continue
        if isinstance(start, tirx.Sub) and start.a.same_as(var) and isinstance(start.b, tirx.IntImm):
            segments.add((int(start.b.value), int(length.value)))
        elif start.same_as(var) and int(length.value) < int(extent.value):
            segments.add((0, int(length.value)))
    ordered = sorted(segments)
    if len(ordered) < MIN_SEGMENTS:
        return None
    position = 0
    for offset, length in ordered:
        if offset != position:
            return None
        position += length
    return ordered if position == int(extent.value) else None


def stack_segments(block: tirx.stmt.SBlock, axis: int) -> list[tuple[int, int]] | None:
    """One (index, 1) segment per input if the block is a ``stack`` along ``axis``.

    TOPI writes ``stack(x_0, ..., x_k)`` as ``if_then_else(v_a == k, x_k[...], if_then_else(v_a == k - 1, ...))``:
    the inputs lack the stacked axis, so their read regions say nothing about it; the conditions do. The chain
    must test every index but one (the final else) for equality with the axis variable."""
    var = block.iter_vars[axis].var
    extent = block.iter_vars[axis].dom.extent
    if not isinstance(extent, tirx.IntImm) or not isinstance(block.body, tirx.BufferStore):
        return None
    value, points = block.body.value, set()
    while isinstance(value, tvm.ir.Call) and getattr(value.op, "name", "") in _IF_THEN_ELSE:
        condition, _, value = value.args
        if not (isinstance(condition, tirx.EQ) and condition.a.same_as(var) and isinstance(condition.b, tirx.IntImm)):
            return None
        points.add(int(condition.b.value))
    n = int(extent.value)
    if n < MIN_SEGMENTS or len(points) != n - 1 or not points <= set(range(n)):
        return None
    return [(k, 1) for k in range(n)]


_IF_THEN_ELSE = ("prim.if_then_else", "tir.if_then_else")


def _concat_axis(block: tirx.stmt.SBlock) -> tuple[int, list[tuple[int, int]]] | None:
    for find in (concat_segments, stack_segments):
        for axis in range(len(block.iter_vars)):
            segments = find(block, axis)
            if segments is not None:
                return axis, segments
    return None


def _chunks(inner_extent: int, outer_iterations: int, cores: int, vector_elements: int) -> int:
    """Largest useful number of chunks of the inner run: a divisor whose runs are whole vectors (of
    ``vector_elements``, the target's SIMD width for the output dtype) or at least MIN_RUN_ELEMENTS long (1 if none).

    Short runs are slow: a 49-element run is 3 vectors plus a scalar tail, while an unchunked plain concat copies
    each input's contiguous segment with one memcpy (LLVM IR of the 14x14 case: 5 memcpy calls unchunked; none,
    but 591 vector loads in 200 KB of loop code, with 4 chunks). Measured interleaved
    (TVM_NUM_THREADS=2, µs; chunk runs that must be whole vectors / at least 16 / 64 / 128 elements):
    GoogLeNet's concat to 1x512x14x14 6.5 / 52.9 / 11.7 / 6.6; to 1x480x28x28 29.4 / 21.2 / 20.8 / 21.2;
    DenseNet's concat+BN+ReLU to 1x384x28x28 30.5 / 18.4 / 17.9 / 17.8, to 1x768x14x14 16.8 / 13.9 / 16.4 / 16.2;
    SqueezeNet's 1x256x27x27 13.4 / 12.8 / 12.8 / 12.5."""
    wanted = max(1, -(-CHUNKS_PER_CORE * cores // max(1, outer_iterations)))
    best = 1
    for chunks in range(1, inner_extent + 1):
        run = inner_extent // chunks
        long_enough = run % vector_elements == 0 or run >= MIN_RUN_ELEMENTS
        if inner_extent % chunks == 0 and chunks <= wanted and long_enough:
            best = chunks
    return best


class Concat(CpuRule):
    """Schedules all-spatial PrimFuncs whose output block is a concatenation (see the module docstring)."""

    name = "concat"

    def apply(self, func: tirx.PrimFunc, target: Target) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        blocks = summarize_blocks(sch)
        if not blocks or any(s.is_reduction or "O" in s.iter_kinds for _, s in blocks):
            return None
        inline_injective_producers(sch, keep=set())
        blocks = summarize_blocks(sch)
        if len(blocks) != 1:
            return None
        block_rv = blocks[0][0]
        found = _concat_axis(sch.get(block_rv))
        loops = sch.get_loops(block_rv)
        extents = static_extents(sch, loops)
        if found is None or extents is None or len(loops) != len(sch.get(block_rv).iter_vars):
            return None
        axis, segments = found
        leading, concat_loop, trailing = loops[:axis], loops[axis], loops[axis + 1:]
        inner_extent = 1
        for extent in extents[axis + 1:]:
            inner_extent *= extent
        outer_iterations = 1
        for extent in extents[:axis]:
            outer_iterations *= extent
        total = outer_iterations * extents[axis] * inner_extent
        cores = num_cores(target)
        outer = list(leading)
        if trailing:
            inner = sch.fuse(*trailing) if len(trailing) > 1 else trailing[0]
            lanes = vector_lanes(target, sch.get(block_rv).writes[0].source.dtype.bits)
            chunks = _chunks(inner_extent, outer_iterations, cores, lanes) if total >= MIN_PARALLEL_ELEMENTS else 1
            if chunks > 1:
                chunk_loop, inner = sch.split(inner, factors=[chunks, None])
                outer.append(chunk_loop)
            sch.reorder(*outer, concat_loop, inner)
        if outer and total >= MIN_PARALLEL_ELEMENTS and cores > 1:
            fused = sch.fuse(*outer) if len(outer) > 1 else outer[0]
            sch.parallel(fused)
        sch.loop_partition(concat_loop, [length for _, length in segments[:-1]] + [None])
        return sch
