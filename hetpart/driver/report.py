"""The readable side of a compile: report.md / report.html, a Gantt chart and the graph coloured by device.

Everything here is derived from the planning graph, its CostTable, the chosen Plan, the simulator's Timeline
and the build's manifest; nothing is measured here. Every time is labelled predicted, with the source of its
costs (``measured`` / ``predicted`` / ``analytic``), and an emulated GPU is said to be emulated.
The figures are drawn by :mod:`hetpart.driver.report_plots`.
"""
from __future__ import annotations

import csv
import html
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from hetpart.driver.report_data import ReportData, fmt_us as _us, md_table
from hetpart.driver.report_fidelity import task_runtime_section
from hetpart.driver.report_plots import COPY_COLOUR, DEVICE_COLOURS, gantt_png, graph_png
from hetpart.driver.report_requests import GANTT_IMAGE, RequestsView, requests_gantt_png, requests_section, \
    requests_view

log = logging.getLogger(__name__)

__all__ = ["COPY_COLOUR", "DEVICE_COLOURS", "CopyCounts", "ReportData", "copy_counts", "gantt_png", "graph_png",
           "markdown", "markdown_to_html", "md_table", "summary", "write_report"]

MAX_KERNEL_ROWS = 200          # larger graphs list the critical path and the longest kernels (all in kernels.csv)
BASELINE_MEANING = {"all_cpu": "every kernel on the CPU",
                    "all_gpu": "every kernel the GPU can run on the GPU, the rest on the CPU",
                    "greedy": "the GPU takes every kernel it supports (like ONNX Runtime)",
                    "heft": "HEFT list scheduling"}
SOURCE_MEANING = {"measured": "timed on the device", "predicted": "a model fitted to measurements",
                  "analytic": "a datasheet roofline, no measurement behind it"}
_UPLOAD_NOTE = re.compile(r"^\w+\(\) uploads (\d+) bytes of weights")
_UNSCHEDULED_NOTE = re.compile(r"^(.*): CPU kernels are unscheduled$")


@dataclass(frozen=True)
class CopyCounts:
    """Copies between devices: per inference (the simulator's Timeline) and once at load (the build)."""

    per_inference: int
    per_inference_bytes: int
    link_time_us: float                  # predicted, summed over the copies
    critical: int                        # copies the result waits for (on the predicted critical path)
    model_inputs: int                    # of them, model inputs sent from the host to another device
    model_outputs: int                   # of them, model outputs brought back to the host
    weight_uploads: int | None           # None: the build did not report how many
    weight_upload_bytes: int | None
    weight_bytes_estimated: bool         # True: from the planning graph's parameter sizes, not from the build


def copy_counts(data: ReportData) -> CopyCounts:
    graph, device_of, host = data.graph, data.plan.device_of, data.plan.devices[0]
    start = {e.op_id: e.start_us for e in data.timeline.op_events()}
    critical_ops = {row.op_id for row in data.why if row.on_critical_path}
    outputs = {t.producer for t in graph.outputs if t.producer is not None}
    succ = graph.successors()
    tol = 1e-6 * max(data.timeline.makespan_us, 1.0)
    copies = data.timeline.copy_events()
    critical = model_inputs = model_outputs = 0
    for e in copies:
        dst = e.resource.split("->")[-1]
        readers = succ[e.op_id] if e.op_id >= 0 else graph.inputs[-1 - e.op_id].consumers
        is_output = e.op_id in outputs and dst == host
        model_inputs += int(e.op_id < 0)
        model_outputs += int(is_output)
        waited = [v for v in readers if device_of[v] == dst and v in critical_ops and abs(start[v] - e.end_us) <= tol]
        critical += int(bool(waited) or (is_output and abs(e.end_us - data.timeline.makespan_us) <= tol))
    uploads, upload_bytes, estimated = data.weight_uploads, data.weight_upload_bytes, False
    if upload_bytes is None:
        parsed = [int(m.group(1)) for n in data.build.get("notes", ()) if (m := _UPLOAD_NOTE.match(str(n)))]
        if parsed:
            upload_bytes = parsed[0]
        elif data.build and not data.build.get("weights_function"):     # the build uploads no weights
            upload_bytes, uploads = 0, 0 if uploads is None else uploads
        else:
            upload_bytes = sum(n.param_bytes for n in graph.nodes if device_of[n.id] != host)
            estimated = True
    return CopyCounts(len(copies), int(sum(e.size_bytes for e in copies)), sum(e.end_us - e.start_us for e in copies),
                      critical, model_inputs, model_outputs, uploads, upload_bytes, estimated)


