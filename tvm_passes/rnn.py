"""ONNX ``LSTM`` / ``GRU`` / ``RNN`` converters for TVM 0.27's Relax ONNX frontend, unrolled per time step.

TVM 0.27 has no converter for these ops. :func:`install_onnx_rnn_converters` registers ours by wrapping
``onnx_frontend._get_convert_map`` (the importer looks the map up for every node). Supported: direction
forward / reverse / bidirectional, optional ``B``, ``initial_h``, ``initial_c``, LSTM peepholes ``P`` and
``input_forget``, ``layout`` 0 and 1, GRU ``linear_before_reset`` 0 and 1, ``sequence_lens`` (absent, a constant,
or an input given at run time), any ONNX activations (``activations``, ``activation_alpha`` / ``activation_beta``) and ``clip``
(:mod:`tvm_passes.rnn_activations`). Anything else raises :class:`hetpart.errors.UnsupportedOpError` naming the
node, the attribute and what is supported.

**Variable lengths.** With ``sequence_lens`` (unless it is a constant equal to the sequence length everywhere),
every step still runs for the whole batch, as the unrolled graph is static, and a mask keeps each batch entry's
state where its sequence has ended: step t of entry b counts when the time position it processes is below
``sequence_lens[b]`` (a reverse direction then starts at the entry's own last position), its output is zero
otherwise, and ``Y_h``/``Y_c`` are the states after the entry's last counted step -- zero for a length of 0, as
onnxruntime gives them. Lengths must lie in ``[0, seq_length]`` (onnxruntime refuses others; constants are
checked at import).

**Tags.** Relax bindings have no attributes, so every binding a converter emits gets a var name that encodes
where it belongs; :func:`parse_rnn_tag` decodes it::

    rnn{L}_d{D}_t{T}_{what}   one recurrence step:      rnn_step = T (0, 1, ...), rnn_phase = "step"
    rnn{L}_d{D}_in_{what}     before the recurrence:    rnn_step = -1, rnn_phase = "input_projection"
                              (weight slicing, the input projection of all steps in one matmul, initial state)
    rnn{L}_d{D}_p{T}_{what}   input_projection="per_slice": the projection of the slice starting at step T
                              (and the slice of the layer input it reads): rnn_step = T,
                              rnn_phase = "input_projection"
    rnn{L}_d{D}_out_{what}    after the recurrence:     rnn_step = -1, rnn_phase = "output"
                              (stacking the per-step outputs of direction D into Y)
    rnn{L}_dall_out_{what}    output spanning both directions of a bidirectional node: rnn_direction = -1

``L`` is the index of the node among the LSTM/GRU/RNN nodes of the imported graph in conversion order, which
is the ONNX node order (topological), so it is stable for a given model file. ``D`` is the index on ONNX's
``num_directions`` axis (0 = forward, 1 = reverse of a bidirectional node; a ``direction="reverse"`` node has
only D = 0). ``T`` is the *iteration* index: step T depends on step T-1 of the same (L, D); a reverse
direction processes time position ``seq_len - 1 - T`` at step T.

**Input projection.** By default (``input_projection="hoisted"``) each direction projects its whole input sequence
in one matmul before the recurrence, so a layer waits for all of the layer below. With
``RnnImportOptions(input_projection="per_slice", slice_steps=k)`` (set around an import with
:func:`rnn_import_options`) each direction projects the input of every k consecutive steps in its own matmul. When
the layer's input is the output sequence of an RNN node converted the same way (through layout ops only:
expand_dims, squeeze, permute_dims, a reshape that keeps the time axis), that slice of the input is rebuilt from
the per-step outputs it holds, so slice s of layer l+1 depends on slice s of layer l only and not on the stacked
sequence; otherwise the slice is cut from the input with a strided_slice. The tag grammar is
``hetpart.partition.slices.RNN_TAG_RE`` (the core's time-slice scheduler reads it).
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import numpy as np
import onnx
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _onnx_frontend

from hetpart.errors import UnsupportedOpError
from hetpart.partition.slices import parse_rnn_tag
from tvm_passes.onnx_nodes import constant_value, wrap_convert_map
from tvm_passes.rnn_activations import DEFAULT_ACTIVATIONS, CellActivations, activation_problems, cell_activations
from tvm_passes.rnn_cells import CELL_STEPS, GATE_COUNT, Emitter, cell_weights, rnn_tag_name
from tvm_passes.rnn_slices import (InputSlices, RnnImportOptions, StepSequence, current_options,
                                   register_sequence, rnn_import_options, stack_steps)

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_ACTIVATIONS", "GATE_COUNT", "RNN_OP_TYPES", "RnnImportOptions", "attribute_problems",
           "convert_recurrent", "find_unsupported_rnn_nodes", "install_onnx_rnn_converters", "parse_rnn_tag",
           "rnn_import_options", "rnn_tag_name"]

RNN_OP_TYPES = ("LSTM", "GRU", "RNN")
_DIRECTIONS = ("forward", "reverse", "bidirectional")
_LAYER_COUNTER_ATTR = "_hetpart_rnn_layers_converted"


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def attribute_problems(op_type: str, node_name: str, attrs: dict) -> list[str]:
    """Every unsupported attribute of one RNN node; ``attrs`` maps names to parsed ONNX values."""
    where = f"{op_type} node '{node_name}'"
    problems = []
    direction = _text(attrs.get("direction", b"forward"))
    if direction not in _DIRECTIONS:
        problems.append(f"{where}: direction={direction!r} is not valid; expected one of {_DIRECTIONS}")
    num_dirs = 2 if direction == "bidirectional" else 1
    if int(attrs.get("layout", 0)) not in (0, 1):
        problems.append(f"{where}: layout={attrs['layout']} is not supported; supported: 0 or 1")
    if op_type == "LSTM" and int(attrs.get("input_forget", 0)) not in (0, 1):
        problems.append(f"{where}: input_forget={attrs['input_forget']} is not valid; supported: 0 or 1")
    if op_type == "GRU" and int(attrs.get("linear_before_reset", 0)) not in (0, 1):
        problems.append(f"{where}: linear_before_reset={attrs['linear_before_reset']} is not valid; "
                        "supported: 0 or 1")
    return problems + activation_problems(op_type, where, attrs, num_dirs)


def find_unsupported_rnn_nodes(model: onnx.ModelProto) -> list[str]:
    """Problems of every LSTM/GRU/RNN node in ``model`` found without TVM: its attributes (shapes, and the values of
    a constant ``sequence_lens``, are checked during conversion)."""
    problems = []
    for node in model.graph.node:
        if node.op_type not in RNN_OP_TYPES:
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        problems += attribute_problems(node.op_type, node.name, attrs)
    return problems


@dataclass(frozen=True)
class _RnnSpec:
    op_type: str
    node_name: str
    hidden: int
    seq_len: int
    batch: int
    layout: int
    reversed_dirs: tuple[bool, ...]   # one entry per ONNX direction index
    linear_before_reset: bool
    dtype: str
    activations: tuple[CellActivations, ...]   # one entry per ONNX direction index
    input_forget: bool = False                 # LSTM: the forget gate is 1 - the input gate
    sequence_lens: relax.Expr | None = None    # [batch] integer lengths to mask by; None: all full length
    lens_may_be_zero: bool = False             # then the final states are zeroed where a length is 0

    @property
    def time_axis(self) -> int:
        return self.layout  # X is [seq, batch, in] (layout 0) or [batch, seq, in] (layout 1)


def _static_dims(expr: relax.Expr, what: str, where: str) -> list[int]:
    dims = []
    for dim in expr.ty.shape.values:
        if not isinstance(dim, tvm.tirx.IntImm):
            raise UnsupportedOpError(f"{where}: {what} has symbolic shape {list(expr.ty.shape.values)}; the RNN "
                                     "is unrolled per time step, so every dimension must be static. Pass the "
                                     "input shapes when importing (e.g. --input-shape NAME=DIMS)")
        dims.append(int(dim))
    return dims


def _parse_spec(op_type: str, inputs, attrs: dict, params) -> _RnnSpec:
    node_name = attrs.get("tvm_custom", {}).get("name", "") or "<unnamed>"
    where = f"{op_type} node '{node_name}'"
    problems = attribute_problems(op_type, node_name, attrs)
    if problems:
        raise UnsupportedOpError("; ".join(problems))
    direction = _text(attrs.get("direction", b"forward"))
    layout = int(attrs.get("layout", 0))
    x_dims = _static_dims(inputs[0], "input X", where)
    r_dims = _static_dims(inputs[2], "recurrence weight R", where)
    hidden = int(attrs.get("hidden_size", r_dims[-1]))
    if r_dims[-1] != hidden or r_dims[1] != GATE_COUNT[op_type] * hidden:
        raise UnsupportedOpError(f"{where}: R has shape {r_dims}, but hidden_size={hidden} needs "
                                 f"[num_directions, {GATE_COUNT[op_type] * hidden}, {hidden}]")
    seq_len, batch = (x_dims[0], x_dims[1]) if layout == 0 else (x_dims[1], x_dims[0])
    lens_expr, lens_may_be_zero = _sequence_lens(inputs[4] if len(inputs) > 4 else None, params, seq_len, batch,
                                                 where)
    reversed_dirs = {"forward": (False,), "reverse": (True,), "bidirectional": (False, True)}[direction]
    return _RnnSpec(op_type=op_type, node_name=node_name, hidden=hidden, seq_len=seq_len, batch=batch,
                    layout=layout, reversed_dirs=reversed_dirs,
                    linear_before_reset=bool(int(attrs.get("linear_before_reset", 0))),
                    dtype=str(inputs[0].ty.dtype),
                    activations=cell_activations(op_type, attrs, len(reversed_dirs)),
                    input_forget=bool(int(attrs.get("input_forget", 0))), sequence_lens=lens_expr,
                    lens_may_be_zero=lens_may_be_zero)


def _sequence_lens(lens: relax.Expr | None, params, seq_len: int, batch: int,
                   where: str) -> tuple[relax.Expr | None, bool]:
    """The lengths to mask the steps by ([batch] int32; None when absent or all equal to ``seq_len``), and whether
    one may be 0."""
    if lens is None:
        return None, False
    value = constant_value(lens, params)
    if value is None:
        dims = _static_dims(lens, "sequence_lens", where)
        dtype = str(lens.ty.dtype)
        if dims != [batch] or not dtype.startswith(("int", "uint")):
            raise UnsupportedOpError(f"{where}: sequence_lens must be an integer tensor of shape [{batch}] (the "
                                     f"batch); found {dtype} of shape {dims}")
        return lens, True
    if value.shape != (batch,) or value.min(initial=0) < 0 or value.max(initial=0) > seq_len:
        raise UnsupportedOpError(f"{where}: sequence_lens must hold {batch} lengths (the batch) in [0, {seq_len}] "
                                 f"(the sequence length); found {value.tolist()}. Fix the model's sequence_lens")
    if np.all(value == seq_len):
        return None, False
    return relax.const(value.astype(np.int32)), bool(np.any(value == 0))


def _initial_state(emit: Emitter, spec: _RnnSpec, state: relax.Expr | None, d: int, what: str) -> relax.Expr:
    if state is None:
        return relax.const(np.zeros((spec.batch, spec.hidden), dtype=spec.dtype))
    dir_axis = 0 if spec.layout == 0 else 1  # [num_dirs, batch, H] or [batch, num_dirs, H]
    return emit(relax.op.take(state, relax.const(d, "int64"), axis=dir_axis, mode="clip"), what)


MAX_SPLIT_OUTPUTS = 16   # per split op, as for stacks (rnn_slices.MAX_STACK_INPUTS): kernels of few arguments


def _step_rows(emit: Emitter, proj: relax.Expr, time_axis: int) -> list[relax.Expr]:
    """The row of every time position of ``proj`` ([T, B, G*H] or [B, T, G*H]) as a [B, G*H] tensor.

    Rows are cut with a tree of ``split`` ops of at most :data:`MAX_SPLIT_OUTPUTS` outputs each, not one ``take``
    per step: a take is a kernel of its own (FuseOps does not fuse it into the recurrent matmul that adds the row),
    480 of them in a 3-layer, 160-step LSTM; the tree makes about T/15 kernels per direction, so there are fewer
    kernels to analyse, plan and build (run and compile times did not change measurably: docs/architecture.md). Its
    kernels do not depend on the step either, so steps keep sharing their compiled functions. Time-major rows are
    consecutive blocks of B rows of ``proj`` viewed as [T*B, G*H]; batch-major rows are consecutive blocks of G*H
    columns of it viewed as [B, T*G*H]."""
    dims = [int(d) for d in proj.ty.shape.values]
    steps, batch, width = dims[time_axis], dims[1 - time_axis], dims[2]
    if steps == 1:
        return [emit(relax.op.reshape(proj, [batch, width]), "x_row")]
    if time_axis == 0:      # a row of each step = `unit` consecutive entries along `axis` of the flat view
        flat_shape, axis, unit = [steps * batch, width], 0, batch
    else:
        flat_shape, axis, unit = [batch, steps * width], 1, width
    flat = emit(relax.op.reshape(proj, flat_shape), "x_flat")

    def rows_of(chunk: relax.Expr, count: int) -> list[relax.Expr]:
        span = 1
        while span * MAX_SPLIT_OUTPUTS < count:
            span *= MAX_SPLIT_OUTPUTS
        sizes = [min(span, count - start) for start in range(0, count, span)]
        parts = emit(relax.op.split(chunk, [unit * start for start in range(span, count, span)], axis=axis),
                     "x_split")
        items = [emit.item(parts, k, "x_row" if size == 1 else "x_part") for k, size in enumerate(sizes)]
        return [row for item, size in zip(items, sizes) for row in ([item] if size == 1 else rows_of(item, size))]

    return rows_of(flat, steps)


def _run_direction(emit: Emitter, spec: _RnnSpec, inputs, d: int, options: RnnImportOptions,
                   x_slices: InputSlices):
    """Unroll one direction; returns (Y of this direction without the direction axis, final h, final c, the output
    of every time position -- zeroed past each length in the per-slice projection only, where the next layer reads
    them)."""
    emit.direction, emit.step = d, "in"
    weights, proj_bias = cell_weights(emit, spec.op_type, spec.hidden, spec.linear_before_reset, inputs, d)
    per_slice = options.input_projection == "per_slice"
    k = options.slice_steps

    def project(x: relax.Expr) -> relax.Expr:
        proj = emit(relax.op.matmul(x, weights.w_t), "xproj")
        return proj if proj_bias is None else emit(relax.op.add(proj, proj_bias), "xproj_bias")

    rows, first_time = ([], 0) if per_slice else (_step_rows(emit, project(inputs[0]), spec.time_axis), 0)
    h = _initial_state(emit, spec, inputs[5] if len(inputs) > 5 else None, d, "h0")
    c = _initial_state(emit, spec, inputs[6] if len(inputs) > 6 else None, d, "c0")
    lens = spec.sequence_lens
    if lens is not None:
        if str(lens.ty.dtype) != "int32":
            lens = emit(relax.op.astype(lens, "int32"), "lens_int32")
        lens = emit(relax.op.reshape(lens, [spec.batch, 1]), "lens")
    outputs: list[relax.Expr | None] = [None] * spec.seq_len
    step_cell = CELL_STEPS[spec.op_type]
    if spec.input_forget:
        step_cell = functools.partial(step_cell, input_forget=True)
    for step in range(spec.seq_len):
        if per_slice and step % k == 0:
            stop = min(spec.seq_len, step + k)
            lo, hi = (spec.seq_len - stop, spec.seq_len - step) if spec.reversed_dirs[d] else (step, stop)
            emit.step = f"p{step}"
            rows, first_time = _step_rows(emit, project(x_slices(emit, lo, hi, d)), spec.time_axis), lo
        emit.step = step
        time = spec.seq_len - 1 - step if spec.reversed_dirs[d] else step
        if lens is None:
            h, c = step_cell(emit, weights, rows[time - first_time], h, c, spec.activations[d])
            outputs[time] = h
            continue
        # variable lengths: the entries whose sequence has ended keep their state and output zeros

        def valid(what: str, time: int = time) -> relax.Var:
            # one test per reader, so each fuses into it (a shared one would be a kernel of its own); the time is a
            # [1, 1] tensor, an argument of the fused kernel: a scalar would be compiled into it, and every step
            # would then run a kernel of its own instead of sharing one compiled function
            return emit(relax.op.less(relax.const(np.full((1, 1), time, np.int32)), lens), what)

        def keep_cell(c_new: relax.Expr, c_old: relax.Expr = c) -> relax.Expr:
            return emit(relax.op.where(valid("valid_c"), c_new, c_old), "c_kept")

        masked = {"cell_mask": keep_cell} if spec.op_type == "LSTM" else {}
        h_new, c = step_cell(emit, weights, rows[time - first_time], h, c, spec.activations[d], **masked)
        h = emit(relax.op.where(valid("valid_h"), h_new, h), "h_kept")
        if per_slice:
            # the next layer's slices read the per-step outputs (rnn_slices.StepSequence): each masked by its step
            outputs[time] = emit(relax.op.where(valid("valid_y"), h, relax.const(0, spec.dtype)), "y_masked")
        else:
            outputs[time] = h          # zeroed past each entry's length once, on the stack (_mask_past_lengths)
    emit.step = "out"
    if lens is not None and spec.lens_may_be_zero:     # onnxruntime: the states of an empty sequence are zero
        started = emit(relax.op.greater(lens, relax.const(0, "int32")), "started")
        h = emit(relax.op.where(started, h, relax.const(0, spec.dtype)), "h_final")
        if spec.op_type == "LSTM":
            c = emit(relax.op.where(started, c, relax.const(0, spec.dtype)), "c_final")
    y = stack_steps(emit, outputs, spec.time_axis, "y_dir")
    if lens is not None and not per_slice:
        y = _mask_past_lengths(emit, spec, lens, y)
    return y, h, c, tuple(outputs)


def _mask_past_lengths(emit: Emitter, spec: _RnnSpec, lens: relax.Expr, y: relax.Expr) -> relax.Expr:
    """One direction's stacked outputs ``y`` with zeros where a time position is at or past its batch entry's
    length (``lens`` [batch, 1] int32). One mask over all steps, fused into the kernel that concatenates the stacks
    of steps, where a mask per step ran a kernel of its own every step (the kept state it reads has other
    readers)."""
    times = np.arange(spec.seq_len, dtype=np.int32).reshape([-1, 1, 1] if spec.time_axis == 0 else [1, -1, 1])
    lengths = lens if spec.time_axis == 0 else emit(relax.op.reshape(lens, [spec.batch, 1, 1]), "lens_rows")
    valid = emit(relax.op.less(relax.const(times, "int32"), lengths), "valid_y")
    return emit(relax.op.where(valid, y, relax.const(0, spec.dtype)), "y_masked")


def _next_layer(bb: relax.BlockBuilder) -> int:
    """Index of the next RNN node converted by this importer (its BlockBuilder), counting from 0."""
    layer = getattr(bb, _LAYER_COUNTER_ATTR, 0)
    setattr(bb, _LAYER_COUNTER_ATTR, layer + 1)
    return layer


def convert_recurrent(op_type: str, bb: relax.BlockBuilder, inputs, attrs: dict, params) -> relax.Tuple:
    """One ONNX ``op_type`` (LSTM, GRU or RNN) node's inputs unrolled per time step: (Y, Y_h[, Y_c])."""
    spec = _parse_spec(op_type, inputs, attrs, params)
    options = current_options()
    emit = Emitter(bb, _next_layer(bb))
    x_slices = InputSlices(bb, inputs[0], spec.time_axis, spec.seq_len)
    logger.debug("unrolling %s node %r as rnn layer %d: %d steps x %d directions, %s input projection%s",
                 op_type, spec.node_name, emit.layer, spec.seq_len, len(spec.reversed_dirs), options.input_projection,
                 f" every {options.slice_steps} steps" + (" from the per-step outputs of the layer below"
                                                          if x_slices.rebuilt else "")
                 if options.input_projection == "per_slice" else "")
    per_dir = [_run_direction(emit, spec, inputs, d, options, x_slices) for d in range(len(spec.reversed_dirs))]
    # Y: [seq, dirs, batch, H] (layout 0) / [batch, seq, dirs, H] (layout 1); Y_h, Y_c: [dirs, batch, H] /
    # [batch, dirs, H]. Direction axis: 1 / 2 for Y, 0 / 1 for the states.
    y_axis, state_axis = (1, 0) if spec.layout == 0 else (2, 1)
    emit.direction, emit.step = (0 if len(per_dir) == 1 else None), "out"

    def gather(parts: list[relax.Expr], axis: int, what: str) -> relax.Var:
        if len(parts) == 1:
            return emit(relax.op.expand_dims(parts[0], axis), what)
        return emit(relax.op.stack(parts, axis=axis), what)

    results = [gather([p[0] for p in per_dir], y_axis, "Y"), gather([p[1] for p in per_dir], state_axis, "Y_h")]
    if op_type == "LSTM":
        results.append(gather([p[2] for p in per_dir], state_axis, "Y_c"))
    if options.input_projection == "per_slice":
        register_sequence(bb, StepSequence(results[0], tuple(p[3] for p in per_dir), spec.time_axis, y_axis))
    return relax.Tuple(results)


def _make_converter(op_type: str) -> type:
    def impl(cls, bb, inputs, attr, params):
        return convert_recurrent(op_type, bb, inputs, attr, params)

    # _impl_v7 serves every opset >= 7 (the importer picks the largest version <= the model's opset).
    return type(op_type, (_onnx_frontend.OnnxOpConverter,), {"_impl_v7": classmethod(impl),
                                                             "__doc__": f"Unrolled ONNX {op_type}."})


_CONVERTERS = {op_type: _make_converter(op_type) for op_type in RNN_OP_TYPES}


def install_onnx_rnn_converters() -> None:
    """Register the LSTM, GRU and RNN converters with the Relax ONNX frontend (idempotent)."""
    if wrap_convert_map("rnn", lambda convert_map: convert_map.update(_CONVERTERS)):
        logger.debug("registered ONNX converters for %s", ", ".join(RNN_OP_TYPES))
