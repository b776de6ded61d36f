"""``hetpart run``: run a compiled model directory (sequentially or with the task runtime), optionally many requests
and a check against onnxruntime. ``register(subparsers, positive_int)`` adds it to hetpart's parser."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable

from hetpart.driver.console import console as _console


def cmd_run(args: argparse.Namespace) -> int:
    import contextlib

    from hetpart.driver import api

    if args.mode is None:
        args.mode = default_mode(Path(args.directory))
    options = {}
    if not args.work_sharing:
        if args.mode != "tasks":
            from hetpart.errors import UsageError

            raise UsageError("--no-work-sharing is an option of the task runtime; add --mode tasks")
        options.update(continuation=False, sharing=False)
    with contextlib.ExitStack() as stack:
        runtime = api.load(args.directory, mode=args.mode, **options)
        if args.mode == "tasks":
            stack.enter_context(runtime)        # joins the worker threads on the way out
        return _run_loaded(args, runtime)


def _run_requests(console, runtime, args: argparse.Namespace, named: dict) -> None:
    """``--requests N``: N requests of the same inputs; throughput and latency percentiles (measured)."""
    import time

    import numpy as np

    specs = runtime.input_specs if args.mode == "tasks" else runtime.manifest.inputs
    positional = [named[str(spec["name"])] for spec in specs]
    started = time.perf_counter()
    if args.mode == "tasks":
        _, latency_us = runtime.run_many([positional] * args.requests, max_in_flight=args.requests)
    else:
        latency_us = []
        for _ in range(args.requests):
            begin = time.perf_counter()
            runtime(*positional)
            latency_us.append((time.perf_counter() - begin) * 1e6)
    wall_s = time.perf_counter() - started
    p50, p99 = np.percentile(latency_us, [50, 99])
    console.print(f"{args.requests} requests ({args.mode}): {args.requests / wall_s:,.1f} inferences/s, latency p50 "
                  f"{p50 / 1e3:,.2f} ms, p99 {p99 / 1e3:,.2f} ms (measured here"
                  f"{'; GPU emulated on the CPU' if runtime.emulated else ''}"
                  f"{'; cross-device sharing' if getattr(runtime, 'cross_device_sharing', False) else ''})")


def _run_loaded(args: argparse.Namespace, runtime) -> int:
    import json

    import numpy as np

    from hetpart.driver.check import (compare_outputs, computes_in_half, load_input_file, onnxruntime_reference,
                                      sample_inputs)
    from hetpart.errors import InputMismatchError
    from hetpart.graph import OpGraph

    console = _console()
    named = dict(load_input_file(item) for item in args.input)
    graph_path = Path(args.directory) / "graph.json"
    wanted = not named or args.check          # for the inputs' valid ranges, or whether it computes in float16
    graph = OpGraph.load(graph_path) if wanted and graph_path.exists() else None
    if not named:
        specs = runtime.input_specs if args.mode == "tasks" else runtime.manifest.inputs
        named = sample_inputs(specs, graph, seed=args.seed)
        console.print(f"no --input given: running on random inputs (seed {args.seed}; integer inputs drawn from "
                      "their valid range)")
    outputs = runtime(**named)
    console.print(repr(runtime), markup=False)
    for k, out in enumerate(outputs):
        console.print(f"output {k}: shape {list(out.shape)} {out.dtype}, mean {float(np.mean(out)):.6g}")
    if args.requests > 1:
        _run_requests(console, runtime, args, named)
    hint = task_runtime_hint(Path(args.directory), args.mode)
    if hint:
        console.print(f"note: {hint}")
    if args.save:
        args.save.mkdir(parents=True, exist_ok=True)
        for k, out in enumerate(outputs):
            np.save(args.save / f"output{k}.npy", out)
        console.print(f"wrote {len(outputs)} output(s) to {args.save}/output<k>.npy")
    if args.check:
        info = json.loads((Path(args.directory) / "compile.json").read_text())
        if not info.get("onnx_path") or not Path(info["onnx_path"]).exists():
            raise InputMismatchError("--check needs the imported ONNX model, which this directory does not "
                                     "reference (a torch model, or the cache was cleared): recompile from the "
                                     "ONNX file, or compare with --save")
        result = compare_outputs(outputs, onnxruntime_reference(info["onnx_path"], named), rtol=args.rtol,
                                 atol=args.atol, half_tolerance=args.half_tolerance,
                                 half_precision=computes_in_half(graph))
        console.print(f"check vs onnxruntime: {result.describe()}")
        return 0 if result.ok else 1
    return 0


def made_for_task_runtime(plan: Any) -> int:
    """Requests in flight a plan was made for on the task runtime (``timeslice``/``portfolio`` with requests, or
    cross-device sharing); 0 for a plan made for one request at a time."""
    requests = int(plan.stats.get("requests", 1) or 1)
    across = bool(plan.config.get("cross_device_sharing"))
    return max(requests, 2) if across else (requests if requests > 1 else 0)


def default_mode(directory: Path) -> str:
    """``hetpart run``'s mode when none is given: ``tasks`` for a plan made for the task runtime whose segments the
    directory holds, else ``sequential``."""
    from hetpart.plan import Plan
    from tvm_passes.segment_artifact import SEGMENTS_MANIFEST

    if (directory / SEGMENTS_MANIFEST).exists() and (directory / "plan.json").exists() and made_for_task_runtime(
            Plan.load(directory / "plan.json")):
        return "tasks"
    return "sequential"


def task_runtime_hint(directory: Path, mode: str) -> str | None:
    """What to do when a plan made for many requests on the task runtime is not run by it (None otherwise)."""
    from hetpart.plan import Plan
    from tvm_passes.segment_artifact import SEGMENTS_MANIFEST

    if mode == "tasks" or not (directory / "plan.json").exists():
        return None
    requests = made_for_task_runtime(Plan.load(directory / "plan.json"))
    if not requests:
        return None
    if (directory / SEGMENTS_MANIFEST).exists():
        return (f"the plan was made for {requests} requests in flight on the task runtime; add --mode tasks to run "
                "its segments that way")
    return (f"the plan was made for {requests} requests in flight on the task runtime, but this directory holds no "
            "segments for it: recompile with --segments, then run with --mode tasks")


def register(sub: Any, positive_int: Callable[[str], int]) -> None:
    """Add ``run`` to hetpart's subcommands."""
    from hetpart.driver.check import DEFAULT_ATOL, DEFAULT_HALF_TOLERANCE, DEFAULT_RTOL

    p = sub.add_parser("run", help="run a compiled model directory")
    p.add_argument("directory", type=Path, help="a directory written by `hetpart compile -o DIR`")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                   help="an input array (repeatable); default: seeded random inputs in each input's valid range")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--check", action="store_true", help="compare the outputs with onnxruntime's; exit 1 if they "
                   "differ by more than the tolerance")
    p.add_argument("--rtol", type=float, default=DEFAULT_RTOL,
                   help=f"relative tolerance of --check (default {DEFAULT_RTOL:g})")
    p.add_argument("--atol", type=float, default=DEFAULT_ATOL,
                   help=f"absolute tolerance of --check (default {DEFAULT_ATOL:g})")
    p.add_argument("--half-tolerance", type=float, default=DEFAULT_HALF_TOLERANCE,
                   help="--check's bound for float16 outputs, relative to the output's largest magnitude (default "
                   f"{DEFAULT_HALF_TOLERANCE:g}: float16 activations carry errors that grow with depth)")
    p.add_argument("--save", type=Path, help="directory to write output<k>.npy into")
    p.add_argument("--mode", choices=("sequential", "tasks"), default=None,
                   help="sequential: one VM runs the whole executable; tasks: the plan's segments on one worker "
                   "thread per device (needs a compile with segments). Default: tasks for a plan made for many "
                   "requests in flight whose segments were built, else sequential")
    p.add_argument("--requests", type=positive_int, default=1,
                   help="run this many requests and print throughput and latency percentiles (tasks mode keeps "
                   "them all in flight)")
    p.add_argument("--no-work-sharing", dest="work_sharing", action="store_false",
                   help="tasks mode: every segment runs on its planned device's worker (by default a worker of an "
                   "equally sized CPU core group with nothing of its own to do takes the other group's ready work)")
    p.set_defaults(func=cmd_run)
