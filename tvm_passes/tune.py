"""Optional, bounded MetaSchedule tuning of a model's CPU kernels, kept in a persistent JSON database.

``tune_model`` lowers the model exactly as :func:`tvm_passes.schedules.cpu_pipeline` does up to FuseTIR
(so the tuned PrimFuncs are structurally equal to the ones the pipeline later looks up), extracts one task
per distinct CPU kernel, times each kernel under hetpart's rule-based schedule, and tunes the kernels in
order of the time they cost (rule latency x number of calls), heaviest first, until the trial count or the
wall-clock budget runs out.  A tuned schedule is written to the database only when it measures faster than
the rule schedule in the same process (interleaved timing), so applying the database never makes a kernel
slower than the rules.  Each kernel's record is committed as soon as that kernel is done; an interrupt
(Ctrl-C) stops tuning and keeps everything committed so far.

Later compiles reuse the records: ``cpu_pipeline(target, database_dir=...)`` applies
``MetaScheduleApplyDatabase`` and falls back to the rules for kernels without a record.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.tune_context import _normalize_mod as normalize_mod
from tvm.target import Target

from hetpart.errors import HetpartError

logger = logging.getLogger(__name__)

WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"
TRIALS_PER_ITER = 8
BUILD_FUNC_NAME = "hetpart.tune.build_kernel"
BUILD_TIMEOUT_S = 60.0


def _build_kernel(mod: tvm.ir.IRModule, target: Target, _params) -> tvm.runtime.Module:
    """MetaSchedule's default build minus ``import tvm.s_tir.tensor_intrin``.

    That import registers every tensor intrinsic by parsing TVMScript and takes 20-30 s per builder worker
    on this machine, so with the default build function most candidates hit the builder timeout.  hetpart's
    CPU kernels are fp32 and never tensorize.
    """
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm_build(mod, target=target)


def register_build_function() -> None:
    """Builder-worker initializer: registers :func:`_build_kernel` under BUILD_FUNC_NAME."""
    tvm.register_global_func(BUILD_FUNC_NAME, _build_kernel, override=True)


@dataclass(frozen=True)
class KernelTuning:
    """Outcome for one kernel: rule vs best tuned latency (µs, same process), and whether it was kept."""

    name: str
    calls: int
    rule_latency_us: float
    tuned_latency_us: float | None
    trials: int
    kept: bool
    seconds: float


@dataclass(frozen=True)
class TuningReport:
    """What ``tune_model`` did: per kernel outcomes, in tuning order, and whether it was interrupted."""

    database_dir: str
    budget_minutes: float
    trials_requested: int
    trials_used: int
    elapsed_s: float
    interrupted: bool
    kernels: tuple[KernelTuning, ...] = field(default_factory=tuple)

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TuningProgress:
    """Passed to the ``progress`` callback after each kernel (and once before the first)."""

    done_kernels: int
    total_kernels: int
    trials_used: int
    trials_requested: int
    elapsed_s: float
    last: KernelTuning | None


def open_database(database_dir: Path | str, create: bool) -> ms.database.JSONDatabase | None:
    """The persistent JSON tuning database in ``database_dir``; None if absent and ``create`` is False."""
    directory = Path(database_dir)
    workload, record = directory / WORKLOAD_FILE, directory / RECORD_FILE
    if not create and not (workload.exists() and record.exists()):
        return None
    directory.mkdir(parents=True, exist_ok=True)
    return ms.database.JSONDatabase(
        path_workload=str(workload), path_tuning_record=str(record), allow_missing=True
    )


def lower_for_tuning(mod: tvm.ir.IRModule, target: Target) -> tvm.ir.IRModule:
    """The module as ``cpu_pipeline`` sees it right after FuseTIR (prepack, legalize, fuse)."""
    from .schedules.base import vector_lanes
    from .schedules.layout import prepack_conv_weights
    from .schedules.pipeline import cpu_generic

    with target:
        passes = [prepack_conv_weights(vector_lanes(target))] + cpu_generic.legalize_passes(target)
        return tvm.transform.Sequential(passes)(mod)


def _random_args(func: tirx.PrimFunc, device) -> list:
    rng = np.random.default_rng(0)
    args = []
    for info in ms.arg_info.ArgInfo.from_prim_func(func):
        shape = [int(d) for d in info.shape]
        dtype = str(info.dtype)
        data = rng.random(shape) if "float" in dtype else rng.integers(0, 2, shape)
        args.append(tvm.runtime.tensor(np.asarray(data).astype(dtype), device))
    return args


def _time_us(func: tirx.PrimFunc, target: Target, args: list, repeat: int = 5) -> float:
    lib = tvm.tirx.build(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target)
    timer = lib.time_evaluator("main", tvm.cpu(), number=1, repeat=repeat, min_repeat_ms=20)
    return float(np.median(timer(*args).results)) * 1e6


def _rule_schedule(func: tirx.PrimFunc, target: Target) -> tirx.PrimFunc:
    from .schedules.base import apply_first_rule
    from .schedules.pipeline import default_rules

    return apply_first_rule(func, target, default_rules()) or func


def _call_counts(lowered: tvm.ir.IRModule) -> dict[str, int]:
    counts: dict[str, int] = {}

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == "relax.call_tir":
            counts[expr.args[0].name_hint] = counts.get(expr.args[0].name_hint, 0) + 1

    for _, func in lowered.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return counts


def _tune_one(task_mod: tvm.ir.IRModule, name: str, target: Target, trials: int, work_dir: str):
    """MetaSchedule on one kernel into an in-memory database; the best record or None."""
    staging = ms.database.MemoryDatabase()
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
    )
    top = staging.get_top_k(staging.commit_workload(task_mod), 1)
    return top[0] if top else None


def tune_model(
    mod: tvm.ir.IRModule,
    target: Target,
    trials: int,
    budget_minutes: float,
    database_dir: Path | str,
    progress: Callable[[TuningProgress], None] | None = None,
    trials_per_kernel: int | None = None,
) -> TuningReport:
    """Tune the model's heaviest CPU kernels with MetaSchedule within ``trials`` and ``budget_minutes``.

    ``trials_per_kernel`` (default: ``max(8, trials // 4)``) bounds each kernel; kernels that already have
    a record in the database are skipped.  Returns a :class:`TuningReport`; see the module docstring.
    """
    if trials < 1 or budget_minutes <= 0:
        raise HetpartError(
            f"tuning needs trials >= 1 and budget_minutes > 0; got trials={trials}, "
            f"budget_minutes={budget_minutes}. Pass a positive trial count and time budget."
        )
    target = Target(target) if not isinstance(target, Target) else target
    per_kernel = trials_per_kernel or max(TRIALS_PER_ITER, trials // 4)
    start = time.monotonic()
    deadline = start + budget_minutes * 60.0
    database = open_database(database_dir, create=True)
    lowered = lower_for_tuning(mod, target)
    counts = _call_counts(lowered)
    device = tvm.cpu()

    candidates = []
    for gvar, func in lowered.functions_items():
        if not isinstance(func, tirx.PrimFunc) or gvar.name_hint not in counts:
            continue
        task_mod = normalize_mod(func)
        if database.has_workload(task_mod) and database.get_top_k(database.commit_workload(task_mod), 1):
            continue
        args = _random_args(func, device)
        rule_us = _time_us(_rule_schedule(func, target), target, args)
        candidates.append((rule_us * counts[gvar.name_hint], gvar.name_hint, task_mod, args, rule_us))
    candidates.sort(key=lambda item: -item[0])

    kernels: list[KernelTuning] = []
    used, interrupted = 0, False

    def report(last: KernelTuning | None) -> None:
        if progress is not None:
            progress(TuningProgress(len(kernels), len(candidates), used, trials, time.monotonic() - start, last))

    report(None)
    with tempfile.TemporaryDirectory(prefix="hetpart-tune-") as work_dir:
        for _total_us, name, task_mod, args, rule_us in candidates:
            remaining = min(per_kernel, trials - used)
            if remaining < 1 or time.monotonic() >= deadline:
                break
            began = time.monotonic()
            try:
                best = _tune_one(task_mod, name, target, remaining, work_dir)
            except KeyboardInterrupt:
                interrupted = True
                logger.warning("tuning interrupted during %s; records committed so far are kept", name)
                break
            used += remaining
            tuned_us, kept = None, False
            if best is not None:
                sch = tvm.s_tir.Schedule(task_mod)
                best.trace.apply_to_schedule(sch, remove_postproc=False)
                tuned_us = _time_us(sch.mod["main"], target, args)
                rule_us = min(rule_us, _time_us(_rule_schedule(task_mod["main"], target), target, args))
                if tuned_us < rule_us:
                    workload = database.commit_workload(task_mod)
                    database.commit_tuning_record(
                        ms.database.TuningRecord(best.trace, workload, best.run_secs, target, best.args_info)
                    )
                    kept = True
            outcome = KernelTuning(name, counts[name], rule_us, tuned_us, remaining, kept, time.monotonic() - began)
            kernels.append(outcome)
            logger.info("tuned %s: rules %.1f us, tuned %s us, kept=%s", name, rule_us, tuned_us, kept)
            report(outcome)
    return TuningReport(
        database_dir=str(database_dir), budget_minutes=float(budget_minutes), trials_requested=int(trials),
        trials_used=used, elapsed_s=time.monotonic() - start, interrupted=interrupted, kernels=tuple(kernels),
    )
