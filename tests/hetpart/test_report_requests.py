"""The report of a plan made for many requests: the multi-request Gantt chart, "Which cut and why", the timeslice
candidate table, and every figure equal to ``simulate_requests`` recomputed here; then a compiled small ONNX LSTM
(its report against the compile's note) and ``hetpart run --mode tasks --requests`` (its printed figures)."""
from __future__ import annotations

import re
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from hetpart.costs import CostTable
from hetpart.driver.report import ReportData, markdown, split_row, write_report
from hetpart.driver.report_plots import MAX_IMAGE_SIDE_PX
from hetpart.driver.report_requests import COLOURS_PER_CYCLE, GANTT_IMAGE, request_colour
from hetpart.driver.task_segments import kernel_segmentation
from hetpart.errors import DegeneratePlanWarning
from hetpart.graph import OpGraph
from hetpart.partition import explain, get_method
from hetpart.partition.request_balance import simulate_request_balance
from hetpart.partition.slices import build_slice_grid
from hetpart.plan import Plan
from hetpart.simulate import simulate
from hetpart.simulate_requests import RuntimeModel, simulate_requests

from .partition.rnn_graphs import synthetic_rnn

OVERHEAD_US = {"cpu": 20.0, "gpu": 20.0}
FAST = {"max_evaluations": 150, "perturbations": 2}
CELL_TOL = 0.051                          # report tables print one decimal


def _plan(graph: OpGraph, costs: CostTable, method: str, **config: Any) -> Plan:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegeneratePlanWarning)
        return get_method(method)(graph, costs, {**FAST, **config})


def _data(graph: OpGraph, costs: CostTable, plan: Plan) -> ReportData:
    return ReportData(graph=graph, costs=costs, plan=plan, timeline=simulate(graph, costs, plan), baselines_us={},
                      why=explain(graph, costs, plan))


def _figures(graph: OpGraph, costs: CostTable, plan: Plan, n: int) -> dict[str, float]:
    """simulate_requests of ``plan``, summarised as the report's tables show it."""
    timeline = simulate_requests(graph, costs, plan, n_requests=n, runtime=RuntimeModel(OVERHEAD_US))
    latency = np.asarray(timeline.latency_us)
    return {"makespan": timeline.makespan_us, "throughput": n / timeline.makespan_us * 1e6,
            "period": timeline.period_us, "p50": float(np.percentile(latency, 50)),
            "p99": float(np.percentile(latency, 99))}


def _table(text: str, heading: str) -> list[dict[str, str]]:
    """The first table after ``heading``, as dicts keyed by the header."""
    lines = text.splitlines()
    start = lines.index(heading)
    block = []
    for line in lines[next(k for k in range(start, len(lines)) if lines[k].startswith("|")):]:
        if not line.startswith("|"):
            break
        block.append(line)
    header = split_row(block[0])
    return [dict(zip(header, split_row(row))) for row in block[2:]]


def _number(cell: str) -> float:
    return float(cell.replace("*", "").replace(",", ""))


def _column(row: dict[str, str], prefix: str) -> float:
    return _number(next(v for k, v in row.items() if k.startswith(prefix)))


def _assert_row(row: dict[str, str], expected: dict[str, float]) -> None:
    got = {"makespan": _column(row, "makespan of"), "throughput": _column(row, "throughput (requests/s)"),
           "p50": _column(row, "p50 latency"), "p99": _column(row, "p99 latency")}
    if any(k.startswith("steady-state period") for k in row):
        got["period"] = _column(row, "steady-state period")
    for key, value in got.items():
        assert value == pytest.approx(expected[key], abs=CELL_TOL), (row, key, expected)


@pytest.fixture(scope="module")
def timeslice16():
    graph, costs = synthetic_rnn(2, 8, seed=1, projection="hoisted")
    plan = _plan(graph, costs, "timeslice", requests=16, dispatch_overhead_us_by_device=OVERHEAD_US)
    return graph, costs, plan


