"""1-D convolutions on the CPU: imported as they are (the pooling rule took them) against the (1, k) conv2d rewrite
(``tvm_passes.conv1d_as_conv2d``), against onnxruntime, in one process with ``cpu_kernels.py``'s block protocol.
With ``--transposed``, 1-D transposed convolutions as they are (the row-reduction rule took them) against the
zero-inserted convolution of ``tvm_passes.conv_transpose_as_conv`` (then a (1, k) conv2d).

Each case is an ONNX model of one Conv (ConvTranspose) over [1, C, L] followed by a ReLU, built here with random
weights; every variant is checked against onnxruntime before it is timed.

    TVM_NUM_THREADS=2 python benchmarks/conv1d_rewrite.py --rounds 7 --out benchmarks/results/conv1d_rewrite
    TVM_NUM_THREADS=2 python benchmarks/conv1d_rewrite.py --transposed --rounds 7 \
        --out benchmarks/results/conv1d_transpose_rewrite

write ``conv1d_rewrite.json`` and ``README.md`` in the ``--out`` directory.
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

# (name, in channels, out channels, kernel, stride, dilation, pad, groups, length)
CASES = [
    ("64->64 k3 d4 L400", 64, 64, 3, 1, 4, 4, 1, 400),
    ("128->256 k5 L400", 128, 256, 5, 1, 1, 2, 1, 400),
    ("512->512 k1 L100", 512, 512, 1, 1, 1, 0, 1, 100),
    ("80->256 k3 s2 L800", 80, 256, 3, 2, 1, 1, 1, 800),
    ("30->128 k5 L200", 30, 128, 5, 1, 1, 0, 1, 200),
    ("1->64 k10 s5 L16000", 1, 64, 10, 5, 1, 0, 1, 16000),
    ("96 depthwise k15 L48", 96, 96, 15, 1, 1, 7, 96, 48),
    ("256->250 k5 L333", 256, 250, 5, 1, 1, 2, 1, 333),
    ("128->300 k1 L186", 128, 300, 1, 1, 1, 0, 1, 186),
]
# (name, in channels, out channels, kernel, stride, dilation, pad, groups, input length): upsampling decoders
TRANSPOSED_CASES = [
    ("128->64 k8 s4 L50", 128, 64, 8, 4, 1, 2, 1, 50),
    ("64->32 k8 s4 L200", 64, 32, 8, 4, 1, 2, 1, 200),
    ("256->128 k16 s8 L32", 256, 128, 16, 8, 1, 4, 1, 32),
    ("512->256 k4 s2 L100", 512, 256, 4, 2, 1, 1, 1, 100),
    ("64->64 k3 s1 L400", 64, 64, 3, 1, 1, 1, 1, 400),
]


def conv1d_onnx(path: Path, c_in: int, c_out: int, kernel: int, stride: int, dilation: int, pad: int, groups: int,
                length: int, transposed: bool = False) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight_shape = (c_in, c_out // groups, kernel) if transposed else (c_out, c_in // groups, kernel)
    weight = numpy_helper.from_array((rng.standard_normal(weight_shape) * 0.1).astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.standard_normal(c_out).astype(np.float32), "b")
    nodes = [helper.make_node("ConvTranspose" if transposed else "Conv", ["x", "w", "b"], ["y"], kernel_shape=[kernel],
                              strides=[stride],
                              dilations=[dilation], pads=[pad, pad], group=groups),
             helper.make_node("Relu", ["y"], ["out"])]
    out_length = (length - 1) * stride - 2 * pad + dilation * (kernel - 1) + 1 if transposed \
        else (length + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c_in, length])
    graph = helper.make_graph(nodes, "conv1d", [x_info],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, c_out, out_length])],
                              [weight, bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    onnx.save(model, str(path))
    return path


def bench_case(case: tuple, work: Path, rounds: int, calls: int, transposed: bool = False) -> dict:
    from rewrite_ab import time_rewrite_off_and_on

    name, *shape = case
    path = conv1d_onnx(work / "conv1d.onnx", *shape, transposed=transposed)
    x = np.random.default_rng(1).standard_normal((1, shape[0], shape[-1])).astype(np.float32)
    row: dict = {"case": name, "shape": dict(zip(("c_in", "c_out", "kernel", "stride", "dilation", "pad", "groups",
                                                    "length"), shape))}
    time_rewrite_off_and_on(row, path, x, "conv_transpose_as_conv" if transposed else "conv1d_as_conv2d",
                            ("as_imported", "rewritten"), rounds, calls)
    return row


def markdown(rows: list[dict], meta: dict) -> str:
    import cpu_kernels as ck

    kind = "1-D transposed convolutions: as imported vs the zero-inserted convolution" if meta.get("transposed") \
        else "1-D convolutions: as imported vs the (1, k) conv2d rewrite"
    lines = [f"# {kind} vs onnxruntime", "",
             f"Measured {meta['date']} on {meta['cpu']} ({meta['threads']} threads for TVM and onnxruntime). "
             + ck._block_protocol(meta, "timed calls"), "", "    " + meta["command"], "",
             f"| {'conv1d_transpose' if meta.get('transposed') else 'conv1d'} + ReLU | as imported ms | rewritten ms | "
             "ORT ms | as imported / ORT | rewritten / ORT |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['as_imported_ms']:.3f} | {r['rewritten_ms']:.3f} | {r['onnxruntime_ms']:.3f} "
                     f"| {r['as_imported_ratio_to_ort']:.2f} | {r['rewritten_ratio_to_ort']:.2f} |")
    ratios = sorted(r["rewritten_ratio_to_ort"] for r in rows)
    lines += ["", f"Rewritten / onnxruntime over {len(rows)} cases: median {ratios[len(ratios) // 2]:.2f}x, worst "
                  f"{ratios[-1]:.2f}x; as imported: median "
                  f"{sorted(r['as_imported_ratio_to_ort'] for r in rows)[len(rows) // 2]:.1f}x."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls-per-block", type=int, default=5)
    parser.add_argument("--transposed", action="store_true", help="1-D transposed convolutions instead")
    parser.add_argument("--out", type=Path, default=_HERE / "results" / "conv1d_rewrite")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in TRANSPOSED_CASES if args.transposed else CASES:
            rows.append(bench_case(case, Path(tmp), args.rounds, args.calls_per_block, args.transposed))
            print(f"{case[0]}: as imported {rows[-1]['as_imported_ratio_to_ort']:.2f}x, rewritten "
                  f"{rows[-1]['rewritten_ratio_to_ort']:.2f}x onnxruntime", flush=True)
    import cpu_kernels as ck

    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "cpu": ck.cpu_name() or platform.processor() or "an unnamed CPU",
            "threads": os.environ["TVM_NUM_THREADS"], "rounds": args.rounds, "calls_per_block": args.calls_per_block,
            "transposed": args.transposed,
            "command": "TVM_NUM_THREADS=2 python benchmarks/conv1d_rewrite.py "
                       f"{'--transposed ' if args.transposed else ''}--rounds {args.rounds} --out "
                       f"benchmarks/results/{args.out.name}"}
    try:
        from tvm_passes.schedules import default_cpu_target
        meta["cpu"] = f"{meta['cpu']} (LLVM mcpu {default_cpu_target().attrs['mcpu']})"
    except Exception:  # noqa: BLE001 (a label only)
        pass
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "conv1d_rewrite.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (args.out / "README.md").write_text(markdown(rows, meta))


if __name__ == "__main__":
    main()
