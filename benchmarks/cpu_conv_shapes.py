"""Single convolutions, hetpart's CPU rules vs onnxruntime: ``python benchmarks/cpu_kernels.py --conv-shapes``.

Times single-convolution ONNX models (conv1d-like (k,1) convs, large maps with few channels, YOLO-like and
depthwise convs: ``CONV_SHAPES``) with the timing helpers of ``cpu_kernels`` and writes
benchmarks/results/cpu_kernels_conv_shapes.{json,md}; ``--compare-without RULE`` also times every conv compiled
without the named CPU rules (before/after in one run).
"""
from __future__ import annotations

import json
import logging
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import tvm

from cpu_kernels import (RESULTS, TvmVariant, _block_protocol, _block_times, _ort_session, _pipeline_without,
                         _record_times, _time_once)
from tvm_passes.frontend import import_model
from tvm_passes.schedules import cpu_pipeline, default_cpu_target

log = logging.getLogger("cpu_kernels")


@dataclass(frozen=True)
class ConvShape:
    """One batch-1 NCHW convolution (+ bias, + an activation) timed on its own."""

    name: str
    kind: str
    in_channels: int
    out_channels: int
    in_hw: tuple[int, int]
    kernel: tuple[int, int]
    stride: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)  # ONNX order: top, left, bottom, right
    groups: int = 1
    activation: str = "none"  # "relu", "silu" or "none"

    def describe(self) -> str:
        kh, kw = self.kernel
        text = f"{self.in_channels}->{self.out_channels} ({kh},{kw})"
        text += f" s{self.stride[0]}" if self.stride[0] == self.stride[1] else f" s{self.stride}"
        text += f" g{self.groups}" if self.groups > 1 else ""
        return text + f" on {self.in_hw[0]}x{self.in_hw[1]}" + (f" +{self.activation}" if self.activation != "none"
                                                                  else "")


