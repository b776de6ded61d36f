"""A PyTorch model as candidate pipeline-split units at module granularity, and the DAG between them.

**Units.** The root module is always cut into its children; ``nn.Sequential`` / ``nn.ModuleList`` /
``nn.ModuleDict`` are transparent (their children take their place: ResNet's ``layer1`` gives ``layer1.0``,
``layer1.1``; BERT's ``layers`` gives ``layers.0`` ...). ``granularity=g`` cuts modules ``g - 1`` levels further
down (a ResNet block into its convolutions), but only a module whose children each run at most once per forward
(a block that calls one ``relu`` twice stays whole). A unit must run exactly once per forward; modules that never
run (e.g. an ``nn.Embedding`` whose weight is sliced directly) are not units, and neither are parameter-free modules
that run several times (one ``nn.Dropout`` applied twice): their ops are glue (below).

**Which ops belong to a unit.** The model is traced once with ``torch.export``; every aten op whose module stack
(``nn_module_stack``) contains a unit belongs to it. Ops outside every unit (the root's own code between unit
calls, e.g. ``torch.flatten`` or adding a position embedding: *glue*) go with the unit that ran last before them,
which is exactly where ``torch.distributed.pipelining.pipeline(split_spec={unit: SplitPoint.BEGINNING})`` puts
them. Units whose ops interleave in the trace cannot be pipeline stages and are refused. A parameter belongs to
the unit of the ops that read it (one unit, else the parameter is shared and refused).

**The DAG.** An edge ``A -> B`` carries the bytes of every tensor an op of ``B`` reads from an op of ``A``: a chain
for chain models, longer edges for skip connections across units. Units are numbered in forward order.

Costs (the units' summed kernel latencies per device) are added by :mod:`hetpart.training_torch.unit_costs`.
"""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from hetpart.graph import Edge, KernelGroup, OpGraph, OpNode, TensorSpec
from hetpart.training_torch.errors import UnitMappingError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TracedUnit:
    """One unit found in the trace (before costing)."""

    name: str                               # module path of the unit, e.g. "layer1.0"
    modules: tuple[str, ...]                # module paths merged into it (``name`` first)
    module_type: str                        # the unit module's class, e.g. "models.resnet.BasicBlock"
    param_names: tuple[str, ...]            # parameters it owns, in the model's order
    param_bytes: int
    input_shapes: tuple[tuple[int, ...], ...]   # the unit module's positional inputs (forward pre-hook)
    input_dtypes: tuple[str, ...]
    glue_ops: tuple[str, ...] = ()          # aten ops of the root's code that run with this unit
    aten_ops: int = 0                       # aten ops of the unit in the trace (glue included)
    signature: str = ""                     # equal for units whose own traced ops are identical (same costs)


@dataclass(frozen=True)
class TracedModel:
    """Units in forward order, what flows between them, and each unit's recorded example inputs."""

    name: str
    units: tuple[TracedUnit, ...]
    edges: tuple[Edge, ...]
    inputs: tuple[TensorSpec, ...]          # model inputs (consumers = unit indices)
    outputs: tuple[TensorSpec, ...]         # model outputs (producer = unit index)
    output_shapes: tuple[tuple[tuple[int, ...], ...], ...]   # per unit: tensors it sends on (or returns)
    output_dtypes: tuple[tuple[str, ...], ...]
    output_bytes: tuple[int, ...]
    source_hash: str
    example_args: Mapping[str, tuple[Any, ...]] = field(default_factory=dict, repr=False)   # unit -> torch args
    notes: tuple[str, ...] = ()

    def to_graph(self, nodes_extra: Sequence[Mapping[str, Any]]) -> OpGraph:
        """The unit OpGraph (level "kernel": a unit is the smallest thing a stage can hold); ``nodes_extra[k]``
        adds OpNode fields (flops, bytes, tags) to unit ``k``."""
        preds: dict[int, set[int]] = {k: set() for k in range(len(self.units))}
        for e in self.edges:
            preds[e.dst].add(e.src)
        nodes = []
        for k, u in enumerate(self.units):
            extra = dict(nodes_extra[k]) if k < len(nodes_extra) else {}
            tags = {"modules": list(u.modules), "module_type": u.module_type, "params": len(u.param_names),
                    "glue_ops": list(u.glue_ops), **extra.pop("tags", {})}
            nodes.append(OpNode(
                id=k, name=u.name, op=f"module:{u.module_type}", inputs=tuple(sorted(preds[k])),
                input_shapes=u.input_shapes, input_dtypes=u.input_dtypes, output_shapes=self.output_shapes[k],
                output_dtypes=self.output_dtypes[k], param_bytes=u.param_bytes, kernel_group=k,
                graph_inputs=tuple(t.name for t in self.inputs if k in t.consumers), tags=tags, **extra))
        return OpGraph(nodes=tuple(nodes), edges=self.edges, inputs=self.inputs, outputs=self.outputs,
                       kernel_groups=tuple(KernelGroup(k, u.name, (k,)) for k, u in enumerate(self.units)),
                       source_hash=self.source_hash, name=self.name, level="kernel").validate()


