"""Models outside the zoo, as a new user brings them: exported from torch at several opsets, compiled for cpu+gpu,
checked against onnxruntime, and (at one opset) timed on the CPU against onnxruntime.

The architectures (``benchmarks/outside_models/architectures.py``, random weights) imitate the kinds third-party
models come in -- vision transformers, U-Nets, EfficientNet/MobileNetV3 blocks, TCNs, conformers, taggers, speaker
encoders, vocoder-style decoders, detectors' FPNs, small GPTs -- and none of them is in the zoo or in a predictor's
training set. Per model and opset: ``torch.onnx.export(dynamo=False)`` (an export torch refuses is recorded as such),
``hetpart.compile(path, devices="cpu,gpu=p2200")`` (the GPU part emulated on the CPU without CUDA), one inference
with the example inputs against onnxruntime on the exported file (largest absolute difference over the largest
absolute reference value). At ``--time-opset``: hetpart's CPU pipeline (all kernels on the CPU) against onnxruntime
with ``cpu_kernels.py``'s block protocol.

    TVM_NUM_THREADS=2 python benchmarks/model_sweep.py --out benchmarks/results/model_sweep
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

os.environ.setdefault("TVM_NUM_THREADS", "2")
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))
sys.path.insert(1, str(_HERE))
sys.path.insert(2, str(_HERE / "outside_models"))

log = logging.getLogger("model_sweep")
REL_TOLERANCE = 1e-4        # a model "matches" onnxruntime when its relative difference is below this


def export(name: str, opset: int, path: Path) -> tuple[list, str | None]:
    """Export model ``name`` at ``opset``; (example inputs as numpy arrays, None) or ([], why torch refused)."""
    import torch

    from architectures import MODELS

    constructor, example_inputs = MODELS[name]
    torch.manual_seed(0)
    model = constructor().eval()
    inputs = example_inputs()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, tuple(inputs), str(path), opset_version=opset, dynamo=False,
                              input_names=[f"in{i}" for i in range(len(inputs))])
    except Exception as exc:  # noqa: BLE001 (torch's exporter: recorded, not ours to fix)
        return [], f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160]}"
    return [x.numpy() for x in inputs], None


def relative_difference(ours: list[np.ndarray], reference: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-12)) for a, b in zip(ours, reference))


def check(path: Path, inputs: list[np.ndarray]) -> dict:
    """Compile for cpu+gpu, run once, compare with onnxruntime."""
    import onnxruntime as ort

    import hetpart

    feeds = {f"in{i}": x for i, x in enumerate(inputs)}
    started = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled = hetpart.compile(str(path), devices="cpu,gpu=p2200")
        ours = compiled(**feeds)
    except Exception as exc:  # noqa: BLE001 (what a user would see, recorded per model)
        return {"status": "failed", "error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:240]}",
                "compile_s": time.perf_counter() - started}
    try:
        reference = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    except Exception as exc:  # noqa: BLE001 (an export onnxruntime rejects, e.g. int64 TopK at opset 9: no reference)
        return {"status": "no reference", "error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:240]}",
                "compile_s": time.perf_counter() - started}
    difference = relative_difference(ours, reference)
    return {"status": "matches" if difference < REL_TOLERANCE else "differs", "relative_difference": difference,
            "compile_s": time.perf_counter() - started, "plan": compiled.plan.method,
            "import_notes": list(compiled.source.get("import_notes", []))}


def time_against_onnxruntime(path: Path, inputs: list[np.ndarray], rounds: int, calls: int) -> dict:
    """hetpart's CPU pipeline against onnxruntime, blocks as in cpu_kernels.py."""
    import tvm
    from tvm import relax

    import cpu_kernels as ck
    from tvm_passes.frontend import import_model
    from tvm_passes.schedules import cpu_pipeline, default_cpu_target

    feeds = {f"in{i}": x for i, x in enumerate(inputs)}
    imported = import_model(path)
    target = default_cpu_target()
    vm = relax.VirtualMachine(tvm.compile(imported.mod, target=target, relax_pipeline=cpu_pipeline(target)),
                              tvm.cpu())
    args = [tvm.runtime.tensor(feeds[param.name]) for param in imported.mod["main"].params]
    sessions = {"onnxruntime": ck._ort_session(path), "onnxruntime_spinning": ck._ort_session(path, spinning=True)}
    runners = {key: (lambda s=s: s.run(None, feeds)) for key, s in sessions.items()}
    runners["rules"] = lambda: vm["main"](*args)
    row: dict = {}
    ck._record_times(row, ck._block_times(runners, rounds, calls))
    return {"rules_ms": row["rules_ms"], "onnxruntime_ms": row["onnxruntime_ms"],
            "rules_ratio_to_ort": row["rules_ratio_to_ort"], "samples_ms": row["samples_ms"]}


