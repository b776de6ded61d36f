"""pipedream_dp and antichain_dp against exhaustive search, memory limits and typed errors."""
from __future__ import annotations

import logging

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetpart.errors import HetpartError, InvalidClusterError, StageInfeasibleError, StateLimitError
from hetpart.training import antichain_dp, brute_force, pipedream_dp
from hetpart.training.antichain_dp import AntichainConfig, enumerate_ideals, fold_units, state_family
from hetpart.training.common import GraphCuts, memory_capacity

from .helpers import make_costs, make_graph, random_dag, make_cluster

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _prefix_family(n):
    return [frozenset(range(k)) for k in range(n + 1)]


@SETTINGS
@given(seed=st.integers(0, 10_000), n=st.integers(2, 6), devices=st.integers(1, 3),
       replication=st.booleans(), schedule=st.sampled_from(["1f1b", "gpipe"]), tight=st.booleans())
def test_dps_equal_brute_force(seed, n, devices, replication, schedule, tight):
    rng = np.random.default_rng(seed)
    graph = random_dag(rng, n)
    cluster = make_cluster(f"gpu=t4x{devices}", memory_bytes=400 if tight else None)
    costs = make_costs(graph, cluster, rng.uniform(1, 50, n))
    config = {"microbatches": int(rng.integers(1, 6)), "schedule": schedule, "replication": replication}
    for module, family in ((antichain_dp, None), (pipedream_dp, _prefix_family(n))):
        try:
            expected = brute_force.solve(graph, costs, cluster, config, families=family)
        except StageInfeasibleError:
            with pytest.raises(StageInfeasibleError):
                module.solve(graph, costs, cluster, config)
            continue
        plan = module.solve(graph, costs, cluster, config)
        assert plan.bottleneck_us == pytest.approx(expected.value_us, rel=1e-9, abs=1e-9)
        assert plan.stats["dp_value_us"] == pytest.approx(plan.bottleneck_us, rel=1e-9, abs=1e-9)
        plan.validate(graph)
        for device, need in plan.peak_memory_bytes.items():      # the simulated peak respects the limit
            assert need <= memory_capacity(cluster, device, module.PlannerConfig.coerce(config))


@SETTINGS
@given(seed=st.integers(0, 10_000), n=st.integers(3, 6))
def test_antichain_never_worse_than_chain(seed, n):
    rng = np.random.default_rng(seed)
    graph = random_dag(rng, n, p_edge=0.3)
    cluster = make_cluster("gpu=t4x3")
    costs = make_costs(graph, cluster, rng.uniform(1, 50, n))
    a = antichain_dp.solve(graph, costs, cluster, {"microbatches": 4})
    p = pipedream_dp.solve(graph, costs, cluster, {"microbatches": 4})
    assert a.bottleneck_us <= p.bottleneck_us + 1e-9


def test_branch_cut_counts_skip_connection():
    # 0 -> 1 -> 2 -> 3 with a skip 0 -> 3 of 100 bytes: a cut after op 1 or 2 carries the skip too
    graph = make_graph(4, [(0, 1, 10), (1, 2, 10), (2, 3, 10), (0, 3, 100)], bytes_written=[110, 10, 10, 4])
    cuts = GraphCuts(graph)
    masks = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 1, 0]], dtype=bool)[:3]
    # op 0's output is read by ops 1 and 3 outside {0}: it crosses once, with the larger read
    assert cuts.cut_bytes(masks).tolist() == [100, 110, 110]
    cluster = make_cluster("gpu=t4x2")
    costs = make_costs(graph, cluster, [10, 10, 10, 10], backward_ratio=1.0)
    plan = antichain_dp.solve(graph, costs, cluster, {"microbatches": 4, "replication": False,
                                                      "allow_fewer_devices": False})
    assert [s.op_ids for s in plan.stages] == [(0,), (1, 2, 3)]
    assert plan.stages[0].send_bytes == 100
    assert plan.bottleneck_us == pytest.approx(101.0)  # 1 us + 100 B at 1 B/us exceeds 60 us of compute


def test_memory_limit_forces_more_stages():
    graph = make_graph(4, [(0, 1, 1), (1, 2, 1), (2, 3, 1)], bytes_written=[1, 1, 1, 1],
                       param_bytes=[100, 100, 100, 100])
    big = make_cluster("gpu=t4x4", memory_bytes=10_000)
    small = make_cluster("gpu=t4x4", memory_bytes=250)      # sgd: 2 x params per op -> at most one op per device
    costs_big = make_costs(graph, big, [1, 1, 1, 1])
    costs_small = make_costs(graph, small, [1, 1, 1, 1])
    cfg = {"microbatches": 2, "replication": False}
    assert antichain_dp.solve(graph, costs_big, big, cfg).num_stages <= 4
    plan = antichain_dp.solve(graph, costs_small, small, cfg)
    assert plan.num_stages == 4
    assert max(plan.peak_memory_bytes.values()) <= 250
    tiny = make_cluster("gpu=t4x2", memory_bytes=250)
    with pytest.raises(StageInfeasibleError, match="memory") as info:
        antichain_dp.solve(graph, make_costs(graph, tiny, [1, 1, 1, 1]), tiny, cfg)
    assert isinstance(info.value, HetpartError) and isinstance(info.value, ValueError)


def test_mixed_cluster_is_refused():
    graph = make_graph(2, [(0, 1, 1)])
    cluster = make_cluster("gpu=a100,gpu=t4")
    costs = make_costs(graph, cluster, [1, 1])
    with pytest.raises(InvalidClusterError, match="hetero"):
        pipedream_dp.solve(graph, costs, cluster)


def test_parameter_ops_are_folded():
    # ops 0 and 1 read only weights and feed op 3 / op 2: folded, so 6 ops give the 3-op chain's 4 ideals
    graph = make_graph(5, [(0, 3, 4), (1, 2, 4), (2, 3, 4), (3, 4, 4)], input_consumers=(2,))
    units = fold_units(graph)
    assert units[0] == units[3] and units[1] == units[2]
    assert len(enumerate_ideals(graph, units, 100)) == 4
    assert len(enumerate_ideals(graph, list(range(5)), 100)) > 4


def test_state_limit_error_and_fallback(caplog):
    rng = np.random.default_rng(0)
    # 12 independent chains of 2 ops: 3^12 ideals
    edges = [(2 * k, 2 * k + 1, 1) for k in range(12)]
    graph = make_graph(24, edges, input_consumers=tuple(range(0, 24, 2)))
    with pytest.raises(StateLimitError, match="state_limit"):
        state_family(graph, AntichainConfig(state_limit=1000, fallback=False))
    with caplog.at_level(logging.WARNING, logger="hetpart.training.antichain_dp"):
        family, info = state_family(graph, AntichainConfig(state_limit=1000))
    assert info["block"] > 1 and len(family) <= 1000 + 25
    assert "coarser" in caplog.text or "blocks of" in caplog.text
    cluster = make_cluster("gpu=t4x2")
    plan = antichain_dp.solve(graph, make_costs(graph, cluster, rng.uniform(1, 5, 24)), cluster,
                              {"state_limit": 1000})
    plan.validate(graph)
    assert any("coarse" in n for n in plan.notes)
