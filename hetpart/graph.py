"""OpGraph: the operator graph of one model, with per-op features and a dependency matrix.

Conventions
-----------
* Op ids are topological: every op's producers have smaller ids. ``nodes[i].id == i``.
* FLOPs count a multiply-add as **2** FLOPs (``conv2d``: ``2*N*Co*Ho*Wo*(Ci/groups)*Kh*Kw``).
* ``bytes_read`` counts every tensor operand (activations and parameters), except the data a slicing op
  (``take``, ``strided_slice``: :data:`SLICING_OPS`) leaves unread: such an op reads at most its output's worth of
  its first operand. ``bytes_written`` counts every output.
* ``param_bytes`` is the size of operands that are model parameters or constants (resident on the op's device).
* An :class:`Edge` ``src -> dst`` carries ``size_bytes``: the bytes of ``src``'s output(s) that ``dst`` reads.
* ``dependency_matrix()[i, j] == 1`` iff op ``j`` reads an output of op ``i`` (row = producer, column = consumer).
* ``kernel_group`` is the id of the fused kernel (TVM FuseOps) the op belongs to, or ``None`` if unknown.

This module imports numpy/scipy only (core rule: no tvm / sklearn / torch).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import scipy.sparse as sp

from hetpart.errors import InvalidGraphError, SchemaError
from hetpart.graph_elements import (SLICING_OPS, Edge, KernelGroup, OpNode, Shape, TensorSpec, dtype_bytes,
                                    slice_read_bytes, tensor_bytes)

# the graph elements moved to hetpart.graph_elements; re-exported from here
__all__ = ["DENSE_MATRIX_MAX_OPS", "SCHEMA_VERSION", "SLICING_OPS", "Edge", "KernelGroup", "OpGraph", "OpNode", "Shape",
           "TensorSpec", "check_schema_version", "dtype_bytes", "slice_read_bytes", "tensor_bytes"]

SCHEMA_VERSION = 1
DENSE_MATRIX_MAX_OPS = 4096


def check_schema_version(data: Any, what: str) -> None:
    """Shared by every JSON type of the core: ``data`` must be an object with the current schema_version."""
    if not isinstance(data, Mapping):
        raise SchemaError(f"{what} JSON must be an object; found {type(data).__name__}")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise SchemaError(
            f"{what} JSON must have schema_version={SCHEMA_VERSION}; found {version!r}. "
            "Re-create it with this hetpart version (e.g. `hetpart analyze MODEL --json out.json`).")


@dataclass(frozen=True)
class OpGraph:
    """Operators of one model in topological order, with edges, model inputs/outputs and fused kernels."""

    nodes: tuple[OpNode, ...]
    edges: tuple[Edge, ...]
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    kernel_groups: tuple[KernelGroup, ...] = ()
    source_hash: str = ""      # hash of the source model + bound shapes
    name: str = ""
    level: str = "op"          # "op" or "kernel" (see kernel_graph())
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        for key in ("nodes", "edges", "inputs", "outputs", "kernel_groups"):
            object.__setattr__(self, key, tuple(getattr(self, key)))

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def num_ops(self) -> int:
        return len(self.nodes)

    def node_by_name(self, name: str) -> OpNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise InvalidGraphError(f"no op named {name!r} in graph {self.name!r}")

    def successors(self) -> list[list[int]]:
        succ: list[list[int]] = [[] for _ in self.nodes]
        for e in self.edges:
            succ[e.src].append(e.dst)
        return succ

    def predecessors(self) -> list[list[int]]:
        return [list(n.inputs) for n in self.nodes]

    def edge_bytes(self) -> dict[tuple[int, int], int]:
        return {(e.src, e.dst): e.size_bytes for e in self.edges}

    @property
    def total_flops(self) -> int:
        return int(sum(n.flops for n in self.nodes))

    @property
    def total_param_bytes(self) -> int:
        return int(sum(n.param_bytes for n in self.nodes))

    def dependency_matrix(self) -> sp.csr_matrix:
        """Sparse 0/1 matrix A (n_ops x n_ops, int8): A[i, j] = 1 iff op j reads an output of op i."""
        n = len(self.nodes)
        rows = np.fromiter((e.src for e in self.edges), dtype=np.int64, count=len(self.edges))
        cols = np.fromiter((e.dst for e in self.edges), dtype=np.int64, count=len(self.edges))
        data = np.ones(len(self.edges), dtype=np.int8)
        return sp.csr_matrix((data, (rows, cols)), shape=(n, n), dtype=np.int8)

    def dependency_matrix_dense(self) -> np.ndarray:
        if len(self.nodes) > DENSE_MATRIX_MAX_OPS:
            raise InvalidGraphError(
                f"a dense dependency matrix needs <= {DENSE_MATRIX_MAX_OPS} ops; this graph has {len(self.nodes)}. "
                "Use dependency_matrix() (scipy.sparse) instead.")
        return self.dependency_matrix().toarray()

    # ------------------------------------------------------------------ kernel view
    def kernel_graph(self) -> "OpGraph":
        """Collapse every fused kernel into one node (ops without a group stay single nodes).

        The result has ``level="kernel"``; node ``tags["op_ids"]`` lists the member op ids, ``op`` is
        ``"fused:" + "+".join(member op names)``; FLOPs and param bytes are summed, bytes_read/written count
        only tensors crossing the kernel boundary, and of a tensor that only slicing members read (a ``take`` of
        one step's row), the bytes they read.
        """
        if self.level != "op":
            raise InvalidGraphError("kernel_graph() needs an op-level graph; this one is already kernel level")
        group_of: dict[int, tuple] = {}
        for g in self.kernel_groups:
            for op_id in g.op_ids:
                group_of[op_id] = ("g", g.id)
        members: dict[tuple, list[int]] = {}
        for node in self.nodes:
            members.setdefault(group_of.get(node.id, ("o", node.id)), []).append(node.id)
        # order clusters by their last member so that producers come first (fused groups are convex)
        clusters = sorted(members.values(), key=lambda ids: max(ids))
        new_id = {op: k for k, ids in enumerate(clusters) for op in ids}
        group_names = {g.id: g.name for g in self.kernel_groups}
        succ = self.successors()
        output_ops = {t.producer for t in self.outputs}
        # a tensor read by several ops of one kernel crosses the kernel boundary once
        # (what its member ops read of it, at most the whole tensor)
        crossing: dict[tuple[int, int], dict[int, int]] = {}
        crossing_read: dict[tuple[int, int], dict[int, int]] = {}
        for e in self.edges:
            s, d = new_id[e.src], new_id[e.dst]
            if s != d:
                per_producer = crossing.setdefault((s, d), {})
                per_producer[e.src] = max(per_producer.get(e.src, 0), e.size_bytes)
                read = crossing_read.setdefault((s, d), {})
                read[e.src] = read.get(e.src, 0) + self._read_of(e.dst, e.size_bytes)
        edge_bytes = {key: sum(v.values()) for key, v in crossing.items()}
        read_bytes: dict[int, int] = {}
        kernel_inputs: dict[int, set[int]] = {}
        for (s, d), per_producer in crossing.items():
            if s >= d:
                raise InvalidGraphError("fused kernels form a cycle; kernel groups must be convex")
            read = crossing_read[(s, d)]
            read_bytes[d] = read_bytes.get(d, 0) + sum(min(size, read[p]) for p, size in per_producer.items())
            kernel_inputs.setdefault(d, set()).add(s)
        graph_input_bytes: dict[int, int] = {}
        for spec in self.inputs:
            for consumer in spec.consumers:
                graph_input_bytes[consumer] = graph_input_bytes.get(consumer, 0) + self._read_of(
                    consumer, tensor_bytes(spec.shape, spec.dtype))
        out_nodes = []
        for k, ids in enumerate(clusters):
            ops = [self.nodes[i] for i in ids]
            key = group_of.get(ids[0], ("o", ids[0]))
            inside = set(ids)
            reads = read_bytes.get(k, 0)
            first, last = ops[0], ops[-1]
            out_nodes.append(OpNode(
                id=k, name=group_names.get(key[1], first.name) if key[0] == "g" else first.name,
                op="fused:" + "+".join(o.op.removeprefix("relax.") for o in ops) if len(ops) > 1 else first.op,
                inputs=sorted(kernel_inputs.get(k, ())),
                input_shapes=first.input_shapes, input_dtypes=first.input_dtypes,
                output_shapes=last.output_shapes, output_dtypes=last.output_dtypes,
                attrs=dict(first.attrs) if len(ops) == 1 else {"anchor_attrs": dict(
                    max(ops, key=lambda o: o.flops).attrs)},
                flops=sum(o.flops for o in ops),
                bytes_read=reads + sum(min(o.param_bytes, o.bytes_read) for o in ops)
                + sum(graph_input_bytes.get(i, 0) for i in ids),
                bytes_written=sum(o.bytes_written for o in ops
                                  if o.id in output_ops or any(c not in inside for c in succ[o.id])),
                param_bytes=sum(o.param_bytes for o in ops),
                kernel_group=k, shape_only=all(o.shape_only for o in ops),
                graph_inputs=sorted({g for o in ops for g in o.graph_inputs}),
                tags={**ops[-1].tags, "op_ids": list(ids), "op_names": [o.name for o in ops],
                      "op_types": [o.op for o in ops]},
            ))
        return OpGraph(
            nodes=tuple(out_nodes),
            edges=tuple(Edge(s, d, b) for (s, d), b in sorted(edge_bytes.items())),
            inputs=tuple(TensorSpec(t.name, t.shape, t.dtype, t.producer,
                                    sorted({new_id[c] for c in t.consumers})) for t in self.inputs),
            outputs=tuple(TensorSpec(t.name, t.shape, t.dtype,
                                     None if t.producer is None else new_id[t.producer]) for t in self.outputs),
            kernel_groups=tuple(KernelGroup(k, out_nodes[k].name, (k,)) for k in range(len(out_nodes))),
            source_hash=self.source_hash, name=self.name, level="kernel")

    def _read_of(self, op_id: int, operand_bytes: int) -> int:
        """Bytes op ``op_id`` reads of one of its data operands of ``operand_bytes``."""
        node = self.nodes[op_id]
        return slice_read_bytes(node.op, operand_bytes, node.bytes_written)

    # ------------------------------------------------------------------ validation
    def validate(self) -> "OpGraph":
        if self.schema_version != SCHEMA_VERSION:
            raise SchemaError(f"OpGraph schema_version must be {SCHEMA_VERSION}; found {self.schema_version}")
        if self.level not in ("op", "kernel"):
            raise InvalidGraphError(f"OpGraph.level must be 'op' or 'kernel'; found {self.level!r}")
        n = len(self.nodes)
        for i, node in enumerate(self.nodes):
            if node.id != i:
                raise InvalidGraphError(f"node at position {i} has id {node.id}; ids must be 0..n-1 in order")
            node.validate()
        seen: set[tuple[int, int]] = set()
        producers: dict[int, set[int]] = {i: set() for i in range(n)}
        for e in self.edges:
            if not (0 <= e.src < n and 0 <= e.dst < n):
                raise InvalidGraphError(f"edge {e.src}->{e.dst} refers to an op id outside 0..{n - 1} (dangling)")
            if e.src >= e.dst:
                raise InvalidGraphError(
                    f"edge {e.src}->{e.dst} goes backwards: ids must be topological, so the graph has a cycle "
                    "or is not sorted")
            if (e.src, e.dst) in seen:
                raise InvalidGraphError(f"edge {e.src}->{e.dst} appears twice")
            if e.size_bytes < 0:
                raise InvalidGraphError(f"edge {e.src}->{e.dst} has negative size_bytes {e.size_bytes}")
            seen.add((e.src, e.dst))
            producers[e.dst].add(e.src)
        for node in self.nodes:
            if set(node.inputs) != producers[node.id]:
                raise InvalidGraphError(
                    f"op {node.id} ({node.name}) lists inputs {sorted(node.inputs)} but edges give "
                    f"{sorted(producers[node.id])}")
        names = [t.name for t in self.inputs]
        if len(set(names)) != len(names):
            raise InvalidGraphError(f"model input names must be unique; found {names}")
        for t in self.inputs:
            if any(not 0 <= c < n for c in t.consumers):
                raise InvalidGraphError(f"input {t.name!r} has a consumer outside 0..{n - 1}")
        for t in self.outputs:
            if t.producer is not None and not 0 <= t.producer < n:
                raise InvalidGraphError(f"output {t.name!r} refers to op {t.producer}, outside 0..{n - 1}")
        for g in self.kernel_groups:
            if any(not 0 <= i < n for i in g.op_ids):
                raise InvalidGraphError(f"kernel group {g.id} ({g.name}) refers to an op outside 0..{n - 1}")
        return self

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version, "name": self.name, "level": self.level,
            "source_hash": self.source_hash,
            "nodes": [n.to_dict() for n in self.nodes],
            "edges": [[e.src, e.dst, e.size_bytes] for e in self.edges],
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "kernel_groups": [{"id": g.id, "name": g.name, "op_ids": list(g.op_ids)} for g in self.kernel_groups],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "OpGraph":
        check_schema_version(data, "OpGraph")
        try:
            graph = cls(
                nodes=tuple(OpNode.from_dict(n) for n in data["nodes"]),
                edges=tuple(Edge(int(s), int(d), int(b)) for s, d, b in data["edges"]),
                inputs=tuple(TensorSpec(**t) for t in data.get("inputs", [])),
                outputs=tuple(TensorSpec(**t) for t in data.get("outputs", [])),
                kernel_groups=tuple(KernelGroup(**g) for g in data.get("kernel_groups", [])),
                source_hash=data.get("source_hash", ""), name=data.get("name", ""),
                level=data.get("level", "op"), schema_version=data["schema_version"])
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, SchemaError):
                raise
            raise SchemaError(f"OpGraph JSON is malformed ({type(exc).__name__}: {exc})") from exc
        return graph.validate()

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> "OpGraph":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SchemaError(f"OpGraph JSON is not valid JSON: {exc}") from exc
        return cls.from_dict(data)

    def save(self, path: str | Path) -> None:
        # compact: the C encoder (json skips it whenever indent is set) writes an 18k-op graph in a tenth of the time
        Path(path).write_text(json.dumps(self.to_dict(), separators=(",", ":")))

    @classmethod
    def load(cls, path: str | Path) -> "OpGraph":
        return cls.from_json(Path(path).read_text())

    def structure_hash(self) -> str:
        """Hash of ops + edges (not of names): identifies 'the same model' for plans and cost tables."""
        h = hashlib.sha256()
        for n in self.nodes:
            h.update(f"{n.op}|{n.inputs}|{n.output_shapes}|".encode())
        return h.hexdigest()[:16]
