"""``hetpart train-plan | train-run | train-calibrate``: pipeline training plans for torch models, real runs of them
on this host, and the backward/forward ratio table. A thin layer over :mod:`hetpart.training_torch`;
``register(subparsers, positive_int)`` adds the three subcommands. torch is imported only when one of them runs,
so ``hetpart --help`` stays fast."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable

from hetpart.driver.console import console as _console

SCHEDULE_CHOICES = ("gpipe", "1f1b", "interleaved_1f1b", "zero_bubble")


def _kib(n: float) -> str:
    return f"{n / 1024:,.1f} KiB" if n < 1024 ** 2 else f"{n / 1024 ** 2:,.2f} MiB"


def cmd_train_plan(args: argparse.Namespace) -> int:
    from rich.table import Table

    from hetpart.training_torch.api import plan_training

    options = {} if args.all_devices is None else {"allow_fewer_devices": not args.all_devices}
    planned = plan_training(args.model, devices=args.devices, microbatches=args.microbatches,
                            schedule=args.schedule, method=args.method, batch=args.batch, size=args.size,
                            granularity=args.granularity, ratios=args.ratios, optimizer=args.optimizer,
                            replication=args.allow_replication, loss=args.loss, options=options)
    plan = planned.plan
    console = _console()
    table = Table(title=f"{plan.model}: {plan.num_stages} stages ({plan.method}, {plan.schedule}, "
                        f"{plan.microbatches} micro-batches of {planned.microbatch_size})")
    for col in ("stage", "devices", "units", "forward µs", "backward µs", "params", "sends"):
        table.add_column(col, justify="right" if col not in ("devices", "units") else "left")
    for s in plan.stages:
        units = ", ".join(s.unit_names) if len(s.unit_names) <= 4 else \
            f"{s.unit_names[0]} … {s.unit_names[-1]} ({len(s.unit_names)} units)"
        table.add_row(str(s.index), ",".join(s.devices), units, f"{s.forward_us:,.1f}", f"{s.backward_us:,.1f}",
                      _kib(s.param_bytes), _kib(s.send_bytes))
    console.print(table)
    console.print(f"predicted: bottleneck {plan.bottleneck_us:,.1f} µs per micro-batch, iteration "
                  f"{plan.iteration_us:,.1f} µs, bubble {plan.bubble_fraction:.1%}; forward costs "
                  f"{plan.costs_source.get('forward')}, backward ratios {plan.costs_source.get('backward')}")
    console.print(f"split points (SplitPoint.BEGINNING): {', '.join(planned.split_points) or 'none (one stage)'}; "
                  f"loss {planned.loss}")
    for note in planned.notes:
        console.print(f"  note: {note}", markup=False)
    planned.save(args.output)
    console.print(f"wrote {args.output}; run it here (one CPU process per stage) with `hetpart train-run "
                  f"{args.output} --steps 3 --check`")
    if any(d.kind == "gpu" for d in plan.cluster.devices):
        console.print(f"on {len(plan.devices_used)} GPUs: `torchrun --nproc-per-node {len(plan.devices_used)} -m "
                      f"hetpart.training_torch.torchrun_main {args.output} --backend nccl --device cuda` "
                      "(docs/training_run.md)")
    return 0


def cmd_train_run(args: argparse.Namespace) -> int:
    from hetpart.training_torch.api import run_training

    report = run_training(args.plan, steps=args.steps, check=args.check, lr=args.lr, schedule=args.schedule,
                          tolerance=args.tolerance, timeout_s=args.timeout, dtype=args.dtype)
    return print_run_report(report)


def print_run_report(report: Any) -> int:
    """Losses per step, per-stage measured vs predicted times, the imbalance and the check; the exit status (1 when
    the check found a difference). Shared with the ``torchrun`` entry point."""
    from rich.table import Table

    console = _console()
    console.print(f"{report.model}: {report.steps} SGD steps, schedule {report.schedule}, {report.world} "
                  f"process(es) x {report.threads_per_rank} torch thread(s), batch {report.batch} in "
                  f"{report.microbatches} micro-batches (torch {report.torch_version})")
    for k, (loss, seconds) in enumerate(zip(report.losses, report.step_s)):
        console.print(f"  step {k}: loss {loss:.6f}  ({seconds * 1e3:,.1f} ms)")
    table = Table(title="per stage, per micro-batch: measured (torch, this run) vs predicted (hetpart)")
    for col in ("stage", "rank", "units", "fwd meas. µs", "bwd meas. µs", "fwd pred. µs", "bwd pred. µs",
                "share meas.", "share pred."):
        table.add_column(col, justify="left" if col == "units" else "right")
    for s, (m_share, p_share) in zip(report.stages, report.shares()):
        units = f"{s.units[0]} … {s.units[-1]}" if len(s.units) > 2 else ", ".join(s.units)
        table.add_row(str(s.index), str(s.rank), units, f"{s.measured_forward_us:,.0f}",
                      f"{s.measured_backward_us:,.0f}", f"{s.predicted_forward_us:,.0f}",
                      f"{s.predicted_backward_us:,.0f}", f"{m_share:.1%}", f"{p_share:.1%}")
    console.print(table)
    load = f"; host load average {report.load_average_1min[0]} -> {report.load_average_1min[-1]}" \
        if report.load_average_1min else ""
    console.print(f"stage-time imbalance (max / mean of forward + backward): measured "
                  f"{report.measured_imbalance:.3f}, predicted {report.predicted_imbalance:.3f}{load}")
    if report.check is None:
        return 0
    c = report.check
    verdict = "[green]equal[/green]" if c.ok else "[red]DIFFERENT[/red]"
    console.print(f"check: the {c.pipeline_dtype} pipeline vs one process in float64 ({c.params_compared} "
                  f"parameters): {verdict}; max |Δloss| {c.loss_max_abs_diff:.2e} (allowed {c.bound('loss'):.1e}), "
                  f"max |Δgrad| (step 0) {c.grad_max_abs_diff:.2e} (allowed {c.bound('grad'):.1e}), max |Δparam| "
                  f"(after step {report.steps - 1}) {c.param_max_abs_diff:.2e} (allowed {c.bound('param'):.1e})")
    console.print(f"  the same single process in float32 is itself off float64 by: loss "
                  f"{c.float32_reference_loss_diff:.2e}, grad {c.float32_reference_grad_diff:.2e}, param "
                  f"{c.float32_reference_param_diff:.2e} (a float32 run may differ by the larger of --tolerance "
                  f"{c.tolerance:g} and twice these; --dtype float64 checks against --tolerance alone)")
    return 0 if c.ok else 1


def cmd_train_calibrate(args: argparse.Namespace) -> int:
    from rich.table import Table

    from hetpart.training_torch.backward_calibration import measure_backward_ratios

    result = measure_backward_ratios(repeats=args.repeats, rounds=args.rounds, threads=args.threads)
    table = Table(title=f"backward / forward time per op kind ({result.source})")
    for col in ("kind", "case", "forward µs", "backward µs", "ratio", "ratio per round"):
        table.add_column(col, justify="left" if col in ("kind", "case") else "right")
    for c in result.cases:
        table.add_row(c.kind, c.name, f"{c.forward_us:,.0f}", f"{c.backward_us:,.0f}", f"{c.ratio:.2f}",
                      " ".join(f"{r:.2f}" for r in c.round_ratios))
    console = _console()
    console.print(table)
    console.print("per kind: " + ", ".join(f"{k} {v:.2f}" for k, v in result.kind_ratio.items())
                  + f"; default {result.default_ratio:.2f}")
    result.save(args.output)
    console.print(f"wrote {args.output}; plan with it: hetpart train-plan MODEL ... --ratios {args.output}")
    return 0


def register(sub: Any, positive_int: Callable[[str], int]) -> None:
    """Add ``train-plan``, ``train-run`` and ``train-calibrate`` to hetpart's subcommands."""
    p = sub.add_parser("train-plan", help="split a torch model into pipeline-training stages over devices")
    p.add_argument("model", help="zoo model with a PyTorch module (see `hetpart zoo`), or package.module:function")
    p.add_argument("--devices", required=True, help="cluster: gpu=a100x4 | gpu=t4x2,gpu=a100x2 | cpu:2 (processes on "
                   "this host) [,link=nvlink|pcie|loopback|ethernet|infiniband] [,per_node=N]")
    p.add_argument("--microbatches", type=positive_int, default=8, help="micro-batches per step (default 8)")
    p.add_argument("--schedule", choices=SCHEDULE_CHOICES, default="1f1b", help="pipeline schedule (default 1f1b)")
    p.add_argument("--method", default="antichain_dp", help="training partitioner: pipedream_dp, antichain_dp, "
                   "hetero, gropipe, uniform_ops, uniform_params, balance_time, data_parallel (default antichain_dp)")
    p.add_argument("--batch", type=positive_int, default=None, help="samples per step (default 4 x --microbatches)")
    p.add_argument("--size", type=positive_int, default=None, help="zoo input size (image side or sequence length)")
    p.add_argument("--granularity", type=positive_int, default=1, help="unit depth: 1 = the model's blocks / layers "
                   "(default), 2 = their children, ...")
    p.add_argument("--ratios", type=Path, default=None, help="backward/forward ratio JSON (default: the table "
                   "shipped with hetpart; `hetpart train-calibrate` measures one)")
    p.add_argument("--optimizer", choices=("sgd", "momentum", "adam"), default="sgd",
                   help="optimizer state in the memory model (default sgd, what train-run uses)")
    p.add_argument("--loss", choices=("cross_entropy", "mse"), default=None,
                   help="loss of the run (default: cross_entropy for a [batch, classes] output, else mse)")
    p.add_argument("--allow-replication", action="store_true", help="let stages run on several devices (data "
                   "parallel inside a stage; train-run cannot execute such plans)")
    p.add_argument("--all-devices", action="store_true", default=None,
                   help="use every device of the cluster (default: the planner may leave some idle)")
    p.add_argument("-o", "--output", type=Path, required=True, help="the plan file to write (JSON)")
    p.set_defaults(func=cmd_train_plan)

    p = sub.add_parser("train-run", help="run a training plan on this host: one gloo process per stage")
    p.add_argument("plan", type=Path, help="a plan file written by `hetpart train-plan`")
    p.add_argument("--steps", type=positive_int, default=3, help="SGD steps (default 3; the first is not timed)")
    p.add_argument("--check", action="store_true", help="compare loss, gradients and parameters with one process "
                   "training the whole model (float64); exit 1 if they differ by more than --tolerance")
    p.add_argument("--tolerance", type=float, default=1e-5, help="absolute tolerance of --check (default 1e-5)")
    p.add_argument("--lr", type=float, default=0.01, help="SGD learning rate (default 0.01)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="the run's floating-point "
                   "type; float64 makes --check exact (float32 gradient sums can differ by more than 1e-5)")
    p.add_argument("--schedule", choices=SCHEDULE_CHOICES, default=None,
                   help="run under another schedule than the plan's")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before the run is stopped (default 600)")
    p.set_defaults(func=cmd_train_run)

    p = sub.add_parser("train-calibrate", help="measure backward/forward time per op kind with torch on this CPU")
    p.add_argument("-o", "--output", type=Path, required=True, help="the ratio table to write (JSON)")
    p.add_argument("--rounds", type=positive_int, default=5, help="round-robin passes over the cases (default 5)")
    p.add_argument("--repeats", type=positive_int, default=21, help="timed passes per case and round (default 21)")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads (default 1, as one pipeline "
                   "stage process uses)")
    p.set_defaults(func=cmd_train_calibrate)
