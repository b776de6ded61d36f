"""CPU rule for NCHW conv2d (1x1, 3x3, strided, dilated, depthwise/grouped) with its fused epilogue.

Recognises a block with iterators ``SSSSRRR`` (n, f, y, x; rc, ry, rx) whose output is 4-D, as TOPI's
``conv2d_nchw`` / ``group_conv2d_nchw`` legalisation produces.  Register tile: output channels (the weight
is a scalar broadcast per channel) x output columns (one vector load of the input row feeds every channel
of the tile).  See :mod:`.contraction` for the loop structure and :func:`tvm_passes.tile_plan.conv_register_tile`
for the tile sizes.
"""

from __future__ import annotations

import math

import tvm
from tvm import s_tir, tirx
from tvm.target import Target

from .base import CpuRule, num_cores, product_loads, static_extents, summarize_blocks, vector_lanes
from ..tile_plan import column_vector_factor  # noqa: F401  (re-exported)
from ..tile_plan import conv_register_tile, conv_row_bands
from .contraction import TilePlan, schedule_contraction


def find_conv_block(sch: s_tir.Schedule) -> str | None:
    """Name of the single NCHW conv-like block (SSSSRRR), or None."""
    blocks = summarize_blocks(sch)
    reductions = [summary for _, summary in blocks if summary.is_reduction]
    if len(reductions) != 1 or reductions[0].iter_kinds != ("S", "S", "S", "S", "R", "R", "R"):
        return None
    name = reductions[0].name
    block = sch.get(sch.get_sblock(name))
    if len(block.writes) != 1 or len(block.reads) < 2 or len(sch.get_loops(sch.get_sblock(name))) != 7:
        return None
    if not isinstance(block.body, tirx.BufferStore) or not isinstance(block.body.value, tirx.Add):
        return None
    return name


def weight_is_channel_innermost(sch: s_tir.Schedule, name: str) -> bool:
    """True when the conv block's weight operand is indexed ``[..., f]`` (layout IHWO from prepacking)."""
    block = sch.get(sch.get_sblock(name))
    out_channel = block.iter_vars[1].var
    product = block.body.value.b
    if not isinstance(product, tirx.Mul):
        return False
    loads = product_loads(product)
    for load in loads:
        uses_channel = [
            index.same_as(out_channel) for index in load.indices
        ]
        if any(uses_channel):
            return bool(uses_channel[-1]) and sum(uses_channel) == 1
    return False


class Conv2dNCHW(CpuRule):
    """Register-tiled, vectorised, parallel NCHW conv2d with the epilogue computed per tile."""

    name = "conv2d_nchw"

    def apply(self, func: tirx.PrimFunc, target: Target) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        name = find_conv_block(sch)
        if name is None:
            return None
        loops = sch.get_loops(sch.get_sblock(name))
        extents = static_extents(sch, loops)
        if extents is None:
            return None
        lanes = vector_lanes(target)
        tile = conv_register_tile(out_channels=extents[1], out_width=extents[3],
                                  reduction=extents[4] * extents[5] * extents[6],
                                  channel_innermost_weights=weight_is_channel_innermost(sch, name), lanes=lanes)
        # Vectors over output channels (IHWO weights) x unrolled output columns, or the transpose.
        reg_axis, vec_axis = (3, 1) if tile.over_channels else (1, 3)
        grouped = _is_grouped(sch, name)
        operands = None if grouped else operand_bytes(sch, name)
        bands = 1 if operands is None else conv_row_bands(batch=extents[0], out_rows=extents[2],
                                                          input_bytes=operands[0], weight_bytes=operands[1],
                                                          cores=num_cores(target))
        plan = TilePlan(reg_axis=reg_axis, reg_factor=tile.reg_factor, vec_axis=vec_axis, vec_factor=tile.vec_factor,
                        n_spatial=4, n_reduction=3, row_bands=bands)
        conv = sch.get_sblock(name)
        schedule_contraction(sch, name, plan, target)
        if grouped:
            _pad_per_channel_tile(sch, conv)
        return sch


def operand_bytes(sch: s_tir.Schedule, name: str) -> tuple[int, int] | None:
    """(bytes of one sample of the input as the conv block reads it, bytes of its weights), or None when the
    multiply does not read two buffers directly. The input is the operand indexed by the batch; padded convs read
    the pad stage's output."""
    block = sch.get(sch.get_sblock(name))
    product = block.body.value.b
    if not isinstance(product, tirx.Mul):
        return None
    loads = product_loads(product)
    batch = block.iter_vars[0].var
    data = [load for load in loads if load.indices and load.indices[0].same_as(batch)]
    weights = [load for load in loads if not (load.indices and load.indices[0].same_as(batch))]
    if len(loads) != 2 or len(data) != 1 or len(weights) != 1:
        return None

    def size(load: tvm.ir.TensorLoad, skip: int) -> int | None:
        dims = [int(d) if isinstance(d, tirx.IntImm) else None for d in load.source.shape[skip:]]
        if any(d is None for d in dims):
            return None
        return math.prod(dims) * tvm.DataType(load.source.dtype).bits // 8

    sizes = size(data[0], 1), size(weights[0], 0)
    return None if None in sizes else (int(sizes[0]), int(sizes[1]))


def _is_grouped(sch: s_tir.Schedule, name: str) -> bool:
    """Grouped/depthwise: the reduction covers fewer input channels than the data tensor (the operand indexed by the
    batch) has. The weights do not count: prepacked (IHWO) weights hold the kernel height in their second axis."""
    block = sch.get(sch.get_sblock(name))
    product = block.body.value.b
    if not isinstance(product, tirx.Mul):
        return False
    reduced_channels = int(block.iter_vars[4].dom.extent)
    batch = block.iter_vars[0].var
    loads = [op for op in product_loads(product) if len(op.indices) == 4 and op.indices[0].same_as(batch)]
    data_channels = [int(load.source.shape[1]) for load in loads]
    return bool(data_channels) and reduced_channels < max(data_channels)


def _pad_per_channel_tile(sch: s_tir.Schedule, conv: s_tir.schedule.SBlockRV) -> None:
    """Grouped convs: compute the padding inside the conv's outer (parallel) loop, per channel tile.

    Each tile then pads only its own channels while they are hot in cache, in parallel with the
    convolution; as a separate stage, padding took ~60% of a depthwise conv's time (0.26 of 0.42 ms).
    """
    producers = sch.get_producers(conv)
    outer = sch.get_loops(conv)[0]
    for producer in producers:
        if sch.get(producer).name_hint.startswith("pad"):
            sch.compute_at(producer, outer, preserve_unit_loops=True)
