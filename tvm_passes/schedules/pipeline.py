"""hetpart's CPU schedule pass and the single-device Relax pipeline that uses it.

``cpu_pipeline(target)`` is TVM 0.27's ``relax.backend.cpu_generic`` default pipeline (library dispatch,
LegalizeOps, AnnotateTIROpPattern, FoldConstant, FuseOps, FuseTIR, dataflow lowering, finalisation) with
hetpart's LegalizeOps (:mod:`tvm_passes.legalize`: vectorisable exp/tanh/sigmoid/erf) in place of TVM's and
three additions: ``prepack_conv_weights`` first (constant conv weights stored output-channel-innermost, see
:mod:`.layout`), and after FuseTIR MetaScheduleApplyDatabase when a tuning database is given, then
``cpu_schedule_pass`` for every CPU PrimFunc the database did not cover.  The pieces are taken from
``tvm.relax.backend.cpu_generic`` rather than copied, so upstream changes to them flow through.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import tvm
from tvm import relax, tirx
from tvm.relax.backend.cpu_generic import pipeline as cpu_generic
from tvm.target import Target

from ..legalize import with_hetpart_legalization
from .base import SCHEDULED_ATTR, CpuRule, apply_first_rule, vector_lanes
from .layout import prepack_conv_weights

logger = logging.getLogger(__name__)


def default_rules() -> list[CpuRule]:
    """hetpart's CPU rules, most specific first (the first rule that applies wins)."""
    from .concat import Concat
    from .conv2d import Conv2dNCHW
    from .elementwise import Elementwise
    from .matmul import Matmul
    from .reduction import RowReduction

    return [Conv2dNCHW(), Matmul(), RowReduction(), Concat(), Elementwise()]


def _is_cpu_func(func: tirx.PrimFunc, target: Target) -> tuple[bool, Target | None]:
    """Whether ``func`` runs on the CPU, and the llvm target to schedule it for."""
    func_target = func.attrs.get("target") if func.attrs is not None else None
    if func_target is None:
        return (target.kind.name == "llvm", target if target.kind.name == "llvm" else None)
    return (func_target.kind.name == "llvm", func_target if func_target.kind.name == "llvm" else None)


def _is_scheduled(func: tirx.PrimFunc) -> bool:
    return func.attrs is not None and SCHEDULED_ATTR in func.attrs and bool(func.attrs[SCHEDULED_ATTR])


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
        for gvar, func in mod.functions_items():
            if not isinstance(func, tirx.PrimFunc) or _is_scheduled(func):
                continue
            is_cpu, func_target = _is_cpu_func(func, target)
            if not is_cpu:
                continue
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


def tuning_database_passes(database_dir: Path | str | None, target: Target) -> list[tvm.transform.Pass]:
    """MetaScheduleApplyDatabase over a persistent JSON database, when one exists on disk."""
    if database_dir is None:
        return []
    from .. import tune  # local import: tune pulls in MetaSchedule

    database = tune.open_database(database_dir, create=False)
    if database is None:
        logger.info("no tuning database at %s; using the CPU rules only", database_dir)
        return []

    @tvm.transform.module_pass(opt_level=0, name="HetpartApplyTuningDatabase")
    def _apply(mod: tvm.ir.IRModule, _ctx: tvm.transform.PassContext) -> tvm.ir.IRModule:
        with target, database:
            return relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(mod)

    return [_apply]


def cpu_pipeline(target: Target | str | dict, database_dir: Path | str | None = None) -> tvm.transform.Pass:
    """The full single-device Relax pipeline hetpart uses for the CPU.

    ``relax.get_default_pipeline(target)`` for llvm, preceded by :func:`prepack_conv_weights`, with
    (optional) tuning-database application and then :func:`cpu_schedule_pass` inserted right after FuseTIR.  Use as
    ``tvm.compile(mod, target=target, relax_pipeline=cpu_pipeline(target))``.
    """
    target = Target(target) if not isinstance(target, Target) else target
    passes = (
        [prepack_conv_weights(vector_lanes(target))]
        + cpu_generic.library_dispatch_passes(target)
        + with_hetpart_legalization(cpu_generic.legalize_passes(target))
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
