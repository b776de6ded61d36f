"""Synthetic kernel-level OpNodes with realistic shapes and known latency laws (test helper, not a test module).

The latency laws are *made up* on purpose: tests check that a predictor recovers a known generating function.
"""
from __future__ import annotations

import numpy as np

from hetpart.graph import Edge, KernelGroup, OpGraph, OpNode, TensorSpec

F32 = 4


def conv_node(i: int, n: int, ci: int, co: int, hw: int, k: int, stride: int = 1, groups: int = 1,
              fused: bool = True) -> OpNode:
    ho = (hw + 2 * (k // 2) - k) // stride + 1
    flops = 2 * n * co * ho * ho * (ci // groups) * k * k
    data, weight, out = (n, ci, hw, hw), (co, ci // groups, k, k), (n, co, ho, ho)
    attrs = {"strides": [stride, stride], "padding": [k // 2] * 4, "dilation": [1, 1], "groups": groups,
             "data_layout": "NCHW", "kernel_layout": "OIHW"}
    wbytes = int(np.prod(weight)) * F32
    out_bytes = int(np.prod(out)) * F32
    return OpNode(
        id=i, name=f"k{i}", op="fused:nn.conv2d+add+nn.relu" if fused else "relax.nn.conv2d",
        input_shapes=(data, weight), input_dtypes=("float32", "float32"), output_shapes=(out,),
        output_dtypes=("float32",), attrs={"anchor_attrs": attrs} if fused else attrs,
        flops=flops + (2 * int(np.prod(out)) if fused else 0),
        bytes_read=int(np.prod(data)) * F32 + wbytes + (co * F32 if fused else 0), bytes_written=out_bytes,
        param_bytes=wbytes + (co * F32 if fused else 0), tags={"op_ids": [i]})


def matmul_node(i: int, m: int, k: int, n: int) -> OpNode:
    return OpNode(
        id=i, name=f"k{i}", op="fused:matmul+add", input_shapes=((m, k), (k, n)),
        input_dtypes=("float32", "float32"), output_shapes=((m, n),), output_dtypes=("float32",),
        attrs={"anchor_attrs": {"out_dtype": "void"}}, flops=2 * m * n * k + m * n,
        bytes_read=(m * k + k * n + n) * F32, bytes_written=m * n * F32, param_bytes=(k * n + n) * F32,
        tags={"op_ids": [i]})


def pool_node(i: int, n: int, c: int, hw: int, k: int, stride: int) -> OpNode:
    ho = (hw - k) // stride + 1
    return OpNode(
        id=i, name=f"k{i}", op="relax.nn.max_pool2d", input_shapes=((n, c, hw, hw),), input_dtypes=("float32",),
        output_shapes=((n, c, ho, ho),), output_dtypes=("float32",),
        attrs={"pool_size": [k, k], "strides": [stride, stride], "padding": [0, 0, 0, 0]},
        flops=n * c * ho * ho * k * k, bytes_read=n * c * hw * hw * F32, bytes_written=n * c * ho * ho * F32,
        tags={"op_ids": [i]})


def elementwise_node(i: int, shape: tuple[int, ...], members: int = 1) -> OpNode:
    elems = int(np.prod(shape))
    op = "relax.add" if members == 1 else "fused:" + "+".join(["add", "nn.relu", "multiply"][:members])
    return OpNode(
        id=i, name=f"k{i}", op=op, input_shapes=(shape, shape), input_dtypes=("float32", "float32"),
        output_shapes=(shape,), output_dtypes=("float32",), flops=elems * members,
        bytes_read=2 * elems * F32, bytes_written=elems * F32, tags={"op_ids": [i]})


def reshape_node(i: int, shape: tuple[int, ...]) -> OpNode:
    elems = int(np.prod(shape))
    return OpNode(id=i, name=f"k{i}", op="relax.reshape", input_shapes=(shape,), input_dtypes=("float32",),
                  output_shapes=((elems,),), output_dtypes=("float32",), bytes_read=elems * F32,
                  bytes_written=elems * F32, tags={"op_ids": [i]})


def random_kernels(rng: np.random.Generator, count: int, kinds: tuple[str, ...] = ("conv2d", "matmul", "pool",
                   "elementwise")) -> list[OpNode]:
    """``count`` kernels cycling over ``kinds`` with CNN/transformer-like shapes."""
    nodes: list[OpNode] = []
    channels = (16, 24, 32, 48, 64, 96, 128, 192, 256)
    for i in range(count):
        kind = kinds[i % len(kinds)]
        if kind == "conv2d":
            nodes.append(conv_node(i, int(rng.choice([1, 2])), int(rng.choice(channels)), int(rng.choice(channels)),
                                   int(rng.choice([7, 14, 28, 56])), int(rng.choice([1, 3])),
                                   int(rng.choice([1, 2]))))
        elif kind == "depthwise_conv2d":
            c = int(rng.choice(channels))
            nodes.append(conv_node(i, 1, c, c, int(rng.choice([7, 14, 28, 56])), 3, int(rng.choice([1, 2])),
                                   groups=c))
        elif kind == "matmul":
            nodes.append(matmul_node(i, int(rng.choice([1, 8, 32, 64, 128])), int(rng.choice([64, 128, 256, 512])),
                                     int(rng.choice([64, 128, 256, 512, 1000]))))
        elif kind == "pool":
            nodes.append(pool_node(i, 1, int(rng.choice(channels)), int(rng.choice([14, 28, 56, 112])),
                                   int(rng.choice([2, 3])), 2))
        elif kind == "elementwise":
            nodes.append(elementwise_node(i, (1, int(rng.choice(channels)), int(rng.choice([7, 14, 28, 56])),
                                              int(rng.choice([7, 14, 28, 56]))), int(rng.choice([1, 2, 3]))))
        else:
            nodes.append(reshape_node(i, (1, int(rng.choice(channels)), int(rng.choice([7, 14, 28])), 7)))
    return nodes


def synthetic_latency_us(nodes: list[OpNode], rng: np.random.Generator | None = None,
                         noise: float = 0.0) -> np.ndarray:
    """A made-up CPU-like law: 3 us launch + work at a per-kind rate (power laws), times log-normal noise."""
    out = []
    for node in nodes:
        gflop = node.flops / 1e9
        mbyte = (node.bytes_read + node.bytes_written) / 1e6
        if "conv2d" in node.op:
            t = 3.0 + 400.0 * gflop ** 0.95 + 20.0 * mbyte
        elif "matmul" in node.op:
            t = 3.0 + 250.0 * gflop ** 0.9 + 30.0 * mbyte
        elif "pool" in node.op:
            t = 2.0 + 80.0 * mbyte
        else:
            t = 1.0 + 50.0 * mbyte
        out.append(t)
    lat = np.array(out)
    if rng is not None and noise > 0:
        lat = lat * np.exp(rng.normal(0.0, noise, size=lat.shape))
    return lat


def chain_graph(nodes: list[OpNode], name: str = "chain") -> OpGraph:
    """A kernel-level chain graph (each kernel reads its predecessor) over copies of ``nodes``."""
    renumbered = [OpNode(**{**n.to_dict(), "id": i, "name": f"k{i}", "inputs": [i - 1] if i else [],
                            "kernel_group": i, "tags": {"op_ids": [i]}}) for i, n in enumerate(nodes)]
    edges = tuple(Edge(i - 1, i, renumbered[i - 1].bytes_written) for i in range(1, len(renumbered)))
    return OpGraph(nodes=tuple(renumbered), edges=edges,
                   inputs=(TensorSpec("x", (1,), "float32", None, (0,)),),
                   outputs=(TensorSpec("y", (1,), "float32", len(renumbered) - 1),),
                   kernel_groups=tuple(KernelGroup(i, f"k{i}", (i,)) for i in range(len(renumbered))),
                   name=name, level="kernel").validate()
