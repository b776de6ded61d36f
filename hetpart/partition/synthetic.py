"""Seeded synthetic DAGs with CPU/GPU costs, for tests and the partitioner benchmark.

Three shapes: ``layered`` (layers of parallel ops, random edges from the previous layers), ``branchy``
(a backbone with Inception-like fork/join blocks) and ``series_parallel`` (recursive series/parallel
composition). Costs come from a seeded random generator: CPU latencies are log-normal; the GPU speed-up of
an op depends on its kind (heavy ops such as conv2d/matmul gain most, small element-wise ops are dominated
by launch overhead and can be slower on the GPU). Devices and links are the real ``cpu_device()`` and a
datasheet GPU preset (``gpu_from_preset``/``preset_links``), so copy costs are realistic.
These are *synthetic* numbers for exercising planners, never measurements.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from hetpart.costs import CostTable
from hetpart.devices import DeviceSet, cpu_device, gpu_from_preset, preset_links
from hetpart.graph import Edge, OpGraph, OpNode, TensorSpec

# (op name, median CPU latency in us, GPU speed-up range (low, high))
OP_KINDS: tuple[tuple[str, float, tuple[float, float]], ...] = (
    ("relax.nn.conv2d", 2000.0, (5.0, 40.0)),
    ("relax.matmul", 1500.0, (5.0, 30.0)),
    ("relax.add", 60.0, (0.3, 4.0)),
    ("relax.nn.relu", 40.0, (0.3, 3.0)),
    ("relax.nn.max_pool2d", 200.0, (1.0, 8.0)),
    ("relax.concat", 80.0, (0.5, 3.0)),
)
KIND_WEIGHTS = np.array([0.35, 0.15, 0.2, 0.15, 0.1, 0.05])


def _edges_layered(n: int, rng: np.random.Generator) -> list[list[int]]:
    width = max(1, int(round(np.sqrt(n) / 2)))
    preds: list[list[int]] = [[] for _ in range(n)]
    layer_of = [i // width for i in range(n)]
    for i in range(width, n):
        lo = (layer_of[i] - 1) * width
        candidates = list(range(max(0, lo - width), layer_of[i] * width))
        k = int(rng.integers(1, min(3, len(candidates)) + 1))
        preds[i] = sorted(int(c) for c in rng.choice(candidates, size=k, replace=False))
    return preds


def _edges_branchy(n: int, rng: np.random.Generator) -> list[list[int]]:
    preds: list[list[int]] = [[] for _ in range(n)]
    i, last = 1, 0
    while i < n:
        if rng.random() < 0.3 and n - i > 6:
            tails = []
            for _ in range(int(rng.integers(2, 5))):
                length = int(rng.integers(1, 4))
                if i + length >= n - 1:
                    break
                preds[i] = [last]
                for j in range(i + 1, i + length):
                    preds[j] = [j - 1]
                tails.append(i + length - 1)
                i += length
            if tails and i < n:
                preds[i] = sorted(set(tails))
                last, i = i, i + 1
        else:
            preds[i] = [last]
            last, i = i, i + 1
    return preds


def _edges_series_parallel(n: int, rng: np.random.Generator) -> list[list[int]]:
    preds: list[list[int]] = [[] for _ in range(n)]
    counter = [0]

    def build(budget: int, sources: list[int]) -> list[int]:
        """Create ``budget`` ops fed by ``sources``; return the sink ops."""
        if budget <= 0:
            return sources
        if budget <= 2 or rng.random() < 0.4:
            tail = sources
            for _ in range(budget):
                v = counter[0]
                counter[0] += 1
                preds[v] = sorted(set(tail))
                tail = [v]
            return tail
        if rng.random() < 0.5:
            left = int(rng.integers(1, budget))
            return build(budget - left, build(left, sources))
        left = int(rng.integers(1, budget - 1))
        a = build(left, sources)
        b = build(budget - left - 1, sources)
        v = counter[0]
        counter[0] += 1
        preds[v] = sorted(set(a + b))
        return [v]

    build(n, [])
    return preds


SHAPES: dict[str, Callable[[int, np.random.Generator], list[list[int]]]] = {
    "layered": _edges_layered, "branchy": _edges_branchy, "series_parallel": _edges_series_parallel}


def synthetic_devices(gpu_preset: str = "p2200") -> DeviceSet:
    return DeviceSet((cpu_device(), gpu_from_preset(gpu_preset)), preset_links(gpu_preset)).validate()


def synthetic_problem(shape: str, n_ops: int, seed: int = 0, *, gpu_preset: str = "p2200",
                      gpu_unsupported_fraction: float = 0.0, shape_only_fraction: float = 0.0,
                      param_bytes_scale: float = 1.0, gpu_speedup_scale: float = 1.0) -> tuple[OpGraph, CostTable]:
    """A seeded random DAG of ``n_ops`` ops of the given ``shape`` and its (cpu, gpu) CostTable.

    ``gpu_speedup_scale`` multiplies every op's GPU speed-up (< 1: a weaker GPU, so that splitting pays)."""
    if shape not in SHAPES:
        raise ValueError(f"unknown synthetic shape {shape!r}; choose one of {sorted(SHAPES)}")
    if n_ops < 1:
        raise ValueError(f"n_ops must be >= 1; found {n_ops}")
    rng = np.random.default_rng(seed)
    preds = SHAPES[shape](n_ops, rng)
    kinds = rng.choice(len(OP_KINDS), size=n_ops, p=KIND_WEIGHTS / KIND_WEIGHTS.sum())
    out_elems = rng.choice([1 << 10, 1 << 14, 1 << 16, 1 << 18], size=n_ops)
    nodes, edges = [], []
    latency = np.empty((n_ops, 2))
    shape_only = rng.random(n_ops) < shape_only_fraction
    for i in range(n_ops):
        name, median_us, (lo, hi) = OP_KINDS[int(kinds[i])]
        out_shape = (1, int(out_elems[i]))
        params = int(out_elems[i] * 4 * param_bytes_scale) if name in ("relax.nn.conv2d", "relax.matmul") else 0
        nodes.append(OpNode(
            id=i, name=f"op{i}", op="relax.shape_of" if shape_only[i] else name, inputs=tuple(preds[i]),
            input_shapes=tuple((1, int(out_elems[p])) for p in preds[i]) or ((1, int(out_elems[i])),),
            input_dtypes=("float32",) * max(1, len(preds[i])),
            output_shapes=(out_shape,), output_dtypes=("float32",), bytes_written=int(out_elems[i]) * 4,
            param_bytes=params, shape_only=bool(shape_only[i]), graph_inputs=() if preds[i] else ("x",)))
        for p in preds[i]:
            edges.append(Edge(p, i, int(out_elems[p]) * 4))
        cpu_us = median_us * float(rng.lognormal(0.0, 0.6))
        latency[i] = (cpu_us, cpu_us / (float(rng.uniform(lo, hi)) * gpu_speedup_scale))
        if shape_only[i]:
            latency[i] = (float(rng.uniform(1.0, 5.0)), float(rng.uniform(5.0, 20.0)))
    supported = np.ones((n_ops, 2), dtype=bool)
    supported[:, 1] = rng.random(n_ops) >= gpu_unsupported_fraction
    has_succ = {e.src for e in edges}
    sinks = [i for i in range(n_ops) if i not in has_succ]
    graph = OpGraph(
        nodes=tuple(nodes), edges=tuple(edges),
        inputs=(TensorSpec("x", (1, 1 << 14), "float32", consumers=tuple(i for i in range(n_ops) if not preds[i])),),
        outputs=tuple(TensorSpec(f"y{k}", nodes[s].output_shapes[0], "float32", producer=s)
                      for k, s in enumerate(sinks)),
        name=f"{shape}-{n_ops}-s{seed}").validate()
    costs = CostTable.from_arrays(latency, synthetic_devices(gpu_preset), supported=supported,
                                  source="analytic", graph=graph, provenance={"synthetic_seed": seed})
    return graph, costs
