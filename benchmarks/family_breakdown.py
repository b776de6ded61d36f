"""Where a held-out family's whole-model prediction misses: fit the CPU predictor on a profile database without one
model family (as the leave-one-family-out split of ``benchmarks/predictor_accuracy.py`` does: zoo kernels only, the
in-model terms fitted on the remaining models), then compare each of the family's kernels with its measured label.

    python benchmarks/family_breakdown.py --db DB --family yolox [--top 15]

Prints, per model of the family, its measured and predicted latency, the predicted / measured ratio per kernel kind,
and the kernels whose predictions miss by the most microseconds (markdown on stdout).
"""
from __future__ import annotations

import argparse
import collections
import json
import warnings

import numpy as np


def breakdown(db: str, family: str, top: int) -> list[str]:
    from predictors.context import fit_context_terms
    from predictors.features import kernel_kind
    from predictors.fitting import evaluate as ev
    from predictors.fitting.dataset import load_training_data
    from predictors.fitting.training import measured_core_cache
    from predictors.profiling.cache_probe import cache_sizes_for_db

    data = load_training_data(db, "cpu")
    target = json.loads(data.target)
    core = measured_core_cache(data)
    sizes = cache_sizes_for_db(db, target.get("mcpu"))
    records = data.records
    held = [n for n, r in records.items() if r.family == family]
    if not held:
        raise SystemExit(f"no model of family {family!r}; families: {sorted({r.family for r in records.values()})}")
    train = [n for n in records if n not in held]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # extrapolation is expected for a held-out family
        predictor = ev.default_methods(target, core)["polynomial"]().fit(
            [node for n in train for node in records[n].nodes],
            [t for n in train for t in records[n].kernel_latencies_us])
        context = fit_context_terms(predictor, [(records[n].nodes, records[n].model_latency_us) for n in train],
                                    None if sizes is None else sizes.bound_bytes, core)
        predictions = {n: np.asarray(predictor.predict(records[n].nodes), dtype=float) for n in held}
    lines = [f"# Family `{family}` held out ({len(train)} training models)", ""]
    for name in held:
        record, predicted = records[name], predictions[name]
        measured = np.asarray(record.kernel_latencies_us, dtype=float)
        extra = float(context.extra_us(record.nodes).sum())
        whole = predicted.sum() + extra
        lines += [f"## {name}", "",
                  f"whole model: measured {record.model_latency_us:.0f} µs, predicted {whole:.0f} µs "
                  f"({whole / record.model_latency_us - 1:+.1%}); kernels measured {measured.sum():.0f} µs, "
                  f"predicted {predicted.sum():.0f} µs, in-model terms {extra:.0f} µs", "",
                  "| kind | kernels | measured µs | predicted µs | predicted / measured |",
                  "|---|---:|---:|---:|---:|"]
        per_kind: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
        for node, m, p in zip(record.nodes, measured, predicted):
            row = per_kind[kernel_kind(node)]
            row[0] += 1
            row[1] += m
            row[2] += p
        for kind, (count, m, p) in sorted(per_kind.items(), key=lambda kv: -kv[1][1]):
            lines.append(f"| {kind} | {count} | {m:.0f} | {p:.0f} | {p / m:.2f} |")
        lines += ["", "| kernel | input shapes | measured µs | predicted µs | ratio |", "|---|---|---:|---:|---:|"]
        for i in np.argsort(-np.abs(predicted - measured))[:top]:
            node = record.nodes[i]
            shapes = " ".join("x".join(map(str, s)) for s in node.input_shapes[:2])
            lines.append(f"| {node.op} | {shapes} | {measured[i]:.0f} | {predicted[i]:.0f} | "
                         f"{predicted[i] / measured[i]:.2f} |")
        lines.append("")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", required=True, help="a profile database (hetpart profile)")
    parser.add_argument("--family", required=True, help="the model family to hold out (e.g. yolox)")
    parser.add_argument("--top", type=int, default=15, help="kernels listed by absolute miss")
    args = parser.parse_args()
    print("\n".join(breakdown(args.db, args.family, args.top)))


if __name__ == "__main__":
    main()
