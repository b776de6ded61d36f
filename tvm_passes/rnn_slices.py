"""Slices of an unrolled RNN layer's input along time, for input projections computed per slice.

``tvm_passes.rnn`` with ``RnnImportOptions(input_projection="per_slice")`` projects the input of every k steps
separately. :class:`InputSlices` gives it ``X[lo:hi]`` along the time axis. When ``X`` is the output sequence of an
RNN node converted per slice (registered here by :func:`register_sequence`), reached through layout ops only
(``expand_dims``, ``squeeze``, ``permute_dims``, a ``reshape`` that keeps the time axis as one dimension with the
same row-major prefix), the slice is rebuilt from the per-step outputs it holds: the same ops replayed on a
stack of ``hi - lo`` steps. Every element is the same value the full sequence holds at that position, so the
result is exact, and the projection of slice s reads only the steps of slice s of the layer below. Any other input
is cut with a ``strided_slice``.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from dataclasses import dataclass
from typing import Callable, Iterator

import tvm
from tvm import relax

from hetpart.errors import UsageError

_SEQUENCES_ATTR = "_hetpart_rnn_sequences"
_LAYOUT_OPS = ("relax.expand_dims", "relax.squeeze", "relax.permute_dims", "relax.reshape")
_MAX_CHAIN = 64

Emit = Callable[[relax.Expr, str], relax.Expr]

INPUT_PROJECTIONS = ("hoisted", "per_slice")


@dataclass(frozen=True)
class RnnImportOptions:
    """How the converters unroll: ``input_projection`` "hoisted" (one matmul over all steps, the default) or
    "per_slice" (one matmul per ``slice_steps`` steps; see the module docstring)."""

    input_projection: str = "hoisted"
    slice_steps: int = 1

    def __post_init__(self) -> None:
        if self.input_projection not in INPUT_PROJECTIONS:
            raise UsageError(f"input_projection must be one of {INPUT_PROJECTIONS}; found {self.input_projection!r}")
        if not isinstance(self.slice_steps, int) or isinstance(self.slice_steps, bool) or self.slice_steps < 1:
            raise UsageError(f"slice_steps must be a positive integer; found {self.slice_steps!r}")

    @property
    def is_default(self) -> bool:
        return self == RnnImportOptions()


_OPTIONS: contextvars.ContextVar[RnnImportOptions] = contextvars.ContextVar("hetpart_rnn_options",
                                                                           default=RnnImportOptions())


@contextlib.contextmanager
def rnn_import_options(options: RnnImportOptions | None) -> Iterator[RnnImportOptions]:
    """Convert the RNN nodes of the imports made inside this block with ``options`` (None: the defaults)."""
    token = _OPTIONS.set(options or RnnImportOptions())
    try:
        yield _OPTIONS.get()
    finally:
        _OPTIONS.reset(token)


def current_options() -> RnnImportOptions:
    """The options of the import running now (the defaults outside :func:`rnn_import_options`)."""
    return _OPTIONS.get()


MAX_STACK_INPUTS = 16   # per stack op: TOPI's stack is one select chain over its inputs (see stack_steps)


def stack_steps(emit: Emit, parts: list[relax.Expr], axis: int, what: str) -> relax.Expr:
    """``stack(parts, axis)`` written as a tree: stacks of at most :data:`MAX_STACK_INPUTS` consecutive parts,
    then concatenations of at most as many groups, exactly equal to the flat stack.

    TOPI computes ``stack`` (and ``concat``) of K inputs as one loop nest whose value is a K-deep ``if_then_else``
    chain, and every kernel argument adds checks to the kernel's entry. For the hundreds of per-step outputs of an
    unrolled recurrence that kernel dominated compile time: a 300-step GRU's output stack took 42 s to compile and
    emitted 1 MB of machine code, and with the last step's cell fused into it 94-100 s; its groups of 16 compile
    in about 2 s once (they share one compiled function), the concatenation of their outputs in about 4 s."""
    if len(parts) <= MAX_STACK_INPUTS:
        return emit(relax.op.stack(parts, axis=axis), what)
    level = [emit(relax.op.stack(parts[i:i + MAX_STACK_INPUTS], axis=axis), f"{what}_part")
             for i in range(0, len(parts), MAX_STACK_INPUTS)]
    while len(level) > MAX_STACK_INPUTS:
        level = [emit(relax.op.concat(level[i:i + MAX_STACK_INPUTS], axis=axis), f"{what}_part")
                 for i in range(0, len(level), MAX_STACK_INPUTS)]
    return emit(relax.op.concat(level, axis=axis), what)


@dataclass(frozen=True)
class StepSequence:
    """The output Y of a converted RNN node, kept as its per-step outputs.

    ``Y`` is ``stack(h_by_time[d], axis=time_axis)`` per direction d, then ``expand_dims`` (one direction) or
    ``stack`` (two) on ``dir_axis``; its own time axis is ``time_axis``."""

    var: relax.Var
    h_by_time: tuple[tuple[relax.Expr, ...], ...]   # per direction, per time position
    time_axis: int
    dir_axis: int

    def emit_slice(self, emit: Emit, lo: int, hi: int) -> relax.Expr:
        parts = [stack_steps(emit, list(h[lo:hi]), self.time_axis, "xin_dir") for h in self.h_by_time]
        if len(parts) == 1:
            return emit(relax.op.expand_dims(parts[0], self.dir_axis), "xin_y")
        return emit(relax.op.stack(parts, axis=self.dir_axis), "xin_y")


def register_sequence(bb: relax.BlockBuilder, sequence: StepSequence) -> None:
    """Remember ``sequence.var`` as a per-step sequence of this importer (its BlockBuilder)."""
    registry = getattr(bb, _SEQUENCES_ATTR, None)
    if registry is None:
        registry = {}
        setattr(bb, _SEQUENCES_ATTR, registry)
    registry[sequence.var.name] = sequence


def _registered(bb: relax.BlockBuilder, expr: relax.Expr) -> StepSequence | None:
    if not isinstance(expr, relax.Var):
        return None
    found = getattr(bb, _SEQUENCES_ATTR, {}).get(expr.name)
    return found if found is not None and found.var.same_as(expr) else None


def _shape(expr: relax.Expr) -> list[int] | None:
    try:
        dims = expr.ty.shape.values
    except (AttributeError, tvm.TVMError, ValueError):
        return None
    if not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
        return None
    return [int(d) for d in dims]


def _trace(bb: relax.BlockBuilder, x: relax.Expr) -> tuple[StepSequence, list[relax.Call]] | None:
    """The registered sequence ``x`` is made from, and the layout ops from it to ``x`` in order."""
    chain: list[relax.Call] = []
    expr = x
    for _ in range(_MAX_CHAIN):
        sequence = _registered(bb, expr)
        if sequence is not None:
            return sequence, chain[::-1]
        if isinstance(expr, relax.Var):
            bound = bb.lookup_binding(expr)
            if bound is None:
                return None
            expr = bound
        elif isinstance(expr, relax.TupleGetItem) and isinstance(expr.tuple_value, relax.Tuple):
            expr = expr.tuple_value.fields[expr.index]
        elif isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name in _LAYOUT_OPS:
            chain.append(expr)
            expr = expr.args[0]
        else:
            return None
    return None


@dataclass(frozen=True)
class _Step:
    """One layout op replayed on a slice: its output time axis and how to emit it for ``length`` steps."""

    time_axis: int
    emit: Callable[[Emit, relax.Expr, int], relax.Expr]


def _replay_step(call: relax.Call, t: int) -> _Step | None:
    """How ``call`` moves time axis ``t``, or None when slicing along it does not commute with ``call``."""
    in_shape, out_shape = _shape(call.args[0]), _shape(call)
    if in_shape is None or out_shape is None:
        return None
    name = call.op.name
    if name == "relax.permute_dims":
        axes = list(reversed(range(len(in_shape)))) if call.attrs.axes is None else [int(a) for a in call.attrs.axes]
        return _Step(axes.index(t), lambda emit, arg, n: emit(relax.op.permute_dims(arg, axes), "xin_perm"))
    if name == "relax.expand_dims":
        rank = len(out_shape)
        inserted = sorted(int(a) % rank for a in call.attrs.axis)
        kept = [p for p in range(rank) if p not in inserted]
        return _Step(kept[t], lambda emit, arg, n: emit(relax.op.expand_dims(arg, inserted), "xin_expand"))
    if name == "relax.squeeze":
        rank = len(in_shape)
        axes = ([p for p, d in enumerate(in_shape) if d == 1] if call.attrs.axis is None
                else [int(a) % rank for a in call.attrs.axis])
        if t in axes:
            return None
        return _Step(t - sum(1 for a in axes if a < t),
                     lambda emit, arg, n: emit(relax.op.squeeze(arg, axes), "xin_squeeze"))
    if name == "relax.reshape":
        prefix = math.prod(in_shape[:t])
        for q, dim in enumerate(out_shape):
            if dim == in_shape[t] and math.prod(out_shape[:q]) == prefix:
                def reshape(emit: Emit, arg: relax.Expr, n: int, q: int = q) -> relax.Expr:
                    return emit(relax.op.reshape(arg, [n if p == q else d for p, d in enumerate(out_shape)]),
                                "xin_reshape")
                return _Step(q, reshape)
    return None


class InputSlices:
    """``X[lo:hi]`` along ``time_axis`` for one RNN node's input, each slice built once per direction (module
    docstring). Per direction: the reverse direction reads time positions in the opposite order, so a slice shared
    with the forward direction would carry the forward direction's slice tag, and the reverse direction's first
    slice would read the forward direction's last one -- a dependency backwards in time for the slice grid."""

    def __init__(self, bb: relax.BlockBuilder, x: relax.Expr, time_axis: int, seq_len: int) -> None:
        self.x, self.time_axis, self.seq_len = x, time_axis, seq_len
        self.cache: dict[tuple[int, int, int], relax.Expr] = {}
        self.sequence: StepSequence | None = None
        self.steps: list[_Step] = []
        traced = _trace(bb, x)
        if traced is not None:
            sequence, chain = traced
            t, steps = sequence.time_axis, []
            for call in chain:
                step = _replay_step(call, t)
                if step is None:
                    break
                steps.append(step)
                t = step.time_axis
            else:
                if t == time_axis:
                    self.sequence, self.steps = sequence, steps

    @property
    def rebuilt(self) -> bool:
        """Whether slices are rebuilt from the per-step outputs of the layer below."""
        return self.sequence is not None

    def __call__(self, emit: Emit, lo: int, hi: int, direction: int) -> relax.Expr:
        key = (direction, lo, hi)
        if key not in self.cache:
            if hi - lo == self.seq_len:
                part = self.x
            elif self.sequence is not None:
                part = self.sequence.emit_slice(emit, lo, hi)
                for step in self.steps:
                    part = step.emit(emit, part, hi - lo)
            else:
                part = emit(relax.op.strided_slice(self.x, axes=[self.time_axis], begin=[lo], end=[hi]), "xin")
            self.cache[key] = part
        return self.cache[key]
