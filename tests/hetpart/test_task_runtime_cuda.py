"""GPU segments compiled for CUDA: a second executable of real ``__global__`` kernels that nvcc accepts (here),
run by the task runtime's GPU worker on its own stream (only where a CUDA GPU exists)."""
from __future__ import annotations

import numpy as np
import pytest

from hetpart.plan import Plan

pytestmark = pytest.mark.tvm

GPU_TARGET = {"kind": "cuda", "arch": "sm_75"}


def _module():
    from tvm import relax

    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 32), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.matmul(x, relax.const(rng.standard_normal((32, 32)).astype("float32"))))
            b = bb.emit(relax.op.nn.relu(a))
            c = bb.emit(relax.op.sigmoid(a))
            d = bb.emit(relax.op.matmul(b, relax.const(rng.standard_normal((32, 32)).astype("float32"))))
            e = bb.emit(relax.op.add(c, d))
            f = bb.emit(relax.op.sum(e, axis=[1], keepdims=True))
            out = bb.emit_output(relax.Tuple([e, f]))
        bb.emit_func_output(out)
    return bb.get()


@pytest.fixture(scope="module")
def mixed():
    """A plan alternating host and GPU segments, and its segments built for CUDA (not emulated)."""
    from hetpart.segments import segment_plan
    from tvm_passes.extract import extract_op_graph
    from tvm_passes.segment_build import build_segments

    graph = extract_op_graph(_module(), with_kernels=False)
    device_of = ["gpu" if k % 2 == 0 else "cpu" for k in range(graph.num_ops)]
    plan = Plan(device_of=device_of, order=range(graph.num_ops), devices=("cpu", "gpu"), method="fixed",
                graph_hash=graph.structure_hash(), level="op").validate(graph)
    devices = [{"name": "cpu", "kind": "cpu", "cores": []}, {"name": "gpu", "kind": "gpu", "cores": []}]
    build = build_segments(_module(), segment_plan(graph, plan), ("gpu",), emulate_gpu=False, gpu_target=GPU_TARGET,
                           devices=devices)
    return graph, plan, build


def test_gpu_segments_become_cuda_kernels_that_nvcc_compiles(mixed, tmp_path, nvcc_path):
    from tvm_passes.segment_artifact import export_segments
    from tvm_passes.segment_build import gpu_source

    _, _, build = mixed
    gpu_functions = [f for f in build.program.functions if f.device == "gpu"]
    assert len(gpu_functions) >= 2 and not build.emulated
    source = gpu_source(build.gpu_executable)
    assert source.count("__global__") >= len(gpu_functions)
    export_segments(build, tmp_path)                       # the CUDA module is compiled (nvcc) into the library
    assert sorted(p.name for p in tmp_path.iterdir()) == ["segments.json", "segments.so", "segments_gpu.so"]


def test_gpu_segments_need_a_target(mixed):
    from hetpart.errors import BuildError
    from hetpart.segments import segment_plan
    from tvm_passes.segment_build import build_segments

    graph, plan, _ = mixed
    with pytest.raises(BuildError, match="gpu_target"):
        build_segments(_module(), segment_plan(graph, plan), ("gpu",), emulate_gpu=False)


@pytest.mark.gpu
def test_cuda_task_runtime_matches_the_cpu(mixed):
    import tvm
    from tvm import relax

    from hetpart.driver.task_runtime import TaskRuntime
    from tvm_passes.build import cuda_available

    if not cuda_available():
        pytest.skip("no CUDA device")
    _, _, build = mixed
    vm = relax.VirtualMachine(tvm.compile(_module(), target="llvm"), tvm.cpu(0))
    xs = [np.random.default_rng(k).standard_normal((4, 32)).astype(np.float32) for k in range(8)]
    expected = [[t.numpy() for t in vm["main"](tvm.runtime.tensor(x))] for x in xs]
    with TaskRuntime(build) as rt:
        assert str(rt._workers["gpu"].runtime_device).startswith("cuda")
        for in_flight in (1, 8):
            outputs, _ = rt.run_many([[x] for x in xs], max_in_flight=in_flight)
            for ours, ref in zip(outputs, expected):
                for a, b in zip(ours, ref):
                    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_with_cross_device_sharing_the_cuda_executable_holds_the_cpu_segments_the_gpu_may_take(nvcc_path, tmp_path):
    """Every segment the sharing table prices on the GPU is compiled for CUDA too (real kernels); one it does not
    price there (an op the GPU cannot run) is left out, and the CPU executable keeps all of them."""
    import re

    from hetpart.cross_sharing import SharingTable, planned_load_us
    from hetpart.segments import segment_plan
    from tvm_passes.extract import extract_op_graph
    from tvm_passes.segment_artifact import export_segments
    from tvm_passes.segment_build import build_segments, gpu_source

    graph = extract_op_graph(_module(), with_kernels=False)
    device_of = ["gpu" if k % 2 == 0 else "cpu" for k in range(graph.num_ops)]
    plan = Plan(device_of=device_of, order=range(graph.num_ops), devices=("cpu", "gpu"), method="fixed",
                graph_hash=graph.structure_hash(), level="op").validate(graph)
    segmentation = segment_plan(graph, plan)
    k = len(segmentation.segments)
    cpu_segments = [s.id for s in segmentation.segments if s.device == "cpu"]
    assert len(cpu_segments) >= 2
    duration = ((10.0,) * k, tuple(None if s == cpu_segments[-1] else 10.0 for s in range(k)))
    copy_in = ((0.0,) * k, (0.0,) * k)
    planned = [("cpu", "gpu").index(s.device) for s in segmentation.segments]
    table = SharingTable(("cpu", "gpu"), duration, copy_in, planned_load_us(duration, copy_in, planned))
    devices = [{"name": "cpu", "kind": "cpu", "cores": []}, {"name": "gpu", "kind": "gpu", "cores": []}]
    build = build_segments(_module(), segmentation, ("gpu",), emulate_gpu=False, gpu_target=GPU_TARGET,
                           devices=devices, sharing=table)

    def functions(executable) -> set[int]:
        return {int(n) for n in re.findall(r"^@hetpart_seg(\d+):", executable.as_text(), flags=re.M)}

    assert functions(build.gpu_executable) == set(range(k)) - {cpu_segments[-1]}
    assert functions(build.executable) == set(range(k))
    assert "__global__" in gpu_source(build.gpu_executable)
    export_segments(build, tmp_path)                       # nvcc compiles the larger CUDA module too
    assert (tmp_path / "segments_gpu.so").exists() and SharingTable.from_dict(build.sharing) == table
