"""ExtractOpFeatures: turn a Relax ``main`` into an :class:`hetpart.graph.OpGraph`.

Op level
  Every binding in ``main`` whose value is a ``relax.Call`` to a ``tvm.ir.Op`` is one op; its id is its
  position among such bindings (the contract ``tvm_passes.annotate`` relies on). ``TupleGetItem``, ``Tuple``
  and alias bindings are transparent: an edge goes from the op that produced the tuple to the op that reads
  an item, carrying only the bytes of the items read. Constants and model inputs listed as parameters count
  as ``param_bytes``; other model inputs are recorded in ``graph_inputs``. Ops whose output is not a tensor
  (shape/prim values) are marked ``shape_only``.
FLOPs (a multiply-add counts as 2 FLOPs)
  conv: ``2*N*Co*Ho*Wo*(Ci/groups)*Kh*Kw``; matmul: ``2*prod(out)*K``; pooling: one per window element per
  output; reductions/softmax/normalisation: a small constant per input element (see ``_FLOPS_PER_ELEMENT``);
  elementwise: one per output element; data movement (reshape, transpose, concat, take, split, ...): 0.
Fused-kernel level
  TVM's own fusion (LegalizeOps, AnnotateTIROpPattern, FuseOps) groups the ops into kernels; each fused
  function's members are mapped back to ops exactly (:mod:`tvm_passes.kernel_groups`).
"""
from __future__ import annotations

import collections
import logging
from typing import Any, Iterable

import numpy as np

from hetpart.errors import InvalidGraphError
from hetpart.graph import Edge, OpGraph, OpNode, TensorSpec, slice_read_bytes, tensor_bytes
from tvm_passes.bindings import op_bindings
from tvm_passes.kernel_groups import fused_kernel_groups

log = logging.getLogger(__name__)

# Bump whenever a change here alters the features of an unchanged model (stored kernel features are then
# re-extracted by `hetpart profile`; timings are kept). 2: a call_tir's (activation, constant) operand tuple no
# longer splits its bytes evenly between the two, which had counted half of each activation as a parameter.
# 3: a slicing op (take, strided_slice) reads at most its output's worth of its data operand, at op and kernel level.
EXTRACTOR_VERSION = 3

_DATA_MOVEMENT = {
    "reshape", "permute_dims", "expand_dims", "squeeze", "flatten", "concat", "split", "strided_slice",
    "take", "broadcast_to", "tile", "repeat", "stack", "layout_transform", "astype", "to_vdevice",
    "hint_on_device", "zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "arange", "gather_elements",
    "gather_nd", "scatter_elements", "dynamic_strided_slice", "where", "flip", "collapse_sum_to", "one_hot",
}
_FLOPS_PER_ELEMENT = {  # per *input* element, approximate, for ops that are not multiply-adds
    "softmax": 3, "log_softmax": 4, "layer_norm": 8, "group_norm": 8, "batch_norm": 2, "rms_norm": 4,
    "sum": 1, "mean": 1, "max": 1, "min": 1, "prod": 1, "variance": 3, "std": 3, "argmax": 1, "argmin": 1,
    "adaptive_avg_pool2d": 1, "adaptive_avg_pool1d": 1,
}
_SHAPE_OPS = {"shape_of", "tensor_to_shape", "shape_to_tensor"}


def _tensor_types(ty) -> list:
    from tvm import relax

    if isinstance(ty, relax.TensorType):
        return [ty]
    if isinstance(ty, relax.TupleType):
        return [t for f in ty.fields for t in _tensor_types(f)]
    return []


def _flatten_tuple_args(args) -> list:
    """Operands with literal tuples opened up, so ``call_tir(f, (activation, const))`` counts each on its own."""
    from tvm import relax

    flat = []
    for arg in args:
        if isinstance(arg, relax.Tuple):
            flat.extend(_flatten_tuple_args(arg.fields))
        else:
            flat.append(arg)
    return flat


