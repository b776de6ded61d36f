"""Latency-predictor benchmark: the honest error report of the CPU predictors as JSON + markdown + scatter PNG.

Runs :func:`predictors.fitting.training.evaluate_db` on a profile database made by ``hetpart profile`` (leave-one-model-
out over the zoo variants, leave-one-family-out, the polynomial predictor against the FLOPs x constant,
calibrated-roofline, random-forest and lookup baselines, the test-retest noise floor) and renders the figures
against the goals:

* per fused kernel >= 100 µs: MAPE <= 8 %, ±10 % accuracy >= 90 %; kernels 10-100 µs: MAPE <= 15 %;
* whole model, leave-one-model-out: MAPE <= 7 %, worst <= 20 %;
* profile + fit <= 60 min (profiling wall time recorded per run in the database); fit alone <= 60 s.

    python benchmarks/predictor_accuracy.py --db ~/.cache/hetpart/profiles.sqlite   # -> benchmarks/results/predictors.*

``--profile-log`` adds runs that predate the database's run table: it reads the ``profile summary:`` line(s)
that ``hetpart profile`` logs (their measured ``elapsed_s``).
"""
from __future__ import annotations

import argparse
import json
import logging
import platform
import re
import sys
from pathlib import Path
from typing import Any

# Run as a script, this file's directory comes first on sys.path and its name would shadow the `predictors`
# package: put the repository root there instead.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from predictors.fitting.training import evaluate_db  # noqa: E402

logger = logging.getLogger("benchmarks.predictors")

METHOD_ORDER = ("polynomial", "random_forest", "calibrated_roofline", "flops_constant", "lookup")


def _pct(value: Any) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _num(value: Any, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}g}"


def logged_runs(paths: list[Path]) -> list[dict[str, Any]]:
    runs = []
    for path in paths:
        text = re.sub(r"\s+", " ", path.read_text())       # rich wraps long log lines
        for match in re.finditer(r"profile summary: (?=\{)", text):
            # the object ends where JSON says, not at the next brace: other log lines may follow it on the line
            summary, _ = json.JSONDecoder().raw_decode(text, match.end())
            runs.append({"source": str(path), "elapsed_s": summary["elapsed_s"], "summary": summary})
    return runs


