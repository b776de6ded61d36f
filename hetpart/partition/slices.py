"""Time slices of an unrolled RNN: the task grid the time-slice pipeline scheduler cuts.

``tvm_passes.rnn`` unrolls ONNX LSTM/GRU/RNN nodes and names every binding it emits with a tag (the grammar is
:data:`RNN_TAG_RE`, decoded by :func:`parse_rnn_tag`); the extractor copies the decoded tag of each op into
``node.tags``. A fused kernel keeps only its last op's tags, so at kernel level the tags of every member op are
read back from ``node.tags["op_names"]``.

:func:`build_slice_grid` groups the ops of an unrolled RNN graph into tasks. Task ``(layer l, slice s)`` holds
the ops of RNN node ``l`` (both directions of a bidirectional node) whose iteration step ``t`` has
``t // slice_steps == s``; a node's prologue (weight slicing, initial state, a projection hoisted over all steps)
joins its first slice and its epilogue (stacking the per-step outputs) its last slice. A kernel holding ops of
several tasks goes to the lowest layer among them, and there to the latest slice; where that makes the tasks depend
on each other in a cycle (a stacked LSTM's final states of every layer concatenated in one kernel with the last
layer's last step), such kernels go to their highest layer instead. Untagged ops join the latest
task among their producers (ops after the recurrence join the last slice), or, with no tagged producer, the
earliest task among their consumers (ops before the recurrence join the first slice). The grid's edges are the
task pairs the graph's edges connect: ``(l-1, s) -> (l, s)`` and ``(l, s-1) -> (l, s)`` for a stacked
unidirectional RNN whose input projection is computed per slice, more where the graph needs more (a hoisted
projection makes layer ``l+1`` wait for all of layer ``l``; a bidirectional layer's reverse direction makes the
next layer wait for its last slice).

A **cut** is one prefix length per layer, ``cut[i]`` slices of ``grid.layers[i]``: the tasks ``s < cut[i]``. A
cut is a down-set (ideal) of the task DAG when every edge into it starts inside it; :meth:`SliceGrid.cuts`
enumerates exactly those (layer splits, time splits and wavefronts alike). On the plain grid they are the
staircases ``cut[0] >= cut[1] >= ...``, C(S + L, L) of them for L layers of S slices.

Imports nothing outside the core.
"""
from __future__ import annotations

import heapq
import logging
import re
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from hetpart.errors import InvalidGraphError, UsageError
from hetpart.graph import OpGraph, OpNode

logger = logging.getLogger(__name__)

#: The names ``tvm_passes.rnn`` gives its bindings: ``rnn{L}_d{D}_t{T}_*`` (recurrence step T), ``rnn{L}_d{D}_p{T}_*``
#: (input projection of the slice starting at step T), ``rnn{L}_d{D}_in_*`` (prologue), ``rnn{L}_d{D|all}_out_*``
#: (epilogue).
RNN_TAG_RE = re.compile(r"^rnn(?P<layer>\d+)_d(?P<dir>\d+|all)_(?:(?P<phase>in|out)|t(?P<step>\d+)|p(?P<proj>\d+))_")
_PHASES = {"in": "input_projection", "out": "output"}


def parse_rnn_tag(var_name: str) -> dict[str, Any] | None:
    """``{"rnn_layer", "rnn_direction", "rnn_step", "rnn_phase"}`` of a tagged binding name, else None.

    Direction -1 spans all directions; step -1 lies outside the recurrence (prologue, epilogue); phase is
    "step", "input_projection" (prologue, or a projection per slice: then its step is the slice's first step)
    or "output"."""
    match = RNN_TAG_RE.match(var_name)
    if match is None:
        return None
    direction = -1 if match["dir"] == "all" else int(match["dir"])
    if match["step"] is not None:
        step, phase = int(match["step"]), "step"
    elif match["proj"] is not None:
        step, phase = int(match["proj"]), "input_projection"
    else:
        step, phase = -1, _PHASES[match["phase"]]
    return {"rnn_layer": int(match["layer"]), "rnn_direction": direction, "rnn_step": step, "rnn_phase": phase}


