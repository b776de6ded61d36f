"""Cutting plans into segments: hand-made cases, invariants on random plans, and a brute force on tiny graphs."""
from __future__ import annotations

import itertools

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hetpart.errors import InvalidPlanError, SchemaError
from hetpart.partition.synthetic import synthetic_problem
from hetpart.plan import Plan
from hetpart.segments import Segmentation, describe_segments, segment_plan
from tests.hetpart.partition.dags import random_dag
from tests.hetpart.test_simulate import plan_of, random_plan
from tests.scaling import cpu_time_growth


def groups_of(seg: Segmentation) -> list[tuple[str, tuple[int, ...]]]:
    return [(s.device, s.op_ids) for s in seg.segments]


def random_problem(shape: str, n: int, seed: int):
    """A random graph, a random device per op (on a device that can run it) and a random topological order."""
    if shape == "dag":
        graph, costs = random_dag(n, seed % 2 == 0, seed)
    else:
        graph, costs = synthetic_problem(shape, n, seed)
    dev, order = random_plan(graph, seed)
    device_of = tuple("gpu" if d == 1 and costs.supported[i, 1] else "cpu" for i, d in enumerate(dev))
    return graph, costs, Plan(device_of, tuple(order), ("cpu", "gpu"), "random")


def quotient_is_acyclic(graph, groups) -> bool:
    """Whether the graph of ``groups`` of ops is acyclic (edges between ops in no group are ignored)."""
    group_of = {v: k for k, ops in enumerate(groups) for v in ops}
    dag = nx.DiGraph()
    dag.add_nodes_from(range(len(groups)))
    dag.add_edges_from((group_of[e.src], group_of[e.dst]) for e in graph.edges
                       if e.src in group_of and e.dst in group_of and group_of[e.src] != group_of[e.dst])
    return nx.is_directed_acyclic_graph(dag)


# ---------------------------------------------------------------------- hand-made cases
def test_a_chain_on_one_device_is_one_segment(make_tiny):
    graph, _ = make_tiny([(1, 1)] * 5, [(i, i + 1, 10) for i in range(4)], outputs=[(4, 8)])
    seg = segment_plan(graph, plan_of(["gpu"] * 5))
    assert groups_of(seg) == [("gpu", (0, 1, 2, 3, 4))]
    only = seg.segments[0]
    assert only.inputs == () and only.graph_inputs == ("x",) and only.outputs == (4,)
    assert seg.edges == () and seg.segment_of == (0,) * 5


def test_alternating_devices_on_a_chain_give_one_segment_per_run(make_tiny):
    graph, _ = make_tiny([(1, 1)] * 6, [(i, i + 1, 10 * (i + 1)) for i in range(5)], outputs=[(5, 8)])
    seg = segment_plan(graph, plan_of(["cpu", "cpu", "gpu", "gpu", "gpu", "cpu"]))
    assert groups_of(seg) == [("cpu", (0, 1)), ("gpu", (2, 3, 4)), ("cpu", (5,))]
    assert seg.edges == ((0, 1), (1, 2))
    assert [(i.segment, i.op_id, i.size_bytes) for i in seg.segments[1].inputs] == [(0, 1, 20)]
    assert [(i.segment, i.op_id, i.size_bytes) for i in seg.segments[2].inputs] == [(1, 4, 50)]
    assert [s.outputs for s in seg.segments] == [(1,), (4,), (5,)]
    assert seg.segment_of == (0, 0, 1, 1, 1, 2)


def test_every_op_alternating_on_a_chain_is_its_own_segment(make_tiny):
    graph, _ = make_tiny([(1, 1)] * 4, [(i, i + 1, 10) for i in range(3)])
    assert len(segment_plan(graph, plan_of(["cpu", "gpu", "cpu", "gpu"]))) == 4


@pytest.mark.parametrize("edges, order, expected", [
    # a -> b on the cpu, b -> c on the gpu, c -> d back on the cpu, and a -> d: d joining {a, b} would make
    # {a, b} -> {c} -> {a, b}, so d opens a second cpu segment
    ([(0, 1, 10), (1, 2, 10), (2, 3, 10), (0, 3, 10)], [0, 1, 2, 3],
     [("cpu", (0, 1)), ("gpu", (2,)), ("cpu", (3,))]),
    # without c -> d, d may join a's segment although c was issued in between
    ([(0, 1, 10), (1, 2, 10), (0, 3, 10)], [0, 1, 2, 3], [("cpu", (0, 1, 3)), ("gpu", (2,))]),
    # issued before c, d joins {a, b} too: the issue order decides what can merge
    ([(0, 1, 10), (1, 2, 10), (0, 3, 10)], [0, 1, 3, 2], [("cpu", (0, 1, 3)), ("gpu", (2,))]),
])
def test_an_op_joins_the_latest_segment_of_its_device_unless_that_makes_a_cycle(make_tiny, edges, order, expected):
    graph, _ = make_tiny([(1, 1)] * 4, edges)
    plan = plan_of(["cpu", "cpu", "gpu", "cpu"], order)
    seg = segment_plan(graph, plan)
    assert groups_of(seg) == expected
    assert quotient_is_acyclic(graph, [s.op_ids for s in seg.segments])
    if len(expected) == 3:           # the rejected merge really is cyclic
        assert not quotient_is_acyclic(graph, [(0, 1, 3), (2,)])


