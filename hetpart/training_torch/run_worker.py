"""One process of a pipeline run: its stages of a training plan, built with ``torch.distributed.pipelining``.

Every process builds the whole model (identical seeded weights), traces it with
``pipeline(model, mb_args, split_spec={unit: SplitPoint.BEGINNING})`` at the plan's split points, and wraps the
traced modules of its own stages in ``PipelineStage`` (never ``Pipe.build_stage``, which breaks V-shaped
schedules in torch 2.13). It times every ``forward_one_chunk`` / ``backward_one_chunk`` (and
``backward_weight_one_chunk``) call of its stages and trains ``steps`` steps with SGD. :func:`train_stages` does
that in a process whose group is already initialised; :func:`worker_entry` is the local launcher's target (gloo,
result files in ``out_dir``), :mod:`hetpart.training_torch.torchrun_main` the ``torchrun`` one.
"""
from __future__ import annotations

import datetime
import json
import os
import statistics
import time
import traceback
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

SCHEDULE_CLASSES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B",
                    "interleaved_1f1b": "ScheduleInterleaved1F1B", "zero_bubble": "ScheduleInterleavedZeroBubble"}
SINGLE_STAGE_SCHEDULES = ("gpipe", "1f1b")


@dataclass(frozen=True)
class WorkerJob:
    """What every process needs (picklable: sent to spawned processes)."""

    plan: dict                  # TrainingPlanFile.to_dict()
    world: int
    port: int                   # the local launcher's gloo port (unused under torchrun: the environment has it)
    schedule: str               # a key of SCHEDULE_CLASSES
    rank_stages: tuple[tuple[int, ...], ...]   # per rank, its stage indices
    steps: int
    lr: float
    threads: int
    out_dir: str
    pg_timeout_s: float
    save_tensors: bool          # gradients after step 0 and final parameters, for the check
    device: str = "cpu"         # "cpu", or "cuda" (device LOCAL_RANK; under torchrun with NCCL)
    dtype: str = "float32"      # the model's and the inputs' floating-point type
    cuda_index: tuple[int, ...] = ()    # per rank, the GPU on its node (default: LOCAL_RANK)


def prepare_model(module: Any) -> Any:
    """Training mode, dropout off: each process would draw its own dropout masks, so neither the pipeline run nor
    the single-process reference would be reproducible."""
    from torch import nn

    module.train()
    for m in module.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            m.eval()
    return module


def _timed(fn: Callable, sink: list[float], sync: Callable[[], None] | None) -> Callable:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if sync:
            sync()
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            if sync:        # GPU kernels run asynchronously: time them to their end
                sync()
            sink.append(time.perf_counter() - t0)
    return wrapper


def worker_entry(rank: int, job: WorkerJob) -> None:
    """``torch.multiprocessing.start_processes`` target (gloo on 127.0.0.1:``job.port``): train, write
    ``rank<r>.json`` (an error too) and, for the check, ``rank<r>_tensors.pt``."""
    import torch
    import torch.distributed as dist

    out = Path(job.out_dir) / f"rank{rank}.json"
    try:
        started = time.perf_counter()
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(job.port))
        dist.init_process_group("gloo", rank=rank, world_size=job.world,
                                timeout=datetime.timedelta(seconds=job.pg_timeout_s))
        try:
            result, tensors = train_stages(rank, job, started)
        finally:
            dist.destroy_process_group()
    except BaseException as exc:
        out.write_text(json.dumps({"rank": rank, "error": f"{type(exc).__name__}: {exc}",
                                   "trace": traceback.format_exc().splitlines()[-8:]}))
        raise
    if tensors is not None:
        torch.save(tensors, Path(job.out_dir) / f"rank{rank}_tensors.pt")
    out.write_text(json.dumps(result))


