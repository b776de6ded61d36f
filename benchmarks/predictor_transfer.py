"""How far off a CPU predictor is on kernels and models measured on another CPU, and how much host scaling helps.

    python benchmarks/predictor_transfer.py --db DB --predictor predictors/data/cpu_znver5.json [--out DIR]

Predicts every kernel and whole model stored in the profile database ``DB`` (measured on this host) with the
predictor JSON (fitted on whatever CPU its provenance names) and writes ``predictor_transfer.json`` + ``.md``: the
ratio measured / predicted per kernel and per model, for the predictor as fitted; scaled by the calibration suite
timed on this host now (:mod:`predictors.host_calibration`, what ``hetpart compile`` does on a CPU without its own
predictor; only when this host's CPU is the database's); and scaled by the ratio of the profiler's canary kernels
(the database's over the predictor's: what ``hetpart compile`` did before it timed a calibration suite, kept for comparison). This is
why hetpart ships one predictor per CPU core type and warns when the host's CPU is not the one a predictor was
measured on.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hetpart.errors import ExtrapolationWarning  # noqa: E402
from predictors.device_predictor import DevicePredictor  # noqa: E402
from predictors.host_calibration import HostScaledPredictor, measure_suite, scale_by_suite  # noqa: E402
from predictors.profiling.calibration_sweep import time_fresh  # noqa: E402
from predictors.registry import host_cpu_name  # noqa: E402
from predictors.fitting.dataset import load_training_data  # noqa: E402

logger = logging.getLogger("benchmarks.predictor_transfer")


def transfer_metrics(data, predictor) -> dict:
    """Measured / predicted per kernel and per whole model of ``data`` (a profile DB's training data)."""
    kernels_m, kernels_p, models = [], [], {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExtrapolationWarning)     # other CPUs' kernels: expected, counted below
        for name, rec in sorted(data.records.items()):
            kernels_m += list(rec.kernel_latencies_us)
            kernels_p += [float(v) for v in predictor.predict(rec.nodes)]
            predicted = float(np.sum(predictor.predict_in_context(rec.nodes)))
            models[name] = {"measured_us": rec.model_latency_us, "predicted_us": predicted,
                            "measured_over_predicted": rec.model_latency_us / predicted}
    m, p = np.asarray(kernels_m), np.asarray(kernels_p)
    ratio, big = m / p, m >= 100
    model_ratio = np.array([v["measured_over_predicted"] for v in models.values()])
    return {"n_kernel_instances": int(m.size), "n_models": len(models),
            "kernel_measured_over_predicted": {"median": float(np.median(ratio)),
                                               "p10": float(np.percentile(ratio, 10)),
                                               "p90": float(np.percentile(ratio, 90))},
            "kernel_mape": float(np.mean(np.abs(p - m) / m)),
            "kernel_ge_100us_within_10pct": float(np.mean(np.abs(p[big] - m[big]) / m[big] <= 0.1)) if big.any()
            else None,
            "model_mape": float(np.mean(np.abs(model_ratio - 1) / model_ratio)),
            "model_worst_ape": float(np.max(np.abs(model_ratio - 1) / model_ratio)),
            "model_measured_over_predicted": {"min": float(model_ratio.min()), "median": float(np.median(model_ratio)),
                                              "max": float(model_ratio.max())},
            "per_model": models}


def transfer_report(db: Path, predictor_path: Path, suite: bool = True) -> dict:
    """The predictor as fitted, scaled by the calibration suite timed here (``suite`` and this host's CPU is the
    one that measured ``db``), and scaled by the canary ratio (``db``'s canary over the predictor's)."""
    data = load_training_data(db)
    predictor = DevicePredictor.load(predictor_path)
    measured_on = json.loads(data.target).get("mcpu", "")
    report = {"profile_db": str(db), "measured_on": measured_on, "host": host_cpu_name(),
              "predictor": str(predictor_path), "fitted_on": predictor.target.get("mcpu"),
              "unscaled": transfer_metrics(data, predictor)}
    predictor_canary = (predictor.fit_info.get("training") or {}).get("canary_reference_us")
    if predictor_canary:
        canary = HostScaledPredictor(predictor, data.reference_canary_us / predictor_canary, {
            "method": "canary", "host_cpu": measured_on, "host_threads": data.num_threads,
            "host_canary_us": data.reference_canary_us, "predictor_canary_us": predictor_canary})
        report["canary_scaling"], report["canary_scaled"] = canary.scaling, transfer_metrics(data, canary)
    if suite and report["host"] == measured_on:
        kernels = measure_suite(measured_on, data.num_threads, time_fresh=time_fresh)
        scaled = scale_by_suite(predictor, kernels, measured_on, data.num_threads)
        report["suite_scaling"], report["suite_scaled"] = scaled.scaling, transfer_metrics(data, scaled)
    elif suite:
        logger.warning("not timing the calibration suite: this host is a %s, the database was measured on a %s",
                       report["host"], measured_on)
    return report


def _summary(r: dict) -> list[str]:
    k, mo = r["kernel_measured_over_predicted"], r["model_measured_over_predicted"]
    return [f"  - kernels ({r['n_kernel_instances']} instances): measured / predicted median {k['median']:.2f}x "
            f"(p10 {k['p10']:.2f}x, p90 {k['p90']:.2f}x); MAPE {r['kernel_mape']:.1%}; kernels >= 100 µs within "
            f"±10%: {r['kernel_ge_100us_within_10pct']:.1%}",
            f"  - whole models ({r['n_models']}): measured / predicted {mo['min']:.2f}x to {mo['max']:.2f}x "
            f"(median {mo['median']:.2f}x); MAPE {r['model_mape']:.1%}, worst {r['model_worst_ape']:.1%}"]


def render_markdown(r: dict, command: str) -> str:
    lines = [f"# CPU predictor on another CPU: fitted on {r['fitted_on']}, measured on {r['measured_on']}", "",
             f"Produced by `{command}`.", "", "- as fitted:", *_summary(r["unscaled"])]
    variants = [("unscaled", "as fitted")]
    if "suite_scaled" in r:
        s = r["suite_scaling"]
        lines += [f"- scaled x{s['speed_ratio']:.2f} by the calibration suite timed on this {s['host_cpu']} host "
                  f"({s['n_kernels']} kernels, {s['host_threads']} threads; measured / predicted x"
                  f"{s['kernel_ratio_min']:.2f} to x{s['kernel_ratio_max']:.2f} per kernel): what `hetpart compile` "
                  "does on a CPU without its own predictor:", *_summary(r["suite_scaled"])]
        variants.append(("suite_scaled", "suite-scaled"))
    if "canary_scaled" in r:
        c = r["canary_scaling"]
        lines += [f"- scaled x{c['speed_ratio']:.2f} by the canary ratio (256³ float32 matmul, {c['host_threads']} "
                  f"threads: {c['predictor_canary_us']:.1f} µs on {r['fitted_on']}, {c['host_canary_us']:.1f} µs on "
                  f"{r['measured_on']}; what `hetpart compile` did before it timed a calibration suite):", *_summary(r["canary_scaled"])]
        variants.append(("canary_scaled", "canary-scaled"))
    lines += ["", "| model | measured µs | " + " | ".join(f"{label}: predicted µs | {label}: m / p"
                                                      for _, label in variants) + " |",
              "|---|---|" + "---|---|" * len(variants)]
    for name, v in r["unscaled"]["per_model"].items():
        cells = [f"{r[key]['per_model'][name]['predicted_us']:,.0f} | "
                 f"{r[key]['per_model'][name]['measured_over_predicted']:.2f}" for key, _ in variants]
        lines.append(f"| {name} | {v['measured_us']:,.0f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, required=True, help="profile database measured on this host")
    parser.add_argument("--predictor", type=Path, required=True, help="predictor JSON fitted on another CPU")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--name", default="predictor_transfer", help="output file stem (default: %(default)s)")
    parser.add_argument("--no-suite", action="store_true", help="do not time the calibration suite on this host")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    report = transfer_report(args.db, args.predictor, suite=not args.no_suite)
    command = "python benchmarks/predictor_transfer.py " + " ".join(sys.argv[1:] if argv is None else argv)
    report["command"] = command
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(report, indent=1))
    (args.out / f"{args.name}.md").write_text(render_markdown(report, command))
    logger.info("wrote %s", args.out / f"{args.name}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
