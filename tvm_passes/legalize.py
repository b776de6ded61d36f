"""hetpart's LegalizeOps: TVM's legalization with vectorisable exp, tanh, sigmoid, erf and the ops built on them.

TVM legalizes ``relax.exp`` / ``tanh`` / ``sigmoid`` / ``erf`` to ``topi.exp`` / ``tanh`` / ``sigmoid`` / ``erf``, which
the llvm backend emits as one scalar libm call (``expf``, ``erff``, ...) per element: LLVM cannot vectorise the loop.
TVM also ships vectorisable polynomial versions (``topi.fast_exp``, ``fast_tanh``, ``fast_erf``, ``nn.fast_softmax``;
its ``FastMathTransform`` pass uses them). hetpart legalizes to those for float32. Measured on this 2-core EPYC, one
128x1024 float32 kernel each, scheduled by hetpart's rules (median of 5x50 runs, ``TVM_NUM_THREADS=2``):

==========  ==================  =====================  ======================================
op          libm (TVM default)  fast (hetpart)         max error vs float64 reference
==========  ==================  =====================  ======================================
exp         169 µs              10 µs                  1.5e-7 relative
tanh        362 µs              9 µs                   2.5e-7 absolute
sigmoid     185 µs              13 µs                  1.7e-7 relative (1 / (1 + fast_exp(-x)))
erf         809 µs              21 µs                  2.4e-7 absolute
==========  ==================  =====================  ======================================

For comparison an add of the same size takes 5 µs, a divide 6 µs. These errors are float32 rounding level and far
inside the tolerances of the onnxruntime comparisons. Softmax went from 500 to 212 µs only (its reduction loops stay
scalar under the row-reduction rule). BERT's GELU (erf) had been 40% of BERT-small's forward pass,
and an LSTM cell's sigmoid/tanh kernel dominated each time step. Other dtypes keep TVM's exact ops. The ops whose
TVM legalization calls these functions internally (``nn.gelu``, ``nn.gelu_tanh``, ``nn.silu``, ``nn.softmax``) are
overridden too, with the same formulas as TVM's; the PrimFunc names are TVM's, so kernel names do not change.

Every place hetpart legalizes a Relax module uses :func:`legalize_ops` (the CPU pipeline the profiler measures,
the heterogeneous build, and the fused-kernel grouping of the extractor), so a profiled kernel is the deployed one.
``log``, ``power``, trigonometric ops, ``softplus`` and ``log_softmax`` still call libm. Sort and scan ops, which
TVM 0.27 legalizes nowhere but in its CUDA pipelines, are legalized by device (:mod:`tvm_passes.sort_scan`).
"""

from __future__ import annotations

import math
from typing import Callable

import tvm
from tvm import relax, te, tirx, topi

from tvm_passes.sort_scan import SORT_SCAN_LEGALIZATIONS

FAST_DTYPES = frozenset({"float32"})


def _fast(x: te.Tensor) -> bool:
    return str(x.dtype) in FAST_DTYPES


def exp(x: te.Tensor) -> te.Tensor:
    return topi.fast_exp(x) if _fast(x) else topi.exp(x)


def tanh(x: te.Tensor) -> te.Tensor:
    return topi.fast_tanh(x) if _fast(x) else topi.tanh(x)


def erf(x: te.Tensor) -> te.Tensor:
    return topi.fast_erf(x) if _fast(x) else topi.erf(x)


def sigmoid(x: te.Tensor) -> te.Tensor:
    if not _fast(x):
        return topi.sigmoid(x)
    one = tirx.const(1.0, x.dtype)
    return topi.divide(one, topi.add(one, topi.fast_exp(topi.negative(x))))


def gelu(x: te.Tensor) -> te.Tensor:
    half = tirx.const(0.5, x.dtype)
    return x * (half + erf(x * tirx.const(0.5 ** 0.5, x.dtype)) * half)


def gelu_tanh(x: te.Tensor) -> te.Tensor:
    dtype = x.dtype
    inner = tirx.const(math.sqrt(2.0 / math.pi), dtype) * x * (1 + tirx.const(0.044715, dtype) * x * x)
    return tirx.const(0.5, dtype) * x * (tirx.const(1.0, dtype) + tanh(inner))


def silu(x: te.Tensor) -> te.Tensor:
    return topi.multiply(x, sigmoid(x))


def _unary(te_func: Callable[[te.Tensor], te.Tensor], name: str):
    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        return bb.call_te(te_func, call.args[0], primfunc_name_hint=name)
    return legalize


def _softmax(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    def te_softmax(x: te.Tensor, axis: int) -> te.Tensor:
        return topi.nn.fast_softmax(x, axis) if _fast(x) else topi.nn.softmax(x, axis)

    return bb.call_te(te_softmax, call.args[0], call.attrs.axis, primfunc_name_hint="softmax")


# PrimFunc names as TVM's own legalization gives them (kernel names, hence the extractor's pairing, stay the same)
LEGALIZE_OVERRIDES = {
    "relax.exp": _unary(exp, "tir_exp"),
    "relax.tanh": _unary(tanh, "tir_tanh"),
    "relax.sigmoid": _unary(sigmoid, "tir_sigmoid"),
    "relax.erf": _unary(erf, "erf"),
    "relax.nn.gelu": _unary(gelu, "gelu"),
    "relax.nn.gelu_tanh": _unary(gelu_tanh, "gelu_tanh"),
    "relax.nn.silu": _unary(silu, "silu"),
    "relax.nn.softmax": _softmax,
}


def legalize_ops() -> tvm.transform.Pass:
    """``relax.transform.LegalizeOps`` with hetpart's overrides (:data:`LEGALIZE_OVERRIDES`), every op's
    legalization memoized per module (:mod:`tvm_passes.legalize_cache`), and the sort and scan ops TVM 0.27
    legalizes nowhere else (:data:`tvm_passes.sort_scan.SORT_SCAN_LEGALIZATIONS`)."""
    from tvm_passes.legalize_cache import memoized_legalize_map

    return relax.transform.LegalizeOps(customize_legalize_map=memoized_legalize_map(
        {**LEGALIZE_OVERRIDES, **SORT_SCAN_LEGALIZATIONS}))


def with_hetpart_legalization(passes: list[tvm.transform.Pass]) -> list[tvm.transform.Pass]:
    """``passes`` with every ``LegalizeOps`` replaced by :func:`legalize_ops` (for TVM's stock pass lists)."""
    return [legalize_ops() if p.info.name == "LegalizeOps" else p for p in passes]