def test_gantt_png_colours_every_request_and_the_section_names_the_cut(timeslice16, tmp_path: Path):
    graph, costs, plan = timeslice16
    paths = write_report(_data(graph, costs, plan), tmp_path)
    png = paths["gantt_requests"]
    assert png == tmp_path / GANTT_IMAGE and png.stat().st_size > 10_000
    with Image.open(png) as image:
        assert max(image.size) <= MAX_IMAGE_SIDE_PX
        colours = {tuple(c[:3]) for _, c in image.convert("RGB").getcolors(maxcolors=1 << 20)}
    for r in range(16):                     # every request's bars are drawn in its own colour
        assert tuple(round(255 * v) for v in request_colour(r)[:3]) in colours, r
    text = paths["markdown"].read_text()
    assert f"]({GANTT_IMAGE})" in text and "## Many requests in flight (simulated)" in text
    chosen = plan.stats["chosen"]
    section = text[text.index("## Which cut and why"):text.index("## Work per device")]
    assert chosen["candidate"] == "cut" and chosen["kind"] == "layer and time split", chosen   # this fixture's
    assert f"**Chosen: the {chosen['kind']} cut {chosen['cut']}**" in section
    assert f"{chosen['first_device']} runs the cut and {chosen['second_device']} the rest" in section
    first, second = chosen["first_device"], chosen["second_device"]
    for layer, c in enumerate(chosen["cut"]):       # each layer's slices 0..c-1 on the first device
        where = f"all 8 slices on {first if c == 8 else second}" if c in (0, 8) else \
            f"slices 0–{c - 1} (steps 0–{c - 1}) on {first}, slices {c}–7 (steps {c}–7) on {second}"
        assert f"- RNN layer {layer} (8 steps): {where}" in section
    assert "slices of 1 step" in section
    candidates = _table(section, "### Candidates simulated")
    assert len(candidates) >= 3 and sum("(chosen)" in r["candidate"] for r in candidates) == 1
    baselines = {r["plan"]: r for r in _table(section, "### Baselines on the same simulator")}
    assert set(baselines) == {"**hetpart (timeslice)**", "all_cpu", "all_gpu", "cp_greedy", "request_balance"}


def test_report_figures_equal_simulate_requests_recomputed(timeslice16):
    graph, costs, plan = timeslice16
    n = 16
    text = markdown(_data(graph, costs, plan), {"gantt": "gantt.png", "graph": "graph.png"})
    own = _figures(graph, costs, plan, n)
    match = re.search(r"\*\*16 requests: makespan ([\d,.]+) µs, ([\d,.]+) requests/s\*\*.*every ([\d,.]+) µs.*\n"
                      r".*\*\*p50 ([\d,.]+) µs, p99 ([\d,.]+) µs\*\*", text)
    assert match, text[:3000]
    for key, cell in zip(("makespan", "throughput", "period", "p50", "p99"), match.groups()):
        assert _number(cell) == pytest.approx(own[key], abs=CELL_TOL), key
    # the compile prints plan.notes[0]: its figures are the report's, rounded to whole µs
    note = re.search(r"16 requests in (\d+) us \(period (\d+) us, p99 latency (\d+) us\)", plan.notes[0])
    for key, value in zip(("makespan", "period", "p99"), note.groups()):
        assert float(value) == pytest.approx(own[key], abs=0.5 + 1e-9), key

    assert costs.supported.all()
    names = costs.device_names
    cp_plan = _plan(graph, costs, "cp_greedy")
    expected = {"**hetpart (timeslice)**": own, "cp_greedy": _figures(graph, costs, cp_plan, n)}
    for name in names:
        single = Plan(device_of=[name] * graph.num_ops, order=range(graph.num_ops), devices=names, method="manual")
        expected[f"all_{name}"] = _figures(graph, costs, single, n)
    balance = simulate_request_balance(graph, costs, n_requests=n, runtime=RuntimeModel(OVERHEAD_US))
    latency = np.asarray(balance.latency_us)
    expected["request_balance"] = {"makespan": balance.makespan_us, "throughput": n / balance.makespan_us * 1e6,
                                   "period": balance.period_us, "p50": float(np.percentile(latency, 50)),
                                   "p99": float(np.percentile(latency, 99))}
    for row in _table(text, "### Baselines on the same simulator"):
        _assert_row(row, expected[row["plan"]])

    grid = build_slice_grid(graph, 1)
    order = [op for task in grid.tasks for op in task.op_ids]
    rows = _table(text, "### Candidates simulated")
    for row in rows:
        if row["first device"] == "—":
            _assert_row(row, expected[row["candidate"]])
            continue
        cut = [int(c) for c in re.match(r"\**\[([\d, ]+)\]", row["candidate"]).group(1).split(",")]
        first = row["first device"]
        second = next(d for d in names if d != first)
        inside = grid.members(cut)
        device_of = [first if inside[grid.task_of[v]] else second for v in range(graph.num_ops)]
        cut_plan = Plan(device_of=device_of, order=order, devices=names, method="manual")
        _assert_row(row, _figures(graph, costs, cut_plan, n))
        first_us = sum(costs.latency_us[v, names.index(device_of[v])] for v in range(graph.num_ops)
                       if device_of[v] == first)
        assert _column(row, "one request on the first device") == pytest.approx(first_us, abs=CELL_TOL)
    makespans = [_column(r, "makespan of") for r in rows]
    assert makespans == sorted(makespans)


