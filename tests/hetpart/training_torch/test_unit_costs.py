"""Units costed through hetpart: positive costs, TrainCosts the planners take unchanged, stages named by module."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")

from hetpart.training.stage_plan import StagePlan  # noqa: E402
from hetpart.training_torch.errors import TrainingPlanFileError, UnitMappingError  # noqa: E402
from hetpart.training_torch.plan_file import TrainingPlanFile  # noqa: E402
from hetpart.training_torch.plan_file import contiguous_split_points  # noqa: E402

pytestmark = pytest.mark.tvm


def test_units_have_positive_costs_and_exact_parameters(toy_units):
    _, units = toy_units
    graph, costs = units.graph, units.train_costs
    assert graph.num_ops == len(units.units) >= 6
    assert np.all(costs.forward_us > 0) and np.all(costs.backward_us > 0)
    assert costs.forward_us.shape == (graph.num_ops, 2)
    assert np.all(units.costs["cpu"].latency_us[:, 0] > 0)
    assert [n.name for n in graph.nodes] == list(units.unit_names)
    assert all(n.tags["kernels"] >= 1 for n in graph.nodes)
    model_params = {"stem.0.weight", "stem.0.bias", "head.weight", "head.bias"}
    owned = [p for u in units.units for p in u.param_names]
    assert model_params <= set(owned) and len(owned) == len(set(owned)) == 22
    assert int(costs.param_bytes.sum()) == sum(u.param_bytes for u in units.units)


def test_a_unit_without_kernels_is_folded_into_the_one_before(toy_units):
    _, units = toy_units
    assert "blocks.5" not in units.unit_names                       # the Dropout
    assert units.units[units.unit_names.index("blocks.4")].modules == ("blocks.4", "blocks.5")
    assert any("blocks.5" in note for note in units.notes)


def test_planners_run_unchanged_and_stages_name_their_modules(toy_units, toy_plan_2):
    _, units = toy_units
    plan = toy_plan_2.plan
    assert plan.num_stages == 2
    names = [n for s in plan.stages for n in s.unit_names]
    assert names == list(units.unit_names)
    assert toy_plan_2.split_points == (plan.stages[1].unit_names[0],)
    assert StagePlan.from_dict(json.loads(plan.to_json())).stages[1].unit_names == plan.stages[1].unit_names


def test_the_same_units_replan_for_a_bigger_cluster(toy_units):
    from hetpart.training_torch.api import plan_from_units

    source, units = toy_units
    four = units.with_cluster("cpu:4")
    assert four.train_costs.forward_us.shape == (units.graph.num_ops, 4)
    planned = plan_from_units(four, source, method="pipedream_dp", microbatches=4,
                              options={"allow_fewer_devices": False})
    assert planned.plan.num_stages == 4 and len(planned.split_points) == 3
    with pytest.raises(UnitMappingError, match="costed for"):
        units.with_cluster("gpu=t4x2")


def test_gpu_presets_are_costed_by_the_datasheet_roofline():
    from hetpart.training_torch.unit_costs import build_unit_graph
    from tests.hetpart.training_torch.toy_models import skip_net

    model, example = skip_net(batch=2)
    units = build_unit_graph(model, example, "gpu=t4x2", name="skip")
    assert set(units.costs) == {"t4"} and units.costs["t4"].source[0, 0] == "analytic"
    assert np.all(units.train_costs.forward_us > 0)
    assert units.train_costs.forward_source == {"gpu0": "analytic", "gpu1": "analytic"}
    assert [(e.src, e.dst) for e in units.graph.edges] == [(0, 1), (0, 2), (1, 2)]


def test_stages_must_be_contiguous_runs_of_units():
    assert contiguous_split_points([(0, 1), (2,), (3, 4)], ["a", "b", "c", "d", "e"]) == ["c", "d"]
    with pytest.raises(TrainingPlanFileError, match="contiguous"):
        contiguous_split_points([(0, 2), (1, 3)], ["a", "b", "c", "d"])


def test_the_plan_file_round_trips(toy_plan_2, tmp_path):
    path = toy_plan_2.save(tmp_path / "plan.json")
    again = TrainingPlanFile.load(path)
    assert again.to_dict() == toy_plan_2.to_dict()
    assert again.microbatch_size == 2 and again.loss == "cross_entropy"