# ------------------------------------------------------------------------------------------------ discovery
def _containers():
    from torch import nn

    return (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def record_calls(model: Any, example_inputs: Sequence[Any]) -> tuple[dict[str, int], dict[str, tuple], list[str]]:
    """One forward (no grad, eval mode, every module's training flag restored after): calls per module path, the
    first call's positional args per module (detached), and the order of first calls."""
    import torch

    counts: dict[str, int] = {}
    args_of: dict[str, tuple] = {}
    order: list[str] = []
    handles = []

    def hook_for(path: str):
        def hook(_module, args, kwargs):
            counts[path] = counts.get(path, 0) + 1
            if path not in args_of:
                if kwargs:
                    args_of[path] = ("kwargs", tuple(sorted(kwargs)))
                else:
                    args_of[path] = tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args)
                order.append(path)
        return hook

    flags = {m: m.training for m in model.modules()}
    try:
        for path, module in model.named_modules():
            if path:
                handles.append(module.register_forward_pre_hook(hook_for(path), with_kwargs=True))
        model.eval()
        with torch.no_grad():
            model(*example_inputs)
    finally:
        for h in handles:
            h.remove()
        for m, flag in flags.items():
            m.training = flag
    return counts, args_of, order


def choose_units(model: Any, counts: Mapping[str, int], granularity: int = 1) -> list[str]:
    """Module paths of the units (see the module docstring), in module-tree order."""
    if granularity < 1:
        raise UnitMappingError(f"granularity must be >= 1 (1 = the root's children); found {granularity}")
    containers = _containers()

    def called_children(path: str, module: Any):
        for name, child in module.named_children():
            child_path = f"{path}.{name}" if path else name
            if isinstance(child, containers):
                yield from called_children(child_path, child)
            elif counts.get(child_path, 0):
                yield child_path, child

    def stateless(module: Any) -> bool:
        return next(iter(module.parameters()), None) is None

    def expandable(path: str, module: Any) -> bool:
        children = [(p, c) for p, c in called_children(path, module) if counts[p] == 1 or not stateless(c)]
        return bool(children) and all(counts[p] == 1 for p, _ in children)

    def visit(path: str, module: Any, depth: int) -> list[str]:
        out: list[str] = []
        for child_path, child in called_children(path, module):
            if counts[child_path] > 1 and stateless(child):
                continue    # e.g. one Dropout applied twice: its ops run as glue with the unit before each call
            if counts[child_path] > 1:
                raise UnitMappingError(
                    f"module {child_path!r} runs {counts[child_path]} times per forward; a pipeline unit must run "
                    f"once. Use a coarser granularity (its parent {path or 'the root'!r} as a unit) or give each "
                    "call its own module")
            if depth < granularity and expandable(child_path, child):
                out += visit(child_path, child, depth + 1)
            else:
                out.append(child_path)
        return out

    units = visit("", model, 1)
    if not units:
        raise UnitMappingError(f"{type(model).__name__} has no submodule that runs in forward: nothing to split")
    return units


def _val_bytes(val: Any) -> int:
    if isinstance(val, (tuple, list)):
        return sum(_val_bytes(v) for v in val)
    if hasattr(val, "shape") and hasattr(val, "element_size"):
        return int(val.numel()) * int(val.element_size())
    return 0


def _val_spec(val: Any) -> tuple[tuple[int, ...], str] | None:
    if hasattr(val, "shape") and hasattr(val, "dtype"):
        return tuple(int(d) for d in val.shape), str(val.dtype).removeprefix("torch.")
    return None


@dataclass(frozen=True)
class ModelTrace:
    """A model traced once: its ``torch.export`` program, the candidate units (module paths in forward order) and
    each module's first positional arguments. :func:`map_units` turns it into units (as often as needed)."""

    model: Any = field(repr=False)
    exported: Any = field(repr=False)
    unit_paths: tuple[str, ...]
    args_of: Mapping[str, tuple] = field(repr=False)
    name: str = ""


