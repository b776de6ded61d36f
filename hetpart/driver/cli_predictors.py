"""``hetpart profile | fit | evaluate``: a thin command-line layer over :mod:`predictors.profiling.zoo_profile` and
:mod:`predictors.fitting.training`. ``register(subparsers)`` adds the three subcommands to hetpart's parser."""
from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from hetpart.errors import PredictorError
from hetpart.paths import cache_root

log = logging.getLogger("hetpart")


def default_db() -> Path:
    """~/.cache/hetpart/profiles.sqlite (or under $HETPART_CACHE_DIR)."""
    return cache_root() / "profiles.sqlite"


def _progress_logger(every: int = 10):
    def report(phase: str, done: int, total: int, item: str) -> None:
        if done == total or done % every == 0 or phase in ("extract", "models"):
            log.info("[%s %d/%d] %s", phase, done, total, item)
    return report


def cmd_profile(args: argparse.Namespace) -> int:
    from predictors.profiling import sampling
    from predictors.profiling.cache_probe import effective_cache_bytes_for_db
    from predictors.profiling.refine import refine_passes
    from predictors.profiling.model_timing import BestWindowProfiler
    from predictors.profiling.zoo_profile import profile_zoo

    if args.device != "cpu":
        raise PredictorError(f"hetpart profile --device must be 'cpu'; found {args.device!r}. GPU kernels are "
                             "not profiled by this command yet; use an analytic GPU preset instead.")
    db = args.db or default_db()
    db.parent.mkdir(parents=True, exist_ok=True)
    variants = sampling.zoo_variants(include_variants=not args.no_variants, models=args.models or None)
    log.info("profiling %d model variants into %s with a budget of %.1f min", len(variants), db,
             args.budget_minutes)
    if args.passes < 1:
        raise PredictorError(f"hetpart profile --passes must be >= 1; found {args.passes}")
    budget_s = args.budget_minutes * 60.0
    profiler = BestWindowProfiler(args.device, windows=args.windows)
    # the cache this host really gives us, for the in-model terms (once per database; predictors.profiling.cache_probe)
    effective_cache_bytes_for_db(db, json.loads(profiler.target).get("mcpu"))
    if args.refine:
        for k, counts in enumerate(refine_passes(db, budget_s, profiler, args.passes, variants)):
            log.info("refine pass %d summary: %s", k + 1, json.dumps(counts))
        return 0
    summary = profile_zoo(db, budget_s, profiler, variants,
                          synthetic=not args.no_synthetic, max_synthetic=args.max_synthetic,
                          retest_count=args.retests, progress=_progress_logger(),
                          wait_when_slow_s=args.wait_when_slow_minutes * 60.0)
    log.info("profile summary: %s", json.dumps(summary.__dict__))
    if summary.stopped_contended:
        log.error("profiling stopped early: the machine stayed slower than this database's reference (see the warning "
                  "above); nothing measured since is comparable. Exit status 3.")
        return 3
    if args.passes > 1 and summary.kernels_not_started:
        log.warning("the budget ran out before every kernel was measured once, so no refine pass ran; rerun to "
                    "finish (nothing measured is lost), then `hetpart profile --refine`")
    elif args.passes > 1:
        for k, counts in enumerate(refine_passes(db, budget_s - summary.elapsed_s, profiler, args.passes - 1,
                                                 variants)):
            log.info("pass %d of %d (refine) summary: %s", k + 2, args.passes, json.dumps(counts))
    return 0


def cmd_fit(args: argparse.Namespace) -> int:
    from predictors.fitting.training import fit_from_db
    from predictors.registry import check_predictor_output, fitted_cpu_predictor_path, host_cpu_name

    db = args.db or default_db()
    if args.output:
        check_predictor_output(args.output)            # before the fit: a given path is known now
    predictor, info = fit_from_db(db, device=args.device)
    output = args.output
    if not output:   # where the loader looks on this host for the thread count the database was timed with
        output = fitted_cpu_predictor_path(host_cpu_name(), predictor.num_threads)
        check_predictor_output(output)
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    predictor.save(output)
    ctx = predictor.context
    bound, probed = info.get("cache_bound_bytes"), info.get("effective_cache_bytes")
    cache = (f"of a {bound / 2 ** 20:.0f} MiB bound (probed {probed / 2 ** 20:.0f} MiB)" if bound and probed
             else "of sysfs's size: the database has no probe of its host")
    log.info("fitted %s predictor on %d kernels timed with %s TVM thread(s) in %.1f s (in a model: +%.2f us per "
             "kernel, +%.1f us per MB of cold weights, a model keeping %.0f MiB %s last-level cache, +%.1f us per "
             "MB of activations beyond %.1f MiB) -> %s",
             args.device, info["n_kernels"], predictor.num_threads or "?", info["fit_seconds"],
             ctx.per_kernel_overhead_us, ctx.cold_param_us_per_mb, ctx.cache_bytes / 2 ** 20, cache,
             ctx.spilled_activation_us_per_mb, ctx.core_cache_bytes / 2 ** 20, output)
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from predictors.fitting.training import evaluate_db

    db = args.db or default_db()
    report = evaluate_db(db, device=args.device, out_dir=args.out, progress=_progress_logger(1))
    for line in report.get("verdicts", []):
        log.info("%s", line)
    for goal, g in (report.get("goals_polynomial_lomo") or {}).items():
        log.info("goal %s: measured %s (goal %s) -> %s", goal, _fmt(g["measured"]), g["sense"],
                 "met" if g["met"] else "MISSED")
    log.info("wrote %s", ", ".join(str(p) for p in report.get("written", [])))
    return 0


