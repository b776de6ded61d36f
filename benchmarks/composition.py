"""Why a whole model runs slower than the sum of its kernels timed one by one: a replay of its kernel calls.

The profiler labels a kernel with its *warm* latency: ``time_evaluator`` calls it back to back, so from the second
call on its weights and inputs sit in the cores' caches, written there by the kernel itself. Inside a model each
kernel runs once, after other kernels. This benchmark compiles a zoo model with the deployment pipeline, records
every kernel call the VM makes (the kernel and its real argument buffers, in order) and replays the calls from
Python with a per-call timer, in five ways:

* ``in_sequence``      -- the model's order, one call each: what the VM does (its sum should match the model);
* ``repeated``         -- each call twice in a row, the second timed: what the profiler measures;
* ``unrelated_between``-- call, then a tiny unrelated kernel, then the timed call: restores code, branch predictors
  and the thread pool's state but leaves the data warm (if this matches ``repeated``, code and threads are not
  the cause);
* ``l2_evicted_between`` -- call, then a parallel kernel streaming 4x the cores' L2 capacity, then the timed call:
  the kernel's data in the last-level cache, not in the cores' L2;
* ``producer_between`` -- call, then the call before it in model order, then the timed call: the data placement
  the real producer leaves behind (its output modified in whichever core's cache wrote it).

Sums are per model; ``python_call_us`` is the timer + Python call overhead per call (the tiny kernel's timed
call), included in every mode alike.

    python benchmarks/composition.py --models mobilenetv2_b1_s224,resnet50_b1_s112 --out benchmarks/results/composition
"""
from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from hetpart.threads import ensure_tvm_threads  # noqa: E402

logger = logging.getLogger("benchmarks.composition")

MODES = ("in_sequence", "repeated", "unrelated_between", "l2_evicted_between", "producer_between")
DEFAULT_MODELS = ("mobilenetv2_b1_s224", "mobilenetv2_b1_s112", "resnet50_b1_s112", "resnet18_b1_s224",
                  "googlenet_b1_s224", "squeezenet1_1_b1_s224", "densenet121_b1_s112", "bert_small_b1_s64",
                  "lstm_lm_b1_s35")
Call = tuple[str, Callable[..., Any], tuple[Any, ...]]


def _vector_add_kernel(profiler: Any, n_elems: int) -> Callable[[], Any]:
    """A compiled ``x + 1`` over ``n_elems`` float32 (deployment pipeline: parallel over the cores)."""
    import tvm
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([n_elems], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(x, relax.const(1.0, "float32")))
        bb.emit_func_output(out)
    vm = relax.VirtualMachine(tvm.compile(bb.get(), target=profiler.tvm_target, relax_pipeline=profiler.pipeline),
                              profiler.dev)
    vm.save_function("main", "run", tvm.runtime.tensor(np.zeros(n_elems, "float32"), profiler.dev))
    return vm["run"]


def capture_calls(mod: Any, profiler: Any) -> tuple[list[Call], float]:
    """The model's kernel calls in order (VM builtins left out) and its own latency (µs, time_evaluator)."""
    import tvm
    from tvm import relax

    from predictors.profiling.model_timing import model_inputs

    vm = relax.VirtualMachine(tvm.compile(mod, target=profiler.tvm_target, relax_pipeline=profiler.pipeline),
                              profiler.dev)
    args = model_inputs(mod, profiler.dev)
    calls: list[Call] = []

    def record(func: Any, name: str, before: bool, ret: Any, *call_args: Any) -> int:
        if before and not name.startswith("vm.builtin"):
            calls.append((name, func, call_args))
        return 0

    vm.set_instrument(record)
    vm["main"](*args)
    vm.set_instrument(None)
    vm.save_function("main", "timed_main", *args)
    for _ in range(3):
        vm["timed_main"]()
    model_us = float(np.median(vm.time_evaluator("timed_main", profiler.dev, number=5, repeat=10)().results)) * 1e6
    return calls, model_us


def replay(calls: Sequence[Call], mode: str, reps: int, unrelated: Callable[[], Any],
           evict: Callable[[], Any]) -> np.ndarray:
    """Median per-call latency (µs) of each call over ``reps`` replays of the whole sequence in ``mode``."""
    timer = time.perf_counter
    per_call = np.zeros((reps, len(calls)))
    for rep in range(reps):
        for i, (_, func, call_args) in enumerate(calls):
            if mode != "in_sequence":
                func(*call_args)
            if mode == "unrelated_between":
                unrelated()
            elif mode == "l2_evicted_between":
                evict()
            elif mode == "producer_between" and i > 0:
                calls[i - 1][1](*calls[i - 1][2])
            start = timer()
            func(*call_args)
            per_call[rep, i] = (timer() - start) * 1e6
    return np.median(per_call, axis=0)


