"""Shared cases for the task-runtime tests: a small branchy Relax module and random pinned plans of it."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from hetpart.plan import Plan


def small_module():
    """Ten ops with branches, a concat of three producers and two outputs (1 x 16 float32 input)."""
    from tvm import relax

    rng = np.random.default_rng(0)

    def const(*shape):
        return relax.const(rng.standard_normal(shape).astype("float32"))

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.matmul(x, const(16, 16)), name_hint="a")
            b = bb.emit(relax.op.nn.relu(a), name_hint="b")
            c = bb.emit(relax.op.sigmoid(a), name_hint="c")
            d = bb.emit(relax.op.matmul(b, const(16, 16)), name_hint="d")
            e = bb.emit(relax.op.add(c, d), name_hint="e")
            f = bb.emit(relax.op.tanh(b), name_hint="f")
            g = bb.emit(relax.op.multiply(e, f), name_hint="g")
            h = bb.emit(relax.op.concat([g, c, x], axis=1), name_hint="h")
            i = bb.emit(relax.op.sum(h, axis=[1], keepdims=True), name_hint="i")
            j = bb.emit(relax.op.add(relax.op.multiply(i, const(1, 1)), x), name_hint="j")
            out = bb.emit_output(relax.Tuple([h, j]))
        bb.emit_func_output(out)
    return bb.get()


def random_plan(graph, device_of: Sequence[str], devices: Sequence[str], pick: Callable[[int], int]) -> Plan:
    """An op-level plan placing op k on ``device_of[k]``, issued in a random topological order: ``pick(n)``
    chooses which of the n ready ops goes next."""
    missing = [len(set(n.inputs)) for n in graph.nodes]
    users: list[list[int]] = [[] for _ in graph.nodes]
    for n in graph.nodes:
        for p in set(n.inputs):
            users[p].append(n.id)
    ready, order = [i for i, m in enumerate(missing) if not m], []
    while ready:
        v = ready.pop(pick(len(ready)))
        order.append(v)
        for w in users[v]:
            missing[w] -= 1
            if not missing[w]:
                ready.append(w)
    return Plan(device_of=list(device_of), order=order, devices=tuple(devices), method="random",
                graph_hash=graph.structure_hash(), level="op").validate(graph)


def mixed_squeezenet(size: int):
    """SqueezeNet compiled for cpu + an emulated T4, every op on the GPU but the pools (a mixed, segmented plan)."""
    import hetpart

    return hetpart.compile("squeezenet1_1", size=size, devices="cpu,gpu=t4", method="all_gpu",
                           pins={"op:relax.nn.*pool2d": "cpu"})


def imported_module(compiled):
    """The Relax module ``compiled`` was compiled from, imported again from its ONNX file."""
    from tvm_passes.sources import import_model

    return import_model(compiled.source["onnx_path"],
                        input_shapes={i["name"]: i["shape"] for i in compiled.source["inputs"]}).mod