def node_rnn_tags(node: OpNode) -> list[dict[str, Any]]:
    """The RNN tags of an op (its tags, or its name), or of every member op of a fused kernel."""
    tags = [parse_rnn_tag(name) for name in (node.tags.get("op_names") or (node.name,))]
    found = [t for t in tags if t is not None]
    if "rnn_layer" in node.tags:
        found.append({k: node.tags[k] for k in ("rnn_layer", "rnn_direction", "rnn_step", "rnn_phase")})
    return found


class NoRnnTagsError(InvalidGraphError):
    """The graph has no op tagged by the RNN unrolling, so it has no time slices."""


class SliceGridError(InvalidGraphError):
    """The RNN tags and the graph's dependencies do not form a slice grid (a task DAG with a cycle)."""


@dataclass(frozen=True)
class SliceTask:
    """The ops of one slice of one RNN layer (both directions)."""

    layer: int                  # the RNN node's index (rnn_layer)
    slice: int
    op_ids: tuple[int, ...]     # ascending (a topological order)


@dataclass(frozen=True)
class SliceGrid:
    """Tasks ``(layer, slice)`` of an unrolled RNN graph and the dependencies between them (module docstring)."""

    slice_steps: int
    layers: tuple[int, ...]             # rnn_layer ids, ascending; a cut's entry i belongs to layers[i]
    steps: tuple[int, ...]              # recurrence steps per layer
    tasks: tuple[SliceTask, ...]        # a topological order of the task DAG, earliest (slice, layer) first
    task_of: tuple[int, ...]            # op id -> index into tasks
    edges: tuple[tuple[int, int], ...]  # task DAG, sorted
    untagged_ops: int = 0               # ops placed by their neighbours (before / between / after the recurrence)

    @property
    def slices(self) -> tuple[int, ...]:
        """Slices per layer."""
        return tuple(-(-s // self.slice_steps) for s in self.steps)

    def position(self, layer: int) -> int:
        return self.layers.index(layer)

    # ------------------------------------------------------------------ cuts
    def members(self, cut: Sequence[int]) -> list[bool]:
        """Per task: inside the cut."""
        return [t.slice < cut[self.position(t.layer)] for t in self.tasks]

    def is_down_set(self, inside: Sequence[bool]) -> bool:
        """Every edge into a task inside starts inside."""
        return all(inside[a] or not inside[b] for a, b in self.edges)

    def _constraints(self) -> list[tuple[int, int, int, int]]:
        """(i, s, j, r) per cross-layer edge (layers[j], r) -> (layers[i], s): cut[i] > s needs cut[j] > r."""
        pos = {layer: i for i, layer in enumerate(self.layers)}
        found: dict[tuple[int, int, int], int] = {}
        for a, b in self.edges:
            ta, tb = self.tasks[a], self.tasks[b]
            if ta.layer != tb.layer:
                key = (pos[tb.layer], tb.slice, pos[ta.layer])
                found[key] = max(found.get(key, -1), ta.slice)
        return sorted((i, s, j, r) for (i, s, j), r in found.items())

    def cuts(self, stride: int = 1) -> Iterator[tuple[int, ...]]:
        """Every cut that is a down-set of the task DAG, depth first, lexicographic in layer order.

        ``stride > 1`` keeps only prefix lengths that are multiples of ``stride`` or a whole layer (a coarse
        subset, for grids with too many cuts)."""
        if stride < 1:
            raise UsageError(f"stride must be >= 1; found {stride}")
        n_layers, slices = len(self.layers), self.slices
        by_layer: list[list[tuple[int, int, int, int]]] = [[] for _ in range(n_layers)]
        for c in self._constraints():
            by_layer[max(c[0], c[2])].append(c)
        cut = [0] * n_layers

        def values(i: int) -> list[int]:
            lo, hi = 0, slices[i]
            for (a, s, b, r) in by_layer[i]:
                if a == i and cut[b] <= r:          # layer i may not reach slice s
                    hi = min(hi, s)
                elif b == i and cut[a] > s:         # an earlier layer reached slice s: layer i must pass r
                    lo = max(lo, r + 1)
            return [v for v in range(lo, hi + 1) if v % stride == 0 or v == slices[i]]

        def walk(i: int) -> Iterator[tuple[int, ...]]:
            if i == n_layers:
                yield tuple(cut)
                return
            for v in values(i):
                cut[i] = v
                yield from walk(i + 1)
            cut[i] = 0

        yield from walk(0)

    def cut_kind(self, cut: Sequence[int]) -> str:
        """"empty", "all", "layer split" (every layer whole or absent), "layer and time split" (all but one layer
        whole or absent), "time split" (one prefix for all layers) or "wavefront" (anything else)."""
        slices = self.slices
        partial = sum(1 for c, s in zip(cut, slices) if c not in (0, s))
        if all(c == 0 for c in cut):
            return "empty"
        if all(c == s for c, s in zip(cut, slices)):
            return "all"
        if partial == 0:
            return "layer split"
        if len(set(cut)) == 1:
            return "time split"
        return "layer and time split" if partial == 1 else "wavefront"

    def to_dict(self) -> dict[str, Any]:
        return {"slice_steps": self.slice_steps, "layers": list(self.layers), "steps": list(self.steps),
                "slices": list(self.slices), "tasks": len(self.tasks), "edges": len(self.edges),
                "untagged_ops": self.untagged_ops}


class _TaskCycleError(SliceGridError):
    """The tasks depend on each other in a cycle (a kernel's task assignment may be to blame)."""


def _task_of_tags(tags: list[dict[str, Any]], slice_steps: int, last_slice: dict[int, int],
                  highest_layer: bool = False) -> tuple[int, int]:
    """(layer, slice) of an op from its members' tags: the lowest layer (the highest with ``highest_layer``), there
    the latest slice."""
    layer = (max if highest_layer else min)(t["rnn_layer"] for t in tags)
    slices = []
    for t in tags:
        if t["rnn_layer"] != layer:
            continue
        if t["rnn_step"] >= 0:
            slices.append(t["rnn_step"] // slice_steps)
        else:
            slices.append(last_slice[layer] if t["rnn_phase"] == "output" else 0)
    return layer, max(slices)


def build_slice_grid(graph: OpGraph, slice_steps: int = 1) -> SliceGrid:
    """The slice grid of an unrolled RNN graph (module docstring). Raises NoRnnTagsError without RNN tags and
    SliceGridError when the tasks' dependencies form a cycle."""
    if not isinstance(slice_steps, int) or slice_steps < 1:
        raise UsageError(f"slice_steps must be a positive integer; found {slice_steps!r}")
    tags = [node_rnn_tags(node) for node in graph.nodes]
    if not any(tags):
        raise NoRnnTagsError(
            f"time slices need an unrolled RNN: no op of graph {graph.name!r} carries an rnn_layer/rnn_step tag "
            "(tags come from importing ONNX LSTM/GRU/RNN nodes with tvm_passes.rnn). Plan this model with another "
            "method, e.g. --method portfolio or cp_greedy")
    steps: dict[int, int] = {}
    for op_tags in tags:
        for t in op_tags:
            steps[t["rnn_layer"]] = max(steps.get(t["rnn_layer"], 1), t["rnn_step"] + 1)
    last_slice = {layer: -(-n // slice_steps) - 1 for layer, n in steps.items()}
    try:
        return _grid_of_tags(graph, tags, slice_steps, steps, last_slice, highest_layer=False)
    except _TaskCycleError as lowest:
        # a kernel fusing the end of several layers (a stacked LSTM's final states concatenated with the last
        # layer's last step) put in its lowest layer's last slice needs the later layers' slices, which need that
        # slice: put such kernels in their highest layer instead
        try:
            return _grid_of_tags(graph, tags, slice_steps, steps, last_slice, highest_layer=True)
        except _TaskCycleError:
            raise lowest from None


def _grid_of_tags(graph: OpGraph, tags: list[list[dict[str, Any]]], slice_steps: int, steps: dict[int, int],
                  last_slice: dict[int, int], *, highest_layer: bool) -> SliceGrid:
    task: list[tuple[int, int] | None] = [
        _task_of_tags(op_tags, slice_steps, last_slice, highest_layer) if op_tags else None for op_tags in tags]
    untagged = sum(1 for t in task if t is None)

    def key(t: tuple[int, int]) -> tuple[int, int]:
        return t[1], t[0]

    succ = graph.successors()
    for node in graph.nodes:                         # after the recurrence: the latest producer task
        if task[node.id] is None:
            known = [task[p] for p in node.inputs if task[p] is not None]
            if known:
                task[node.id] = max(known, key=key)
    first = (min(steps), 0)
    for node in reversed(graph.nodes):              # before it: the earliest consumer task
        if task[node.id] is None:
            known = [task[c] for c in succ[node.id] if task[c] is not None]
            task[node.id] = min(known, key=key) if known else first
    return _grid(graph, slice_steps, steps, [t for t in task if t is not None], untagged)


def _grid(graph: OpGraph, slice_steps: int, steps: dict[int, int], task: list[tuple[int, int]],
          untagged: int) -> SliceGrid:
    layers = tuple(sorted(steps))
    pos = {layer: i for i, layer in enumerate(layers)}
    keys = sorted(set(task), key=lambda t: (t[1], pos[t[0]]))
    raw = {t: k for k, t in enumerate(keys)}
    preds: list[set[int]] = [set() for _ in keys]
    for e in graph.edges:
        a, b = raw[task[e.src]], raw[task[e.dst]]
        if a != b:
            preds[b].add(a)
    for b, ps in enumerate(preds):
        for a in ps:
            (la, sa), (lb, sb) = keys[a], keys[b]
            if la == lb and sa > sb:
                raise SliceGridError(
                    f"slice {sb} of rnn layer {lb} reads slice {sa} of the same layer: the graph's dependencies run "
                    "backwards in time, so it cannot be cut into time slices. Use another method, e.g. portfolio")
    succ: list[list[int]] = [[] for _ in keys]
    for b, ps in enumerate(preds):
        for a in ps:
            succ[a].append(b)
    missing = [len(p) for p in preds]
    ready = [(keys[k][1], pos[keys[k][0]], k) for k in range(len(keys)) if not missing[k]]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        *_, k = heapq.heappop(ready)
        order.append(k)
        for w in succ[k]:
            missing[w] -= 1
            if not missing[w]:
                heapq.heappush(ready, (keys[w][1], pos[keys[w][0]], w))
    if len(order) != len(keys):
        raise _TaskCycleError(f"the tasks of {slice_steps}-step slices depend on each other in a cycle (fused "
                              "kernels spanning slices of different layers); try a larger slice_steps, or another "
                              "method")
    index = {k: i for i, k in enumerate(order)}
    members: list[list[int]] = [[] for _ in keys]
    for op, t in enumerate(task):
        members[index[raw[t]]].append(op)
    tasks = tuple(SliceTask(keys[k][0], keys[k][1], tuple(members[index[k]])) for k in order)
    edges = tuple(sorted((index[a], index[b]) for b, ps in enumerate(preds) for a in ps))
    grid = SliceGrid(slice_steps, layers, tuple(steps[layer] for layer in layers), tasks,
                     tuple(index[raw[t]] for t in task), edges, untagged)
    logger.debug("slice grid of %s: %s", graph.name, grid.to_dict())
    return grid


def step_tasks(graph: OpGraph) -> list[tuple[int, int] | None]:
    """Per op, its task ``(layer, slice)`` at one step per slice; None for every op of a graph that has no slice
    grid. Partitioners that glue ops into clusters use it never to glue two time steps (or layers) together."""
    try:
        grid = build_slice_grid(graph, 1)
    except (NoRnnTagsError, SliceGridError):
        return [None] * graph.num_ops
    return [(grid.tasks[t].layer, grid.tasks[t].slice) for t in grid.task_of]
