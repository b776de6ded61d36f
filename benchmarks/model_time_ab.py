"""Whole-model CPU time of this source tree against another, in alternating processes.

For a change that is not a schedule rule (``cpu_kernels.py --compare-without`` covers those), e.g. how the ONNX
frontend writes a model: each round runs one process per tree and model, in alternating order, and each process
imports hetpart from its tree, compiles the model for the CPU with that tree's pipeline (all kernels on the CPU,
batch 1, random weights), checks it against onnxruntime and times ``--calls`` calls. The figure per tree is the
median over rounds of each process's median call; the ratio compares trees within each round.

    TVM_NUM_THREADS=2 python benchmarks/model_time_ab.py --models lstm_speaker lstm_lm --against ../hetpart-before \\
        --rounds 3 --out benchmarks/results/cpu_kernels_rnn_gates

``../hetpart-before``: a checkout of the earlier tree, e.g. ``git worktree add ../hetpart-before REV``.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
THIS_TREE = HERE.parent
log = logging.getLogger("model_time_ab")


def time_one_model(name: str, calls: int) -> dict:
    """In a child process whose sys.path starts with the tree under test: compile and time ``name``."""
    import numpy as np
    import onnxruntime as ort
    import tvm
    from tvm import relax

    import models
    from tvm_passes.frontend import import_model
    from tvm_passes.schedules import cpu_pipeline, default_cpu_target

    built = Path(models.build_onnx(name))
    imported = import_model(built)
    onnx_path = str(imported.onnx_path or built)
    session = ort.InferenceSession(onnx_path)
    rng = np.random.default_rng(0)
    feeds = {}
    for info in session.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in info.shape]
        feeds[info.name] = (rng.integers(0, 100, shape).astype(np.int64) if "int64" in info.type
                            else rng.random(shape).astype(np.float32))
    target = default_cpu_target()
    began = time.perf_counter()
    executable = tvm.compile(imported.mod, target=target, relax_pipeline=cpu_pipeline(target))
    compile_s = time.perf_counter() - began
    vm = relax.VirtualMachine(executable, tvm.cpu())
    args = [tvm.runtime.tensor(feeds[p.name]) for p in imported.mod["main"].params]
    out = vm["main"](*args)
    first = out[0] if isinstance(out, (list, tuple)) or type(out).__name__ == "Array" else out
    reference = session.run(None, feeds)[0]
    max_abs_diff = float(np.max(np.abs(first.numpy().astype(np.float64) - reference)))
    for _ in range(3):
        vm["main"](*args)
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        vm["main"](*args)
        samples.append(time.perf_counter() - start)
    return {"model": name, "mcpu": str(target.attrs["mcpu"]),
            "median_ms": statistics.median(samples) * 1e3, "min_ms": min(samples) * 1e3,
            "compile_s": compile_s, "max_abs_diff_vs_onnxruntime": max_abs_diff}


def _run_child(tree: Path, name: str, calls: int) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(tree / "benchmarks")]))
    command = [sys.executable, str(Path(__file__).resolve()), "--one-model", name, "--tree", str(tree),
               "--calls", str(calls)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{name} in {tree} failed (exit {done.returncode}): {tail}")
    return json.loads(lines[-1])


def summarize(samples: dict[str, dict[str, list[dict]]]) -> list[dict]:
    """One row per model from its per-round child records of both trees: medians per tree, and this tree's time
    over the other's within each round (round k of one tree against round k of the other)."""
    rows = []
    for name, by_tree in samples.items():
        this, other = by_tree["this"], by_tree["against"]
        ratios = [a["median_ms"] / b["median_ms"] for a, b in zip(this, other)]
        rows.append({"model": name, "this_ms": statistics.median(r["median_ms"] for r in this),
                     "against_ms": statistics.median(r["median_ms"] for r in other), "ratios": ratios,
                     "ratio_median": statistics.median(ratios),
                     "max_abs_diff": max(r["max_abs_diff_vs_onnxruntime"] for r in this),
                     "this": this, "against": other})
    return rows


def _markdown(result: dict) -> str:
    meta = result["meta"]
    lines = [f"# Whole-model CPU time: this tree against `{meta['against_label']}`", "",
             f"Measured {meta['measured_at']} on {meta['cpu']} (TVM_NUM_THREADS={meta['tvm_threads']}); "
             f"{meta['rounds']} rounds, one process per tree and model per round in alternating order, "
             f"{meta['calls']} calls per process. Times: median over rounds of each process's median call.", "",
             f"    {meta['command']}", "",
             "| model | this tree ms | other tree ms | this / other (per round) | max abs diff vs onnxruntime |",
             "|---|---:|---:|---|---:|"]
    for row in result["rows"]:
        ratios = ", ".join(f"{r:.3f}" for r in row["ratios"])
        lines.append(f"| {row['model']} | {row['this_ms']:.2f} | {row['against_ms']:.2f} | {ratios} "
                     f"(median {row['ratio_median']:.3f}) | {row['max_abs_diff']:.1e} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["lstm_speaker", "lstm_lm", "crnn_ocr"])
    parser.add_argument("--against", help="the other source tree (a checkout)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--out", default=str(HERE / "results" / "model_time_ab"))
    parser.add_argument("--one-model", help=argparse.SUPPRESS)
    parser.add_argument("--tree", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one_model:
        print(json.dumps(time_one_model(args.one_model, args.calls)), flush=True)
        os._exit(0)   # skip interpreter teardown: freeing TVM executables at exit has crashed on this host
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if not args.against or not (Path(args.against) / "tvm_passes").is_dir():
        parser.error("--against must name another checkout of hetpart (a directory holding tvm_passes/)")
    trees = {"this": THIS_TREE, "against": Path(args.against).resolve()}
    samples: dict[str, dict[str, list[dict]]] = {m: {"this": [], "against": []} for m in args.models}
    for round_index in range(args.rounds):
        for name in args.models:
            order = ["this", "against"] if round_index % 2 == 0 else ["against", "this"]
            for which in order:
                record = _run_child(trees[which], name, args.calls)
                samples[name][which].append(record)
                log.info("round %d %s %s: %.2f ms", round_index + 1, name, which, record["median_ms"])
    rows = summarize(samples)
    against_label = args.against if not Path(args.against).is_absolute() else "OTHER_TREE"
    out_label = os.path.relpath(args.out, THIS_TREE) if Path(args.out).is_absolute() else args.out
    command = (f"TVM_NUM_THREADS={os.environ.get('TVM_NUM_THREADS', '?')} python benchmarks/model_time_ab.py "
               f"--models {' '.join(args.models)} --against {against_label} --rounds {args.rounds} "
               f"--calls {args.calls} --out {out_label}")
    result = {"meta": {"measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "cpu": f"{platform.machine()}, LLVM mcpu {rows[0]['this'][0]['mcpu']}",
                       "tvm_threads": os.environ.get("TVM_NUM_THREADS", "unset"), "rounds": args.rounds,
                       "calls": args.calls, "against_label": against_label, "command": command},
              "rows": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(_markdown(result))
    log.info("wrote %s.{json,md}", out)


if __name__ == "__main__":
    main()
