"""Which segments the task runtime runs for a plan: the runtime's own cut, or one segment per time-slice task.

A plan made by ``timeslice`` with ``timeslice_segments="slices"`` records ``plan.stats["segments"] == "slices"`` when
its N-request makespan was simulated with one segment per (layer, slice) task (``slice_segmentation``): the second
device starts a request's first slice while the first device runs the next one. Every other plan is cut by
``hetpart.segments.segment_plan`` (maximal single-device groups). Both the simulator and the runtime must use the
same segmentation; these helpers give it to them:

- :func:`kernel_segmentation`: the kernel-level segmentation ``simulate_requests`` takes for the plan (None: its
  default ``segment_plan``);
- :func:`runtime_segmentation`: the op-level segmentation the segment functions are built from (the kernel-level
  one expanded to every kernel's member ops, ids and (slice, layer) numbering kept), so the workers, which take the
  ready segment with the lowest (request, segment id), run each device's work in (request, slice, layer) order.
"""
from __future__ import annotations

from hetpart.errors import InvalidPlanError
from hetpart.graph import OpGraph
from hetpart.partition.slices import build_slice_grid
from hetpart.partition.timeslice import slice_segmentation
from hetpart.plan import Plan
from hetpart.segments import Segmentation, expand_segmentation, segment_plan

__all__ = ["SLICE_SEGMENTS", "needs_slice_segments", "kernel_segmentation", "runtime_segmentation"]

SLICE_SEGMENTS = "slices"       # the value of plan.stats["segments"] for one segment per slice task


def needs_slice_segments(plan: Plan) -> bool:
    """Whether ``plan`` was scored (and must run) with one segment per time-slice task."""
    return plan.stats.get("segments") == SLICE_SEGMENTS


def kernel_segmentation(graph: OpGraph, plan: Plan) -> Segmentation | None:
    """One segment per slice task of the kernel-level ``plan`` of ``graph`` when the plan needs it, else None (the
    task runtime's ``segment_plan``, which ``simulate_requests`` applies by default)."""
    return _slice_segments(graph, plan) if needs_slice_segments(plan) else None


def _slice_segments(graph: OpGraph, plan: Plan) -> Segmentation:
    if plan.level != "kernel" or graph.level != "kernel":
        raise InvalidPlanError(f"a time-slice plan's slice tasks are those of the kernel graph it was planned on; "
                               f"found plan level {plan.level!r} and graph level {graph.level!r} (pass "
                               "compiled.graph and compiled.plan)")
    slice_steps = plan.stats.get("slice_steps")
    if not isinstance(slice_steps, int) or isinstance(slice_steps, bool) or slice_steps < 1:
        raise InvalidPlanError(f"a plan that runs one segment per slice task must record stats['slice_steps'] (a "
                               f"positive integer); found {slice_steps!r}. Re-plan with --method timeslice")
    return slice_segmentation(graph, plan, build_slice_grid(graph, slice_steps)).validate(graph, plan)


def runtime_segmentation(op_graph: OpGraph, op_plan: Plan, kernel_graph: OpGraph | None = None,
                         kernel_plan: Plan | None = None) -> Segmentation:
    """The op-level segments the task runtime builds and runs for ``op_plan`` (the expansion of ``kernel_plan``):
    one per slice task when the plan needs it (then the kernel graph and plan are required), else
    ``segment_plan(op_graph, op_plan)``."""
    if not needs_slice_segments(kernel_plan if kernel_plan is not None else op_plan):
        return segment_plan(op_graph, op_plan)
    if kernel_graph is None or kernel_plan is None:
        raise InvalidPlanError("this plan runs one segment per time-slice task, which are cut on the kernel graph; "
                               "pass kernel_graph and kernel_plan (compiled.graph, compiled.plan) as well")
    return expand_segmentation(_slice_segments(kernel_graph, kernel_plan), kernel_graph, op_graph, op_plan)
