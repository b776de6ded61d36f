"""Run a training plan for real: one process per pipeline rank on this host (gloo, CPU, ``torch.multiprocessing``
spawn, one torch thread each), ``steps`` SGD steps under a ``torch.distributed.pipelining`` schedule, each stage's
forward and backward time per micro-batch measured and set against the plan's prediction, and optionally the loss
and every gradient compared with one process training the whole model on the whole batch (in float64).

What the check can and cannot show: with equal micro-batches, a mean loss per micro-batch and torch's default
``scale_grads=True``, the pipeline's gradient is the full-batch gradient, so loss, gradients (after step 1) and
parameters (after the last step) must agree to float rounding. BatchNorm breaks this on purpose: in training mode
it normalises with the statistics of each micro-batch, not of the full batch. Dropout is switched off in both runs
(each process would draw its own masks).

Predicted times are hetpart's (TVM kernels on the CPU predictor, or a GPU datasheet roofline) and the measured ones
are torch's eager CPU kernels, so absolute levels differ; what the run tests is the *balance*: each stage's share
of the total time, measured vs predicted, and the imbalance max(stage time) / mean(stage time).
"""
from __future__ import annotations

import json
import logging
import math
import os
import socket
import statistics
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from hetpart.training_torch.errors import PipelineRunError, TrainingPlanFileError
from hetpart.training_torch.plan_file import TrainingPlanFile, make_loss
from hetpart.training_torch.run_worker import SCHEDULE_CLASSES, SINGLE_STAGE_SCHEDULES, WorkerJob, prepare_model

log = logging.getLogger(__name__)

DEFAULT_TOLERANCE = 1e-5
DTYPES = ("float32", "float64")
FLOAT32_NOISE_FACTOR = 2.0     # a float32 run may differ from float64 by this many times the float32 reference's error


@dataclass(frozen=True)
class StageTiming:
    """One stage: measured (median over the timed steps of the mean per micro-batch) and predicted µs."""

    index: int
    rank: int
    device: str
    units: tuple[str, ...]
    measured_forward_us: float
    measured_backward_us: float
    predicted_forward_us: float
    predicted_backward_us: float

    @property
    def measured_us(self) -> float:
        return self.measured_forward_us + self.measured_backward_us

    @property
    def predicted_us(self) -> float:
        return self.predicted_forward_us + self.predicted_backward_us


@dataclass(frozen=True)
class CheckResult:
    """The pipeline run (float32) against one process training the whole model on the whole batch with the same
    data and SGD in float64: largest absolute differences. The float64 reference carries no float32 rounding of
    its own; the ``float32_reference_*`` fields say how far the same single-process run in float32 is from it
    (torch's float32 weight-gradient reduction over a whole batch can be further off than the pipeline's
    micro-batched one)."""

    loss_max_abs_diff: float
    grad_max_abs_diff: float           # gradients after the first step
    param_max_abs_diff: float          # parameters after the last step
    reference_losses: tuple[float, ...]
    params_compared: int
    tolerance: float
    float32_reference_grad_diff: float = float("nan")
    float32_reference_loss_diff: float = float("nan")
    float32_reference_param_diff: float = float("nan")
    pipeline_dtype: str = "float32"

    def bound(self, what: str) -> float:
        """The allowed difference: ``tolerance``; for a float32 pipeline, twice the float32 single-process run's own
        distance from float64 when that is larger (two float32 computations summing in different orders are about
        equally far from the exact result; a partitioning error is of the order of the gradients themselves)."""
        floor = getattr(self, f"float32_reference_{what}_diff") if self.pipeline_dtype == "float32" else 0.0
        return self.tolerance if math.isnan(floor) else max(self.tolerance, FLOAT32_NOISE_FACTOR * floor)

    @property
    def ok(self) -> bool:
        return (self.loss_max_abs_diff <= self.bound("loss") and self.grad_max_abs_diff <= self.bound("grad")
                and self.param_max_abs_diff <= self.bound("param"))


