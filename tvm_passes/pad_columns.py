"""Pad the columns of matmuls against constant weights to a whole number of SIMD vectors.

A matmul ``x[..., K] @ W[K, N]`` whose weight is a constant (a Linear/Gemm layer, an RNN's gate projection)
is register-tiled by hetpart's CPU rule with one SIMD vector of ``W``'s columns per accumulator
(``tvm_passes.schedules.matmul``). When ``N`` is not a multiple of the vector width the tile is either half a
vector (N = 2600, an LSTM's 4 x 650 gates) or a full vector with a predicated tail that TVM scalarises
(N = 1950, a GRU's 3 x 650 gates). Measured on this repository's 2-core AVX-512 host (K = 650, bias fused,
``TVM_NUM_THREADS=2``), padded to the next multiple of 16:

======  ===========  ============  ==========
rows    N = 1950     N = 1952      ratio
======  ===========  ============  ==========
1       128 us       30 us         4.3x
35      3781 us      175 us        21.6x
140     15363 us     688 us        22.3x
======  ===========  ============  ==========

and 541 -> 282 us (1.9x) for 35 x 650 x 2600 -> 2608. (That host was a Zen 5; on a Zen 4 host of the same
machine kind the 35-row case measured 10x, and 2.8x on the CI host: the size of the cliff depends on the CPU.) This pass rewrites such a matmul at import time to a
matmul against the zero-padded weight (and zero-padded bias, when a constant bias add is its only consumer)
followed by ``strided_slice`` back to ``N`` columns. The slice is injective, so FuseOps fuses it into the
consumers (an RNN's gate split) instead of into the matmul. The results are bit-identical: padded columns are
computed from zero weights and sliced away.

It runs in :func:`tvm_passes.frontend.import_model`, before the OpGraph is extracted, so the graph, the
profiler, the predictors and the executable all see the same (padded) kernels.
"""
from __future__ import annotations

import functools
import logging
from typing import Any

import numpy as np

from tvm_passes.import_rewrites import apply_rewriter, use_counter_class

log = logging.getLogger(__name__)

# fp32 lanes of the widest CPU vector hetpart schedules (AVX-512); a multiple of AVX2's 8 and NEON's 4 lanes,
# so one padded graph serves every CPU target.
COLUMN_MULTIPLE = 16
# Narrower weights keep N: the CPU rule tiles N <= 2 vectors as one whole-extent tile (no scalar tail).
MIN_COLUMNS = 2 * COLUMN_MULTIPLE + 1
# Suffix of the bindings that compute the padded columns (the sliced result keeps the original binding's var).
WIDE_SUFFIX = "_wide"


