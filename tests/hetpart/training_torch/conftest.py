"""A toy CNN costed once per test run (TVM import of every unit + the CPU predictor: ~20-40 s)."""
from __future__ import annotations

import pytest

TOY_CNN = "tests.hetpart.training_torch.toy_models:toy_cnn"
BATCH = 8
MICROBATCHES = 4


@pytest.fixture(scope="session")
def toy_units():
    pytest.importorskip("torch")
    from hetpart.training_torch.plan_file import ModelSource
    from hetpart.training_torch.unit_costs import build_unit_graph

    source = ModelSource(TOY_CNN, BATCH)
    model, example = source.build(BATCH // MICROBATCHES)
    return source, build_unit_graph(model, example, "cpu:2", name="toy_cnn")


@pytest.fixture(scope="session")
def toy_plan_2(toy_units):
    """Two stages on two CPU processes."""
    from hetpart.training_torch.api import plan_from_units

    source, units = toy_units
    return plan_from_units(units, source, method="pipedream_dp", microbatches=MICROBATCHES, schedule="1f1b",
                           options={"allow_fewer_devices": False})
