"""hetpart's CPU schedule pass and the single-device Relax pipeline that uses it.

``cpu_pipeline(target)`` is TVM 0.27's ``relax.backend.cpu_generic`` default pipeline (library dispatch,
LegalizeOps, AnnotateTIROpPattern, FoldConstant, FuseOps, FuseTIR, dataflow lowering, finalisation) with
hetpart's LegalizeOps (:mod:`tvm_passes.legalize`: vectorisable exp/tanh/sigmoid/erf) in place of TVM's and
three additions: ``prepack_conv_weights`` first (constant conv weights stored output-channel-innermost, see
:mod:`.layout`), and after FuseTIR the records of a tuning database when one is given
(:mod:`tvm_passes.tuning_db`), then ``cpu_schedule_pass`` for every CPU PrimFunc the database did not cover.
The passes up to FuseTIR are :func:`tvm_passes.tuning_db.kernel_lowering_passes`, shared with
``tvm_passes.tune`` so tuned workloads match the kernels looked up here.  The pieces are taken from
``tvm.relax.backend.cpu_generic`` rather than copied, so upstream changes to them flow through.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import tvm
from tvm import tirx
from tvm.relax.backend.cpu_generic import pipeline as cpu_generic
from tvm.target import Target

from .. import tuning_db
from .base import SCHEDULED_ATTR, CpuRule, apply_first_rule

logger = logging.getLogger(__name__)


def default_rules() -> list[CpuRule]:
    """hetpart's CPU rules, most specific first (the first rule that applies wins)."""
    from .concat import Concat
    from .conv2d import Conv2dNCHW
    from .conv_depthwise import Conv2dDepthwise
    from .conv_flat import Conv2dFlat
    from .elementwise import Elementwise
    from .matmul import Matmul
    from .pooling import Pooling
    from .reduction import RowReduction

    return [Conv2dFlat(), Conv2dDepthwise(), Conv2dNCHW(), Matmul(), Pooling(), RowReduction(), Concat(), Elementwise()]


def _is_cpu_func(func: tirx.PrimFunc, target: Target) -> tuple[bool, Target | None]:
    """Whether ``func`` runs on the CPU, and the llvm target to schedule it for."""
    func_target = func.attrs.get("target") if func.attrs is not None else None
    if func_target is None:
        return (target.kind.name == "llvm", target if target.kind.name == "llvm" else None)
    return (func_target.kind.name == "llvm", func_target if func_target.kind.name == "llvm" else None)


def _is_scheduled(func: tirx.PrimFunc) -> bool:
    return func.attrs is not None and SCHEDULED_ATTR in func.attrs and bool(func.attrs[SCHEDULED_ATTR])


def _unscheduled_cpu_funcs(mod: tvm.ir.IRModule, target: Target):
    """(global var, PrimFunc, its target) for every CPU PrimFunc of ``mod`` no schedule has been applied to."""
    for gvar, func in mod.functions_items():
        if not isinstance(func, tirx.PrimFunc) or _is_scheduled(func):
            continue
        is_cpu, func_target = _is_cpu_func(func, target)
        if is_cpu:
            yield gvar, func, func_target


def cpu_schedule_pass(target: Target | str | dict, rules: list[CpuRule] | None = None) -> tvm.transform.Pass:
    """A module pass scheduling every unscheduled CPU PrimFunc with hetpart's CPU rules.

    A PrimFunc is a CPU one when its ``target`` attribute has kind llvm, or when it has no target attribute
    and ``target`` is llvm.  GPU PrimFuncs and PrimFuncs already marked ``tirx.is_scheduled`` are left as
    they are; so are PrimFuncs no rule applies to.  The input module is not mutated (the pass works on a
    copy).  Scheduled PrimFuncs get ``tirx.is_scheduled=True`` and ``hetpart.cpu_rule=<rule name>``.
    """
    target = Target(target) if not isinstance(target, Target) else target
    active_rules = list(rules) if rules is not None else default_rules()

    @tvm.transform.module_pass(opt_level=0, name="HetpartCpuSchedule")
    def _pass(mod: tvm.ir.IRModule, _ctx: tvm.transform.PassContext) -> tvm.ir.IRModule:
        updates = {}
        for gvar, func, func_target in _unscheduled_cpu_funcs(mod, target):
            scheduled = apply_first_rule(func, func_target, active_rules)
            if scheduled is None:
                logger.debug("no CPU rule applies to %s; left unscheduled", gvar.name_hint)
                continue
            updates[gvar] = scheduled
        if not updates:
            return mod
        new_mod = mod.clone()
        for gvar, func in updates.items():
            new_mod[gvar] = func
        return new_mod

    return _pass