def _same(kernel: tuple[int, int]) -> tuple[int, int, int, int]:
    (kh, kw) = kernel
    return ((kh - 1) // 2, (kw - 1) // 2, kh // 2, kw // 2)


CONV_SHAPES = [
    ConvShape("conv1d_k5", "conv1d", 256, 512, (512, 1), (5, 1), pads=_same((5, 1)), activation="relu"),
    ConvShape("conv1d_k5_h1", "conv1d", 256, 512, (1, 512), (1, 5), pads=_same((1, 5)), activation="relu"),
    ConvShape("pitch_k512_s4", "pitch", 1, 256, (1024, 1), (512, 1), (4, 1), pads=(254, 0, 254, 0),
              activation="relu"),
    ConvShape("pitch_k64_256to64", "pitch", 256, 64, (128, 1), (64, 1), pads=_same((64, 1)), activation="relu"),
    ConvShape("pitch_k64_64to64", "pitch", 64, 64, (64, 1), (64, 1), pads=_same((64, 1)), activation="relu"),
    ConvShape("pitch_k64_64to128", "pitch", 64, 128, (32, 1), (64, 1), pads=_same((64, 1)), activation="relu"),
    ConvShape("pitch_k64_128to256", "pitch", 128, 256, (16, 1), (64, 1), pads=_same((64, 1)), activation="relu"),
    ConvShape("map100_1to32", "wide map", 1, 32, (100, 161), (3, 3), pads=_same((3, 3)), activation="relu"),
    ConvShape("map100_32to32", "wide map", 32, 32, (100, 161), (3, 3), pads=_same((3, 3)), activation="relu"),
    ConvShape("map100_32to64", "wide map", 32, 64, (100, 161), (3, 3), pads=_same((3, 3)), activation="relu"),
    ConvShape("map900_1to32", "wide map", 1, 32, (900, 161), (3, 3), pads=_same((3, 3)), activation="relu"),
    ConvShape("map900_32to32", "wide map", 32, 32, (900, 161), (3, 3), pads=_same((3, 3)), activation="relu"),
    ConvShape("map900_32to64", "wide map", 32, 64, (900, 161), (3, 3), pads=_same((3, 3)), activation="relu"),
    ConvShape("yolo_stem_12to32", "yolo", 12, 32, (208, 208), (3, 3), pads=_same((3, 3)), activation="silu"),
    ConvShape("yolo_s2_32to64", "yolo", 32, 64, (208, 208), (3, 3), (2, 2), pads=(1, 1, 1, 1), activation="silu"),
    ConvShape("yolo_1x1_64to32", "yolo", 64, 32, (104, 104), (1, 1), activation="silu"),
    ConvShape("yolo_3x3_32to32", "yolo", 32, 32, (104, 104), (3, 3), pads=_same((3, 3)), activation="silu"),
    ConvShape("yolo_1x1_32to64_208", "yolo", 32, 64, (208, 208), (1, 1), activation="silu"),
    ConvShape("yolo_s2_64to128", "yolo", 64, 128, (104, 104), (3, 3), (2, 2), pads=(1, 1, 1, 1), activation="silu"),
    ConvShape("yolo_1x1_128to64", "yolo", 128, 64, (52, 52), (1, 1), activation="silu"),
    ConvShape("yolo_3x3_64to64", "yolo", 64, 64, (52, 52), (3, 3), pads=_same((3, 3)), activation="silu"),
    ConvShape("yolo_s2_128to256", "yolo", 128, 256, (52, 52), (3, 3), (2, 2), pads=(1, 1, 1, 1), activation="silu"),
    ConvShape("yolo_1x1_256to128", "yolo", 256, 128, (26, 26), (1, 1), activation="silu"),
    ConvShape("dw_32_208", "depthwise", 32, 32, (208, 208), (3, 3), pads=_same((3, 3)), groups=32, activation="relu"),
    ConvShape("dw_64_104_s2", "depthwise", 64, 64, (104, 104), (3, 3), (2, 2), pads=(1, 1, 1, 1), groups=64,
              activation="relu"),
    ConvShape("dw_128_52", "depthwise", 128, 128, (52, 52), (3, 3), pads=_same((3, 3)), groups=128,
              activation="relu"),
    ConvShape("dw_32_100x161", "depthwise", 32, 32, (100, 161), (3, 3), pads=_same((3, 3)), groups=32),
]


def conv_model(shape: ConvShape, path: Path, seed: int = 0) -> Path:
    """A one-conv ONNX model (opset 18) of ``shape`` with random weights and bias, saved at ``path``."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    fan_in = shape.in_channels // shape.groups * shape.kernel[0] * shape.kernel[1]
    weight = rng.standard_normal((shape.out_channels, shape.in_channels // shape.groups, *shape.kernel))
    inits = [numpy_helper.from_array((weight / np.sqrt(fan_in)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(shape.out_channels).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["conv"], kernel_shape=list(shape.kernel),
                              strides=list(shape.stride), pads=list(shape.pads), group=shape.groups)]
    if shape.activation == "relu":
        nodes.append(helper.make_node("Relu", ["conv"], ["y"]))
    elif shape.activation == "silu":
        nodes += [helper.make_node("Sigmoid", ["conv"], ["gate"]), helper.make_node("Mul", ["conv", "gate"], ["y"])]
    else:
        nodes.append(helper.make_node("Identity", ["conv"], ["y"]))
    graph = helper.make_graph(nodes, shape.name, [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, shape.in_channels, *shape.in_hw])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    onnx.save(model, str(path))
    return path


def bench_conv_shape(shape: ConvShape, args, work_dir: Path) -> dict:
    """ORT vs hetpart's rules (vs the rules without ``args.compare_without``) on one conv, interleaved."""
    path = conv_model(shape, work_dir / f"{shape.name}.onnx")
    imported = import_model(path)
    feeds = {"x": np.random.default_rng(1).standard_normal((1, shape.in_channels, *shape.in_hw)).astype(np.float32)}
    session = _ort_session(path)
    reference = session.run(None, feeds)[0]
    target = default_cpu_target()
    param_order = [p.name for p in imported.mod["main"].params]
    variants = {"rules": TvmVariant("rules", imported.mod, target, cpu_pipeline(target), feeds, param_order)}
    if args.compare_without:
        variants["rules_before"] = TvmVariant("rules_before", imported.mod, target,
                                              _pipeline_without(target, args.compare_without), feeds, param_order)
    row: dict = {"shape": shape.name, "kind": shape.kind, "conv": shape.describe(),
                 "gflop": 2 * reference.size * shape.in_channels // shape.groups * shape.kernel[0] * shape.kernel[1]
                 / 1e9, "rules_applied": _rules_applied(imported.mod, target)}
    for variant in variants.values():
        diff = float(np.max(np.abs(variant.run().astype(np.float64) - reference)))
        row[f"{variant.name}_max_abs_diff"] = diff
        row[f"{variant.name}_max_rel_diff"] = diff / (float(np.max(np.abs(reference))) or 1.0)
    spinning = _ort_session(path, spinning=True)
    runners = {"onnxruntime": lambda: session.run(None, feeds),
               "onnxruntime_spinning": lambda: spinning.run(None, feeds)}
    runners.update({name: variant.run for name, variant in variants.items()})
    warm_s = min(_time_once(run) for run in runners.values() for _ in range(2))
    reps = max(1, min(200, int(args.min_sample_ms * 1e-3 / max(warm_s, 1e-6))))
    times = _block_times(runners, args.rounds, args.calls_per_block, reps=reps)
    spinning = None              # release the session and its spinning threads before the next shape
    row["reps_per_sample"] = reps
    _record_times(row, times)
    log.info("%s: %s", shape.name, {k: round(v, 3) for k, v in row.items()
                                    if k.endswith(("_ms", "_ort")) and isinstance(v, float)})
    return row


def _rules_applied(mod, target) -> str:
    """The CPU rule of every kernel of ``mod`` as hetpart's pipeline schedules it ("rule x count, ...")."""
    from collections import Counter

    from tvm_passes.schedules import RULE_ATTR, cpu_schedule_pass
    from tvm_passes.tuning_db import kernel_lowering_passes

    with target:
        scheduled = tvm.transform.Sequential(kernel_lowering_passes(target) + [cpu_schedule_pass(target)])(mod)
    counts = Counter(str(func.attrs.get(RULE_ATTR, "unscheduled")) for _, func in scheduled.functions_items()
                     if isinstance(func, tvm.tirx.PrimFunc))
    return ", ".join(f"{name} x{count}" if count > 1 else name for name, count in sorted(counts.items()))


def _conv_protocol(meta: dict) -> str:
    """How the shapes were timed (results written before timing in blocks say so)."""
    if "calls_per_block" not in meta:
        return (f"Variants interleaved round-robin in one process (order rotated every round, onnxruntime thread "
                f"spinning off); median of {meta['rounds']} rounds, each sample the mean of back-to-back calls (reps).")
    return _block_protocol(meta, "samples, each the mean of back-to-back calls (reps)")


def conv_markdown(rows: list[dict], meta: dict) -> str:
    before = any("rules_before_ms" in row for row in rows)
    lines = [
        "# CPU kernels: single convolutions, hetpart rules vs onnxruntime (batch 1)",
        "",
        f"Measured {meta['date']} on {meta['cpu']} ({meta['threads']} threads for onnxruntime and TVM), target "
        f"`{meta['target']}`, load average at the start {meta['load_average']}. " + _conv_protocol(meta)
        + " The machine was shared with other jobs; compare ratios within a row."
        + (f" *before*: the same pipeline without the rules {meta['compare_without']}." if before else ""),
        "",
        f"    {meta['command']}",
        "",
        "| shape | conv | GFLOP | ORT ms | rules ms | rules / ORT |"
        + (" before ms | before / ORT |" if before else "") + " max rel diff | rules applied |",
        "|---|---|---|---|---|---|" + ("---|---|" if before else "") + "---|---|",
    ]
    for row in rows:
        line = (f"| {row['shape']} | {row['conv']} | {row['gflop']:.3f} | {row['onnxruntime_ms']:.3f} | "
                f"{row['rules_ms']:.3f} | {row['rules_ratio_to_ort']:.2f} |")
        if before:
            line += f" {row['rules_before_ms']:.3f} | {row['rules_before_ratio_to_ort']:.2f} |"
        lines.append(line + f" {row['rules_max_rel_diff']:.1e} | {row['rules_applied']} |")
    ratios = {name: [row[f"{name}_ratio_to_ort"] for row in rows] for name in ("rules", "rules_before")
              if all(f"{name}_ratio_to_ort" in row for row in rows)}
    lines.append("")
    for name, values in ratios.items():
        lines.append(f"- {name.replace('rules_before', 'before')} / ORT over {len(values)} shapes: median "
                     f"{statistics.median(values):.2f}x, worst {max(values):.2f}x "
                     f"({rows[values.index(max(values))]['shape']}), geomean "
                     f"{float(np.exp(np.mean(np.log(values)))):.2f}x")
    for low, high in ((2.0, None), (1.2, 2.0)):
        behind = [f"{row['shape']} {row['rules_ratio_to_ort']:.2f}x" for row in rows
                  if row["rules_ratio_to_ort"] > low and (high is None or row["rules_ratio_to_ort"] <= high)]
        span = f"above {low}x" if high is None else f"between {low}x and {high}x"
        lines.append(f"- rules {span} onnxruntime's time: {', '.join(behind) if behind else 'none'}")
    return "\n".join(lines) + "\n" + CONV_NOTES


CONV_NOTES = """
Rules: `conv2d_flat` (tvm_passes/schedules/conv_flat.py) takes batch-1 dense convs with prepacked weights, and
those with OIHW weights whose rows are too short for whole-register column vectors; `conv2d_depthwise`
(conv_depthwise.py) takes depthwise convs; `conv2d_nchw` the rest. Why the shapes were slow before: a one-column
(k,1) conv got a register tile of one column (one or two accumulators: every multiply-add waited on the previous
one); 161- and 52-column rows got 7- and 13-wide tiles or vectors; large maps read every input-channel plane per
tile through indices LLVM recomputes per load inside a parallel loop; a SiLU epilogue after channel vectors ran
scalar. Known gaps: weight-streaming convs with few output positions (128->256 (64,1) on 16 steps) read the
output-channel-innermost weights of one channel tile with a stride of all output channels; 1->32 3x3 convs spend
their time writing the output (9 taps per output); stride-2 depthwise convs gather their inputs lane by lane.
"""


def run_conv_shapes(args, meta: dict) -> None:
    shapes = [shape for shape in CONV_SHAPES if not args.shapes or shape.name in args.shapes]
    meta["min_sample_ms"] = args.min_sample_ms
    out = Path(args.out if args.out != str(RESULTS / "cpu_kernels") else RESULTS / "cpu_kernels_conv_shapes")
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as work_dir:
        for shape in shapes:
            rows.append(bench_conv_shape(shape, args, Path(work_dir)))
            out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
            out.with_suffix(".md").write_text(conv_markdown(rows, meta))
    print(out.with_suffix(".md").read_text())
