"""Optional, bounded MetaSchedule tuning of a model's CPU kernels, kept in a persistent JSON database.

``tune_model`` lowers the model as ``cpu_pipeline`` does up to FuseTIR (:mod:`tvm_passes.tuning_db`, so tuned
workloads match the kernels later looked up), times each kernel under hetpart's rules, and tunes the kernels
heaviest first (rule latency x calls) until the trial count or the wall-clock budget runs out.  A tuned
schedule is committed (atomically, as soon as its kernel is done) only when it measures faster than the rules
in the same process, so the database never makes a kernel slower.  Ctrl-C or the budget stops tuning and keeps
what was committed; an unreadable database found at the start is set aside.  No piece of work (a rule timing,
a MetaSchedule batch) starts unless :class:`TuningBudget` expects it to fit in the time left, and the
``progress`` callback hears from every phase.
"""

from __future__ import annotations

import logging
import math
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.s_tir import meta_schedule as ms
from tvm.target import Target

from hetpart.errors import HetpartError

from . import tuning_db
from .tune_search import HEARTBEAT_S, TRIALS_PER_ITER, heartbeat, tune_one

logger = logging.getLogger(__name__)

# Seconds per MetaSchedule trial assumed until one is measured: a conv batch of 8 on a busy 2-core host
# (search, build and run included).  Pessimistic on purpose: it only sizes the first kernel's trials.
PRIOR_SECONDS_PER_TRIAL = 20.0
PRIOR_RULE_TIMING_S = 2.0
Clock = Callable[[], float]


@dataclass
class TuningBudget:
    """A wall-clock deadline (``clock`` seconds) and what the work has been measured to cost so far.

    A MetaSchedule batch costs a fixed part (search, worker start-up) plus a part per trial.  A batch of n
    trials is expected to take the larger of n x (seconds per trial measured so far, or the prior) and the
    mean duration of the measured batches of the same kind (a kernel's first batch includes its start-up).
    Every tuned kernel is then timed against the rules (two rule timings).
    """

    deadline_s: float
    clock: Clock = time.monotonic
    prior_seconds_per_trial: float = PRIOR_SECONDS_PER_TRIAL
    prior_rule_timing_s: float = PRIOR_RULE_TIMING_S
    batches: list[tuple[int, float, bool]] = field(default_factory=list)  # (trials, seconds, first of a kernel)
    rule_timings_s: list[float] = field(default_factory=list)

    def remaining_s(self) -> float:
        return self.deadline_s - self.clock()

    def seconds_per_trial(self) -> float:
        trials = sum(b[0] for b in self.batches)
        return sum(b[1] for b in self.batches) / trials if trials else self.prior_seconds_per_trial

    def rule_timing_s(self) -> float:
        return float(np.mean(self.rule_timings_s)) if self.rule_timings_s else self.prior_rule_timing_s

    def batch_s(self, trials: int, first: bool) -> float:
        same_kind = [b[1] for b in self.batches if b[2] == first] or [b[1] for b in self.batches] or [0.0]
        return max(trials * self.seconds_per_trial(), float(np.mean(same_kind)))

    def record_batch(self, trials: int, seconds: float, first: bool) -> None:
        self.batches.append((trials, max(0.0, seconds), first))

    def record_rule_timing(self, seconds: float) -> None:
        self.rule_timings_s.append(max(0.0, seconds))

    def can_time_rule(self) -> bool:
        return self.remaining_s() >= self.rule_timing_s()

    def batch_fits(self, trials: int, first: bool) -> bool:
        return self.batch_s(trials, first) + 2 * self.rule_timing_s() <= self.remaining_s()

    def trials_to_start(self, wanted: int, batch_trials: int) -> int:
        """Trials (at most ``wanted``) a new kernel may start with: 0 unless its first batch fits."""
        spare_s = self.remaining_s() - 2 * self.rule_timing_s()
        trials = max(0, min(wanted, math.floor(spare_s / self.seconds_per_trial())))
        return trials if trials and self.batch_fits(min(batch_trials, trials), first=True) else 0


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
    stopped_by_budget: bool = False


