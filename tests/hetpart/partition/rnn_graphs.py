"""Synthetic unrolled-RNN OpGraphs named like ``tvm_passes.rnn``'s bindings, with seeded random two-device costs.

Per layer and direction: a prologue (``rnn{L}_d{D}_in_*``: initial state, a projection hoisted over all steps
unless projections are per slice), per step ``t`` a take of the projected input, the recurrent matmul and the
gate tail (``rnn{L}_d{D}_t{t}_*``), per slice a projection of that slice's input (``rnn{L}_d{D}_p{a}_*``, with
``projection="per_slice"``), and an epilogue stacking the outputs (``rnn{L}_dall_out_*``). Untagged ops: an
embedding before the recurrence, a reshape between hoisted layers and a decoder after it.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from hetpart.costs import CostTable
from hetpart.graph import Edge, OpGraph, OpNode, TensorSpec
from hetpart.partition.synthetic import synthetic_devices

STATE_BYTES = 4 * 650


def synthetic_rnn(layers: int = 2, steps: int = 6, *, bidirectional: Sequence[int] = (), projection: str = "per_slice",
                  projection_steps: int = 1, pre: bool = True, post: bool = True, seed: int = 0,
                  gpu_speedup: float = 3.0, gpu_preset: str = "p2200") -> tuple[OpGraph, CostTable]:
    rng = np.random.default_rng(seed)
    names: list[str] = []
    preds: list[list[int]] = []
    sizes: list[int] = []
    kinds: list[str] = []
    reads_input: list[bool] = []

    def op(name: str, inputs: Sequence[int], kind: str = "relax.add", size: int = STATE_BYTES) -> int:
        reads_input.append(not inputs and (name == "embed" or name.startswith("rnn0_") and "xproj" in name))
        names.append(name)
        preds.append(sorted(set(inputs)))
        sizes.append(size)
        kinds.append(kind)
        return len(names) - 1

    layer_input = [op("embed", [], "relax.take", STATE_BYTES * steps)] if pre else []
    prev_h: list[list[int]] | None = None       # per direction of the layer below: h op per time position
    for layer in range(layers):
        dirs = 2 if layer in bidirectional else 1
        h_at: list[list[int]] = [[-1] * steps for _ in range(dirs)]
        for d in range(dirs):
            h = op(f"rnn{layer}_d{d}_in_h0", [])
            hoisted = op(f"rnn{layer}_d{d}_in_xproj", layer_input, "relax.matmul", STATE_BYTES * 4 * steps) \
                if projection == "hoisted" else None
            proj = hoisted
            for t in range(steps):
                time = steps - 1 - t if d == 1 else t
                if hoisted is None and t % projection_steps == 0:
                    stop = min(steps, t + projection_steps)
                    span = range(steps - stop, steps - t) if d == 1 else range(t, stop)
                    reads = layer_input if prev_h is None else [hs[p] for hs in prev_h for p in span]
                    proj = op(f"rnn{layer}_d{d}_p{t}_xproj", reads, "relax.matmul", STATE_BYTES * 4 * len(span))
                x = op(f"rnn{layer}_d{d}_t{t}_x", [proj], "relax.take", STATE_BYTES * 4)
                gates = op(f"rnn{layer}_d{d}_t{t}_gates", [x, h], "relax.matmul", STATE_BYTES * 4)
                h = op(f"rnn{layer}_d{d}_t{t}_h", [gates, h])
                h_at[d][time] = h
        y = op(f"rnn{layer}_dall_out_Y", [v for hs in h_at for v in hs], "relax.stack", STATE_BYTES * steps * dirs)
        if projection == "hoisted" and layer + 1 < layers:
            layer_input = [op(f"reshape{layer}", [y], "relax.reshape", STATE_BYTES * steps * dirs)]
        else:
            layer_input = [y]
        prev_h = h_at
    if post:
        op("decoder", layer_input, "relax.matmul", 4 * 10_000 * steps)
    n = len(names)
    succ = {p for ps in preds for p in ps}
    sinks = [i for i in range(n) if i not in succ]
    nodes = tuple(OpNode(id=i, name=names[i], op=kinds[i], inputs=tuple(preds[i]), output_shapes=((sizes[i] // 4,),),
                         output_dtypes=("float32",), bytes_written=sizes[i],
                         graph_inputs=("x",) if reads_input[i] else ())
                  for i in range(n))
    graph = OpGraph(nodes=nodes, edges=tuple(Edge(p, i, sizes[p]) for i in range(n) for p in preds[i]),
                    inputs=(TensorSpec("x", (steps, 1), "int64", consumers=tuple(np.flatnonzero(reads_input))),),
                    outputs=tuple(TensorSpec(f"y{k}", nodes[s].output_shapes[0], "float32", producer=s)
                                  for k, s in enumerate(sinks)), name=f"rnn-{layers}x{steps}").validate()
    base = {"relax.matmul": 50.0, "relax.take": 3.0, "relax.add": 8.0, "relax.stack": 10.0, "relax.reshape": 4.0}
    cpu = np.array([base[k] * rng.lognormal(0.0, 0.3) for k in kinds])
    gpu = np.array([(c / (gpu_speedup * rng.lognormal(0.0, 0.3)) if k == "relax.matmul" else 5.0 + c / 4)
                    for c, k in zip(cpu, kinds)])
    costs = CostTable.from_arrays(np.stack([cpu, gpu], axis=1), synthetic_devices(gpu_preset), source="analytic",
                                  graph=graph)
    return graph, costs
