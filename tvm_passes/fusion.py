"""Which kernels TVM's FuseOps may fuse: TVM's op patterns, with stacks of many inputs, and the channel slice after
a padded conv over a one-column map (:func:`is_padded_channel_slice`), kept out of fusion.

An unrolled recurrence stacks its per-step outputs (``tvm_passes.rnn_slices.stack_steps``: stacks of at most 16
steps, then concatenations). ``AnnotateTIROpPattern`` marks stacks and concatenations injective, so FuseOps fuses
the whole tree -- and the last step's cell, a chain of fast sigmoid/tanh polynomials -- into one kernel with one
argument per step and a select chain over all of them: a 600-step GRU's output became one kernel of 602 arguments;
at 300 steps such kernels took 94-100 s each to compile (1.1 MB of machine code; every other kernel of the model
compiled in under 3 s).

:func:`keep_stacks_unfused` marks a kernel that is a ``stack`` of at least :data:`MIN_UNFUSED_STACK_INPUTS` inputs
(one block whose value is TOPI's select chain on one axis, :func:`tvm_passes.schedules.concat.stack_segments`)
opaque: it stays a kernel of its own, scheduled by the concat rule's loop partition, and nothing fuses into it.
Concatenations are left alone (a CNN's concat keeps its fused batch norm and ReLU). Every place hetpart fuses uses
:func:`fusion_passes` -- the heterogeneous build, the extractor's kernel groups, the profiler's CPU pipeline -- so
the kernels measured, predicted and deployed stay the same.
"""
from __future__ import annotations

import tvm
from tvm import relax, s_tir, tirx

__all__ = ["MIN_UNFUSED_STACK_INPUTS", "fusion_passes", "is_padded_channel_slice", "keep_stacks_unfused",
           "with_stacks_unfused"]

MIN_UNFUSED_STACK_INPUTS = 8
INJECTIVE_PATTERN = 2           # TVM's OpPatternKind: kElemWise 0, kBroadcast 1, kInjective 2, ..., kOpaque 8
OPAQUE_PATTERN = 8


def is_wide_stack(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` is one TOPI stack block over at least :data:`MIN_UNFUSED_STACK_INPUTS` inputs."""
    from tvm_passes.schedules.concat import stack_segments

    if func.attrs is None or "op_pattern" not in func.attrs or int(func.attrs["op_pattern"]) > INJECTIVE_PATTERN:
        return False
    if len(func.params) - 1 < MIN_UNFUSED_STACK_INPUTS:       # the last parameter is the output
        return False
    try:
        sch = s_tir.Schedule(func)
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
    except (RuntimeError, ValueError, IndexError):     # no root block: not a TOPI stack
        return False
    if len(blocks) != 1:
        return False
    block = sch.get(blocks[0])
    return any(stack_segments(block, axis) is not None for axis in range(len(block.iter_vars)))


def is_padded_channel_slice(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` is the slice ``tvm_passes.pad_conv_channels`` puts after a conv padded to whole vectors, on
    a map one column wide: one strided-slice block taking the first O of an NCHW tensor's channels, where the tensor
    has exactly the padded count for O (O at least 33 and no multiple of 8) and its rows one column.

    Fused into the conv's kernel, such a slice leaves later stages over O of the conv's channels, which
    ``conv2d_flat`` (the rule for one-column maps) does not take: the kernel fell to ``conv2d_nchw``, whose column
    vectors are one lane wide there (a (5, 1) conv 64 -> 100 over 512 x 1: 681 us; kept apart, 215 us for the conv
    and 4 us each for the slice and the ReLU). On wider maps the fused slice is the faster form: with every such
    slice kept apart, 8 of the 14 padded convs of ``benchmarks/conv_channel_padding.py`` ran 1.3-2.1x their time
    relative to onnxruntime in the committed run (the unpadded control moved 1.08x), so those stay fused."""
    from tvm_passes.pad_conv_channels import padded_channels

    if len(func.params) != 2:
        return False
    shapes = []
    for param in func.params:           # TVM 0.27: a PrimFunc's parameters are its buffers
        shape = getattr(param, "shape", None)
        if shape is None or len(shape) != 4 or not all(isinstance(d, tirx.IntImm) for d in shape):
            return False
        shapes.append([int(d) for d in shape])
    (n, wide, h, w), (n_out, channels, h_out, w_out) = shapes
    if (n, h, w) != (n_out, h_out, w_out) or w != 1 or channels == wide or padded_channels(channels) != wide:
        return False
    try:
        sch = s_tir.Schedule(func)
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
    except (RuntimeError, ValueError, IndexError):
        return False
    return len(blocks) == 1 and sch.get(blocks[0]).name_hint.startswith("T_strided_slice")


@tvm.transform.module_pass(opt_level=0, name="HetpartKeepStacksUnfused")
def keep_stacks_unfused(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """Mark wide stack PrimFuncs, and the channel slices after padded convs, opaque (run after
    ``AnnotateTIROpPattern``, before ``FuseOps``)."""
    updates = {gv: func.with_attr("op_pattern", OPAQUE_PATTERN) for gv, func in mod.functions_items()
               if isinstance(func, tirx.PrimFunc) and (is_wide_stack(func) or is_padded_channel_slice(func))}
    if not updates:
        return mod
    out = tvm.IRModule(dict(mod.functions_items()), mod.attrs, mod.global_infos)
    for gv, func in updates.items():
        out[gv] = func
    return out


def fusion_passes() -> list[tvm.transform.Pass]:
    """AnnotateTIROpPattern, :func:`keep_stacks_unfused`, FuseOps (FuseTIR is left to the caller)."""
    return [relax.transform.AnnotateTIROpPattern(), keep_stacks_unfused, relax.transform.FuseOps()]


def with_stacks_unfused(passes: list[tvm.transform.Pass]) -> list[tvm.transform.Pass]:
    """``passes`` (a stock TVM pass list) with :func:`keep_stacks_unfused` after every AnnotateTIROpPattern."""
    out: list[tvm.transform.Pass] = []
    for p in passes:
        out.append(p)
        if p.info.name == "AnnotateTIROpPattern":
            out.append(keep_stacks_unfused)
    return out
