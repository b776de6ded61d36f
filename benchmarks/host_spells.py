"""Slow spells of this host: how often, how long, and whether the profiler's canary sees them.

Times the profiler's canary (a 256x256 matmul, L2-resident), a few probe kernels of the kinds the predictors
are fitted on and any whole zoo models named by ``--models`` (e.g. mobilenetv2_b1_s112), round robin, for
``--seconds``. Each timing is one ``time_evaluator`` call (3 repeats of >= 1 ms);
each kernel is reported relative to its own timings over the run:

* p10 / p90 relative to the median, and the share of timings > 1.2x the kernel's 10th percentile (its fast level;
  the median itself can sit in the slow mode when the host spends most of a run in it),
* the correlation of its log ratio with the canary's (whether the canary can flag the spell) and with the most
  affected probe's (whether the spells are one host state that moves kernels together, or in opposite directions),
* each kernel's median ratio to its fast level per 10-second block (how the kernels move together over time),
* persistence: the chance a slow timing (> 1.2x) of the most affected probe is followed by another slow one, and the
  share of slow timings per 10-second block (spells last seconds, not milliseconds).

    TVM_NUM_THREADS=2 python benchmarks/host_spells.py --seconds 150 [--models mobilenetv2_b1_s112 ...]

Writes benchmarks/results/host_spells.json and .md. Nothing else may run meanwhile: it measures the host.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TVM_NUM_THREADS", "2")

from predictors.profiling import sampling  # noqa: E402
from predictors.profiling.kernel_mapping import map_kernels  # noqa: E402
from predictors.profiling.model_timing import compile_model, import_variant  # noqa: E402
from predictors.profiling.profiler import KernelProfiler  # noqa: E402
from predictors.profiling.synthetic_modules import build_synthetic_module  # noqa: E402
from predictors.profiling.workloads import canary_workload  # noqa: E402
from predictors.synthetic_spec import SyntheticSpec  # noqa: E402

PROBES = {
    "conv1x1_112to128_56px": ("conv2d", dict(n=1, ci=112, co=128, hw=56, k=1, stride=1)),
    "conv1x1_128to128_56px": ("conv2d", dict(n=1, ci=128, co=128, hw=56, k=1, stride=1)),
    "conv3x3_64to64_56px": ("conv2d", dict(n=1, ci=64, co=64, hw=56, k=3, stride=1)),
    "matmul_512x1024x256": ("matmul", dict(m=512, k=1024, n=256)),
    "add_relu_4MB": ("add_relu", dict(n=1, c=64, hw=128)),
    "add_relu_16MB": ("add_relu", dict(n=1, c=256, hw=128)),
}
SLOW = 1.2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=150.0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "host_spells")
    parser.add_argument("--models", nargs="*", default=[], help="zoo variants (model_bB_sS) to time whole as well")
    args = parser.parse_args()
    profiler = KernelProfiler("cpu")
    kernels = {"canary_matmul_256": profiler.compile(canary_workload(256, profiler.tvm_target))}
    for name, (op, params) in PROBES.items():
        spec = SyntheticSpec.of(op, **params)
        workloads = map_kernels(build_synthetic_module(spec), spec.name, profiler).workloads
        main_kernel = [w for w in workloads if op.split("_")[0] in w.name] or list(workloads)
        kernels[name] = profiler.compile(main_kernel[0])
    variants = {v.name: v for v in sampling.zoo_variants()}
    for name in args.models:
        if name not in variants:
            parser.error(f"--models: unknown zoo variant {name!r}; known: {', '.join(sorted(variants))}")
        kernels[f"model_{name}"] = compile_model(import_variant(variants[name]), profiler)

    def time_us(kernel, number: int) -> float:
        return float(np.median(kernel.vm.time_evaluator("timed_main", kernel.dev, number=number,
                                                        repeat=3)().results)) * 1e6

    numbers = {n: max(1, int(np.ceil(1000.0 / time_us(k, 1)))) for n, k in kernels.items()}
    names, rows, start = list(kernels), [], time.monotonic()
    while time.monotonic() - start < args.seconds:
        rows.append([time.monotonic() - start] + [time_us(kernels[n], numbers[n]) for n in names])
    table = np.array(rows)
    ratio = table[:, 1:] / np.median(table[:, 1:], axis=0)
    to_fast = table[:, 1:] / np.percentile(table[:, 1:], 10, axis=0)
    logs = np.log(ratio)
    canary = logs[:, 0]
    report = {"seconds": args.seconds, "rounds": len(rows), "threads": profiler.num_threads, "kernels": {}}
    for j, name in enumerate(names):
        r = ratio[:, j]
        report["kernels"][name] = {
            "median_us": float(np.median(table[:, j + 1])), "p10": float(np.percentile(r, 10)),
            "p90": float(np.percentile(r, 90)), "share_slow": float(np.mean(to_fast[:, j] > SLOW)),
            "corr_with_canary": float(np.corrcoef(canary, logs[:, j])[0, 1]) if j else 1.0}
    worst = max(names[1:], key=lambda n: report["kernels"][n]["share_slow"])
    for j, name in enumerate(names):
        report["kernels"][name]["corr_with_most_affected"] = float(
            np.corrcoef(logs[:, names.index(worst)], logs[:, j])[0, 1])
    block_of = (table[:, 0] // 10).astype(int)
    report["ratio_to_fast_per_10s_block"] = {
        name: [float(np.median(to_fast[block_of == b, j])) for b in np.unique(block_of)]
        for j, name in enumerate(names)}
    slow = to_fast[:, names.index(worst)] > SLOW
    blocks = [float(np.mean(slow[block_of == b])) for b in np.unique(block_of)]
    report["persistence"] = {"kernel": worst, "p_slow": float(slow.mean()),
                             "p_slow_after_slow": float(slow[1:][slow[:-1]].mean()) if slow[:-1].any() else None,
                             "share_slow_per_10s_block": blocks}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    lines = [f"# Host slow spells ({len(rows)} rounds in {args.seconds:.0f} s, {profiler.num_threads} threads)", "",
             "Command: `TVM_NUM_THREADS=2 python benchmarks/host_spells.py --seconds "
             f"{args.seconds:.0f}" + (" --models " + " ".join(args.models) if args.models else "") + "`", "",
             "| kernel | median µs | p10 / median | p90 / median | share > 1.2x p10 | corr. with canary | "
             f"corr. with {worst} |", "|---|---|---|---|---|---|---|"]
    for name, k in report["kernels"].items():
        lines.append(f"| {name} | {k['median_us']:.1f} | {k['p10']:.2f} | {k['p90']:.2f} | {k['share_slow']:.2f} | "
                     f"{k['corr_with_canary']:+.2f} | {k['corr_with_most_affected']:+.2f} |")
    p = report["persistence"]
    lines += ["", f"Persistence ({p['kernel']}): P(slow) = {p['p_slow']:.2f}, P(slow | previous slow) = "
              f"{p['p_slow_after_slow']:.2f}; share slow per 10-s block: "
              + ", ".join(f"{b:.2f}" for b in p["share_slow_per_10s_block"]),
              "", "Median time / fast level per 10-s block:", "",
              "| kernel | " + " | ".join(f"{10 * b}s" for b in np.unique(block_of)) + " |",
              "|---|" + "---|" * len(np.unique(block_of))]
    lines += [f"| {name} | " + " | ".join(f"{v:.2f}" for v in series) + " |"
              for name, series in report["ratio_to_fast_per_10s_block"].items()]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
