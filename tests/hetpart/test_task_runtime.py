"""The task runtime: a plan's segments on one worker thread per device (GPU emulated on cpu(1)), many requests
in flight; numerics against the sequential single-VM executable and onnxruntime, futures, failures, shutdown and
random plans."""
from __future__ import annotations

import threading

import numpy as np
import onnxruntime as ort
import pytest

from hetpart.errors import InputMismatchError
from hetpart.plan import Plan
from tests.hetpart.runtime_cases import imported_module, mixed_squeezenet, random_plan, small_module

pytestmark = pytest.mark.tvm

SIZE = 64


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    scale = max(1.0, float(np.max(np.abs(b))))
    return float(np.max(np.abs(a - b))) <= 1e-4 * scale


def _worker_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("hetpart-") and t.name.endswith("-worker")]


@pytest.fixture(scope="module")
def compiled():
    return mixed_squeezenet(SIZE)


@pytest.fixture(scope="module")
def module(compiled):
    return imported_module(compiled)


@pytest.fixture(scope="module")
def runtime(compiled, module):
    from hetpart.driver.task_runtime import TaskRuntime

    rt = TaskRuntime.from_compiled(compiled, module, threads_per_device={"cpu": 1, "gpu": 1})
    yield rt
    rt.close()


def _inputs(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, 3, SIZE, SIZE)).astype(np.float32) for _ in range(n)]


def test_plan_is_mixed_and_segmented(compiled, runtime):
    assert set(compiled.op_plan.device_of) == {"cpu", "gpu"}
    devices = {f.device for f in runtime.program.functions}
    assert devices == {"cpu", "gpu"} and len(runtime.program.functions) >= 3
    assert runtime.build.emulated and "EMULATED" in repr(runtime)


