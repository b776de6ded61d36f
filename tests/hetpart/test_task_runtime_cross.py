"""Cross-device sharing in the task runtime (GPU emulated on cpu(1)): with every segment built for every device, a
free worker takes a busy device's ready segment when the sharing table predicts it ends it sooner; the outputs stay
on its device and the readers copy them from there. Numerics against the sequential executable."""
from __future__ import annotations

import numpy as np
import pytest

import hetpart
from hetpart.cross_sharing import SharingTable, planned_load_us
from hetpart.errors import UsageError
from hetpart.segments import segment_plan
from tests.hetpart.runtime_cases import imported_module, mixed_squeezenet

pytestmark = pytest.mark.tvm

SIZE = 64


@pytest.fixture(scope="module")
def compiled():
    return mixed_squeezenet(SIZE)


@pytest.fixture(scope="module")
def module(compiled):
    return imported_module(compiled)


def _table(planned: list[int], duration_us, copy_in_us) -> SharingTable:
    return SharingTable(("cpu", "gpu"), duration_us, copy_in_us, planned_load_us(duration_us, copy_in_us, planned))


def _build(compiled, module, cpu_us: float, gpu_us: float):
    from tvm_passes.segment_build import build_segments

    segmentation = segment_plan(compiled.op_graph, compiled.op_plan)
    k = len(segmentation.segments)
    table = _table([("cpu", "gpu").index(s.device) for s in segmentation.segments], ((cpu_us,) * k, (gpu_us,) * k),
                   ((0.0,) * k, (0.0,) * k))
    return build_segments(module, segmentation, ["gpu"], sharing=table)


def _inputs(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, 3, SIZE, SIZE)).astype(np.float32) for _ in range(n)]


def _run(build, xs, **options):
    from hetpart.driver.task_runtime import TaskRuntime

    with TaskRuntime(build, trace=True, threads_per_device={"cpu": 1, "gpu": 1}, **options) as rt:
        outputs, _ = rt.run_many([[x] for x in xs], max_in_flight=len(xs))
        planned = [f.device for f in rt.program.functions]
        return outputs, [(run.device, planned[run.segment]) for run in rt.trace], rt.copies_made


def _matches(compiled, xs, outputs) -> None:
    for x, ours in zip(xs, outputs):
        for a, b in zip(ours, compiled(x)):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_a_free_cpu_takes_gpu_segments_predicted_to_end_sooner_and_the_numerics_hold(compiled, module):
    xs = _inputs(8, seed=1)
    outputs, runs, copies = _run(_build(compiled, module, cpu_us=1.0, gpu_us=1e6), xs)
    _matches(compiled, xs, outputs)
    assert ("cpu", "gpu") in runs             # a GPU segment ran on the CPU worker
    assert copies > 0


def test_nothing_is_taken_when_the_taker_is_predicted_slower(compiled, module):
    xs = _inputs(6, seed=2)
    outputs, runs, _ = _run(_build(compiled, module, cpu_us=1e6, gpu_us=1.0), xs)
    _matches(compiled, xs, outputs)
    assert ("cpu", "gpu") not in runs        # the GPU may still take a CPU segment: it is predicted faster


def test_off_keeps_the_placement(compiled, module):
    xs = _inputs(6, seed=3)
    outputs, runs, _ = _run(_build(compiled, module, cpu_us=1.0, gpu_us=1e6), xs, cross_device_sharing=False)
    _matches(compiled, xs, outputs)
    assert all(device == planned for device, planned in runs)


def test_the_table_round_trips_with_the_segments_and_a_build_without_it_refuses(compiled, module, tmp_path):
    from hetpart.driver.task_runtime import TaskRuntime
    from tvm_passes.segment_artifact import export_segments, load_segments
    from tvm_passes.segment_build import build_segments

    build = _build(compiled, module, cpu_us=1.0, gpu_us=1e6)
    export_segments(build, tmp_path)
    loaded = load_segments(tmp_path)
    assert loaded.sharing == build.sharing and SharingTable.from_dict(loaded.sharing).n_segments == len(
        build.program.functions)
    plain = build_segments(module, segment_plan(compiled.op_graph, compiled.op_plan), ["gpu"])
    assert plain.sharing is None
    with pytest.raises(UsageError, match="--cross-device-sharing"):
        TaskRuntime(plain, cross_device_sharing=True)


