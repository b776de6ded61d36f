"""A time-slice plan run by the task runtime as its slice tasks, on two CPU devices of one core each: the compile ->
artifact -> TaskRuntime path builds one segment per (layer, slice) task, each device issues them in (request, slice,
layer) order, and the outputs match onnxruntime with 1 and 8 requests in flight (2-layer bidirectional LSTM and GRU,
and a 2-layer bidirectional LSTM with input projections per slice). Timing is the benchmark's business (benchmarks/rnn_pipeline.py --measured)."""
from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import hetpart
from hetpart.driver.device_choice import parse_devices
from hetpart.errors import InvalidPlanError, UsageError
from hetpart.partition.slices import build_slice_grid
from hetpart.plan import Plan
from hetpart.segments import expand_segmentation, segment_plan
from tests.tvm_passes.rnn_models import build_rnn_model

pytestmark = [pytest.mark.tvm,
              pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a process allowed on two cores")]

CORES = sorted(os.sched_getaffinity(0))[:2] if len(os.sched_getaffinity(0)) >= 2 else [0, 1]   # else skipped
SPEC = f"cpu:{CORES[0]},cpu:{CORES[1]}"
DEVICES = tuple(parse_devices(SPEC).devices.names) if len(os.sched_getaffinity(0)) >= 2 else ("cpu0", "cpu1")
SLICE_STEPS = 2
REQUESTS = 8
BIDIRECTIONAL = dict(seq=6, batch=1, input_size=5, hidden=8, num_layers=2, direction="bidirectional")
CASES = {   # name: (cell, model options, input projection)
    "LSTM-bidirectional": ("LSTM", BIDIRECTIONAL, "hoisted"),
    "GRU-bidirectional": ("GRU", {**BIDIRECTIONAL, "linear_before_reset": 1}, "hoisted"),
    "LSTM-bidirectional-per-slice": ("LSTM", BIDIRECTIONAL, "per_slice"),
}


def _kernel_graph(path: str, projection: str):
    from hetpart.driver.api import import_model
    from tvm_passes.extract import extract_op_graph
    from tvm_passes.rnn import RnnImportOptions

    imported = import_model(path, rnn_options=RnnImportOptions(projection, SLICE_STEPS))
    return extract_op_graph(imported.mod, name=imported.name, source_hash=imported.source_hash,
                            param_inputs=imported.param_inputs).kernel_graph()


def _slice_plan(graph) -> Plan:
    """The most even down-set cut of the slice grid on the first device, the rest on the second, issued in the grid's task order, to
    be run with one segment per task."""
    grid = build_slice_grid(graph, SLICE_STEPS)
    n_tasks = len(grid.tasks)
    cut = min(grid.cuts(), key=lambda c: abs(2 * sum(grid.members(c)) - n_tasks))
    inside = grid.members(cut)
    assert 0 < sum(inside) < n_tasks
    device_of = [DEVICES[0] if inside[grid.task_of[k]] else DEVICES[1] for k in range(graph.num_ops)]
    order = [k for task in grid.tasks for k in task.op_ids]
    return Plan(device_of=device_of, order=order, devices=DEVICES, method="timeslice",
                graph_hash=graph.structure_hash(), level="kernel", device_spec=SPEC,
                stats={"segments": "slices", "slice_steps": SLICE_STEPS, "cut": list(cut)}).validate(graph)


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    """(compiled model, output directory, slice grid, requests' feeds, onnxruntime's outputs per request)."""
    cell, options, projection = CASES[request.param]
    work = tmp_path_factory.mktemp(request.param.lower())
    model, _ = build_rnn_model(cell, **options)
    path = str(work / f"{cell.lower()}.onnx")
    onnx.save(model, path)
    plan = _slice_plan(_kernel_graph(path, projection))
    out = work / "out"
    compiled = hetpart.compile(path, devices=SPEC, plan=plan, rnn_projection=projection, slice_steps=SLICE_STEPS,
                               segments=True, output_dir=out)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    shapes = [(i.name, [d.dim_value for d in i.type.tensor_type.shape.dim]) for i in model.graph.input]
    inputs = [[rng.uniform(-1, 1, shape).astype(np.float32) for _, shape in shapes] for _ in range(REQUESTS)]
    expected = [session.run(None, {name: x for (name, _), x in zip(shapes, xs)}) for xs in inputs]
    return compiled, out, build_slice_grid(compiled.graph, SLICE_STEPS), inputs, expected


def test_the_artifact_holds_one_segment_per_slice_task_in_grid_order(case):
    from hetpart.driver.task_segments import kernel_segmentation, runtime_segmentation

    compiled, _, grid, _, _ = case
    assert compiled.plan.stats["segments"] == "slices"
    program = compiled.segments.program
    assert len(program.functions) == len(grid.tasks)
    segmentation = runtime_segmentation(compiled.op_graph, compiled.op_plan, compiled.graph, compiled.plan)
    assert tuple(program.segment_of) == segmentation.segment_of
    for k, task in enumerate(grid.tasks):           # segment k is task k: ids in (slice, layer) issue order
        ops = {op for kernel in task.op_ids for op in compiled.graph.nodes[kernel].tags["op_ids"]}
        assert set(segmentation.segments[k].op_ids) == ops
        assert program.functions[k].device == compiled.plan.device_of[task.op_ids[0]]
    assert {f.device for f in program.functions} == set(DEVICES)
    per_task = kernel_segmentation(compiled.graph, compiled.plan)
    assert per_task is not None and len(per_task) == len(grid.tasks)
    assert compiled.task_runtime["segments"] == len(grid.tasks)


@pytest.mark.parametrize("in_flight", [1, REQUESTS])
def test_loaded_artifact_matches_onnxruntime_and_issues_in_request_slice_layer_order(case, in_flight):
    compiled, out, _, inputs, expected = case
    with hetpart.load(out, mode="tasks", trace=True) as rt:
        assert rt.worker_cores == {DEVICES[0]: (CORES[0],), DEVICES[1]: (CORES[1],)}
        outputs, latency_us = rt.run_many(inputs, max_in_flight=in_flight)
        runs = list(rt.trace)
    assert len(latency_us) == REQUESTS
    for ours, ref in zip(outputs, expected):
        assert len(ours) == len(ref)
        for a, b in zip(ours, ref):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    n_segments = len(compiled.segments.program.functions)
    assert sorted((run.request, run.segment) for run in runs) == [(r, s) for r in range(REQUESTS) for s in range(n_segments)]
    for device in DEVICES:
        issued = [(run.request, run.segment) for run in sorted(runs, key=lambda run: run.start_s)
                  if run.device == device]
        if in_flight == 1:      # one request at a time: the device's tasks strictly in (request, slice, layer) order
            assert issued == sorted(issued)
        for r in range(REQUESTS):    # within a request, always in (slice, layer) order
            mine = [s for q, s in issued if q == r]
            assert mine == sorted(mine)


def test_from_compiled_runs_the_same_slice_segments(case):
    from hetpart.driver.task_runtime import TaskRuntime

    compiled, _, _, inputs, expected = case
    if compiled.source["rnn_options"]["input_projection"] != "per_slice":
        pytest.skip("one case suffices: the per-slice import is the one from_compiled must repeat")
    with TaskRuntime.from_compiled(compiled) as rt:        # re-imports the ONNX file with the compile's projection
        assert rt.program.segment_of == compiled.segments.program.segment_of
        outputs, _ = rt.run_many(inputs[:3], max_in_flight=3)
    for ours, ref in zip(outputs, expected):
        for a, b in zip(ours, ref):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_segmentation_helpers_refuse_what_they_cannot_map(case):
    from hetpart.driver.task_segments import kernel_segmentation, runtime_segmentation

    compiled, _, _, _, _ = case
    runtime_plan = replace(compiled.plan, stats={**compiled.plan.stats, "segments": "runtime"})
    runtime_op_plan = replace(compiled.op_plan, stats=runtime_plan.stats)
    assert kernel_segmentation(compiled.graph, runtime_plan) is None
    assert runtime_segmentation(compiled.op_graph, runtime_op_plan) == segment_plan(compiled.op_graph,
                                                                                     runtime_op_plan)
    with pytest.raises(InvalidPlanError, match="kernel_graph and kernel_plan"):
        runtime_segmentation(compiled.op_graph, compiled.op_plan)
    with pytest.raises(InvalidPlanError, match="slice_steps"):
        kernel_segmentation(compiled.graph, replace(compiled.plan, stats={"segments": "slices"}))
    per_task = kernel_segmentation(compiled.graph, compiled.plan)
    with pytest.raises(InvalidPlanError, match="kernel graph, then the op graph"):
        expand_segmentation(per_task, compiled.op_graph, compiled.graph)


def test_compile_refuses_partition_options_given_twice(tmp_path):
    with pytest.raises(UsageError, match="requests"):
        hetpart.compile("lstm_lm", devices=SPEC, method="timeslice", requests=4,
                        partition_options={"requests": 8})
    with pytest.raises(InvalidPlanError, match="unknown partition options"):
        hetpart.compile("lstm_lm", devices=SPEC, method="timeslice", partition_options={"segments": "slices"})


def test_cli_timeslice_segments_reaches_the_scheduler(tmp_path):
    """`hetpart compile --method timeslice --timeslice-segments slices` simulates the cuts with one segment per slice
    task too (candidates of both segmentations in the plan), and the artifact's segments follow the chosen one."""
    import json

    from hetpart.driver.cli import build_parser

    model, _ = build_rnn_model("LSTM", **{**BIDIRECTIONAL, "direction": "forward"})
    onnx.save(model, tmp_path / "lstm.onnx")
    out = tmp_path / "out"
    args = build_parser().parse_args(["compile", str(tmp_path / "lstm.onnx"), "--devices", SPEC, "--method",
                                      "timeslice", "--requests", "4", "--slice-steps", str(SLICE_STEPS),
                                      "--timeslice-segments", "slices", "--segments", "-o", str(out)])
    assert args.func(args) == 0
    plan = json.loads((out / "plan.json").read_text())
    assert plan["config"]["timeslice_segments"] == "slices"
    cut_rows = [row for row in plan["stats"]["candidates"] if row["candidate"] == "cut"]
    assert {row["segments"] for row in cut_rows} == {"runtime", "slices"}
    info = json.loads((out / "compile.json").read_text())["task_runtime"]
    if plan["stats"]["segments"] == "slices":
        assert info["segments"] == len(build_slice_grid(_kernel_graph(str(tmp_path / "lstm.onnx"), "hoisted"),
                                                        SLICE_STEPS).tasks)
    rng = np.random.default_rng(3)
    feeds = {i.name: rng.uniform(-1, 1, [d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input}
    expected = ort.InferenceSession(str(tmp_path / "lstm.onnx"), providers=["CPUExecutionProvider"]).run(None, feeds)
    with hetpart.load(out, mode="tasks") as runtime:
        got = runtime(*feeds.values())
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("segments", [None, False])
def test_a_plan_made_for_many_requests_is_built_for_the_task_runtime_by_default(tmp_path, segments):
    """compile(segments=None) builds the segments of a timeslice plan for more than one request in flight (what
    `hetpart run` then runs in tasks mode); segments=False (--no-segments) does not."""
    from hetpart.driver.cli_run import default_mode

    model, _ = build_rnn_model("LSTM", **{**BIDIRECTIONAL, "direction": "forward"})
    onnx.save(model, tmp_path / "lstm.onnx")
    out = tmp_path / "out"
    compiled = hetpart.compile(str(tmp_path / "lstm.onnx"), devices=SPEC, method="timeslice", requests=4,
                               segments=segments, output_dir=out)
    assert (compiled.segments is not None) == (segments is None)
    assert default_mode(out) == ("tasks" if segments is None else "sequential")
