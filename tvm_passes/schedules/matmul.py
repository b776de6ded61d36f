"""CPU rule for matmul / dense / batch_matmul (``[B,] M, N += [B,] M, K * [B,] K, N``) with its epilogue.

Relax has no dense: ONNX Gemm / torch Linear become permute_dims + matmul + add.  With constant weights
FoldConstant pre-transposes the weight, so the kernel reads ``B[k, n]`` contiguously along ``n``; the
register tile is rows (``A[m, k]`` broadcast) x columns (one vector load of ``B`` feeds every row).  For
matrix-vector products (M = 1) the column tile is several vectors wide, giving independent accumulators.  The tile
sizes are plain arithmetic in :func:`tvm_passes.tile_plan.matmul_register_tile` (the latency predictors read
them too).
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.target import Target

from .base import CpuRule, product_loads, static_extents, summarize_blocks, vector_lanes
from ..tile_plan import matmul_register_tile, power_of_two_vector  # noqa: F401  (re-exported)
from .contraction import TilePlan, inline_side_producers, schedule_contraction


def find_matmul_block(sch: s_tir.Schedule) -> str | None:
    """Name of the single matmul-like block (any batch dims, then M, N spatial and one K reduction), or None."""
    blocks = summarize_blocks(sch)
    reductions = [summary for _, summary in blocks if summary.is_reduction]
    if len(reductions) != 1:
        return None
    kinds = reductions[0].iter_kinds
    if len(kinds) < 3 or kinds[-1] != "R" or any(kind != "S" for kind in kinds[:-1]):
        return None
    name = reductions[0].name
    block = sch.get(sch.get_sblock(name))
    if len(block.writes) != 1 or len(block.reads) < 2:
        return None
    if not isinstance(block.body, tirx.BufferStore) or not isinstance(block.body.value, tirx.Add):
        return None
    if not isinstance(block.body.value.b, tirx.Mul) and not isinstance(block.body.value.b, tirx.Cast):
        return None
    return name


def _row_axis(sch: s_tir.Schedule, name: str, n_spatial: int, extents: list[int]) -> int:
    """The spatial axis to register-tile: M, unless M is 1 and a batch axis does not index B.

    A batch of matrix-vector products against one shared matrix (e.g. an LSTM's hoisted input projection,
    ``[T, 1, K] x [K, N]``) is then tiled over the batch, so each vector load of B feeds several rows.
    """
    m_axis = n_spatial - 2
    if extents[m_axis] != 1:
        return m_axis
    block = sch.get(sch.get_sblock(name))
    column_var = block.iter_vars[n_spatial - 1].var
    product = block.body.value.b
    if not isinstance(product, tirx.Mul):
        return m_axis
    b_loads = [operand for operand in product_loads(product)
               if any(_uses(index, column_var) for index in operand.indices)]
    if len(b_loads) != 1:
        return m_axis
    for axis in range(m_axis - 1, -1, -1):
        batch_var = block.iter_vars[axis].var
        if extents[axis] > 1 and not any(_uses(index, batch_var) for index in b_loads[0].indices):
            return axis
    return m_axis


def _uses(expr: tirx.PrimExpr, var: tirx.Var) -> bool:
    return any(free.same_as(var) for free in tirx.analysis.undefined_vars(expr, []))


class Matmul(CpuRule):
    """Register-tiled, vectorised, parallel (batch) matmul with the epilogue computed per tile."""

    name = "matmul"

    def apply(self, func: tirx.PrimFunc, target: Target) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        name = find_matmul_block(sch)
        if name is None:
            return None
        loops = sch.get_loops(sch.get_sblock(name))
        extents = static_extents(sch, loops)
        if extents is None:
            return None
        n_spatial = len(extents) - 1
        reg_axis = _row_axis(sch, name, n_spatial, extents)
        rows, cols = extents[reg_axis], extents[n_spatial - 1]
        tile = matmul_register_tile(rows, cols, vector_lanes(target))
        if tile.gemv:
            # Matrix-vector product: the register tile is several vectors along the columns.
            plan = TilePlan(reg_axis=n_spatial - 1, reg_factor=tile.reg_factor, vec_axis=n_spatial - 1,
                            vec_factor=tile.vec_factor, n_spatial=n_spatial, n_reduction=1)
        else:
            plan = TilePlan(reg_axis=reg_axis, reg_factor=tile.reg_factor, vec_axis=n_spatial - 1,
                            vec_factor=tile.vec_factor, n_spatial=n_spatial, n_reduction=1, vec_outer_first=True)
        try:
            schedule_contraction(sch, name, plan, target)
        except s_tir.ScheduleError:
            # an epilogue reading a block computed before the matmul from another input (a mask): inline that
            # block first, then schedule again (kernels without one never get here, so their schedule is as it was)
            sch = s_tir.Schedule(func)
            if not inline_side_producers(sch, name):
                raise
            schedule_contraction(sch, name, plan, target)
        return sch
