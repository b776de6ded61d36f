"""ONNX ``Scan`` and ``Loop`` nodes with a trip count known at import, unrolled into plain ONNX before TVM's importer
(which converts neither).

hetpart compiles for fixed input shapes, so a ``Scan`` runs as many iterations as its scan inputs are long, and a
``Loop`` whose trip count ``M`` is a constant (after onnxslim has folded the shape computations) and whose condition
stays true (absent, or a constant true that the body passes on unchanged) runs exactly ``M``. Each iteration gets a
copy of the body with its own tensor names; a scan input's element is a ``Gather`` of one index on its scan axis, and
the scan outputs are stacked with ``Unsqueeze`` + ``Concat`` (in reverse for a reverse direction); tensors of the
enclosing graph that the body reads keep their names. Nested loops are unrolled from the inside out. What cannot be
unrolled this way -- a condition computed from the data, a trip count given at run time, a scan input of unknown
length, the batched ``Scan`` of opset 8 -- raises :class:`hetpart.errors.UnsupportedOpError` naming the node and
the reason. Tests against onnxruntime: ``tests/tvm_passes/test_onnx_loops.py``.
"""
from __future__ import annotations

import itertools
import logging
from typing import Iterable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from hetpart.errors import UnsupportedOpError

log = logging.getLogger(__name__)

__all__ = ["LOOP_OP_TYPES", "MAX_ITERATIONS", "count_loop_nodes", "unroll_loops"]

LOOP_OP_TYPES = ("Loop", "Scan")
MAX_ITERATIONS = 4096          # beyond this, unrolling would make a graph too large to compile in reasonable time


def count_loop_nodes(graph: onnx.GraphProto) -> int:
    return sum(node.op_type in LOOP_OP_TYPES for node in graph.node)


def unroll_loops(model: onnx.ModelProto, label: str) -> onnx.ModelProto | None:
    """``model`` with every Scan and Loop unrolled (a new model), or None when it has none."""
    if not count_loop_nodes(model.graph):
        return None
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 9 and any(n.op_type == "Scan" for n in model.graph.node):
        raise UnsupportedOpError(f"{label}: the batched Scan of opset {opset} (a sequence_lens input) is not "
                                 "supported; export the model at opset 9 or later")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    shapes = _static_shapes(out)
    names = _Names(_all_names(out.graph), opset)
    unrolled = _unroll_graph(out.graph, shapes, {}, names, label)
    log.info("%s: unrolled %d Loop/Scan node(s)", label, unrolled)
    return out


class _Names:
    """Fresh tensor names, none equal to a name already in the model (and the model's opset, which decides the form
    of the nodes added)."""

    def __init__(self, taken: set[str], opset: int):
        self.taken = taken
        self.opset = opset
        self.counter = itertools.count()

    def fresh(self, hint: str) -> str:
        while True:
            name = f"{hint}__{next(self.counter)}"
            if name not in self.taken:
                self.taken.add(name)
                return name


def _all_names(graph: onnx.GraphProto) -> set[str]:
    found = {v.name for v in itertools.chain(graph.input, graph.output, graph.value_info)}
    found |= {t.name for t in graph.initializer}
    for node in graph.node:
        found |= set(node.input) | set(node.output)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                found |= _all_names(attr.g)
    return found


def _value_shape(value: onnx.ValueInfoProto) -> list[int] | None:
    dims = value.type.tensor_type.shape.dim
    known = value.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims)
    return [d.dim_value for d in dims] if known else None


def _static_shapes(model: onnx.ModelProto) -> dict[str, list[int] | None]:
    """The static shape of every tensor ONNX shape inference can tell, in the graph and its loop bodies (names are
    unique across them in a valid model)."""
    shapes: dict[str, list[int] | None] = {}

    def collect(graph: onnx.GraphProto) -> None:
        for value in itertools.chain(graph.input, graph.value_info, graph.output):
            shapes.setdefault(value.name, _value_shape(value))
        for tensor in graph.initializer:
            shapes[tensor.name] = list(tensor.dims)
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    collect(attr.g)

    try:
        collect(onnx.shape_inference.infer_shapes(model).graph)
    except Exception as exc:  # noqa: BLE001 (shapes then come from the declared value infos only)
        log.debug("ONNX shape inference failed (%s); using the declared shapes", exc)
        collect(model.graph)
    return shapes


