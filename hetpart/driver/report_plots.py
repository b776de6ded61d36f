"""The figures of a compile report: ``gantt.png`` (the predicted timeline) and ``graph.png`` (the planning graph
coloured by device).

A small graph is drawn kernel by kernel, top to bottom in data-flow order, with a label per kernel. A large one
(e.g. an unrolled RNN) is drawn compactly: kernels are grouped into blocks by dependency depth (left to right)
and device (one lane per device), each block labelled with its kernel count, and the edges between blocks are
aggregated into one arrow per block pair. Both images stay within ``MAX_IMAGE_SIDE_PX`` on their long side.
"""
from __future__ import annotations

import logging
import textwrap
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from hetpart.driver.report_data import ReportData

log = logging.getLogger(__name__)

DEVICE_COLOURS = {"cpu": "#1f77b4", "gpu": "#2ca02c"}
OTHER_DEVICE_COLOUR = "#9467bd"
COPY_COLOUR = "#d62728"
IO_COLOUR = "#bbbbbb"
DPI = 100
MAX_IMAGE_SIDE_PX = 2400
MAX_SIDE_IN = MAX_IMAGE_SIDE_PX / DPI
SMALL_GRAPH_MAX_KERNELS = 80       # up to this many kernels, every kernel is drawn and labelled
ROW_IN = 0.42                      # detailed drawing: vertical distance between dependency levels, at most
MIN_ROW_IN = 0.3                   # ... and at least (deeper graphs are drawn compactly)
DETAILED_MARGIN_IN = 1.8           # detailed drawing: title and legend above the graph
COLUMN_IN = 2.6                    # detailed drawing: horizontal distance between kernels of one level
COMPACT_MAX_BANDS = 14             # compact drawing: at most this many depth bands (columns of blocks)
BAND_IN = 1.45
LANE_IN = 1.7
LABEL_MAX_CHARS = 26


def device_colour(device: str) -> str:
    return DEVICE_COLOURS.get(device, OTHER_DEVICE_COLOUR)


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def cost_sources_text(data: "ReportData") -> str:
    """Where each device's costs come from, for a figure's title: ``cpu: predicted, gpu: analytic``."""
    parts = [f"{d}: {'/'.join(sorted(set(data.costs.source[:, j].tolist())))}"
             for j, d in enumerate(data.costs.device_names)]
    return ", ".join(parts)