def train_stages(rank: int, job: WorkerJob, started: float) -> tuple[dict[str, Any], dict | None]:
    """This rank's stages, trained ``job.steps`` steps in an initialised process group: the result (timings,
    losses on the last stage's rank) and, with ``save_tensors``, ``{"grads": step-0 gradients, "params": final
    parameters}`` on the CPU."""
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, SplitPoint, pipeline
    from torch.distributed.pipelining import schedules as torch_schedules

    from hetpart.training_torch.plan_file import TrainingPlanFile, make_loss

    warnings.filterwarnings("ignore", category=FutureWarning)     # the tracer's pytree deprecation notice
    torch.set_num_threads(job.threads)
    plan_file = TrainingPlanFile.from_dict(job.plan)
    plan, source = plan_file.plan, plan_file.source
    n_stages, n_mb = plan.num_stages, plan.microbatches
    my_stages = job.rank_stages[rank]
    if job.device == "cuda":
        index = job.cuda_index[rank] if job.cuda_index else int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
        sync = torch.cuda.synchronize
    else:
        device, sync = torch.device("cpu"), None
    phases = {"start_s": time.perf_counter() - started}
    torch.manual_seed(source.seed)
    model, example = source.build()
    model = prepare_model(model)
    with torch.no_grad():
        out_example = model(*example)
    real = getattr(torch, job.dtype)
    model = model.to(real)

    def cast(x: torch.Tensor) -> torch.Tensor:
        return x.to(real) if x.dtype.is_floating_point else x

    batches = [(tuple(cast(x) for x in inputs), cast(target)) for inputs, target in
               (source.batch_for_step(s, example, plan_file.loss, out_example) for s in range(job.steps))]
    mb_args = tuple(x[: source.batch // n_mb] for x in batches[0][0])
    pipe = pipeline(model, mb_args=mb_args,
                    split_spec={name: SplitPoint.BEGINNING for name in plan_file.split_points})
    if pipe.num_stages != n_stages:
        raise RuntimeError(f"the tracer made {pipe.num_stages} stages at split points "
                           f"{list(plan_file.split_points)}; the plan has {n_stages}")
    stages, params = [], []
    forward_s: dict[int, list[float]] = {s: [] for s in my_stages}
    backward_s: dict[int, list[float]] = {s: [] for s in my_stages}
    for s in my_stages:
        sub = pipe.get_stage_module(s).to(device)
        stage = PipelineStage(sub, s, n_stages, device)
        stage.forward_one_chunk = _timed(stage.forward_one_chunk, forward_s[s], sync)
        stage.backward_one_chunk = _timed(stage.backward_one_chunk, backward_s[s], sync)
        stage.backward_weight_one_chunk = _timed(stage.backward_weight_one_chunk, backward_s[s], sync)
        stages.append(stage)
        params += list(sub.named_parameters())
    cls = getattr(torch_schedules, SCHEDULE_CLASSES[job.schedule])
    schedule = cls(stages[0] if job.schedule in SINGLE_STAGE_SCHEDULES else stages, n_microbatches=n_mb,
                   loss_fn=make_loss(plan_file.loss))
    optimizer = torch.optim.SGD([p for _, p in params], lr=job.lr)
    phases["build_s"] = time.perf_counter() - started - phases["start_s"]
    has_first, has_last = 0 in my_stages, (n_stages - 1) in my_stages
    step_losses: list[float] = []
    step_s: list[float] = []
    per_step: list[tuple[dict[int, float], dict[int, float]]] = []
    tensors: dict | None = {} if job.save_tensors else None
    for step, (inputs, target) in enumerate(batches):
        for _, p in params:
            p.grad = None
        marks = {s: (len(forward_s[s]), len(backward_s[s])) for s in my_stages}
        dist.barrier()
        t0 = time.perf_counter()
        losses: list[torch.Tensor] = []
        kwargs = {"target": target.to(device), "losses": losses} if has_last else {}
        schedule.step(*(tuple(x.to(device) for x in inputs) if has_first else ()), **kwargs)
        if step == 0 and tensors is not None:
            tensors["grads"] = {n: p.grad.detach().to("cpu", torch.float32, copy=True) for n, p in params
                                if p.grad is not None}
        optimizer.step()
        if sync:
            sync()
        step_s.append(time.perf_counter() - t0)
        per_step.append(({s: sum(forward_s[s][marks[s][0]:]) / n_mb for s in my_stages},
                         {s: sum(backward_s[s][marks[s][1]:]) / n_mb for s in my_stages}))
        if has_last:
            step_losses.append(float(torch.stack(losses).detach().mean()))
    if tensors is not None:
        tensors["params"] = {n: p.detach().to("cpu", torch.float32, copy=True) for n, p in params}
    dist.barrier()
    phases["total_s"] = time.perf_counter() - started
    timed = per_step[1:] if job.steps > 1 else per_step     # the first step warms up (shape inference)
    result = {"rank": rank, "stages": list(my_stages), "pid": os.getpid(), "torch": torch.__version__,
              "device": str(device), "threads": torch.get_num_threads(), "step_s": step_s,
              "losses": step_losses if has_last else None,
              "forward_us": {str(s): statistics.median(f[s] for f, _ in timed) * 1e6 for s in my_stages},
              "backward_us": {str(s): statistics.median(b[s] for _, b in timed) * 1e6 for s in my_stages},
              "param_names": [n for n, _ in params], "phases": phases,
              "job": {k: v for k, v in asdict(job).items() if k != "plan"}}
    return result, tensors
