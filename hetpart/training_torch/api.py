"""``plan_training`` and ``run_training``: the Python API behind ``hetpart train-plan`` and ``hetpart train-run``.

    from hetpart.training_torch import plan_training, run_training
    planned = plan_training("squeezenet1_1", devices="cpu:2", microbatches=4, batch=16, size=64)
    planned.save("plan.json")
    report = run_training("plan.json", steps=3, check=True)
    report.check.ok, report.measured_imbalance, report.predicted_imbalance
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

from hetpart.threads import ensure_tvm_threads
from hetpart.training_torch.errors import TrainingPlanFileError
from hetpart.training_torch.plan_file import ModelSource, TrainingPlanFile, default_loss

log = logging.getLogger(__name__)

DEFAULT_METHOD = "antichain_dp"
DEFAULT_MICROBATCH_SIZE = 4


def plan_training(model: str, *, devices: str, microbatches: int = 8, schedule: str = "1f1b",
                  method: str = DEFAULT_METHOD, batch: int | None = None, size: int | None = None,
                  granularity: int = 1, ratios: str | Path | None = None, optimizer: str = "sgd",
                  replication: bool = False, loss: str | None = None, seed: int = 0, cpu_predictor: Any = None,
                  options: Mapping[str, Any] | None = None) -> TrainingPlanFile:
    """Plan pipeline training of ``model`` (a zoo name or ``"package.module:function"``) on ``devices`` (a
    cluster spec: ``gpu=a100x4``, ``cpu:2``, ...).

    ``batch`` is the mini-batch (default ``microbatches`` x 4); units are costed at one micro-batch. ``ratios``: a
    backward-ratio JSON (default: the table shipped with hetpart). ``replication=False`` keeps one device per stage
    (what the torch run executes). ``options`` go to the partitioner's config (e.g. ``allow_fewer_devices``)."""
    ensure_tvm_threads()
    from hetpart.training import Cluster, get_method
    from hetpart.training.cost_model import BackwardRatios
    from hetpart.training_torch.unit_costs import build_unit_graph

    cluster = Cluster.parse(devices)
    batch = batch or microbatches * DEFAULT_MICROBATCH_SIZE
    if batch % microbatches:
        raise TrainingPlanFileError(f"the batch of {batch} does not split into {microbatches} equal micro-batches; "
                                    "pick a batch that is a multiple of --microbatches")
    source = ModelSource(model, batch, size, seed).validate()
    get_method(method)                  # an unknown method fails before the model is imported
    module, example = source.build(batch // microbatches)
    backward = BackwardRatios.load(ratios) if ratios else None
    units = build_unit_graph(module, example, cluster, granularity=granularity, ratios=backward,
                             optimizer=optimizer, cpu_predictor=cpu_predictor, name=_display_name(model))
    return plan_from_units(units, source, method=method, microbatches=microbatches, schedule=schedule,
                           replication=replication, loss=loss, granularity=granularity, options=options)


def plan_from_units(units: Any, source: ModelSource, *, method: str = DEFAULT_METHOD, microbatches: int = 8,
                    schedule: str = "1f1b", replication: bool = False, loss: str | None = None,
                    granularity: int = 1, options: Mapping[str, Any] | None = None) -> TrainingPlanFile:
    """Plan on an already costed :class:`~hetpart.training_torch.unit_costs.UnitGraph` (e.g. one reused for
    another cluster with ``units.with_cluster(...)``)."""
    from hetpart.training import get_method

    if source.batch % microbatches or source.batch // microbatches != units.microbatch_size:
        raise TrainingPlanFileError(f"the units were costed at micro-batches of {units.microbatch_size}; a batch of "
                                    f"{source.batch} in {microbatches} micro-batches does not match")
    config = {"microbatches": microbatches, "schedule": schedule, "replication": replication, **dict(options or {})}
    plan = units.name_stages(get_method(method)(units.graph, units.train_costs, units.cluster, config))
    out = units.graph.outputs[-1]
    planned = TrainingPlanFile(source=source, plan=plan, graph=units.graph, train_costs=units.train_costs,
                               split_points=tuple(units.split_points(plan)),
                               loss=loss or default_loss(out.shape, out.dtype), granularity=granularity,
                               notes=tuple(units.notes) + tuple(plan.notes))
    log.info("planned %s: %d stages (%s), bottleneck %.1f us per micro-batch", source.model, plan.num_stages,
             " | ".join(",".join(s.unit_names) for s in plan.stages), plan.bottleneck_us)
    return planned.validate()


def _display_name(model: str) -> str:
    return model.rpartition(":")[2] if ":" in model else model


def run_training(plan: TrainingPlanFile | str | Path, *, steps: int = 3, check: bool = False, lr: float = 0.01,
                 schedule: str | None = None, tolerance: float | None = None, threads: int = 1,
                 timeout_s: float = 600.0, dtype: str = "float32"):
    """Run a training plan on this host (one gloo process per rank; see :mod:`hetpart.training_torch.run`) and
    return its :class:`~hetpart.training_torch.run.RunReport`. ``dtype="float64"`` makes ``check`` exact (the
    float32 rounding of large gradient reductions can exceed 1e-5 on realistic input sizes)."""
    from hetpart.training_torch.run import DEFAULT_TOLERANCE, run_plan

    plan_file = plan if isinstance(plan, TrainingPlanFile) else TrainingPlanFile.load(plan)
    return run_plan(plan_file, steps=steps, lr=lr, schedule=schedule, check=check,
                    tolerance=DEFAULT_TOLERANCE if tolerance is None else tolerance, threads=threads,
                    timeout_s=timeout_s, dtype=dtype)