# ---------------------------------------------------------------------------------------------- Gantt chart
def gantt_png(data: "ReportData", path: Path) -> Path:
    """The simulator's predicted timeline of one inference: one row per device, one per copy direction."""
    from matplotlib.patches import Patch

    plt = pyplot()
    links = sorted({e.resource for e in data.timeline.copy_events()})
    rows = list(data.plan.devices) + links
    labels = list(data.plan.devices) + [f"copy {r.replace('->', ' → ')}" for r in links]
    fig, ax = plt.subplots(figsize=(12, 1.6 + 0.55 * len(rows)))
    spans: dict[str, list[tuple[float, float]]] = {}
    for event in data.timeline.events:
        spans.setdefault(event.resource, []).append((event.start_us, max(event.end_us - event.start_us, 1e-3)))
    for y, resource in enumerate(rows):      # one collection per row: fast for thousands of events
        colour = COPY_COLOUR if resource in links else device_colour(resource)
        ax.broken_barh(spans.get(resource, []), (y - 0.35, 0.7), facecolors=colour, edgecolor="black",
                       linewidth=0.2)
    ax.set_yticks(range(len(rows)), labels)
    ax.set_xlabel("time since the inference starts (µs, predicted)")
    ax.set_xlim(0, max(data.timeline.makespan_us, 1e-3) * 1.01)
    ax.set_title(f"{data.graph.name}: predicted timeline of one inference, {data.plan.method} plan, "
                 f"makespan {data.timeline.makespan_us:,.1f} µs\n"
                 f"simulated from the cost model ({cost_sources_text(data)}), not measured", fontsize=10)
    handles = [Patch(color=device_colour(d), label=f"kernel on {d}") for d in data.plan.devices]
    handles.append(Patch(color=COPY_COLOUR, label="copy between devices"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=len(handles), fontsize=8,
              frameon=False)
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------- graph drawing
def dependency_depth(data: "ReportData") -> list[int]:
    """Longest path (in kernels) from a graph source to every kernel; ids are topological."""
    depth = [0] * data.graph.num_ops
    for node in data.graph.nodes:
        depth[node.id] = 1 + max((depth[u] for u in node.inputs), default=-1)
    return depth


def short_label(name: str) -> str:
    """A kernel's name without the ``fused_`` prefix, cut to ``LABEL_MAX_CHARS``."""
    text = name.removeprefix("fused_")
    return text if len(text) <= LABEL_MAX_CHARS else text[:LABEL_MAX_CHARS - 1] + "…"


def graph_form(data: "ReportData") -> str:
    """``"detailed"`` when every kernel fits labelled within the size bound, else ``"compact"``."""
    depth = dependency_depth(data)
    levels = max(depth, default=0) + 1
    widest = max(Counter(depth).values(), default=1)
    fits = detailed_row_in(levels) >= MIN_ROW_IN and widest * COLUMN_IN + 1.0 <= MAX_SIDE_IN
    return "detailed" if data.graph.num_ops <= SMALL_GRAPH_MAX_KERNELS and fits else "compact"


def detailed_row_in(levels: int) -> float:
    """Vertical distance between dependency levels that keeps a detailed drawing within the size bound."""
    return min(ROW_IN, (MAX_SIDE_IN - DETAILED_MARGIN_IN - 0.05) / (levels + 2))


def graph_png(data: "ReportData", path: Path) -> Path:
    """``path``: every kernel labelled (small graphs) or depth x device blocks with counts (large graphs)."""
    depth, form = dependency_depth(data), graph_form(data)
    log.debug("%s: %s drawing of %d kernels", path.name, form, data.graph.num_ops)
    return (_draw_detailed if form == "detailed" else _draw_compact)(data, depth, path)


def _legend_handles(data: "ReportData", counts: Counter, *, critical: bool) -> list[Any]:
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], marker="o", linestyle="", markersize=9, color=device_colour(d),
                      label=f"on {d} ({counts.get(d, 0)} kernels)") for d in data.plan.devices]
    handles.append(Line2D([], [], color=COPY_COLOUR, linewidth=2, label="tensor copied between devices"))
    handles.append(Line2D([], [], color="#777777", linewidth=1, label="data flow, same device"))
    if critical:
        handles.append(Line2D([], [], marker="o", linestyle="", markersize=9, markerfacecolor="white",
                              markeredgecolor="black", markeredgewidth=2, label="on the predicted critical path"))
    handles.append(Line2D([], [], marker="s", linestyle="", markersize=8, color=IO_COLOUR,
                          label="model input / output (on the host)"))
    return handles


def _barycentre_order(layers: list[list[int]], preds: Sequence[Sequence[int]]) -> dict[int, float]:
    """x position of every node: each level sorted by the mean x of its producers (fewer crossings)."""
    x: dict[int, float] = {}
    for layer in layers:
        keyed = sorted(layer, key=lambda v: (sum(x[u] for u in preds[v]) / len(preds[v]) if preds[v] else 0.0, v))
        for k, v in enumerate(keyed):
            x[v] = (k - (len(keyed) - 1) / 2) * COLUMN_IN
    return x