def summary(data: ReportData) -> dict[str, Any]:
    """Numbers the report (and the CLI) shows: makespans, shares per device, copies."""
    per_device: dict[str, dict[str, float]] = {}
    for device in data.plan.devices:
        kernels = data.plan.ops_on(device)
        member_ops = [i for k in kernels for i in data.graph.nodes[k].tags.get("op_ids", [k])]
        per_device[device] = {
            "kernels": len(kernels),
            "ops": len(member_ops) if data.op_graph is not None else len(kernels),
            "flops_share": sum(data.graph.nodes[k].flops for k in kernels) / max(1, data.graph.total_flops),
            "busy_us": sum(e.end_us - e.start_us for e in data.timeline.op_events() if e.resource == device),
            "peak_memory_bytes": int(data.timeline.peak_memory_bytes.get(device, 0)),
        }
    c = copy_counts(data)
    return {
        "model": data.graph.name, "method": data.plan.method, "makespan_us": data.timeline.makespan_us,
        "baselines_us": dict(data.baselines_us), "per_device": per_device,
        "copies": c.per_inference, "copied_bytes": c.per_inference_bytes, "copy_time_us": c.link_time_us,
        "critical_copies": c.critical, "weight_uploads": c.weight_uploads,
        "weight_upload_bytes": c.weight_upload_bytes, "weight_bytes_estimated": c.weight_bytes_estimated,
        "cost_sources": {d: sorted(set(data.costs.source[:, j].tolist()))
                         for j, d in enumerate(data.costs.device_names)},
        "emulated": bool(data.build.get("emulated", False)),
    }


# ---------------------------------------------------------------------------------------------- markdown
def _mb(size_bytes: float) -> str:
    return f"{size_bytes / 1e6:,.2f}"


def _build_notes(build: Mapping[str, Any]) -> list[str]:
    """The build's notes in user terms; what other sections already say (weights, emulation) is left out."""
    out = []
    for note in map(str, build.get("notes", ())):
        if _UPLOAD_NOTE.match(note) or note.startswith("EMULATED"):
            continue
        unscheduled = _UNSCHEDULED_NOTE.match(note)
        out.append(f"CPU kernels were compiled without hetpart's CPU schedules ({unscheduled.group(1)}), so they "
                   "will likely run slower than the predicted CPU times" if unscheduled else note)
    return out


def _copies_section(data: ReportData, c: CopyCounts) -> list[str]:
    where = " and ".join(f"the {d}" for d in data.plan.devices[1:]) or "the other devices"
    waited = ("none is on the critical path (the result waits for none of them)" if c.critical == 0 else
              f"{c.critical} {'is' if c.critical == 1 else 'are'} on the critical path (the result waits for "
              f"{'it' if c.critical == 1 else 'them'})")
    io = "".join(part for n, part in (
        (c.model_inputs, f"; {c.model_inputs} send{'s' if c.model_inputs == 1 else ''} a model input from the host"),
        (c.model_outputs, f"; {c.model_outputs} bring{'s' if c.model_outputs == 1 else ''} a model output back to "
                          "the host")) if n)
    lines = ["## Copies between devices", "",
             f"- **Every inference: {c.per_inference} tensor cop{'y' if c.per_inference == 1 else 'ies'}** "
             f"({_mb(c.per_inference_bytes)} MB, {_us(c.link_time_us)} µs of link time, predicted). Of these, "
             f"{waited}{io}."]
    if c.weight_upload_bytes:
        count = ("the weights" if c.weight_uploads is None else
                 f"{c.weight_uploads} weight tensor{'' if c.weight_uploads == 1 else 's'}")
        size = (f"about {_mb(c.weight_upload_bytes)} MB, estimated from the parameter sizes of the kernels placed "
                "there" if c.weight_bytes_estimated else f"{_mb(c.weight_upload_bytes)} MB")
        one = c.weight_uploads == 1
        lines.append(f"- **Once, when the model is loaded:** {count} ({size}) {'is' if one else 'are'} uploaded to "
                     f"{where} and stay{'s' if one else ''} there, so inferences do not copy "
                     f"{'it' if one else 'them'} again (`hetpart.load` and `hetpart run` do this "
                     "upload for you).")
    else:
        lines.append(f"- **Once, when the model is loaded:** no weights are uploaded (no kernel with weights runs "
                     f"on {where}).")
    per_call = c.per_inference if data.program_copies_per_call is None else data.program_copies_per_call
    if per_call != c.per_inference:
        lines.append(f"- The compiled program makes {per_call} copies per inference where the simulator predicts "
                     f"{c.per_inference}: the predicted copy times may be off by the difference.")
    if c.weight_uploads is not None:
        total = per_call + c.weight_uploads
        lines.append(f"- The compiled program contains {total} copies in all: {per_call} per inference + "
                     f"{c.weight_uploads} weight uploads at load (the compile log's \"{total} copies "
                     f"({c.weight_uploads} of constants)\").")
    return lines + [""]


