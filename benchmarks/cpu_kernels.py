"""CPU kernel benchmark: onnxruntime vs TVM's default pipeline vs hetpart's CPU rules (vs rules + tuning).

Metric: batch-1 inference latency per zoo model with the same thread count (2) for onnxruntime and TVM, reported as
ratios to onnxruntime; numerics of every TVM variant against onnxruntime (max abs and max relative difference). All
variants are timed in one process, in blocks: every round runs, for each variant in turn (order rotated every
round), one untimed call and then a few calls back to back, and keeps the block's median; a variant's time is the
median over rounds. onnxruntime runs twice per round, with its worker threads spinning (its default) and without;
its time is the better of the two. Short blocks spread every variant over the same spells of this host (its
memory-bound slow spells last seconds and move whole models by up to 1.7x, benchmarks/results/host_spells*.md),
which timing one variant after the others did not.
Goals: rules <= 3x onnxruntime on ResNet-18/50 and MobileNetV2, >= 20x faster than TVM's default
pipeline on every zoo CNN; rules + bounded tuning <= 1.5x onnxruntime on ResNet-18.

    TVM_NUM_THREADS=2 python benchmarks/cpu_kernels.py [--models resnet18 ...] [--tune-minutes 10]
    TVM_NUM_THREADS=2 python benchmarks/cpu_kernels.py --conv-shapes [--shapes conv1d_k5 ...] \
        [--compare-without conv_narrow ...]

Writes benchmarks/results/cpu_kernels.json and .md.  ``--conv-shapes`` times single-convolution ONNX models
instead (conv1d-like (k,1) convs, large maps with few channels, YOLO-like and depthwise convs: ``CONV_SHAPES``)
and writes benchmarks/results/cpu_kernels_conv_shapes.{json,md};
``--compare-without RULE`` also times every model compiled without the named CPU rules (before/after in one
run). The single-convolution half lives in ``cpu_conv_shapes.py``.  The machine is shared, so absolute times drift
between runs; the ratios within one run are the result.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import tempfile
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TVM_NUM_THREADS", "2")

import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import tvm  # noqa: E402
from tvm import relax  # noqa: E402

from tvm_passes.frontend import import_model  # noqa: E402
from tvm_passes.schedules import cpu_pipeline, default_cpu_target  # noqa: E402

log = logging.getLogger("cpu_kernels")
MODELS = ["resnet18", "resnet50", "mobilenetv2", "vgg16", "lstm_lm", "gru_lm", "bert_small"]
CNNS = {"resnet18", "resnet50", "mobilenetv2", "vgg16"}
THREADS = int(os.environ["TVM_NUM_THREADS"])
RESULTS = Path(__file__).resolve().parent / "results"
# Before each timed block: after a run, TVM's pool worker keeps a core busy for ~0.2 s (300,000 yields) and
# onnxruntime's spinning threads for ~0.04 s (SqueezeNet, measured on the Zen 4 host).
PAUSE_S = 0.3


def _inputs(path: Path, name: str) -> dict[str, np.ndarray]:
    from onnx.helper import tensor_dtype_to_np_dtype

    from models import get_info

    rng = np.random.default_rng(1)
    feeds = {}
    initializers = {init.name for init in onnx.load(str(path), load_external_data=False).graph.initializer}
    for value in onnx.load(str(path), load_external_data=False).graph.input:
        if value.name in initializers:
            continue
        shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
        dtype = tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        if dtype.kind == "f":
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
        else:
            vocab = get_info(name).vocab_size or 100
            feeds[value.name] = rng.integers(0, vocab, size=shape).astype(dtype)
    return feeds


def _ort_session(path: Path, spinning: bool = False) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # Interleaved timing needs spinning off: otherwise onnxruntime's worker threads keep spinning after each
    # run and steal the cores from whatever is timed next (measured: the variant timed right after
    # onnxruntime looked 2x slower).  Its default (spinning on) is timed separately, back to back.
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _first_output(value) -> np.ndarray:
    if hasattr(value, "numpy"):
        return value.numpy()
    return _first_output(value[0])


class TvmVariant:
    """One compiled TVM executable plus a callable that runs it once."""

    def __init__(self, name: str, mod, target, pipeline, feeds: dict[str, np.ndarray], param_order: list[str]):
        began = time.perf_counter()
        self.executable = tvm.compile(mod, target=target, relax_pipeline=pipeline)
        self.compile_s = time.perf_counter() - began
        self.name = name
        self.vm = relax.VirtualMachine(self.executable, tvm.cpu())
        self.args = [tvm.runtime.tensor(feeds[p]) for p in param_order]

    def run(self) -> np.ndarray:
        return _first_output(self.vm["main"](*self.args))


def _time_once(fn, reps: int = 1) -> float:
    """Seconds per call of ``fn``, averaged over ``reps`` back-to-back calls."""
    began = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - began) / reps


def _block_times(runners: dict, rounds: int, calls: int, max_rounds: dict[str, int] | None = None,
                 pause_s: float | None = None, reps: int = 1) -> dict[str, list[float]]:
    """Per-call seconds of every runner, one sample per round: the median of ``calls`` timings after one untimed
    call, each timing the mean of ``reps`` back-to-back calls, the runners taken in turn (order rotated every round).
    ``max_rounds`` caps the rounds of slow runners (TVM's default pipeline, seconds a call), which also time one
    call per block.

    The pause before each block lets the worker threads of the previous runner go idle: onnxruntime's (spinning
    on) and TVM's pool (300,000 yields by default) keep spinning after a run and take the cores from the next one.
    With a 20 ms pause onnxruntime with spinning timed 4.0-4.4 ms or 8.8-16 ms per call of SqueezeNet from one
    round to the next; with 300 ms, 4.1-4.4 ms in every round."""
    pause_s = PAUSE_S if pause_s is None else pause_s
    times: dict[str, list[float]] = {name: [] for name in runners}
    order = list(runners)
    for round_index in range(rounds):
        shift = round_index % len(order)
        for name in order[shift:] + order[:shift]:
            if len(times[name]) >= (max_rounds or {}).get(name, rounds):
                continue
            time.sleep(pause_s)
            runners[name]()
            block_calls = 1 if name in (max_rounds or {}) else calls
            times[name].append(statistics.median(_time_once(runners[name], reps) for _ in range(block_calls)))
    return times


def _record_times(row: dict, times: dict[str, list[float]]) -> None:
    """Put :func:`_block_times`' samples into ``row``: every sample, onnxruntime's two settings and the better one
    (``onnxruntime_ms``), and per TVM variant its median, ratio to onnxruntime and rounds."""
    row["samples_ms"] = {name: [round(t * 1e3, 5) for t in samples] for name, samples in times.items()}
    row["onnxruntime_not_spinning_ms"] = statistics.median(times["onnxruntime"]) * 1e3
    row["onnxruntime_spinning_ms"] = statistics.median(times["onnxruntime_spinning"]) * 1e3
    row["onnxruntime_ms"] = min(row["onnxruntime_not_spinning_ms"], row["onnxruntime_spinning_ms"])
    for name, samples in times.items():
        if not name.startswith("onnxruntime"):
            row[f"{name}_ms"] = statistics.median(samples) * 1e3
            row[f"{name}_ratio_to_ort"] = row[f"{name}_ms"] / row["onnxruntime_ms"]
            row[f"{name}_rounds"] = len(samples)


def cpu_name() -> str | None:
    """The CPU's model name as /proc/cpuinfo gives it; None where there is none."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, StopIteration):
        return None