def render_markdown(report: dict[str, Any], command: str) -> str:
    lines = [f"# Latency predictors ({report['device']}, TVM {report['tvm_version']})", "",
             f"Produced by `{command}` on {report.get('host', '?')}; target `{json.dumps(report['target'])}`, "
             f"{report.get('num_threads', '?')} TVM thread(s).", "",
             f"{report['n_model_records']} model variants ({', '.join(report['models'])}), families "
             f"{', '.join(report['families'])}; {report['n_kernel_rows_ok']} distinct kernels with an ok label "
             f"({report['n_synthetic_kernels']} synthetic); row statuses {report['row_statuses']}.", ""]
    if report.get("cache_bound_bytes"):
        sysfs = report.get("sysfs_cache_bytes")
        lines += [f"In-model terms: each fold fits the share of a {report['cache_bound_bytes'] / 2 ** 20:.0f} MiB "
                  f"last-level cache bound a model keeps (probed {report['effective_cache_bytes'] / 2 ** 20:.0f} MiB, "
                  f"sysfs {'?' if sysfs is None else f'{sysfs / 2 ** 20:.0f}'} MiB; "
                  "predictors/profiling/cache_probe.py); "
                  f"cores' L2 {report['core_cache_bytes'] / 2 ** 20:.0f} MiB.", ""]
    if report.get("excluded_models"):
        lines += ["Excluded model variants: " + "; ".join(f"{k}: {v}" for k, v in report["excluded_models"].items()),
                  ""]
    lines += ["## Goals (polynomial, leave-one-model-out)", "", "| goal | target | measured | met |",
              "|---|---|---|---|"]
    for goal, g in (report.get("goals_polynomial_lomo") or {}).items():
        lines.append(f"| {goal} | {g['sense']} | {_num(g['measured'], 4)} | {'yes' if g['met'] else '**NO**'} |")
    prof = report.get("profile_seconds_total", 0.0)
    fit = report.get("full_fit_seconds")
    lines.append(f"| profile + fit (min) | max 60 | {prof / 60 + (fit or 0) / 60:.1f} | "
                 f"{'yes' if prof / 60 + (fit or 0) / 60 <= 60 else '**NO**'} |")
    lines.append(f"| fit alone (s) | max 60 | {_num(fit)} | {'yes' if fit is not None and fit <= 60 else '**NO**'} |")
    for split_name, split in report["splits"].items():
        if not split:
            continue
        lines += ["", f"## {split_name.replace('_', ' ')}", "",
                  "| method | kernel MAPE | ±10% | kernels >=100us MAPE | >=100us ±10% | 10-100us MAPE | "
                  "<10us MAPE | Spearman | bias | model MAPE | model worst | fit s (max) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for method in [m for m in METHOD_ORDER if m in split] + [m for m in split if m not in METHOD_ORDER]:
            r = split[method]
            k = r["kernel"]
            lines.append(
                f"| {method} | {_pct(k['all']['mape'])} | {_pct(k['all']['within_10pct'])} | "
                f"{_pct(k['ge_100us']['mape'])} (n={k['ge_100us']['n']}) | {_pct(k['ge_100us']['within_10pct'])} | "
                f"{_pct(k['10_to_100us']['mape'])} (n={k['10_to_100us']['n']}) | {_pct(k['lt_10us']['mape'])} | "
                f"{_num(k['spearman'])} | {_pct(k['all']['signed_bias'])} | {_pct(r['model']['mape'])} | "
                f"{_pct(r['model']['max_ape'])} | {_num(r['fit_seconds']['max'])} |")
        poly = split["polynomial"]["model"]["per_model"]
        lines += ["", "Per model (polynomial): " + ", ".join(
            f"{name} {_pct((v['predicted_us'] - v['measured_us']) / v['measured_us'])}" for name, v in poly.items())]
        kinds = split["polynomial"]["kernel"]["by_kind"]
        lines += ["", "Per kernel kind (polynomial): " + ", ".join(
            f"{kind} MAPE {_pct(v['mape'])} Spearman {_num(v['spearman'])} (n={v['n']})" for kind, v in kinds.items())]
    misses = report.get("misses_ge_100us")
    if misses and misses.get("misses"):
        lines += ["", "## Misses: kernels >= 100 µs outside ±10% (polynomial, leave-one-model-out)", "",
                  f"{misses['misses']} of {misses['n_kernels_ge_min']} kernel instances ({misses['distinct_kernels']} "
                  f"distinct kernels). **{misses['label_stable']}** have a *stable* label -- every quiet re-measurement "
                  f"of the kernel lies within ±10% of it -- so they are errors of the predictor, not of the "
                  f"measurements; {misses['label_noisy']} have a label that some pass measured more than 10% away.",
                  "", "Per model: " + ", ".join(f"{k} {v}" for k, v in misses["per_model"].items()) + ". Per kind: "
                  + ", ".join(f"{k} {v}" for k, v in misses["per_kind"].items()) + "."]
    composed = report.get("model_level_floor", {})
    if composed:
        lines += ["", "## Model-level floor (perfect kernel predictions)", "",
                  "Each held-out model's *measured* kernel latencies plus in-model terms (per-kernel overhead, cold "
                  "weights, activations spilled past the cores' L2) fitted on the other models, against its measured latency: no kernel predictor can beat "
                  "this on the same split.", ""]
        for split, v in composed.items():
            worst = max(v["signed_error_per_model"].items(), key=lambda kv: abs(kv[1]))
            lines.append(f"- {split}: MAPE {_pct(v['mape'])}, worst {_pct(v['max_ape'])} ({worst[0]})")
    floor = report.get("noise_floor", {})
    lines += ["", "## Noise floor (test-retest of the measurements themselves)", "",
              "Every `hetpart profile --refine` pass (and `--retests`) records one re-measurement per kernel and "
              "session. A session is *quiet* when its median canary is within 5% of the reference; contended "
              "sessions are listed but kept out of the floors (a label is the lowest median over sessions). "
              "`retest_*`: quiet re-measurements against the stored label -- how often the protocol itself "
              "lands within ±10% of a label, which bounds any predictor's ±10% accuracy. A `--refine` pass that lowered "
              "a label made its own re-measurement the label, so `retest_*` is optimistic where the database was "
              "refined in one sitting. `between_sessions`: kernels re-measured in two or more quiet sessions, each "
              "against the others' median (the stricter floor).", ""]
    for session, v in sorted(floor.get("sessions", {}).items(), key=lambda kv: -kv[1]["n"]):
        state = "quiet" if v["quiet"] else "contended, not used"
        lines.append(f"- session `{session}`: {v['n']} kernels, canary {v['canary_vs_reference']:.3f}x the reference "
                     f"({state}); median {_pct(v['median_signed_error_vs_label'])} vs the label, "
                     f"{_pct(v['within_10pct_of_label'])} within ±10%")
    for key in sorted(k for k in floor if k.startswith(("between_sessions", "retest"))):
        v = floor[key]
        if isinstance(v, dict):
            lines.append(f"- {key}: MAPE {_pct(v.get('mape'))}, ±10% {_pct(v.get('within_10pct'))}, "
                         f"n={v.get('n_kernels')}")
    if "within_window_spread" in floor:
        w = floor["within_window_spread"]
        lines.append(f"- within-window spread (MAD/median) of ok rows: median {_pct(w['median'])}, "
                     f"p90 {_pct(w['p90'])} (n={w['n']})")
    lines += ["", "## Verdicts", ""] + [f"- {v}" for v in report.get("verdicts", [])]
    if report.get("plot"):
        lines += ["", f"![predicted vs measured]({Path(report['plot']).name})"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, default=Path.home() / ".cache" / "hetpart" / "profiles.sqlite")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--profile-log", type=Path, action="append", default=[],
                        help="hetpart profile log with a 'profile summary:' line (runs not in the database)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    report = evaluate_db(args.db, device=args.device, out_dir=args.out,
                         progress=lambda split, done, total, _: logger.info("%s %d/%d", split, done, total))
    extra = logged_runs(args.profile_log)
    if extra:
        report["profile_runs_from_logs"] = extra
        report["profile_seconds_total"] = report.get("profile_seconds_total", 0.0) + sum(r["elapsed_s"] for r in extra)
    report["host"] = f"{platform.node()} ({platform.processor() or platform.machine()})"
    command = "python benchmarks/predictor_accuracy.py " + " ".join(sys.argv[1:] if argv is None else argv)
    report["command"] = command
    (args.out / "predictors.json").write_text(json.dumps(report, indent=1))
    (args.out / "predictors.md").write_text(render_markdown(report, command))
    logger.info("wrote %s", args.out / "predictors.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
