"""Legalizations of Relax's sort and scan ops (``cumsum``, ``cumprod``, ``sort``, ``argsort``, ``topk``).

TVM 0.27 registers no ``FLegalize`` for them: they are left to ``relax.backend.DispatchSortScan``, which TVM's
CUDA pipelines run but its CPU pipeline does not, so a model with ONNX ``CumSum`` (position ids from an attention
mask) or ``TopK`` (a detector's candidate boxes) failed to build ("CodeGenVM cannot emit this Relax operator
directly"). hetpart legalizes them in the same LegalizeOps as every other op (:func:`tvm_passes.legalize.legalize_ops`),
choosing TOPI's implementation by the device the op was placed on, as ``DispatchSortScan`` does without thrust:

- CPU (no vdevice, or a CPU vdevice, including an emulated GPU): ``topi.cumsum``/``cumprod`` (a sequential scan
  along the axis) and ``topi.sort``/``argsort``/``topk`` (calls into the TVM runtime's ``tvm.contrib.sort``);
- CUDA vdevice: ``topi.gpu.*``, already bound to threads; what they leave unscheduled gets the build's default GPU
  schedules.
"""
from __future__ import annotations

from typing import Any, Callable

from tvm import relax, topi
from tvm.target import Target

__all__ = ["SORT_SCAN_LEGALIZATIONS"]


def _gpu_target(expr: relax.Expr) -> Target | None:
    """The target of the GPU vdevice ``expr`` lives on, None on the CPU (or when it has no vdevice)."""
    vdevice = getattr(expr.ty, "vdevice", None)
    if vdevice is None or "gpu" not in vdevice.target.keys:
        return None
    return vdevice.target


def _call(bb: relax.BlockBuilder, call: relax.Call, cpu: Callable[..., Any], gpu: Callable[..., Any], name: str,
          *args: Any) -> relax.Expr:
    target = _gpu_target(call.args[0])
    if target is None:
        return bb.call_te(cpu, call.args[0], *args, primfunc_name_hint=name)
    with target:                       # topi.gpu reads the thread limits of the current target
        return bb.call_te(gpu, call.args[0], *args, primfunc_name_hint=name)


def _axis(call: relax.Call) -> int | None:
    return None if call.attrs.axis is None else int(call.attrs.axis)


def _dtype(call: relax.Call) -> str | None:
    dtype = call.attrs.dtype
    return None if dtype is None or str(dtype) in ("", "void") else str(dtype)


def _cumsum(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    return _call(bb, call, topi.cumsum, topi.gpu.cumsum, "cumsum", _axis(call), _dtype(call),
                 bool(call.attrs.exclusive))


def _cumprod(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    return _call(bb, call, topi.cumprod, topi.gpu.cumprod, "cumprod", _axis(call), _dtype(call),
                 bool(call.attrs.exclusive))


def _sort(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    return _call(bb, call, topi.sort, topi.gpu.sort, "sort", int(call.attrs.axis), not call.attrs.descending)


def _argsort(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    def cpu(x: Any, axis: int, ascending: bool, dtype: str) -> Any:
        return topi.argsort(x, axis=axis, is_ascend=ascending, dtype=dtype)

    def gpu(x: Any, axis: int, ascending: bool, dtype: str) -> Any:
        return topi.gpu.argsort(x, axis=axis, is_ascend=ascending, dtype=dtype)

    return _call(bb, call, cpu, gpu, "argsort", int(call.attrs.axis), not call.attrs.descending,
                 _dtype(call) or "int32")


def _topk(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    return _call(bb, call, topi.topk, topi.gpu.topk, "topk", int(call.attrs.k), int(call.attrs.axis),
                 str(call.attrs.ret_type), not call.attrs.largest, _dtype(call) or "int32")


SORT_SCAN_LEGALIZATIONS = {
    "relax.cumsum": _cumsum,
    "relax.cumprod": _cumprod,
    "relax.sort": _sort,
    "relax.argsort": _argsort,
    "relax.topk": _topk,
}
