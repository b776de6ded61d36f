"""Rewrite 1-D transposed convolutions as zero-inserted input + ordinary convolution.

hetpart's CPU rules schedule ``conv2d`` (and, through :mod:`tvm_passes.conv1d_as_conv2d`, ``conv1d``) but not
``conv1d_transpose``: the row-reduction rule took it, and ran it a median 72x behind onnxruntime over 5 decoder
shapes (``TVM_NUM_THREADS=2 python benchmarks/conv1d_rewrite.py --transposed --rounds 7``, 2-core Zen 4 host,
benchmarks/results/conv1d_transpose_rewrite/; 128 -> 64 channels, kernel 8, stride 4, length 50: 7.3 ms against
0.10 ms). Rewritten: a median 1.55x, the worst 5.1x at stride 8 (the inserted zeros multiply the work by the stride;
a polyphase split would not), 0.46x at stride 1.

A transposed convolution with stride ``s``, padding ``(p0, p1)``, output padding ``q`` and dilation ``d`` equals an
ordinary stride-1 convolution, dilation ``d``, of the input with ``s - 1`` zeros inserted between neighbours, padded
by ``d (k - 1) - p0`` before and ``d (k - 1) - p1 + q`` after, with the weight's kernel axis flipped and its input
and output channels swapped (per group). The zeros are inserted by a reshape, a pad, a reshape and a slice (one
copy of the input, ``s`` times longer); the convolution, which multiplies by the inserted zeros (``s`` times the
transposed convolution's work), then becomes a (1, k) 2-D convolution on the conv rules. Only constant weights with
NCW/IOW layouts whose padding is at most ``d (k - 1)`` are rewritten; others stay as they are. 2-D transposed
convolutions are left alone (see ``_LAYOUTS``).
"""
from __future__ import annotations

import functools
import logging
from typing import Any

import numpy as np

from tvm_passes.import_rewrites import apply_rewriter, out_dtype_of

log = logging.getLogger(__name__)

# Only 1-D: 2-D transposed convolutions already reach the conv rules through TOPI's legalization, and the rewrite
# measured slower there (a stride-2 4x4 deconvolution model 0.45 -> 0.57 ms, a U-Net 3.43 -> 3.68 ms).
_LAYOUTS = {"relax.nn.conv1d_transpose": ("NCW", "IOW")}


def conv_transpose_as_conv(mod: Any) -> tuple[Any, int]:
    """(module with every rewritable 1-D transposed convolution replaced, number replaced)."""
    mod, count = apply_rewriter(mod, _rewriter_class()(mod))
    if count:
        log.info("rewrote %d 1-D transposed convolution(s) as zero-inserted convolutions", count)
    return mod, count


def conv_weight(weight: np.ndarray, groups: int) -> np.ndarray:
    """A transposed convolution's ``[I, O / g, *k]`` weight as the equivalent convolution's ``[O, I / g, *k]``:
    channels swapped per group, kernel axes flipped."""
    in_channels, out_per_group, *kernel = weight.shape
    grouped = weight.reshape(groups, in_channels // groups, out_per_group, *kernel)
    swapped = np.swapaxes(grouped, 1, 2).reshape(groups * out_per_group, in_channels // groups, *kernel)
    return np.ascontiguousarray(np.flip(swapped, axis=tuple(range(2, 2 + len(kernel)))))


def _static(values: Any) -> list[int] | None:
    try:
        return [int(v) for v in values]
    except (TypeError, ValueError):
        return None


def _plan(call: Any) -> dict[str, Any] | None:
    """What the rewrite needs of ``call``, or None when it is not a transposed convolution it rewrites."""
    import tvm

    if not (hasattr(call, "op") and isinstance(call.op, tvm.ir.Op) and call.op.name in _LAYOUTS):
        return None
    attrs = call.attrs
    if (str(attrs.data_layout), str(attrs.kernel_layout)) != _LAYOUTS[call.op.name] \
            or str(attrs.out_layout) not in ("", str(attrs.data_layout)):
        return None
    weight = call.args[1]
    if not isinstance(weight, tvm.ir.GenericConst):
        return None
    data_shape = _static(getattr(call.args[0].ty, "shape", None) or ())
    if not data_shape:
        return None
    value = weight.value.numpy()
    spatial = value.ndim - 2
    strides, dilation = _static(attrs.strides), _static(attrs.dilation)
    padding, output_padding = _static(attrs.padding), _static(attrs.output_padding)
    if None in (strides, dilation, padding, output_padding):
        return None
    kernel = value.shape[2:]
    before, after = padding[:spatial], padding[spatial:]
    pads = []
    for axis in range(spatial):
        reach = dilation[axis] * (kernel[axis] - 1)
        pads.append((reach - before[axis], reach - after[axis] + output_padding[axis]))
    if any(p < 0 for pair in pads for p in pair):
        return None
    return {"weight": value, "strides": strides, "dilation": dilation, "pads": pads, "groups": int(attrs.groups),
            "shape": data_shape, "out_dtype": out_dtype_of(attrs)}


@functools.lru_cache(maxsize=None)
def _rewriter_class() -> type:
    """The mutator class, made once (see ``tvm_passes.pad_columns._padder_class``)."""
    from tvm import relax

    @relax.expr_functor.mutator
    class _Rewriter(relax.PyExprMutator):
        def __init__(self, module: Any) -> None:
            super().__init__(module)
            self.count = 0

        def zero_inserted(self, data: Any, shape: list[int], strides: list[int], name: str) -> Any:
            """``data`` with ``s - 1`` zeros after every element along each spatial axis (none after the last)."""
            if all(s == 1 for s in strides):
                return data
            n, c, *spatial = shape
            split = [n, c] + [d for size in spatial for d in (size, 1)]
            widths = [0, 0, 0, 0] + [w for s in strides for w in (0, 0, 0, s - 1)]
            emit = self.builder_.emit
            split_var = emit(relax.op.reshape(data, split), name_hint=f"{name}_split")
            wide = emit(relax.op.nn.pad(split_var, widths), name_hint=f"{name}_zeros")
            flat = emit(relax.op.reshape(wide, [n, c] + [size * s for size, s in zip(spatial, strides)]),
                        name_hint=f"{name}_interleaved")
            axes = list(range(2, 2 + len(spatial)))
            return emit(relax.op.strided_slice(flat, axes=axes, begin=[0] * len(spatial),
                                               end=[(size - 1) * s + 1 for size, s in zip(spatial, strides)]),
                        name_hint=f"{name}_dilated")

        def visit_var_binding_(self, binding: Any) -> None:
            plan = _plan(binding.value)
            if plan is None:
                super().visit_var_binding_(binding)
                return
            call, name = binding.value, binding.var.name
            data = self.zero_inserted(self.visit_expr(call.args[0]), plan["shape"], plan["strides"], name)
            weight = relax.const(conv_weight(plan["weight"], plan["groups"]))
            pads = plan["pads"]
            conv = relax.op.nn.conv1d(data, weight, strides=1, padding=list(pads[0]), dilation=plan["dilation"],
                                      groups=plan["groups"], out_dtype=plan["out_dtype"])
            self.count += 1
            self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(conv)))

    return _Rewriter
