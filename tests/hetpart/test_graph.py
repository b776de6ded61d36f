"""hetpart.graph: validation, JSON round-trip, dependency matrix and the kernel view, incl. random DAGs."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetpart.errors import InvalidGraphError, SchemaError
from hetpart.graph import Edge, KernelGroup, OpGraph, OpNode, TensorSpec, dtype_bytes


def chain_graph() -> OpGraph:
    nodes = (
        OpNode(0, "a", "relax.nn.conv2d", output_shapes=[(1, 4)], output_dtypes=["float32"], flops=100,
               bytes_written=16, param_bytes=8, kernel_group=0, graph_inputs=["x"]),
        OpNode(1, "b", "relax.nn.relu", inputs=[0], output_shapes=[(1, 4)], output_dtypes=["float32"], flops=4,
               bytes_written=16, kernel_group=0),
        OpNode(2, "c", "relax.matmul", inputs=[1], output_shapes=[(1, 2)], output_dtypes=["float32"], flops=16,
               bytes_written=8, kernel_group=1),
        OpNode(3, "d", "relax.add", inputs=[1, 2], output_shapes=[(1, 2)], output_dtypes=["float32"], flops=2,
               bytes_written=8, kernel_group=1),
    )
    edges = (Edge(0, 1, 16), Edge(1, 2, 16), Edge(1, 3, 16), Edge(2, 3, 8))
    return OpGraph(nodes, edges, inputs=(TensorSpec("x", (1, 4), "float32", consumers=(0,)),),
                   outputs=(TensorSpec("y", (1, 2), "float32", producer=3),),
                   kernel_groups=(KernelGroup(0, "fused_conv2d_relu", (0, 1)), KernelGroup(1, "fused_mm_add", (2, 3))),
                   name="chain").validate()


@st.composite
def random_dags(draw, max_ops: int = 25) -> OpGraph:
    n = draw(st.integers(1, max_ops))
    edges = []
    for dst in range(1, n):
        srcs = draw(st.sets(st.integers(0, dst - 1), max_size=3))
        edges += [Edge(s, dst, draw(st.integers(0, 10_000))) for s in sorted(srcs)]
    producers = {i: sorted(e.src for e in edges if e.dst == i) for i in range(n)}
    nodes = tuple(OpNode(i, f"op{i}", draw(st.sampled_from(["relax.add", "relax.nn.conv2d", "relax.matmul"])),
                         inputs=producers[i], flops=draw(st.integers(0, 10 ** 9)),
                         bytes_written=draw(st.integers(0, 10 ** 6)), kernel_group=i // 2) for i in range(n))
    groups = tuple(KernelGroup(g, f"k{g}", tuple(i for i in range(n) if i // 2 == g)) for g in range((n + 1) // 2))
    return OpGraph(nodes, tuple(edges), kernel_groups=groups, name="random")


@settings(max_examples=60, deadline=None)
@given(random_dags())
def test_random_graphs_validate_and_round_trip(graph):
    graph.validate()
    again = OpGraph.from_json(graph.to_json())
    assert again == graph
    dense = graph.dependency_matrix_dense()
    assert dense.sum() == len(graph.edges) and np.all(np.tril(dense) == 0)


@settings(max_examples=60, deadline=None)
@given(random_dags())
def test_kernel_view_preserves_totals(graph):
    kernels = graph.kernel_graph().validate()
    assert kernels.total_flops == graph.total_flops
    assert sorted(i for n in kernels.nodes for i in n.tags["op_ids"]) == list(range(graph.num_ops))
    assert all(e.size_bytes <= sum(x.size_bytes for x in graph.edges) for e in kernels.edges)


def test_kernel_view_counts_a_shared_tensor_once():
    kernels = chain_graph().kernel_graph()
    assert kernels.num_ops == 2
    (edge,) = kernels.edges
    assert (edge.src, edge.dst, edge.size_bytes) == (0, 1, 16)      # b's output read by c and d: once
    assert kernels.nodes[1].op == "fused:matmul+add"
    assert kernels.nodes[0].bytes_written == 16 and kernels.nodes[1].bytes_written == 8
    assert kernels.outputs[0].producer == 1 and kernels.inputs[0].consumers == (0,)
    with pytest.raises(InvalidGraphError, match="already kernel level"):
        kernels.kernel_graph()


def slicing_graph(second_reader: str) -> OpGraph:
    """A 1024-byte projection read by a take of one 64-byte row (its own kernel) and by a kernel of a 256-byte
    strided_slice and ``second_reader``, which reads the projection whole unless it slices too."""
    def op(i, op_name, inputs, written, group, read=0, params=0):
        return OpNode(i, f"op{i}", op_name, inputs=inputs, output_shapes=[(written // 4,)],
                      output_dtypes=["float32"], bytes_read=read, bytes_written=written, param_bytes=params,
                      kernel_group=group, graph_inputs=["x"] if not inputs else [])
    nodes = (op(0, "relax.matmul", [], 1024, 0, read=512 + 128, params=128),
             op(1, "relax.take", [0], 64, 1, read=64 + 8, params=8),
             op(2, "relax.strided_slice", [0], 256, 2, read=256),
             op(3, second_reader, [0, 2], 256, 2, read=1024 + 256),
             op(4, "relax.add", [1, 3], 64, 3, read=64 + 256))
    edges = (Edge(0, 1, 1024), Edge(0, 2, 1024), Edge(0, 3, 1024), Edge(1, 4, 64), Edge(2, 3, 256), Edge(3, 4, 256))
    return OpGraph(nodes, edges, inputs=(TensorSpec("x", (128,), "float32", consumers=(0,)),),
                   outputs=(TensorSpec("y", (16,), "float32", producer=4),),
                   kernel_groups=tuple(KernelGroup(g, f"k{g}", ids) for g, ids in
                                       enumerate([(0,), (1,), (2, 3), (4,)])), name="slices").validate()


@settings(max_examples=60, deadline=None)
@given(random_dags(), st.sets(st.integers(0, 24)))
def test_slicing_members_read_at_most_the_whole_tensors(graph, slicing):
    """Turning ops into takes never adds bytes to a kernel, and a take's kernel reads at most what it writes of
    each producer; the kernel edges (copies) keep the whole tensors."""
    sliced = OpGraph(tuple(dataclasses.replace(n, op="relax.take") if n.id in slicing else n for n in graph.nodes),
                     graph.edges, kernel_groups=graph.kernel_groups, name="random")
    before, after = graph.kernel_graph(), sliced.kernel_graph()
    assert after.edges == before.edges
    for old, new in zip(before.nodes, after.nodes):
        assert new.bytes_read <= old.bytes_read
        if all(i in slicing for i in new.tags["op_ids"]):
            producers = {e.src for e in graph.edges if e.dst in new.tags["op_ids"]} - set(new.tags["op_ids"])
            assert new.bytes_read <= len(producers) * sum(graph.nodes[i].bytes_written for i in new.tags["op_ids"])


def test_kernel_view_counts_what_slicing_members_read():
    kernels = slicing_graph("relax.add").kernel_graph()
    take, mixed = kernels.nodes[1], kernels.nodes[2]
    assert take.bytes_read == 64 + 8                 # one row of the projection and its constant index
    assert mixed.bytes_read == 1024                  # the add reads the projection whole: counted once, whole
    assert {(e.src, e.dst): e.size_bytes for e in kernels.edges}[(0, 1)] == 1024   # a copy still moves it whole
    sliced = slicing_graph("relax.strided_slice").kernel_graph()
    assert sliced.nodes[2].bytes_read == 256 + 256   # two windows of it
    assert sliced.nodes[0].bytes_read == 512 + 128   # the graph input and the weights, as before


def _mutated(**changes) -> dict:
    data = chain_graph().to_dict()
    data.update(changes)
    return data


def test_invalid_json_raises_typed_errors():
    data = chain_graph().to_dict()
    cyclic = json.loads(json.dumps(data))
    cyclic["edges"].append([3, 1, 8])
    cyclic["nodes"][1]["inputs"] = [0, 3]
    with pytest.raises(InvalidGraphError, match="backwards|topological"):
        OpGraph.from_dict(cyclic)
    dangling = json.loads(json.dumps(data))
    dangling["edges"].append([1, 9, 8])
    with pytest.raises(InvalidGraphError, match="dangling"):
        OpGraph.from_dict(dangling)
    with pytest.raises(SchemaError, match="schema_version=1"):
        OpGraph.from_dict(_mutated(schema_version=99))
    with pytest.raises(SchemaError, match="not valid JSON"):
        OpGraph.from_json("{nope")
    missing = json.loads(json.dumps(data))
    del missing["nodes"]
    with pytest.raises(SchemaError, match="malformed"):
        OpGraph.from_dict(missing)
    inconsistent = json.loads(json.dumps(data))
    inconsistent["nodes"][2]["inputs"] = [0]
    with pytest.raises(InvalidGraphError, match="edges give"):
        OpGraph.from_dict(inconsistent)
    assert issubclass(InvalidGraphError, ValueError) and issubclass(SchemaError, ValueError)


def test_nodes_are_frozen_and_negative_costs_rejected():
    graph = chain_graph()
    with pytest.raises(AttributeError):
        graph.nodes[0].flops = 3  # type: ignore[misc]
    bad = OpGraph((OpNode(0, "a", "relax.add", flops=-1),), ())
    with pytest.raises(InvalidGraphError, match="flops must be >= 0"):
        bad.validate()


def test_dense_matrix_refuses_huge_graphs(monkeypatch):
    import hetpart.graph as g

    monkeypatch.setattr(g, "DENSE_MATRIX_MAX_OPS", 2)
    with pytest.raises(InvalidGraphError, match="scipy.sparse"):
        chain_graph().dependency_matrix_dense()


def test_dtype_sizes_and_structure_hash():
    assert dtype_bytes("float32") == 4 and dtype_bytes("int64") == 8 and dtype_bytes("bool") == 1
    assert dtype_bytes("float16") == 2
    with pytest.raises(InvalidGraphError):
        dtype_bytes("handle")
    a, b = chain_graph(), chain_graph()
    assert a.structure_hash() == b.structure_hash()
    assert a.structure_hash() != a.kernel_graph().structure_hash()
