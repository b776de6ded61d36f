"""Builders for the training-planner tests: random small DAGs with training costs on a test cluster."""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from hetpart.graph import Edge, OpGraph, OpNode, TensorSpec
from hetpart.training.cluster import Cluster, LinkPreset
from hetpart.training.cost_model import TrainCosts

# 1 byte per microsecond after 1 us: a message of B bytes takes 1 + B us
TEST_LINK = LinkPreset("test", 1e6, 1.0, "assumed")
IDEAL_LINK = LinkPreset("ideal", 1e15, 0.0, "assumed")


def make_cluster(spec: str, link: LinkPreset = TEST_LINK, inter: LinkPreset | None = None,
                 memory_bytes: int | None = None) -> Cluster:
    cluster = replace(Cluster.parse(spec), intra_node_link=link, inter_node_link=inter or link)
    if memory_bytes is not None:
        cluster = replace(cluster, devices=tuple(replace(d, memory_bytes=memory_bytes) for d in cluster.devices))
    return cluster.validate()


def make_graph(n: int, edges: Sequence[tuple[int, int, int]], *, bytes_written: Sequence[int] | None = None,
               param_bytes: Sequence[int] | None = None, input_consumers: Sequence[int] = (0,),
               input_bytes: int = 4, output_bytes: int = 4, name: str = "g") -> OpGraph:
    preds: list[list[int]] = [[] for _ in range(n)]
    for s, d, _ in edges:
        preds[d].append(s)
    nodes = tuple(OpNode(id=i, name=f"op{i}", op="relax.nn.conv2d" if i % 2 == 0 else "relax.add",
                         inputs=tuple(sorted(preds[i])), bytes_written=bytes_written[i] if bytes_written else 0,
                         param_bytes=param_bytes[i] if param_bytes else 0,
                         graph_inputs=("x",) if i in input_consumers else ()) for i in range(n))
    return OpGraph(nodes=nodes, edges=tuple(Edge(s, d, b) for s, d, b in sorted(edges)),
                   inputs=(TensorSpec("x", (input_bytes,), "int8", consumers=tuple(input_consumers)),),
                   outputs=(TensorSpec("y", (output_bytes,), "int8", producer=n - 1),), name=name).validate()


def make_costs(graph: OpGraph, cluster: Cluster, forward_us: Sequence[float] | np.ndarray,
               backward_ratio: float = 2.0, speed: dict[str, float] | None = None,
               optimizer: str = "sgd") -> TrainCosts:
    """Forward time per op on the first preset; other presets run ``speed[preset]`` times slower."""
    fwd = np.asarray(forward_us, dtype=float)
    cols = np.stack([fwd * (speed or {}).get(d.preset, 1.0) for d in cluster.devices], axis=1)
    return TrainCosts(device_names=cluster.names, device_presets=tuple(d.preset for d in cluster.devices),
                      forward_us=cols, backward_us=cols * backward_ratio,
                      activation_bytes=np.array([n.bytes_written for n in graph.nodes]),
                      param_bytes=np.array([n.param_bytes for n in graph.nodes]), optimizer=optimizer,
                      graph_hash=graph.structure_hash(), model=graph.name).validate(graph)


def random_dag(rng: np.random.Generator, n: int, p_edge: float = 0.4, max_bytes: int = 20) -> OpGraph:
    edges = []
    for d in range(1, n):
        srcs = [s for s in range(d) if rng.random() < p_edge] or [int(rng.integers(0, d))]
        edges += [(s, d, int(rng.integers(0, max_bytes))) for s in srcs]
    return make_graph(n, edges, bytes_written=[int(v) for v in rng.integers(0, 30, n)],
                      param_bytes=[int(v) for v in rng.integers(0, 40, n)])
