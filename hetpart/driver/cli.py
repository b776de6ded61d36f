"""``hetpart`` command line: a thin layer over :mod:`hetpart.driver.api` (argument parsing, tables, exit codes)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from hetpart.driver.console import console as _console
from hetpart.errors import HetpartError
from hetpart.threads import ensure_tvm_threads

log = logging.getLogger("hetpart")

DESCRIPTION = ("Compile a DNN (ONNX file, zoo model) to run across a CPU and a GPU together: predict every kernel's "
               "latency on every device, plan which device runs what, build one executable and a readable report.")
EPILOG = ("examples:\n"
          "  hetpart zoo\n"
          "  hetpart compile googlenet --devices cpu,gpu=jetson-orin -o hetpart-out/googlenet\n"
          "  hetpart run hetpart-out/googlenet --check\n"
          "  hetpart analyze model.onnx --input-shape input=1,3,224,224")


def _setup_logging(verbose: int, quiet: bool = False) -> None:
    from rich.console import Console
    from rich.logging import RichHandler

    level = logging.WARNING if quiet else logging.DEBUG if verbose >= 2 else logging.INFO
    logging.basicConfig(level=level, format="%(message)s", datefmt="[%X]", force=True,
                        handlers=[RichHandler(show_path=False, rich_tracebacks=False,
                                              console=Console(file=_log_stream(), width=160))])
    for noisy in ("onnxslim", "matplotlib", "PIL"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    _route_warnings(verbose)


def _log_stream():
    """The log's own handle on the terminal's stderr: a duplicate of file descriptor 2 taken now, so log lines still
    reach the user while TVM's native output on descriptor 2 is captured (:mod:`tvm_passes.native_log`)."""
    import os

    try:
        sys.stderr.flush()
        return os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
    except (OSError, ValueError):
        return sys.stderr


def _route_warnings(verbose: int) -> None:
    """Python warnings become one log line each (no source lines): hetpart's own at WARNING, third-party
    deprecation notices (torch, TVM) at DEBUG, other third-party warnings at INFO."""
    import warnings

    from hetpart.errors import DegeneratePlanWarning, ExtrapolationWarning

    ours = (DegeneratePlanWarning, ExtrapolationWarning)
    log_warnings = logging.getLogger("hetpart.warnings")

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if issubclass(category, ours):
            level = logging.WARNING
        elif issubclass(category, (DeprecationWarning, FutureWarning, PendingDeprecationWarning)):
            level = logging.DEBUG
        else:
            level = logging.INFO
        log_warnings.log(level, "%s: %s", category.__name__, message)

    warnings.showwarning = show
    if verbose < 2:
        warnings.filterwarnings("once")


def _fmt_count(value: float, unit: str = "") -> str:
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.2f} {prefix}{unit}"
    return f"{value:.0f} {unit}".rstrip()


# ------------------------------------------------------------------------------------------------ analyze
def cmd_analyze(args: argparse.Namespace) -> int:
    import numpy as np
    import scipy.sparse as sp
    from rich.table import Table

    from hetpart.driver import api

    graph = api.analyze(args.model, input_shapes=args.input_shape, batch=args.batch, size=args.size,
                        level=args.level, outputs=args.outputs)
    console = _console()
    table = Table(title=f"{graph.name}: {graph.num_ops} {graph.level}s", show_lines=False)
    for col in ("id", "name", "op", "output shape", "FLOPs", "read", "written", "params", "kernel", "inputs"):
        table.add_column(col, justify="right" if col in ("id", "FLOPs", "read", "written", "params", "kernel")
                         else "left")
    rows = graph.nodes if args.max_rows <= 0 else graph.nodes[:args.max_rows]
    for n in rows:
        table.add_row(str(n.id), n.name, n.op.removeprefix("relax."),
                      "x".join(map(str, n.output_shapes[0])) if n.output_shapes else "-",
                      _fmt_count(n.flops), _fmt_count(n.bytes_read, "B"), _fmt_count(n.bytes_written, "B"),
                      _fmt_count(n.param_bytes, "B"), "-" if n.kernel_group is None else str(n.kernel_group),
                      ",".join(map(str, n.inputs)) or ",".join(n.graph_inputs))
    console.print(table)
    if 0 < args.max_rows < graph.num_ops:
        console.print(f"... {graph.num_ops - args.max_rows} more rows (--max-rows 0 shows all)")
    by_op = Counter(n.op.removeprefix("relax.") for n in graph.nodes)
    console.print(f"[bold]totals[/bold]: {graph.num_ops} ops, {len(graph.edges)} edges, "
                  f"{len(graph.kernel_groups)} fused kernels, {_fmt_count(graph.total_flops, 'FLOP')} "
                  f"(multiply-add = 2 FLOPs), parameters {_fmt_count(graph.total_param_bytes, 'B')}")
    console.print("ops by type: " + ", ".join(f"{op} {c}" for op, c in by_op.most_common()))
    if args.json:
        graph.save(args.json)
        console.print(f"wrote {args.json}")
    if args.matrix:
        sp.save_npz(args.matrix, graph.dependency_matrix())
        console.print(f"wrote {args.matrix} (scipy.sparse CSR; A[i, j] = 1 iff op j reads op i's output)",
                      markup=False)
    if args.dense_matrix:
        np.save(args.dense_matrix, graph.dependency_matrix_dense())
        console.print(f"wrote {args.dense_matrix}")
    return 0