@dataclass(frozen=True)
class RunReport:
    model: str
    schedule: str
    world: int
    microbatches: int
    batch: int
    steps: int
    losses: tuple[float, ...]                 # per step: the mean of the micro-batch losses
    step_s: tuple[float, ...]                 # per step, the slowest rank's wall time
    stages: tuple[StageTiming, ...]
    torch_version: str
    threads_per_rank: int
    check: CheckResult | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    load_average_1min: tuple[float, ...] = ()   # the host's load when the run started and ended (busy or quiet)

    @staticmethod
    def imbalance(values: Sequence[float]) -> float:
        """max / mean (1.0 = perfectly balanced)."""
        return max(values) / statistics.fmean(values) if values and statistics.fmean(values) > 0 else float("nan")

    @property
    def measured_imbalance(self) -> float:
        return self.imbalance([s.measured_us for s in self.stages])

    @property
    def predicted_imbalance(self) -> float:
        return self.imbalance([s.predicted_us for s in self.stages])

    def shares(self) -> list[tuple[float, float]]:
        """Per stage (measured share, predicted share) of the summed stage time."""
        m, p = sum(s.measured_us for s in self.stages), sum(s.predicted_us for s in self.stages)
        return [(s.measured_us / m if m else float("nan"), s.predicted_us / p if p else float("nan"))
                for s in self.stages]

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        out = asdict(self)
        out["measured_imbalance"], out["predicted_imbalance"] = self.measured_imbalance, self.predicted_imbalance
        out["shares"] = self.shares()
        if self.check is not None:
            out["check"]["ok"] = self.check.ok
        return out


# ------------------------------------------------------------------------------------------------ layout
def rank_layout(plan_file: TrainingPlanFile, schedule: str) -> tuple[list[str], list[tuple[int, ...]]]:
    """Ranks (one per device the plan uses, in the order of their first stage: rank r holds stage r) and each
    rank's stages; refuses what torch's schedules cannot run."""
    plan = plan_file.plan
    if schedule not in SCHEDULE_CLASSES:
        raise TrainingPlanFileError(f"schedule must be one of {sorted(SCHEDULE_CLASSES)}; found {schedule!r}")
    replicated = [s.index for s in plan.stages if s.replicas > 1]
    if replicated or plan.groups > 1:
        raise TrainingPlanFileError(
            f"stages {replicated} are replicated (data parallel inside a stage, groups={plan.groups}); the torch run "
            "executes one replica per stage. Re-plan without replication (the default of `hetpart train-plan`)")
    devices = list(dict.fromkeys(s.devices[0] for s in plan.stages))
    rank_stages = [tuple(s.index for s in plan.stages if s.devices[0] == d) for d in devices]
    world = len(devices)
    if schedule in SINGLE_STAGE_SCHEDULES and any(len(r) != 1 for r in rank_stages):
        raise TrainingPlanFileError(f"{schedule} runs one stage per rank; this plan puts stages {rank_stages} on "
                                    f"{devices}. Use --schedule interleaved_1f1b for several stages per rank")
    if schedule not in SINGLE_STAGE_SCHEDULES:
        loop = [tuple(range(r, plan.num_stages, world)) for r in range(world)]
        if rank_stages != loop:
            raise TrainingPlanFileError(f"{schedule} needs stage s on rank s % {world} (torch's loop layout); this "
                                        f"plan has {rank_stages}")
    if schedule in ("1f1b",) and plan.microbatches < plan.num_stages:
        raise TrainingPlanFileError(f"torch's Schedule1F1B needs at least as many micro-batches as stages; the "
                                    f"plan has {plan.microbatches} for {plan.num_stages} stages")
    return devices, rank_stages


