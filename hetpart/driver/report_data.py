"""What the report is made from: the planning graph, costs, plan, simulated timeline and build facts of a compile."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from hetpart.costs import CostTable
from hetpart.graph import OpGraph
from hetpart.plan import Plan, Timeline


@dataclass(frozen=True)
class ReportData:
    graph: OpGraph                       # the planning graph (kernel level)
    costs: CostTable
    plan: Plan
    timeline: Timeline
    baselines_us: Mapping[str, float]    # method -> simulated makespan (all_cpu, all_gpu, ...)
    why: Sequence[Any]                   # hetpart.partition.OpWhy rows
    op_graph: OpGraph | None = None      # op level (for op counts / FLOPs shares)
    build: Mapping[str, Any] = field(default_factory=dict)   # manifest facts: emulated, build time, notes
    compile_seconds: Mapping[str, float] = field(default_factory=dict)
    import_notes: Sequence[str] = ()     # what the frontend changed in the graph (e.g. padded matmul columns)
    cost_notes: Sequence[str] = ()       # where the costs came from (e.g. which CPU predictor, measured on which CPU)
    weight_uploads: int | None = None    # weight tensors the build copies to non-host devices once, at load
    weight_upload_bytes: int | None = None
    program_copies_per_call: int | None = None   # tensor copies left in the compiled main (run every inference)
    task_runtime: Mapping[str, Any] | None = None   # predicted task-runtime figures (compile --segments)