def test_only_the_most_recent_segment_of_a_device_is_joined(make_tiny):
    # cpu a, gpu b <- a, cpu c <- b (cycle with {a}: new segment), cpu e independent: joins {c}, not {a}
    graph, _ = make_tiny([(1, 1)] * 4, [(0, 1, 10), (1, 2, 10)], input_consumers=(0, 3))
    seg = segment_plan(graph, plan_of(["cpu", "gpu", "cpu", "cpu"]))
    assert groups_of(seg) == [("cpu", (0,)), ("gpu", (1,)), ("cpu", (2, 3))]
    assert seg.segments[2].graph_inputs == ("x",)


def test_segments_are_numbered_in_a_topological_order_not_in_opening_order(make_tiny):
    # gpu op 1 opens a segment first, but it reads cpu op 0's segment, which the later cpu op 2 also joins
    graph, _ = make_tiny([(1, 1)] * 3, [(0, 1, 10), (1, 2, 10)], input_consumers=(0,))
    seg = segment_plan(graph, plan_of(["cpu", "gpu", "cpu"], [0, 1, 2]))
    assert [s.device for s in seg.segments] == ["cpu", "gpu", "cpu"]
    assert all(a < b for a, b in seg.edges)


def test_merge_false_gives_one_op_per_segment_in_plan_order(make_tiny):
    graph, _ = make_tiny([(1, 1)] * 3, [(0, 2, 10)], input_consumers=(0, 1))
    seg = segment_plan(graph, plan_of(["cpu"] * 3, [1, 0, 2]), merge=False)
    assert groups_of(seg) == [("cpu", (1,)), ("cpu", (0,)), ("cpu", (2,))]
    assert seg.edges == ((1, 2),)


def test_json_round_trip_and_refused_segmentations(make_tiny):
    graph, _ = make_tiny([(1, 1)] * 4, [(0, 1, 10), (1, 2, 10), (2, 3, 10), (0, 3, 10)], outputs=[(3, 4)])
    plan = plan_of(["cpu", "cpu", "gpu", "cpu"])
    seg = segment_plan(graph, plan)
    assert Segmentation.from_json(seg.to_json()) == seg
    assert Segmentation.from_dict(seg.to_dict()).validate(graph, plan) == seg
    with pytest.raises(SchemaError, match="schema_version"):
        Segmentation.from_dict({**seg.to_dict(), "schema_version": 99})
    with pytest.raises(SchemaError, match="malformed"):
        Segmentation.from_dict({k: v for k, v in seg.to_dict().items() if k != "segment_of"})
    with pytest.raises(InvalidPlanError, match="another device"):
        seg.validate(graph, plan_of(["cpu", "cpu", "cpu", "cpu"]))
    with pytest.raises(InvalidPlanError, match="out of plan order"):
        describe_segments(graph, [(1, 0), (2,), (3,)], ["cpu", "gpu", "cpu"]).validate(graph, plan)
    tampered = seg.to_dict()
    tampered["edges"] = [[1, 0]]
    with pytest.raises(InvalidPlanError, match="do not match"):
        Segmentation.from_dict(tampered)
    with pytest.raises(InvalidPlanError, match="cycle"):
        describe_segments(graph, [(0, 1, 3), (2,)], ["cpu", "gpu"])


# ---------------------------------------------------------------------- invariants on random plans
def check_invariants(graph, plan: Plan, seg: Segmentation) -> None:
    seg.validate(graph, plan)
    ops = sorted(op for s in seg.segments for op in s.op_ids)
    assert ops == list(range(graph.num_ops))                                   # every op exactly once
    assert all(len({plan.device_of[op] for op in s.op_ids}) == 1 for s in seg.segments)
    assert quotient_is_acyclic(graph, [s.op_ids for s in seg.segments])
    assert all(a < b for a, b in seg.edges)                                    # ids are a topological order
    dag = nx.DiGraph(list(seg.edges))
    dag.add_nodes_from(range(len(seg)))
    for device in plan.devices:
        mine = seg.on_device(device)
        # a device's segments are consecutive runs of its ops in plan order, each reaching the next
        assert [op for s in mine for op in s.op_ids] == [op for op in plan.order if plan.device_of[op] == device]
        assert all(nx.has_path(dag, a.id, b.id) for a, b in zip(mine, mine[1:]))
        # maximality: merging any two segments of one device creates a cycle
        for a, b in itertools.combinations(mine, 2):
            groups = [s.op_ids for s in seg.segments if s.id not in (a.id, b.id)] + [a.op_ids + b.op_ids]
            assert not quotient_is_acyclic(graph, groups)