def _block_protocol(meta: dict, sample: str) -> str:
    """The block protocol in words; ``sample``: what one timed sample of a block is."""
    return (f"Variants timed in blocks in one process: every round, each variant in turn (order rotated every round) "
            f"waits {meta.get('pause_s', 0.3):g} s (the previous variant's worker threads stop spinning), makes one "
            f"untimed call, then {meta['calls_per_block']} {sample}, and keeps their median; median of "
            f"{meta['rounds']} rounds. onnxruntime runs twice per round, its worker threads spinning (its default) "
            "and not; ORT ms is the better of the two (JSON has both).")


def _pipeline_without(target, rule_names: list[str]):
    """hetpart's CPU pipeline with the named rules taken out of the rule list (the "before" of a rule change)."""
    from tvm_passes.schedules import pipeline as cpu_pipelines

    rules = [rule for rule in cpu_pipelines.default_rules() if rule.name not in set(rule_names)]
    generic = cpu_pipelines.cpu_generic
    passes = (cpu_pipelines.tuning_db.kernel_lowering_passes(target) + [cpu_pipelines.cpu_schedule_pass(target, rules)]
              + generic.dataflow_lower_passes(target) + generic.finalize_passes(target))

    @tvm.transform.module_pass(opt_level=0, name="HetpartCpuPipelineWithout")
    def _pipeline(mod, _ctx):
        with target:
            return tvm.transform.Sequential(passes)(mod)

    return _pipeline


