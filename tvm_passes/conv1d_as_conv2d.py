"""Rewrite 1-D convolutions as (1, k) 2-D convolutions, which hetpart's CPU conv rules schedule.

hetpart's CPU rules (``tvm_passes.schedules``) tile NCHW conv2d kernels; none of them knows ``relax.nn.conv1d``. A
1-D convolution fell to the pooling rule, which took it for a sliding-window reduction: it ran the output channels
in parallel, copied the whole padded input once per output channel and never vectorised. Measured on a 2-core Zen 4
host (``TVM_NUM_THREADS=2 python benchmarks/conv1d_rewrite.py --rounds 7``, conv + ReLU, onnxruntime with 2
threads in the same rounds; benchmarks/results/conv1d_rewrite/): 9 shapes, as imported a median 25.6x
onnxruntime's time (e.g. 128 -> 256 channels, k 5, length 400: 35.4 ms against 0.78 ms), rewritten 0.87x (0.68 ms);
earlier runs of the same command 24.7x / 0.92x and 28.6x / 0.87x.

Audio and sequence models (TCNs, x-vectors, conformers, wav2vec-style feature encoders) are built of such
convolutions. This pass rewrites every ``conv1d`` with NCW data and OIW weights at import time as
``reshape(x, [N, C, 1, L])``, a ``conv2d`` with kernel (1, k) and the stride, dilation and padding on the second
spatial axis, and ``reshape`` back to ``[N, O, L']`` (reshapes are views): the same products summed in the same
order. Elementwise ops that follow (the bias add, activations, a residual add) are applied to the 4-D form too, so
FuseOps fuses them into the convolution's kernel as it does for a 2-D convolution; a 3-D view is made for whatever
else reads them. A constant weight becomes a constant ``[O, I, 1, k]`` (one per original, however many convolutions
share it), so the conv rules' weight prepacking applies. The (1, k) orientation measured as fast as (k, 1) where
the output channels fill whole vectors, and faster where they do not (256 -> 250, k 5, 333: 1.9 against 10.9 ms;
128 -> 300, k 3, 186: 2.0 against 3.3 ms; one interleaved run). Pointwise convolutions whose output channels are not
a multiple of 8 were slow either way (128 -> 300, k 1, 186: 1.95-2.07 ms against onnxruntime's 0.10-0.11 ms), as 2-D
ones with such channel counts were; ``tvm_passes.pad_conv_channels`` pads their channels (0.93x onnxruntime).

It runs in :func:`tvm_passes.frontend.import_model` after constant folding and
``tvm_passes.conv_transpose_as_conv`` (whose 1-D output it rewrites too), before the padding rewrites, so the graph,
the profiler, the predictors and the executable all see the 2-D kernels.
"""
from __future__ import annotations

import functools
import logging
from typing import Any

from tvm_passes.import_rewrites import apply_rewriter, out_dtype_of

log = logging.getLogger(__name__)

# Ops applied to a convolution's output in its [N, C, 1, L] form (one output element per input element, or a
# broadcast of a constant such as the bias), so that FuseOps fuses them into the 2-D convolution's kernel.
ELEMENTWISE_OPS = frozenset({
    "relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.maximum", "relax.minimum",
    "relax.power", "relax.nn.relu", "relax.nn.silu", "relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.leakyrelu",
    "relax.sigmoid", "relax.tanh", "relax.clip", "relax.exp", "relax.negative", "relax.sqrt", "relax.abs",
    "relax.erf",
})


def conv1d_as_conv2d(mod: Any) -> tuple[Any, int]:
    """(module with every NCW/OIW ``conv1d`` rewritten as a (1, k) ``conv2d``, number rewritten)."""
    mod, count = apply_rewriter(mod, _rewriter_class()(mod))
    if count:
        log.info("rewrote %d conv1d(s) as (1, k) conv2d(s)", count)
    return mod, count


def _rewritable(call: Any) -> bool:
    """A conv1d call with NCW data, OIW weights, NCW output and static shapes."""
    import tvm
    from tvm import relax

    if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.conv1d"):
        return False
    attrs = call.attrs
    if (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout)) != ("NCW", "OIW", "NCW"):
        return False
    shapes = [getattr(arg.ty, "shape", None) for arg in call.args[:2]]
    return all(isinstance(shape, relax.ShapeExpr) and len(shape.values) == 3
               and all(isinstance(v, tvm.tirx.IntImm) for v in shape.values) for shape in shapes)


def _as_rows(shape: Any) -> tuple[int, ...]:
    """A 3-D shape [N, C, L] as the 2-D convolution's [N, C, 1, L]."""
    return tuple(shape[:2]) + (1,) + tuple(shape[2:])


def _dims(expr: Any) -> list[int] | None:
    """The static shape of a tensor expression; None when it has none."""
    shape = getattr(expr.ty, "shape", None)
    values = getattr(shape, "values", None)
    return None if values is None else [int(v) if hasattr(v, "value") else -1 for v in values]


