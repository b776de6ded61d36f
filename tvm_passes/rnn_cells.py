"""The math of one unrolled recurrence step of ONNX LSTM / GRU / RNN, emitted as tagged Relax bindings.

:mod:`tvm_passes.rnn` parses the node and unrolls it; this module holds what one step computes: every direction's
weights laid out for ``x @ w_t`` and ``h @ r_t`` (:func:`cell_weights`), and one step of each cell type
(:data:`CELL_STEPS`), each binding named by :func:`rnn_tag_name` with the (layer, direction, step) it belongs to.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import tvm
from tvm import relax

from tvm_passes.rnn_activations import CellActivations

GATE_COUNT = {"LSTM": 4, "GRU": 3, "RNN": 1}


def rnn_tag_name(layer: int, direction: int | None, step: int | str, what: str) -> str:
    """The var name for an emitted binding: ``step`` is an int, ``"in"``, ``"out"`` or ``"p<T>"`` (the projection of
    the slice starting at step T); direction None = all."""
    d = "all" if direction is None else str(direction)
    t = f"t{step}" if isinstance(step, int) else step
    return f"rnn{layer}_d{d}_{t}_{what}"


class Emitter:
    """Emits bindings named with the (layer, direction, step) tag of one RNN node."""

    def __init__(self, bb: relax.BlockBuilder, layer: int):
        self.bb = bb
        self.layer = layer
        self.direction: int | None = None
        self.step: int | str = "in"

    def __call__(self, expr: relax.Expr, what: str) -> relax.Var:
        return self.bb.emit(expr, name_hint=rnn_tag_name(self.layer, self.direction, self.step, what))

    def item(self, tup: relax.Expr, index: int, what: str) -> relax.Var:
        return self(relax.TupleGetItem(tup, index), what)


def _slice_rows(emit: Emitter, tensor: relax.Expr, direction: int, start: int, stop: int,
                transpose: bool, what: str) -> relax.Expr:
    """``tensor[direction, start:stop]`` (transposed if asked), folded in numpy when ``tensor`` is a constant."""
    if isinstance(tensor, tvm.ir.expr.Constant):
        rows = tensor.value.numpy()[direction, start:stop]
        return relax.const(np.ascontiguousarray(rows.T if transpose else rows))
    part = emit(relax.op.take(tensor, relax.const(direction, "int64"), axis=0, mode="clip"), f"{what}_dir")
    if start != 0 or stop != int(tensor.ty.shape.values[1]):
        part = emit(relax.op.strided_slice(part, axes=[0], begin=[start], end=[stop]), f"{what}_rows")
    return emit(relax.op.permute_dims(part, [1, 0]), f"{what}_t") if transpose else part


def _add(emit: Emitter, a: relax.Expr | None, b: relax.Expr | None, what: str) -> relax.Expr | None:
    """a + b where either may be None (absent); two constants are added in numpy."""
    if a is None or b is None:
        return b if a is None else a
    if isinstance(a, tvm.ir.expr.Constant) and isinstance(b, tvm.ir.expr.Constant):
        return relax.const(a.value.numpy() + b.value.numpy())
    return emit(relax.op.add(a, b), what)


@dataclass(frozen=True)
class CellWeights:
    """One direction's weights, laid out for ``x @ w_t`` and ``h @ r_t``."""

    w_t: relax.Expr                              # [input, G*H]
    r_t: relax.Expr                              # [H, G*H]; GRU with linear_before_reset=0: [H, 2H] (z, r)
    r_h_t: relax.Expr | None = None              # GRU with linear_before_reset=0: [H, H]
    recurrent_bias: relax.Expr | None = None     # GRU with linear_before_reset=1: Rb [3H]
    peepholes: tuple[relax.Expr, ...] | None = None  # LSTM: (P_i, P_o, P_f), each [H]


