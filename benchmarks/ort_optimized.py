"""Zoo models as onnxruntime's graph optimizer saves them (``SessionOptions.optimized_model_filepath``, the form
packages ship to start faster): saved at ``ORT_ENABLE_EXTENDED``, compiled by hetpart for cpu+gpu (the GPU part
emulated on the CPU without CUDA) and run once against onnxruntime on the saved file; the op types onnxruntime put
in the file are listed. At ``ORT_ENABLE_ALL`` onnxruntime saves NCHWc layout ops for the machine it ran on, which
hetpart refuses (naming that fix); ``--level all`` records that.

    TVM_NUM_THREADS=2 python benchmarks/ort_optimized.py --out benchmarks/results/ort_optimized
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

os.environ.setdefault("TVM_NUM_THREADS", "2")
_HERE = Path(__file__).resolve().parent
if str(_HERE.parent) not in sys.path:      # the zoo's ``models`` package
    sys.path.insert(0, str(_HERE.parent))

DEFAULT_MODELS = ["resnet18", "mobilenetv2", "squeezenet1_1", "googlenet", "yolo_detector", "crnn_ocr",
                  "conv1d_audio", "bert_small", "gru_lm"]
LEVELS = {"extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}
REL_TOLERANCE = 1e-4


def optimized(source: Path, level: str, work: Path) -> tuple[Path, dict[str, int]]:
    """``source`` saved by onnxruntime at ``level``; the saved file and its op types (``domain.op`` outside the
    default domain) with their counts."""
    import onnx
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[level])
    saved = work / f"{source.stem}_{level}.onnx"
    options.optimized_model_filepath = str(saved)
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    counts = collections.Counter(f"{n.domain}.{n.op_type}" if n.domain else n.op_type
                                 for n in onnx.load(str(saved)).graph.node)
    return saved, dict(sorted(counts.items()))


def check(saved: Path) -> dict:
    """Compile ``saved`` for cpu+gpu and compare one inference with onnxruntime's on the same file (the inputs
    sampled as ``hetpart run`` samples them: token ids within their table)."""
    import hetpart
    from hetpart.driver.check import onnxruntime_reference, sample_inputs

    started = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled = hetpart.compile(str(saved), devices="cpu,gpu=p2200")
        compile_s = time.perf_counter() - started
        feeds = sample_inputs(compiled.build.manifest.inputs, compiled.op_graph)
        ours = compiled(**feeds)
    except Exception as exc:  # noqa: BLE001 (what a user would see, recorded per model)
        return {"status": "refused" if type(exc).__name__ == "UnsupportedOpError" else "failed",
                "error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:600]}"}
    reference = onnxruntime_reference(saved, feeds)
    difference = max(float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-12)) for a, b in zip(ours, reference))
    return {"status": "matches" if difference < REL_TOLERANCE else "differs", "relative_difference": difference,
            "compile_s": compile_s}


def markdown(result: dict) -> str:
    meta = result["meta"]
    lines = [f"# Zoo models saved by onnxruntime's optimizer ({LEVELS[meta['level']]})", "",
             f"Measured {meta['date']}; onnxruntime {meta['onnxruntime']}. Each zoo model saved by onnxruntime "
             f"(`SessionOptions.optimized_model_filepath`), compiled by hetpart for cpu+gpu (GPU emulated on the CPU) "
             f"and run once against onnxruntime on the saved file: largest difference over the largest output, "
             f"\"matches\" below {REL_TOLERANCE:g}.", "", "    " + meta["command"], "",
             "| model | onnxruntime's ops outside the ONNX domain | result | compile s |", "|---|---|---|---:|"]
    for name, row in result["rows"].items():
        fused = ", ".join(f"{op} x{c}" for op, c in row["ops"].items() if "." in op) or "none"
        outcome = row["check"]
        text = (f"{outcome['status']} ({outcome['relative_difference']:.0e})" if "relative_difference" in outcome
                else f"{outcome['status']}: {outcome['error']}")
        seconds = f"{outcome['compile_s']:.0f}" if "compile_s" in outcome else "–"
        lines.append(f"| {name} | {fused} | {text} | {seconds} |")
    statuses = collections.Counter(row["check"]["status"] for row in result["rows"].values())
    lines += ["", ", ".join(f"{count} {status}" for status, count in sorted(statuses.items())) + "."]
    return "\n".join(lines) + "\n"


def main() -> None:
    import onnxruntime as ort

    import models

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=DEFAULT_MODELS, choices=models.list_models())
    parser.add_argument("--level", choices=list(LEVELS), default="extended")
    parser.add_argument("--out", type=Path, default=_HERE / "results" / "ort_optimized")
    args = parser.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            saved, ops = optimized(Path(models.build_onnx(name)), args.level, Path(tmp))
            rows[name] = {"ops": ops, "check": check(saved)}
            print(f"{name}: {rows[name]['check']['status']}", flush=True)
    command = ("TVM_NUM_THREADS=2 python benchmarks/ort_optimized.py"
               + ("" if args.models == DEFAULT_MODELS else " --models " + " ".join(args.models))
               + ("" if args.level == "extended" else f" --level {args.level}")
               + f" --out benchmarks/results/{args.out.name}")
    result = {"meta": {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "onnxruntime": ort.__version__,
                       "level": args.level, "command": command}, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ort_optimized.json").write_text(json.dumps(result, indent=1))
    (args.out / "README.md").write_text(markdown(result))


if __name__ == "__main__":
    main()
