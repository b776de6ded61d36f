"""How much a Relax VM call waits for Python's interpreter lock when another thread runs Python.

A VM call releases the interpreter lock (GIL) while its kernels run, but its thread must take the lock back to
return. This times one VM call of a two-layer GRU (hidden 256, 35 steps; about 1 ms on one core) on core A, its TVM
pool one thread pinned there, 200 calls per scenario:

* ``alone``: nothing else runs;
* ``python_loop``: another thread runs a pure-Python loop on core B (it never releases the lock by itself, so the
  VM thread gets it back only when CPython's switch interval, 5 ms by default, forces a hand-over);
* ``python_bursts``: another thread on core B runs 100 µs of Python, then sleeps 1 ms (a scheduler's bookkeeping
  between segments; it releases the lock as it sleeps);
* ``python_loop`` again with ``sys.setswitchinterval(0.0005)``.

Reported per scenario: wall time and the part of it the thread spent off the CPU (wall minus the thread's CPU time:
waiting for the lock), p10/p50/p90/p99 in µs.

    TVM_NUM_THREADS=2 python benchmarks/gil_vm_call.py [--calls 200] [--out benchmarks/results/gil_vm_call]
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np

os.environ.setdefault("TVM_NUM_THREADS", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))

RESULTS = Path(__file__).resolve().parent / "results" / "gil_vm_call"
log = logging.getLogger("gil_vm_call")


def _other_thread(kind: str, core: int, stop: threading.Event) -> None:
    """On ``core`` until ``stop``: pure Python without pause (``python_loop``), or 100 µs of it then a 1 ms sleep."""
    os.sched_setaffinity(0, {core})
    while not stop.is_set():
        began = time.perf_counter()
        while time.perf_counter() - began < 1e-4 or kind == "python_loop":
            if stop.is_set():
                return
        time.sleep(1e-3)


def time_calls(call, calls: int) -> dict[str, list[float]]:
    """Each call's wall time and the part of it this thread spent off the CPU (wall minus its CPU time), in µs."""
    wall, off_cpu = [], []
    for _ in range(calls):
        began, cpu = time.perf_counter(), time.thread_time()
        call()
        elapsed = time.perf_counter() - began
        wall.append(elapsed * 1e6)
        off_cpu.append(max(0.0, elapsed - (time.thread_time() - cpu)) * 1e6)
    return {"wall_us": wall, "off_cpu_us": off_cpu}


def run(calls: int, cores: tuple[int, int]) -> dict:
    import tvm

    import hetpart
    from rnn_pipeline import RnnConfig, build_onnx
    from rnn_pipeline_measured import SequentialModel
    from hetpart.paths import cache_root
    from tvm_passes.thread_pool import restricted_pool

    config = RnnConfig("GRU", 2, 256, 35, 1)
    work = cache_root() / "benchmarks" / "gil_vm_call"
    work.mkdir(parents=True, exist_ok=True)
    path = build_onnx(config, work / f"{config.name}.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = hetpart.compile(str(path), devices="cpu", method="all_cpu")
    model = SequentialModel(compiled.build)
    shape = [int(d) for d in compiled.build.manifest.inputs[0]["shape"]]
    x = tvm.runtime.tensor(np.random.default_rng(0).uniform(-1, 1, shape).astype(np.float32), tvm.cpu(0))
    scenarios = [("alone", None, None), ("python_loop", "python_loop", None),
                 ("python_bursts", "python_bursts", None), ("python_loop_switch_0.5ms", "python_loop", 0.0005)]
    results = {}
    default_interval = sys.getswitchinterval()
    with restricted_pool(1, (cores[0],)):
        call = model.caller()
        for _ in range(5):
            call(x)
        for name, other, interval in scenarios:
            stop = threading.Event()
            thread = None
            if other is not None:
                thread = threading.Thread(target=_other_thread, args=(other, cores[1], stop), daemon=True)
                thread.start()
                time.sleep(0.05)
            if interval is not None:
                sys.setswitchinterval(interval)
            try:
                samples = time_calls(lambda: call(x), calls)
            finally:
                sys.setswitchinterval(default_interval)
                stop.set()
                if thread is not None:
                    thread.join()
            results[name] = {key: [float(np.percentile(values, p)) for p in (10, 50, 90, 99)]
                             for key, values in samples.items()}
            log.info("%s: wall p10/50/90/99 %s µs, off the CPU %s µs", name,
                     [round(v) for v in results[name]["wall_us"]], [round(v) for v in results[name]["off_cpu_us"]])
    return {"model": config.name, "calls": calls, "cores": list(cores), "switch_interval_s": default_interval,
            "scenarios": results}


def markdown(result: dict) -> str:
    meta = result["meta"]
    lines = ["# A Relax VM call and Python's interpreter lock", "",
             f"Measured {meta['date']} on {meta['cpu']}; `{meta['command']}`. One VM call of "
             f"`{result['model']}` on core {result['cores'][0]} (its TVM pool one thread pinned there), "
             f"{result['calls']} calls per scenario; the other thread runs on core {result['cores'][1]}. "
             "Off the CPU: wall time minus the calling thread's CPU time (waiting for the lock).", "",
             "| scenario | wall p10 / p50 / p90 / p99 µs | off the CPU p10 / p50 / p90 / p99 µs |", "|---|---|---|"]
    for name, figures in result["scenarios"].items():
        wall = " / ".join(f"{v:.0f}" for v in figures["wall_us"])
        off = " / ".join(f"{v:.0f}" for v in figures["off_cpu_us"])
        lines.append(f"| {name} | {wall} | {off} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    cores = tuple(sorted(os.sched_getaffinity(0))[:2])
    if len(cores) < 2:
        raise SystemExit("this benchmark needs a process allowed on two cores")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    result = run(args.calls, cores)
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            cpu = next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    result["meta"] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": cpu,
                      "command": "TVM_NUM_THREADS=2 python benchmarks/gil_vm_call.py"
                                 + "".join(f" {a}" for a in (argv if argv is not None else sys.argv[1:]))}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gil_vm_call.json").write_text(json.dumps(result, indent=1))
    (args.out / "README.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
