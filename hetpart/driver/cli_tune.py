"""``hetpart tune``: bounded MetaSchedule tuning of a model's CPU kernels into the persistent tuning database; a thin
command-line layer over :func:`tvm_passes.tune.tune_model`. ``register(subparsers, add_model_args)`` adds it."""
from __future__ import annotations

import argparse
from pathlib import Path
from collections import Counter
from typing import Any, Callable

from hetpart.driver.console import console as _console
from hetpart.errors import HetpartError


def cmd_tune(args: argparse.Namespace) -> int:
    import json
    import time

    from hetpart.driver import api
    from tvm_passes.schedules import default_cpu_target
    from tvm_passes.tune import tune_model
    from tvm_passes.tuning_db import default_database_dir

    started_s = time.monotonic()
    console = _console()
    console.print(f"importing {args.model}", markup=False)
    imported = api.import_model(args.model, input_shapes=args.input_shape, batch=args.batch, size=args.size,
                                outputs=args.outputs)
    database = args.database or default_database_dir()
    import_minutes = (time.monotonic() - started_s) / 60.0  # the import counts against the budget too
    budget_minutes = args.budget_minutes - import_minutes if args.budget_minutes > 0 else args.budget_minutes
    if args.budget_minutes > 0 >= budget_minutes:
        raise HetpartError(f"--budget-minutes must leave time for tuning after the model import; importing "
                           f"{args.model} took {time.monotonic() - started_s:,.0f} s of the {args.budget_minutes} "
                           "minute budget. Pass a larger --budget-minutes.")

    def progress(p) -> None:
        last = "" if p.last is None else (
            f" — {p.last.name}: rules {p.last.rule_latency_us:,.0f} µs"
            + ("" if p.last.tuned_latency_us is None else f", tuned {p.last.tuned_latency_us:,.0f} µs")
            + (" (kept)" if p.last.kept else ""))
        detail = f" {p.detail}" if p.detail and p.last is None and p.phase != "done" else ""
        console.print(f"[{p.phase}: {p.done_kernels}/{p.total_kernels} kernels, {p.trials_used}/{p.trials_requested} "
                      f"trials, {p.elapsed_s:,.0f} s]{last}{detail}", markup=False)

    report = tune_model(imported.mod, default_cpu_target(), trials=args.trials, budget_minutes=budget_minutes,
                        database_dir=database, progress=progress)
    kept = [k for k in report.kernels if k.kept]
    console.print(f"tuned {len(report.kernels)} kernels with {report.trials_used} trials in {report.elapsed_s:,.0f} s, "
                  f"kept {len(kept)} faster schedules in {database}"
                  f"{' (interrupted: what was tuned is kept)' if report.interrupted else ''}", markup=False)
    if report.already_tuned:
        console.print(f"{report.already_tuned} kernels already had a record and were skipped", markup=False)
    for note in report.notes:
        console.print(note, markup=False)
    if report.skipped:
        names = ", ".join(k.name for k in report.skipped[:8]) + (", ..." if len(report.skipped) > 8 else "")
        reasons = Counter(k.reason for k in report.skipped)
        console.print(f"not tuned: {len(report.skipped)} kernels ({'; '.join(f'{n} {r}' for r, n in reasons.items())})"
                      f": {names}", markup=False)
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_json(), indent=1))
    return 130 if report.interrupted else 0


def register(sub: Any, add_model_args: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add ``tune`` to hetpart's subcommands."""
    p = sub.add_parser("tune", help="bounded MetaSchedule tuning of a model's CPU kernels (persistent database)")
    add_model_args(p)
    p.add_argument("--trials", type=int, default=64, help="MetaSchedule trials in total")
    p.add_argument("--budget-minutes", type=float, default=30.0,
                   help="wall-clock budget, model import included; no work starts that is not expected to fit")
    p.add_argument("--database", type=Path, help="tuning database dir (default ~/.cache/hetpart/tuning)")
    p.add_argument("--json", type=Path, help="write the tuning report as JSON")
    p.set_defaults(func=cmd_tune)
