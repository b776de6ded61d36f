"""A scheduled kernel's parallel loop must not read what its other iterations write: a check on every rule's result.

A rule that moves a block under a parallel loop (``compute_at``, ``reverse_compute_at``) without narrowing the block
to the loop's iteration leaves every iteration computing the block's whole output. Where that block reads only data
made before the loop (a padded input, a packed weight), every iteration writes the same values: redundant but
correct. Where it reads what the loop's iterations make one part each, it reads parts other threads have not written
yet, and the kernel returns wrong numbers. TVM checks a loop's blocks when the loop is made parallel, not when blocks
are moved into it later, so such a schedule builds and runs. Seen: the pooling rule took a 1-D convolution followed
by an unfolded batch norm; the norm's stages, moved under the channel loop, read every channel of the convolution's
output in every iteration, and the output was off by a factor of 1e8.

:func:`parallel_write_conflicts` walks each parallel loop's body, tracking which variables differ between its
iterations (the loop variable, block variables and loops bound to it), and reports every buffer that the loop both
writes per iteration (a store whose indices vary) and reads or writes the same way in every iteration (indices that
do not vary, outside a branch or predicate that does). Buffers allocated inside the loop are each iteration's own.
It reads the stores and loads themselves, not the blocks' declared regions, which TVM widens to whole buffers after
some primitives (``loop_partition``). ``apply_first_rule`` refuses a rule's schedule with a conflict and tries the
next rule.
"""
from __future__ import annotations

from typing import Any

import tvm
import tvm_ffi
from tvm import s_tir, tirx

__all__ = ["parallel_write_conflicts"]


def _vars_of(node: Any) -> set:
    found: set = set()
    tvm_ffi.structural_walk(node, (tirx.Var, found.add))
    return found


def _loads_of(node: Any) -> list[Any]:
    found: list[Any] = []
    tvm_ffi.structural_walk(node, (tvm.ir.TensorLoad, found.append))
    return found


def _children(stmt: Any) -> list[Any]:
    """The statements directly nested in ``stmt`` (loops, sequences, blocks, branches, attributes, lets)."""
    if isinstance(stmt, tirx.SeqStmt):
        return list(stmt.seq)
    if isinstance(stmt, s_tir.SBlockRealize):
        block = stmt.block
        return [block.body] + ([block.init] if block.init is not None else [])
    if isinstance(stmt, tirx.IfThenElse):
        return [stmt.then_case] + ([stmt.else_case] if stmt.else_case is not None else [])
    body = getattr(stmt, "body", None)
    return [body] if isinstance(body, tirx.Stmt) else []


class _Accesses:
    """One parallel loop's buffer accesses, split by whether their indices differ between its iterations."""

    def __init__(self, local: set):
        self.local = local
        self.per_iteration: dict[str, Any] = {}     # buffer name -> buffer, stored with varying indices
        self.alike: dict[str, str] = {}             # buffer name -> the first block reading/writing it alike
        self.block = "root"                         # the innermost block entered, for the messages

    def visit(self, stmt: Any, varying: frozenset) -> None:
        if isinstance(stmt, tirx.For):
            if (_vars_of(stmt.min) | _vars_of(stmt.extent)) & varying:
                varying = varying | {stmt.loop_var}
        elif isinstance(stmt, tirx.IfThenElse) and _vars_of(stmt.condition) & varying:
            return          # only some iterations run it
        elif isinstance(stmt, s_tir.SBlockRealize):
            if _vars_of(stmt.predicate) & varying:
                return
            block = stmt.block
            varying = varying | {iv.var for iv, value in zip(block.iter_vars, stmt.iter_values)
                                 if _vars_of(value) & varying}
            self.block = block.name_hint
        elif isinstance(stmt, (tirx.LetStmt, tirx.Bind)) and _vars_of(stmt.value) & varying:
            varying = varying | {stmt.var}
        elif isinstance(stmt, tirx.BufferStore):
            self._access(stmt.buffer, stmt.indices, varying, store=True)
            for load in _loads_of(stmt.value) + [load for index in stmt.indices for load in _loads_of(index)]:
                self._access(load.source, load.indices, varying, store=False)
            return
        for child in _children(stmt):
            self.visit(child, varying)

    def _access(self, buffer: Any, indices: Any, varying: frozenset, store: bool) -> None:
        if any(buffer.same_as(own) for own in self.local):
            return
        varies = any(_vars_of(index) & varying for index in indices)
        if varies and store:
            self.per_iteration.setdefault(buffer.name, buffer)
        elif not varies:
            self.alike.setdefault(buffer.name, self.block)


def _allocated_under(stmt: Any) -> set:
    """Buffers allocated inside ``stmt`` (each iteration's scratch when ``stmt`` is a loop body)."""
    found: set = set()
    tvm_ffi.structural_walk(stmt, (s_tir.SBlockRealize, lambda r: found.update(r.block.alloc_buffers)))
    return found


def _parallel_loops(func: tirx.PrimFunc) -> list[tirx.For]:
    loops: list[tirx.For] = []

    def on_for(loop: tirx.For) -> None:
        one_iteration = isinstance(loop.extent, tirx.IntImm) and int(loop.extent) <= 1
        if int(loop.kind) == int(tirx.ForKind.PARALLEL) and not one_iteration:
            loops.append(loop)   # (a loop of one iteration has nothing to race with; TVM drops its variable)

    tvm_ffi.structural_walk(func.body, (tirx.For, on_for))
    return loops


def parallel_write_conflicts(func: tirx.PrimFunc) -> list[str]:
    """One line per buffer that a parallel loop of ``func`` writes one part per iteration and also reads or writes
    whole in every iteration (see the module docstring); empty when there is none."""
    conflicts: list[str] = []
    for loop in _parallel_loops(func):
        accesses = _Accesses(_allocated_under(loop.body))
        accesses.visit(loop.body, frozenset({loop.loop_var}))
        conflicts += [f"block {accesses.alike[name]} uses all of {name} in every iteration of parallel loop "
                      f"{loop.loop_var.name}, whose iterations write one part each"
                      for name in accesses.per_iteration if name in accesses.alike]
    return conflicts