def _parse_pins(items: Sequence[str]) -> dict[str, str]:
    from hetpart.errors import PinError

    pins = {}
    for item in items:
        pattern, sep, device = item.rpartition("=")
        if not sep or not pattern or not device:
            raise PinError(f"--pin {item!r} must look like OP_NAME_OR_GLOB=DEVICE, e.g. --pin 'lv1*=cpu'")
        pins[pattern] = device
    return pins


def _partition_options(args: argparse.Namespace) -> dict[str, Any] | None:
    options: dict[str, Any] = {}
    if args.timeslice_segments:
        options["timeslice_segments"] = args.timeslice_segments
    if args.cross_device_sharing:
        options["cross_device_sharing"] = True
    return options or None


def cmd_compile(args: argparse.Namespace) -> int:
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from hetpart.driver import api
    from hetpart.driver.cli_run import made_for_task_runtime
    from hetpart.driver.report import summary

    out_dir = args.output or Path("hetpart-out") / Path(str(args.model)).stem
    if args.output is None:
        log.info("no -o given: writing %s", out_dir)
    console = _console()
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                  transient=True) as progress:
        task = progress.add_task("starting", total=None)
        compiled = api.compile(args.model, devices=args.devices, method=args.method, pins=_parse_pins(args.pin),
                               plan=args.plan, input_shapes=args.input_shape, batch=args.batch, size=args.size,
                               cpu_predictor=args.cpu_predictor, output_dir=out_dir, overwrite=args.force,
                               segments=args.segments, requests=args.requests, slice_steps=args.slice_steps,
                               rnn_projection=args.rnn_projection, outputs=args.outputs,
                               partition_options=_partition_options(args),
                               progress=lambda msg: (progress.update(task, description=msg), log.info("%s", msg)))
    s = summary(compiled._report_data())
    console.print(f"[bold]{s['model']}[/bold]: {s['method']} plan, predicted {s['makespan_us']:,.0f} µs per inference")
    for name, value in sorted(s["baselines_us"].items(), key=lambda kv: kv[1]):
        console.print(f"  {name:>8}: {value:>12,.0f} µs  ({value / s['makespan_us']:.2f}x the hetpart plan)")
    for device, row in s["per_device"].items():
        console.print(f"  {device}: {row['kernels']} kernels, {row['flops_share']:.1%} of FLOPs")
    shared = compiled.segments is not None and compiled.costs.devices.interchangeable_groups()
    in_flight = made_for_task_runtime(compiled.plan)
    console.print(_partition_verdict(s, shared_groups=shared or (), made_for=in_flight))
    if compiled.plan.method == "timeslice":      # its objective: many requests in flight
        console.print(f"  {compiled.plan.notes[0]}")
    console.print(f"  copies per inference: {s['copies']} ({s['copied_bytes'] / 1e6:.2f} MB, predicted)")
    if s.get("weight_upload_bytes"):
        count = "" if s.get("weight_uploads") is None else f"{s['weight_uploads']} weight tensors, "
        console.print(f"  uploaded once at load: {count}{s['weight_upload_bytes'] / 1e6:.2f} MB")
    if s["emulated"]:
        console.print("  [yellow]GPU EMULATED[/yellow]: no CUDA here; the executable's GPU part runs on the CPU")
    run = f"hetpart run {out_dir}"
    if compiled.segments is not None:
        run += f" --mode tasks{f' --requests {in_flight}' if in_flight else ''}"
    elif in_flight:
        console.print(f"  made for {in_flight} requests in flight on the task runtime: compile without --no-segments "
                      f"to build its segments, then `{run} --mode tasks --requests {in_flight}`")
    console.print(f"report: {out_dir / 'report.md'} (and report.html); run it with `{run}`")
    return 0


