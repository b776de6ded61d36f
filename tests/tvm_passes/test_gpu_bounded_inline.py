"""GPU kernels of fused activation chains compile in bounded memory: BoundedInlineGpuRule before DLight's rules.

Without the rule DLight's GPU rules inline every producer, and a fused chain of fast sigmoid/tanh or Mish activations
grows as k^n (the CPU rules met the same; see test_schedule_inline_growth). CUDA code is generated and, where nvcc
exists, compiled; it runs only where a CUDA GPU exists.
"""
from __future__ import annotations

import json

import pytest

tvm = pytest.importorskip("tvm")
from tvm import relax, tirx  # noqa: E402

from tests.memory import run_under_address_space_limit  # noqa: E402
from tvm_passes.schedules import base  # noqa: E402
from tvm_passes.schedules.gpu_bounded_inline import BoundedInlineGpuRule  # noqa: E402

from .test_schedule_inline_growth import _case, _module  # noqa: E402

pytestmark = pytest.mark.tvm

CHILD_ADDRESS_SPACE_BYTES = 3_000_000_000
CHILD_TIMEOUT_S = 240
CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_75", "max_num_threads": 1024})


def _fused_gpu_kernels(name: str) -> list[tirx.PrimFunc]:
    """The PrimFuncs of chain ``name`` after hetpart's legalization and fusion (FuseTIR), before any schedule."""
    from tvm_passes.fusion import fusion_passes
    from tvm_passes.legalize import legalize_ops

    shape, ops, _ = _case(name)
    mod = tvm.transform.Sequential([legalize_ops(), *fusion_passes(), relax.transform.FuseTIR()])(_module(shape, ops))
    return [f for _, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)]


def test_rule_leaves_ordinary_kernels_to_dlight():
    kernel = _single_sigmoid_kernel()
    assert BoundedInlineGpuRule().apply(kernel, CUDA, False) is None
    assert BoundedInlineGpuRule().apply(kernel, tvm.target.Target("llvm"), False) is None   # not a GPU target


def _single_sigmoid_kernel() -> tirx.PrimFunc:
    from tvm_passes.fusion import fusion_passes
    from tvm_passes.legalize import legalize_ops

    mod = tvm.transform.Sequential([legalize_ops(), *fusion_passes(), relax.transform.FuseTIR()])(
        _module((4, 256), [relax.op.sigmoid]))
    (kernel,) = [f for _, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)]
    return kernel


def test_rule_keeps_a_long_chain_in_bounded_thread_bound_stages():
    (kernel,) = _fused_gpu_kernels("sigmoid_tanh_x6")
    sch = BoundedInlineGpuRule().apply(kernel, CUDA, False)
    assert sch is not None
    blocks = base.summarize_blocks(sch)
    assert len(blocks) > 1                                       # some producers stay materialised
    for block_rv, _summary in blocks:
        assert base.expr_tree_nodes(sch.get(block_rv).body.value, 10**7) <= base.MAX_INLINE_GROWTH_NODES
        bound = {str(sch.get(loop).thread_binding.thread_tag) for loop in sch.get_loops(block_rv)
                 if sch.get(loop).thread_binding is not None}
        assert bound == {"blockIdx.x", "threadIdx.x"}
    (fresh,) = _fused_gpu_kernels("sigmoid_tanh_x6")
    tvm.ir.assert_structural_equal(kernel, fresh)                # the input PrimFunc is not modified


def gpu_chain_reports() -> None:
    """Child process: build every chain all on a (real, not emulated) CUDA device and compile its CUDA source with
    nvcc; one JSON line per chain."""
    import time

    from hetpart.devices import DeviceSet, cpu_device, gpu_from_preset, preset_links
    from hetpart.plan import Plan
    from tvm_passes.annotate import AnnotateDevicePlacement
    from tvm_passes.bindings import op_bindings
    from tvm_passes.build import build, compile_cuda_source_with_nvcc

    devices = DeviceSet((cpu_device(), gpu_from_preset("t4")), preset_links("t4"))
    for name in ("sigmoid_tanh_x6", "mish_x4"):
        shape, ops, _ = _case(name)
        mod = _module(shape, ops)
        n = len(op_bindings(mod["main"]))
        plan = Plan(device_of=("gpu",) * n, order=tuple(range(n)), devices=("cpu", "gpu"), method="hand-written")
        start = time.perf_counter()
        result = build(AnnotateDevicePlacement(plan, devices)(mod), devices, emulate_gpu=False)
        build_s = time.perf_counter() - start
        fatbin = compile_cuda_source_with_nvcc(result)             # nvcc accepts the generated source
        print(json.dumps({"case": name, "build_s": build_s, "cuda_chars": len(result.cuda_source()),
                          "fatbin_bytes": len(fatbin)}), flush=True)


def test_fused_chains_build_for_cuda_in_bounded_memory(nvcc_path):
    stdout, failure = run_under_address_space_limit("tests.tvm_passes.test_gpu_bounded_inline", "gpu_chain_reports",
                                                    CHILD_ADDRESS_SPACE_BYTES, CHILD_TIMEOUT_S)
    reports = [json.loads(line) for line in stdout.splitlines() if line.startswith('{"case"')]
    assert not failure and len(reports) == 2, failure
    for report in reports:
        assert report["build_s"] < 60 and 0 < report["cuda_chars"] < 2_000_000 and report["fatbin_bytes"] > 0, report