@dataclass(frozen=True)
class SkippedKernel:
    """A kernel ``tune_model`` did not tune, and why (``budget``, ``trials`` or ``interrupted``)."""

    name: str
    reason: str


@dataclass(frozen=True)
class TuningReport:
    """What ``tune_model`` did: per kernel outcomes in tuning order, what was skipped, and why it stopped."""

    database_dir: str
    budget_minutes: float
    trials_requested: int
    trials_used: int
    elapsed_s: float
    interrupted: bool
    kernels: tuple[KernelTuning, ...] = field(default_factory=tuple)
    stopped_by_budget: bool = False
    skipped: tuple[SkippedKernel, ...] = field(default_factory=tuple)
    already_tuned: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TuningProgress:
    """Passed to the ``progress`` callback in every phase: ``lowering``, ``timing rules``, ``tuning``, ``done``.

    ``done_kernels``/``total_kernels`` count the current phase's kernels.  While a MetaSchedule batch runs
    the callback is also called every HEARTBEAT_S seconds, from a background thread.
    """

    done_kernels: int
    total_kernels: int
    trials_used: int
    trials_requested: int
    elapsed_s: float
    last: KernelTuning | None
    phase: str = "tuning"
    detail: str = ""


def lower_for_tuning(mod: tvm.ir.IRModule, target: Target) -> tvm.ir.IRModule:
    """The module as ``cpu_pipeline`` sees it right after FuseTIR (prepack, legalize, fuse)."""
    with target:
        return tvm.transform.Sequential(tuning_db.kernel_lowering_passes(target))(mod)


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
    from .schedules import default_rules
    from .schedules.base import apply_first_rule

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


@dataclass
class _Kernel:
    name: str
    calls: int
    func: tirx.PrimFunc
    task_mod: tvm.ir.IRModule
    args: list = field(default_factory=list)
    rule_us: float = 0.0