def cell_weights(emit: Emitter, op_type: str, hidden: int, linear_before_reset: bool, inputs,
                 d: int) -> tuple[CellWeights, relax.Expr | None]:
    """Direction ``d``'s weights of an ONNX ``op_type`` node with its ``inputs``, plus the bias added to the input
    projection (None: no bias)."""
    gh, hid = GATE_COUNT[op_type] * hidden, hidden
    w, r, b = inputs[1], inputs[2], inputs[3] if len(inputs) > 3 else None
    w_t = _slice_rows(emit, w, d, 0, gh, True, "w")
    w_bias = None if b is None else _slice_rows(emit, b, d, 0, gh, False, "wb")
    r_bias = None if b is None else _slice_rows(emit, b, d, gh, 2 * gh, False, "rb")
    if op_type == "GRU" and not linear_before_reset:
        # h~ = tanh(x W_h + (r * H) R_h + Wb_h + Rb_h): R_h multiplies r * H, so it is a separate matmul.
        weights = CellWeights(w_t=w_t, r_t=_slice_rows(emit, r, d, 0, 2 * hid, True, "r_zr"),
                              r_h_t=_slice_rows(emit, r, d, 2 * hid, 3 * hid, True, "r_h"))
        return weights, _add(emit, w_bias, r_bias, "bias")
    r_t = _slice_rows(emit, r, d, 0, gh, True, "r")
    if op_type == "GRU":  # linear_before_reset=1: h~ = tanh(x W_h + Wb_h + r * (H R_h + Rb_h))
        return CellWeights(w_t=w_t, r_t=r_t, recurrent_bias=r_bias), w_bias
    peep = inputs[7] if op_type == "LSTM" and len(inputs) > 7 else None
    peepholes = None if peep is None else tuple(
        _slice_rows(emit, peep, d, k * hid, (k + 1) * hid, False, f"p{k}") for k in range(3))
    return CellWeights(w_t=w_t, r_t=r_t, peepholes=peepholes), _add(emit, w_bias, r_bias, "bias")


def _columns(tensor: relax.Expr) -> int:
    return int(tensor.ty.shape.values[-1])


def _gate(emit: Emitter, tensor: relax.Expr, k: int, hidden: int, what: str) -> relax.Var:
    """Columns ``[k*hidden, (k+1)*hidden)`` of ``tensor``: one gate of a [batch, G*hidden] tensor.

    Gates are cut with one slice each, not a ``split``: FuseOps cannot fuse the tuple a split returns into the
    cell when the gates go to different kernels (an LSTM's two cell kernels, a GRU's candidate behind a second
    matmul), so every step ran a split kernel of its own and allocated its G outputs; each single-use slice fuses
    into the kernel that reads it (an LSTM step: the recurrent matmul and two cell kernels, instead of a split
    kernel more)."""
    return emit(relax.op.strided_slice(tensor, axes=[1], begin=[k * hidden], end=[(k + 1) * hidden]), what)


def _lstm_step(emit: Emitter, w: CellWeights, x: relax.Expr, h: relax.Expr, c: relax.Expr, act: CellActivations,
               input_forget: bool = False, cell_mask: Callable[[relax.Expr], relax.Expr] | None = None):
    """ONNX LSTM, gate order i, o, f, c; peepholes P_i, P_f see C_{t-1} and P_o sees C_t. Activations: f for the
    gates (sigmoid by default), g for the candidate and h for the cell output (tanh). ``input_forget`` couples the
    forget gate to the input gate, f = 1 - i, as onnxruntime computes it (the forget gate's own weights and
    peephole are then unused). ``cell_mask`` (variable lengths) maps C_t to the cell state kept, before the output
    reads it: C_t then has one reader, so the mask fuses into the cell kernel (the output of an entry whose
    sequence has ended is discarded by the caller's own mask)."""
    op = relax.op
    gates = emit(op.add(x, emit(op.matmul(h, w.r_t), "hr")), "gates")
    hidden = _columns(gates) // 4
    g_i, g_o, g_f, g_c = (_gate(emit, gates, k, hidden, name) for k, name in enumerate(("gi", "go", "gf", "gc")))
    if w.peepholes is not None:
        p_i, p_o, p_f = w.peepholes
        g_i = emit(op.add(g_i, emit(op.multiply(p_i, c), "pi_c")), "gi_peep")
        g_f = emit(op.add(g_f, emit(op.multiply(p_f, c), "pf_c")), "gf_peep")
    i = act.gate(emit, act.f, g_i, "i")
    f = emit(op.subtract(relax.const(1, i.ty.dtype), i), "f") if input_forget else act.gate(emit, act.f, g_f, "f")
    cand = act.gate(emit, act.g, g_c, "cand")
    c_new = emit(op.add(emit(op.multiply(f, c), "fc"), emit(op.multiply(i, cand), "ic")), "c")
    if cell_mask is not None:
        c_new = cell_mask(c_new)
    if w.peepholes is not None:
        g_o = emit(op.add(g_o, emit(op.multiply(w.peepholes[1], c_new), "po_c")), "go_peep")
    o = act.gate(emit, act.f, g_o, "o")
    assert act.h is not None
    return emit(op.multiply(o, act.h.apply(emit, c_new, "tanh_c")), "h"), c_new


