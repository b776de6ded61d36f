"""How far off a CPU predictor is on kernels and models measured on another CPU.

    python benchmarks/predictor_transfer.py --db DB --predictor predictors/data/cpu_default.json [--out DIR]

Predicts every kernel and whole model stored in the profile database ``DB`` (measured on this host) with the
predictor JSON (fitted on whatever CPU its provenance names) and writes ``predictor_transfer.json`` + ``.md``: the
ratio measured / predicted per kernel and per model. This is why hetpart ships one predictor per CPU core type and
``hetpart compile`` warns when the host's CPU is not the one a predictor was measured on.
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
from predictors.device_predictor import DevicePredictor  # noqa: E402
from predictors.training import load_training_data  # noqa: E402

logger = logging.getLogger("benchmarks.predictor_transfer")


def transfer_report(db: Path, predictor_path: Path) -> dict:
    data = load_training_data(db)
    predictor = DevicePredictor.load(predictor_path)
    kernels_m, kernels_p, models = [], [], {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExtrapolationWarning)     # other CPUs' kernels: expected, counted below
        for name, rec in sorted(data.records.items()):
            kernels_m += list(rec.kernel_latencies_us)
            kernels_p += [float(v) for v in predictor.predict(rec.nodes)]
            models[name] = {"measured_us": rec.model_latency_us,
                            "predicted_us": float(np.sum(predictor.predict_in_context(rec.nodes)))}
    m, p = np.asarray(kernels_m), np.asarray(kernels_p)
    ratio = m / p
    big = m >= 100
    model_ratio = np.array([v["measured_us"] / v["predicted_us"] for v in models.values()])
    for v in models.values():
        v["measured_over_predicted"] = v["measured_us"] / v["predicted_us"]
    return {"profile_db": str(db), "measured_on": json.loads(data.target).get("mcpu"), "host": host_cpu_name(),
            "predictor": str(predictor_path), "fitted_on": predictor.target.get("mcpu"),
            "n_kernel_instances": int(m.size), "n_models": len(models),
            "kernel_measured_over_predicted": {"median": float(np.median(ratio)),
                                               "p10": float(np.percentile(ratio, 10)),
                                               "p90": float(np.percentile(ratio, 90))},
            "kernel_mape": float(np.mean(np.abs(p - m) / m)),
            "kernel_ge_100us_within_10pct": float(np.mean(np.abs(p[big] - m[big]) / m[big] <= 0.1)) if big.any()
            else None,
            "model_mape": float(np.mean(np.abs(model_ratio - 1) / model_ratio)),
            "model_measured_over_predicted": {"min": float(model_ratio.min()), "median": float(np.median(model_ratio)),
                                              "max": float(model_ratio.max())},
            "per_model": models}


def render_markdown(r: dict, command: str) -> str:
    k, mo = r["kernel_measured_over_predicted"], r["model_measured_over_predicted"]
    lines = [f"# CPU predictor on another CPU: fitted on {r['fitted_on']}, measured on {r['measured_on']}", "",
             f"Produced by `{command}`.", "",
             f"- kernels ({r['n_kernel_instances']} instances): measured / predicted median {k['median']:.2f}x "
             f"(p10 {k['p10']:.2f}x, p90 {k['p90']:.2f}x); MAPE {r['kernel_mape']:.1%}; kernels >= 100 µs within "
             f"±10%: {r['kernel_ge_100us_within_10pct']:.1%}",
             f"- whole models ({r['n_models']}): measured / predicted {mo['min']:.2f}x to {mo['max']:.2f}x "
             f"(median {mo['median']:.2f}x); MAPE {r['model_mape']:.1%}", "",
             "| model | measured µs | predicted µs | measured / predicted |", "|---|---|---|---|"]
    lines += [f"| {n} | {v['measured_us']:,.0f} | {v['predicted_us']:,.0f} | {v['measured_over_predicted']:.2f} |"
              for n, v in r["per_model"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, required=True, help="profile database measured on this host")
    parser.add_argument("--predictor", type=Path, required=True, help="predictor JSON fitted on another CPU")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    report = transfer_report(args.db, args.predictor)
    command = "python benchmarks/predictor_transfer.py " + " ".join(sys.argv[1:] if argv is None else argv)
    report["command"] = command
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "predictor_transfer.json").write_text(json.dumps(report, indent=1))
    (args.out / "predictor_transfer.md").write_text(render_markdown(report, command))
    logger.info("wrote %s", args.out / "predictor_transfer.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
