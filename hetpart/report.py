"""The readable side of a compile: report.md / report.html, a Gantt chart and the graph coloured by device.

Everything here is derived from the planning graph, its CostTable, the chosen Plan and the simulator's
Timelines; nothing is measured here. Predicted numbers are labelled with the source of their costs
(``measured`` / ``predicted`` / ``analytic``), and an emulated GPU is said to be emulated.
"""
from __future__ import annotations

import html
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from hetpart.costs import CostTable
from hetpart.graph import OpGraph
from hetpart.plan import Plan, Timeline

log = logging.getLogger(__name__)

DEVICE_COLOURS = {"cpu": "#1f77b4", "gpu": "#2ca02c"}
COPY_COLOUR = "#d62728"


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


def _colour(device: str) -> str:
    return DEVICE_COLOURS.get(device, "#9467bd")


def gantt_png(data: ReportData, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(data.plan.devices) + sorted({e.resource for e in data.timeline.copy_events()})
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.6 * len(rows)))
    for event in data.timeline.events:
        y = rows.index(event.resource)
        colour = COPY_COLOUR if event.kind == "copy" else _colour(event.resource)
        ax.barh(y, max(event.end_us - event.start_us, 1e-3), left=event.start_us, color=colour,
                edgecolor="black", linewidth=0.2)
    ax.set_yticks(range(len(rows)), rows)
    ax.set_xlabel("time (µs, predicted)")
    ax.set_title(f"{data.graph.name}: {data.plan.method} plan, predicted makespan {data.timeline.makespan_us:,.0f} µs")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def graph_png(data: ReportData, path: Path) -> Path:
    """Layered drawing (x = dependency depth) of the planning graph, nodes coloured by device."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(range(data.graph.num_ops))
    g.add_edges_from((e.src, e.dst) for e in data.graph.edges)
    pos = {}
    for depth, layer in enumerate(nx.topological_generations(g)):
        for k, node in enumerate(sorted(layer)):
            pos[node] = (depth, -k + (len(layer) - 1) / 2)
    width = max(6.0, min(40.0, 0.25 * (max(x for x, _ in pos.values()) + 1)))
    fig, ax = plt.subplots(figsize=(width, 5))
    colours = [_colour(data.plan.device_of[i]) for i in range(data.graph.num_ops)]
    crossing = [(e.src, e.dst) for e in data.graph.edges if data.plan.device_of[e.src] != data.plan.device_of[e.dst]]
    nx.draw_networkx_edges(g, pos, ax=ax, arrows=False, width=0.4, edge_color="#999999")
    nx.draw_networkx_edges(g, pos, edgelist=crossing, ax=ax, arrows=False, width=1.2, edge_color=COPY_COLOUR)
    nx.draw_networkx_nodes(g, pos, ax=ax, node_color=colours, node_size=25)
    for device in data.plan.devices:
        ax.scatter([], [], color=_colour(device), label=device)
    ax.plot([], [], color=COPY_COLOUR, label="copy between devices")
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(f"{data.graph.name}: {data.graph.num_ops} {data.graph.level}s coloured by device")
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def summary(data: ReportData) -> dict[str, Any]:
    """Numbers the report (and the CLI) shows: makespans, shares per device, copies."""
    op_graph = data.op_graph
    per_device: dict[str, dict[str, float]] = {}
    for device in data.plan.devices:
        kernels = data.plan.ops_on(device)
        member_ops = [i for k in kernels for i in data.graph.nodes[k].tags.get("op_ids", [k])]
        flops = sum(data.graph.nodes[k].flops for k in kernels)
        per_device[device] = {
            "kernels": len(kernels),
            "ops": len(member_ops) if op_graph is not None else len(kernels),
            "flops_share": flops / max(1, data.graph.total_flops),
            "busy_us": sum(e.end_us - e.start_us for e in data.timeline.op_events() if e.resource == device),
        }
    copies = data.timeline.copy_events()
    return {
        "model": data.graph.name, "method": data.plan.method, "makespan_us": data.timeline.makespan_us,
        "baselines_us": dict(data.baselines_us), "per_device": per_device,
        "copies": len(copies), "copied_bytes": int(sum(e.size_bytes for e in copies)),
        "copy_time_us": sum(e.end_us - e.start_us for e in copies),
        "cost_sources": {d: sorted(set(data.costs.source[:, j].tolist()))
                         for j, d in enumerate(data.costs.device_names)},
        "emulated": bool(data.build.get("emulated", False)),
    }


def markdown(data: ReportData, images: Mapping[str, str]) -> str:
    s = summary(data)
    lines = [f"# hetpart report: {s['model']}", ""]
    if s["emulated"]:
        lines += ["> **GPU EMULATED**: this machine has no CUDA device. The executable's GPU part was compiled for "
                  "and runs on a second CPU device, so run-time numbers are not GPU numbers; the plan and the "
                  "predicted times below use the GPU's cost model.", ""]
    sources = "; ".join(f"{d}: {', '.join(v)}" for d, v in s["cost_sources"].items())
    lines += [f"Method **{s['method']}**, devices {', '.join(data.plan.devices)}. Cost sources: {sources} "
              "(analytic = datasheet roofline, no measurement behind it).", "",
              "## Predicted latency (simulated, one inference)", "", "| plan | makespan (µs) | vs hetpart |",
              "|---|---:|---:|"]
    for name, value in sorted(s["baselines_us"].items(), key=lambda kv: kv[1]):
        lines.append(f"| {name} | {value:,.1f} | {value / s['makespan_us']:.2f}x |")
    lines.append(f"| **hetpart ({s['method']})** | **{s['makespan_us']:,.1f}** | 1.00x |")
    lines += ["", "## Share per device", "", "| device | kernels | ops | FLOPs share | busy (µs) |", "|---|---:|---:|---:|---:|"]
    for device, row in s["per_device"].items():
        lines.append(f"| {device} | {row['kernels']} | {row['ops']} | {row['flops_share']:.1%} | {row['busy_us']:,.1f} |")
    lines += ["", f"Copies between devices: **{s['copies']}**, {s['copied_bytes'] / 1e6:.3f} MB moved, "
              f"{s['copy_time_us']:,.1f} µs of link time.", ""]
    if data.compile_seconds:
        lines += ["Compile time: " + ", ".join(f"{k} {v:.1f} s" for k, v in data.compile_seconds.items()), ""]
    for note in list(data.cost_notes) + list(data.import_notes) + list(data.plan.notes) + list(data.build.get("notes", [])):
        lines.append(f"- note: {note}")
    lines += ["", f"![Gantt chart]({images['gantt']})", "", f"![graph coloured by device]({images['graph']})", "",
              "## Per-kernel decisions (why)", "",
              "| id | kernel | device | " + " | ".join(f"{d} µs" for d in data.plan.devices)
              + " | copy in µs | copy out µs | slack µs | critical | pinned |",
              "|" + "---|" * (9 + len(data.plan.devices))]
    for row in data.why:
        lat = " | ".join("-" if row.latency_us.get(d) is None else f"{row.latency_us[d]:,.1f}" for d in data.plan.devices)
        lines.append(f"| {row.op_id} | {row.name} | {row.device} | {lat} | {row.copy_in_us:,.1f} | "
                     f"{row.copy_out_us:,.1f} | {row.slack_us:,.1f} | {'yes' if row.on_critical_path else ''} | "
                     f"{'yes' if row.pinned else ''} |")
    return "\n".join(lines) + "\n"


def _markdown_to_html(text: str, title: str) -> str:
    """A small renderer for the subset of markdown this module writes (headings, tables, images, lists)."""
    out, table = [], False
    for line in text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if all(set(c) <= set("-:") for c in cells):
                continue
            if not table:
                out.append("<table>")
                table = True
            tag = "th" if out[-1] == "<table>" else "td"
            out.append("<tr>" + "".join(f"<{tag}>{_inline(c)}</{tag}>" for c in cells) + "</tr>")
            continue
        if table:
            out.append("</table>")
            table = False
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            out.append(f"<h{level}>{_inline(line.lstrip('# '))}</h{level}>")
        elif line.startswith("!["):
            alt, src = line[2:].split("](")
            out.append(f'<p><img alt="{html.escape(alt)}" src="{html.escape(src.rstrip(")"))}" style="max-width:100%"></p>')
        elif line.startswith("> "):
            out.append(f"<blockquote>{_inline(line[2:])}</blockquote>")
        elif line.startswith("- "):
            out.append(f"<li>{_inline(line[2:])}</li>")
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
    if table:
        out.append("</table>")
    style = ("body{font-family:sans-serif;max-width:1200px;margin:auto}table{border-collapse:collapse;font-size:12px}"
             "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}blockquote{background:#fff3cd;padding:8px}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(out)}</body></html>")


def _inline(text: str) -> str:
    escaped = html.escape(text)
    parts = escaped.split("**")
    return "".join(f"<b>{p}</b>" if i % 2 else p for i, p in enumerate(parts))


def write_report(data: ReportData, out_dir: str | Path) -> dict[str, Path]:
    """Write report.md, report.html, gantt.png and graph.png into ``out_dir``; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    gantt = gantt_png(data, out / "gantt.png")
    graph = graph_png(data, out / "graph.png")
    text = markdown(data, {"gantt": gantt.name, "graph": graph.name})
    (out / "report.md").write_text(text)
    (out / "report.html").write_text(_markdown_to_html(text, f"hetpart report: {data.graph.name}"))
    return {"markdown": out / "report.md", "html": out / "report.html", "gantt": gantt, "graph": graph}