def _gru_step(emit: Emitter, w: CellWeights, x: relax.Expr, h: relax.Expr, c: relax.Expr, act: CellActivations):
    """ONNX GRU, gate order z, r, h; H_t = (1 - z) * h~ + z * H_{t-1}, computed as h~ + z * (H_{t-1} - h~).
    Activations: f for z and r (sigmoid by default), g for h~ (tanh)."""
    op = relax.op
    if w.r_h_t is None:  # linear_before_reset=1
        # One cell kernel reads every gate, so FuseOps fuses a split into it, and a split is fewer ops than slices:
        # with slices the 600-step GRU had 22,900 ops instead of 18,104 and compiled 8% slower.
        x_parts = emit(op.split(x, 3, axis=1), "x_split")
        x_z, x_r, x_h = (emit.item(x_parts, k, name) for k, name in enumerate(("xz", "xr", "xh")))
        h_proj = emit(op.matmul(h, w.r_t), "hr")
        if w.recurrent_bias is not None:
            h_proj = emit(op.add(h_proj, w.recurrent_bias), "hr_bias")
        h_parts = emit(op.split(h_proj, 3, axis=1), "h_split")
        h_z, h_r, h_h = (emit.item(h_parts, k, name) for k, name in enumerate(("hz", "hr_r", "hh")))
    else:
        hidden = _columns(x) // 3
        x_z, x_r, x_h = (_gate(emit, x, k, hidden, name) for k, name in enumerate(("xz", "xr", "xh")))
        hr = emit(op.matmul(h, w.r_t), "hr")
        h_z, h_r = (_gate(emit, hr, k, hidden, name) for k, name in enumerate(("hz", "hr_r")))
    z = act.gate(emit, act.f, emit(op.add(x_z, h_z), "z_pre"), "z")
    r = act.gate(emit, act.f, emit(op.add(x_r, h_r), "r_pre"), "r")
    if w.r_h_t is None:
        reset = emit(op.multiply(r, h_h), "r_hh")
    else:
        reset = emit(op.matmul(emit(op.multiply(r, h), "r_h"), w.r_h_t), "r_h_proj")
    cand = act.gate(emit, act.g, emit(op.add(x_h, reset), "cand_pre"), "cand")
    return emit(op.add(cand, emit(op.multiply(z, emit(op.subtract(h, cand), "h_cand")), "z_h_cand")), "h"), c


def _rnn_step(emit: Emitter, w: CellWeights, x: relax.Expr, h: relax.Expr, c: relax.Expr, act: CellActivations):
    """ONNX RNN: H_t = f(x W^T + H_{t-1} R^T + Wb + Rb), f tanh by default."""
    op = relax.op
    return act.gate(emit, act.f, emit(op.add(x, emit(op.matmul(h, w.r_t), "hr")), "pre"), "h"), c


CELL_STEPS = {"LSTM": _lstm_step, "GRU": _gru_step, "RNN": _rnn_step}