def bench_model(name: str, args) -> dict:
    import models

    row: dict = {"model": name}
    try:
        path = Path(models.build_onnx(name))
        imported = import_model(path)
    except Exception as err:  # noqa: BLE001 - report which model could not be imported and why
        row["skipped"] = f"import failed: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
        log.warning("%s: %s", name, row["skipped"])
        return row
    onnx_path = imported.onnx_path or path
    feeds = _inputs(onnx_path, name)
    session = _ort_session(onnx_path)
    reference = session.run(None, feeds)[0]
    param_order = [p.name for p in imported.mod["main"].params]
    target = default_cpu_target()
    variants: dict[str, TvmVariant] = {}
    variants["rules"] = TvmVariant("rules", imported.mod, target, cpu_pipeline(target), feeds, param_order)
    if args.compare_without:
        variants["rules_before"] = TvmVariant("rules_before", imported.mod, target,
                                              _pipeline_without(target, args.compare_without), feeds, param_order)
    if imported.notes and args.compare_unpadded:     # the frontend padded matmul columns (tvm_passes.pad_columns)
        row["import_notes"] = list(imported.notes)
        unpadded = import_model(path, pad_columns=False)
        variants["rules_unpadded"] = TvmVariant("rules_unpadded", unpadded.mod, target, cpu_pipeline(target), feeds,
                                                [p.name for p in unpadded.mod["main"].params])
    if args.compare_row_bands:
        # Rules v9's batch-1 convs: every conv splits output channels across the cores, none runs in row bands.
        from unittest import mock

        from tvm_passes import tile_plan

        with mock.patch.object(tile_plan, "CONV_BAND_MIN_INPUT_TO_WEIGHTS", float("inf")):
            variants["rules_no_bands"] = TvmVariant("rules_no_bands", imported.mod, target, cpu_pipeline(target),
                                                    feeds, param_order)
    if name == "resnet18" and args.compare_generic_target:
        generic = tvm.target.Target({"kind": "llvm", "num-cores": int(target.attrs["num-cores"])})
        variants["rules_generic_llvm"] = TvmVariant(
            "rules_generic_llvm", imported.mod, generic, cpu_pipeline(generic), feeds, param_order
        )
    if name in args.tune_models and args.tune_minutes > 0:
        from tvm_passes.tune import tune_model

        db_dir = Path(args.database_dir) / name
        report = tune_model(imported.mod, target, trials=args.tune_trials, budget_minutes=args.tune_minutes,
                            database_dir=db_dir, progress=lambda p: log.info("tuning %s: %s", name, p))
        row["tuning"] = report.to_json()
        variants["rules_tuned"] = TvmVariant(
            "rules_tuned", imported.mod, target, cpu_pipeline(target, database_dir=db_dir), feeds, param_order
        )
    if not args.skip_default:
        variants["tvm_default"] = TvmVariant(
            "tvm_default", imported.mod, target, relax.get_default_pipeline(target), feeds, param_order
        )

    for variant in variants.values():
        out = variant.run()
        diff = float(np.max(np.abs(out.astype(np.float64) - reference)))
        scale = float(np.max(np.abs(reference))) or 1.0
        row[f"{variant.name}_max_abs_diff"] = diff
        row[f"{variant.name}_max_rel_diff"] = diff / scale
        row[f"{variant.name}_compile_s"] = variant.compile_s

    spinning = _ort_session(onnx_path, spinning=True)
    runners = {"onnxruntime": lambda: session.run(None, feeds),
               "onnxruntime_spinning": lambda: spinning.run(None, feeds)}
    runners.update({vname: variant.run for vname, variant in variants.items()})
    times = _block_times(runners, args.rounds, args.calls_per_block,
                         max_rounds={"tvm_default": args.default_rounds})
    spinning = None              # release the session and its spinning threads before the next model
    _record_times(row, times)
    if "tvm_default_ms" in row:
        row["speedup_rules_vs_default"] = row["tvm_default_ms"] / row["rules_ms"]
    if "rules_before_ms" in row:
        row["speedup_vs_before"] = row["rules_before_ms"] / row["rules_ms"]
    if "rules_no_bands_ms" in row:
        row["speedup_row_bands"] = row["rules_no_bands_ms"] / row["rules_ms"]
    if "rules_unpadded_ms" in row:
        row["speedup_padded_columns"] = row["rules_unpadded_ms"] / row["rules_ms"]
    log.info("%s: %s", name, {k: round(v, 3) for k, v in row.items()
                              if k.endswith(("_ms", "_ratio_to_ort")) and isinstance(v, float)})
    return row