def _partition_verdict(s: dict, shared_groups: tuple[tuple[str, ...], ...] = (), made_for: int = 0) -> str:
    """One line: does the plan split the model, and what does that buy over the best single device.
    ``shared_groups``: the CPU core groups whose task-runtime workers share work (a compile with segments);
    ``made_for``: the requests in flight a plan was made for (its one-request figure is then not its objective)."""
    used = [d for d, row in s["per_device"].items() if row["kernels"]]
    singles = {k: v for k, v in s["baselines_us"].items() if k in ("all_cpu", "all_gpu")}
    if len(used) > 1 and singles:
        best = min(singles, key=singles.get)
        alone = f"{singles[best] / s['makespan_us']:.2f}x as fast as the best single device ({best})"
        if made_for:
            return (f"  [bold]the plan uses both devices[/bold], made for {made_for} requests in flight; one request "
                    f"alone is predicted {alone}")
        return f"  [bold]the plan uses both devices[/bold]: predicted {alone}"
    if len(used) > 1:
        return "  the plan uses both devices"
    group = next((g for g in shared_groups if used[0] in g), None)
    if group is not None:
        return (f"  the plan keeps every kernel on {used[0]}: with the task runtime (`hetpart run --mode tasks`) "
                f"requests in flight spread over {', '.join(group)}, which share work")
    if len(s["per_device"]) > 1:
        return (f"  the plan keeps every kernel on {used[0]}: splitting this model does not pay on these devices "
                "(copies would cost more than running branches side by side saves)")
    return f"  one device offered: every kernel runs on {used[0]}"


def cmd_zoo(args: argparse.Namespace) -> int:
    from rich.table import Table

    import models

    table = Table(title="model zoo")
    for col in ("name", "family", "kind", "default input", "--size is", "sizes", "published GMACs"):
        table.add_column(col)
    for name in sorted(models.ZOO):
        info = models.ZOO[name]
        sizes = (f"{info.min_size}-{info.max_size}" if info.max_size else f">= {info.min_size}") + \
            (f", multiples of {info.size_multiple}" if info.size_multiple > 1 else "")
        table.add_row(name, info.family, info.kind, "x".join(map(str, info.input_shape())), info.size_meaning, sizes,
                      "" if info.published_gmacs is None else f"{info.published_gmacs}")
    _console().print(table)
    return 0


