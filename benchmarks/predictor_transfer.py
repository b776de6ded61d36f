"""How far off a CPU predictor is on kernels and models measured on another CPU.

    python benchmarks/predictor_transfer.py --db DB --predictor predictors/data/cpu_default.json [--out DIR]

Predicts every kernel and whole model stored in the profile database ``DB`` (measured on this host) with the
predictor JSON (fitted on whatever CPU its provenance names) and writes ``predictor_transfer.json`` + ``.md``: the
ratio measured / predicted per kernel and per model, for the predictor as fitted and scaled by the canary ratio
(:mod:`predictors.canary_scaling`, what ``hetpart compile`` does on a CPU without its own predictor). This is why
hetpart ships one predictor per CPU core type and warns when the host's CPU is not the one a predictor was measured
on.
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

from hetpart.compiler import host_cpu_name  # noqa: E402
from hetpart.errors import ExtrapolationWarning  # noqa: E402
from predictors.canary_scaling import CanaryScaledPredictor  # noqa: E402
from predictors.device_predictor import DevicePredictor  # noqa: E402
from predictors.training import load_training_data  # noqa: E402

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


def transfer_report(db: Path, predictor_path: Path) -> dict:
    """The predictor as fitted, and scaled by the canary ratio (the canary of ``db``'s rows, measured on the host
    that measured the kernels, over the predictor's own): what ``hetpart compile`` does on a foreign CPU."""
    data = load_training_data(db)
    predictor = DevicePredictor.load(predictor_path)
    scaled = CanaryScaledPredictor(predictor, data.reference_canary_us, json.loads(data.target).get("mcpu", ""),
                                   data.num_threads)
    return {"profile_db": str(db), "measured_on": json.loads(data.target).get("mcpu"), "host": host_cpu_name(),
            "predictor": str(predictor_path), "fitted_on": predictor.target.get("mcpu"),
            "canary_scaling": scaled.scaling,
            "unscaled": transfer_metrics(data, predictor), "canary_scaled": transfer_metrics(data, scaled)}


def _summary(r: dict) -> list[str]:
    k, mo = r["kernel_measured_over_predicted"], r["model_measured_over_predicted"]
    return [f"  - kernels ({r['n_kernel_instances']} instances): measured / predicted median {k['median']:.2f}x "
            f"(p10 {k['p10']:.2f}x, p90 {k['p90']:.2f}x); MAPE {r['kernel_mape']:.1%}; kernels >= 100 µs within "
            f"±10%: {r['kernel_ge_100us_within_10pct']:.1%}",
            f"  - whole models ({r['n_models']}): measured / predicted {mo['min']:.2f}x to {mo['max']:.2f}x "
            f"(median {mo['median']:.2f}x); MAPE {r['model_mape']:.1%}, worst {r['model_worst_ape']:.1%}"]


def render_markdown(r: dict, command: str) -> str:
    c = r["canary_scaling"]
    lines = [f"# CPU predictor on another CPU: fitted on {r['fitted_on']}, measured on {r['measured_on']}", "",
             f"Produced by `{command}`.", "",
             f"Canary (256³ float32 matmul, {c['host_threads']} threads): {c['predictor_canary_us']:.1f} µs on "
             f"{r['fitted_on']}, {c['host_canary_us']:.1f} µs on {r['measured_on']} -> speed ratio "
             f"{c['speed_ratio']:.2f}.", "",
             "- as fitted:", *_summary(r["unscaled"]),
             f"- scaled by the canary ratio (what `hetpart compile` does on a CPU without its own predictor):",
             *_summary(r["canary_scaled"]), "",
             "| model | measured µs | predicted µs | measured / predicted | scaled: predicted µs | scaled: m / p |",
             "|---|---|---|---|---|---|"]
    for name, v in r["unscaled"]["per_model"].items():
        s = r["canary_scaled"]["per_model"][name]
        lines.append(f"| {name} | {v['measured_us']:,.0f} | {v['predicted_us']:,.0f} | "
                     f"{v['measured_over_predicted']:.2f} | {s['predicted_us']:,.0f} | {s['measured_over_predicted']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, required=True, help="profile database measured on this host")
    parser.add_argument("--predictor", type=Path, required=True, help="predictor JSON fitted on another CPU")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--name", default="predictor_transfer", help="output file stem (default: %(default)s)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    report = transfer_report(args.db, args.predictor)
    command = "python benchmarks/predictor_transfer.py " + " ".join(sys.argv[1:] if argv is None else argv)
    report["command"] = command
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(report, indent=1))
    (args.out / f"{args.name}.md").write_text(render_markdown(report, command))
    logger.info("wrote %s", args.out / f"{args.name}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
