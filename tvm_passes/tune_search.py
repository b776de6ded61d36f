"""MetaSchedule's side of ``hetpart tune``: one kernel's search, its builder, and what keeps it quick and observable.

:func:`tune_one` runs MetaSchedule on one kernel into an in-memory database with a per-batch callback (which
reports progress and stops the search when the budget is spent), a builder without TVM's slow tensor-intrinsic
import, and only the host CPU's tensor intrinsics registered (:func:`cpu_tensor_intrinsics_only`).
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import platform
import sys
import threading
from collections.abc import Callable, Iterator

import numpy as np
import tvm
from tvm.s_tir import meta_schedule as ms
from tvm.target import Target

logger = logging.getLogger("tvm_passes.tune")

TRIALS_PER_ITER = 8
BUILD_FUNC_NAME = "hetpart.tune.build_kernel"
BUILD_TIMEOUT_S = 60.0
HEARTBEAT_S = 10.0


def _build_kernel(mod: tvm.ir.IRModule, target: Target, _params) -> tvm.runtime.Module:
    """MetaSchedule's default build minus ``import tvm.s_tir.tensor_intrin`` (see cpu_tensor_intrinsics_only)."""
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm_build(mod, target=target)


def register_build_function() -> None:
    """Builder-worker initializer: registers :func:`_build_kernel` under BUILD_FUNC_NAME."""
    tvm.register_global_func(BUILD_FUNC_NAME, _build_kernel, override=True)


_INTRINSICS_PACKAGE = "tvm.s_tir.tensor_intrin"
_INTRINSICS_BY_ARCH = {"x86_64": "x86", "amd64": "x86", "i686": "x86", "i386": "x86", "aarch64": "arm_cpu",
                       "arm64": "arm_cpu", "arm": "arm_cpu", "riscv64": "riscv_cpu", "riscv32": "riscv_cpu"}


@contextlib.contextmanager
def cpu_tensor_intrinsics_only(target: Target) -> Iterator[None]:
    """Within the block, ``import tvm.s_tir.tensor_intrin`` registers only the target CPU's intrinsics.

    ``TuneContext()`` imports that package, whose ``__init__`` parses TVMScript for every CUDA, ROCm, ARM,
    x86, Hexagon and RISC-V intrinsic: 40 s to 4 min on a 2-core host, silently.  MetaSchedule's llvm rules
    need only the host CPU family's.  The block installs the package module without running its
    ``__init__`` and imports that one submodule; on leaving it removes the stand-in, so a later import runs
    the real ``__init__`` (reusing the submodule).  Nothing changes if the package is already imported.
    """
    triple = str(target.attrs.get("mtriple", "")) if target.attrs is not None else ""
    submodule = _INTRINSICS_BY_ARCH.get((triple.split("-")[0] or platform.machine()).lower())
    package = None
    if _INTRINSICS_PACKAGE not in sys.modules and submodule is not None:
        package = importlib.util.module_from_spec(importlib.util.find_spec(_INTRINSICS_PACKAGE))
        sys.modules[_INTRINSICS_PACKAGE] = package
        try:
            importlib.import_module(f"{_INTRINSICS_PACKAGE}.{submodule}")
        except Exception as exc:  # noqa: BLE001 (fall back to TVM's full import)
            logger.debug("importing only the %s tensor intrinsics failed (%s); TVM imports them all", submodule, exc)
            del sys.modules[_INTRINSICS_PACKAGE]
            package = None
    try:
        yield
    finally:
        if package is not None and sys.modules.get(_INTRINSICS_PACKAGE) is package:
            del sys.modules[_INTRINSICS_PACKAGE]


@tvm.ir.utils.derived_object
class BatchCallback(ms.measure_callback.PyMeasureCallback):
    """Measure callback calling ``on_batch(trials, best_us)`` after each batch; False terminates the task."""

    def __init__(self, on_batch: Callable[[int, float | None], bool]) -> None:
        self.on_batch = on_batch

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results) -> None:
        latencies_s = [float(np.mean([float(t) for t in r.run_secs])) for r in runner_results
                       if r.error_msg is None and r.run_secs]
        if not self.on_batch(len(measure_candidates), min(latencies_s) * 1e6 if latencies_s else None):
            task_scheduler.terminate_task(task_id)


@contextlib.contextmanager
def heartbeat(interval_s: float, beat: Callable[[], None]) -> Iterator[None]:
    """Call ``beat()`` every ``interval_s`` seconds from a background thread while the block runs."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval_s):
            try:
                beat()
            except Exception as exc:  # noqa: BLE001 (a failing progress printer must not stop tuning)
                logger.debug("progress heartbeat failed: %s", exc)

    thread = threading.Thread(target=loop, name="hetpart-tune-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def tune_one(task_mod: tvm.ir.IRModule, name: str, target: Target, trials: int, work_dir: str,
              on_batch: Callable[[int, float | None], bool]):
    """MetaSchedule on one kernel into an in-memory database; the best record or None.

    ``on_batch(trials_measured, best_us)`` is called after every measured batch; returning False ends the
    search before the next batch.
    """
    staging = ms.database.MemoryDatabase()
    search_log = logging.getLogger("tvm.s_tir.meta_schedule")  # per-batch tables: only with hetpart at DEBUG
    previous_level = search_log.level
    if not logger.isEnabledFor(logging.DEBUG):
        search_log.setLevel(logging.WARNING)
    try:
        with cpu_tensor_intrinsics_only(target):
            context = ms.TuneContext(
                mod=task_mod, target=target, space_generator="post-order-apply", search_strategy="evolutionary",
                task_name=name, num_threads=1,
            ).clone()
        ms.tune_tasks(
            tasks=[context], task_weights=[1.0], work_dir=work_dir, max_trials_global=trials,
            num_trials_per_iter=min(TRIALS_PER_ITER, trials), database=staging, cost_model="random",
            builder=ms.builder.LocalBuilder(
                f_build=BUILD_FUNC_NAME, initializer=register_build_function, timeout_sec=BUILD_TIMEOUT_S
            ),
            measure_callbacks=list(ms.measure_callback.MeasureCallback.create("default")) + [BatchCallback(on_batch)],
        )
    finally:
        search_log.setLevel(previous_level)
    top = staging.get_top_k(staging.commit_workload(task_mod), 1)
    return top[0] if top else None