def _fmt(value: Any) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def register(subparsers: Any) -> None:
    """Add ``profile``, ``fit`` and ``evaluate`` to hetpart's subcommand parser."""
    p = subparsers.add_parser("profile", help="measure kernels of the zoo (+ synthetic variations) into a "
                                              "profile database, resumably, under a time budget",
                              epilog="Kernels are timed with TVM_NUM_THREADS threads (default: every core, the count "
                                     "compiled models run with); one database holds one thread count. Exit status 3: "
                                     "stopped early because every timing window was contended (the machine runs "
                                     "slower than when the database was made); rerun when quiet.")
    p.add_argument("--device", default="cpu", help="device to measure (cpu)")
    p.add_argument("--budget-minutes", type=float, required=True, help="wall-clock budget of this run")
    p.add_argument("--db", type=Path, help=f"profile database (default {default_db()})")
    p.add_argument("--models", nargs="*", help="zoo models to profile (default: all)")
    p.add_argument("--no-variants", action="store_true", help="only batch 1 at the default size")
    p.add_argument("--no-synthetic", action="store_true", help="skip the synthetic variations")
    p.add_argument("--max-synthetic", type=int, default=1200,
                   help="most synthetic workloads to consider, shared out equally among op kinds (the batch 2 "
                        "and 8 variations of weight-heavy convs, the variations of convs with a residual add and "
                        "of softmaxes come on top)")
    p.add_argument("--retests", type=int, default=40, help="kernels to measure twice (noise floor)")
    p.add_argument("--wait-when-slow-minutes", type=float, default=0.0,
                   help="when the machine turns slower than the database's reference, wait up to this long in all "
                        "for it to come back (the canary is timed every 30 s) instead of stopping at once (exit 3)")
    p.add_argument("--refine", action="store_true", help="only time the stored kernels (zoo and synthetic) and "
                   "models again, --passes times, keeping the lower (canary-normalised) median: contention only adds "
                   "time. It refuses to start when the host runs faster than the database's reference")
    p.add_argument("--passes", type=int, default=3, help="how often each kernel and model is timed, in separate "
                   "sweeps over all of them, keeping the lowest median; the first measures, the others refine, "
                   "while the budget lasts (this host has slow spells of seconds to minutes that the canary cannot see; "
                   "see benchmarks/results/host_spells.md)")
    p.add_argument("--windows", type=int, default=1, help="timing windows per kernel / model within a pass, back "
                   "to back; the least contended (lowest median) is kept")
    p.set_defaults(func=cmd_profile)

    p = subparsers.add_parser("fit", help="fit a latency predictor from a profile database (JSON, no pickles)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--db", type=Path, help=f"profile database (default {default_db()})")
    p.add_argument("-o", "--output", type=Path, help="predictor JSON to write (default: "
                   "predictors/cpu_<this host's CPU>.json in the cache, e.g. ~/.cache/hetpart/predictors/cpu_znver4.json, "
                   "which hetpart compile then uses on this CPU; cpu_<CPU>_threads<N>.json when the database was "
                   "timed with fewer threads than the host has cores, used for CPU devices of N cores); an "
                   "existing file is replaced only if it is a predictor hetpart wrote")
    p.set_defaults(func=cmd_fit)

    p = subparsers.add_parser("evaluate", help="honest error report of the predictors (leave-one-model-out, "
                                               "leave-one-family-out, baselines, noise floor)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--db", type=Path, help=f"profile database (default {default_db()})")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="directory for JSON + PNG")
    p.set_defaults(func=cmd_evaluate)
