"""A GPU schedule rule that bounds what compute_inline may duplicate, for kernels DLight's rules would blow up.

DLight's GPU rules inline every injective producer into its consumers before they bind threads (``Fallback`` and the
reduction rules through ``try_inline``). A producer read k times is copied k times, so a fused chain of activations
each read many times grows as k^n: TVM's fast tanh reads its input 19 times, fast exp 40 times, and a fused chain of
four Mish or sigmoid/tanh activations becomes a kernel of millions of expression nodes that takes minutes and
gigabytes to compile (the CPU rules met the same; see :func:`.base.inline_injective_producers`).

:class:`BoundedInlineGpuRule` runs first among the GPU rules. It inlines as the CPU rules do, with the same bound
(:data:`.base.MAX_INLINE_GROWTH_NODES`), on a trial schedule; where nothing had to stay materialised it returns
``None`` and DLight's rules schedule the kernel exactly as before. Where some producer must stay materialised, it
keeps that schedule and maps every remaining block onto the GPU itself: its spatial loops fused and split into
``blockIdx.x`` x ``threadIdx.x`` (the target's threads per block), reduction loops kept serial inside each thread and
their initialisation split off. The kernel then runs as a few launches instead of one, each of a bounded size.
"""
from __future__ import annotations

import logging

from tvm import s_tir, tirx
from tvm.s_tir.dlight.gpu.base import GPUScheduleRule
from tvm.target import Target

from .base import inline_injective_producers, summarize_blocks

__all__ = ["BoundedInlineGpuRule"]

logger = logging.getLogger(__name__)

DEFAULT_THREADS_PER_BLOCK = 256


def _threads_per_block(target: Target) -> int:
    limit = target.attrs.get("max_num_threads") if target.attrs is not None else None
    return min(int(limit), DEFAULT_THREADS_PER_BLOCK) if limit is not None else DEFAULT_THREADS_PER_BLOCK


class BoundedInlineGpuRule(GPUScheduleRule):
    """See the module docstring. ``apply`` returns None for kernels DLight's own rules schedule safely."""

    def apply(self, func: tirx.PrimFunc, target: Target, _tunable: bool) -> s_tir.Schedule | None:  # noqa: D102
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        try:
            sch = s_tir.Schedule(func)
            summarize_blocks(sch)
        except (RuntimeError, ValueError, IndexError):    # no root block or not a static loop nest: not ours
            return None
        kept = inline_injective_producers(sch, keep=set())
        if not kept:
            return None
        logger.info("%s: %d producer(s) stay materialised on the GPU (inlining them would add over the bound)",
                    func.attrs["global_symbol"] if func.attrs and "global_symbol" in func.attrs else "kernel",
                    len(kept))
        threads = _threads_per_block(target)
        reductions = []
        for block_rv, summary in summarize_blocks(sch):
            loops = sch.get_loops(block_rv)
            if any(sch.get(loop).thread_binding is not None for loop in loops):
                continue
            if len(summary.iter_kinds) != len(loops):
                return None                         # loops and block axes do not correspond one to one
            spatial = [loop for loop, kind in zip(loops, summary.iter_kinds) if kind == "S"]
            serial = [loop for loop, kind in zip(loops, summary.iter_kinds) if kind != "S"]
            if not spatial:
                spatial = [sch.add_unit_loop(block_rv)]
            sch.reorder(*spatial, *serial)
            block_x, thread_x = sch.split(sch.fuse(*spatial), factors=[None, threads])
            sch.bind(block_x, "blockIdx.x")
            sch.bind(thread_x, "threadIdx.x")
            if serial and summary.is_reduction:
                reductions.append((block_rv, serial[0]))
        for block_rv, loop in reductions:
            sch.decompose_reduction(block_rv, loop)
        return sch