def _kernel_rows(data: ReportData) -> tuple[list[Any], bool]:
    """The per-kernel rows to list: all, or for a large graph the critical path then the longest kernels."""
    rows = list(data.why)
    if len(rows) <= MAX_KERNEL_ROWS:
        return rows, False
    own_time = {r.op_id: r.latency_us.get(r.device) or 0.0 for r in rows}
    ranked = sorted(rows, key=lambda r: (not r.on_critical_path, -own_time[r.op_id], r.op_id))
    return sorted(ranked[:MAX_KERNEL_ROWS], key=lambda r: r.op_id), True


def markdown(data: ReportData, images: Mapping[str, str], kernels_csv: str | None = None,
             requests: RequestsView | None = None) -> str:
    """The report; ``requests``: the plan's many-request simulation (computed here when the plan was made for
    several requests or by timeslice and it is not given)."""
    s, c, devices = summary(data), copy_counts(data), list(data.plan.devices)
    requests = requests if requests is not None else requests_view(data)
    lines = [f"# hetpart report: {s['model']}", ""]
    if s["emulated"]:
        lines += ["> **GPU EMULATED.** The GPU part of this executable was compiled for the CPU and runs on the "
                  "CPU (this machine has no usable CUDA GPU, or emulation was asked for). Running it checks the "
                  "results; its speed says nothing about a GPU. The plan and every time in this report are "
                  "predictions for the modelled GPU.", ""]
    headline = f"**Predicted latency of one inference: {_us(s['makespan_us'])} µs** ({s['method']} plan on " \
               f"{', '.join(devices)})"
    all_cpu_us = s["baselines_us"].get("all_cpu")
    if all_cpu_us and s["makespan_us"] > 0:
        ratio = all_cpu_us / s["makespan_us"]
        headline += (f", {ratio:.2f}× faster" if ratio >= 1 else f", {1 / ratio:.2f}× slower") + \
            " than running everything on the CPU (predicted)"
    lines += [headline + ".", "",
              "All times here are **predicted** by hetpart's simulator from per-kernel cost estimates; none was "
              "measured. Where the estimates come from:", ""]
    specs = {d.name: d for d in data.costs.devices.devices}
    for device, sources in s["cost_sources"].items():
        spec = specs.get(device)
        model = f"; modelled device: {spec.citation}" if spec is not None and spec.citation else ""
        lines.append(f"- {device}: " + ", ".join(f"{src} ({SOURCE_MEANING.get(src, src)})" for src in sources)
                     + model)
    lines += ["", "## Predicted latency of one inference", ""]
    rows = [[f"{name}", BASELINE_MEANING.get(name, name), _us(v), f"{v / s['makespan_us']:.2f}×"]
            for name, v in sorted(s["baselines_us"].items(), key=lambda kv: kv[1])]
    rows.append([f"**hetpart ({s['method']})**", "the chosen plan", f"**{_us(s['makespan_us'])}**", "1.00×"])
    lines += md_table(["plan", "what it does", "predicted latency (µs)", "times the hetpart plan's latency"], rows,
                      "llrr")
    if requests is not None:
        lines += ["", f"The plan was made for {requests.n_requests} request{'s' if requests.n_requests > 1 else ''} "
                  "in flight, not for one inference: see *Many requests in flight* below."]
        lines += [""] + requests_section(data, requests, images.get("gantt_requests", GANTT_IMAGE))
    lines += ["", "## Work per device", ""]
    lines += md_table(["device", "kernels", "ops", "share of FLOPs", "predicted busy time (µs)",
                       "predicted peak memory (MB)"],
                      [[d, r["kernels"], r["ops"], f"{r['flops_share']:.1%}", _us(r["busy_us"]),
                        _mb(r["peak_memory_bytes"])] for d, r in s["per_device"].items()], "lrrrrr")
    lines += [""] + _copies_section(data, c)
    lines += task_runtime_section(data.costs.devices, data.task_runtime)
    notes = [("Cost estimates", list(data.cost_notes)), ("Model import", list(data.import_notes)),
             ("Plan", list(data.plan.notes)), ("Build", _build_notes(data.build))]
    if any(items for _, items in notes):
        lines += ["## Notes", ""]
        for title, items in notes:
            if items:
                lines += [f"### {title}", ""] + [f"- {item}" for item in items] + [""]
    if data.compile_seconds:
        lines += ["## Compile time", ""]
        lines += md_table(["stage", "time (s)"], [[k, f"{v:,.1f}"] for k, v in data.compile_seconds.items()]
                          + [["**total**", f"**{sum(data.compile_seconds.values()):,.1f}**"]], "lr")
        lines.append("")
    lines += ["## Figures", "", f"![Predicted timeline of one inference]({images['gantt']})", "",
              "Predicted timeline of one inference (simulated, not measured): one row per device and per copy "
              "direction.", "", f"![Kernels coloured by device]({images['graph']})", "",
              "The planning graph, each kernel coloured by the device the plan puts it on; red arrows are tensors "
              "copied between devices.", ""]
    shown, truncated = _kernel_rows(data)
    lines += ["## Per-kernel decisions", "",
              "Predicted time of each kernel on every device (*cannot run* where a device does not support it); "
              "*waits for copies*: predicted link time of the copies bringing its inputs from another device; "
              "*copies out*: link time of the copies of its output to other devices; *slack*: how much later it "
              "could finish without delaying the result (0 on the critical path); *pinned*: placed by a pin.", ""]
    if truncated:
        where = f"; {kernels_csv} lists all {len(data.why)}" if kernels_csv else ""
        lines += [f"{len(shown)} of {len(data.why)} kernels shown: the critical path first, then the longest "
                  f"kernels{where}.", ""]
    header = ["id", "kernel", "device"] + [f"predicted time on {d} (µs)" for d in devices] + [
        "waits for copies (µs)", "copies out (µs)", "slack (µs)", "critical path", "pinned"]
    lines += md_table(header, [_kernel_cells(row, devices) for row in shown], "lll" + "r" * (len(devices) + 3) + "ll")
    return "\n".join(lines) + "\n"


