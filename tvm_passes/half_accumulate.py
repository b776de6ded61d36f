"""Compute float16 models' reductions and transcendental functions in float32, as onnxruntime and torch do.

TVM computes an op in the dtype of its operands: a float16 convolution sums its products in float16, a float16
mean adds 1,024 values in float16, a float16 softmax or layer norm normalises in float16. onnxruntime's CPU kernels
compute such ops in float32 (from float16 inputs, rounding the result to float16 once), and torch accumulates half
matmuls and convolutions in float32 too. The zoo ResNet-18 exported in half precision came out 4.9e-3 of its
output's magnitude from the same file computed in float32 (onnxruntime's float16 run: 3.6e-4), the GRU LM 9.4e-3
(3.9e-4); LLVM has no float16 ``erf`` for the CPU, so BERT's float16 GELU did not build at all
(``benchmarks/half_precision.py``; after this rewrite 5.1e-4, 9.1e-4 and 1.7e-3).

This import rewrite makes every float16 op that accumulates or approximates compute in float32 and round once:

- convolutions and matmuls keep their float16 operands (half the memory traffic, and the GPU's half loads) and
  take ``out_dtype="float32"``: TOPI then casts each operand as it multiplies and sums in float32; an ``astype``
  back to float16 follows, which FuseOps fuses into the kernel's epilogue;
- reductions, normalisations, softmax, pooling averages and transcendental activations (:data:`WIDENED_OPS`) get
  their float16 tensor operands cast to float32 (constants converted once, at import) and their result cast back;
  the casts are elementwise and fuse into the op's kernel.

Elementwise arithmetic (add, multiply, divide, max, ReLU...) is left in float16: each such op is correctly rounded
either way. Models without float16 tensors are returned unchanged. It runs last among the import rewrites of
:func:`tvm_passes.frontend.import_model` (after the padding rewrites, which then see the float16 ops as written).
"""
from __future__ import annotations

import functools
import logging
from typing import Any, Callable

from tvm_passes.import_rewrites import apply_rewriter

log = logging.getLogger(__name__)

HALF = "float16"
WIDE = "float32"

# ops whose every float16 tensor operand is cast to float32 and whose float16 result is cast back
WIDENED_OPS = frozenset(f"relax.{name}" for name in (
    # reductions
    "sum", "mean", "prod", "variance", "std", "cumsum", "cumprod", "einsum",
    # normalisations and softmax
    "nn.softmax", "nn.log_softmax", "nn.layer_norm", "nn.group_norm", "nn.rms_norm", "nn.instance_norm",
    "nn.attention", "nn.attention_bias",
    # averaging pools (max pools pick a value: exact in float16)
    "nn.avg_pool1d", "nn.avg_pool2d", "nn.avg_pool3d", "nn.adaptive_avg_pool1d", "nn.adaptive_avg_pool2d",
    "nn.adaptive_avg_pool3d",
    # transcendental functions, which TVM approximates by polynomials evaluated in the operand's dtype
    "exp", "log", "tanh", "sigmoid", "erf", "sqrt", "rsqrt", "power", "sin", "cos", "nn.gelu", "nn.gelu_tanh",
    "nn.silu", "nn.softplus",
))


def _conv_builder(make: Callable[..., Any], *extra: str) -> Callable[[Any, Any, Any, str], Any]:
    fields = ("strides", "padding", *extra, "dilation", "groups", "data_layout", "kernel_layout", "out_layout")

    def build(data: Any, weight: Any, attrs: Any, out_dtype: str) -> Any:
        return make(data, weight, **{name: getattr(attrs, name) for name in fields}, out_dtype=out_dtype)
    return build


@functools.lru_cache(maxsize=None)
def _accumulating_ops() -> dict[str, Callable[[Any, Any, Any, str], Any]]:
    """op name -> builder of the same call with another ``out_dtype`` (ops that multiply-accumulate in it)."""
    from tvm import relax

    nn = relax.op.nn
    return {
        "relax.nn.conv1d": _conv_builder(nn.conv1d),
        "relax.nn.conv2d": _conv_builder(nn.conv2d),
        "relax.nn.conv3d": _conv_builder(nn.conv3d),
        "relax.nn.conv1d_transpose": _conv_builder(nn.conv1d_transpose, "output_padding"),
        "relax.nn.conv2d_transpose": _conv_builder(nn.conv2d_transpose, "output_padding"),
        "relax.matmul": lambda a, b, attrs, out_dtype: relax.op.matmul(a, b, out_dtype=out_dtype),
    }


def accumulate_half_in_float32(mod: Any) -> tuple[Any, int]:
    """(module whose float16 accumulations and approximations run in float32, number of ops changed)."""
    mod, count = apply_rewriter(mod, _widener_class()(mod))
    if count:
        log.info("computing %d float16 op(s) in float32 (reductions, normalisations, transcendental functions)",
                 count)
    return mod, count


def _dtype(expr: Any) -> str | None:
    from tvm import relax

    ty = getattr(expr, "ty", None)
    return str(ty.dtype) if isinstance(ty, relax.TensorType) else None


@functools.lru_cache(maxsize=None)
def _widener_class() -> type:
    """The mutator class, made once (TVM keeps every class its decorators make alive)."""
    import tvm
    from tvm import relax

    @relax.expr_functor.mutator
    class _Widener(relax.PyExprMutator):
        def __init__(self, module: Any) -> None:
            super().__init__(module)
            self.count = 0

        def finish(self, func: Any) -> Any:
            """Drop the casts of an op left as written (its result dtype is an attribute, e.g. cumsum's)."""
            return relax.analysis.remove_all_unused(func)

        def wide(self, arg: Any, name: str) -> Any:
            """``arg`` as float32: a constant converted now, a tensor through an ``astype``."""
            if _dtype(arg) != HALF:
                return arg
            if isinstance(arg, tvm.ir.GenericConst):
                return relax.const(arg.value.numpy().astype(WIDE))
            return self.builder_.emit(relax.op.astype(arg, WIDE), name_hint=f"{name}_f32")

        def visit_var_binding_(self, binding: Any) -> None:
            value, var = binding.value, binding.var
            if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and _dtype(var) == HALF):
                super().visit_var_binding_(binding)
                return
            name = value.op.name
            builder = _accumulating_ops().get(name)
            if builder is not None and all(_dtype(arg) == HALF for arg in value.args[:2]):
                data, weight = (self.visit_expr(arg) for arg in value.args[:2])
                wide = self.builder_.emit(builder(data, weight, value.attrs, WIDE), name_hint=f"{var.name}_f32")
            elif name in WIDENED_OPS:
                args = [self.wide(self.visit_expr(arg), f"{var.name}_arg{k}") for k, arg in enumerate(value.args)]
                wide = self.builder_.emit(relax.Call(value.op, args, value.attrs, value.ty_args),
                                          name_hint=f"{var.name}_f32")
                if _dtype(wide) != WIDE:          # an op whose result dtype is an attribute: leave it as written
                    super().visit_var_binding_(binding)
                    return
            else:
                super().visit_var_binding_(binding)
                return
            self.count += 1
            self.builder_.emit_normalized(relax.VarBinding(var, self.builder_.normalize(relax.op.astype(wide, HALF))))

    return _Widener