@functools.lru_cache(maxsize=None)
def _rewriter_class() -> type:
    """The mutator class, made once (TVM keeps every class its decorators make alive; see
    ``tvm_passes.pad_columns._padder_class``); instances hold the weights only until :meth:`forget`."""
    import tvm
    from tvm import relax

    @relax.expr_functor.mutator
    class _Rewriter(relax.PyExprMutator):
        def __init__(self, module: Any) -> None:
            super().__init__(module)
            self.constants: list[tuple[Any, Any]] = []    # (original OIW constant, its OIHW twin)
            self.rows: dict[Any, Any] = {}                # 3-D var -> its [N, C, 1, L] twin
            self.count = 0

        def forget(self) -> None:
            self.constants, self.rows = [], {}

        def finish(self, func: Any) -> Any:
            """Drop the 3-D views nothing reads."""
            return relax.analysis.remove_all_unused(func)

        def weight_2d(self, weight: Any, name: str) -> Any:
            if isinstance(weight, tvm.ir.GenericConst):
                for source, twin in self.constants:
                    if source.value.same_as(weight.value):
                        return twin
                twin = relax.const(weight.value.numpy()[:, :, None, :])
                self.constants.append((weight, twin))
                return twin
            o, i, k = (int(v) for v in weight.ty.shape.values)
            return self.builder_.emit(relax.op.reshape(weight, [o, i, 1, k]), name_hint=f"{name}_weight_rows")

        def rebind(self, var: Any, rows: Any) -> None:
            """Bind ``var`` to the 3-D view of ``rows`` (removed again when nothing else reads ``var``)."""
            self.rows[var] = rows
            shape = [int(v) for v in rows.ty.shape.values]
            shape = shape[:2] + shape[3:]
            self.builder_.emit_normalized(relax.VarBinding(var, self.builder_.normalize(relax.op.reshape(rows,
                                                                                                        shape))))

        def conv_rows(self, call: Any, name: str) -> Any:
            data, weight = self.visit_expr(call.args[0]), self.visit_expr(call.args[1])
            attrs = call.attrs
            n, c, length = (int(v) for v in data.ty.shape.values)
            rows = self.builder_.emit(relax.op.reshape(data, [n, c, 1, length]), name_hint=f"{name}_input_rows")
            pad_before, pad_after = (int(p) for p in attrs.padding)
            self.count += 1
            return self.builder_.emit(relax.op.nn.conv2d(
                rows, self.weight_2d(weight, name), strides=[1, int(attrs.strides[0])],
                padding=[0, pad_before, 0, pad_after], dilation=[1, int(attrs.dilation[0])],
                groups=int(attrs.groups), data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW",
                out_dtype=out_dtype_of(attrs)), name_hint=f"{name}_rows")

        def operand_rows(self, arg: Any, name: str) -> Any | None:
            """``arg`` of an elementwise op on rows, in rows form; None when it has no such form."""
            if arg in self.rows:
                return self.rows[arg]
            if isinstance(arg, tvm.ir.GenericConst):
                value = arg.value.numpy()
                if value.ndim == 0:
                    return arg
                return relax.const(value.reshape(_as_rows((1,) * (3 - value.ndim) + value.shape))) \
                    if value.ndim <= 3 else None
            if not isinstance(getattr(arg, "ty", None), relax.TensorType):
                return arg          # a scalar attribute such as clip's bounds
            arg = self.visit_expr(arg)
            values = _dims(arg)
            if values is None or len(values) > 3 or min(values, default=0) < 0:
                return None
            return self.builder_.emit(relax.op.reshape(arg, list(_as_rows([1] * (3 - len(values)) + values))),
                                      name_hint=f"{name}_rows")

        def elementwise_rows(self, call: Any, name: str) -> Any | None:
            """``call`` applied to the rows forms of its operands; None when it is not such an op."""
            if not (isinstance(call.op, tvm.ir.Op) and call.op.name in ELEMENTWISE_OPS
                    and any(arg in self.rows for arg in call.args)):
                return None
            operands = [self.operand_rows(arg, f"{name}_arg{k}") for k, arg in enumerate(call.args)]
            if any(operand is None for operand in operands):
                return None
            rows = self.builder_.emit(relax.Call(call.op, operands, call.attrs, call.ty_args), name_hint=f"{name}_rows")
            sources = [self.rows[arg] for arg in call.args if arg in self.rows]
            if not all(_dims(rows) == _dims(source) for source in sources):
                return None      # it broadcasts the convolution's output: leave it as written (rows unused)
            return rows

        def visit_var_binding_(self, binding: Any) -> None:
            value = binding.value
            if _rewritable(value):
                self.rebind(binding.var, self.conv_rows(value, binding.var.name))
                return
            if isinstance(value, relax.Call):
                rows = self.elementwise_rows(value, binding.var.name)
                if rows is not None:
                    self.rebind(binding.var, rows)
                    return
            super().visit_var_binding_(binding)

    return _Rewriter
