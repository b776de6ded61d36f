"""Shared builders for hetpart tests: hand-made two-device problems with easy arithmetic.

The links of ``tiny_problem`` copy 1 byte per microsecond after a 10 us latency, so a copy of B bytes takes
exactly ``10 + B`` us and timelines can be computed by hand.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pytest

from hetpart.costs import CostTable
from hetpart.devices import DeviceSet, DeviceSpec, Link
from hetpart.graph import Edge, OpGraph, OpNode, TensorSpec

LINK_BYTES_PER_S = 1e6
LINK_LATENCY_US = 10.0


def tiny_problem(latency_us: Sequence[tuple[float, float]], edges: Sequence[tuple[int, int, int]] = (), *,
                 input_bytes: int = 50, input_consumers: Sequence[int] = (0,),
                 outputs: Sequence[tuple[int, int]] = (), param_bytes: Sequence[int] | None = None,
                 bytes_written: Sequence[int] | None = None, supported: np.ndarray | None = None,
                 memory_bytes: tuple[int, int] = (1 << 30, 1 << 30), names: Sequence[str] | None = None,
                 shape_only: Sequence[int] = ()) -> tuple[OpGraph, CostTable]:
    """Ops with (cpu, gpu) latencies, edges (src, dst, bytes), one model input "x", outputs (producer, bytes)."""
    n = len(latency_us)
    preds: list[list[int]] = [[] for _ in range(n)]
    for s, d, _ in edges:
        preds[d].append(s)
    nodes = tuple(OpNode(
        id=i, name=(names[i] if names else f"op{i}"), op="relax.nn.conv2d" if i % 2 == 0 else "relax.add",
        inputs=tuple(sorted(preds[i])), bytes_written=(bytes_written[i] if bytes_written else 0),
        param_bytes=(param_bytes[i] if param_bytes else 0), shape_only=i in shape_only,
        graph_inputs=("x",) if i in input_consumers else ()) for i in range(n))
    graph = OpGraph(
        nodes=nodes, edges=tuple(Edge(s, d, b) for s, d, b in sorted(edges)),
        inputs=(TensorSpec("x", (input_bytes,), "int8", consumers=tuple(input_consumers)),),
        outputs=tuple(TensorSpec(f"y{k}", (b,), "int8", producer=p) for k, (p, b) in enumerate(outputs)),
        name="tiny").validate()
    devices = DeviceSet(
        (DeviceSpec("cpu", "cpu", {"kind": "llvm"}, memory_bytes[0]),
         DeviceSpec("gpu", "gpu", {"kind": "cuda", "arch": "sm_75"}, memory_bytes[1], source="datasheet")),
        (Link("cpu", "gpu", LINK_BYTES_PER_S, LINK_LATENCY_US), Link("gpu", "cpu", LINK_BYTES_PER_S, LINK_LATENCY_US)))
    costs = CostTable.from_arrays(np.array(latency_us, dtype=float).reshape(n, 2), devices, supported=supported,
                                  graph=graph, source="measured")
    return graph, costs


@pytest.fixture
def make_tiny():
    return tiny_problem