@pytest.mark.parametrize("in_flight", [1, 8])
def test_matches_sequential_and_onnxruntime(compiled, runtime, in_flight):
    xs = _inputs(8, seed=in_flight)
    outputs, latency_us = runtime.run_many([[x] for x in xs], max_in_flight=in_flight)
    session = ort.InferenceSession(compiled.source["onnx_path"], providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    assert len(outputs) == 8 and len(latency_us) == 8 and all(t > 0 for t in latency_us)
    # the emulated GPU is a device of its own (cpu(1)): its inputs and outputs are copied
    assert str(runtime.runtime_devices["gpu"]) == "cpu:1" and runtime.copies_made > 0
    for x, ours in zip(xs, outputs):
        sequential = compiled(x)
        reference = session.run(None, {name: x})
        assert len(ours) == len(sequential) == len(reference)
        for a, s, r in zip(ours, sequential, reference):
            assert a.shape == r.shape and _close(a, s) and _close(a, r)


def test_call_and_futures(compiled, runtime):
    xs = _inputs(4, seed=7)
    futures = [runtime.submit(x) for x in xs]
    named = runtime(**{runtime.input_specs[0]["name"]: xs[0]})
    for x, future in zip(xs, futures):
        (ours,) = future.result(timeout=120)
        assert _close(ours, compiled(x)[0])
    assert _close(named[0], futures[0].result()[0])


def test_bad_input_fails_only_its_future(compiled, runtime):
    (x,) = _inputs(1, seed=3)
    bad = runtime.submit(np.zeros((1, 3, SIZE + 1, SIZE), np.float32))
    assert isinstance(bad.exception(timeout=60), InputMismatchError)
    # past the input check: the segment function itself raises on the wrong shape, in a worker thread
    inside = runtime._submit_arrays([np.zeros((1, 3, SIZE // 2, SIZE // 2), np.float32)])
    good = runtime.submit(x)
    assert inside.exception(timeout=120) is not None
    assert _close(good.result(timeout=120)[0], compiled(x)[0])
    assert _close(runtime(x)[0], compiled(x)[0])


def test_run_many_with_a_bad_request_runs_the_others(compiled, runtime):
    xs = _inputs(4, seed=11)
    inputs = [[xs[0]], [np.zeros((1, 3, SIZE + 1, SIZE), np.float32)], [xs[1]], [xs[2]], [xs[3]]]
    from hetpart.driver.task_feed import RequestFeed

    feed = RequestFeed(runtime._admit, inputs, max_in_flight=2)
    with pytest.raises(InputMismatchError, match="must have shape"):
        feed.run()
    assert isinstance(feed.futures[1].exception(), InputMismatchError)
    for x, future in zip(xs, feed.futures[:1] + feed.futures[2:]):
        assert _close(future.result()[0], compiled(x)[0])
    with pytest.raises(InputMismatchError):
        runtime.run_many(inputs, max_in_flight=8)


def test_closing_during_run_many_fails_the_rest_and_returns(runtime):
    from hetpart.driver.task_runtime import TaskRuntime
    from hetpart.errors import UsageError

    rt = TaskRuntime(runtime.build)
    caught: list[BaseException] = []

    def run() -> None:
        try:
            rt.run_many([_inputs(1, seed=5)] * 400, max_in_flight=2)      # far longer than close() takes
        except BaseException as exc:  # noqa: BLE001
            caught.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    rt.close()
    thread.join(timeout=120)
    assert not thread.is_alive(), "run_many hung after the runtime closed"
    assert caught and isinstance(caught[0], UsageError)


def test_close_joins_every_worker(runtime):
    from hetpart.driver.task_runtime import TaskRuntime

    before = len(_worker_threads())
    with TaskRuntime(runtime.build) as rt:
        assert len(_worker_threads()) == before + 2
        rt(_inputs(1)[0])
    assert len(_worker_threads()) == before
    rt.close()                                          # idempotent


# ------------------------------------------------------------------------------ random plans
def _random_plan(graph, rng, cpu_share: float) -> Plan:
    device_of = ["cpu" if rng.random() < cpu_share else "gpu" for _ in graph.nodes]
    return random_plan(graph, device_of, ("cpu", "gpu"), lambda n: int(rng.integers(n)))


def test_random_plans_do_not_deadlock_and_match():
    import tvm
    from tvm import relax

    from hetpart.driver.task_runtime import TaskRuntime
    from tvm_passes.extract import extract_op_graph

    graph = extract_op_graph(small_module(), with_kernels=False)
    vm = relax.VirtualMachine(tvm.compile(small_module(), target="llvm"), tvm.cpu(0))
    rng = np.random.default_rng(11)
    xs = [rng.standard_normal((1, 16)).astype(np.float32) for _ in range(6)]
    expected = [[t.numpy() for t in vm["main"](tvm.runtime.tensor(x))] for x in xs]
    for trial in range(6):
        plan = _random_plan(graph, rng, cpu_share=[0.5, 0.2, 0.8][trial % 3])
        with TaskRuntime.from_module(small_module(), graph, plan) as rt:
            outputs, _ = rt.run_many([[x] for x in xs], max_in_flight=1 + trial % 4)
        for ours, ref in zip(outputs, expected):
            assert len(ours) == 2
            for a, b in zip(ours, ref):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_random_squeezenet_plans_match_sequential(compiled, module):
    from hetpart.driver.task_runtime import TaskRuntime

    rng = np.random.default_rng(5)
    xs = _inputs(3, seed=9)
    for _ in range(2):
        plan = _random_plan(compiled.op_graph, rng, cpu_share=0.5)
        with TaskRuntime.from_module(module, compiled.op_graph, plan) as rt:
            assert len(rt.program.functions) > 7
            outputs, _ = rt.run_many([[x] for x in xs], max_in_flight=3)
        for x, ours in zip(xs, outputs):
            assert _close(ours[0], compiled(x)[0])


def test_segment_build_round_trips_through_one_library(compiled, runtime, tmp_path):
    from hetpart.driver.task_runtime import TaskRuntime
    from tvm_passes.segment_artifact import export_segments, load_segments

    export_segments(runtime.build, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["segments.json", "segments.so"]
    loaded = load_segments(tmp_path)
    assert loaded.program == runtime.build.program
    (x,) = _inputs(1, seed=4)
    with TaskRuntime(loaded) as rt:
        assert np.array_equal(rt(x)[0], runtime(x)[0])


def test_a_compile_with_segments_runs_in_tasks_mode_from_its_directory(tmp_path):
    """compile(segments=True) writes segments.so; hetpart.load(dir, mode="tasks") runs them on worker threads with the
    same outputs as the sequential executable; the CLI prints throughput for --requests."""
    import subprocess
    import sys

    import hetpart
    from hetpart.errors import UsageError

    out = tmp_path / "sq"
    hetpart.compile("squeezenet1_1", size=64, devices="cpu,gpu=t4", method="all_gpu",
                    pins={"op:relax.nn.max_pool2d": "cpu"}, segments=True, output_dir=out)
    x = np.random.default_rng(5).standard_normal((1, 3, 64, 64)).astype(np.float32)
    expected = hetpart.load(out)(x)
    with hetpart.load(out, mode="tasks") as tasks:
        assert tasks.emulated
        outputs, latency_us = tasks.run_many([[x]] * 4, max_in_flight=4)
    for got in outputs:
        for a, b in zip(got, expected):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert len(latency_us) == 4 and all(v > 0 for v in latency_us)
    with pytest.raises(UsageError, match="mode must be one of"):
        hetpart.load(out, mode="parallel")
    result = subprocess.run([sys.executable, "-m", "hetpart", "run", str(out), "--mode", "tasks", "--requests", "4"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "4 requests (tasks):" in result.stdout and "inferences/s" in result.stdout


def test_tasks_mode_needs_a_compile_with_segments(tmp_path):
    import hetpart
    from hetpart.errors import UsageError

    out = tmp_path / "plain"
    hetpart.compile("squeezenet1_1", size=64, devices="cpu", output_dir=out)
    with pytest.raises(UsageError, match="--segments"):
        hetpart.load(out, mode="tasks")


def test_segments_carry_the_prim_funcs_main_calls():
    """A frontend may lower an op to call_tir at import (ONNX Clip with tensor bounds: MobileNetV2's ReLU6 is
    call_tir(maximum/minimum)); every segment module must carry the PrimFuncs its functions call."""
    from tvm import relax, tirx, topi

    from hetpart.driver.task_runtime import TaskRuntime
    from tvm_passes.extract import extract_op_graph

    rng = np.random.default_rng(3)
    w1, w2 = (rng.standard_normal((16, 16)).astype("float32") for _ in range(2))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.matmul(x, relax.const(w1)), name_hint="a")
            b = bb.emit_te(topi.clip, a, -0.5, 0.5, name_hint="b")
            c = bb.emit(relax.op.matmul(b, relax.const(w2)), name_hint="c")
            d = bb.emit_te(topi.clip, c, -0.5, 0.5, name_hint="d")
            out = bb.emit_output(d)
        bb.emit_func_output(out)
    mod = bb.get()
    assert any(isinstance(f, tirx.PrimFunc) for f in mod.functions.values())     # main calls them already
    graph = extract_op_graph(mod, with_kernels=False)
    plan = random_plan(graph, ["cpu", "gpu", "gpu", "cpu"], ("cpu", "gpu"), lambda n: 0)
    value = rng.standard_normal((1, 16)).astype("float32")
    with TaskRuntime.from_module(mod, graph, plan) as rt:
        (got,) = rt(value)
    expected = np.clip(np.clip(value @ w1, -0.5, 0.5) @ w2, -0.5, 0.5)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_run_no_work_sharing_reaches_the_task_runtime(monkeypatch, tmp_path):
    from hetpart.driver import api
    from hetpart.driver.cli import build_parser
    from hetpart.errors import UsageError

    seen = {}

    def fake_load(directory, mode="sequential", **options):
        seen.update(options, mode=mode)
        raise UsageError("stop here")

    monkeypatch.setattr(api, "load", fake_load)
    parser = build_parser()
    args = parser.parse_args(["run", str(tmp_path), "--mode", "tasks", "--no-work-sharing"])
    with pytest.raises(UsageError, match="stop here"):
        args.func(args)
    assert seen == {"mode": "tasks", "continuation": False, "sharing": False}
    seen.clear()
    args = parser.parse_args(["run", str(tmp_path), "--mode", "tasks"])
    with pytest.raises(UsageError, match="stop here"):
        args.func(args)
    assert seen == {"mode": "tasks"}                  # the runtime's defaults: work shared
    args = parser.parse_args(["run", str(tmp_path), "--no-work-sharing"])
    with pytest.raises(UsageError, match="add --mode tasks"):
        args.func(args)