def _protocol(meta: dict) -> str:
    """How the rows were timed (results written before timing in blocks say so)."""
    if "calls_per_block" not in meta:
        return (f"Variants interleaved round-robin in one process, one call each per round (order rotated every "
                f"round, onnxruntime thread spinning off); median of {meta['rounds']} rounds (TVM default: "
                f"{meta['default_rounds']}). ORT ms is the better of onnxruntime interleaved (spinning off) and "
                "onnxruntime alone with its default spinning, timed after the others (JSON has both).")
    return (_block_protocol(meta, "back to back")
            + f" TVM's default pipeline: {meta['default_rounds']} rounds, one call per block.")


def _fastest_round_ratio(row: dict) -> float | None:
    """rules / onnxruntime from each side's fastest round (the block least disturbed by the host), or None."""
    samples = row.get("samples_ms")
    if not samples or "rules" not in samples:
        return None
    ort = min(min(samples[name]) for name in ("onnxruntime", "onnxruntime_spinning") if name in samples)
    return min(samples["rules"]) / ort


def _summary_lines(rows: list[dict]) -> list[str]:
    """Median and worst rules / onnxruntime over the models, by the median of rounds and by the fastest round."""
    timed = [r for r in rows if "rules_ratio_to_ort" in r]
    if not timed:
        return []
    by_median = sorted((r["rules_ratio_to_ort"], r["model"]) for r in timed)
    lines = ["", f"rules / ORT over {len(timed)} models, median of rounds: median "
             f"{statistics.median(x for x, _ in by_median):.2f}x, worst {by_median[-1][0]:.2f}x ({by_median[-1][1]})."]
    fastest = sorted((x, r["model"]) for r in timed if (x := _fastest_round_ratio(r)) is not None)
    if len(fastest) == len(timed):
        lines[-1] += (f" Fastest round of each side (the block least disturbed by the host's spells): median "
                      f"{statistics.median(x for x, _ in fastest):.2f}x, worst {fastest[-1][0]:.2f}x "
                      f"({fastest[-1][1]}); per model: " + ", ".join(f"{m} {x:.2f}" for x, m in
                                                                     sorted(fastest, key=lambda t: t[1])) + ".")
    return lines


