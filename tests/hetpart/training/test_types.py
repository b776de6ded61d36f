"""Cluster, TrainCosts and StagePlan: parsing, validation, typed errors and JSON round-trips."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from hetpart.costs import CostTable
from hetpart.devices import DeviceSet, cpu_device, gpu_from_preset, preset_links
from hetpart.errors import (HetpartError, InvalidClusterError, InvalidCostTableError, InvalidStagePlanError,
                            MissingCostError, SchemaError)
from hetpart.training import BackwardRatios, Cluster, StagePlan, TrainCosts, antichain_dp, get_method
from hetpart.training.cost_model import anchor_kind

from .helpers import make_cluster, make_costs, make_graph


def test_cluster_parse_and_presets():
    c = Cluster.parse("gpu=a100x2,gpu=t4x2")
    assert c.names == ("gpu0", "gpu1", "gpu2", "gpu3") and c.presets == ("a100", "t4")
    assert c.intra_node_link.name == "pcie3"                 # the T4's PCIe 3.0 is the slowest interface
    assert c.device("gpu0").memory_bytes == 40 * 2**30       # the A100 40GB datasheet figure
    cpus = Cluster.parse("cpu:2")
    assert [d.kind for d in cpus.devices] == ["cpu", "cpu"] and cpus.intra_node_link.name == "loopback"
    assert cpus.intra_node_link.source == "assumed"
    nv = Cluster.identical("a100", 8, link="nvlink", per_node=4)
    assert nv.num_nodes == 2 and nv.link_between("gpu0", "gpu3").name == "nvlink"
    assert nv.link_between("gpu3", "gpu4").name == "ethernet"
    assert nv.allreduce_us(1e9, nv.names[:4]) < nv.allreduce_us(1e9, nv.names)
    assert Cluster.from_dict(json.loads(json.dumps(nv.to_dict()))) == nv
    assert Cluster.parse(nv.spec) == nv


@pytest.mark.parametrize("spec, match", [("gpu=h900x2", "unknown GPU preset"), ("", "names no device"),
                                         ("a100x2,link=carrier-pigeon", "unknown link preset"),
                                         ("a100x2,per_node=0", "per_node"), ("cpu:x", "CPU processes")])
def test_cluster_errors_are_typed(spec, match):
    with pytest.raises(InvalidClusterError, match=match) as info:
        Cluster.parse(spec)
    assert isinstance(info.value, HetpartError) and isinstance(info.value, ValueError)


def _table(graph, preset):
    devices = DeviceSet((cpu_device(), gpu_from_preset(preset)), preset_links(preset)).validate()
    lat = np.array([[10.0 * (i + 1), 1.0 * (i + 1)] for i in range(graph.num_ops)])
    return CostTable.from_arrays(lat, devices, source=np.array([["predicted", "analytic"]] * graph.num_ops),
                                 graph=graph)


def test_train_costs_from_cost_tables_and_ratios(tmp_path):
    graph = make_graph(3, [(0, 1, 8), (1, 2, 8)], bytes_written=[8, 8, 8], param_bytes=[100, 0, 50])
    cluster = Cluster.parse("gpu=a100,gpu=t4,cpu:1")
    tables = {"a100": _table(graph, "a100"), "t4": _table(graph, "t4"), "cpu": _table(graph, "a100")}
    costs = TrainCosts.build(graph, tables, cluster, optimizer="adam")
    assert costs.backward_source == "assumed"
    assert costs.forward_us[:, 0].tolist() == [1.0, 2.0, 3.0] and costs.forward_us[:, 2].tolist() == [10, 20, 30]
    assert np.allclose(costs.backward_us, 2.0 * costs.forward_us)
    assert costs.weight_state_bytes.tolist() == [400, 0, 200]          # weights + grads + two Adam moments
    assert costs.forward_source == {"gpu0": "analytic", "gpu1": "analytic", "cpu0": "predicted"}
    path = tmp_path / "ratios.json"
    path.write_text(json.dumps({"kind_ratio": {"Conv2d": 3.0}, "default_ratio": 1.5, "source": "measured on x"}))
    measured = TrainCosts.build(graph, tables, cluster, ratios=BackwardRatios.load(path))
    assert measured.backward_source == "measured on x"
    assert measured.backward_us[:, 0].tolist() == [3.0, 3.0, 9.0]      # ops 0, 2 are conv2d, op 1 an add
    assert TrainCosts.from_dict(json.loads(json.dumps(measured.to_dict()))).to_dict() == measured.to_dict()
    with pytest.raises(MissingCostError, match="preset"):
        TrainCosts.build(graph, {"a100": tables["a100"]}, cluster)
    with pytest.raises(MissingCostError, match="columns"):
        TrainCosts.build(graph, tables["a100"], Cluster.parse("gpu=t4"))


def test_missing_cost_raises_never_zero():
    graph = make_graph(2, [(0, 1, 8)])
    cluster = make_cluster("gpu=t4x2")
    costs = make_costs(graph, cluster, [1.0, 2.0])
    fwd = costs.forward_us.copy()
    fwd[1, :] = np.nan
    with pytest.raises(MissingCostError, match="no training cost"):
        replace(costs, forward_us=fwd, backward_us=fwd).validate()
    with pytest.raises(InvalidCostTableError):
        replace(costs, optimizer="lion").validate()
    with pytest.raises(SchemaError):
        BackwardRatios.from_dict({"ratio": 2})


def test_anchor_kind_of_fused_kernel():
    graph = make_graph(1, [])
    node = replace(graph.nodes[0], op="fused:add+nn.conv2d", tags={"op_types": ["relax.add", "relax.nn.conv2d"]})
    assert anchor_kind(node) == "conv2d"


def test_stage_plan_json_round_trip_and_validation(tmp_path):
    graph = make_graph(4, [(0, 1, 4), (1, 2, 4), (2, 3, 4), (0, 3, 4)], bytes_written=[4] * 4,
                       param_bytes=[10, 0, 10, 0])
    cluster = make_cluster("gpu=t4x2")
    plan = antichain_dp.solve(graph, make_costs(graph, cluster, [5, 1, 5, 1]), cluster,
                              {"microbatches": 4, "replication": False, "allow_fewer_devices": False})
    path = tmp_path / "plan.json"
    plan.save(path)
    again = StagePlan.load(path, graph)
    assert again == plan
    assert again.to_dict() == plan.to_dict()
    with pytest.raises(InvalidStagePlanError, match="topological cut"):
        bad = replace(plan, stages=(replace(plan.stages[0], op_ids=(0, 3)), replace(plan.stages[1], op_ids=(1, 2))))
        bad.validate(graph)
    with pytest.raises(InvalidStagePlanError, match="two stages"):
        replace(plan, stages=(plan.stages[0], replace(plan.stages[1], op_ids=plan.stages[0].op_ids))).validate()
    with pytest.raises(InvalidStagePlanError, match="only the interleaved"):
        replace(plan, stages=(plan.stages[0], replace(plan.stages[1], devices=plan.stages[0].devices))).validate()
    with pytest.raises(SchemaError):
        StagePlan.from_dict({**plan.to_dict(), "schema_version": 99})
    with pytest.raises(HetpartError, match="unknown training partitioner"):
        get_method("magic")
