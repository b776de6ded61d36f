"""Machinery shared by the import rewrites (``conv_transpose_as_conv``, ``conv1d_as_conv2d``, ``pad_conv_channels``,
``pad_columns``): running a Relax mutator over a module's functions, and a visitor counting each var's uses."""
from __future__ import annotations

import functools
from collections import Counter
from typing import Any


def apply_rewriter(mod: Any, rewriter: Any) -> tuple[Any, int]:
    """Run ``rewriter`` (a ``relax.PyExprMutator`` built on ``mod`` with a ``count`` of the ops it rewrote, and
    optionally ``plan(func)`` called before and ``finish(func) -> func`` after each function, and ``forget()``) over
    every Relax function of ``mod``; returns ``(mod, 0)`` when it rewrote nothing, else the normalized new module and
    the count."""
    from tvm import relax

    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            if hasattr(rewriter, "plan"):
                rewriter.plan(func)
            visited = rewriter.visit_expr(func)
            rewriter.builder_.update_func(gv, rewriter.finish(visited) if hasattr(rewriter, "finish") else visited)
    count = rewriter.count
    if hasattr(rewriter, "forget"):
        rewriter.forget()
    if count == 0:
        return mod, 0
    return relax.transform.Normalize()(rewriter.builder_.get()), count


def out_dtype_of(attrs: Any) -> str | None:
    """A conv's ``out_dtype`` attribute as the op constructors take it: None when unset (void)."""
    text = "" if attrs.out_dtype is None else str(attrs.out_dtype)
    return None if text in ("", "void", "None") else text


@functools.lru_cache(maxsize=None)
def use_counter_class() -> type:
    """A Relax visitor recording each var's binding (``bindings``) and how often it is read (``uses``); made once
    (TVM keeps every class its decorators make alive, with whatever it closes over). The padding rewrites use it to
    find ops whose only use is a bias add they absorb."""
    from tvm import relax

    @relax.expr_functor.visitor
    class _UseCounter(relax.PyExprVisitor):
        def __init__(self) -> None:
            super().__init__()
            self.uses: Counter = Counter()
            self.bindings: dict[Any, Any] = {}

        def visit_var_binding_(self, binding: Any) -> None:
            self.bindings[binding.var] = binding.value
            self.visit_expr(binding.value)

        def visit_var_(self, var: Any) -> None:
            self.uses[var] += 1

        def visit_dataflow_var_(self, var: Any) -> None:
            self.uses[var] += 1

    return _UseCounter
