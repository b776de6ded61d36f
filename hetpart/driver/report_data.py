"""What the report is made from: the planning graph, costs, plan, simulated timeline and build facts of a compile;
and the markdown table and number formats every report section uses."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

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


def _cell(text: Any) -> str:
    return str(text).replace("\n", " ").replace("|", "\\|")


def md_table(header: Sequence[str], rows: Iterable[Sequence[Any]], align: str) -> list[str]:
    """A GitHub markdown table; ``align`` has one letter per column (``l`` or ``r``); ``|`` in cells is escaped."""
    if len(align) != len(header):
        raise ValueError(f"md_table: {len(header)} columns but alignment {align!r}")
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |",
             "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"md_table: row {list(row)} has {len(row)} cells; the header has {len(header)}")
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return lines


def fmt_us(value: float) -> str:
    """Microseconds (or any figure) with one decimal and thousands separators, as every report table shows them."""
    return f"{value:,.1f}"