def _scheduled_from_database(database, func: tirx.PrimFunc, target: Target) -> tirx.PrimFunc | None:
    """``func`` scheduled by its database record (keeping its attributes), or None without a record."""
    key = tuning_db.workload_module(func)
    if not database.has_workload(key):
        return None
    schedule = database.query_schedule(key, target, "main")
    if schedule is None:
        return None
    tuned = schedule.mod["main"].without_attr("global_symbol")
    for name, value in (func.attrs or {}).items():
        tuned = tuned.with_attr(name, value)
    return tuned.with_attr(SCHEDULED_ATTR, True)


def apply_database_pass(database, target: Target, database_dir: Path | str) -> tvm.transform.Pass:
    """A module pass giving every unscheduled CPU PrimFunc with a record in ``database`` the record's schedule.

    Unlike TVM's MetaScheduleApplyDatabase it keeps the module's ``global_infos`` (vdevices) and attributes,
    and it never fails a build: a record that does not apply to its kernel (or any other error) leaves the
    kernel to the rules and is reported in one warning naming ``database_dir``.
    """

    @tvm.transform.module_pass(opt_level=0, name="HetpartApplyTuningDatabase")
    def _apply(mod: tvm.ir.IRModule, _ctx: tvm.transform.PassContext) -> tvm.ir.IRModule:
        updates, failures = {}, []
        for gvar, func, func_target in _unscheduled_cpu_funcs(mod, target):
            try:
                scheduled = _scheduled_from_database(database, func, func_target)
            except Exception as exc:  # noqa: BLE001 (a record's trace may fail in many TVM-specific ways)
                failures.append(f"{gvar.name_hint} ({type(exc).__name__}: {str(exc).strip()[-160:]})")
                continue
            if scheduled is not None:
                updates[gvar] = scheduled
        if failures:
            logger.warning("tuning records in %s do not apply to %d kernel(s), which use the CPU rules instead: %s. "
                           "Fix: delete %s or run `hetpart tune` again", database_dir, len(failures),
                           "; ".join(failures), database_dir)
        if not updates:
            return mod
        new_mod = mod.clone()
        for gvar, func in updates.items():
            new_mod[gvar] = func
        logger.info("applied %d tuned schedule(s) from %s", len(updates), database_dir)
        return new_mod

    return _apply


def tuning_database_passes(database_dir: Path | str | None, target: Target) -> list[tvm.transform.Pass]:
    """The pass applying the persistent tuning database in ``database_dir``; none when there is no database.

    An unreadable database (empty or malformed files, records that do not load) is logged as one warning
    naming the directory and the fix, and the build goes on with the rules alone.
    """
    if database_dir is None:
        return []
    try:
        database = tuning_db.read_database(database_dir)
    except tuning_db.TuningDatabaseError as exc:
        logger.warning("tuning database ignored, building with the CPU rules only: %s", exc)
        return []
    if database is None:
        logger.info("no tuning database at %s; using the CPU rules only", database_dir)
        return []
    return [apply_database_pass(database, target, database_dir)]


def cpu_pipeline(target: Target | str | dict, database_dir: Path | str | None = None) -> tvm.transform.Pass:
    """The full single-device Relax pipeline hetpart uses for the CPU.

    ``relax.get_default_pipeline(target)`` for llvm, preceded by :func:`prepack_conv_weights`, with
    (optional) tuning-database application and then :func:`cpu_schedule_pass` inserted right after FuseTIR.  Use as
    ``tvm.compile(mod, target=target, relax_pipeline=cpu_pipeline(target))``.
    """
    target = Target(target) if not isinstance(target, Target) else target
    passes = (
        tuning_db.kernel_lowering_passes(target)
        + tuning_database_passes(database_dir, target)
        + [cpu_schedule_pass(target)]
        + cpu_generic.dataflow_lower_passes(target)
        + cpu_generic.finalize_passes(target)
    )

    @tvm.transform.module_pass(opt_level=0, name="HetpartCpuPipeline")
    def _pipeline(mod: tvm.ir.IRModule, _ctx: tvm.transform.PassContext) -> tvm.ir.IRModule:
        with target:
            return tvm.transform.Sequential(passes)(mod)

    return _pipeline


def default_cpu_target() -> Target:
    """The llvm target hetpart compiles CPU kernels for: this host's CPU (mcpu, hence SIMD width) and core count.

    Chosen by measurement (benchmarks/results/cpu_kernels.md): with the vectorised rules, the host-CPU target
    (AVX-512 here) beats generic x86-64 llvm.
    """
    host = Target.from_device(tvm.cpu())
    config = {"kind": "llvm", "mcpu": str(host.attrs["mcpu"]), "mtriple": str(host.attrs["mtriple"])}
    config["num-cores"] = max(1, os.cpu_count() or 1)
    return Target(config)
