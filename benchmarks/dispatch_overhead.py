"""What one segment costs the task runtime beyond its kernels: dispatch, hand-off between worker threads, and the
copy of a small tensor between two devices (the GPU emulated on a second CPU device).

A chain of ``--ops`` tiny element-wise ops (add / multiply by a constant, 1 x 16 float32) is run by :class:`hetpart.driver.task_runtime.TaskRuntime`
under two plans of the same module, interleaved in one process: every op on the CPU (one segment) and the ops
alternating between the two devices (one segment per op, a copy before each). Requests run one at a time. The
overhead per segment is (alternating - one segment) / (segments added); the kernels are the same in both, so they
cancel. This is the figure ``hetpart.simulate_requests.RuntimeModel.dispatch_overhead_us_by_device`` stands for.

    python benchmarks/dispatch_overhead.py --out benchmarks/results/dispatch_overhead
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))

import numpy as np  # noqa: E402


def plan_for(graph, devices: list[str]):
    from hetpart.plan import Plan

    return Plan(device_of=devices, order=range(graph.num_ops), devices=("cpu", "gpu"), method="fixed",
                graph_hash=graph.structure_hash(), level="op").validate(graph)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=32, help="ops in the chain")
    parser.add_argument("--requests", type=int, default=200, help="requests per round and plan")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (median kept)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/dispatch_overhead"))
    args = parser.parse_args()

    from hetpart.driver.runtime_overhead import chain_module
    from hetpart.driver.task_runtime import TaskRuntime
    from tvm_passes.extract import extract_op_graph

    graph = extract_op_graph(chain_module(args.ops), with_kernels=False)
    plans = {"one_segment": plan_for(graph, ["cpu"] * graph.num_ops),
             "alternating": plan_for(graph, ["cpu" if k % 2 == 0 else "gpu" for k in range(graph.num_ops)])}
    x = np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32)
    runtimes = {name: TaskRuntime.from_module(chain_module(args.ops), graph, plan) for name, plan in plans.items()}
    segments = {name: len(rt.build.program.functions) for name, rt in runtimes.items()}
    per_request_us: dict[str, list[float]] = {name: [] for name in plans}
    try:
        for rt in runtimes.values():
            rt(x)                                            # warm up: VMs created, first call done
        for round_index in range(args.rounds):
            names = list(plans) if round_index % 2 == 0 else list(reversed(plans))
            for name in names:
                started = time.perf_counter()
                for _ in range(args.requests):
                    runtimes[name](x)
                per_request_us[name].append((time.perf_counter() - started) / args.requests * 1e6)
    finally:
        for rt in runtimes.values():
            rt.close()
    median = {name: statistics.median(v) for name, v in per_request_us.items()}
    added = segments["alternating"] - segments["one_segment"]
    overhead_us = (median["alternating"] - median["one_segment"]) / added
    record = {"ops": graph.num_ops, "segments": segments, "requests_per_round": args.requests,
              "rounds": args.rounds, "per_request_us": per_request_us, "median_per_request_us": median,
              "overhead_per_segment_us": overhead_us, "tvm_num_threads": int(os.environ["TVM_NUM_THREADS"]),
              "cpu": platform.processor() or platform.machine(),
              "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "command": "python benchmarks/dispatch_overhead.py " + " ".join(
                  f"--{k} {v}" for k, v in (("ops", args.ops), ("requests", args.requests), ("rounds", args.rounds)))}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "dispatch_overhead.json").write_text(json.dumps(record, indent=1))
    lines = ["# Task runtime: overhead per segment", "",
             f"Command: `{record['command']}` ({record['measured_at']}, TVM_NUM_THREADS={record['tvm_num_threads']}, "
             "the GPU emulated on a second CPU device). A chain of tiny element-wise ops, requests one at a time; "
             "the two plans run interleaved in one process, median over rounds.", "",
             "| plan | segments | per request (µs, median) |", "|---|---:|---:|"]
    lines += [f"| {name} | {segments[name]} | {median[name]:,.1f} |" for name in plans]
    lines += ["", f"Overhead per segment (dispatch + hand-off between workers + one 64-byte copy): "
              f"**{overhead_us:,.1f} µs** = ({median['alternating']:,.1f} - {median['one_segment']:,.1f}) / {added}.",
              "", "Per-round figures are in `dispatch_overhead.json`. The machine may have been shared: compare "
              "only the two rows of one run."]
    (args.out / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