def trace_model(model: Any, example_inputs: Sequence[Any], *, granularity: int = 1, name: str = "") -> ModelTrace:
    """Record calls (forward pre-hooks) and trace ``model`` with ``torch.export`` for ``example_inputs`` (one
    micro-batch), in eval mode; every module's training flag is restored afterwards."""
    import torch

    example_inputs = tuple(example_inputs)
    counts, args_of, order = record_calls(model, example_inputs)
    unit_paths = choose_units(model, counts, granularity)
    position = {p: k for k, p in enumerate(order)}
    unit_paths.sort(key=lambda p: position[p])
    flags = {m: m.training for m in model.modules()}
    try:
        model.eval()
        with torch.no_grad():
            exported = torch.export.export(model, example_inputs)
    except Exception as exc:  # torch raises many types here
        raise UnitMappingError(f"torch.export could not trace {type(model).__name__} ({type(exc).__name__}: "
                               f"{str(exc).splitlines()[0][:300] if str(exc) else ''}); units need a traceable "
                               "model") from exc
    finally:
        for m, flag in flags.items():
            m.training = flag
    return ModelTrace(model, exported, tuple(unit_paths), args_of, name or type(model).__name__)


def _op_name(node: Any) -> str:
    return str(getattr(node.target, "__name__", node.target))


def _signature(nodes: Sequence[Any]) -> str:
    """A hash of a unit's own traced ops: targets, output shapes, constant arguments and where every tensor
    argument comes from (an earlier op of the unit, or the shape of a parameter / an outside tensor)."""
    position = {n: k for k, n in enumerate(nodes)}

    def arg(a: Any) -> Any:
        if hasattr(a, "op") and hasattr(a, "meta"):
            return ("op", position[a]) if a in position else ("in", _val_spec(a.meta.get("val")))
        if isinstance(a, (list, tuple)):
            return tuple(arg(x) for x in a)
        return repr(a)

    digest = hashlib.sha256()
    for n in nodes:
        digest.update(repr((_op_name(n), _val_spec(n.meta.get("val")), arg(n.args),
                            sorted((k, arg(v)) for k, v in n.kwargs.items()))).encode())
    return digest.hexdigest()[:16]


