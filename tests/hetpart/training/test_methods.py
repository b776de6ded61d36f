"""hetero and gropipe against exhaustive search; the baselines; every method on one small model."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetpart.errors import InvalidClusterError, StageInfeasibleError
from hetpart.training import METHODS, antichain_dp, brute_force, get_method, gropipe, hetero
from hetpart.training.baselines import linear_partition
from hetpart.training.common import GraphCuts, bottleneck_us, stage_terms

from .helpers import make_cluster, make_costs, make_graph, random_dag

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(seed=st.integers(0, 10_000), n=st.integers(2, 5), spec=st.sampled_from(["gpu=a100,gpu=t4", "gpu=a100x2,gpu=t4",
                                                                            "gpu=t4x2,cpu:1"]),
       replication=st.booleans(), tight=st.booleans())
def test_hetero_equals_brute_force(seed, n, spec, replication, tight):
    rng = np.random.default_rng(seed)
    graph = random_dag(rng, n)
    cluster = make_cluster(spec, memory_bytes=300 if tight else None)
    costs = make_costs(graph, cluster, rng.uniform(1, 50, n), speed={"t4": 2.5, "cpu": 9.0})
    config = {"microbatches": int(rng.integers(1, 5)), "replication": replication}
    try:
        expected = brute_force.solve(graph, costs, cluster, config)
    except StageInfeasibleError:
        with pytest.raises(StageInfeasibleError):
            hetero.solve(graph, costs, cluster, config)
        return
    plan = hetero.solve(graph, costs, cluster, config)
    assert plan.bottleneck_us == pytest.approx(expected.value_us, rel=1e-9)
    plan.validate(graph)


def test_hetero_puts_more_work_on_the_faster_device():
    graph = make_graph(6, [(k, k + 1, 1) for k in range(5)])
    cluster = make_cluster("gpu=a100,gpu=t4")
    costs = make_costs(graph, cluster, [10.0] * 6, speed={"t4": 2.0})
    plan = hetero.solve(graph, costs, cluster, {"replication": False, "allow_fewer_devices": False})
    sizes = {s.devices[0]: len(s.op_ids) for s in plan.stages}
    assert sizes == {"gpu0": 4, "gpu1": 2}            # 4 x 30 us on the A100, 2 x 60 us on the T4


@SETTINGS
@given(seed=st.integers(0, 10_000), n=st.integers(3, 6))
def test_gropipe_intra_group_split_is_optimal(seed, n):
    rng = np.random.default_rng(seed)
    graph = random_dag(rng, n)
    cluster = make_cluster("gpu=t4x4")
    costs = make_costs(graph, cluster, rng.uniform(1, 50, n))
    plan = gropipe.solve(graph, costs, cluster, {"microbatches": 4})
    plan.validate(graph)
    assert plan.groups * plan.num_stages <= 4 and all(s.replicas == plan.groups for s in plan.stages)
    # the per-group split is the exhaustive optimum for P devices without replication, n / G micro-batches
    p = plan.num_stages
    group = make_cluster(f"gpu=t4x{p}")
    sub = brute_force.solve(graph, make_costs(graph, group, costs.forward_us[:, 0]), group,
                            {"microbatches": 4 // plan.groups, "schedule": "gpipe", "replication": False,
                             "allow_fewer_devices": False})
    assert plan.stats["group_bottleneck_us"] == pytest.approx(sub.value_us, rel=1e-9)
    # GroPipe tries pure data parallelism (G = 4) and pure pipelining (G = 1): it is never slower than either
    shapes = {c["groups"]: c for c in plan.stats["candidates"] if "iteration_us" in c}
    assert plan.iteration_us <= min(c["iteration_us"] for c in shapes.values()) + 1e-9


def test_gropipe_refuses_mixed_and_bad_groups():
    graph = make_graph(3, [(0, 1, 1), (1, 2, 1)])
    mixed = make_cluster("gpu=a100,gpu=t4")
    with pytest.raises(InvalidClusterError):
        gropipe.solve(graph, make_costs(graph, mixed, [1, 1, 1]), mixed)
    four = make_cluster("gpu=t4x4")
    with pytest.raises(StageInfeasibleError, match="divide"):
        gropipe.solve(graph, make_costs(graph, four, [1, 1, 1]), four, {"groups": 3})


def test_linear_partition_is_exact():
    rng = np.random.default_rng(1)
    for _ in range(30):
        w = rng.integers(0, 10, rng.integers(2, 8)).tolist()
        parts = int(rng.integers(1, len(w) + 1))
        bounds = linear_partition(w, parts)
        best = min(max(sum(w[a:b]) for a, b in zip((0, *cut), (*cut, len(w))))
                   for cut in __import__("itertools").combinations(range(1, len(w)), parts - 1))
        assert len(bounds) == parts + 1 and all(a < b for a, b in zip(bounds, bounds[1:]))
        assert max(sum(w[a:b]) for a, b in zip(bounds, bounds[1:])) == best


@SETTINGS
@given(seed=st.integers(0, 10_000), n=st.integers(4, 9), devices=st.sampled_from([2, 3, 4]))
def test_antichain_bottleneck_never_above_a_baseline(seed, n, devices):
    rng = np.random.default_rng(seed)
    graph = random_dag(rng, n)
    cluster = make_cluster(f"gpu=t4x{devices}")
    costs = make_costs(graph, cluster, rng.uniform(1, 50, n))
    best = antichain_dp.solve(graph, costs, cluster, {"microbatches": 4}).bottleneck_us
    for method in ("uniform_ops", "uniform_params", "balance_time", "data_parallel", "pipedream_dp"):
        plan = get_method(method)(graph, costs, cluster, {"microbatches": 4})
        plan.validate(graph)
        assert best <= plan.bottleneck_us + 1e-9, method


def test_every_method_on_one_model():
    graph = make_graph(6, [(0, 1, 8), (1, 2, 8), (1, 3, 8), (2, 4, 8), (3, 4, 8), (4, 5, 8)],
                       bytes_written=[8] * 6, param_bytes=[40, 0, 40, 40, 0, 40])
    cluster = make_cluster("gpu=t4x4")
    costs = make_costs(graph, cluster, [4, 1, 6, 6, 1, 4])
    for method in METHODS:
        plan = get_method(method)(graph, costs, cluster, {"microbatches": 4})
        plan.validate(graph)
        terms = stage_terms(GraphCuts(graph), costs, cluster, [s.op_ids for s in plan.stages],
                            [s.devices for s in plan.stages])
        assert plan.bottleneck_us == pytest.approx(bottleneck_us(terms, [s.devices for s in plan.stages], cluster, 4))
        assert plan.iteration_us >= plan.bottleneck_us and plan.stats["planner_s"] >= 0
        assert plan.config["microbatches"] == 4
        assert type(plan).from_json(plan.to_json()) == plan