def _draw_detailed(data: "ReportData", depth: list[int], path: Path) -> Path:
    import networkx as nx

    plt = pyplot()
    graph, device_of = data.graph, data.plan.device_of
    host = data.plan.devices[0]
    levels = max(depth, default=0) + 1
    layers: list[list[int]] = [[] for _ in range(levels)]
    for v, d in enumerate(depth):
        layers[d].append(v)
    x = _barycentre_order(layers, graph.predecessors())
    row_in = detailed_row_in(levels)
    pos: dict[object, tuple[float, float]] = {v: (x[v], -(depth[v] + 1) * row_in) for v in range(graph.num_ops)}
    g = nx.DiGraph()
    g.add_nodes_from(pos)
    g.add_edges_from((e.src, e.dst) for e in graph.edges)
    io_edges: list[tuple[object, object]] = []
    for k, spec in enumerate(graph.inputs):
        key = f"in{k}"
        pos[key] = ((k - (len(graph.inputs) - 1) / 2) * COLUMN_IN, 0.0)
        io_edges += [(key, c) for c in spec.consumers]
    for k, spec in enumerate(graph.outputs):
        key = f"out{k}"
        pos[key] = ((k - (len(graph.outputs) - 1) / 2) * COLUMN_IN, -(levels + 1) * row_in)
        if spec.producer is not None:
            io_edges.append((spec.producer, key))
    g.add_nodes_from(p for p in pos if isinstance(p, str))
    g.add_edges_from(io_edges)

    def device(node: object) -> str:
        return host if isinstance(node, str) else device_of[int(node)]

    crossing = [e for e in g.edges if device(e[0]) != device(e[1])]
    local = [e for e in g.edges if device(e[0]) == device(e[1])]
    xs = [p[0] for p in pos.values()]
    left_in, right_in = min(xs) - 0.4, max(xs) + 0.75 * COLUMN_IN     # labels sit right of their kernel
    width_in = min(MAX_SIDE_IN, max(7.0, right_in - left_in + 0.4))
    height_in = (levels + 2) * row_in + DETAILED_MARGIN_IN
    fig = plt.figure(figsize=(width_in, height_in))
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0 - 1.3 / height_in))
    ax.set_xlim((left_in + right_in - width_in) / 2, (left_in + right_in + width_in) / 2)
    ax.set_ylim(-(levels + 1.6) * row_in, 0.5 * row_in)
    kernels = list(range(graph.num_ops))
    critical = {row.op_id for row in data.why if row.on_critical_path}
    common = dict(ax=ax, arrows=True, arrowstyle="-|>", arrowsize=9, node_size=110)
    nx.draw_networkx_edges(g, pos, edgelist=local, width=0.8, edge_color="#777777", **common)
    nx.draw_networkx_edges(g, pos, edgelist=crossing, width=1.8, edge_color=COPY_COLOUR, **common)
    nx.draw_networkx_nodes(g, pos, nodelist=kernels, ax=ax, node_size=110,
                           node_color=[device_colour(device_of[v]) for v in kernels],
                           edgecolors=["black" if v in critical else "white" for v in kernels],
                           linewidths=[2.0 if v in critical else 0.5 for v in kernels])
    io_nodes = [p for p in pos if isinstance(p, str)]
    nx.draw_networkx_nodes(g, pos, nodelist=io_nodes, ax=ax, node_size=90, node_shape="s", node_color=IO_COLOUR)
    labels = {v: f"{v} {short_label(graph.nodes[v].name)}" for v in kernels}
    labels.update({f"in{k}": f"model input {spec.name}" for k, spec in enumerate(graph.inputs)})
    labels.update({f"out{k}": f"model output {spec.name}" for k, spec in enumerate(graph.outputs)})
    for node, label in labels.items():      # on a white patch, so that edges do not run through the text
        ax.text(pos[node][0] + 0.11, pos[node][1], label, fontsize=7, va="center",
                bbox=dict(facecolor="white", edgecolor="none", alpha=0.8, pad=0.4))
    ax.axis("off")
    counts = Counter(device_of)
    fig.suptitle(f"{graph.name}: {graph.num_ops} kernels placed by the {data.plan.method} plan\n"
                 "data flows from top to bottom; label = kernel id (as in the report's table) and name",
                 fontsize=10, y=1.0 - 0.1 / height_in, va="top")
    fig.legend(handles=_legend_handles(data, counts, critical=bool(critical)), loc="upper center", fontsize=7,
               ncol=3, frameon=False, bbox_to_anchor=(0.5, 1.0 - 0.55 / height_in))
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------- compact form
@dataclass(frozen=True)
class Block:
    """Kernels of one depth band placed on one device."""

    band: int
    device: str
    kernels: tuple[int, ...]