def _graph_constants(graph: onnx.GraphProto, outer: dict) -> dict:
    """The constant tensors a graph can read: its enclosing scopes', its initializers and its Constant nodes."""
    constants = dict(outer)
    constants.update({t.name: t for t in graph.initializer})
    constants.update({n.output[0]: n.attribute[0].t for n in graph.node
                      if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"})
    return constants


def _unroll_graph(graph: onnx.GraphProto, shapes: dict, outer_constants: dict, names: _Names, label: str) -> int:
    constants = _graph_constants(graph, outer_constants)
    count = 0
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        if node.op_type not in LOOP_OP_TYPES:
            nodes.append(node)
            continue
        body = onnx.GraphProto()
        body.CopyFrom(next(a.g for a in node.attribute if a.name == "body"))
        count += _unroll_graph(body, shapes, constants, names, label)        # inner loops first
        where = f"{label}: {node.op_type} node '{node.name or node.output[0]}'"
        expand = _unroll_scan if node.op_type == "Scan" else _unroll_loop
        new_nodes, initializers = expand(node, body, shapes, constants, names, where)
        nodes.extend(new_nodes)
        graph.initializer.extend(initializers)
        count += 1
    del graph.node[:]
    graph.node.extend(nodes)
    return count


def _attr(node: onnx.NodeProto, name: str, default):
    for attr in node.attribute:
        if attr.name == name:
            return helper.get_attribute_value(attr)
    return default


def _int_constant(name: str, constants: dict) -> int | None:
    tensor = constants.get(name)
    if tensor is None:
        return None
    value = numpy_helper.to_array(tensor)
    return int(value.reshape(())) if value.size == 1 else None


def _body_copy(body: onnx.GraphProto, bound: dict[str, str], names: _Names, tag: str,
               shared: dict[str, str]) -> tuple[list[onnx.NodeProto], dict[str, str]]:
    """One iteration of ``body``: its nodes with every name the body defines renamed (body inputs to ``bound``,
    initializers to ``shared``), outer-scope names kept. Returns the nodes and the map of the body's names."""
    rename = dict(bound)
    rename.update(shared)
    for node in body.node:
        for out in node.output:
            if out:
                rename[out] = names.fresh(f"{tag}/{out}")
    copies = []
    for node in body.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = f"{tag}/{node.name}" if node.name else ""
        copy.input[:] = [rename.get(i, i) if i else i for i in node.input]
        copy.output[:] = [rename.get(o, o) if o else o for o in node.output]
        for attr in copy.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _rename_outer_references(attr.g, rename)
        copies.append(copy)
    return copies, rename


def _rename_outer_references(graph: onnx.GraphProto, rename: dict[str, str]) -> None:
    """In a subgraph (an If branch in the body), rename the body's tensors it reads from its enclosing scope."""
    local = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    local |= {o for n in graph.node for o in n.output}
    outer = {k: v for k, v in rename.items() if k not in local}
    for node in graph.node:
        node.input[:] = [outer.get(i, i) if i else i for i in node.input]
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _rename_outer_references(attr.g, outer)
    for out in graph.output:
        if out.name in outer:
            out.name = outer[out.name]


def _shared_initializers(body: onnx.GraphProto, names: _Names, tag: str) -> tuple[dict[str, str], list]:
    """The body's initializers, once for all iterations, under fresh names."""
    shared, tensors = {}, []
    for tensor in body.initializer:
        copy = onnx.TensorProto()
        copy.CopyFrom(tensor)
        copy.name = shared[tensor.name] = names.fresh(f"{tag}/{tensor.name}")
        tensors.append(copy)
    return shared, tensors


def _stack(nodes: list, parts: Iterable[str], axis: int, output: str, names: _Names, tag: str,
           initializers: list) -> None:
    """``output`` = the ``parts`` stacked along a new ``axis`` (Unsqueeze each, Concat); Unsqueeze takes its axes as
    an input from opset 13, as an attribute before."""
    axes = names.fresh(f"{tag}/axes")
    if names.opset >= 13:
        initializers.append(numpy_helper.from_array(np.array([axis], np.int64), axes))
    expanded = []
    for part in parts:
        expanded.append(names.fresh(f"{tag}/unsqueezed"))
        nodes.append(helper.make_node("Unsqueeze", [part, axes], [expanded[-1]]) if names.opset >= 13
                     else helper.make_node("Unsqueeze", [part], [expanded[-1]], axes=[axis]))
    nodes.append(helper.make_node("Concat", expanded, [output], axis=axis))


def _unroll_scan(node, body, shapes, constants, names, where):
    scans = int(_attr(node, "num_scan_inputs", 0))
    states = len(node.input) - scans
    in_axes = list(_attr(node, "scan_input_axes", [0] * scans))
    in_dirs = list(_attr(node, "scan_input_directions", [0] * scans))
    outs = len(body.output) - states
    out_axes = list(_attr(node, "scan_output_axes", [0] * outs))
    out_dirs = list(_attr(node, "scan_output_directions", [0] * outs))
    scan_inputs = list(node.input[states:])
    steps = set()
    for name, axis in zip(scan_inputs, in_axes):
        shape = shapes.get(name)
        if shape is None:
            raise UnsupportedOpError(f"{where}: scan input '{name}' has no static shape; bind the model's input "
                                     "shapes (--input-shape NAME=DIMS) so its length is known")
        steps.add(shape[axis % len(shape)])
    if len(steps) != 1:
        raise UnsupportedOpError(f"{where}: its scan inputs have different lengths {sorted(steps)}")
    count = steps.pop()
    _check_count(count, where)
    tag = node.name or node.output[0]
    shared, initializers = _shared_initializers(body, names, tag)
    nodes: list[onnx.NodeProto] = []
    state = list(node.input[:states])
    collected: list[list[str]] = [[] for _ in range(outs)]
    for t in range(count):
        bound = dict(zip((v.name for v in body.input[:states]), state))
        for j, (name, axis, direction) in enumerate(zip(scan_inputs, in_axes, in_dirs)):
            index = names.fresh(f"{tag}/t{t}/index")
            initializers.append(numpy_helper.from_array(np.array(count - 1 - t if direction else t, np.int64), index))
            element = names.fresh(f"{tag}/t{t}/element")
            nodes.append(helper.make_node("Gather", [name, index], [element], axis=axis))
            bound[body.input[states + j].name] = element
        copies, rename = _body_copy(body, bound, names, f"{tag}/t{t}", shared)
        nodes.extend(copies)
        results = [rename.get(o.name, o.name) for o in body.output]
        state = results[:states]
        for k in range(outs):
            collected[k].append(results[states + k])
    for k, output in enumerate(node.output[:states]):
        if output:
            nodes.append(helper.make_node("Identity", [state[k]], [output]))
    for k, output in enumerate(node.output[states:]):
        if output:
            parts = collected[k][::-1] if out_dirs[k] else collected[k]
            element = body.output[states + k]
            rank = len(element.type.tensor_type.shape.dim) if element.type.tensor_type.HasField("shape") else None
            axis = out_axes[k] if out_axes[k] >= 0 or rank is None else out_axes[k] + rank + 1
            if axis < 0:
                raise UnsupportedOpError(f"{where}: a negative scan_output_axes needs the output's rank, which is "
                                         "unknown here; use a non-negative axis")
            _stack(nodes, parts, axis, output, names, tag, initializers)
    return nodes, initializers


def _always_true(name: str, body: onnx.GraphProto, cond_input: str, constants: dict) -> bool:
    """Whether the body's condition output is its condition input passed on (through Identity) or a constant
    true."""
    producers = {o: n for n in body.node for o in n.output}
    local_constants = {t.name: t for t in body.initializer}
    while True:
        if name == cond_input:
            return True
        tensor = local_constants.get(name) or constants.get(name)
        node = producers.get(name)
        if node is not None and node.op_type == "Constant" and node.attribute:
            tensor = helper.get_attribute_value(node.attribute[0])
        if isinstance(tensor, onnx.TensorProto):
            return bool(numpy_helper.to_array(tensor).all())
        if node is None or node.op_type != "Identity":
            return False
        name = node.input[0]


def _check_count(count: int, where: str) -> None:
    if count > MAX_ITERATIONS:
        raise UnsupportedOpError(f"{where}: {count} iterations; hetpart unrolls at most {MAX_ITERATIONS}")


def _unroll_loop(node, body, shapes, constants, names, where):
    trip = node.input[0] if len(node.input) > 0 else ""
    cond = node.input[1] if len(node.input) > 1 else ""
    count = _int_constant(trip, constants) if trip else None
    if count is None:
        found = "absent (a while loop)" if not trip else "computed at run time"
        raise UnsupportedOpError(f"{where}: its trip count is {found}; hetpart unrolls loops whose trip count is a "
                                 "constant for the bound input shapes")
    if cond and _int_constant(cond, constants) is None:
        raise UnsupportedOpError(f"{where}: its condition '{cond}' is computed at run time; hetpart unrolls loops "
                                 "that run their full trip count")
    if cond and not _int_constant(cond, constants):
        count = 0
    if not _always_true(body.output[0].name, body, body.input[1].name, constants):
        raise UnsupportedOpError(f"{where}: the body computes whether to go on from the data; hetpart unrolls "
                                 "loops that run their full trip count")
    _check_count(count, where)
    carried = len(node.input) - 2
    tag = node.name or node.output[0]
    shared, initializers = _shared_initializers(body, names, tag)
    nodes: list[onnx.NodeProto] = []
    state = list(node.input[2:])
    collected: list[list[str]] = [[] for _ in range(len(body.output) - 1 - carried)]
    true = names.fresh(f"{tag}/true")
    initializers.append(numpy_helper.from_array(np.array(True), true))
    for t in range(count):
        iteration = names.fresh(f"{tag}/t{t}/iteration")
        initializers.append(numpy_helper.from_array(np.array(t, np.int64), iteration))
        bound = {body.input[0].name: iteration, body.input[1].name: true}
        bound.update(zip((v.name for v in body.input[2:]), state))
        copies, rename = _body_copy(body, bound, names, f"{tag}/t{t}", shared)
        nodes.extend(copies)
        results = [rename.get(o.name, o.name) for o in body.output]
        state = results[1:1 + carried]
        for k, part in enumerate(results[1 + carried:]):
            collected[k].append(part)
    for k, output in enumerate(node.output[:carried]):
        if output:
            nodes.append(helper.make_node("Identity", [state[k]], [output]))
    for k, output in enumerate(node.output[carried:]):
        if output:
            if not collected[k]:
                raise UnsupportedOpError(f"{where}: runs no iteration, so its scan output '{output}' is empty")
            _stack(nodes, collected[k], 0, output, names, tag, initializers)
    return nodes, initializers
