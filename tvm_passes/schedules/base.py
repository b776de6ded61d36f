"""Shared pieces of hetpart's CPU schedule rules (DLight style).

A rule is an object with ``apply(func, target) -> tvm.s_tir.Schedule | None``: it inspects one PrimFunc
and either returns a schedule for it or ``None`` when the PrimFunc is not its kind of kernel.  Rules never
raise for kernels they do not understand; :func:`apply_first_rule` additionally catches schedule errors so a
rule bug degrades to "unscheduled" (with a warning) instead of breaking the build, and refuses a schedule whose
parallel loop has iterations reading each other's output (:mod:`.race_check`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.target import Target

from ..tile_plan import vector_lanes_for
from .race_check import parallel_write_conflicts

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


# Most expression nodes one compute_inline may add by copying its producer into several loads (inline_growth_nodes).
# The model zoo's largest such inline, an LSTM cell's tanh(c') with c' holding three fast activations, adds ~15,000;
# a third stacked fast activation adds ~85,000 (sigmoid(tanh(sigmoid(x))), Mish(Mish(x))) and each further one
# ~20-40x more.  Up to this bound the rules' kernels are unchanged, and the LSTM/GRU cells and single Mish
# activations that fuse into one kernel stay one loop nest.
MAX_INLINE_GROWTH_NODES = 32768


def product_loads(product: tirx.Mul) -> list[tvm.ir.TensorLoad]:
    """The buffer loads a multiply-accumulate multiplies, looking through a cast of either factor: a float16 conv
    or matmul summing in float32 (``tvm_passes.half_accumulate``) multiplies cast loads."""
    factors = [factor.value if isinstance(factor, tirx.Cast) else factor for factor in (product.a, product.b)]
    return [factor for factor in factors if isinstance(factor, tvm.ir.TensorLoad)]


def expr_tree_nodes(expr: tvm.ir.Expr, limit: int) -> int:
    """Size of ``expr`` counted as a tree: every use of a shared sub-expression counts, as it does once a
    schedule substitutes it (compute_inline copies the producer's value into each load).  Operations,
    constants, variables and loads count (a load's buffer variable too, its type does not).  The walk stops
    after ``limit + 1`` nodes, so measuring a huge expression costs no more than measuring one just over
    the limit.
    """
    count = 0

    def on_expr(_node: tvm.ir.Expr) -> tvm_ffi.VisitInterrupt | None:
        nonlocal count
        count += 1
        return tvm_ffi.VisitInterrupt(count) if count > limit else None

    tvm_ffi.structural_walk(expr, [(tvm.ir.Type, lambda _type: tvm_ffi.WalkResult.SKIP), (tvm.ir.Expr, on_expr)],
                            order="pre")
    return count


def _buffer_of(access: object) -> object:
    """The buffer variable a load, store or access region refers to (``.source`` in TVM 0.27, ``.buffer`` before)."""
    source = getattr(access, "source", None)
    return source if source is not None else access.buffer


def count_loads(stmt: tirx.Stmt, buffer: object, limit: int) -> int:
    """Number of loads of ``buffer`` in ``stmt`` counted as a tree, stopping after ``limit + 1``."""
    count = 0

    def on_load(load: tvm.ir.TensorLoad) -> tvm_ffi.VisitInterrupt | None:
        nonlocal count
        if _buffer_of(load).same_as(buffer):
            count += 1
            if count > limit:
                return tvm_ffi.VisitInterrupt(count)
        return None

    tvm_ffi.structural_walk(stmt, (tvm.ir.TensorLoad, on_load))
    return count


def inline_growth_nodes(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, limit: int) -> int:
    """Expression nodes that compute_inline of ``block`` would add beyond moving its value once.

    Inlining copies the producer's value into every load of its buffer in its consumers, so the kernel grows
    by ``(loads - 1) * size(value)``: 0 for a block read once.  The result is exact up to ``limit`` and some
    number above ``limit`` otherwise; either way the walks stop after about ``limit`` nodes.  A block that is
    not a single store (compute_inline rejects it anyway) counts as 0.
    """
    producer = sch.get(block)
    store = producer.body
    if not isinstance(store, tirx.BufferStore) or len(producer.writes) != 1:
        return 0
    written = _buffer_of(producer.writes[0])
    loads = 0
    for consumer in sch.get_consumers(block):
        loads += count_loads(sch.get(consumer).body, written, limit + 1 - loads)
        if loads > limit + 1:
            break
    if loads <= 1:
        return 0
    copies = loads - 1
    return copies * max(1, expr_tree_nodes(store.value, limit // copies))


def _writes_any(block: tirx.stmt.SBlock, buffers: list) -> bool:
    return any(_buffer_of(region).same_as(buffer) for region in block.writes for buffer in buffers)


def inline_injective_producers(sch: s_tir.Schedule, keep: set[str], max_growth_nodes: int | None = None) -> set[str]:
    """compute_inline every spatial block not in ``keep`` that can be inlined (padding, transposes, casts).

    Blocks that cannot be inlined (e.g. they are outputs, or read non-trivially) are left where they are, and
    so is a block whose inlining would add more than ``max_growth_nodes`` expression nodes
    (:func:`inline_growth_nodes`): a block read once is always inlined, a small one (a clamp, a negation) may
    be copied into many loads, but a large value read several times stays a materialised stage.  Without
    that bound a chain of producers each read k times (TVM's fast tanh reads its input 19 times, fast exp
    40 times) grows as k^n: four fused sigmoid/tanh ops made a 20-million-character kernel that took four
    minutes and 2.3 GB to compile, and longer chains exhaust the host's memory.  Materialising costs one
    store and load per element; the duplicated copies were computed once anyway after common-subexpression
    elimination, so run times stay the same. Returns the names of the blocks kept materialised by the bound.
    """
    if max_growth_nodes is None:
        max_growth_nodes = MAX_INLINE_GROWTH_NODES
    too_large: set[str] = set()  # growth never shrinks as inlining proceeds, so a rejected block stays rejected
    parameters = list(sch.mod["main"].params)
    changed = True
    while changed:  # a pass in program order inlines whole chains; repeat while a pass still inlines something
        changed = False
        for block_rv, summary in summarize_blocks(sch):
            if summary.name in keep or summary.name in too_large or summary.is_reduction:
                continue
            if _writes_any(sch.get(block_rv), parameters):
                continue   # a block storing into a parameter is an output: compute_inline refuses it, slowly
            growth = inline_growth_nodes(sch, block_rv, max_growth_nodes)
            if growth > max_growth_nodes:
                logger.debug("block %s stays materialised: inlining it would add over %d expression nodes",
                             summary.name, max_growth_nodes)
                too_large.add(summary.name)
                continue
            try:
                sch.compute_inline(block_rv)
                changed = True
            except RuntimeError:
                continue
    return too_large


def is_hand_written(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` is one opaque block written by TOPI's ir_builder or ``te.extern`` (a scan loop, a call into
    ``tvm.contrib.sort``) rather than a tree of compute blocks under a root block: no rule can schedule it."""
    body = func.body
    return isinstance(body, s_tir.SBlockRealize) and body.block.name_hint != "root"


def apply_first_rule(func: tirx.PrimFunc, target: Target, rules: list[CpuRule]) -> tirx.PrimFunc | None:
    """Schedule ``func`` with the first rule that applies and succeeds; None when none does (or ``func`` is
    :func:`is_hand_written`: it keeps the loops it was written with)."""
    if is_hand_written(func):
        return None
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
        conflicts = parallel_write_conflicts(scheduled)
        if conflicts:
            logger.warning("CPU rule %s made a parallel loop whose iterations read each other's output (%s); trying the "
                           "next rule", rule.name, "; ".join(conflicts[:3]))
            continue
        return scheduled.with_attr(SCHEDULED_ATTR, True).with_attr(RULE_ATTR, rule.name)
    return None
