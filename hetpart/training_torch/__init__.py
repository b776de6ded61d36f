"""The torch side of training partitioning: a PyTorch model as module units costed by hetpart
(:mod:`~hetpart.training_torch.units`), measured backward/forward ratios
(:mod:`~hetpart.training_torch.backward_calibration`), and real pipeline runs of a StagePlan with
``torch.distributed.pipelining`` (:mod:`~hetpart.training_torch.run`).

    from hetpart.training_torch import plan_training, run_training
    planned = plan_training("squeezenet1_1", devices="cpu:2", microbatches=4, batch=16, size=64)
    planned.save("plan.json")
    report = run_training("plan.json", steps=3, check=True)

The functions are resolved lazily: importing this package does not import torch or TVM.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "plan_training": "hetpart.training_torch.api",
    "run_training": "hetpart.training_torch.api",
    "plan_from_units": "hetpart.training_torch.api",
    "TrainingPlanFile": "hetpart.training_torch.plan_file",
    "ModelSource": "hetpart.training_torch.plan_file",
    "UnitGraph": "hetpart.training_torch.unit_costs",
    "build_unit_graph": "hetpart.training_torch.unit_costs",
    "measure_backward_ratios": "hetpart.training_torch.backward_calibration",
    "load_ratios": "hetpart.training_torch.backward_calibration",
}

__all__ = ["ModelSource", "TrainingPlanFile", "UnitGraph", "build_unit_graph", "load_ratios",
           "measure_backward_ratios", "plan_from_units", "plan_training", "run_training"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
