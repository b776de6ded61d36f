"""Pad the output channels of convolutions to whole SIMD vectors when they are not a multiple of 8.

hetpart's conv rules vectorise a convolution over its output channels (weights prepacked output-channel-innermost)
when those fill whole or half registers, else over the columns of the output rows. Column vectors do badly in most
shapes: a pointwise (1x1) convolution with 300 output channels on a row of 186 columns (an x-vector's 128 -> 300
layer) ran 18.8x behind onnxruntime, and spatial ones worse -- a 3x3 conv 64 -> 100 channels on 56x56 ran 17.4 ms
against onnxruntime's 2.8, a conv-STFT front end (1 -> 130 channels, kernel 128, stride 64, a (1, k) conv after
``conv1d_as_conv2d``) 0.74 against 0.08 ms, and strided convs read their columns with gathers.

This pass rewrites such a convolution (constant ``[O, I, kh, kw]`` weight, ``groups=1``, ``O`` at least 33 and not a
multiple of 8) at import time to one against the zero-padded weight (and zero-padded bias, when a constant bias add
is its only consumer) followed by ``strided_slice`` back to ``O`` channels; the slice fuses into the consumers.
Results are bit-identical: the padded channels are computed from zero weights and sliced away.

Measured (``TVM_NUM_THREADS=2 python benchmarks/conv_channel_padding.py``, one process, blocks of 5 calls, median of
7 rounds, Zen 4; ``benchmarks/results/conv_channel_padding/``), 14 such convs and a control: padded ran a median
0.12x their unpadded time -- 3x3 convs with 36-100 channels on 56x56 and 64x64 maps 0.10-0.13x, strided, STFT and
pointwise ones 0.03-0.12x -- and 0.92x onnxruntime's (worst 3.0x, a (5, 1) conv over a 512 x 1 map, one output
column per row). Where column vectors already did well (28x28, 7x7 and 13x13 maps) padding cost at most 1.05x (36
channels padded to 48 on 28x28, 0.60x onnxruntime's time); the control (200 channels, not padded) moved 1.00x. An
earlier run of the same benchmark gave a median of 0.14x, 0.86x onnxruntime's. Fewer than 33 channels are left as
they are: in a first trial 20 and 12 channels padded to 32 and 16 gained nothing measurable (0.89-0.95x).

On a map one column wide the slice is kept out of the conv's kernel (``tvm_passes.fusion.is_padded_channel_slice``):
fused, its stages over 100 of the conv's 112 channels sent the kernel from ``conv2d_flat`` to ``conv2d_nchw``'s
one-lane column vectors (the (5, 1) conv above: 681 us in the kernel, 3.0x onnxruntime; kept apart, 212 + 4 + 4 us).
Padding to multiples of 32 or 64 instead did not help (measured per case in one process).
"""
from __future__ import annotations

import functools
import logging
from typing import Any

import numpy as np

from tvm_passes.import_rewrites import apply_rewriter, out_dtype_of, use_counter_class
from tvm_passes.pad_columns import COLUMN_MULTIPLE, MIN_COLUMNS, padded_columns

log = logging.getLogger(__name__)

# output channels in whole or half registers already get channel vectors from the conv rules
HALF_REGISTER_LANES = 8


def padded_channels(channels: int) -> int:
    """The output channel count a conv with ``channels`` is padded to (``channels`` itself when it is left alone);
    also how :func:`tvm_passes.fusion.is_padded_channel_slice` recognises the slice back."""
    if channels % HALF_REGISTER_LANES == 0:
        return channels
    return padded_columns(channels, COLUMN_MULTIPLE)


def _paddable_weight(value: Any) -> np.ndarray | None:
    """The constant [O, I, kh, kw] weight of a conv2d call this pass pads, else None."""
    import tvm

    if not (hasattr(value, "op") and isinstance(value.op, tvm.ir.Op) and value.op.name == "relax.nn.conv2d"):
        return None
    attrs = value.attrs
    if (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout)) != ("NCHW", "OIHW", "NCHW") \
            or int(attrs.groups) != 1 or not isinstance(value.args[1], tvm.ir.GenericConst):
        return None
    weight = value.args[1].value.numpy()
    if weight.ndim != 4 or weight.dtype.kind != "f" or weight.shape[0] < MIN_COLUMNS:
        return None
    return weight if padded_channels(weight.shape[0]) != weight.shape[0] else None


