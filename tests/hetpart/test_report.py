"""The compile report: well-formed markdown tables and HTML, copies per inference vs. weight uploads at load,
user wording, and bounded, readable figures. Built from synthetic graphs and hand-made plans (no TVM)."""
from __future__ import annotations

import csv
import re
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path
from typing import Callable

import pytest
from PIL import Image

from hetpart.graph import OpNode
from hetpart.partition import explain, get_method
from hetpart.partition.synthetic import synthetic_problem
from hetpart.plan import Plan
from hetpart.driver.report import MAX_KERNEL_ROWS, ReportData, copy_counts, markdown, markdown_to_html, md_table, \
    split_row, summary, write_report
from hetpart.driver.report_plots import MAX_IMAGE_SIDE_PX, block_description, compact_blocks, dependency_depth, graph_form, \
    graph_png
from hetpart.simulate import simulate

EMULATED_BUILD = {"emulated": True, "weights_function": "hetpart_upload_weights", "notes": [
    "hetpart_upload_weights() uploads 4941984 bytes of weights to the non-host devices; call it once and pass its "
    "result as the last argument of main",
    "EMULATED: the GPU vdevice was compiled for and runs on a second CPU device"]}


def report_data(n_ops: int = 30, shape: str = "branchy", method: str = "heft",
                rename: Callable[[OpNode], str] | None = None,
                gpu_unsupported_fraction: float = 0.0, **extra) -> ReportData:
    graph, costs = synthetic_problem(shape, n_ops, seed=1, gpu_speedup_scale=0.3,
                                     gpu_unsupported_fraction=gpu_unsupported_fraction)
    if rename is not None:
        graph = replace(graph, nodes=tuple(replace(n, name=rename(n)) for n in graph.nodes))
    plan = get_method(method)(graph, costs, None)
    baselines = {m: get_method(m)(graph, costs, None).makespan_us for m in ("all_cpu", "all_gpu")}
    return ReportData(graph=graph, costs=costs, plan=plan, timeline=simulate(graph, costs, plan),
                      baselines_us=baselines, why=explain(graph, costs, plan), **extra)


def hand_plan(devices: list[str]) -> Plan:
    return Plan(device_of=devices, order=range(len(devices)), devices=("cpu", "gpu"), method="manual")


def tiny_report(make_tiny: Callable, latency_us: list[tuple[float, float]], edges: list[tuple[int, int, int]],
                devices: list[str], outputs: list[tuple[int, int]]) -> ReportData:
    graph, costs = make_tiny(latency_us, edges, outputs=outputs)
    plan = hand_plan(devices)
    return ReportData(graph=graph, costs=costs, plan=plan, timeline=simulate(graph, costs, plan), baselines_us={},
                      why=explain(graph, costs, plan))


def markdown_tables(text: str) -> list[list[str]]:
    tables, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    return tables


def test_every_markdown_table_is_well_formed():
    data = report_data(rename=lambda n: f"k|{n.id}", build=EMULATED_BUILD, compile_seconds={"plan": 1.25},
                       import_notes=("padded | matmul columns",))
    text = markdown(data, {"gantt": "gantt.png", "graph": "graph.png"})
    tables = markdown_tables(text)
    assert len(tables) >= 4, "latency, devices, compile time and per-kernel tables"
    for table in tables:
        header, separator, rows = split_row(table[0]), split_row(table[1]), [split_row(r) for r in table[2:]]
        assert all(re.fullmatch(r":?-{3,}:?", cell) for cell in separator), table[1]
        assert len(separator) == len(header), table[:2]
        for row in rows:
            assert len(row) == len(header), (table[0], row)
    kernel_table = next(t for t in tables if split_row(t[0])[0] == "id")
    assert split_row(kernel_table[2])[1] == "k\\|0", "a | inside a cell is escaped"
    assert len(kernel_table) - 2 == data.graph.num_ops


def test_md_table_rejects_ragged_rows():
    assert md_table(["a", "b"], [["x|y", 1]], "lr") == ["| a | b |", "|---|---:|", "| x\\|y | 1 |"]
    with pytest.raises(ValueError, match="3 cells"):
        md_table(["a", "b"], [[1, 2, 3]], "lr")


class StructureChecker(HTMLParser):
    VOID = {"img", "meta", "br", "hr", "link", "input"}
    BLOCKS = {"ul", "ol", "table", "h1", "h2", "h3", "h4", "blockquote", "p"}

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.problems: list[str] = []
        self.cells: list[str] = []
        self.counts: dict[str, int] = {}

    def handle_starttag(self, tag, attrs):
        parent = self.stack[-1] if self.stack else None
        self.counts[tag] = self.counts.get(tag, 0) + 1
        if tag == "li" and parent not in ("ul", "ol"):
            self.problems.append(f"<li> inside <{parent}>")
        if tag == "tr" and parent not in ("table", "thead", "tbody"):
            self.problems.append(f"<tr> inside <{parent}>")
        if tag in ("td", "th") and parent != "tr":
            self.problems.append(f"<{tag}> inside <{parent}>")
        if tag in self.BLOCKS and parent == "p":
            self.problems.append(f"<{tag}> inside <p>")
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}>")
        else:
            self.stack.pop()

    def handle_data(self, data):
        if self.stack and self.stack[-1] == "td":
            self.cells.append(data)


