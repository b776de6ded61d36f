"""float16 models on the CPU: accuracy and time of hetpart's import with float32 sums (``tvm_passes.half_accumulate``)
and without (every op in float16, as TVM computes it), against onnxruntime and torch.

Each zoo model is built with its seeded random weights, cast to half precision and exported to ONNX (opset 17) as a
published float16 model would be; the same file with every float16 tensor made float32 (the same weights, computed
in float32 by onnxruntime) gives the reference. torch's error: its half-precision run against its float32 run of
the same half-precision weights (unfolded BatchNorm). Errors
are norm-wise: the largest difference from the float32 run over the float32 run's largest magnitude. Times: the
deployment CPU pipeline (all on the CPU), onnxruntime with as many intra-op threads, interleaved rounds in one
process, median of the rounds.

    TVM_NUM_THREADS=2 python benchmarks/half_precision.py --rounds 7 --out benchmarks/results/half_precision

writes ``half_precision.json`` and ``README.md`` in the ``--out`` directory.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
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

DEFAULT_MODELS = ("resnet18", "mobilenetv2", "squeezenet1_1", "yolo_detector", "bert_small", "gru_lm")
VARIANTS = ("float32_sums", "float16_sums")


def export(name: str, work: Path) -> tuple[Path, Path, np.ndarray, float]:
    """(float16 ONNX, its float32 twin, a float16 input (or int64 ids), torch's half-precision error)."""
    import torch

    from models.zoo import build_torch

    module, (example,) = build_torch(name)
    half = module.half()
    x = example.half() if example.is_floating_point() else example
    path = work / f"{name}_float16.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(half, (x,), str(path), dynamo=False, opset_version=17, input_names=["x"])
        with torch.no_grad():
            torch_half = half(x).double()
            exact = half.float()(x.float() if x.is_floating_point() else x).double()
    torch_error = float((torch_half - exact).abs().max() / exact.abs().max())
    return path, float32_twin(path), x.numpy(), torch_error


def float32_twin(path: Path) -> Path:
    """The float16 ONNX model with every float16 tensor, cast and constant made float32: the same weights (as
    exported, BatchNorm folded in float16) computed in float32."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    half, single = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT

    def widen(tensor) -> None:
        if tensor.data_type == half:
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float32), tensor.name))
    for tensor in model.graph.initializer:
        widen(tensor)
    for value in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        if value.type.tensor_type.elem_type == half:
            value.type.tensor_type.elem_type = single
    for node in model.graph.node:
        for attribute in node.attribute:
            if attribute.name == "to" and attribute.i == half:
                attribute.i = single
            if attribute.HasField("t"):
                widen(attribute.t)
    twin = path.with_name(path.stem.replace("float16", "float32") + ".onnx")
    onnx.save(model, str(twin))
    return twin


def compiled(path: Path, float32_sums: bool):
    """The all-CPU deployment build of ``path`` (None when it does not build), with or without float32 sums."""
    import tvm
    from tvm import relax

    from tvm_passes import frontend
    from tvm_passes.outline import deployment_pipeline

    original = frontend.accumulate_half_in_float32
    if not float32_sums:
        frontend.accumulate_half_in_float32 = lambda mod: (mod, 0)
    try:
        mod = frontend.import_model(str(path)).mod
        pipeline, target = deployment_pipeline(None, None)
        executable = tvm.compile(mod, target=target, relax_pipeline=pipeline)
    except Exception as exc:  # noqa: BLE001 (recorded: float16 erf does not build for the CPU)
        return None, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160]}"
    finally:
        frontend.accumulate_half_in_float32 = original
    return relax.VirtualMachine(executable, tvm.cpu()), None


def normwise(ours: np.ndarray, exact: np.ndarray) -> float:
    return float(np.abs(ours.astype(np.float64) - exact).max() / np.abs(exact).max())


def measure(name: str, work: Path, rounds: int, threads: int) -> dict:
    import onnxruntime as ort
    import tvm

    half_path, single_path, x, torch_error = export(name, work)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(half_path), options, providers=["CPUExecutionProvider"])
    exact_session = ort.InferenceSession(str(single_path), options, providers=["CPUExecutionProvider"])
    x_single = x.astype(np.float32) if x.dtype == np.float16 else x
    exact = exact_session.run(None, {"x": x_single})[0].astype(np.float64)
    runs = {"onnxruntime": lambda: session.run(None, {"x": x})[0]}
    record = {"model": name, "torch_half_error": torch_error,
              "onnxruntime_error": normwise(runs["onnxruntime"](), exact), "errors": {}, "build_errors": {}}
    tensor = tvm.runtime.tensor(x, tvm.cpu())
    for variant in VARIANTS:
        vm, error = compiled(half_path, variant == "float32_sums")
        if vm is None:
            record["build_errors"][variant] = error
            continue
        runs[variant] = lambda vm=vm: vm["main"](tensor).numpy()
        record["errors"][variant] = normwise(runs[variant](), exact)
    times: dict[str, list[float]] = {k: [] for k in runs}
    for r in range(rounds):
        order = list(runs)[r % len(runs):] + list(runs)[:r % len(runs)]
        for key in order:
            runs[key]()
            started = time.perf_counter()
            for _ in range(5):
                runs[key]()
            times[key].append((time.perf_counter() - started) / 5 * 1e3)
    record["ms"] = {k: statistics.median(v) for k, v in times.items()}
    return record


def markdown(result: dict) -> str:
    meta = result["meta"]
    lines = [
        "# float16 models on the CPU: float32 sums against float16 sums",
        "",
        f"Measured {meta['date']} on {meta['cpu']} ({meta['threads']} threads for TVM and onnxruntime), "
        f"{meta['rounds']} interleaved rounds; {meta['wall_s']:.0f} s.",
        "",
        f"    {meta['command']}",
        "",
        "Error: largest difference from the same model file computed in float32 (onnxruntime), over "
        "that output's largest magnitude (torch: its half-precision run against its float32 run). `float32 sums`: hetpart's import (`tvm_passes.half_accumulate`); "
        "`float16 sums`: without that rewrite, every op computed in float16 as TVM does. Times: all on the CPU.",
        "",
        "| model | torch half error | onnxruntime error | float32 sums error | float16 sums error | onnxruntime ms | "
        "float32 sums ms | float16 sums ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["records"]:
        def error(variant: str) -> str:
            return f"{r['errors'][variant]:.1e}" if variant in r["errors"] else "does not build"

        def ms(key: str) -> str:
            return f"{r['ms'][key]:.1f}" if key in r["ms"] else "–"
        lines.append(f"| {r['model']} | {r['torch_half_error']:.1e} | {r['onnxruntime_error']:.1e} | "
                     f"{error('float32_sums')} | {error('float16_sums')} | {ms('onnxruntime')} | "
                     f"{ms('float32_sums')} | {ms('float16_sums')} |")
    failures = [f"{r['model']}: {e}" for r in result["records"] for e in r["build_errors"].values()]
    if failures:
        lines += ["", "Builds that failed: " + "; ".join(failures) + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    from cpu_kernels import cpu_name
    from predictors.registry import host_cpu_name

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, default=_HERE / "results" / "half_precision")
    args = parser.parse_args(argv)
    threads = int(os.environ["TVM_NUM_THREADS"])
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="hetpart-half-") as work:
        records = []
        for name in args.models:
            records.append(measure(name, Path(work), args.rounds, threads))
            print(json.dumps(records[-1]), flush=True)
    meta = {"command": "TVM_NUM_THREADS=%d python benchmarks/half_precision.py %s" % (threads, " ".join(argv)),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "cpu": f"{cpu_name() or platform.machine()} (LLVM {host_cpu_name()})",
            "threads": threads, "rounds": args.rounds, "wall_s": time.time() - started}
    result = {"meta": meta, "records": records}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "half_precision.json").write_text(json.dumps(result, indent=1))
    (args.out / "README.md").write_text(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
