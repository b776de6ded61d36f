"""Segments: a plan cut into maximal single-device groups of ops whose graph is acyclic.

A segment is what one device's worker of the task runtime runs in one go. ``segment_plan(graph, plan)`` walks
``plan.order`` once; an op joins the most recent segment of its device when the segment graph stays acyclic
with it, and opens a new segment otherwise. Properties of the result (checked by the tests):

* every op is in exactly one segment; a segment's ops are on one device and listed in plan order;
* the segment graph (``P -> S`` when an op of ``S`` reads an op of ``P``) is acyclic, and ``segments`` are in a
  topological order of it (an edge always goes from a smaller to a larger segment id);
* a device's segments hold consecutive runs of that device's ops in plan order, and each of them reaches the
  next one in the segment graph, so any topological order runs them in plan order (a worker never has two
  ready segments of one request);
* no two segments can be merged: merging two segments of one device would create a cycle.

The cycle check keeps a topological numbering of the segments up to date as edges are added (Pearce & Kelly,
"A dynamic topological sort algorithm for directed acyclic graphs", ACM JEA 11, 2006), so only the segments
numbered between the two ends of a new edge are searched.

``expand_segmentation`` maps a segmentation of a kernel-level plan (e.g. the time-slice method's one segment per
slice task) to the op level the task runtime builds.

Imports numpy/scipy/networkx only (core rule); this module needs none of them.
"""
from __future__ import annotations

import heapq
import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from hetpart.errors import InvalidPlanError, SchemaError
from hetpart.graph import SCHEMA_VERSION, OpGraph, check_schema_version
from hetpart.plan import Plan


@dataclass(frozen=True)
class SegmentInput:
    """A tensor a segment reads from another segment: the output of ``op_id``, produced in ``segment``.

    ``size_bytes`` is the largest edge from ``op_id`` to an op of the reading segment (what it reads of it)."""

    segment: int
    op_id: int
    size_bytes: int


@dataclass(frozen=True)
class Segment:
    """Ops run back to back by one device's worker."""

    id: int
    device: str
    op_ids: tuple[int, ...]                       # in plan order
    inputs: tuple[SegmentInput, ...] = ()         # tensors from other segments, by (segment, op id)
    graph_inputs: tuple[str, ...] = ()            # model inputs its ops read, in graph.inputs order
    outputs: tuple[int, ...] = ()                 # its ops read by another segment or that are model outputs

    def __post_init__(self) -> None:
        object.__setattr__(self, "op_ids", tuple(int(i) for i in self.op_ids))
        object.__setattr__(self, "inputs", tuple(i if isinstance(i, SegmentInput) else SegmentInput(*i)
                                                 for i in self.inputs))
        object.__setattr__(self, "graph_inputs", tuple(self.graph_inputs))
        object.__setattr__(self, "outputs", tuple(int(i) for i in self.outputs))

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "device": self.device, "op_ids": list(self.op_ids),
                "inputs": [[i.segment, i.op_id, i.size_bytes] for i in self.inputs],
                "graph_inputs": list(self.graph_inputs), "outputs": list(self.outputs)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Segment":
        return cls(id=int(data["id"]), device=str(data["device"]), op_ids=data["op_ids"],
                   inputs=tuple(SegmentInput(int(s), int(o), int(b)) for s, o, b in data.get("inputs", ())),
                   graph_inputs=data.get("graph_inputs", ()), outputs=data.get("outputs", ()))