def compact_blocks(data: "ReportData", depth: Sequence[int], max_bands: int = COMPACT_MAX_BANDS) -> list[Block]:
    """Kernels grouped by (depth band, device); bands split the dependency depth into equal ranges."""
    levels = max(depth, default=0) + 1
    n_bands = min(max_bands, levels)
    members: dict[tuple[int, str], list[int]] = {}
    for v, d in enumerate(depth):
        members.setdefault((d * n_bands // levels, data.plan.device_of[v]), []).append(v)
    return [Block(band, device, tuple(ids)) for (band, device), ids in sorted(members.items())]


def block_description(data: "ReportData", block: Block) -> str:
    """What a block holds: its RNN layers/time steps when the graph is an unrolled RNN, else its commonest kernel."""
    steps: dict[int, list[int]] = {}
    for v in block.kernels:
        tags = data.graph.nodes[v].tags
        if tags.get("rnn_phase") == "step":
            steps.setdefault(int(tags["rnn_layer"]), []).append(int(tags["rnn_step"]))
    if steps:
        return "\n".join(f"layer {layer} t{min(t)}–{max(t)}" if min(t) != max(t) else f"layer {layer} t{t[0]}"
                         for layer, t in sorted(steps.items())[:2])
    kinds = Counter(op_kind(data.graph.nodes[v].op) for v in block.kernels)
    name, count = kinds.most_common(1)[0]
    name = name if len(name) <= 15 else name[:14] + "…"
    return f"{name} ×{count}" if count > 1 else name


def op_kind(op: str) -> str:
    """``fused:nn.conv2d+add+nn.relu`` / ``relax.nn.conv2d`` -> ``conv2d+add+relu`` / ``conv2d``."""
    parts = op.removeprefix("fused:").split("+")
    return "+".join(p.removeprefix("relax.").removeprefix("nn.") for p in parts)


def _draw_compact(data: "ReportData", depth: Sequence[int], path: Path) -> Path:
    from matplotlib.patches import FancyBboxPatch

    plt = pyplot()
    graph, device_of = data.graph, data.plan.device_of
    blocks = compact_blocks(data, depth)
    n_bands = max(b.band for b in blocks) + 1
    lanes = list(data.plan.devices)
    host = lanes[0]
    block_of = {v: i for i, b in enumerate(blocks) for v in b.kernels}
    width_in = min(MAX_SIDE_IN, max(10.0, (n_bands + 2) * BAND_IN + 0.4))
    height_in = len(lanes) * LANE_IN + 1.5
    fig = plt.figure(figsize=(width_in, height_in))
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0 - 1.3 / height_in))
    ax.set_xlim(-1.6 * BAND_IN, (n_bands + 0.6) * BAND_IN)
    ax.set_ylim(-(len(lanes) - 0.35) * LANE_IN, 0.55 * LANE_IN)
    ax.axis("off")
    box_w, box_h = 0.74 * BAND_IN, 0.62 * LANE_IN
    centres: dict[object, tuple[float, float]] = {}
    patches: dict[object, FancyBboxPatch] = {}

    def add_box(key: object, cx: float, cy: float, colour: str, text: str, text_colour: str) -> None:
        patch = FancyBboxPatch((cx - box_w / 2, cy - box_h / 2), box_w, box_h, boxstyle="round,pad=0.02",
                               facecolor=colour, edgecolor="black", linewidth=0.6)
        ax.add_patch(patch)
        ax.text(cx, cy, text, ha="center", va="center", fontsize=7, color=text_colour)
        centres[key], patches[key] = (cx, cy), patch

    for lane, device in enumerate(lanes):
        ax.text(-1.55 * BAND_IN, -lane * LANE_IN, device, fontsize=11, fontweight="bold", va="center",
                color=device_colour(device))
        ax.axhline(-lane * LANE_IN - LANE_IN / 2, color="#eeeeee", linewidth=0.8, zorder=0)
    # model inputs/outputs get arrows from the first/to the last band; elsewhere the block's text says so
    reads_input = {block_of[c] for spec in graph.inputs for c in spec.consumers}
    n_outputs = Counter(block_of[t.producer] for t in graph.outputs if t.producer is not None)
    for i, b in enumerate(blocks):
        first, last = min(b.kernels), max(b.kernels)
        text = (f"{len(b.kernels)} kernel{'s' if len(b.kernels) > 1 else ''}\n"
                f"{f'#{first}' if first == last else f'#{first}–{last}'}\n{block_description(data, b)}")
        if i in reads_input and b.band > 0:
            text += "\nreads model input"
        if n_outputs.get(i) and b.band < n_bands - 1:
            text += f"\n{n_outputs[i]} model output{'s' if n_outputs[i] > 1 else ''}"
        add_box(i, b.band * BAND_IN, -lanes.index(b.device) * LANE_IN, device_colour(b.device), text, "white")
    add_box("in", -1.0 * BAND_IN, 0.0, IO_COLOUR, "model\ninputs", "black")
    add_box("out", n_bands * BAND_IN, 0.0, IO_COLOUR, "model\noutputs", "black")
    # one arrow per (block, block) pair; a red arrow counts the tensors copied (one per producer and device)
    pairs: dict[tuple[object, object], set] = {}
    for e in graph.edges:
        a, b = block_of[e.src], block_of[e.dst]
        if a != b:
            pairs.setdefault((a, b), set()).add(e.src)
    for k, spec in enumerate(graph.inputs):
        for c in spec.consumers:
            if blocks[block_of[c]].band == 0:
                pairs.setdefault(("in", block_of[c]), set()).add(-1 - k)
    for spec in graph.outputs:
        if spec.producer is not None and blocks[block_of[spec.producer]].band == n_bands - 1:
            pairs.setdefault((block_of[spec.producer], "out"), set()).add(spec.producer)

    def device_of_key(key: object) -> str:
        return host if isinstance(key, str) else blocks[int(key)].device

    for (a, b), producers in pairs.items():
        (xa, ya), (xb, yb) = centres[a], centres[b]
        copied = device_of_key(a) != device_of_key(b)
        rad = 0.12 if ya != yb and (b, a) in pairs else 0.0     # opposite copies between two blocks bend apart
        if ya == yb and abs(xb - xa) > 1.01 * BAND_IN:   # along a lane, past other blocks: above/below them
            rad = (-1.0 if ya == 0.0 else 1.0) * (1.0 if xb > xa else -1.0) * 0.9 * LANE_IN / abs(xb - xa)
        ax.annotate("", xy=(xb, yb), xytext=(xa, ya), zorder=1,
                    arrowprops=dict(arrowstyle="-|>", color=COPY_COLOUR if copied else "#777777",
                                    linewidth=1.6 if copied else 0.8, patchA=patches[a], patchB=patches[b],
                                    connectionstyle=f"arc3,rad={rad}", shrinkA=1, shrinkB=1))
        if copied:      # the label sits on the arc's midpoint
            mx, my = (xa + xb) / 2 + rad * (yb - ya) / 2, (ya + yb) / 2 - rad * (xb - xa) / 2
            ax.text(mx, my, f"{len(producers)}", fontsize=7, color=COPY_COLOUR, ha="center",
                    va="center", bbox=dict(boxstyle="round,pad=0.15", facecolor="white", edgecolor=COPY_COLOUR,
                                           linewidth=0.5))
    counts = Counter(device_of)
    explanation = textwrap.fill(
        "dependency depth grows left to right (each column is a range of depths); a block = the kernels of that "
        "range on one device (kernel ids as in the report's table); a red arrow's number = tensors copied",
        width=int(width_in * 13))
    fig.suptitle(f"{graph.name}: {graph.num_ops} kernels placed by the {data.plan.method} plan, in {len(blocks)} "
                 f"blocks\n{explanation}", fontsize=9, y=1.0 - 0.1 / height_in, va="top")
    fig.legend(handles=_legend_handles(data, counts, critical=False), loc="upper center", fontsize=7,
               ncol=5, frameon=False, bbox_to_anchor=(0.5, 1.0 - 0.78 / height_in))
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