def _markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        "# CPU kernels: hetpart rules vs onnxruntime vs TVM default (batch 1)",
        "",
        f"Measured {meta['date']} on {meta['cpu']} ({meta['threads']} threads for onnxruntime and TVM), target "
        f"`{meta['target']}`, load average at the start {meta.get('load_average', 'not recorded')}. "
        + _protocol(meta) +
        " The machine was shared with other jobs, so absolute times are noisy; compare ratios within a row.",
        "",
    ]
    if "command" in meta:
        lines += [f"    {meta['command']}", ""]
    lines += [
        "| model | ORT ms | rules ms | rules / ORT | TVM default ms | default / rules | rules+tuned ms | tuned / ORT "
        "| max abs diff (rules) | max rel diff (rules) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def fmt(value, spec=".1f"):
        return "–" if value is None else format(value, spec)

    for row in rows:
        if "skipped" in row:
            lines.append(f"| {row['model']} | skipped: {row['skipped']} ||||||||")
            continue
        lines.append(
            f"| {row['model']} | {fmt(row['onnxruntime_ms'])} | {fmt(row['rules_ms'])} | "
            f"{fmt(row['rules_ratio_to_ort'], '.2f')} | {fmt(row.get('tvm_default_ms'))} | "
            f"{fmt(row.get('speedup_rules_vs_default'), '.0f')}x | {fmt(row.get('rules_tuned_ms'))} | "
            f"{fmt(row.get('rules_tuned_ratio_to_ort'), '.2f')} | {fmt(row['rules_max_abs_diff'], '.1e')} | "
            f"{fmt(row['rules_max_rel_diff'], '.1e')} |"
        )
    lines += _summary_lines(rows)
    extra = [r for r in rows if "rules_generic_llvm_ms" in r]
    if extra:
        row = extra[0]
        lines += ["", f"Target choice ({row['model']}): host CPU target rules {row['rules_ms']:.1f} ms vs generic "
                  f"`llvm` rules {row['rules_generic_llvm_ms']:.1f} ms (same rounds)."]
    padded = [r for r in rows if "rules_unpadded_ms" in r]
    if padded:
        lines += ["", "Padded matmul columns (`tvm_passes.pad_columns`; same rounds, rules on both sides):", "",
                  "| model | padded ms | as written ms | speedup | what the frontend did |", "|---|---|---|---|---|"]
        for row in padded:
            lines.append(f"| {row['model']} | {row['rules_ms']:.2f} | {row['rules_unpadded_ms']:.2f} | "
                         f"{row['speedup_padded_columns']:.2f}x | {'; '.join(row['import_notes'])} |")
    before = [r for r in rows if "rules_before_ms" in r]
    if before:
        lines += ["", f"Rule change (same rounds; *before*: compiled without the rules {meta.get('compare_without')}):",
                  "", "| model | rules ms | before ms | rules / ORT | before / ORT | max rel diff (before) |",
                  "|---|---|---|---|---|---|"]
        for row in before:
            lines.append(f"| {row['model']} | {row['rules_ms']:.2f} | {row['rules_before_ms']:.2f} | "
                         f"{row['rules_ratio_to_ort']:.2f} | {row['rules_before_ratio_to_ort']:.2f} | "
                         f"{row['rules_before_max_rel_diff']:.1e} |")
    banded = [r for r in rows if "rules_no_bands_ms" in r]
    if banded:
        lines += ["", "Row bands for batch-1 convs (rules v10, `tile_plan.conv_row_bands`; same rounds, the other "
                  "side compiled with no conv banded):", "",
                  "| model | bands ms | no bands ms | bands / no bands | max abs diff (no bands) |",
                  "|---|---|---|---|---|"]
        for row in banded:
            lines.append(f"| {row['model']} | {row['rules_ms']:.2f} | {row['rules_no_bands_ms']:.2f} | "
                         f"{1 / row['speedup_row_bands']:.3f}x | {row['rules_no_bands_max_abs_diff']:.1e} |")
    for row in rows:
        if "tuning" in row:
            tuning = row["tuning"]
            kept = sum(1 for k in tuning["kernels"] if k["kept"])
            lines += ["", f"Tuning ({row['model']}): {tuning['trials_used']} MetaSchedule trials in "
                      f"{tuning['elapsed_s'] / 60:.1f} min (budget {tuning['budget_minutes']} min) over "
                      f"{len(tuning['kernels'])} kernels; {kept} tuned schedules beat the rules and were kept."]
            if kept == 0:
                lines[-1] += (" With no record kept, rules+tuned compiles to the same kernels as rules: the "
                              "difference between those two columns is measurement noise.")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--default-rounds", type=int, default=2, help="rounds for the (slow) TVM default")
    parser.add_argument("--calls-per-block", type=int, default=5,
                        help="timed back-to-back calls per variant and round (their median is the round's sample)")
    parser.add_argument("--skip-default", action="store_true")
    parser.add_argument("--tune-models", nargs="*", default=["resnet18"])
    parser.add_argument("--tune-minutes", type=float, default=10.0)
    parser.add_argument("--tune-trials", type=int, default=64)
    parser.add_argument("--database-dir", default=str(Path(tempfile.gettempdir()) / "hetpart-cpu-kernels-db"))
    parser.add_argument("--compare-generic-target", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--compare-unpadded", action=argparse.BooleanOptionalAction, default=True,
                        help="also time models whose matmul columns the frontend padded without the padding")
    parser.add_argument("--compare-row-bands", action="store_true",
                        help="also time every model compiled without row bands for batch-1 convs (rules v9)")
    parser.add_argument("--out", default=str(RESULTS / "cpu_kernels"))
    parser.add_argument("--render-only", action="store_true", help="rewrite the .md from the existing .json")
    parser.add_argument("--conv-shapes", action="store_true", help="time single convs (CONV_SHAPES), not models")
    parser.add_argument("--shapes", nargs="*", default=[], help="with --conv-shapes: only these (default: all)")
    parser.add_argument("--compare-without", nargs="*", default=[], metavar="RULE",
                        help="also time everything compiled without these CPU rules (e.g. conv_narrow)")
    parser.add_argument("--min-sample-ms", type=float, default=5.0,
                        help="with --conv-shapes: call a kernel back to back until one sample lasts this long")
    args = parser.parse_args()
    if args.render_only:
        from cpu_conv_shapes import conv_markdown

        saved = json.loads(Path(args.out).with_suffix(".json").read_text())
        render = conv_markdown if "shape" in saved["rows"][0] else _markdown
        Path(args.out).with_suffix(".md").write_text(render(saved["rows"], saved["meta"]))
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    rows = []
    target = default_cpu_target()
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu": platform.processor() or platform.machine(),
        "threads": THREADS,
        "target": str(target),
        "rounds": args.rounds,
        "default_rounds": args.default_rounds,
        "calls_per_block": args.calls_per_block,
        "pause_s": PAUSE_S,
        "tune_minutes": args.tune_minutes,
        "tune_trials": args.tune_trials,
        "compare_without": args.compare_without,
        "load_average": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
    cpu = cpu_name()
    if cpu is not None:
        meta["cpu"] = cpu
    meta["command"] = "TVM_NUM_THREADS=2 python benchmarks/cpu_kernels.py " + " ".join(sys.argv[1:])
    if args.conv_shapes:
        from cpu_conv_shapes import run_conv_shapes

        run_conv_shapes(args, meta)
        return
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for name in args.models:
        rows.append(bench_model(name, args))
        out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
        out.with_suffix(".md").write_text(_markdown(rows, meta))
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
