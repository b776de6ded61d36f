"""Shared pieces of hetpart's CPU schedule rules (DLight style).

A rule is an object with ``apply(func, target) -> tvm.s_tir.Schedule | None``: it inspects one PrimFunc
and either returns a schedule for it or ``None`` when the PrimFunc is not its kind of kernel.  Rules never
raise for kernels they do not understand; :func:`apply_first_rule` additionally catches schedule errors so a
rule bug degrades to "unscheduled" (with a warning) instead of breaking the build.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from tvm import s_tir, tirx
from tvm.target import Target

from ..tile_plan import vector_lanes_for

logger = logging.getLogger(__name__)

SCHEDULED_ATTR = "tirx.is_scheduled"
RULE_ATTR = "hetpart.cpu_rule"


class CpuRule:
    """Base class: a named rule that schedules one kind of PrimFunc for an llvm target."""

    name = "cpu_rule"

    def apply(self, func: tirx.PrimFunc, target: Target) -> s_tir.Schedule | None:
        """Return a schedule for ``func`` or None when this rule does not apply."""
        raise NotImplementedError


def vector_lanes(target: Target, dtype_bits: int = 32) -> int:
    """Number of elements of ``dtype_bits`` in one SIMD register of ``target`` (4 for generic x86-64)."""
    mcpu = str(target.attrs.get("mcpu", "")) if target.attrs is not None else ""
    mattr = [str(k) for k in target.attrs.get("mattr", [])] if target.attrs is not None else []
    return vector_lanes_for(mcpu, mattr, dtype_bits)


def num_cores(target: Target) -> int:
    """Cores to split parallel loops for: the target's ``num-cores``, else this host's CPU count.

    Deliberately not the TVM runtime's current thread count: that is 1 unless TVM_NUM_THREADS is set, and a
    schedule compiled once may run under a different thread setting.
    """
    declared = target.attrs.get("num-cores") if target.attrs is not None else None
    if declared:
        return max(1, int(declared))
    return max(1, os.cpu_count() or 1)


def loop_extent(sch: s_tir.Schedule, loop: s_tir.schedule.LoopRV) -> int | None:
    """Static extent of a loop, or None when it is symbolic."""
    extent = sch.get(loop).extent
    return int(extent.value) if isinstance(extent, tirx.IntImm) else None


def static_extents(sch: s_tir.Schedule, loops: list[s_tir.schedule.LoopRV]) -> list[int] | None:
    """Static extents of ``loops``, or None when any of them is symbolic."""
    extents = [loop_extent(sch, loop) for loop in loops]
    return None if any(extent is None for extent in extents) else extents


@dataclass(frozen=True)
class BlockSummary:
    """What a rule needs to know about one block: its name, iteration kinds and whether it reduces."""

    name: str
    iter_kinds: tuple[str, ...]  # "S" spatial, "R" reduction, "O" other

    @property
    def is_reduction(self) -> bool:
        return "R" in self.iter_kinds


def summarize_blocks(sch: s_tir.Schedule) -> list[tuple[s_tir.schedule.SBlockRV, BlockSummary]]:
    """Top-level blocks of the PrimFunc under the root, in program order, with their iteration kinds."""
    root = sch.get_sblock("root")
    result = []
    for block_rv in sch.get_child_blocks(root):
        block = sch.get(block_rv)
        kinds = []
        for iter_var in block.iter_vars:
            kind = int(iter_var.iter_type)
            kinds.append("S" if kind == 0 else ("R" if kind == 2 else "O"))
        result.append((block_rv, BlockSummary(block.name_hint, tuple(kinds))))
    return result


def inline_injective_producers(sch: s_tir.Schedule, keep: set[str]) -> None:
    """compute_inline every spatial block not in ``keep`` that can be inlined (padding, transposes, casts).

    Blocks that cannot be inlined (e.g. they are outputs, or read non-trivially) are left where they are.
    """
    changed = True
    while changed:
        changed = False
        for block_rv, summary in summarize_blocks(sch):
            if summary.name in keep or summary.is_reduction:
                continue
            try:
                sch.compute_inline(block_rv)
                changed = True
                break
            except RuntimeError:
                continue


def apply_first_rule(func: tirx.PrimFunc, target: Target, rules: list[CpuRule]) -> tirx.PrimFunc | None:
    """Schedule ``func`` with the first rule that applies and succeeds; None when none does."""
    for rule in rules:
        try:
            sch = rule.apply(func, target)
        except (RuntimeError, ValueError, IndexError, AssertionError) as err:
            first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            logger.warning("CPU rule %s failed on a PrimFunc (%s); trying the next rule", rule.name, first_line)
            logger.debug("full error of CPU rule %s: %s", rule.name, err)
            continue
        if sch is None:
            continue
        scheduled = sch.mod["main"]
        return scheduled.with_attr(SCHEDULED_ATTR, True).with_attr(RULE_ATTR, rule.name)
    return None