def _load_average() -> float:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return float("nan")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------------------------------------ running
def run_plan(plan_file: TrainingPlanFile, *, steps: int = 3, lr: float = 0.01, schedule: str | None = None,
             check: bool = False, tolerance: float = DEFAULT_TOLERANCE, threads: int = 1,
             timeout_s: float = 600.0, dtype: str = "float32") -> RunReport:
    """Train ``steps`` steps of ``plan_file`` on this host, one process per rank (see the module docstring);
    ``dtype="float64"`` runs the pipeline in double precision (for an exact check, not for timing)."""
    import torch
    import torch.multiprocessing as mp

    if dtype not in DTYPES:
        raise TrainingPlanFileError(f"dtype must be one of {DTYPES}; found {dtype!r}")
    if steps < 1 or threads < 1 or lr <= 0:
        raise TrainingPlanFileError(f"steps and threads must be >= 1 and lr > 0; found {steps}, {threads}, {lr}")
    plan_file.validate()
    if plan_file.source.batch_dim != 0:
        raise TrainingPlanFileError(f"{plan_file.source.model} takes its batch in input dimension "
                                    f"{plan_file.source.batch_dim}; torch's pipeline schedules cut micro-batches along "
                                    "dimension 0, so this model can be planned but not run")
    load_before = _load_average()
    schedule = schedule or plan_file.plan.schedule
    devices, rank_stages = rank_layout(plan_file, schedule)
    with tempfile.TemporaryDirectory(prefix="hetpart-train-run-") as out_dir:
        job = WorkerJob(plan=plan_file.to_dict(), world=len(devices), port=free_port(), schedule=schedule,
                        rank_stages=tuple(rank_stages), steps=steps, lr=lr, threads=threads, out_dir=out_dir,
                        pg_timeout_s=min(timeout_s, 300.0), save_tensors=check, dtype=dtype)
        log.info("starting %d process(es) (gloo on 127.0.0.1:%d), schedule %s, stages per rank %s", job.world,
                 job.port, schedule, rank_stages)
        from hetpart.training_torch.run_worker import worker_entry

        started = time.perf_counter()
        context = mp.start_processes(worker_entry, args=(job,), nprocs=job.world, join=False, start_method="spawn")
        _wait(context, timeout_s, Path(out_dir))
        log.info("the %d process(es) finished in %.1f s", job.world, time.perf_counter() - started)
        results = [json.loads((Path(out_dir) / f"rank{r}.json").read_text()) for r in range(job.world)]
        for r in results:
            log.debug("rank %d: %s", r["rank"], ", ".join(f"{k} {v:.1f}" for k, v in r["phases"].items()))
        started = time.perf_counter()
        tensors = {r: torch.load(Path(out_dir) / f"rank{r}_tensors.pt") for r in range(job.world)} if check else {}
        result_check = None
        if check:
            result_check = check_against_one_process(plan_file, results, tensors, steps, lr, tolerance, dtype)
        if check:
            log.info("single-process reference and comparison: %.1f s", time.perf_counter() - started)
    return replace(build_report(plan_file, schedule, devices, results, steps, threads, result_check,
                                torch.__version__), load_average_1min=(load_before, _load_average()))


def _wait(context: Any, timeout_s: float, out_dir: Path) -> None:
    deadline = time.monotonic() + timeout_s
    try:
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                for p in context.processes:
                    if p.is_alive():
                        p.kill()
                raise PipelineRunError(f"the pipeline run did not finish within {timeout_s:.0f} s; its processes "
                                       "were stopped")
    except PipelineRunError:
        raise
    except Exception as exc:   # torch.multiprocessing.ProcessRaisedException / ProcessExitedException
        errors = []
        for path in sorted(out_dir.glob("rank*.json")):
            data = json.loads(path.read_text())
            if data.get("error"):
                errors.append(f"rank {data['rank']}: {data['error']}")
        detail = "; ".join(errors) or str(exc).strip().splitlines()[-1]
        raise PipelineRunError(f"the pipeline run failed: {detail}") from exc


def build_report(plan_file: TrainingPlanFile, schedule: str, devices: list[str], results: list[dict], steps: int,
            threads: int, check: CheckResult | None, torch_version: str) -> RunReport:
    plan = plan_file.plan
    by_stage: dict[int, tuple[int, float, float]] = {}
    for r in results:
        for s in r["stages"]:
            by_stage[s] = (r["rank"], r["forward_us"][str(s)], r["backward_us"][str(s)])
    stages = tuple(StageTiming(index=st.index, rank=by_stage[st.index][0], device=st.devices[0],
                               units=st.unit_names, measured_forward_us=by_stage[st.index][1],
                               measured_backward_us=by_stage[st.index][2], predicted_forward_us=st.forward_us,
                               predicted_backward_us=st.backward_us) for st in plan.stages)
    last = next(r for r in results if (plan.num_stages - 1) in r["stages"])
    step_s = tuple(max(r["step_s"][k] for r in results) for k in range(steps))
    notes = [f"{threads} torch thread(s) per process, {len(devices)} process(es) on {plan_file.plan.cluster.spec}",
             "predicted: hetpart's costs (TVM kernels / datasheet roofline); measured: torch eager kernels"]
    return RunReport(model=plan.model, schedule=schedule, world=len(devices), microbatches=plan.microbatches,
                     batch=plan_file.source.batch, steps=steps, losses=tuple(last["losses"]), step_s=step_s,
                     stages=stages, torch_version=torch_version, threads_per_rank=threads, check=check,
                     notes=tuple(notes))


