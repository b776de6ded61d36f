"""Training-side planning: split a model into pipeline stages over several devices and simulate the schedule.

Framework-free (numpy, scipy, networkx): the types (:class:`Cluster`, :class:`TrainCosts`, :class:`StagePlan`),
the stage partitioners (every one ``solve(graph, train_costs, cluster, config) -> StagePlan``) and the schedule
simulator. See docs/training.md.
"""
from __future__ import annotations

import importlib
from typing import Callable

from hetpart.training.cluster import LINK_PRESETS, Cluster, LinkPreset, TrainDevice
from hetpart.training.cost_model import BackwardRatios, TrainCosts
from hetpart.training.stage_plan import SCHEDULES, Stage, StagePlan

# method name -> "module:function"
METHODS = {
    "pipedream_dp": "hetpart.training.pipedream_dp:solve",
    "antichain_dp": "hetpart.training.antichain_dp:solve",
    "hetero": "hetpart.training.hetero:solve",
    "gropipe": "hetpart.training.gropipe:solve",
    "uniform_ops": "hetpart.training.baselines:solve_uniform_ops",
    "uniform_params": "hetpart.training.baselines:solve_uniform_params",
    "balance_time": "hetpart.training.baselines:solve_balance_time",
    "data_parallel": "hetpart.training.baselines:solve_data_parallel",
}


def get_method(name: str) -> Callable[..., StagePlan]:
    """The ``solve`` function of a training partitioner by name (see ``METHODS``)."""
    from hetpart.errors import UsageError
    try:
        module, func = METHODS[name].split(":")
    except KeyError:
        raise UsageError(f"unknown training partitioner {name!r}; known: {', '.join(METHODS)}") from None
    return getattr(importlib.import_module(module), func)


__all__ = ["LINK_PRESETS", "METHODS", "SCHEDULES", "BackwardRatios", "Cluster", "LinkPreset", "Stage", "StagePlan",
           "TrainCosts", "TrainDevice", "get_method"]
