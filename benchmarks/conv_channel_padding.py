"""Convolutions whose output channels are not a multiple of 8: as written against padded to whole vectors
(``tvm_passes.pad_conv_channels``), against onnxruntime, in one process with ``cpu_kernels.py``'s block protocol.

Each case is an ONNX model of one Conv (bias, no padding of the input) followed by a ReLU, with random weights:
3x3 convs on maps of several sizes, strided convs, a (5, 1) conv over a 1-D signal, conv-STFT front ends (one input
channel, a window of 128 or 512 samples, hop 64 or 128, a (1, k) conv after ``conv1d_as_conv2d``), and pointwise
convs. One control case has a multiple of 8 channels: the pass leaves it alone, so its two variants differ by the
host's noise only.

    TVM_NUM_THREADS=2 python benchmarks/conv_channel_padding.py --out benchmarks/results/conv_channel_padding
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TVM_NUM_THREADS", "2")
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))
sys.path.insert(1, str(_HERE))

# (name, in channels, out channels, kernel h, kernel w, stride h, stride w, height, width)
CASES = [
    ("3x3 64->100 56x56", 64, 100, 3, 3, 1, 1, 56, 56),
    ("3x3 64->60 56x56", 64, 60, 3, 3, 1, 1, 56, 56),
    ("3x3 32->36 56x56", 32, 36, 3, 3, 1, 1, 56, 56),
    ("3x3 16->100 64x64", 16, 100, 3, 3, 1, 1, 64, 64),
    ("3x3 64->36 28x28", 64, 36, 3, 3, 1, 1, 28, 28),
    ("3x3 64->90 28x28", 64, 90, 3, 3, 1, 1, 28, 28),
    ("3x3 128->200 14x14 (control: 200 = 25 x 8, not padded)", 128, 200, 3, 3, 1, 1, 14, 14),
    ("3x3 64->100 7x7", 64, 100, 3, 3, 1, 1, 7, 7),
    ("3x3 s2 64->100 56x56", 64, 100, 3, 3, 2, 2, 56, 56),
    ("7x7 s2 3->36 224x224", 3, 36, 7, 7, 2, 2, 224, 224),
    ("(5,1) 64->100 512x1", 64, 100, 5, 1, 1, 1, 512, 1),
    ("STFT (1,128) s64 1->130 1x8000", 1, 130, 1, 128, 1, 64, 1, 8000),
    ("STFT (1,512) s128 1->514 1x16000", 1, 514, 1, 512, 1, 128, 1, 16000),
    ("1x1 128->300 1x186", 128, 300, 1, 1, 1, 1, 1, 186),
    ("1x1 256->255 13x13", 256, 255, 1, 1, 1, 1, 13, 13),
]


def conv_onnx(path: Path, c_in: int, c_out: int, kernel_h: int, kernel_w: int, stride_h: int, stride_w: int,
              height: int, width: int) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array((rng.standard_normal((c_out, c_in, kernel_h, kernel_w)) * 0.1)
                                     .astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.standard_normal(c_out).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[kernel_h, kernel_w],
                              strides=[stride_h, stride_w]),
             helper.make_node("Relu", ["y"], ["out"])]
    out_shape = [1, c_out, (height - kernel_h) // stride_h + 1, (width - kernel_w) // stride_w + 1]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                            [1, c_in, height, width])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, out_shape)], [weight, bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, str(path))
    return path


def bench_case(case: tuple, work: Path, rounds: int, calls: int) -> dict:
    from rewrite_ab import time_rewrite_off_and_on

    name, *shape = case
    path = conv_onnx(work / "conv.onnx", *shape)
    x = np.random.default_rng(1).standard_normal((1, shape[0], shape[6], shape[7])).astype(np.float32)
    row: dict = {"case": name, "shape": dict(zip(("c_in", "c_out", "kernel_h", "kernel_w", "stride_h", "stride_w",
                                                    "height", "width"), shape))}
    time_rewrite_off_and_on(row, path, x, "pad_conv_channels", ("as_written", "padded"), rounds, calls)
    row["padded_to_as_written"] = row["padded_ms"] / row["as_written_ms"]
    return row


def markdown(rows: list[dict], meta: dict) -> str:
    import cpu_kernels as ck

    lines = ["# Convolutions with output channels not a multiple of 8: as written vs padded vs onnxruntime", "",
             f"Measured {meta['date']} on {meta['cpu']} ({meta['threads']} threads for TVM and onnxruntime). "
             + ck._block_protocol(meta, "timed calls"), "", "    " + meta["command"], "",
             "| conv + ReLU | as written ms | padded ms | ORT ms | padded / as written | as written / ORT | "
             "padded / ORT |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['as_written_ms']:.3f} | {r['padded_ms']:.3f} | {r['onnxruntime_ms']:.3f} | "
                     f"{r['padded_to_as_written']:.2f} | {r['as_written_ratio_to_ort']:.2f} | "
                     f"{r['padded_ratio_to_ort']:.2f} |")
    gains = sorted(r["padded_to_as_written"] for r in rows)
    padded = sorted(r["padded_ratio_to_ort"] for r in rows)
    written = sorted(r["as_written_ratio_to_ort"] for r in rows)
    lines += ["", f"Over {len(rows)} cases: padded / as written median {gains[len(gains) // 2]:.2f}x (from "
                  f"{gains[0]:.2f}x to {gains[-1]:.2f}x); against onnxruntime as written median "
                  f"{written[len(written) // 2]:.2f}x, worst {written[-1]:.2f}x; padded median "
                  f"{padded[len(padded) // 2]:.2f}x, worst {padded[-1]:.2f}x."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls-per-block", type=int, default=5)
    parser.add_argument("--out", type=Path, default=_HERE / "results" / "conv_channel_padding")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            rows.append(bench_case(case, Path(tmp), args.rounds, args.calls_per_block))
            print(f"{case[0]}: padded / as written {rows[-1]['padded_to_as_written']:.2f}, padded / onnxruntime "
                  f"{rows[-1]['padded_ratio_to_ort']:.2f}", flush=True)
    import cpu_kernels as ck
    from tvm_passes.schedules import default_cpu_target

    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "cpu": f"{ck.cpu_name() or platform.processor() or 'an unnamed CPU'} (LLVM mcpu "
                   f"{default_cpu_target().attrs.get('mcpu', 'generic')})",
            "threads": os.environ["TVM_NUM_THREADS"], "rounds": args.rounds, "calls_per_block": args.calls_per_block,
            "command": f"TVM_NUM_THREADS=2 python benchmarks/conv_channel_padding.py --rounds {args.rounds} --out "
                       f"benchmarks/results/{args.out.name}"}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "conv_channel_padding.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (args.out / "README.md").write_text(markdown(rows, meta))


if __name__ == "__main__":
    main()
