"""The slice grid of unrolled RNN graphs: tasks, edges from the real dependencies, and its down-set cuts."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from hetpart.costs import CostTable
from hetpart.graph import OpGraph, OpNode
from hetpart.partition.common import Problem
from hetpart.partition.cp_greedy import clusters
from hetpart.partition.slices import (NoRnnTagsError, SliceGrid, build_slice_grid, node_rnn_tags, parse_rnn_tag,
                                      step_tasks)
from hetpart.partition.synthetic import synthetic_devices, synthetic_problem

from .rnn_graphs import synthetic_rnn


def _task(grid: SliceGrid, name: str, graph: OpGraph) -> tuple[int, int]:
    op = next(n.id for n in graph.nodes if n.name == name)
    task = grid.tasks[grid.task_of[op]]
    return task.layer, task.slice


def _brute_force_down_sets(grid: SliceGrid) -> set[frozenset[int]]:
    found = set()
    for bits in itertools.product((False, True), repeat=len(grid.tasks)):
        if grid.is_down_set(bits):
            found.add(frozenset(k for k, b in enumerate(bits) if b))
    return found


def test_parse_rnn_tag_reads_every_phase():
    assert parse_rnn_tag("rnn1_d0_p4_xproj") == {"rnn_layer": 1, "rnn_direction": 0, "rnn_step": 4,
                                                 "rnn_phase": "input_projection"}
    assert parse_rnn_tag("rnn0_d1_t7_h")["rnn_step"] == 7
    assert parse_rnn_tag("rnn2_dall_out_Y")["rnn_phase"] == "output"
    assert parse_rnn_tag("lv3") is None and parse_rnn_tag("rnn0_d0_q1_x") is None


def test_kernel_tags_come_from_every_member_op():
    node = OpNode(id=0, name="fused_kernel", op="fused:add+stack",
                  tags={"op_names": ["rnn0_d0_t5_h", "rnn0_dall_out_Y", "lv9"], "op_ids": [3, 4, 5]})
    assert [(t["rnn_step"], t["rnn_phase"]) for t in node_rnn_tags(node)] == [(5, "step"), (-1, "output")]


@pytest.mark.parametrize("steps,slice_steps", [(6, 1), (6, 2), (7, 3), (5, 5), (4, 8)])
def test_per_slice_grid_is_the_plain_grid(steps, slice_steps):
    graph, _ = synthetic_rnn(3, steps, projection_steps=slice_steps)
    grid = build_slice_grid(graph, slice_steps)
    slices = math.ceil(steps / slice_steps)
    assert grid.slices == (slices,) * 3 and len(grid.tasks) == 3 * slices
    index = {(t.layer, t.slice): k for k, t in enumerate(grid.tasks)}
    plain = {(index[(layer, s - 1)], index[(layer, s)]) for layer in range(3) for s in range(1, slices)}
    plain |= {(index[(layer - 1, s)], index[(layer, s)]) for layer in range(1, 3) for s in range(slices)}
    assert plain <= set(grid.edges)
    # beyond the grid only edges it implies (the embedding read by every layer-0 slice, the output stack)
    for a, b in set(grid.edges) - plain:
        assert grid.tasks[a].layer <= grid.tasks[b].layer and grid.tasks[a].slice <= grid.tasks[b].slice
    assert sum(1 for _ in grid.cuts()) == math.comb(slices + 3, 3)
    for name in graph.nodes:
        tag = parse_rnn_tag(name.name)
        if tag and tag["rnn_step"] >= 0:
            assert _task(grid, name.name, graph) == (tag["rnn_layer"], tag["rnn_step"] // slice_steps)
    assert _task(grid, "embed", graph) == (0, 0)
    assert _task(grid, "decoder", graph) == (2, slices - 1)
    assert grid.untagged_ops == 2
    order = [op for t in grid.tasks for op in t.op_ids]
    position = {op: k for k, op in enumerate(order)}
    assert all(position[e.src] < position[e.dst] for e in graph.edges)


def test_hoisted_projection_makes_the_next_layer_wait_for_the_whole_layer():
    graph, _ = synthetic_rnn(2, 4, projection="hoisted")
    grid = build_slice_grid(graph, 1)
    assert _task(grid, "reshape0", graph) == (0, 3)                  # between the layers: the producer's slice
    assert _task(grid, "rnn1_d0_in_xproj", graph) == (1, 0)
    cuts = list(grid.cuts())
    assert all(cut[1] == 0 or cut[0] == 4 for cut in cuts)           # layer 1 starts only after all of layer 0
    assert len(cuts) == 5 + 4
    assert {grid.cut_kind(c) for c in cuts} == {"empty", "all", "layer split", "layer and time split"}


def test_a_bidirectional_layer_holds_both_directions_and_delays_the_next_layer():
    graph, _ = synthetic_rnn(2, 4, bidirectional=(0,))
    grid = build_slice_grid(graph, 1)
    assert _task(grid, "rnn0_d0_t1_h", graph) == _task(grid, "rnn0_d1_t1_h", graph) == (0, 1)
    # the next layer's slice 0 reads time 0, which the reverse direction computes at its last step
    assert all(cut[1] == 0 or cut[0] == 4 for cut in grid.cuts())


@pytest.mark.parametrize("layers,steps,kwargs", [
    (1, 4, {}), (2, 3, {}), (3, 2, {}), (2, 3, {"projection": "hoisted"}), (2, 3, {"bidirectional": (1,)}),
    (3, 2, {"bidirectional": (0,)}), (2, 4, {"projection_steps": 2}), (2, 2, {"pre": False, "post": False}),
])
def test_cuts_are_exactly_the_down_sets(layers, steps, kwargs):
    graph, _ = synthetic_rnn(layers, steps, **kwargs)
    grid = build_slice_grid(graph, 1)
    cuts = list(grid.cuts())
    assert len(set(cuts)) == len(cuts)
    as_sets = {frozenset(k for k, inside in enumerate(grid.members(c)) if inside) for c in cuts}
    assert as_sets == _brute_force_down_sets(grid)


def test_a_coarse_stride_keeps_whole_layers_and_multiples():
    graph, _ = synthetic_rnn(2, 7)
    grid = build_slice_grid(graph, 1)
    coarse = list(grid.cuts(stride=3))
    assert set(coarse) <= set(grid.cuts())
    assert all(c % 3 == 0 or c == 7 for cut in coarse for c in cut)
    assert (7, 7) in coarse and (3, 3) in coarse and (7, 0) in coarse


def test_graph_without_rnn_tags_is_a_typed_error_naming_the_fix():
    graph, _ = synthetic_problem("layered", 6, 0)
    with pytest.raises(NoRnnTagsError, match="another method.*portfolio"):
        build_slice_grid(graph, 1)
    assert step_tasks(graph) == [None] * 6


def test_cp_greedy_clusters_never_glue_two_time_steps():
    graph, _ = synthetic_rnn(2, 5, projection="hoisted")
    costs = CostTable.from_arrays(np.ones((graph.num_ops, 2)), synthetic_devices(), graph=graph, source="analytic")
    steps = step_tasks(graph)
    for cluster in clusters(Problem(graph, costs, None, "cp_greedy")):
        assert len({steps[v] for v in cluster}) == 1, [graph.nodes[v].name for v in cluster]


@pytest.mark.tvm
@pytest.mark.parametrize("model", ["lstm_lm", "gru_lm"])
def test_zoo_rnn_grids(model, zoo_rnn_graph):
    seq = 4
    for projection, slice_steps in (("hoisted", None), ("per_slice", 1)):
        graph = zoo_rnn_graph(model, seq, slice_steps)
        grid = build_slice_grid(graph, 1)
        assert grid.layers == (0, 1) and grid.slices == (seq, seq)
        assert len(grid.tasks) == 2 * seq and grid.untagged_ops >= 2       # embedding before, decoder after
        cuts = list(grid.cuts())
        if projection == "per_slice":
            assert len(cuts) == math.comb(seq + 2, 2)                      # every staircase
        else:
            assert len(cuts) == seq + 1 + seq                              # layer 1 waits for all of layer 0
        steps = step_tasks(graph)
        costs = CostTable.from_arrays(np.ones((graph.num_ops, 2)), synthetic_devices(), graph=graph,
                                      source="analytic")
        for cluster in clusters(Problem(graph, costs, None, "cp_greedy")):
            assert len({steps[v] for v in cluster}) == 1


@pytest.mark.tvm
def test_final_states_of_every_layer_fused_with_the_last_step_still_form_a_grid(zoo_rnn_graph):
    """A 3-layer LSTM returning every layer's final state (Y_h): one kernel concatenates them with the last layer's
    last step. In layer 0's last slice it would need layer 2, which needs layer 0's whole output: a cycle."""
    steps = 4
    graph = zoo_rnn_graph("lstm_speaker", steps, None)
    concat = next(n for n in graph.nodes if {t["rnn_layer"] for t in node_rnn_tags(n)} == {0, 1, 2})
    grid = build_slice_grid(graph, 1)
    assert grid.layers == (0, 1, 2) and grid.slices == (steps,) * 3
    task = grid.tasks[grid.task_of[concat.id]]
    assert (task.layer, task.slice) == (2, steps - 1)
    cuts = list(grid.cuts())
    assert (0, 0, 0) in cuts and (steps,) * 3 in cuts and len(cuts) == 3 * steps + 1   # layer splits wait for layers
