"""One request at a time on two one-core CPU devices: the task runtime with and without continuation, against the
same plan run sequentially on one core.

Per model, one compile (``--devices cpu:0,cpu:1 --method portfolio --requests 16 --segments``, planned for the
static placement: ``work_sharing`` off, so the plan cuts across the two groups), then, alternated call by call for
``--rounds`` rounds (order reversed every other round), median kept (work sharing off in both runtimes):

- *sequential*: the plan's one-VM executable, the calling thread's pool restricted to the first core;
- *segments back to back*: the runtime's segment functions called one after another in that thread (what the
  segment build costs, without any runtime);
- *tasks, continuation*: ``TaskRuntime(continuation=True)`` (the default): a worker with nothing of its own to do
  runs the next segment of the other core group itself;
- *tasks, hand-overs*: ``TaskRuntime(continuation=False)``: every segment runs on its planned core's worker.

    TVM_NUM_THREADS=2 python benchmarks/one_request_continuation.py --out benchmarks/results/one_request_continuation
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
import warnings
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", "2")

VARIANTS = ("sequential", "segments back to back", "tasks, continuation", "tasks, hand-overs")


def measure(model: str, rounds: int, cores: tuple[int, int]) -> dict:
    import tvm

    import hetpart
    from hetpart.driver.check import sample_inputs
    from hetpart.driver.task_runtime import TaskRuntime
    from tvm_passes.host_tensors import to_host_tensor
    from tvm_passes.thread_pool import restricted_pool
    from tvm_passes.virtual_machine import new_virtual_machine

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = hetpart.compile(model, devices=f"cpu:{cores[0]},cpu:{cores[1]}", method="portfolio",
                                   segments=True, requests=16,      # the static placement: segments on both groups
                                   partition_options={"work_sharing": False})
    inputs = list(sample_inputs(compiled.build.manifest.inputs, compiled.op_graph, seed=0).values())
    program = compiled.segments.program
    _vm, calls = new_virtual_machine(compiled.segments.executable, tvm.cpu(0), [f.name for f in program.functions])
    host_inputs = [to_host_tensor(a, tvm.cpu(0)) for a in inputs]

    def back_to_back() -> None:
        values = {}
        for f in program.functions:
            out = calls[f.name](*([host_inputs[k] for k in f.input_params] + [values[op] for op in f.op_params]))
            for k, op in enumerate(f.outputs):
                values[op] = out[k]

    def on_first_core(fn):
        def run() -> None:
            with restricted_pool(1, (cores[0],)):
                fn()
        return run

    with TaskRuntime(compiled.segments, trace=True, sharing=False) as continued, \
            TaskRuntime(compiled.segments, continuation=False, sharing=False) as handed:
        runs = {"sequential": on_first_core(lambda: compiled(*inputs)),
                "segments back to back": on_first_core(back_to_back),
                "tasks, continuation": lambda: continued(*inputs), "tasks, hand-overs": lambda: handed(*inputs)}
        for run in runs.values():
            run()
        times_ms: dict[str, list[float]] = {name: [] for name in runs}
        for k in range(rounds):
            for name in (VARIANTS if k % 2 == 0 else VARIANTS[::-1]):
                started = time.perf_counter()
                runs[name]()
                times_ms[name].append((time.perf_counter() - started) * 1e3)
        continued.trace.clear()
        continued(*inputs)
        workers = sorted({run.device for run in continued.trace})
    return {"model": model, "segments": len(program.functions),
            "segment_devices": [f.device for f in program.functions], "continued_on": workers,
            "median_ms": {name: statistics.median(v) for name, v in times_ms.items()}}


def _cpu_name() -> str:
    """LLVM's name for this host's CPU (what the predictors are keyed by), else the platform's."""
    try:
        import tvm

        return str(tvm.target.Target.from_device(tvm.cpu()).attrs["mcpu"])
    except Exception:  # noqa: BLE001 (only a label)
        return platform.processor() or platform.machine()


def markdown(rows: list[dict], command: str, rounds: int) -> str:
    lines = ["# One request at a time: the task runtime with and without continuation", "",
             f"Command: `{command}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"{_cpu_name()}, TVM_NUM_THREADS={os.environ['TVM_NUM_THREADS']}). "
             f"Median of {rounds} rounds, the four variants alternated call by call; in brackets the difference from "
             "*sequential* (ms). Plans vary between compiles: each row is the plan of its compile.", "",
             "| model | segments (devices) | workers used, continuation | " + " | ".join(VARIANTS) + " |",
             "|---|---|---|" + "---:|" * len(VARIANTS)]
    for row in rows:
        base = row["median_ms"]["sequential"]
        cells = [f"{row['median_ms'][v]:.2f}" + ("" if v == "sequential" else f" ({row['median_ms'][v] - base:+.2f})")
                 for v in VARIANTS]
        lines.append(f"| {row['model']} | {row['segments']} ({', '.join(row['segment_devices'])}) | "
                     f"{', '.join(row['continued_on'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    import json
    import sys

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="googlenet,resnet18,lstm_lm")
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/one_request_continuation"))
    args = parser.parse_args()
    cores = tuple(sorted(os.sched_getaffinity(0))[:2])
    if len(cores) < 2:
        raise SystemExit("two one-core CPU devices need a process allowed on two cores")
    rows = [measure(m, args.rounds, cores) for m in args.models.split(",") if m]
    args.out.mkdir(parents=True, exist_ok=True)
    command = "TVM_NUM_THREADS=2 python benchmarks/one_request_continuation.py " + " ".join(sys.argv[1:])
    (args.out / "one_request_continuation.json").write_text(json.dumps(rows, indent=1) + "\n")
    (args.out / "README.md").write_text(markdown(rows, command.strip(), args.rounds))
    print(markdown(rows, command.strip(), args.rounds))


if __name__ == "__main__":
    main()