def _channel_bias(value: Any, channels: int) -> np.ndarray | None:
    """A constant bias of shape [1, O, 1, 1] (or [O, 1, 1]) added along the channels, else None."""
    import tvm

    if not isinstance(value, tvm.ir.GenericConst):
        return None
    bias = value.value.numpy()
    if bias.dtype.kind != "f" or bias.ndim not in (3, 4) or bias.shape[-3:] != (channels, 1, 1) \
            or any(d != 1 for d in bias.shape[:-3]):
        return None
    return bias


def pad_conv_channels(mod: Any) -> tuple[Any, int]:
    """(module with every such convolution padded, number padded)."""
    mod, count = apply_rewriter(mod, _padder_class()(mod))
    if count:
        log.info("padded the output channels of %d convolution(s) to whole vectors", count)
    return mod, count


@functools.lru_cache(maxsize=None)
def _padder_class() -> type:
    """The mutator class, made once (see ``tvm_passes.pad_columns._padder_class``)."""
    from tvm import relax

    @relax.expr_functor.mutator
    class _Padder(relax.PyExprMutator):
        def __init__(self, module: Any) -> None:
            super().__init__(module)
            self.absorbed: dict[Any, tuple] = {}          # add var -> (conv var, conv, weight, bias, bias first)
            self.skipped: set[Any] = set()                # conv vars emitted where their bias add is
            self.constants: list[tuple[Any, Any]] = []    # (original, padded) constants
            self.count = 0

        def forget(self) -> None:
            self.absorbed, self.skipped, self.constants = {}, set(), []

        def plan(self, func: Any) -> None:
            """Find the convolutions whose only use is an add of a constant per-channel bias."""
            counter = use_counter_class()()
            counter.visit_expr(func)
            self.absorbed, self.skipped = {}, set()
            for var, value in counter.bindings.items():
                if not (isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.add"):
                    continue
                for conv_index in (0, 1):
                    conv_var, bias_expr = value.args[conv_index], value.args[1 - conv_index]
                    conv = counter.bindings.get(conv_var)
                    weight = None if conv is None else _paddable_weight(conv)
                    if weight is None or counter.uses[conv_var] != 1:
                        continue
                    bias = _channel_bias(bias_expr, weight.shape[0])
                    if bias is not None:
                        self.absorbed[var] = (conv_var, conv, weight, bias, conv_index == 1)
                        self.skipped.add(conv_var)
                        break

        def wide_constant(self, original: Any, value: np.ndarray, axis: int) -> Any:
            """``value`` zero-padded along ``axis`` to the padded channel count, one constant per original."""
            for source, wide in self.constants:
                if source.value.same_as(original.value):
                    return wide
            channels = value.shape[axis]
            widths = [(0, 0)] * value.ndim
            widths[axis] = (0, padded_channels(channels) - channels)
            wide = relax.const(np.pad(value, widths))
            self.constants.append((original, wide))
            return wide

        def padded(self, conv_var: Any, conv: Any, weight: np.ndarray) -> Any:
            self.count += 1
            attrs = conv.attrs
            return self.builder_.emit(relax.op.nn.conv2d(
                self.visit_expr(conv.args[0]), self.wide_constant(conv.args[1], weight, 0),
                strides=[int(s) for s in attrs.strides], padding=[int(p) for p in attrs.padding],
                dilation=[int(d) for d in attrs.dilation], groups=1, data_layout="NCHW", kernel_layout="OIHW",
                out_layout="NCHW", out_dtype=out_dtype_of(attrs)),
                name_hint=f"{conv_var.name}_wide")

        def rebind(self, var: Any, wide: Any, channels: int) -> None:
            sliced = relax.op.strided_slice(wide, axes=[1], begin=[0], end=[channels])
            self.builder_.emit_normalized(relax.VarBinding(var, self.builder_.normalize(sliced)))

        def visit_var_binding_(self, binding: Any) -> None:
            var, value = binding.var, binding.value
            if var in self.skipped:
                return
            if var in self.absorbed:
                conv_var, conv, weight, bias, bias_first = self.absorbed[var]
                product = self.padded(conv_var, conv, weight)
                bias_expr = value.args[0] if bias_first else value.args[1]
                wide_bias = self.wide_constant(bias_expr, bias, bias.ndim - 3)
                added = relax.op.add(wide_bias, product) if bias_first else relax.op.add(product, wide_bias)
                self.rebind(var, self.builder_.emit(added, name_hint=f"{var.name}_wide"), weight.shape[0])
                return
            weight = _paddable_weight(value)
            if weight is not None:
                self.rebind(var, self.padded(var, value, weight), weight.shape[0])
                return
            super().visit_var_binding_(binding)

    return _Padder