def test_html_is_well_structured_and_escaped():
    data = report_data(rename=lambda n: f"<k>|{n.id}", build=EMULATED_BUILD,
                       cost_notes=("CPU costs: a & b <predictor>",), compile_seconds={"plan": 1.0})
    page = markdown_to_html(markdown(data, {"gantt": "gantt.png", "graph": "graph.png"}), "t")
    checker = StructureChecker()
    checker.feed(page)
    checker.close()
    assert not checker.problems, checker.problems
    assert checker.stack == [], f"unclosed tags {checker.stack}"
    assert checker.counts["ul"] >= 2 and checker.counts["li"] >= 3 and checker.counts["table"] >= 3
    assert checker.counts["h1"] == 1 and checker.counts["h2"] >= 4 and checker.counts["img"] == 2
    assert "<k>|0" in checker.cells, "a kernel name is one escaped cell, its | unescaped"
    assert "&lt;predictor&gt;" in page and "<predictor>" not in page


def test_copies_per_inference_and_weight_uploads_at_load_reconcile():
    data = report_data(build=EMULATED_BUILD)
    per_inference = len(data.timeline.copy_events())
    assert per_inference > 0 and set(data.plan.device_of) == {"cpu", "gpu"}
    counted = replace(data, weight_uploads=42, weight_upload_bytes=4941984, program_copies_per_call=per_inference)
    text = markdown(counted, {"gantt": "g.png", "graph": "h.png"})
    assert f"**Every inference: {per_inference} tensor copies**" in text
    assert "**Once, when the model is loaded:** 42 weight tensors (4.94 MB) are uploaded to the gpu" in text
    assert (f"{per_inference + 42} copies in all: {per_inference} per inference + 42 weight uploads at load "
            f"(the compile log's \"{per_inference + 42} copies (42 of constants)\")") in text
    s = summary(counted)
    assert (s["copies"], s["weight_uploads"], s["weight_upload_bytes"]) == (per_inference, 42, 4941984)
    # without the count, the size still comes from the build's manifest
    assert "the weights (4.94 MB) are uploaded to the gpu" in markdown(data, {"gantt": "g", "graph": "h"})
    # a build that uploads weights without saying how much: the size is estimated from the parameters on the gpu
    unsized = replace(data, build={"emulated": True, "weights_function": "upload", "notes": []})
    gpu_params = sum(n.param_bytes for n in data.graph.nodes if data.plan.device_of[n.id] == "gpu")
    assert gpu_params > 0 and f"the weights (about {gpu_params / 1e6:,.2f} MB, estimated from the parameter sizes" \
        in markdown(unsized, {"gantt": "g", "graph": "h"})
    nothing = replace(data, build={"emulated": True, "weights_function": None, "notes": []})
    assert "no weights are uploaded" in markdown(nothing, {"gantt": "g", "graph": "h"})
    # a program that copies more than the simulator modelled says so
    off = markdown(replace(counted, program_copies_per_call=per_inference + 3), {"gantt": "g", "graph": "h"})
    assert f"makes {per_inference + 3} copies per inference where the simulator predicts {per_inference}" in off


def test_report_speaks_to_users_not_about_internals():
    text = markdown(report_data(build=EMULATED_BUILD), {"gantt": "g.png", "graph": "h.png"})
    for internal in ("hetpart_upload_weights", "last argument of main", "vdevice", "EMULATED:", "- note:"):
        assert internal not in text, internal
    assert "**GPU EMULATED.**" in text and "its speed says nothing about a GPU" in text
    assert "gpu: analytic (a datasheet roofline, no measurement behind it)" in text
    unscheduled = replace(report_data(), build={"notes": ["no schedule rule for conv2d: CPU kernels are unscheduled"]})
    assert ("CPU kernels were compiled without hetpart's CPU schedules (no schedule rule for conv2d)"
            in markdown(unscheduled, {"gantt": "g", "graph": "h"}))


def test_every_table_header_with_a_number_names_its_unit():
    text = markdown(report_data(compile_seconds={"plan": 1.0}), {"gantt": "g", "graph": "h"})
    for table in markdown_tables(text):
        header = split_row(table[0])
        for k, title in enumerate(header):
            column = [split_row(r)[k].strip("*") for r in table[2:]]
            numeric = bool(column) and all(re.fullmatch(r"[\d,.]+", c) for c in column)
            if numeric and title not in ("id", "kernels", "ops"):
                assert re.search(r"\((µs|MB|s)\)", title), title