@dataclass(frozen=True)
class Segmentation:
    """A plan's segments in topological issue order (``segments[k].id == k``), the segment DAG and each op's
    segment."""

    segments: tuple[Segment, ...]
    segment_of: tuple[int, ...]                   # segment id per op id
    edges: tuple[tuple[int, int], ...]            # segment DAG, (producer segment, consumer segment), sorted
    graph_hash: str = ""
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        object.__setattr__(self, "segments", tuple(self.segments))
        object.__setattr__(self, "segment_of", tuple(int(s) for s in self.segment_of))
        object.__setattr__(self, "edges", tuple((int(a), int(b)) for a, b in self.edges))

    def __len__(self) -> int:
        return len(self.segments)

    def on_device(self, device: str) -> list[Segment]:
        return [s for s in self.segments if s.device == device]

    def successors(self) -> list[list[int]]:
        succ: list[list[int]] = [[] for _ in self.segments]
        for a, b in self.edges:
            succ[a].append(b)
        return succ

    def validate(self, graph: OpGraph | None = None, plan: Plan | None = None) -> "Segmentation":
        """Check the invariants; with ``graph`` (and ``plan``) also that the segments describe that graph (and
        that plan's devices and issue order) exactly."""
        if self.schema_version != SCHEMA_VERSION:
            raise SchemaError(f"Segmentation schema_version must be {SCHEMA_VERSION}; found {self.schema_version}")
        n = len(self.segment_of)
        seen = [False] * n
        for k, seg in enumerate(self.segments):
            if seg.id != k:
                raise InvalidPlanError(f"segment at position {k} has id {seg.id}; ids must be 0..k-1 in order")
            if not seg.op_ids:
                raise InvalidPlanError(f"segment {k} has no ops; every segment needs at least one")
            for op in seg.op_ids:
                if not 0 <= op < n or seen[op] or self.segment_of[op] != k:
                    raise InvalidPlanError(f"op {op} of segment {k} is out of range, listed twice or recorded "
                                           "in another segment; every op must be in exactly one segment")
                seen[op] = True
            if not set(seg.outputs) <= set(seg.op_ids):
                raise InvalidPlanError(f"segment {k} lists outputs {list(seg.outputs)} that are not its ops")
            for inp in seg.inputs:
                if not 0 <= inp.op_id < n or self.segment_of[inp.op_id] != inp.segment:
                    raise InvalidPlanError(f"segment {k} reads op {inp.op_id} from segment {inp.segment}, "
                                           "which does not hold it")
        if not all(seen):
            raise InvalidPlanError(f"ops {[i for i in range(n) if not seen[i]][:5]} are in no segment")
        derived = sorted({(inp.segment, seg.id) for seg in self.segments for inp in seg.inputs})
        if list(self.edges) != derived:
            raise InvalidPlanError(f"segment edges {list(self.edges)[:5]} do not match the segments' inputs "
                                   f"{derived[:5]}")
        backwards = [(a, b) for a, b in self.edges if a >= b]
        if backwards:
            raise InvalidPlanError(f"segment edges {backwards[:5]} go backwards: segments must be in a topological "
                                   "order of an acyclic segment graph")
        if graph is not None:
            self._check_against(graph, plan)
        return self

    def _check_against(self, graph: OpGraph, plan: Plan | None) -> None:
        if graph.num_ops != len(self.segment_of):
            raise InvalidPlanError(f"segmentation covers {len(self.segment_of)} ops but graph {graph.name!r} has "
                                   f"{graph.num_ops}; segment the plan of this graph")
        if self.graph_hash and self.graph_hash != graph.structure_hash():
            raise InvalidPlanError(f"segmentation was made for graph {self.graph_hash}, not "
                                   f"{graph.structure_hash()} ({graph.name!r})")
        devices = [""] * graph.num_ops
        for seg in self.segments:
            for op in seg.op_ids:
                devices[op] = seg.device
        if plan is not None:
            if tuple(devices) != plan.device_of:
                bad = [i for i in range(graph.num_ops) if devices[i] != plan.device_of[i]][:5]
                raise InvalidPlanError(f"ops {bad} are in segments of another device than the plan gives them")
            position = {op: k for k, op in enumerate(plan.order)}
            for seg in self.segments:
                if [position[op] for op in seg.op_ids] != sorted(position[op] for op in seg.op_ids):
                    raise InvalidPlanError(f"segment {seg.id} lists its ops {list(seg.op_ids)} out of plan order")
        expected = describe_segments(graph, [s.op_ids for s in self.segments], [s.device for s in self.segments])
        if expected.segments != self.segments:
            bad = next(k for k, (a, b) in enumerate(zip(expected.segments, self.segments)) if a != b)
            raise InvalidPlanError(f"segment {bad}'s inputs, model inputs or outputs do not match the graph: "
                                   f"expected {expected.segments[bad]}, found {self.segments[bad]}")

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": self.schema_version, "graph_hash": self.graph_hash,
                "segments": [s.to_dict() for s in self.segments], "segment_of": list(self.segment_of),
                "edges": [list(e) for e in self.edges]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Segmentation":
        check_schema_version(data, "Segmentation")
        try:
            result = cls(segments=tuple(Segment.from_dict(s) for s in data["segments"]),
                         segment_of=data["segment_of"], edges=tuple((a, b) for a, b in data["edges"]),
                         graph_hash=str(data.get("graph_hash", "")), schema_version=data["schema_version"])
        except (KeyError, TypeError, ValueError) as exc:
            raise SchemaError(f"Segmentation JSON is malformed ({type(exc).__name__}: {exc})") from exc
        return result.validate()

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> "Segmentation":
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as exc:
            raise SchemaError(f"Segmentation JSON is not valid JSON: {exc}") from exc