@settings(max_examples=40, deadline=None)
@given(shape=st.sampled_from(["dag", "layered", "branchy", "series_parallel"]), n=st.integers(1, 30),
       seed=st.integers(0, 10_000))
def test_random_plans_give_valid_maximal_segmentations(shape, n, seed):
    graph, _, plan = random_problem(shape, n, seed)
    seg = segment_plan(graph, plan)
    check_invariants(graph, plan, seg)
    assert Segmentation.from_json(seg.to_json()) == seg
    single = segment_plan(graph, plan, merge=False)
    assert len(single) == graph.num_ops and quotient_is_acyclic(graph, [s.op_ids for s in single.segments])


def run_segmentations(graph, plan: Plan):
    """Every *run segmentation* of the plan: walking plan.order, each op either joins the most recent segment of
    its device (choice True) or opens a new one (False), and the graph of the segments so far stays acyclic
    after every step. Choice vectors are tried in lexicographic order, True first (2^n of them)."""
    for choice in itertools.product((True, False), repeat=graph.num_ops):
        groups: list[list[int]] = []
        latest: dict[str, int] = {}
        for v, join in zip(plan.order, choice):
            d = plan.device_of[v]
            if join and d in latest:
                groups[latest[d]].append(v)
            else:
                latest[d] = len(groups)
                groups.append([v])
            if not quotient_is_acyclic(graph, groups):
                break
        else:
            yield [tuple(g) for g in groups]


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 7), seed=st.integers(0, 10_000))
def test_brute_force_on_tiny_graphs(n, seed):
    """Precisely: let R be the set of run segmentations (see run_segmentations). Then (1) the greedy result is
    the lexicographically first member of R, i.e. the one that joins at every step where joining keeps the
    segment graph acyclic (opening is always possible, so joining never rules out finishing); (2) it is
    maximal: merging any two of its segments makes a cycle, so nothing with fewer segments is reached from it
    by merging. It is NOT always the member of R with the fewest segments (see
    test_greedy_is_not_always_the_fewest_segments)."""
    graph, _, plan = random_problem("dag", n, seed)
    seg = segment_plan(graph, plan)
    found = [sorted(r) for r in run_segmentations(graph, plan)]
    assert found[0] == sorted(s.op_ids for s in seg.segments)
    assert len(seg) >= min(len(r) for r in found)
    check_invariants(graph, plan, seg)


def test_greedy_is_not_always_the_fewest_segments(make_tiny):
    # order 1(gpu) 0 2 3 (cpu) 4(gpu) 5(cpu): joining 3 to {0, 2} forces 4 and 5 into new segments (4 in all);
    # opening a new segment at 3 lets 4 join {1} and 5 join {3}: 3 segments
    edges = [(0, 2, 1), (0, 3, 1), (0, 5, 1), (1, 3, 1), (1, 4, 1), (2, 3, 1), (2, 4, 1), (3, 5, 1), (4, 5, 1)]
    graph, _ = make_tiny([(1, 1)] * 6, edges, input_consumers=(0, 1))
    plan = plan_of(["cpu", "gpu", "cpu", "cpu", "gpu", "cpu"], [1, 0, 2, 3, 4, 5])
    assert groups_of(segment_plan(graph, plan)) == [("gpu", (1,)), ("cpu", (0, 2, 3)), ("gpu", (4,)),
                                                    ("cpu", (5,))]
    fewer = describe_segments(graph, [(1, 4), (0, 2), (3, 5)], ["gpu", "cpu", "cpu"]).validate(graph, plan)
    assert len(fewer) == 3 and [(0, 2), (1, 4), (3, 5)] in [sorted(r) for r in run_segmentations(graph, plan)]


@pytest.mark.parametrize("shape", ["layered", "branchy", "series_parallel"])
def test_segmenting_grows_about_linearly_up_to_two_thousand_ops(shape):
    def segmenting(n_ops: int):
        graph, _, plan = random_problem(shape, n_ops, 0)
        return lambda: segment_plan(graph, plan)

    # 4x the ops: about 4-5x the time when linear, 16x when quadratic
    assert cpu_time_growth(segmenting, 500, 2000) < 10
    graph, _, plan = random_problem(shape, 2000, 0)
    seg = segment_plan(graph, plan)
    assert 1 < len(seg) < graph.num_ops
    assert sorted(np.concatenate([s.op_ids for s in seg.segments]).tolist()) == list(range(2000))
