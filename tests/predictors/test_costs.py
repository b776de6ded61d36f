"""build_cost_table: predicted/analytic/measured sources, GPU support of shape ops, missing predictors."""
import dataclasses

import numpy as np
import pytest

from hetpart.costs import CostTable
from hetpart.devices import DeviceSet, cpu_device, gpu_from_preset, preset_links
from hetpart.errors import MissingCostError, PredictorError
from predictors.analytic import AnalyticGpuModel
from predictors.costs import build_cost_table, gpu_supports
from predictors.device_predictor import DevicePredictor
from tests.predictors.synthetic_kernels import (chain_graph, conv_node, elementwise_node, pool_node, random_kernels,
                                                reshape_node, synthetic_latency_us)


@pytest.fixture(scope="module")
def setup():
    rng = np.random.default_rng(0)
    train = random_kernels(rng, 240, ("conv2d", "pool", "elementwise", "reshape"))
    cpu = DevicePredictor("cpu").fit(train, synthetic_latency_us(train, rng, 0.02))
    shape_op = dataclasses.replace(reshape_node(0, (1, 16, 14, 14)), op="relax.shape_of", shape_only=True)
    graph = chain_graph([conv_node(0, 1, 16, 32, 28, 3), pool_node(0, 1, 32, 28, 2, 2), shape_op,
                         reshape_node(0, (1, 32, 14, 14)), elementwise_node(0, (1, 32, 14, 14))], name="small")
    devices = DeviceSet((cpu_device(), gpu_from_preset("t4")), preset_links("t4")).validate()
    return graph, devices, {"cpu": cpu, "gpu": AnalyticGpuModel("t4")}


def test_cost_table_validates_and_labels_sources(setup):
    graph, devices, predictors = setup
    table = build_cost_table(graph, predictors, devices)
    assert isinstance(table, CostTable) and table.validate(graph) is table
    assert table.latency_us.shape == (5, 2) and table.graph_hash == graph.structure_hash()
    assert set(table.source[:, 0]) == {"predicted"} and set(table.source[:, 1]) == {"analytic"}
    assert not table.supported[2, 1] and table.supported[2, 0]       # shape_of stays on the CPU
    with pytest.raises(MissingCostError):
        table.latency(2, "gpu")
    assert table.latency(0, "gpu") > 0 and table.latency(0, "cpu") > 0
    assert np.allclose(table.latency_us[:, 1][table.supported[:, 1]],
                       predictors["gpu"].predict([graph.nodes[i] for i in (0, 1, 3, 4)]))
    assert table.transfer_us(1_000_000, "cpu", "gpu") == devices.link("cpu", "gpu").transfer_us(1_000_000)
    assert table.provenance["devices"]["gpu"]["source"] == "analytic"
    assert CostTable.from_dict(table.to_dict()).validate(graph).latency(0, "gpu") == table.latency(0, "gpu")


def test_measured_entries_override_predictions(setup):
    graph, devices, predictors = setup
    table = build_cost_table(graph, predictors, devices, measured={"cpu": {0: 123.0}})
    assert table.latency(0, "cpu") == 123.0 and table.source[0, 0] == "measured"
    assert table.source[1, 0] == "predicted"
    only_measured = build_cost_table(graph, {"gpu": predictors["gpu"]}, devices,
                                     measured={"cpu": {i: 10.0 + i for i in range(5)}})
    assert set(only_measured.source[:, 0]) == {"measured"} and only_measured.latency(4, "cpu") == 14.0


def test_missing_or_mismatched_predictor_raises(setup):
    graph, devices, predictors = setup
    with pytest.raises(PredictorError, match="gpu"):
        build_cost_table(graph, {"cpu": predictors["cpu"]}, devices)
    with pytest.raises(PredictorError, match="target kind"):
        build_cost_table(graph, {"cpu": predictors["cpu"], "gpu": predictors["cpu"]}, devices)


def test_supported_override_and_gpu_support_rule(setup):
    graph, devices, predictors = setup
    sup = np.ones((5, 2), dtype=bool)
    sup[0, 1] = False
    sup[2, 1] = False
    table = build_cost_table(graph, predictors, devices, supported=sup)
    assert not table.supported[0, 1] and np.isnan(table.latency_us[0, 1])
    assert not gpu_supports(graph.nodes[2]) and gpu_supports(graph.nodes[0])