class _TuningRun:
    """One ``tune_model`` call: budget, progress reporting and the three phases."""

    def __init__(self, target: Target, trials: int, per_kernel: int, budget_minutes: float, database_dir: Path,
                 progress: Callable[[TuningProgress], None] | None, clock: Clock) -> None:
        self.target, self.trials, self.per_kernel, self.database_dir = target, trials, per_kernel, database_dir
        self.budget_minutes, self.progress, self.clock = budget_minutes, progress, clock
        self.start_s = clock()
        self.budget = TuningBudget(deadline_s=self.start_s + budget_minutes * 60.0, clock=clock)
        self.kernels: list[KernelTuning] = []
        self.skipped: list[SkippedKernel] = []
        self.notes: list[str] = []
        self.used = self.already_tuned = 0
        self.interrupted = self.stopped_by_budget = False
        self._lock = threading.Lock()

    def elapsed_s(self) -> float:
        return self.clock() - self.start_s

    def emit(self, phase: str, done: int, total: int, detail: str = "", last: KernelTuning | None = None) -> None:
        if self.progress is None:
            return
        with self._lock:
            self.progress(TuningProgress(done, total, self.used, self.trials, self.elapsed_s(), last, phase, detail))

    def stop_for_budget(self, detail: str, rest: list[_Kernel], what: str) -> None:
        self.stopped_by_budget = True
        self.skipped += [SkippedKernel(k.name, f"budget: {what}") for k in rest]
        self.notes.append(f"the budget stopped work at {self.elapsed_s():.0f} s of {self.budget_minutes * 60:.0f} s: "
                          f"{detail}; {len(rest)} kernel(s) {what}")
        logger.debug("tuning: %s", self.notes[-1])

    def open_database(self) -> ms.database.Database | None:
        try:
            return tuning_db.read_database(self.database_dir)
        except tuning_db.TuningDatabaseError as exc:
            moved = tuning_db.set_aside_unreadable(self.database_dir)
            note = (f"the tuning database in {self.database_dir} was unreadable ({exc.__cause__ or exc}); it was set "
                    f"aside ({', '.join(p.name for p in moved) or 'empty files deleted'}) and a new one started")
            logger.warning("%s", note)
            self.notes.append(note)
            return None

    def pending_kernels(self, mod: tvm.ir.IRModule) -> list[_Kernel]:
        self.emit("lowering", 0, 0, "lowering the model to CPU kernels")
        database = self.open_database()
        with heartbeat(HEARTBEAT_S, lambda: self.emit("lowering", 0, 0, "still lowering the model")):
            lowered = lower_for_tuning(mod, self.target)
        counts = _call_counts(lowered)
        pending = []
        for gvar, func in lowered.functions_items():
            if not isinstance(func, tirx.PrimFunc) or gvar.name_hint not in counts:
                continue
            task_mod = tuning_db.workload_module(func)
            if database is not None and database.has_workload(task_mod) \
                    and database.get_top_k(database.commit_workload(task_mod), 1):
                self.already_tuned += 1
                continue
            pending.append(_Kernel(gvar.name_hint, counts[gvar.name_hint], func, task_mod))
        self.emit("lowering", 0, len(pending), f"{len(pending)} kernels to tune, {self.already_tuned} already tuned")
        return pending

    def time_rules(self, pending: list[_Kernel]) -> list[_Kernel]:
        """Rule latency of each kernel while the budget allows; the timed kernels, heaviest total time first."""
        timed: list[_Kernel] = []
        for index, kernel in enumerate(pending):
            if not self.budget.can_time_rule():
                self.stop_for_budget(f"timing a rule schedule takes ~{self.budget.rule_timing_s():.1f} s, "
                                     f"{max(0.0, self.budget.remaining_s()):.1f} s were left",
                                     pending[index:], "not timed, not tuned")
                break
            began = self.clock()
            kernel.args = _random_args(kernel.func, tvm.cpu())
            kernel.rule_us = _time_us(_rule_schedule(kernel.func, self.target), self.target, kernel.args)
            self.budget.record_rule_timing(self.clock() - began)
            timed.append(kernel)
            self.emit("timing rules", index + 1, len(pending),
                      f"{kernel.name}: {kernel.rule_us:,.0f} us x {kernel.calls} call(s)")
        return sorted(timed, key=lambda k: -k.rule_us * k.calls)

    def tune_all(self, candidates: list[_Kernel]) -> None:
        with tempfile.TemporaryDirectory(prefix="hetpart-tune-") as work_dir:
            for index, kernel in enumerate(candidates):
                wanted = min(self.per_kernel, self.trials - self.used)
                if wanted < 1:
                    self.skipped += [SkippedKernel(k.name, "trials: the trial count is used up")
                                     for k in candidates[index:]]
                    break
                fit = self.budget.trials_to_start(wanted, TRIALS_PER_ITER)
                if fit < 1:
                    batch_s = self.budget.batch_s(min(wanted, TRIALS_PER_ITER), first=True)
                    self.stop_for_budget(f"a kernel's first batch takes ~{batch_s:.0f} s, "
                                         f"{max(0.0, self.budget.remaining_s()):.0f} s were left",
                                         candidates[index:], "not tuned")
                    break
                try:
                    outcome = self.tune_kernel(kernel, fit, work_dir, index, len(candidates))
                except KeyboardInterrupt:
                    self.interrupted = True
                    self.skipped += [SkippedKernel(k.name, "interrupted") for k in candidates[index:]]
                    logger.warning("tuning interrupted during %s; records committed so far are kept", kernel.name)
                    break
                except Exception as exc:  # noqa: BLE001 (one kernel failing in MetaSchedule must not end the run)
                    self.skipped.append(SkippedKernel(kernel.name, f"error: {type(exc).__name__}: {str(exc)[-200:]}"))
                    logger.warning("tuning %s failed (%s: %s); going on with the next kernel", kernel.name,
                                   type(exc).__name__, str(exc).strip()[-300:])
                    continue
                self.kernels.append(outcome)
                logger.debug("tuned %s: rules %.1f us, tuned %s us, kept=%s", outcome.name, outcome.rule_latency_us,
                             outcome.tuned_latency_us, outcome.kept)
                self.emit("tuning", index + 1, len(candidates), f"{kernel.name} done", outcome)

    def tune_kernel(self, kernel: _Kernel, trials: int, work_dir: str, index: int, total: int) -> KernelTuning:
        began = self.clock()
        state = {"mark": began, "measured": 0, "cut": False}

        def on_batch(count: int, best_us: float | None) -> bool:
            now = self.clock()
            self.budget.record_batch(count, now - state["mark"], first=state["measured"] == 0)
            state["mark"] = now
            state["measured"] += count
            self.used += count
            best = "" if best_us is None else f", best {best_us:,.0f} us"
            self.emit("tuning", index, total, f"{kernel.name}: {state['measured']}/{trials} trials{best}")
            next_batch = min(TRIALS_PER_ITER, trials - state["measured"])
            if next_batch > 0 and not self.budget.batch_fits(next_batch, first=False):
                state["cut"] = True
                return False
            return True

        def beat() -> None:
            self.emit("tuning", index, total, f"{kernel.name}: MetaSchedule batch running "
                      f"({state['measured']}/{trials} trials measured, {self.clock() - began:.0f} s on this kernel)")

        self.emit("tuning", index, total, f"{kernel.name}: starting {trials} trials")
        with heartbeat(HEARTBEAT_S, beat):
            best = tune_one(kernel.task_mod, kernel.name, self.target, trials, work_dir, on_batch)
        rule_us, tuned_us, kept = kernel.rule_us, None, False
        if best is not None:
            sch = tvm.s_tir.Schedule(kernel.task_mod)
            best.trace.apply_to_schedule(sch, remove_postproc=False)
            tuned_us = _time_us(sch.mod["main"], self.target, kernel.args)
            rule_us = min(rule_us, _time_us(_rule_schedule(kernel.func, self.target), self.target, kernel.args))
            if tuned_us < rule_us:
                tuning_db.commit_record(self.database_dir, kernel.task_mod, best, self.target)
                kept = True
        if state["cut"]:
            self.stopped_by_budget = True
            self.notes.append(f"the budget stopped {kernel.name} after {state['measured']} of {trials} trials "
                              f"at {self.elapsed_s():.0f} s")
        return KernelTuning(kernel.name, kernel.calls, rule_us, tuned_us, state["measured"], kept,
                            self.clock() - began, state["cut"])

    def report(self) -> TuningReport:
        return TuningReport(str(self.database_dir), float(self.budget_minutes), int(self.trials), self.used,
                            self.elapsed_s(), self.interrupted, tuple(self.kernels), self.stopped_by_budget,
                            tuple(self.skipped), self.already_tuned, tuple(self.notes))


