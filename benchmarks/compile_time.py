"""Compile time per stage: ``hetpart compile MODEL --devices cpu,gpu=p2200 -o DIR`` as a user runs it, in a fresh
process per model (so ``import tvm`` and the zoo's ONNX cache count as a user sees them), timed by the compiler's own
stage clock (``CompiledModel.seconds``: import, analyze, costs, plan, build, save) and by the wall clock of the process.

The models that matter are the long unrolled recurrences (a conv + 2-layer GRU over 600 frames: 18,104 ops; a 3-layer
LSTM of hidden 256 over 160 frames: 6,282 ops); a few CNNs show the floor. The zoo's ONNX export of each model is
cached before timing. Run on a quiet host; ``--rounds`` repeats each model and keeps every round.

    python benchmarks/compile_time.py                      # the default models, 1 round
    python benchmarks/compile_time.py --models gru_audio:600 --rounds 3 --against ../hetpart-before
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_MODELS = ("gru_audio:600", "lstm_speaker:160", "crnn_ocr", "googlenet", "resnet50")
GOAL_SECONDS = 60.0
STAGES = ("import", "analyze", "costs", "plan", "build", "save")
_CHILD = """
import json, sys, time
import hetpart
name, size, out = sys.argv[1], (int(sys.argv[2]) if sys.argv[2] else None), sys.argv[3]
compiled = hetpart.compile(name, size=size, devices="cpu,gpu=p2200", output_dir=out, overwrite=True)
print("HETPART_COMPILE_TIME " + json.dumps({"seconds": compiled.seconds, "ops": compiled.op_graph.num_ops,
                                            "kernels": compiled.graph.num_ops}))
"""


REPO_ROOT = Path(__file__).resolve().parents[1]


def compile_once(model: str, size: int | None, out_dir: Path, source_tree: Path = REPO_ROOT) -> dict:
    """One ``hetpart.compile`` in a fresh interpreter importing hetpart from ``source_tree`` (run from
    ``out_dir``'s parent, so no other checkout shadows it): stage seconds, op and kernel counts, wall seconds."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(source_tree), os.environ.get("PYTHONPATH", "")]))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _CHILD, model, "" if size is None else str(size), str(out_dir)],
                          capture_output=True, text=True, env=env, cwd=out_dir.parent)
    wall_s = time.perf_counter() - started
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("HETPART_COMPILE_TIME ")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"compiling {model} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    record = json.loads(line.removeprefix("HETPART_COMPILE_TIME "))
    return {**record, "wall_s": round(wall_s, 2)}


def warm_cache(model: str, size: int | None) -> None:
    """Export the zoo model's ONNX once (cached), so that no round times the export."""
    from models.export import build_onnx

    build_onnx(model, size=size)


def _median_row(rows: list[dict]) -> dict:
    return {"seconds": {s: statistics.median(r["seconds"].get(s, 0.0) for r in rows) for s in STAGES},
            "wall_s": statistics.median(r["wall_s"] for r in rows), "walls": [r["wall_s"] for r in rows],
            "ops": rows[0]["ops"], "kernels": rows[0]["kernels"]}


def render(records: list[dict], meta: dict) -> str:
    lines = [f"# Compile time ({meta['cpu']}, {meta['threads']} TVM threads, devices cpu,gpu=p2200)", "",
             f"Command: `{meta['command']}` ({meta['date']}). Stage seconds from the compiler's own clock, medians "
             f"over {meta['rounds']} round(s); *wall* is the whole process (Python start-up and `import tvm` "
             f"included), each round listed. Goal for the unrolled RNNs (over 5,000 ops): wall <= "
             f"{GOAL_SECONDS:.0f} s. This host's speed varies by up to a third between minutes (the profiler's "
             "canary, nothing else running), so compare trees only within one run (`--against`).", "",
             "| model | tree | ops | kernels | " + " | ".join(STAGES) + " | wall s (median) | rounds | goal |",
             "|---|---|---:|---:|" + "---:|" * len(STAGES) + "---:|---|---|"]
    for model in dict.fromkeys(r["model"] for r in records):
        for tree in dict.fromkeys(r["tree"] for r in records):
            rows = [r for r in records if r["model"] == model and r["tree"] == tree]
            if not rows:
                continue
            row = _median_row(rows)
            stages = " | ".join(f"{row['seconds'][s]:.1f}" for s in STAGES)
            goal = ("met" if row["wall_s"] <= GOAL_SECONDS else "missed") if row["ops"] > 5000 else ""
            walls = ", ".join(f"{w:.1f}" for w in row["walls"])
            lines.append(f"| {model} | {tree} | {row['ops']} | {row['kernels']} | {stages} | {row['wall_s']:.1f} | "
                         f"{walls} | {goal} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        help="comma-separated zoo models, each optionally NAME:SIZE")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--against", type=Path, default=None,
                        help="another hetpart checkout (e.g. `git worktree add ../before REV`), timed in the same "
                             "rounds, interleaved with this one")
    parser.add_argument("--out", default="benchmarks/results/compile_time",
                        help="directory for README.md (the table) and compile_time.json")
    args = parser.parse_args(argv)
    from predictors.registry import host_cpu_name

    specs = [(m.partition(":")[0], int(m.partition(":")[2]) if m.partition(":")[2] else None)
             for m in args.models.split(",") if m]
    trees = {"this": REPO_ROOT}
    if args.against is not None:
        if not (args.against / "hetpart" / "__init__.py").is_file():
            raise SystemExit(f"--against must be a hetpart checkout (with hetpart/__init__.py); found {args.against}")
        trees["against"] = args.against.resolve()
    records = []
    with tempfile.TemporaryDirectory(prefix="hetpart-compile-time-") as tmp:
        for model, size in specs:
            warm_cache(model, size)
            for k in range(args.rounds):
                order = list(trees.items()) if k % 2 == 0 else list(reversed(trees.items()))
                for tree, source in order:
                    record = compile_once(model, size, Path(tmp) / f"{model}_{tree}_{k}", source)
                    records.append({"model": model if size is None else f"{model}:{size}", "tree": tree,
                                    "round": k, **record})
                    print(f"{records[-1]['model']} [{tree}] round {k}: wall {record['wall_s']:.1f} s "
                          f"{record['seconds']}", flush=True)
    meta = {"cpu": host_cpu_name(), "threads": os.environ.get("TVM_NUM_THREADS", "every core"),
            "machine": platform.machine(), "rounds": args.rounds,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": "python benchmarks/compile_time.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "trees": {tree: ("this checkout" if tree == "this" else "the --against checkout") for tree in trees}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    md_path, json_path = out / "README.md", out / "compile_time.json"
    json_path.write_text(json.dumps({"meta": meta, "records": records}, indent=1) + "\n")
    md_path.write_text(render(records, meta))
    print(f"wrote {md_path} and {json_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
