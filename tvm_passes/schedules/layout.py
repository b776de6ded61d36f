"""Relax pass: store constant conv2d weights output-channel-innermost (kernel layout IHWO) for the CPU.

TOPI's NCHW conv reads ``w[f, c, ry, rx]``; vectorising over output channels ``f`` (what the
:class:`~tvm_passes.schedules.conv2d.Conv2dNCHW` rule does for dense convs, because it works for every
spatial size, 7x7 included) needs ``f`` contiguous.  This pass permutes each *constant* OIHW weight of a
dense (groups == 1) NCHW conv2d to IHWO with numpy at compile time and sets ``kernel_layout="IHWO"``;
TOPI's generic ``conv`` legalises any kernel-layout permutation, so data and output stay NCHW and the rest
of the model is untouched.  Weights that are not constants (e.g. passed as inputs), grouped/depthwise convs
output channel counts that are not a multiple of the vector width, and stride-1 1x1 convs whose rows fit
column vectors (faster that way, see :func:`tvm_passes.tile_plan.conv_prepacks_weights`) are left as they are.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..tile_plan import conv_prepacks_weights

PREPACKED_KERNEL_LAYOUT = "IHWO"


def _should_prepack(call: relax.Call, lanes: int) -> bool:
    if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.conv2d"):
        return False
    attrs = call.attrs
    if str(attrs.data_layout) != "NCHW" or str(attrs.kernel_layout) != "OIHW" or str(attrs.out_layout) != "NCHW":
        return False
    if int(attrs.groups) != 1 or not isinstance(call.args[1], tvm.ir.GenericConst):
        return False
    shape = call.args[1].value.shape
    if len(shape) != 4:
        return False
    out_width = call.ty.shape.values[3] if isinstance(call.ty, relax.TensorType) and call.ty.shape else None
    static_width = int(out_width.value) if isinstance(out_width, tvm.tirx.IntImm) else None
    return conv_prepacks_weights(int(shape[0]), int(attrs.groups), int(shape[2]), int(shape[3]),
                                 [int(s) for s in attrs.strides], static_width, lanes)


@relax.expr_functor.mutator
class _PrepackRewriter(relax.PyExprMutator):
    """Rewrites the convs :func:`_should_prepack` accepts; ``rewritten`` counts them.

    Defined once at module level: TVM keeps every class its ``mutator`` decorator makes alive, and a class made in
    each pass call closed over the list of rewritten calls, leaking their weight constants on every compile.
    """

    def __init__(self, mod: tvm.ir.IRModule, lanes: int) -> None:
        super().__init__(mod)
        self.lanes, self.rewritten = lanes, 0

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not _should_prepack(call, self.lanes):
            return call
        weight = call.args[1]
        packed = np.ascontiguousarray(np.transpose(weight.value.numpy(), (1, 2, 3, 0)))
        attrs = call.attrs
        self.rewritten += 1
        return self.builder_.normalize(relax.op.nn.conv2d(
            call.args[0],
            relax.const(packed, str(weight.ty.dtype)),
            strides=[int(s) for s in attrs.strides],
            padding=[int(p) for p in attrs.padding],
            dilation=[int(d) for d in attrs.dilation],
            groups=1,
            data_layout="NCHW",
            kernel_layout=PREPACKED_KERNEL_LAYOUT,
            out_layout="NCHW",
            out_dtype=attrs.out_dtype,
        ))


def prepack_conv_weights(lanes: int = 16) -> tvm.transform.Pass:
    """Module pass: constant OIHW conv2d weights -> IHWO constants (see module docstring).

    ``lanes``: only convs whose output channel count is a multiple of it are rewritten (the rule's
    channel vector width).
    """

    @tvm.transform.module_pass(opt_level=0, name="HetpartPrepackConvWeights")
    def _pass(mod: tvm.ir.IRModule, _ctx: tvm.transform.PassContext) -> tvm.ir.IRModule:
        rewriter = _PrepackRewriter(mod, lanes)
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function):
                rewriter.builder_.update_func(gvar, rewriter.visit_expr(func))
        if not rewriter.rewritten:
            return mod
        return rewriter.builder_.get()

    return _pass