class _DynamicDag:
    """A DAG that keeps a topological numbering ``ord`` while edges are added (Pearce-Kelly)."""

    def __init__(self) -> None:
        self.succ: list[set[int]] = []
        self.pred: list[set[int]] = []
        self.ord: list[int] = []

    def add_node(self) -> int:
        k = len(self.ord)
        self.succ.append(set())
        self.pred.append(set())
        self.ord.append(k)
        return k

    def reaches_any(self, source: int, targets: set[int]) -> bool:
        """Whether a path leads from ``source`` to one of ``targets``."""
        ord_ = self.ord
        targets = {t for t in targets if ord_[t] > ord_[source]}
        if not targets:
            return False
        bound = max(ord_[t] for t in targets)
        stack, seen = [source], {source}
        while stack:
            for w in self.succ[stack.pop()]:
                if w in targets:
                    return True
                if w not in seen and ord_[w] < bound:
                    seen.add(w)
                    stack.append(w)
        return False

    def _collect(self, start: int, adjacency: list[set[int]], low: int, high: int) -> list[int]:
        ord_, found, stack = self.ord, {start}, [start]
        while stack:
            for w in adjacency[stack.pop()]:
                if w not in found and low < ord_[w] < high:
                    found.add(w)
                    stack.append(w)
        return sorted(found, key=ord_.__getitem__)

    def add_edge(self, x: int, y: int) -> None:
        """Add ``x -> y``; the caller guarantees that ``y`` does not reach ``x``."""
        if y in self.succ[x]:
            return
        self.succ[x].add(y)
        self.pred[y].add(x)
        low, high = self.ord[y], self.ord[x]
        if low < high:
            forward = self._collect(y, self.succ, low, high)
            backward = self._collect(x, self.pred, low, high)
            moved = backward + forward
            for node, value in zip(moved, sorted(self.ord[v] for v in moved)):
                self.ord[node] = value


def _greedy_groups(preds: Sequence[Sequence[int]], device_of: Sequence[str], order: Sequence[int]) -> list[list[int]]:
    dag = _DynamicDag()
    groups: list[list[int]] = []
    group_of = [-1] * len(device_of)
    latest: dict[str, int] = {}
    for v in order:
        sources = {group_of[u] for u in preds[v]}
        s = latest.get(device_of[v])
        if s is None or dag.reaches_any(s, sources - {s}):
            s = dag.add_node()
            groups.append([])
            latest[device_of[v]] = s
        groups[s].append(v)
        group_of[v] = s
        for p in sources - {s}:
            dag.add_edge(p, s)
    return groups


def _model_inputs_of(graph: OpGraph) -> list[list[int]]:
    """Indices (in ``graph.inputs``) of the model inputs each op reads, as the simulator counts them."""
    index_of = {t.name: k for k, t in enumerate(graph.inputs)}
    reads: list[set[int]] = [set() for _ in graph.nodes]
    for k, t in enumerate(graph.inputs):
        for c in t.consumers:
            reads[c].add(k)
    for node in graph.nodes:
        reads[node.id].update(index_of[name] for name in node.graph_inputs if name in index_of)
    return [sorted(r) for r in reads]


