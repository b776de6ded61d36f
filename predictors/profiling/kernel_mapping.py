"""Pair a module's deployment kernels with the kernel-graph nodes a CostTable is built on.

Features must be identical at training and at prediction time. At prediction time a CostTable is built on the nodes
of ``tvm_passes.extract.extract_op_graph(mod).kernel_graph()``; so each measured deployment kernel takes its
features from that graph. :func:`map_kernels` pairs them: the i-th ``call_tir`` of the fused ``main`` of the
deployment pipeline is usually node i; :func:`align_calls` pairs each call with an unpaired node with the same
output shapes (same operand sizes and op names preferred, nearest position), which also covers branches the two
orders list differently. Every pairing is verified by output shapes; nodes left without a kernel must be host-side
shape computations. On any mismatch the model's kernels keep the TIR-derived features of
:func:`predictors.profiling.workloads.kernels_of_module`, a warning is logged, ``aligned`` is False and
:data:`ALIGNMENT_STATS` counts it (``predictors.fitting.training`` leaves such rows out of fits and counts them).
"""
from __future__ import annotations

import dataclasses
import logging
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from hetpart.graph import OpGraph
from predictors.profiling.profiler import KernelProfiler
from predictors.profiling.workloads import KernelWorkload, kernels_of_module
from tvm_passes.outline import flatten_tensor_types, fuse_for_deployment

logger = logging.getLogger(__name__)

ALIGNMENT_STATS = {"aligned": 0, "fallback_tir": 0}     # per process: how often map_kernels fell back
@dataclass(frozen=True)
class ModelKernels:
    """A module's kernel graph and its distinct deployment kernels (features taken from the graph if aligned)."""

    name: str
    graph: OpGraph                          # kernel level, exactly what a CostTable is built on
    workloads: tuple[KernelWorkload, ...]
    node_keys: tuple[str, ...]              # key hash of node i's kernel ("" = runs none); () if not aligned
    aligned: bool
    mismatch: str = ""                      # why the alignment failed
    token_mismatches: int = 0               # pairs with equal output shapes but different op names