def padded_columns(n_columns: int, multiple: int = COLUMN_MULTIPLE) -> int:
    """``n_columns`` rounded up to a multiple of ``multiple``; unchanged when already one or too narrow."""
    if n_columns < max(MIN_COLUMNS, 2 * multiple + 1) or n_columns % multiple == 0:
        return n_columns
    return -(-n_columns // multiple) * multiple


def pad_matmul_columns(mod: Any, multiple: int = COLUMN_MULTIPLE) -> tuple[Any, int]:
    """(module with every ragged constant-weight matmul padded, number of matmuls padded)."""
    mod, count = apply_rewriter(mod, _padder_class()(mod, multiple))
    if count:
        log.info("padded the columns of %d constant-weight matmul(s) to multiples of %d", count, multiple)
    return mod, count


def _constant(expr: Any) -> np.ndarray | None:
    import tvm

    if isinstance(expr, tvm.ir.GenericConst):
        value = expr.value.numpy()
        return value if value.dtype.kind == "f" else None
    return None


def _is_call(expr: Any, name: str) -> bool:
    import tvm
    from tvm import relax

    return isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == name


def _wide_name(var: Any) -> str:
    """Name of the padded twin of ``var``: its own name (unique, and carrying the RNN converters' step tags that
    tvm_passes.extract reads) plus a suffix."""
    return f"{var.name}{WIDE_SUFFIX}"


def _ragged_weight(value: Any, multiple: int) -> np.ndarray | None:
    """The constant [K, N] weight of a matmul call whose N this pass pads, else None."""
    if not _is_call(value, "relax.matmul"):
        return None
    weight = _constant(value.args[1])
    if weight is None or weight.ndim != 2 or padded_columns(weight.shape[1], multiple) == weight.shape[1]:
        return None
    return weight


@functools.lru_cache(maxsize=None)
def _padder_class() -> type:
    """The mutator class, made once: TVM keeps every class its decorators make alive, with whatever it closes over
    (see tvm_passes.kernel_groups._rename_kernels_mutator); instances hold the weights only until :meth:`forget`."""
    import tvm
    from tvm import relax

    _UseCounter = use_counter_class()

    @relax.expr_functor.mutator
    class _Padder(relax.PyExprMutator):
        def __init__(self, module: Any, multiple: int) -> None:
            super().__init__(module)
            self.multiple = multiple
            self.absorbed: dict[Any, tuple] = {}          # add var -> (matmul var, matmul, W, bias)
            self.skipped: set[Any] = set()                # matmul vars emitted where their bias add is
            self.constants: list[tuple[Any, Any]] = []    # (original, padded) constants
            self.count = 0

        def forget(self) -> None:
            self.absorbed, self.skipped, self.constants = {}, set(), []

        def plan(self, func: Any) -> None:
            """Find the matmuls whose only use is an add of a constant bias along N (absorbed with it)."""
            counter = _UseCounter()
            counter.visit_expr(func)
            self.absorbed, self.skipped = {}, set()
            for var, value in counter.bindings.items():
                if not _is_call(value, "relax.add"):
                    continue
                lhs, rhs = value.args
                matmul_var, bias_expr = (lhs, rhs) if lhs in counter.bindings else (rhs, lhs)
                matmul = counter.bindings.get(matmul_var)
                weight, bias = _ragged_weight(matmul, self.multiple), _constant(bias_expr)
                if weight is None or bias is None or counter.uses[matmul_var] != 1:
                    continue
                if bias.shape[-1:] != (weight.shape[1],) or any(d != 1 for d in bias.shape[:-1]):
                    continue
                self.absorbed[var] = (matmul_var, matmul, weight, bias)
                self.skipped.add(matmul_var)

        def wide_constant(self, original: Any, value: np.ndarray) -> Any:
            """``value`` zero-padded along its last axis, one constant per original constant: an unrolled RNN
            shares one weight among its steps, and a padded copy per step would multiply its size."""
            for source, wide in self.constants:
                if source.value.same_as(original.value):
                    return wide
            n = value.shape[-1]
            padded = np.zeros(value.shape[:-1] + (padded_columns(n, self.multiple),), dtype=value.dtype)
            padded[..., :n] = value
            wide = relax.const(padded)
            self.constants.append((original, wide))
            return wide

        def padded(self, matmul_var: Any, matmul: Any, weight: np.ndarray) -> Any:
            self.count += 1
            return self.builder_.emit(relax.op.matmul(self.visit_expr(matmul.args[0]),
                                                      self.wide_constant(matmul.args[1], weight),
                                                      out_dtype=matmul.attrs.out_dtype),
                                      name_hint=_wide_name(matmul_var))

        def rebind(self, var: Any, wide: Any, n_columns: int) -> None:
            sliced = relax.op.strided_slice(wide, axes=[-1], begin=[0], end=[n_columns])
            self.builder_.emit_normalized(relax.VarBinding(var, self.builder_.normalize(sliced)))

        def visit_var_binding_(self, binding: Any) -> None:
            var, value = binding.var, binding.value
            if var in self.skipped:
                return
            if var in self.absorbed:
                matmul_var, matmul, weight, bias = self.absorbed[var]
                product = self.padded(matmul_var, matmul, weight)
                bias_first = isinstance(value.args[0], tvm.ir.GenericConst)
                wide_bias = self.wide_constant(value.args[0] if bias_first else value.args[1], bias)
                self.rebind(var, self.builder_.emit(relax.op.add(product, wide_bias), name_hint=_wide_name(var)),
                            weight.shape[1])
                return
            weight = _ragged_weight(value, self.multiple)
            if weight is not None:
                self.rebind(var, self.padded(var, value, weight), weight.shape[1])
                return
            super().visit_var_binding_(binding)

    return _Padder
