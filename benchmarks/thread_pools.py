"""How TVM's CPU thread pool behaves when two host threads call kernels at once (the task runtime's workers).

One compiled kernel (a float32 matmul, ``--size`` cubed, scheduled by hetpart's CPU pipeline, ``T.parallel`` over
rows) is called ``--calls`` times per caller thread in each configuration, all in one process, configurations
interleaved over ``--rounds`` rounds (median kept):

- ``1 caller, pool of N``: the deployment's pool (TVM_NUM_THREADS = N);
- ``1 caller, 1 thread on core A``: ``runtime.config_threadpool`` restricted in the calling thread;
- ``2 callers, 1 thread each, own cores``: each caller restricts its own pool and pins it to its core (what the
  task runtime does for ``--devices cpu:A,cpu:B``);
- ``2 callers, 1 thread each, unpinned``;
- ``2 callers, pool of N each``: both callers keep the deployment pool (2N threads on N cores);
- ``2 callers, 1 thread each, same core``: the failure mode of a wrong core list.

    python benchmarks/thread_pools.py --out benchmarks/results/thread_pools
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import threading
import time
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))

import numpy as np  # noqa: E402


def build_kernel(size: int):
    import tvm
    from tvm import relax

    from tvm_passes.schedules.pipeline import cpu_pipeline, default_cpu_target

    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType((size, size), "float32"))
    with bb.function("main", [a]):
        with bb.dataflow():
            w = relax.const(np.random.default_rng(0).standard_normal((size, size)).astype("float32"))
            out = bb.emit_output(bb.emit(relax.op.matmul(a, w)))
        bb.emit_func_output(out)
    target = default_cpu_target()
    return tvm.compile(bb.get(), target=target, relax_pipeline=cpu_pipeline(target))


def caller(executable, x, calls: int, threads: int | None, cores: tuple[int, ...], out: list, barrier) -> None:
    import tvm
    from tvm import relax

    from tvm_passes.thread_pool import configure_pool

    if threads is not None:
        configure_pool(tvm.get_global_func("runtime.config_threadpool"), threads, cores)
    vm = relax.VirtualMachine(executable, tvm.cpu(0))
    arg = tvm.runtime.tensor(x)
    vm["main"](arg)
    barrier.wait()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        vm["main"](arg)
        times.append((time.perf_counter() - start) * 1e6)
    out.append((times, time.perf_counter()))


def run_config(executable, x, calls: int, callers: list[tuple[int | None, tuple[int, ...]]]) -> dict:
    results: list = []
    barrier = threading.Barrier(len(callers) + 1)
    workers = [threading.Thread(target=caller, args=(executable, x, calls, t, c, results, barrier))
               for t, c in callers]
    for w in workers:
        w.start()
    barrier.wait()
    started = time.perf_counter()
    for w in workers:
        w.join()
    wall_s = max(end for _, end in results) - started
    per_call = statistics.median([t for times, _ in results for t in times])
    return {"per_call_us": per_call, "calls_per_s": len(callers) * calls / wall_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=384)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/thread_pools"))
    args = parser.parse_args()
    cores = tuple(sorted(os.sched_getaffinity(0)))
    if len(cores) < 2:
        raise SystemExit("needs a process allowed on two cores")
    a, b = cores[:2]
    n = int(os.environ["TVM_NUM_THREADS"])
    configs = {
        f"1 caller, pool of {n}": [(None, ())],
        f"1 caller, 1 thread on core {a}": [(1, (a,))],
        "2 callers, 1 thread each, own cores": [(1, (a,)), (1, (b,))],
        "2 callers, 1 thread each, unpinned": [(1, ()), (1, ())],
        f"2 callers, pool of {n} each": [(None, ()), (None, ())],
        "2 callers, 1 thread each, same core": [(1, (a,)), (1, (a,))],
    }
    executable = build_kernel(args.size)
    x = np.random.default_rng(1).standard_normal((args.size, args.size)).astype(np.float32)
    rows: dict[str, list[dict]] = {name: [] for name in configs}
    for round_index in range(args.rounds):
        order = list(configs) if round_index % 2 == 0 else list(reversed(list(configs)))
        for name in order:
            rows[name].append(run_config(executable, x, args.calls, configs[name]))
    result = {name: {"per_call_us": statistics.median(r["per_call_us"] for r in runs),
                     "calls_per_s": statistics.median(r["calls_per_s"] for r in runs)} for name, runs in rows.items()}
    base = result[f"1 caller, pool of {n}"]["calls_per_s"]
    command = f"python benchmarks/thread_pools.py --size {args.size} --calls {args.calls} --rounds {args.rounds}"
    record = {"command": command, "size": args.size, "tvm_num_threads": n, "cores": list(cores),
              "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "platform": platform.platform(),
              "results": result, "rounds": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "thread_pools.json").write_text(json.dumps(record, indent=1))
    lines = ["# TVM's thread pool with two calling threads", "",
             f"Command: `{command}` ({record['measured_at']}, TVM_NUM_THREADS={n}, cores {list(cores)}). "
             f"A {args.size}^3 float32 matmul; median over {args.rounds} interleaved rounds.", "",
             "| configuration | per call (µs, median) | calls/s (all callers) | throughput vs 1 caller with the pool |",
             "|---|---:|---:|---:|"]
    lines += [f"| {name} | {r['per_call_us']:,.0f} | {r['calls_per_s']:,.1f} | {r['calls_per_s'] / base:.2f}x |"
              for name, r in result.items()]
    (args.out / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