def deployment_calls(mod: Any, target: Any, pipeline: Any) -> list[tuple[str, tuple[tuple[int, ...], ...]]]:
    """(PrimFunc name, output shapes) of every ``call_tir`` of the deployment pipeline's fused main, in order."""
    import tvm
    from tvm import relax

    fused = fuse_for_deployment(mod, target, pipeline)
    call_tir = tvm.ir.Op.get("relax.call_tir")
    calls = []
    for block in fused["main"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and value.op.same_as(call_tir):
                shapes = []
                for ty in flatten_tensor_types(value.ty_args):   # a fused split returns a tuple of tensors
                    try:
                        shapes.append(tuple(int(d) for d in ty.shape.values))
                    except (AttributeError, TypeError, ValueError):
                        shapes.append(())
                calls.append((value.args[0].name_hint, tuple(shapes)))
    return calls


_NAME_NOISE = {"fused", "tir", "nn", "relax", ""}


def op_tokens(name: str) -> tuple[str, ...]:
    """Op names in a kernel name, without TVM's numeric suffixes: 'fused_conv2d2_add2' -> ('conv2d', 'add')."""
    parts = re.split(r"[_+.:]", name)
    return tuple(t for t in (re.sub(r"(?<=[a-z])\d+$", "", p) if not p.endswith("2d") else p for p in parts)
                 if t not in _NAME_NOISE)


def operand_sizes(shapes: Sequence[Sequence[int]]) -> Counter:
    """Element counts of the non-scalar operands (a multiset): layout-independent, so a node and its deployment
    kernel share them even when the kernel's weights are prepacked or its scalars are inlined."""
    return Counter(n for n in (int(np.prod(s)) for s in shapes) if n > 1)


def shared_operands(a: Counter, b: Counter | None) -> int:
    """How many operand sizes two multisets share (0 when ``b`` is unknown)."""
    return 0 if b is None else sum((a & b).values())


def align_calls(calls: Sequence[tuple], graph: OpGraph) -> tuple[list[int] | None, str, int]:
    """Node index of each deployment call, or (None, why) when they cannot be paired.

    ``calls`` are ``(kernel name, output shapes)`` or ``(kernel name, output shapes, input shapes)``. Call i is
    paired with an unpaired node with the same output shapes, or one whose first outputs they are (a standalone
    ``batch_norm`` node lists its running mean and variance, which the deployment kernel does not write when
    nothing reads them), preferring -- in this order -- the most operand sizes in common (:func:`operand_sizes`; a
    node lists its group's external inputs, the kernel may also take constants), the same op tokens, equal (not
    prefix) shapes, the node nearest to position i (usually node i itself: same order).
    Inception-style branches write equal shapes from different convolutions, so the output shape alone would
    pair a 1x1 conv with a 3x3 one. Returns also how many pairs had equal shapes but different op tokens. Every
    call must find a node; nodes left unpaired must be ones that run no kernel in deployment (shape
    computations the VM does on the host), else the pairing fails.
    """
    if len(calls) > graph.num_ops:
        return None, f"{len(calls)} deployment kernels but only {graph.num_ops} kernel-graph nodes", 0
    free = set(range(graph.num_ops))
    shapes = [tuple(tuple(s) for s in n.output_shapes) for n in graph.nodes]
    sizes = [operand_sizes(n.input_shapes) for n in graph.nodes]
    tokens = [op_tokens(n.op if n.op.startswith("fused:") else n.op) for n in graph.nodes]
    out, token_mismatches = [], 0
    for i, call in enumerate(calls):
        func_name, call_shapes = call[0], call[1]
        call_sizes = operand_sizes(call[2]) if len(call) > 2 else None
        # equal output shapes, or a tuple-valued node whose unused outputs the deployment kernel does not write
        prefix_only = {j for j in free if len(shapes[j]) > len(call_shapes) and
                       shapes[j][:len(call_shapes)] == call_shapes}
        same_shape = [j for j in free if shapes[j] == call_shapes or j in prefix_only]
        if not same_shape:
            return None, (f"position {i}: kernel {func_name} writes {list(call_shapes)}; no unpaired kernel-graph "
                          f"node writes that (node {i}: {graph.nodes[i].op} writes {list(shapes[i])})"), 0
        call_tokens = op_tokens(func_name)
        token_mismatches += not any(tokens[j] == call_tokens for j in same_shape)
        j = min(same_shape, key=lambda j: (-shared_operands(sizes[j], call_sizes), tokens[j] != call_tokens,
                                            j in prefix_only, abs(j - i), j))
        free.remove(j)
        out.append(j)
    real = [j for j in sorted(free) if not _runs_no_kernel(graph.nodes[j])]
    if real:
        return None, (f"{len(real)} kernel-graph nodes that compute (e.g. node {real[0]}: {graph.nodes[real[0]].op}) "
                      "got no deployment kernel: the deployment pipeline fuses differently"), token_mismatches
    return out, "", token_mismatches


def _runs_no_kernel(node: Any) -> bool:
    """Shape computations and scalar reads of shapes, which the VM does on the host without a kernel."""
    out_elems = sum(int(np.prod(s)) for s in node.output_shapes)
    return node.shape_only or (node.flops == 0 and out_elems <= 64)


def map_kernels(mod: Any, name: str, profiler: KernelProfiler) -> ModelKernels:
    """Distinct deployment kernels of ``mod`` with features of their kernel-graph nodes (see module docstring)."""
    from tvm_passes.extract import extract_op_graph

    graph = extract_op_graph(mod, name=name).kernel_graph()
    workloads = kernels_of_module(mod, profiler.tvm_target)
    calls = deployment_calls(mod, profiler.tvm_target, profiler.pipeline)
    by_instance = {inst: w for w in workloads for inst in w.instance_names}
    missing = [f for f, _ in calls if f not in by_instance]
    node_of_call, mismatch, token_mismatches = align_calls(
        [(f, shapes, by_instance[f].input_shapes) if f in by_instance else (f, shapes) for f, shapes in calls], graph)
    if missing:
        mismatch = f"deployment kernels {missing[:3]} are not among the profiled kernels"
    if node_of_call is None or missing:
        ALIGNMENT_STATS["fallback_tir"] += 1
        logger.warning("%s: deployment kernels and kernel-graph nodes do not align (%s); its kernels keep "
                       "TIR-derived features and are left out of fits", name, mismatch)
        return ModelKernels(name, graph, tuple(workloads), (), False, mismatch)
    ALIGNMENT_STATS["aligned"] += 1
    kernel_less = sorted(set(range(graph.num_ops)) - set(node_of_call))
    if kernel_less:
        logger.info("%s: %d kernel-graph nodes run no kernel in deployment: %s", name, len(kernel_less),
                    sorted({graph.nodes[j].op for j in kernel_less}))
    if token_mismatches:
        logger.info("%s: %d kernels paired by output shape only (op names differ)", name, token_mismatches)
    reordered = sum(j != i for i, j in enumerate(node_of_call))
    if reordered:
        logger.info("%s: %d of %d kernels run in a different order than the kernel graph lists them", name,
                    reordered, len(calls))
    node_keys = [""] * graph.num_ops
    node_of: dict[str, int] = {}
    for (func_name, _), j in zip(calls, node_of_call):
        key = by_instance[func_name].key_hash
        node_keys[j] = key
        node_of.setdefault(key, j)
    mapped = []
    for w in workloads:
        node = graph.nodes[node_of[w.key_hash]].to_dict()
        tir_hash = w.features.get("tags", {}).get("tir_hash", "")
        features = {**node, "tags": {**node["tags"], "tir_hash": tir_hash, "source": "kernel_graph"}}
        mapped.append(dataclasses.replace(w, features=features))
    return ModelKernels(name, graph, tuple(mapped), tuple(node_keys), True, "", token_mismatches)