def test_every_numeric_column_names_its_unit(timeslice16):
    graph, costs, plan = timeslice16
    text = markdown(_data(graph, costs, plan), {"gantt": "gantt.png", "graph": "graph.png"})
    section = text[text.index("## Many requests in flight"):text.index("## Work per device")]
    headings = ("### Candidates simulated", "### Baselines on the same simulator")
    for heading in headings:
        rows = _table(section, heading)
        assert rows, heading
        for title in rows[0]:
            numeric = all(re.fullmatch(r"[\d,.]+", r[title].strip("*")) for r in rows)
            if numeric and title != "rank":
                assert re.search(r"\((µs|requests/s)\)", title), title


def test_timeslice_stats_list_every_candidate_without_changing_the_choice(timeslice16):
    graph, costs, plan = timeslice16
    stats = plan.stats
    rows = stats["candidates"]
    chosen = [r for r in rows if r["chosen"]]
    assert len(chosen) == 1 and chosen[0]["makespan_us"] == stats["chosen"]["makespan_us"]
    assert all(r["makespan_us"] >= chosen[0]["makespan_us"] * (1 - 1e-9) for r in rows)
    assert {r["candidate"] for r in rows if r["candidate"] != "cut"} == {"all_cpu", "all_gpu", "cp_greedy"}
    published = [r for r in rows if r["published"]]
    assert published and all(r["cut"] == stats["published_criterion"]["cut"] for r in published)
    cut_rows = [r for r in rows if r["candidate"] == "cut"]
    assert len(cut_rows) == len({(r["first_device"], tuple(r["cut"]), r["segments"]) for r in cut_rows})
    assert min(r["imbalance_us"] for r in cut_rows) == pytest.approx(stats["published_criterion"]["imbalance_us"])
    for r in cut_rows:
        assert r["imbalance_us"] == pytest.approx(abs(r["first_us"] - r["second_us"]))
        assert set(r["considered"]) <= {"every cut", "estimate", "balance", "whole grid", "refinement"}


def test_a_given_plan_is_resimulated_with_the_current_costs(timeslice16):
    graph, costs, plan = timeslice16
    slower = replace(costs, latency_us=costs.latency_us * 1.5)
    text = markdown(_data(graph, slower, plan), {"gantt": "gantt.png", "graph": "graph.png"})
    assert "The planner recorded a makespan of" in text
    baselines = {r["plan"]: r for r in _table(text, "### Baselines on the same simulator")}
    _assert_row(baselines["**hetpart (timeslice)**"], _figures(graph, slower, plan, 16))
    cp_plan = _plan(graph, slower, "cp_greedy")
    _assert_row(baselines["cp_greedy"], _figures(graph, slower, cp_plan, 16))


def test_a_plan_for_many_requests_by_another_method_gets_the_gantt_and_baselines(tmp_path: Path):
    graph, costs = synthetic_rnn(2, 6, seed=2)
    plan = _plan(graph, costs, "heft", requests=64)
    paths = write_report(_data(graph, costs, plan), tmp_path)
    text = paths["markdown"].read_text()
    assert "## Many requests in flight (simulated)" in text and "## Which cut and why" not in text
    names = {r["plan"] for r in _table(text, "### Baselines on the same simulator")}
    assert names == {"**hetpart (heft)**", "all_cpu", "all_gpu", "cp_greedy", "request_balance"}
    with Image.open(paths["gantt_requests"]) as image:
        assert max(image.size) <= MAX_IMAGE_SIDE_PX
    one = write_report(_data(graph, costs, _plan(graph, costs, "heft")), tmp_path / "one")
    assert "gantt_requests" not in one and not (tmp_path / "one" / GANTT_IMAGE).exists()
    assert "Many requests in flight" not in one["markdown"].read_text()


def test_request_colours_differ_between_neighbours_and_cycle():
    colours = [request_colour(r) for r in range(2 * COLOURS_PER_CYCLE)]
    assert len(set(colours[:COLOURS_PER_CYCLE])) == COLOURS_PER_CYCLE
    assert colours[:COLOURS_PER_CYCLE] == colours[COLOURS_PER_CYCLE:]