def replay_model(name: str, profiler: Any, reps: int, evict_bytes: int) -> dict[str, Any]:
    from predictors.profiling import sampling
    from predictors.profiling.model_timing import import_variant, release_memory

    variants = {v.name: v for v in sampling.zoo_variants()}
    if name not in variants:
        raise SystemExit(f"unknown model variant {name!r}; choose from {sorted(variants)}")
    calls, model_us = capture_calls(import_variant(variants[name]), profiler)
    unrelated = _vector_add_kernel(profiler, 16)
    evict = _vector_add_kernel(profiler, evict_bytes // 8)   # reads n, writes n: 2 x 4 bytes per element
    per_mode = {mode: replay(calls, mode, reps, unrelated, evict) for mode in MODES}
    start = time.perf_counter()
    for _ in range(200):
        unrelated()
    python_call_us = (time.perf_counter() - start) / 200 * 1e6
    seq, warm = per_mode["in_sequence"], per_mode["repeated"]
    worst = np.argsort(-(seq - warm))[:10]
    result = {"model": name, "n_calls": len(calls), "model_us": model_us, "python_call_us": python_call_us,
              "sum_us": {mode: float(v.sum()) for mode, v in per_mode.items()},
              "largest_gaps": [{"index": int(i), "kernel": calls[i][0],
                                **{mode: float(per_mode[mode][i]) for mode in MODES}} for i in worst]}
    release_memory()
    return result


def render_markdown(report: dict[str, Any]) -> str:
    lines = ["# In-model composition: replayed kernel calls", "",
             f"Produced by `{report['command']}` on {report['host']}; target `{report['target']}`, "
             f"{report['threads']} TVM thread(s), L2 eviction streams {report['evict_bytes'] / 2**20:.0f} MiB.", "",
             "Sums of per-call latencies (µs), and each mode's sum relative to `in_sequence` (the model's own "
             "order). `model` is the compiled model timed by time_evaluator.", "",
             "| model | calls | model | in_sequence | repeated | unrelated_between | l2_evicted_between | "
             "producer_between | repeated / in_sequence | l2_evicted / in_sequence |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["models"]:
        s = r["sum_us"]
        lines.append(f"| {r['model']} | {r['n_calls']} | {r['model_us']:.0f} | " +
                     " | ".join(f"{s[m]:.0f}" for m in MODES) +
                     f" | {s['repeated'] / s['in_sequence']:.2f} | {s['l2_evicted_between'] / s['in_sequence']:.2f} |")
    ratios = [r["sum_us"]["in_sequence"] / r["model_us"] for r in report["models"]]
    calls = [r["python_call_us"] for r in report["models"]]
    close = sum(abs(r - 1) <= 0.05 for r in ratios)
    lines += ["", f"The replay's in-sequence sum is within 5% of the model's own latency for {close} of {len(ratios)} "
              f"models ({min(ratios):.2f}-{max(ratios):.2f}x over all; each timed call also carries "
              f"{min(calls):.1f}-{max(calls):.1f} µs of Python call and timer overhead): per-call figures show where "
              "a model's time goes, not exact in-model latencies."]
    lines += ["", "Largest per-call gaps (in_sequence - repeated), µs:", ""]
    for r in report["models"]:
        lines.append(f"- **{r['model']}**: " + "; ".join(
            f"{g['kernel']} {g['in_sequence']:.0f} vs {g['repeated']:.0f} (L2-evicted {g['l2_evicted_between']:.0f},"
            f" after its producer {g['producer_between']:.0f})" for g in r["largest_gaps"][:4]))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated zoo variant names")
    parser.add_argument("--reps", type=int, default=7, help="replays of the whole call sequence per mode")
    parser.add_argument("--out", type=Path, default=_HERE / "results" / "composition")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    ensure_tvm_threads()
    from predictors.context import core_cache_bytes
    from predictors.profiling.profiler import KernelProfiler

    profiler = KernelProfiler("cpu")
    evict_bytes = 4 * core_cache_bytes(profiler.num_threads)
    models = [m for m in args.models.split(",") if m]
    results = []
    for done, name in enumerate(models, 1):
        results.append(replay_model(name, profiler, args.reps, evict_bytes))
        s = results[-1]["sum_us"]
        logger.info("%d/%d %s: model %.0f us, in_sequence %.0f, repeated %.0f, L2-evicted %.0f", done, len(models),
                    name, results[-1]["model_us"], s["in_sequence"], s["repeated"], s["l2_evicted_between"])
    command = "python benchmarks/composition.py " + " ".join(sys.argv[1:] if argv is None else argv)
    report = {"command": command, "host": f"{platform.node()} ({platform.processor() or platform.machine()})",
              "target": profiler.target, "threads": profiler.num_threads, "evict_bytes": evict_bytes,
              "reps": args.reps, "models": results}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "composition.json").write_text(json.dumps(report, indent=1))
    (args.out / "composition.md").write_text(render_markdown(report))
    logger.info("wrote %s", args.out / "composition.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