def map_units(trace: ModelTrace, fold: frozenset[str] | set[str] = frozenset()) -> TracedModel:
    """Units of a traced model; the units named in ``fold`` run with the unit before them (like glue)."""
    import torch

    graph, sig = trace.exported.graph, trace.exported.graph_signature
    unit_set = set(trace.unit_paths)
    node_unit: dict[Any, str] = {}
    glue: dict[str, list[str]] = {}
    ops: dict[str, int] = {}
    folded: dict[str, list[str]] = {}
    seen_order: list[str] = []
    pending: list[Any] = []          # ops before the first unit: they run with it
    own_nodes: dict[str, list[Any]] = {}   # a unit's own ops (not glue), for its signature
    current: str | None = None
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        stack = node.meta.get("nn_module_stack") or {}
        owner = next((path for path, _ in stack.values() if path in unit_set), None)
        if owner is not None and owner in fold:
            if current is not None and owner not in folded[current]:
                folded[current].append(owner)
            owner = None
        if owner is None:
            if current is None:
                pending.append(node)
                continue
            owner = current
            glue[owner].append(_op_name(node))
        elif owner != current:
            if owner in seen_order:
                raise UnitMappingError(f"the ops of unit {owner!r} are interleaved with those of {current!r} in "
                                       "the traced forward: units must run one after the other to be pipeline "
                                       "stages. Use a coarser granularity")
            seen_order.append(owner)
            glue[owner], ops[owner], folded[owner] = [], 0, [owner]
            current = owner
        node_unit[node] = owner
        own_nodes.setdefault(owner, []).append(node)
        ops[owner] += 1
    if not seen_order:
        raise UnitMappingError(f"no op of the traced {trace.name} belongs to a unit (or every unit was folded)")
    first = seen_order[0]
    for node in pending:
        node_unit[node] = first
        glue[first].append(_op_name(node))
        ops[first] += 1
    for p in sorted(fold & unit_set):
        if not any(p in f for f in folded.values()):
            folded[first].append(p)
    silent = [p for p in trace.unit_paths if p not in seen_order and not any(p in f for f in folded.values())]
    for p in silent:   # modules that leave no op in the trace (an Identity): they run with the unit before them
        before = [q for q in seen_order if trace.unit_paths.index(q) < trace.unit_paths.index(p)]
        folded[before[-1] if before else first].append(p)
    notes = [f"{p} leaves no op in the trace: it runs with the unit before it" for p in silent]
    notes += [f"{p} runs with the unit before it (folded)" for p in sorted(fold & unit_set)]
    index = {p: k for k, p in enumerate(seen_order)}
    placeholders = {n.name: n for n in graph.nodes if n.op == "placeholder"}
    params_of: dict[str, list[str]] = {p: [] for p in seen_order}
    param_bytes: dict[str, int] = {p: 0 for p in seen_order}
    model_params = dict(trace.model.named_parameters())
    for ph_name, fqn in sig.inputs_to_parameters.items():
        users = {node_unit[u] for u in placeholders[ph_name].users if u in node_unit}
        if len(users) > 1:
            raise UnitMappingError(f"parameter {fqn!r} is read by units {sorted(users)}: shared (tied) weights "
                                   "cannot be split across pipeline stages. Use a coarser granularity")
        owner = users.pop() if users else next((p for p in seen_order if fqn.startswith(p + ".")), first)
        params_of[owner].append(fqn)
        param_bytes[owner] += int(model_params[fqn].numel() * model_params[fqn].element_size())
    crossing: dict[tuple[int, int], dict[str, int]] = {}
    sent: dict[int, dict[str, Any]] = {k: {} for k in range(len(seen_order))}
    consumers: dict[str, set[int]] = {n: set() for n in sig.user_inputs}
    for node, owner in node_unit.items():
        dst = index[owner]
        for src_node in node.all_input_nodes:
            if src_node.op == "placeholder" and src_node.name in consumers:
                consumers[src_node.name].add(dst)
            elif src_node in node_unit and node_unit[src_node] != owner:
                src = index[node_unit[src_node]]
                crossing.setdefault((src, dst), {})[src_node.name] = _val_bytes(src_node.meta.get("val"))
                sent[src][src_node.name] = src_node.meta.get("val")
    outputs = []
    output_node = next(n for n in graph.nodes if n.op == "output")
    for k, out in enumerate(output_node.all_input_nodes):
        spec = _val_spec(out.meta.get("val"))
        if out in node_unit and spec is not None:
            sent[index[node_unit[out]]][out.name] = out.meta.get("val")
            outputs.append(TensorSpec(f"output{k}", spec[0], spec[1], index[node_unit[out]]))
    inputs = [TensorSpec(n, *_val_spec(placeholders[n].meta.get("val")), None, sorted(consumers[n]))
              for n in sig.user_inputs if _val_spec(placeholders[n].meta.get("val")) is not None]
    units = []
    for p in seen_order:
        args = trace.args_of.get(p, ())
        if args and args[0] == "kwargs":
            raise UnitMappingError(f"unit {p!r} is called with keyword arguments {list(args[1])}; units must take "
                                   "positional tensors (a pipeline stage receives positional tensors)")
        if any(not isinstance(a, torch.Tensor) for a in args):
            raise UnitMappingError(f"unit {p!r} is called with non-tensor arguments "
                                   f"{[type(a).__name__ for a in args if not isinstance(a, torch.Tensor)]}")
        module = trace.model.get_submodule(p)
        units.append(TracedUnit(
            name=p, modules=tuple(folded[p]), module_type=f"{type(module).__module__}.{type(module).__qualname__}",
            param_names=tuple(params_of[p]), param_bytes=param_bytes[p],
            input_shapes=tuple(tuple(int(d) for d in t.shape) for t in args),
            input_dtypes=tuple(str(t.dtype).removeprefix("torch.") for t in args),
            glue_ops=tuple(glue[p]), aten_ops=ops[p], signature=_signature(own_nodes.get(p, []))))
    out_specs = [[s for s in (_val_spec(v) for v in sent[k].values()) if s is not None] for k in range(len(units))]
    digest = hashlib.sha256(str(graph).encode())
    digest.update(repr([t.shape for t in inputs]).encode())
    digest.update(repr(seen_order).encode())
    return TracedModel(
        name=trace.name, units=tuple(units),
        edges=tuple(Edge(s, d, sum(b.values())) for (s, d), b in sorted(crossing.items())),
        inputs=tuple(inputs), outputs=tuple(outputs),
        output_shapes=tuple(tuple(s for s, _ in specs) for specs in out_specs),
        output_dtypes=tuple(tuple(d for _, d in specs) for specs in out_specs),
        output_bytes=tuple(sum(_val_bytes(v) for v in sent[k].values()) for k in range(len(units))),
        source_hash=digest.hexdigest()[:16], example_args={p: trace.args_of[p] for p in seen_order},
        notes=tuple(notes))