# ---------------------------------------------------------------------------------------------- compiled LSTM
@pytest.fixture(scope="module")
def compiled_lstm(tmp_path_factory):
    """A 2-layer LSTM of 8 steps compiled with timeslice for 16 requests, with segments for the task runtime."""
    import onnx

    import hetpart
    from tests.tvm_passes.rnn_models import build_rnn_model

    root = tmp_path_factory.mktemp("lstm")
    model, _ = build_rnn_model("LSTM", seq=8, batch=1, input_size=8, hidden=8, num_layers=2, with_initial=False)
    onnx.save(model, root / "lstm.onnx")
    out = root / "out"
    compiled = hetpart.compile(str(root / "lstm.onnx"), devices="cpu,gpu=p2200", method="timeslice", requests=16,
                               segments=True, output_dir=out)
    return compiled, out


def test_compiled_timeslice_report_matches_the_compile_note(compiled_lstm):
    compiled, out = compiled_lstm
    text = (out / "report.md").read_text()
    assert (out / GANTT_IMAGE).stat().st_size > 10_000 and "## Which cut and why" in text
    overheads = compiled.plan.config["dispatch_overhead_us_by_device"]      # measured by the compile (segments=True):
    assert set(overheads) == set(compiled.plan.devices) and min(overheads.values()) >= 0    # planned for the runtime
    assert compiled.task_runtime["overhead_per_segment_us"] == pytest.approx(max(overheads.values()))
    timeline = simulate_requests(compiled.graph, compiled.costs, compiled.plan, n_requests=16,
                                 runtime=RuntimeModel(overheads), segmentation=kernel_segmentation(compiled.graph,
                                                                                                  compiled.plan))
    note = re.search(r"16 requests in (\d+) us \(period (\d+) us, p99 latency (\d+) us\)", compiled.plan.notes[0])
    shown = re.search(r"\*\*16 requests: makespan ([\d,.]+) µs", text)
    assert _number(shown.group(1)) == pytest.approx(timeline.makespan_us, abs=CELL_TOL)
    assert float(note.group(1)) == pytest.approx(timeline.makespan_us, abs=0.5 + 1e-9)
    assert float(note.group(2)) == pytest.approx(timeline.period_us, abs=0.5 + 1e-9)
    rows = {r["plan"]: r for r in _table(text, "### Baselines on the same simulator")}
    assert {"all_cpu", "all_gpu", "cp_greedy", "request_balance"} < set(rows)


def test_run_with_many_requests_prints_measured_throughput_and_percentiles(compiled_lstm, capsys):
    from hetpart.driver.cli import build_parser

    _, out = compiled_lstm
    args = build_parser().parse_args(["run", str(out), "--mode", "tasks", "--requests", "64"])
    started = time.perf_counter()
    assert args.func(args) == 0                   # what `hetpart run DIR --mode tasks --requests 64` runs
    wall_s = time.perf_counter() - started
    printed = capsys.readouterr().out
    match = re.search(r"^(\d+) requests \(tasks\): ([\d,.]+) inferences/s, latency p50 ([\d,.]+) ms, "
                      r"p99 ([\d,.]+) ms \(measured here", printed, re.MULTILINE)
    assert match, printed
    n, throughput, p50_ms, p99_ms = int(match.group(1)), *(_number(g) for g in match.groups()[1:])
    assert n == 64 and 0 < p50_ms <= p99_ms
    assert throughput >= 64 / wall_s              # measured over part of this call, so over less than its time
    assert p99_ms <= wall_s * 1e3                  # a request's latency fits in the whole call (ms, not µs)


def test_a_plan_made_for_cross_device_sharing_is_reported_with_it(tmp_path: Path):
    graph, costs = synthetic_rnn(2, 6, seed=2)
    plan = _plan(graph, costs, "timeslice", requests=16, cross_device_sharing=True)
    text = write_report(_data(graph, costs, plan), tmp_path)["markdown"].read_text()
    assert "With cross-device sharing a free device runs the other's ready segments" in text
    assert plan.stats["few_in_flight"]["compared"] >= 2 and "simulated again with 2 requests in flight" in text
    static = write_report(_data(graph, costs, _plan(graph, costs, "timeslice", requests=16)), tmp_path / "static")
    assert "cross-device sharing" not in static["markdown"].read_text()