def _static_shape(ty) -> tuple[int, ...]:
    if ty.shape is None:
        raise InvalidGraphError("a tensor has an unknown shape; bind every input shape before extracting")
    try:
        return tuple(s.value for s in ty.shape.values[:])     # slicing reads an FFI array faster than iterating
    except AttributeError:                                     # a symbolic dimension has no value
        raise InvalidGraphError(f"a tensor has a symbolic shape {ty.shape}; bind input shapes "
                                "(--input-shape NAME=DIMS) so that every shape is static") from None


_ATTRS_METHODS = {"get_int", "get_int_tuple", "get_str", "id_", "is_", "same_as", "keys", "handle"}


def _attrs_dict(attrs) -> dict[str, Any]:
    """Op attributes (strides, padding, groups, layouts, axes, ...) as JSON-safe values."""
    if attrs is None:
        return {}
    if hasattr(attrs, "keys"):
        keys = list(attrs.keys())
    else:  # 0.27 attrs objects expose fields as properties
        keys = [k for k in dir(attrs) if not k.startswith("_") and k not in _ATTRS_METHODS]
    out: dict[str, Any] = {}
    for key in keys:
        value = attrs[key] if hasattr(attrs, "keys") else getattr(attrs, key)
        if callable(value):
            continue
        out[str(key)] = _jsonable(value)
    return out


def _jsonable(value):
    import tvm

    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tvm.tirx.IntImm,)):
        return int(value)
    if isinstance(value, (tvm.tirx.FloatImm,)):
        return float(value)
    if hasattr(value, "__len__") and not isinstance(value, str):
        try:
            return [_jsonable(v) for v in value]
        except TypeError:
            pass
    return str(value)


def op_flops(op: str, in_shapes: list[tuple[int, ...]], out_shapes: list[tuple[int, ...]],
             attrs: dict[str, Any]) -> int:
    """FLOPs of one Relax op (multiply-add = 2)."""
    short = op.removeprefix("relax.").removeprefix("nn.")
    out_elems = sum(int(np.prod(s, dtype=np.int64)) for s in out_shapes)
    if short in ("conv1d", "conv2d", "conv3d"):
        weight = in_shapes[1]                      # O, I/groups, spatial... (OIHW; other kernel layouts below)
        layout = str(attrs.get("kernel_layout", "OIHW"))
        per_out = int(np.prod(weight, dtype=np.int64)) // weight[layout.index("O")] if "O" in layout else 0
        return 2 * out_elems * per_out
    if short in ("conv1d_transpose", "conv2d_transpose"):
        data, weight = in_shapes[0], in_shapes[1]  # weight IOHW: I = Cin, O = Cout/groups
        return 2 * int(np.prod(data, dtype=np.int64)) * int(np.prod(weight[1:], dtype=np.int64))
    if short == "matmul":
        a = in_shapes[0]
        return 2 * out_elems * int(a[-1])
    if short in ("max_pool2d", "avg_pool2d", "max_pool1d", "avg_pool1d", "max_pool3d", "avg_pool3d"):
        return out_elems * int(np.prod(attrs.get("pool_size", [1]), dtype=np.int64))
    if short in _FLOPS_PER_ELEMENT:
        return _FLOPS_PER_ELEMENT[short] * int(np.prod(in_shapes[0], dtype=np.int64)) if in_shapes else 0
    if short in _DATA_MOVEMENT or short in _SHAPE_OPS:
        return 0
    return out_elems  # elementwise: one per output element