def _kernel_cells(row: Any, devices: Sequence[str]) -> list[str]:
    times = ["cannot run" if row.latency_us.get(d) is None else _us(row.latency_us[d]) for d in devices]
    return [str(row.op_id), row.name, row.device, *times, _us(row.copy_in_us), _us(row.copy_out_us),
            _us(row.slack_us), "yes" if row.on_critical_path else "no", "yes" if row.pinned else "no"]


def _write_kernels_csv(data: ReportData, path: Path) -> Path:
    devices = list(data.plan.devices)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "kernel", "op", "device"] + [f"predicted_{d}_us" for d in devices]
                        + ["copy_in_us", "copy_out_us", "start_us", "end_us", "slack_us", "critical", "pinned"])
        for r in data.why:
            writer.writerow([r.op_id, r.name, r.op, r.device] + [r.latency_us.get(d) for d in devices]
                            + [r.copy_in_us, r.copy_out_us, r.start_us, r.end_us, r.slack_us,
                               int(r.on_critical_path), int(r.pinned)])
    return path


# ---------------------------------------------------------------------------------------------- HTML
_PIPE = re.compile(r"(?<!\\)\|")
_IMAGE = re.compile(r"^!\[(.*)\]\((.*)\)$")


def split_row(line: str) -> list[str]:
    """Cells of a markdown table row (``\\|`` inside a cell is a literal ``|``)."""
    return [c.strip() for c in _PIPE.split(line.strip().removeprefix("|").removesuffix("|"))]


