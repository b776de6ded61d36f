"""The elements of an OpGraph: OpNode (one operator), Edge, TensorSpec (model input/output), KernelGroup, and
tensor sizing (``dtype_bytes``, ``tensor_bytes``). The conventions are those of :mod:`hetpart.graph`.

This module imports the standard library only (core rule: no tvm / sklearn / torch).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Mapping

from hetpart.errors import InvalidGraphError, SchemaError

Shape = tuple[int, ...]


def _tuple_of_shapes(values: Iterable[Iterable[int]]) -> tuple[Shape, ...]:
    return tuple(tuple(int(d) for d in s) for s in values)


@dataclass(frozen=True)
class OpNode:
    """One Relax operator call in ``main``."""

    id: int
    name: str                       # Relax variable name of the binding (e.g. "lv12")
    op: str                         # Relax op name, e.g. "relax.nn.conv2d"
    inputs: tuple[int, ...] = ()    # producer op ids (sorted, unique)
    input_shapes: tuple[Shape, ...] = ()   # every tensor operand, in argument order
    input_dtypes: tuple[str, ...] = ()
    output_shapes: tuple[Shape, ...] = ()  # one entry per output (tuple outputs have several)
    output_dtypes: tuple[str, ...] = ()
    attrs: Mapping[str, Any] = field(default_factory=dict)
    flops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    param_bytes: int = 0
    kernel_group: int | None = None
    shape_only: bool = False        # computes only shapes/metadata (no tensor data work)
    graph_inputs: tuple[str, ...] = ()     # names of model inputs this op reads directly
    tags: Mapping[str, Any] = field(default_factory=dict)  # e.g. {"rnn_layer": 0, "rnn_direction": 0, "rnn_step": 3}

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(int(i) for i in self.inputs))
        object.__setattr__(self, "input_shapes", _tuple_of_shapes(self.input_shapes))
        object.__setattr__(self, "output_shapes", _tuple_of_shapes(self.output_shapes))
        object.__setattr__(self, "input_dtypes", tuple(self.input_dtypes))
        object.__setattr__(self, "output_dtypes", tuple(self.output_dtypes))
        object.__setattr__(self, "graph_inputs", tuple(self.graph_inputs))
        object.__setattr__(self, "attrs", dict(self.attrs))
        object.__setattr__(self, "tags", dict(self.tags))

    def validate(self) -> None:
        if any(i >= self.id or i < 0 for i in self.inputs):
            raise InvalidGraphError(
                f"op {self.id} ({self.name}) must read only ops with smaller ids (topological order); "
                f"found inputs {list(self.inputs)}")
        if len(set(self.inputs)) != len(self.inputs):
            raise InvalidGraphError(f"op {self.id} ({self.name}) lists a producer twice: {list(self.inputs)}")
        if len(self.input_shapes) != len(self.input_dtypes) or len(self.output_shapes) != len(self.output_dtypes):
            raise InvalidGraphError(f"op {self.id} ({self.name}): shapes and dtypes must pair up")
        for label, value in (("flops", self.flops), ("bytes_read", self.bytes_read),
                             ("bytes_written", self.bytes_written), ("param_bytes", self.param_bytes)):
            if value < 0:
                raise InvalidGraphError(f"op {self.id} ({self.name}): {label} must be >= 0, found {value}")

    @property
    def output_bytes(self) -> int:
        return self.bytes_written

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for key in ("inputs", "input_dtypes", "output_dtypes", "graph_inputs"):
            out[key] = list(out[key])
        for key in ("input_shapes", "output_shapes"):
            out[key] = [list(s) for s in out[key]]
        out["attrs"] = dict(self.attrs)
        out["tags"] = dict(self.tags)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "OpNode":
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise SchemaError(f"OpNode JSON has unknown keys {sorted(unknown)}; expected a subset of {sorted(known)}")
        try:
            return cls(**data)
        except TypeError as exc:
            raise SchemaError(f"OpNode JSON is malformed: {exc}") from exc


@dataclass(frozen=True)
class Edge:
    src: int
    dst: int
    size_bytes: int


@dataclass(frozen=True)
class TensorSpec:
    """A model input or output tensor."""

    name: str
    shape: Shape
    dtype: str
    producer: int | None = None      # for outputs: the op that produces it (None: an input passed through)
    consumers: tuple[int, ...] = ()  # for inputs: ops that read it

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "consumers", tuple(int(c) for c in self.consumers))

    @property
    def size_bytes(self) -> int:
        return tensor_bytes(self.shape, self.dtype)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype,
                "producer": self.producer, "consumers": list(self.consumers)}


@dataclass(frozen=True)
class KernelGroup:
    """Ops that TVM's FuseOps put into one fused kernel."""

    id: int
    name: str                  # fused function name, e.g. "fused_conv2d_add_relu"
    op_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "op_ids", tuple(int(i) for i in self.op_ids))


@functools.lru_cache(maxsize=None)
def dtype_bytes(dtype: str) -> int:
    if dtype == "bool":
        return 1
    digits = "".join(ch for ch in dtype if ch.isdigit())
    if not digits:
        raise InvalidGraphError(f"cannot size dtype {dtype!r}: expected e.g. float32, int64, bool")
    return max(1, int(digits) // 8)


def tensor_bytes(shape: Iterable[int], dtype: str) -> int:
    return math.prod(int(d) for d in shape) * dtype_bytes(dtype)


# Ops that read only part of their first operand: an index (take) or a window (strided_slice) picks what they
# copy, so they read at most their output's worth of it (a take of one step's row of an unrolled RNN's projection
# of all steps reads 4 KB of 640 KB; counted whole, it was featured as reading 640 KB).
SLICING_OPS = frozenset({"relax.take", "relax.strided_slice", "relax.dynamic_strided_slice"})


def slice_read_bytes(op: str, operand_bytes: int, output_bytes: int) -> int:
    """Bytes ``op`` reads of a data operand of ``operand_bytes``: all of it, or for a :data:`SLICING_OPS` op at most
    its output's worth (``output_bytes``)."""
    return min(operand_bytes, output_bytes) if op in SLICING_OPS else operand_bytes