def test_copies_on_the_critical_path_are_the_ones_the_result_waits_for(make_tiny):
    # op0 on the cpu feeds op1 on the gpu, whose output goes back to the host: both copies are waited for
    chain = tiny_report(make_tiny, [(5.0, 5.0), (50.0, 5.0)], [(0, 1, 20)], ["cpu", "gpu"], outputs=[(1, 30)])
    c = copy_counts(chain)
    assert (c.per_inference, c.critical, c.model_inputs, c.model_outputs) == (2, 2, 0, 1)
    # the model input goes to op0 on the gpu, whose output op1 reads on the cpu
    upload = tiny_report(make_tiny, [(50.0, 5.0), (5.0, 50.0)], [(0, 1, 20)], ["gpu", "cpu"], outputs=[(1, 30)])
    c = copy_counts(upload)
    assert (c.per_inference, c.critical, c.model_inputs, c.model_outputs) == (2, 2, 1, 0)
    # op0 forks to a short gpu op1 and a long cpu op2; op3 on the cpu joins them: op2 decides the makespan
    fork = tiny_report(make_tiny, [(5.0, 5.0), (50.0, 2.0), (500.0, 500.0), (5.0, 5.0)], [(0, 1, 20), (0, 2, 20),
                       (1, 3, 20), (2, 3, 20)], ["cpu", "gpu", "cpu", "cpu"], outputs=[(3, 10)])
    c = copy_counts(fork)
    assert (c.per_inference, c.critical, c.model_inputs, c.model_outputs) == (2, 0, 0, 0)
    assert c.weight_bytes_estimated and c.weight_upload_bytes == 0


def test_write_report_files_and_bounded_figures(tmp_path: Path):
    small = report_data(n_ops=24, build=EMULATED_BUILD)
    assert graph_form(small) == "detailed"
    paths = write_report(small, tmp_path / "small")
    for key in ("markdown", "html", "gantt", "graph", "kernels"):
        assert paths[key].exists(), key
    with paths["kernels"].open() as f:
        assert len(list(csv.DictReader(f))) == small.graph.num_ops
    large = report_data(n_ops=800, shape="layered", method="greedy", gpu_unsupported_fraction=0.1)
    assert graph_form(large) == "compact"
    paths = write_report(large, tmp_path / "large")
    for key in ("gantt", "graph"):
        with Image.open(paths[key]) as image:
            assert max(image.size) <= MAX_IMAGE_SIDE_PX, (key, image.size)
    text = paths["markdown"].read_text()
    assert f"{MAX_KERNEL_ROWS} of 800 kernels shown" in text and "kernels.csv lists all 800" in text
    kernel_table = next(t for t in markdown_tables(text) if split_row(t[0])[0] == "id")
    assert len(kernel_table) - 2 == MAX_KERNEL_ROWS


def test_a_deep_chain_is_drawn_labelled_within_the_size_bound(tmp_path: Path):
    deep = report_data(n_ops=78, shape="series_parallel")
    assert max(dependency_depth(deep)) > 50 and graph_form(deep) == "detailed"
    with Image.open(graph_png(deep, tmp_path / "graph.png")) as image:
        assert max(image.size) <= MAX_IMAGE_SIDE_PX and image.size[1] > image.size[0], image.size


def test_compact_blocks_cover_every_kernel_once_on_its_device():
    data = report_data(n_ops=800, shape="layered", method="greedy", gpu_unsupported_fraction=0.1)
    depth = dependency_depth(data)
    blocks = compact_blocks(data, depth, max_bands=10)
    members = sorted(v for b in blocks for v in b.kernels)
    assert members == list(range(data.graph.num_ops))
    assert max(b.band for b in blocks) == 9
    assert all(data.plan.device_of[v] == b.device for b in blocks for v in b.kernels)
    for a, b in ((a, b) for a in blocks for b in blocks if a.band < b.band):
        assert max(depth[v] for v in a.kernels) < min(depth[v] for v in b.kernels), "bands are depth ranges"


def test_block_of_an_unrolled_rnn_names_its_layer_and_time_steps():
    def tag(n):
        return {"rnn_layer": n.id // 10, "rnn_direction": 0, "rnn_step": n.id % 10, "rnn_phase": "step"}

    data = report_data(n_ops=20, shape="series_parallel")
    data = replace(data, graph=replace(data.graph, nodes=tuple(replace(n, tags=tag(n)) for n in data.graph.nodes)))
    blocks = compact_blocks(data, dependency_depth(data), max_bands=1)
    text = block_description(data, max(blocks, key=lambda b: len(b.kernels)))
    assert re.fullmatch(r"layer 0 t\d–\d\nlayer 1 t\d–\d", text), text