def tune_model(
    mod: tvm.ir.IRModule,
    target: Target,
    trials: int,
    budget_minutes: float,
    database_dir: Path | str,
    progress: Callable[[TuningProgress], None] | None = None,
    trials_per_kernel: int | None = None,
    clock: Clock = time.monotonic,
) -> TuningReport:
    """Tune the model's heaviest CPU kernels with MetaSchedule within ``trials`` and ``budget_minutes``.

    ``trials_per_kernel`` (default: ``max(8, trials // 4)``) bounds each kernel; kernels that already have
    a record in the database are skipped.  ``clock`` (seconds) measures the budget.  Returns a
    :class:`TuningReport`; see the module docstring.
    """
    if trials < 1 or budget_minutes <= 0:
        raise HetpartError(
            f"tuning needs trials >= 1 and budget_minutes > 0; got trials={trials}, "
            f"budget_minutes={budget_minutes}. Pass a positive trial count and time budget."
        )
    target = Target(target) if not isinstance(target, Target) else target
    per_kernel = trials_per_kernel or max(TRIALS_PER_ITER, trials // 4)
    run = _TuningRun(target, trials, per_kernel, budget_minutes, Path(database_dir), progress, clock)
    try:
        pending = run.pending_kernels(mod)
        candidates = run.time_rules(pending)
        run.tune_all(candidates)
    except KeyboardInterrupt:
        run.interrupted = True
        logger.warning("tuning interrupted; records committed so far are kept")
    report = run.report()
    run.emit("done", len(report.kernels), len(report.kernels) + len(report.skipped),
             "; ".join(report.notes) or "all kernels tuned")
    return report