class _Extractor:
    """Walks ``main`` once; see the module docstring for the conventions."""

    def __init__(self, func, param_inputs: Iterable[str]):
        self.func = func
        self.param_names = set(param_inputs)
        # vars are keyed by object address (__chandle__): a dict keyed by the vars compares each hit with Var.__eq__
        self.param_vars = {p.__chandle__() for p in func.params if p.name in self.param_names}
        self.input_handles = {p.__chandle__(): p.name for p in func.params if p.name not in self.param_names}
        self.input_vars = [p for p in func.params if p.name not in self.param_names]
        self.nodes: list[OpNode] = []
        # var -> list of (source, item index or None); source is ("op", id) | ("input", name) | ("param",)
        self.origin: dict[Any, list[tuple[tuple, int | None]]] = {}
        self.input_consumers: dict[str, set[int]] = {p.name: set() for p in self.input_vars}
        self.edge_bytes: dict[int, dict[int, int]] = {}   # consumer id -> {producer id: bytes read}

    def _sources(self, expr) -> list[tuple[tuple, int | None]]:
        import tvm
        from tvm import relax

        if isinstance(expr, relax.Var):
            handle = expr.__chandle__()
            if handle in self.param_vars:
                return [(("param",), None)]
            if handle in self.origin:
                return self.origin[handle]
            if handle in self.input_handles:
                return [(("input", self.input_handles[handle]), None)]
            return []
        if isinstance(expr, tvm.ir.GenericConst):
            return [(("param",), None)]
        if isinstance(expr, relax.Tuple):
            return [s for f in expr.fields for s in self._sources(f)]
        if isinstance(expr, relax.TupleGetItem):
            inner = self._sources(expr.tuple_value)
            return [(src, expr.index if item is None else item) for src, item in inner]
        return []

    def run(self, bindings_of_ops: list) -> None:
        from tvm import relax

        op_set = {b.var.__chandle__() for b in bindings_of_ops}
        for block in self.func.body.blocks:
            for b in block.bindings:
                if b.var.__chandle__() in op_set:
                    self._add_op(b)
                elif isinstance(b, (relax.VarBinding, relax.MatchCast)):   # alias / TupleGetItem / Tuple
                    self.origin[b.var.__chandle__()] = self._sources(b.value)

    def _operand_bytes(self, arg) -> list[int]:
        return [tensor_bytes(_static_shape(t), str(t.dtype)) for t in _tensor_types(arg.ty)]

    def _add_op(self, binding) -> None:
        call = binding.value
        op_id = len(self.nodes)
        op = call.op.name
        attrs = _attrs_dict(call.attrs)
        in_types = [t for a in call.args for t in _tensor_types(a.ty)]
        out_types = _tensor_types(binding.var.ty)
        in_shapes = [_static_shape(t) for t in in_types]
        out_shapes = [_static_shape(t) for t in out_types]
        producers: dict[int, int] = {}
        graph_inputs: list[str] = []
        param_bytes = 0
        for arg in _flatten_tuple_args(call.args):
            sources = self._sources(arg)
            arg_sizes = self._operand_bytes(arg)
            if not sources:
                continue
            for k, (src, item) in enumerate(sources):
                if src[0] == "param":
                    # a tuple-typed operand (e.g. a var bound to a tuple) pairs each source with its field
                    param_bytes += (arg_sizes[k] if len(arg_sizes) == len(sources)
                                    else sum(arg_sizes) // max(1, len(sources)))
                elif src[0] == "input":
                    graph_inputs.append(src[1])
                    self.input_consumers[src[1]].add(op_id)
                else:
                    prod = self.nodes[src[1]]
                    size = (tensor_bytes(prod.output_shapes[item], prod.output_dtypes[item])
                            if item is not None and item < len(prod.output_shapes) else prod.bytes_written)
                    producers[src[1]] = producers.get(src[1], 0) + size
        bytes_written = sum(tensor_bytes(s, str(t.dtype)) for s, t in zip(out_shapes, out_types))
        operand_bytes = [tensor_bytes(s, str(t.dtype)) for s, t in zip(in_shapes, in_types)]
        bytes_read = sum(operand_bytes[1:]) + (slice_read_bytes(op, operand_bytes[0], bytes_written)
                                               if operand_bytes else 0)
        short = op.removeprefix("relax.").removeprefix("nn.")
        self.nodes.append(OpNode(
            id=op_id, name=binding.var.name, op=op, inputs=sorted(producers),
            input_shapes=in_shapes, input_dtypes=[str(t.dtype) for t in in_types],
            output_shapes=out_shapes, output_dtypes=[str(t.dtype) for t in out_types], attrs=attrs,
            flops=op_flops(op, in_shapes, out_shapes, attrs), bytes_read=bytes_read, bytes_written=bytes_written,
            param_bytes=param_bytes, shape_only=(not out_types) or short in _SHAPE_OPS,
            graph_inputs=sorted(set(graph_inputs)), tags=_rnn_tags(binding.var.name)))
        self.edge_bytes[op_id] = producers
        self.origin[binding.var.__chandle__()] = [(("op", op_id), None)]

    def graph(self, name: str, source_hash: str) -> OpGraph:
        edges = [Edge(src, dst, size) for dst, prods in sorted(self.edge_bytes.items())
                 for src, size in sorted(prods.items())]
        inputs = tuple(TensorSpec(p.name, _static_shape(p.ty), str(p.ty.dtype),
                                  consumers=sorted(self.input_consumers[p.name])) for p in self.input_vars)
        outputs = []
        body = self.func.body.body
        for k, (src, item) in enumerate(self._sources(body)):
            if src[0] == "op":
                node = self.nodes[src[1]]
                idx = item or 0
                outputs.append(TensorSpec(f"output{k}", node.output_shapes[idx], node.output_dtypes[idx],
                                          producer=src[1]))
            elif src[0] == "input":
                spec = next(i for i in inputs if i.name == src[1])
                outputs.append(TensorSpec(f"output{k}", spec.shape, spec.dtype))
        return OpGraph(nodes=tuple(self.nodes), edges=tuple(edges), inputs=inputs, outputs=tuple(outputs),
                       source_hash=source_hash, name=name)


def _rnn_tags(var_name: str) -> dict[str, Any]:
    from tvm_passes.rnn import parse_rnn_tag

    return parse_rnn_tag(var_name) or {}


def extract_op_graph(mod, *, name: str = "", source_hash: str = "", param_inputs: Iterable[str] = (),
                     with_kernels: bool = True) -> OpGraph:
    """The OpGraph of ``mod["main"]`` (op level), with fused-kernel groups when ``with_kernels``."""
    func = mod["main"]
    extractor = _Extractor(func, param_inputs)
    extractor.run(op_bindings(func))
    graph = extractor.graph(name, source_hash)
    if with_kernels and graph.nodes:
        names = collections.Counter(n.name for n in graph.nodes)
        repeated = sorted(n for n, count in names.items() if count > 1)
        if repeated:
            raise InvalidGraphError(
                f"fused kernels are mapped back to ops by binding name, so every op binding of main needs a "
                f"unique var name; {len(repeated)} name(s) are bound more than once (e.g. {repeated[:3]}). Fix: "
                "give the bindings distinct name_hints in the pass that emitted them (BlockBuilder.emit(..., "
                "name_hint=...)), or extract with with_kernels=False for the op level only.")
        groups = fused_kernel_groups(mod, list(graph.nodes))
        group_of = {i: g.id for g in groups for i in g.op_ids}
        nodes = tuple(OpNode(**{**n.__dict__, "kernel_group": group_of.get(n.id)}) for n in graph.nodes)
        graph = OpGraph(nodes=nodes, edges=graph.edges, inputs=graph.inputs, outputs=graph.outputs,
                        kernel_groups=groups, source_hash=source_hash, name=name)
    return graph.validate()


def ExtractOpFeatures(param_inputs: Iterable[str] = (), name: str = ""):
    """Module pass form: records the op count, total FLOPs and kernel count on ``main`` as attributes
    (``hetpart.num_ops``, ``hetpart.total_flops``, ``hetpart.num_kernels``) and leaves the IR unchanged
    otherwise. Use :func:`extract_op_graph` to get the OpGraph itself."""
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="hetpart.ExtractOpFeatures")
    def _pass(mod, _ctx):
        graph = extract_op_graph(mod, name=name, param_inputs=param_inputs)
        out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs, global_infos=mod.global_infos)
        out["main"] = mod["main"].with_attrs({"hetpart.num_ops": graph.num_ops,
                                              "hetpart.total_flops": graph.total_flops,
                                              "hetpart.num_kernels": len(graph.kernel_groups)})
        return out

    return _pass