# ------------------------------------------------------------------------------------------------ reference
def reference_run(plan_file: TrainingPlanFile, steps: int, lr: float,
                  dtype: str = "float64") -> tuple[list[float], dict, dict]:
    """One process, the whole model and batch, the same data and SGD, in ``dtype``: losses per step, gradients
    after step 1 and final parameters (as float32)."""
    import torch

    source = plan_file.source
    torch.manual_seed(source.seed)
    model, example = source.build()
    model = prepare_model(model)
    with torch.no_grad():
        out_example = model(*example)
    real = getattr(torch, dtype)
    model = model.to(real)
    loss_fn = make_loss(plan_file.loss)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses, grads = [], {}
    for step in range(steps):
        inputs, target = source.batch_for_step(step, example, plan_file.loss, out_example)
        inputs = tuple(x.to(real) if x.dtype.is_floating_point else x for x in inputs)
        target = target.to(real) if target.dtype.is_floating_point else target
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(*inputs), target)
        loss.backward()
        if step == 0:
            grads = {n: p.grad.detach().float() for n, p in model.named_parameters() if p.grad is not None}
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses, grads, {n: p.detach().float() for n, p in model.named_parameters()}


def match_name(name: str, reference: Mapping[str, Any]) -> str | None:
    """The model's parameter name for a (possibly '.'-to-'_' mangled) stage-module parameter name."""
    if name in reference:
        return name
    squashed = name.replace("_", ".")
    hits = [r for r in reference if r.replace("_", ".") == squashed]
    return hits[0] if len(hits) == 1 else None


def check_against_one_process(plan_file: TrainingPlanFile, results: list[dict], tensors: Mapping[int, dict],
                              steps: int, lr: float, tolerance: float, dtype: str = "float32") -> CheckResult:
    """Compare every rank's losses, step-0 gradients and final parameters (``tensors[rank]``) with
    :func:`reference_run` in float64; the float32 single-process run's own distance from it is recorded too."""
    ref_losses, ref_grads, ref_params = reference_run(plan_file, steps, lr, "float64")
    f32_losses, f32_grads, f32_params = reference_run(plan_file, steps, lr, "float32")
    f32_grad_diff = max(float((f32_grads[n] - g).abs().max()) for n, g in ref_grads.items())
    f32_param_diff = max(float((f32_params[n] - p).abs().max()) for n, p in ref_params.items())
    last = next(r for r in results if (plan_file.plan.num_stages - 1) in r["stages"])
    loss_diff = max(abs(a - b) for a, b in zip(last["losses"], ref_losses))
    grad_diff = param_diff = 0.0
    seen: set[str] = set()
    for r in results:
        grads, params = tensors[r["rank"]]["grads"], tensors[r["rank"]]["params"]
        for name, value in params.items():
            original = match_name(name, ref_params)
            if original is None or original in seen:
                raise PipelineRunError(f"stage parameter {name!r} of rank {r['rank']} matches no parameter of the "
                                       "model, or one already compared")
            seen.add(original)
            param_diff = max(param_diff, float((value - ref_params[original]).abs().max()))
            if name in grads:
                grad_diff = max(grad_diff, float((grads[name] - ref_grads[original]).abs().max()))
            elif original in ref_grads:
                raise PipelineRunError(f"parameter {original!r} got a gradient in one process but none in the "
                                       "pipeline")
    missing = sorted(set(ref_params) - seen)
    if missing:
        raise PipelineRunError(f"{len(missing)} parameters of the model are in no pipeline stage, e.g. {missing[:3]}")
    return CheckResult(loss_max_abs_diff=loss_diff, grad_max_abs_diff=grad_diff, param_max_abs_diff=param_diff,
                       reference_losses=tuple(ref_losses), params_compared=len(seen), tolerance=tolerance,
                       float32_reference_grad_diff=f32_grad_diff, float32_reference_param_diff=f32_param_diff,
                       float32_reference_loss_diff=max(abs(a - b) for a, b in zip(f32_losses, ref_losses)),
                       pipeline_dtype=dtype)