# ------------------------------------------------------------------------------------------------ parser
def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer; found {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer; found {value}")
    return value


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="ONNX file or zoo model name (see `hetpart zoo`)")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=DIMS",
                   help="bind an input's shape, e.g. --input-shape input=1,3,224,224 (repeatable)")
    p.add_argument("--outputs", action="append", default=None, metavar="NAME[,NAME...]",
                   help="keep an ONNX model up to these tensors (node output names), e.g. before a detector's "
                   "NonMaxSuppression; the original file is not changed (repeatable)")
    p.add_argument("--batch", type=_positive_int, default=None, help="batch size for zoo models (default 1)")
    p.add_argument("--size", type=_positive_int, default=None,
                   help="input size for zoo models: what it sets depends on the model (image side, sequence length, "
                   "frames, ...; `hetpart zoo` lists it per model)")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hetpart")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    from hetpart.partition import DEFAULT_METHOD, METHODS

    parser = argparse.ArgumentParser(prog="hetpart", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more logging (-vv: debug, and every Python warning)")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors on stderr")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("analyze", help="per-op features, FLOPs, bytes and the dependency matrix of a model")
    _add_model_args(p)
    p.add_argument("--level", choices=("op", "kernel"), default="op", help="op level or fused-kernel level")
    p.add_argument("--json", type=Path, help="write the OpGraph as JSON")
    p.add_argument("--matrix", type=Path, help="write the dependency matrix (scipy.sparse .npz)")
    p.add_argument("--dense-matrix", type=Path, help="write the dependency matrix as a dense .npy (small graphs)")
    p.add_argument("--max-rows", type=int, default=60, help="rows of the per-op table to print (0 = all)")
    p.set_defaults(func=cmd_analyze)

    p = sub.add_parser("compile", help="plan a model across CPU and GPU and build one executable + report")
    _add_model_args(p)
    p.add_argument("--devices", default=None, help="cpu,gpu=<preset> (presets: p2200, t4, a100, rtx3090, "
                   "jetson-orin; gpu alone means p2200), cpu, or CPU devices on their own cores: cpu:0,cpu:1 "
                   "(cpu:N-M for a core range); default: the devices of --plan, else cpu,gpu")
    p.add_argument("--method", default=DEFAULT_METHOD, choices=sorted(METHODS), metavar="METHOD",
                   help=f"partitioner: {', '.join(sorted(METHODS))} (default {DEFAULT_METHOD}; milp and "
                   "exhaustive are exact and only for small graphs)")
    p.add_argument("--requests", type=_positive_int, default=None, help="timeslice, portfolio: requests in "
                   "flight whose simulated makespan the plan minimises, as the task runtime runs them (default 1)")
    p.add_argument("--slice-steps", type=_positive_int, default=None, help="timeslice: recurrence steps per time "
                   "slice (default 1); with --rnn-projection per_slice also the steps per input projection")
    p.add_argument("--rnn-projection", choices=("hoisted", "per_slice"), default=None, help="unroll ONNX RNNs with "
                   "one input projection over all steps (hoisted, the default) or one per --slice-steps steps")
    p.add_argument("--timeslice-segments", choices=("runtime", "slices"), default=None, help="timeslice: run the "
                   "plan on the task runtime as maximal one-device segments (runtime, the default) or as one segment "
                   "per time-slice task, which lets requests interleave at slice boundaries (slices; the scheduler "
                   "simulates both and keeps the better cut for this choice)")
    p.add_argument("--cross-device-sharing", action="store_true", help="timeslice, portfolio: plan for a task "
                   "runtime whose free device takes another device's ready segment when it is predicted to end it "
                   "sooner (request-level balancing inside the plan); --segments then builds every segment for "
                   "every device")
    p.add_argument("--pin", action="append", default=[], metavar="OP=DEVICE",
                   help="force ops (name, glob, or op:relax.nn.conv2d) onto a device (repeatable)")
    p.add_argument("--plan", type=Path, help="use this plan.json (e.g. an edited one) instead of planning")
    p.add_argument("--cpu-predictor", type=Path, help="CPU latency predictor JSON (default: the shipped one)")
    p.add_argument("-o", "--output", type=Path, help="output directory, new or empty (default hetpart-out/MODEL)")
    p.add_argument("--segments", action=argparse.BooleanOptionalAction, default=None, help="also build the plan's "
                   "segments for the task runtime (hetpart run --mode tasks; the GPU's segments are emulated on the "
                   "CPU where there is no CUDA). Default: built when the plan is made for it (timeslice or portfolio "
                   "with --requests > 1, or --cross-device-sharing)")
    p.add_argument("--force", action="store_true", help="replace an earlier hetpart output in the output directory "
                   "(files hetpart did not write are never deleted)")
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("zoo", help="list the built-in models (random weights, built on first use)")
    p.set_defaults(func=cmd_zoo)

    from hetpart.driver import cli_predictors, cli_run, cli_train, cli_tune  # profile / fit / evaluate; run; tune

    cli_run.register(sub, _positive_int)
    cli_train.register(sub, _positive_int)   # train-plan / train-run / train-calibrate
    cli_tune.register(sub, _add_model_args)
    cli_predictors.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    ensure_tvm_threads()   # before any subcommand loads TVM: profiles and deployments must use the same count
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.verbose, args.quiet)
    import contextlib

    from tvm_passes.native_log import native_output_to_log

    # TVM's C++ warnings go through the log (after the command, at their level); -vv shows them as they come
    capture = contextlib.nullcontext() if args.verbose >= 2 else native_output_to_log()
    try:
        with capture:
            return int(args.func(args) or 0)
    except HetpartError as exc:  # one line, typed: what must hold, what was found, the fix
        sys.stderr.write(f"hetpart: error: {type(exc).__name__}: {exc}\n")
        return 2
    except KeyboardInterrupt:
        log.error("interrupted")
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