def describe_segments(graph: OpGraph, groups: Sequence[Sequence[int]], devices: Sequence[str]) -> Segmentation:
    """The Segmentation of ops grouped as ``groups`` (each in plan order) on ``devices``.

    Segments are numbered in a topological order of the segment DAG that, among segments whose producers are
    all numbered, takes the one listed first in ``groups`` (so groups already in a topological order keep it).
    Raises InvalidPlanError when the segment graph has a cycle."""
    group_of = [-1] * graph.num_ops
    for g, ops in enumerate(groups):
        for op in ops:
            group_of[op] = g
    preds: list[set[int]] = [set() for _ in groups]
    for e in graph.edges:
        a, b = group_of[e.src], group_of[e.dst]
        if a != b:
            preds[b].add(a)
    succ: list[list[int]] = [[] for _ in groups]
    for b, ps in enumerate(preds):
        for a in ps:
            succ[a].append(b)
    missing = [len(p) for p in preds]
    ready = [g for g in range(len(groups)) if not missing[g]]
    heapq.heapify(ready)
    rank: list[int] = []
    while ready:
        g = heapq.heappop(ready)
        rank.append(g)
        for w in succ[g]:
            missing[w] -= 1
            if not missing[w]:
                heapq.heappush(ready, w)
    if len(rank) != len(groups):
        raise InvalidPlanError("these groups of ops form a cycle in the segment graph; a segment must be able to "
                               "run once all its inputs exist")
    new_id = {g: k for k, g in enumerate(rank)}
    segment_of = tuple(new_id[g] for g in group_of)
    reads = _model_inputs_of(graph)
    into: list[dict[int, int]] = [{} for _ in groups]          # per segment: producer op -> bytes read
    leaves = [False] * graph.num_ops
    for e in graph.edges:
        s = segment_of[e.dst]
        if segment_of[e.src] != s:
            into[s][e.src] = max(into[s].get(e.src, 0), e.size_bytes)
            leaves[e.src] = True
    for t in graph.outputs:
        if t.producer is not None:
            leaves[t.producer] = True
    segments = []
    for k, g in enumerate(rank):
        ops = tuple(groups[g])
        segments.append(Segment(
            id=k, device=devices[g], op_ids=ops,
            inputs=tuple(SegmentInput(segment_of[u], u, b) for u, b in sorted(into[k].items())),
            graph_inputs=tuple(graph.inputs[i].name for i in sorted({i for op in ops for i in reads[op]})),
            outputs=tuple(op for op in ops if leaves[op])))
    edges = tuple(sorted({(inp.segment, s.id) for s in segments for inp in s.inputs}))
    return Segmentation(tuple(segments), segment_of, edges, graph_hash=graph.structure_hash())


def expand_segmentation(segmentation: Segmentation, kernels: OpGraph, ops: OpGraph,
                        op_plan: Plan | None = None) -> Segmentation:
    """A kernel-level ``segmentation`` of ``kernels`` (``ops.kernel_graph()``) at the op level: every kernel's member
    ops (``tags["op_ids"]``) in its segment, on its device, listed in ``op_plan``'s order (else by op id).

    Segment ids are kept: an edge between ops of two kernels is an edge between those kernels, so the op-level
    segment graph is a subgraph of the kernel-level one and its topological numbering still holds."""
    if kernels.level != "kernel" or ops.level != "op":
        raise InvalidPlanError(f"expand_segmentation maps a kernel-level segmentation to ops; found graph levels "
                               f"{kernels.level!r} and {ops.level!r} (pass the kernel graph, then the op graph)")
    if len(segmentation.segment_of) != kernels.num_ops:
        raise InvalidPlanError(f"the segmentation covers {len(segmentation.segment_of)} kernels but the kernel graph "
                               f"has {kernels.num_ops}; segment the plan of this kernel graph")
    position = {op: k for k, op in enumerate(op_plan.order)} if op_plan is not None else {}
    groups: list[list[int]] = []
    for seg in segmentation.segments:
        members = [op for k in seg.op_ids for op in kernels.nodes[k].tags.get("op_ids", [k])]
        groups.append(sorted(members, key=lambda op: (position.get(op, op), op)))
    covered = sorted(op for group in groups for op in group)
    if covered != list(range(ops.num_ops)):
        raise InvalidPlanError(f"the kernels' member ops cover {len(covered)} op ids, not each of the op graph's "
                               f"{ops.num_ops} ops once; pass the op graph these kernels were fused from")
    expanded = describe_segments(ops, groups, [s.device for s in segmentation.segments])
    return expanded.validate(ops, op_plan)


def segment_plan(graph: OpGraph, plan: Plan, merge: bool = True) -> Segmentation:
    """Cut ``plan`` into segments (see the module docstring). ``merge=False`` gives one op per segment."""
    plan.validate(graph)
    if merge:
        groups = _greedy_groups([n.inputs for n in graph.nodes], plan.device_of, plan.order)
    else:
        groups = [[v] for v in plan.order]
    return describe_segments(graph, groups, [plan.device_of[ops[0]] for ops in groups]).validate()