def _inline(text: str) -> str:
    """Escaped text with ``**bold**``, ``*italic*`` and ``code`` spans."""
    out = []
    for k, part in enumerate(text.replace("\\|", "|").split("`")):
        if k % 2:
            out.append(f"<code>{html.escape(part)}</code>")
            continue
        escaped = html.escape(part)
        escaped = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", escaped)
        out.append(re.sub(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])", r"<i>\1</i>", escaped))
    return "".join(out)


def _table_html(rows: list[str]) -> str:
    header, align = split_row(rows[0]), split_row(rows[1])
    style = ["right" if a.endswith(":") else "left" for a in align]
    head = "".join(f"<th style='text-align:{a}'>{_inline(c)}</th>" for c, a in zip(header, style))
    body = "".join("<tr>" + "".join(f"<td style='text-align:{a}'>{_inline(c)}</td>" for c, a in
                                    zip(split_row(r), style)) + "</tr>" for r in rows[2:])
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def markdown_to_html(text: str, title: str) -> str:
    """HTML for the markdown this module writes: headings, paragraphs, lists, tables, quotes, images."""
    lines, out, i = text.splitlines(), [], 0

    def take(pred: Callable[[str], bool]) -> list[str]:
        nonlocal i
        block = []
        while i < len(lines) and lines[i].strip() and pred(lines[i]):
            block.append(lines[i])
            i += 1
        return block

    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
        elif line.startswith("|"):
            out.append(_table_html(take(lambda s: s.startswith("|"))))
        elif line.startswith("#"):
            level = min(6, len(line) - len(line.lstrip("#")))
            out.append(f"<h{level}>{_inline(line.lstrip('#').strip())}</h{level}>")
            i += 1
        elif line.startswith("- "):
            out.append("<ul>" + "".join(f"<li>{_inline(s[2:])}</li>" for s in take(lambda s: s.startswith("- ")))
                       + "</ul>")
        elif line.startswith(">"):
            quote = " ".join(s.lstrip(">").strip() for s in take(lambda s: s.startswith(">")))
            out.append(f"<blockquote><p>{_inline(quote)}</p></blockquote>")
        elif _IMAGE.match(line):
            alt, src = _IMAGE.match(line).groups()
            out.append(f'<p><img alt="{html.escape(alt)}" src="{html.escape(src)}" style="max-width:100%"></p>')
            i += 1
        else:
            para = take(lambda s: not s.startswith(("|", "#", "- ", ">")) and not _IMAGE.match(s))
            out.append(f"<p>{_inline(' '.join(para))}</p>")
    style = ("body{font-family:sans-serif;max-width:1200px;margin:auto;padding:0 1em}"
             "table{border-collapse:collapse;font-size:12px;margin:1em 0}td,th{border:1px solid #ccc;"
             "padding:2px 6px}th{background:#f4f4f4}blockquote{background:#fff3cd;margin:1em 0;padding:4px 12px}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(out)}</body></html>")


def write_report(data: ReportData, out_dir: str | Path) -> dict[str, Path]:
    """Write report.md, report.html, gantt.png, graph.png and kernels.csv into ``out_dir``, and gantt_requests.png
    for a plan made for several requests or by timeslice; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    gantt = gantt_png(data, out / "gantt.png")
    graph = graph_png(data, out / "graph.png")
    kernels = _write_kernels_csv(data, out / "kernels.csv")
    requests = requests_view(data)
    images = {"gantt": gantt.name, "graph": graph.name}
    written: dict[str, Path] = {}
    if requests is not None:
        written["gantt_requests"] = requests_gantt_png(data, requests, out / GANTT_IMAGE)
        images["gantt_requests"] = GANTT_IMAGE
    text = markdown(data, images, kernels_csv=kernels.name, requests=requests)
    (out / "report.md").write_text(text)
    (out / "report.html").write_text(markdown_to_html(text, f"hetpart report: {data.graph.name}"))
    log.debug("wrote report.md, report.html, %s, %s and %s in %s", gantt.name, graph.name, kernels.name, out)
    return {"markdown": out / "report.md", "html": out / "report.html", "gantt": gantt, "graph": graph,
            "kernels": kernels, **written}