def test_a_compile_made_for_cross_device_sharing_builds_and_runs_it(tmp_path):
    """portfolio planned for 8 requests with cross-device sharing: the segments carry the table, the prediction
    says so, and the directory runs in tasks mode with the sequential executable's outputs."""
    out = tmp_path / "sq"
    compiled = hetpart.compile("squeezenet1_1", size=SIZE, devices="cpu,gpu=t4", method="portfolio", requests=8,
                               segments=True, output_dir=out, partition_options={"cross_device_sharing": True})
    assert compiled.plan.config["cross_device_sharing"] is True
    table = SharingTable.from_dict(compiled.segments.sharing)
    assert table.n_segments == len(compiled.segments.program.functions) and table.devices == ("cpu", "gpu")
    assert compiled.task_runtime["cross_device_sharing"] is True
    xs = _inputs(4, seed=4)
    with hetpart.load(out, mode="tasks") as tasks:
        assert tasks.cross_device_sharing
        outputs, _ = tasks.run_many([[x] for x in xs], max_in_flight=4)
    _matches(compiled, xs, outputs)
    from hetpart.driver.task_runtime import TaskRuntime

    with TaskRuntime.from_compiled(compiled) as rebuilt:      # rebuilt from the ONNX file: the same table
        assert rebuilt.cross_device_sharing and rebuilt.build.sharing == compiled.segments.sharing


def test_the_cli_flag_becomes_the_partition_option():
    from hetpart.driver.cli import _partition_options, build_parser

    parser = build_parser()
    args = parser.parse_args(["compile", "lstm_lm", "--method", "timeslice", "--cross-device-sharing"])
    assert _partition_options(args) == {"cross_device_sharing": True}
    assert _partition_options(parser.parse_args(["compile", "lstm_lm"])) is None


def test_random_plans_and_tables_do_not_deadlock_and_match():
    """Random placements of a branchy module, random predicted times: whoever runs each segment, the outputs are the
    single VM's."""
    import tvm
    from tvm import relax

    from hetpart.driver.task_runtime import TaskRuntime
    from tests.hetpart.runtime_cases import random_plan, small_module
    from tvm_passes.extract import extract_op_graph
    from tvm_passes.segment_build import build_segments

    graph = extract_op_graph(small_module(), with_kernels=False)
    vm = relax.VirtualMachine(tvm.compile(small_module(), target="llvm"), tvm.cpu(0))
    rng = np.random.default_rng(12)
    xs = [rng.standard_normal((1, 16)).astype(np.float32) for _ in range(8)]
    expected = [[t.numpy() for t in vm["main"](tvm.runtime.tensor(x))] for x in xs]
    taken = 0
    for trial in range(6):
        device_of = ["cpu" if rng.random() < 0.5 else "gpu" for _ in graph.nodes]
        plan = random_plan(graph, device_of, ("cpu", "gpu"), lambda n: int(rng.integers(n)))
        segmentation = segment_plan(graph, plan)
        k = len(segmentation.segments)
        table = _table([("cpu", "gpu").index(s.device) for s in segmentation.segments],
                       (tuple(rng.uniform(1, 100, k)), tuple(rng.uniform(1, 100, k))),
                       (tuple(rng.uniform(0, 20, k)), tuple(rng.uniform(0, 20, k))))
        with TaskRuntime(build_segments(small_module(), segmentation, ["gpu"], sharing=table), trace=True) as rt:
            outputs, _ = rt.run_many([[x] for x in xs], max_in_flight=1 + trial % 8)
            taken += sum(run.device != rt.program.functions[run.segment].device for run in rt.trace)
        for ours, ref in zip(outputs, expected):
            for a, b in zip(ours, ref):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert taken > 0


def test_the_runtime_says_whether_it_shares_across_devices(compiled, module):
    from hetpart.driver.task_runtime import TaskRuntime

    build = _build(compiled, module, cpu_us=1.0, gpu_us=1e6)
    with TaskRuntime(build) as rt:
        assert rt.cross_device_sharing
    with TaskRuntime(build, sharing=False, continuation=False) as rt:      # hetpart run --no-work-sharing
        assert not rt.cross_device_sharing