def markdown(result: dict) -> str:
    import cpu_kernels as ck

    meta, rows = result["meta"], result["rows"]
    opsets = meta["opsets"]
    lines = ["# Models outside the zoo: export, compile for cpu+gpu, numerics and CPU time against onnxruntime", "",
             f"Measured {meta['date']} on {meta['cpu']}, {meta['threads']} threads for TVM and onnxruntime. "
             f"Numerics: the compiled cpu+gpu plan (GPU part emulated on the CPU) on the example inputs, the largest "
             f"absolute difference over the largest absolute onnxruntime value; \"matches\" below {REL_TOLERANCE:g}. "
             f"Time (opset {meta['time_opset']}): hetpart's CPU pipeline, all kernels on the CPU. "
             + ck._block_protocol(meta, "timed calls"), "", "    " + meta["command"], "",
             "| model | " + " | ".join(f"opset {o}" for o in opsets) + " | rules ms | ORT ms | rules / ORT |",
             "|---|" + "---|" * len(opsets) + "---|---|---|"]
    for name in meta["models"]:
        cells = []
        for opset in opsets:
            entry = rows[name].get(str(opset), {})
            if "export_error" in entry:
                cells.append("torch cannot export")
            elif entry.get("status") == "failed":
                cells.append(f"**failed**: {entry['error'][:80]}")
            elif entry.get("status") == "no reference":
                cells.append("onnxruntime rejects the export")
            else:
                cells.append(f"{entry['status']} ({entry['relative_difference']:.0e})")
        timed = rows[name].get("time", {})
        timing = (f"{timed['rules_ms']:.2f} | {timed['onnxruntime_ms']:.2f} | {timed['rules_ratio_to_ort']:.2f}"
                  if timed else "– | – | –")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {timing} |")
    ratios = sorted(rows[n]["time"]["rules_ratio_to_ort"] for n in meta["models"] if rows[n].get("time"))
    checked = [e for n in meta["models"] for o, e in rows[n].items()
               if o != "time" and e.get("status") not in (None, "no reference")]
    lines += ["", f"{sum(e['status'] == 'matches' for e in checked)} of {len(checked)} exported models compile and "
                  f"match onnxruntime ({sum(e['status'] == 'failed' for e in checked)} fail, "
                  f"{sum(e['status'] == 'differs' for e in checked)} differ)."]
    if ratios:
        lines.append(f"hetpart rules / onnxruntime over {len(ratios)} models: median {ratios[len(ratios) // 2]:.2f}x, "
                     f"worst {ratios[-1]:.2f}x.")
    return "\n".join(lines) + "\n"


def main() -> None:
    from architectures import MODELS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--opsets", nargs="*", type=int, default=[9, 11, 13, 17])
    parser.add_argument("--time-opset", type=int, default=17, help="the opset timed against onnxruntime (0: none)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls-per-block", type=int, default=5)
    parser.add_argument("--out", type=Path, default=_HERE / "results" / "model_sweep")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rows: dict = {name: {} for name in args.models}
    with tempfile.TemporaryDirectory() as tmp:
        for opset in args.opsets:
            for name in args.models:
                path = Path(tmp) / f"{name}_opset{opset}.onnx"
                inputs, refused = export(name, opset, path)
                if refused:
                    rows[name][str(opset)] = {"export_error": refused}
                    log.info("%s opset %d: torch cannot export (%s)", name, opset, refused)
                    continue
                rows[name][str(opset)] = check(path, inputs)
                log.info("%s opset %d: %s", name, opset, rows[name][str(opset)]["status"])
                if opset == args.time_opset and rows[name][str(opset)]["status"] in ("matches", "differs"):
                    rows[name]["time"] = time_against_onnxruntime(path, inputs, args.rounds, args.calls_per_block)
                    log.info("%s: rules / onnxruntime %.2f", name, rows[name]["time"]["rules_ratio_to_ort"])
    import cpu_kernels as ck

    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "cpu": ck.cpu_name() or platform.processor() or "an unnamed CPU",
            "threads": os.environ["TVM_NUM_THREADS"], "models": args.models, "opsets": args.opsets,
            "time_opset": args.time_opset, "rounds": args.rounds, "calls_per_block": args.calls_per_block,
            "command": "TVM_NUM_THREADS=2 python benchmarks/model_sweep.py"
                       + ("" if args.models == list(MODELS) else " --models " + " ".join(args.models))
                       + ("" if args.opsets == [9, 11, 13, 17] else " --opsets " + " ".join(map(str, args.opsets)))
                       + f" --out benchmarks/results/{args.out.name}"}
    result = {"meta": meta, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "model_sweep.json").write_text(json.dumps(result, indent=1))
    (args.out / "README.md").write_text(markdown(result))


if __name__ == "__main__":
    main()
