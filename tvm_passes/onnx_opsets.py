"""Older ONNX opsets: find the nodes TVM 0.27's Relax importer would convert with a converter made for another op
form, and upgrade such models with ``onnx.version_converter`` before ``from_onnx``.

How TVM picks a converter: every converter class has methods ``_impl_vN``; for a model whose default-domain opset
is ``o`` the importer takes the largest ``N <= o`` and, when there is none, the *smallest* ``N`` -- a converter
made for a newer opset (``OnnxOpConverter.get_converter``). Slice has only ``_impl_v13``, which reads starts/ends/
axes as inputs, so a Slice-1 node (opset < 10, starts/ends/axes attributes) fails with "Cannot cast NoneType to
list of Expr"; a TopK-10 node (``K`` is an input) gets ``_impl_v1``, which reads the ``k`` attribute and silently
returns the top 1.

The rule (``find_mismatches``): a node is *mismatched* when the op version its converter was written for (the
ONNX schema at ``N``) moves one of the node's names -- an attribute of the node that is an input there, an input
that is an attribute there, or an input at another position. Names compare case-insensitively (TopK ``k``/``K``).
Additionally ``Upsample`` is always mismatched: its only converter (``_impl_v9``) reads the Upsample-7 ``scales``
attribute and rounds nearest-neighbour indices instead of flooring them (measured: 2.1 max abs error against
onnxruntime for scales 1,1,2,3); the version converter replaces it by Resize, which TVM converts correctly.

A node is also mismatched when an ``axis``/``axes`` attribute counts from the end (``-1``) below opset 11, where
ONNX first allowed that, and TVM picks a converter written before it (``ArgMax._impl_v1`` asserts "Axis is out of
bounds"). torch writes ``dim=-1`` that way at every opset and onnxruntime accepts it; such a node needs opset 11
(``Mismatch.legal_opset``). If ``onnx.version_converter`` cannot upgrade a model whose only mismatches are of this
kind, the model is imported as it is, with a warning.

When a model has mismatched nodes it is upgraded to the *lowest* opset at which none remain (``upgrade_for_tvm``):
each mismatched op type names the lowest opset whose form matches its converter; the model is converted to the
highest of these and checked again (Upsample becomes Resize-10, itself mismatched until Resize-11). TVM 0.27 has
mismatched converters only below opset 11, so upgrades end at opset 10 or 11.

The 10 -> 11 upgrade leaves Resize-11's default coordinates (``half_pixel``) on nodes that had Resize-10's
``asymmetric`` ones; ``keep_resize10_coordinates`` restores them on linear nodes. One op form fails in every opset:
Resize with ``sizes`` and an empty ``scales`` constant (what torch writes for ``interpolate(size=...)`` at opsets
11-12). ``omit_empty_resize_scales`` gives the importer a copy that omits the empty input.
"""
from __future__ import annotations

import collections
import contextlib
import io
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from hetpart.errors import ModelLoadError

log = logging.getLogger(__name__)

DEFAULT_DOMAINS = ("", "ai.onnx")
FIX_OPSET = 13   # the opset error messages suggest: most TVM 0.27 converters are _impl_v13, none mismatched there
MAX_UPGRADE_ROUNDS = 4
RESIZE_COORDINATES_OPSET = 11   # Resize gained coordinate_transformation_mode (default half_pixel) here
NEGATIVE_AXES_OPSET = 11        # axis/axes attributes may count from the end from here on
AXIS_ATTRIBUTES = ("axis", "axes")
# converters that do not implement the op form they are named for, whatever the opset (see the module docstring)
BROKEN_CONVERTERS: Mapping[str, str] = {
    "Upsample": "TVM 0.27's only Upsample converter reads the opset-7 'scales' attribute and rounds "
                "nearest-neighbour indices where ONNX floors them",
}


@dataclass(frozen=True)
class Mismatch:
    """One node whose TVM converter was written for another form of its op."""

    op_type: str
    node_name: str
    op_version: int          # since_version of the node's op at the model's opset
    converter_version: int   # the N of the _impl_vN TVM picks
    reason: str
    legal_opset: int | None = None   # set when the node's own values need this opset (negative axes), not its form

    def describe(self) -> str:
        return (f"TVM 0.27 would convert {self.op_type}-{self.op_version} node {self.node_name!r} with "
                f"{self.op_type}._impl_v{self.converter_version} ({self.reason})")


@dataclass(frozen=True)
class OpsetUpgrade:
    """What ``upgrade_for_tvm`` did to a model."""

    from_opset: int
    to_opset: int
    motivating_ops: tuple[str, ...]   # "Slice x2": the op types mismatched at from_opset, with node counts

    def note(self) -> str:
        return (f"upgraded the ONNX model from opset {self.from_opset} to {self.to_opset} with "
                f"onnx.version_converter before import: TVM 0.27 would convert {', '.join(self.motivating_ops)} "
                "with a converter made for another form of the op (tvm_passes.onnx_opsets)")


def default_opset(model: Any) -> int | None:
    """The model's default-domain (ai.onnx) opset, None when it imports none."""
    for entry in model.opset_import:
        if entry.domain in DEFAULT_DOMAINS:
            return int(entry.version)
    return None


def converter_versions(convert_class: Any) -> list[int]:
    """The N of every ``_impl_vN`` of a TVM converter class, ascending."""
    return sorted(int(name.removeprefix("_impl_v")) for name in dir(convert_class)
                  if name.startswith("_impl_v") and name.removeprefix("_impl_v").isdigit())


def picked_converter_version(versions: list[int], opset: int) -> int:
    """The version TVM 0.27's ``OnnxOpConverter.get_converter`` picks: largest <= opset, else the smallest."""
    candidates = [v for v in versions if v <= opset]
    return max(candidates) if candidates else versions[0]


def _schema(op_type: str, opset: int) -> Any:
    import onnx.defs

    try:
        return onnx.defs.get_schema(op_type, opset, "")
    except onnx.defs.SchemaError:   # the op does not exist yet at this opset
        return None


def _form(schema: Any) -> tuple[list[str], set[str]]:
    return [i.name.lower() for i in schema.inputs], {a.lower() for a in schema.attributes}


def form_difference(op_type: str, opset: int, converter_version: int) -> str | None:
    """Why the op's form at ``opset`` differs from the form its converter reads (None: it does not)."""
    if op_type in BROKEN_CONVERTERS:
        return BROKEN_CONVERTERS[op_type]
    node_schema, conv_schema = _schema(op_type, opset), _schema(op_type, converter_version)
    if node_schema is None or conv_schema is None or node_schema.since_version == conv_schema.since_version:
        return None
    node_inputs, node_attrs = _form(node_schema)
    conv_inputs, conv_attrs = _form(conv_schema)
    version = conv_schema.since_version
    moved = [f"attribute {a} is an input of {op_type}-{version}" for a in sorted(node_attrs)
             if a in conv_inputs and a not in conv_attrs]
    moved += [f"input {i} is an attribute of {op_type}-{version}" for i in node_inputs
              if i in conv_attrs and i not in conv_inputs]
    moved += [f"input {i} is input #{conv_inputs.index(i)} of {op_type}-{version}, not #{k}"
              for k, i in enumerate(node_inputs) if i in conv_inputs and conv_inputs.index(i) != k]
    return "; ".join(moved) or None


def _nodes(graph: Any) -> Iterator[Any]:
    """Every node, including those of subgraphs (If branches)."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from _nodes(attr.g)
            for sub in attr.graphs:
                yield from _nodes(sub)


def node_label(node: Any) -> str:
    return node.name or f"(unnamed, output {node.output[0] if node.output else '?'})"


def omit_empty_resize_scales(model: Any) -> Any | None:
    """A copy of ``model`` for TVM's importer in which Resize nodes that give ``sizes`` omit their empty ``scales``
    input; None when no node does so.

    Exporters targeting opsets 11-12 (torch's ``F.interpolate(size=...)``) write Resize with both inputs, ``scales``
    an empty constant: ONNX reads an empty ``scales`` as absent, TVM 0.27's converter asserts "Only one of scales and
    sizes can be provided" whatever the opset. The copy names the input ``""`` (omitted), which TVM reads as absent;
    below opset 13 ONNX itself requires the input, so the copy is for the importer only."""
    empty = {init.name for init in model.graph.initializer if 0 in init.dims}
    empty |= {node.output[0] for node in model.graph.node if node.op_type == "Constant" and node.attribute
              and node.attribute[0].HasField("t") and 0 in node.attribute[0].t.dims}

    def wanted(node: Any) -> bool:
        return node.domain in DEFAULT_DOMAINS and node.op_type == "Resize" and len(node.input) >= 4 \
            and bool(node.input[3]) and node.input[2] in empty

    if not any(wanted(node) for node in _nodes(model.graph)):
        return None
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for node in _nodes(copy.graph):
        if wanted(node):
            node.input[2] = ""
    return copy


def find_mismatches(model: Any, convert_map: Mapping[str, Any]) -> list[Mismatch]:
    """Default-domain nodes TVM would convert with a converter made for another form of their op."""
    opset = default_opset(model)
    if opset is None:
        return []
    by_op_type: dict[str, tuple[int, int, str] | None] = {}   # op type -> (op version, converter version, reason)
    out = []
    for node in _nodes(model.graph):
        if node.domain not in DEFAULT_DOMAINS or node.op_type not in convert_map:
            continue
        if node.op_type not in by_op_type:
            by_op_type[node.op_type] = _op_mismatch(node.op_type, opset, convert_map[node.op_type])
        found = by_op_type[node.op_type]
        if found is not None:
            out.append(Mismatch(node.op_type, node_label(node), *found))
        elif opset < NEGATIVE_AXES_OPSET:
            negative = _negative_axes(node, opset, convert_map[node.op_type])
            if negative is not None:
                out.append(Mismatch(node.op_type, node_label(node), *negative, legal_opset=NEGATIVE_AXES_OPSET))
    return out


def _negative_axes(node: Any, opset: int, convert_class: Any) -> tuple[int, int, str] | None:
    """(op version, converter version, reason) when ``node`` counts an axis from the end and TVM would convert it
    with a converter written before ONNX allowed that (opset 11): torch writes ``dim=-1`` as ``axis=-1`` at every
    opset and onnxruntime accepts it, but e.g. TVM's ArgMax-1 converter asserts "Axis is out of bounds"."""
    from onnx import helper

    versions = converter_versions(convert_class)
    if not versions or picked_converter_version(versions, opset) >= NEGATIVE_AXES_OPSET:
        return None
    for attr in node.attribute:
        if attr.name in AXIS_ATTRIBUTES:
            value = helper.get_attribute_value(attr)
            if any(v < 0 for v in (value if isinstance(value, list) else [value])):
                schema = _schema(node.op_type, opset)
                return ((schema.since_version if schema is not None else opset),
                        picked_converter_version(versions, opset),
                        f"{attr.name}={value} counts from the end, which ONNX allows from opset {NEGATIVE_AXES_OPSET}")
    return None


def _op_mismatch(op_type: str, opset: int, convert_class: Any) -> tuple[int, int, str] | None:
    versions = converter_versions(convert_class)
    if not versions:
        return None
    picked = picked_converter_version(versions, opset)
    reason = form_difference(op_type, opset, picked)
    if reason is None:
        return None
    schema = _schema(op_type, opset)
    return (schema.since_version if schema is not None else opset), picked, reason


def lowest_matching_opset(op_type: str, opset: int, convert_map: Mapping[str, Any]) -> int | None:
    """The lowest opset above ``opset`` at which ``op_type`` no longer needs a mismatched converter: its form
    matches, or it is deprecated there (the version converter replaces it). None if there is none."""
    import onnx.defs

    versions = converter_versions(convert_map[op_type])
    for target in range(opset + 1, onnx.defs.onnx_opset_version() + 1):
        schema = _schema(op_type, target)
        if schema is None:
            continue
        if schema.deprecated:
            current = _schema(op_type, opset)
            return target if current is not None and not current.deprecated else None
        if form_difference(op_type, target, picked_converter_version(versions, target)) is None:
            return target
    return None


def _fix_hint(opset: int) -> str:
    if opset < FIX_OPSET:
        return (f"convert the model to opset >= {FIX_OPSET} with onnx.version_converter.convert_version and "
                "retry; if it still fails, replace the node or register a converter")
    return "replace the node with a supported form or register a converter (see docs/architecture.md, Frontends)"


def keep_resize10_coordinates(model: Any) -> int:
    """Give the linear Resize nodes of a model upgraded from below opset 11 Resize-10's coordinates; returns how many.

    Upsample and Resize-10 map output to input coordinates as ``x / scale`` (``asymmetric``); Resize-11 added
    ``coordinate_transformation_mode`` with the default ``half_pixel``, and ``onnx.version_converter``'s 10 -> 11
    adapter does not set it, so an upgraded linear upsample read other input positions (max abs error 0.72 against
    onnxruntime on the original opset-9 model). Nearest-mode nodes are left as converted: for integer scales the
    upgraded defaults select the same inputs, as the tests against onnxruntime check."""
    from onnx import helper

    changed = 0
    for node in _nodes(model.graph):
        if node.domain not in DEFAULT_DOMAINS or node.op_type != "Resize":
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("mode", b"nearest") == b"linear" and "coordinate_transformation_mode" not in attrs:
            node.attribute.append(helper.make_attribute("coordinate_transformation_mode", "asymmetric"))
            changed += 1
    return changed


def upgrade_for_tvm(model: Any, convert_map: Mapping[str, Any], model_label: str) -> tuple[Any, OpsetUpgrade | None]:
    """``(model, None)`` if no node is mismatched, else ``(upgraded model, OpsetUpgrade)``; ModelLoadError if the
    upgrade fails or leaves a mismatched node."""
    from onnx import version_converter

    opset = default_opset(model)
    mismatches = find_mismatches(model, convert_map)
    if not mismatches:
        return model, None
    counts = collections.Counter(m.op_type for m in mismatches)
    motivating = tuple(f"{op} x{n}" for op, n in sorted(counts.items()))
    upgraded, current = model, opset
    for _ in range(MAX_UPGRADE_ROUNDS):
        targets = {m.op_type: lowest_matching_opset(m.op_type, current, convert_map) for m in mismatches
                   if m.legal_opset is None}
        targets.update({m.op_type: max(m.legal_opset, targets.get(m.op_type) or 0) for m in mismatches
                        if m.legal_opset is not None})
        stuck = [m for m in mismatches if targets[m.op_type] is None]
        if stuck:
            first = stuck[0]
            schema = _schema(first.op_type, current)
            fix = (f"{first.op_type} is deprecated since opset {schema.since_version}: replace the node by its "
                   "successor op (Upsample: Resize)" if schema is not None and schema.deprecated
                   else _fix_hint(current))
            raise ModelLoadError(
                f"{model_label}: {first.describe()} at model opset {opset}"
                f"{f' (upgraded to {current})' if current != opset else ''}, and no newer opset changes that; {fix}")
        target = max(targets.values())
        try:
            upgraded = version_converter.convert_version(model, target)
        except Exception as exc:
            if current == opset and all(m.legal_opset is not None for m in mismatches):
                # only axes counted from the end: TVM may still convert them; its own error names the node if not
                log.warning("%s: onnx.version_converter could not upgrade the model to opset %d (%s: %s); importing "
                            "it at opset %s, where %s", model_label, target, type(exc).__name__, _first_line(exc),
                            opset, mismatches[0].describe())
                return model, None
            first = mismatches[0]
            raise ModelLoadError(
                f"{model_label}: {first.describe()} at model opset {opset}, and onnx.version_converter failed to "
                f"upgrade the model to opset {target} ({type(exc).__name__}: {_first_line(exc)}); fix the node or "
                f"export the model at opset >= {FIX_OPSET} and retry") from exc
        current = target
        if opset is not None and opset < RESIZE_COORDINATES_OPSET <= current:
            keep_resize10_coordinates(upgraded)
        mismatches = find_mismatches(upgraded, convert_map)
        if not mismatches:
            upgrade = OpsetUpgrade(opset, current, motivating)
            log.info("%s: %s", model_label, upgrade.note())
            return upgraded, upgrade
    first = mismatches[0]
    raise ModelLoadError(f"{model_label}: {first.describe()} after upgrading from opset {opset} to {current}; "
                         f"{_fix_hint(current)}")


def _first_line(exc: BaseException, limit_chars: int = 240) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text if len(text) <= limit_chars else text[: limit_chars - 3] + "..."


def failing_node(exc: BaseException) -> Any:
    """The ONNX node TVM's importer was converting when ``exc`` was raised (None if it cannot be told).

    Reads the ``node`` local of the importer's node loop (``_construct_nodes`` / ``_convert_subgraph``) in the
    traceback; the innermost such frame wins (a node inside an If branch rather than the If)."""
    found = None
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name in ("_construct_nodes", "_convert_subgraph"):
            node = frame.f_locals.get("node")
            if node is not None and hasattr(node, "op_type"):
                found = node
        tb = tb.tb_next
    return found


def import_failure(model_label: str, model: Any, exc: BaseException, upgrade: OpsetUpgrade | None) -> ModelLoadError:
    """A one-line ModelLoadError for an exception from ``from_onnx``: op type, node, opset, the fix."""
    opset = default_opset(model)
    node = failing_node(exc)
    where = (f"{node.op_type} node {node_label(node)!r}" if node is not None else "a node it could not identify")
    opset_text = (f"model opset {upgrade.from_opset}, upgraded to {upgrade.to_opset}" if upgrade is not None
                  else f"model opset {opset}")
    effective = upgrade.to_opset if upgrade is not None else (opset or FIX_OPSET)
    return ModelLoadError(f"{model_label}: TVM's ONNX importer failed on {where} ({opset_text}): "
                          f"{type(exc).__name__}: {_first_line(exc)}; {_fix_hint(effective)}")


@contextlib.contextmanager
def converter_prints_to_log() -> Iterator[None]:
    """TVM's importer prints "Error converting operator ..." with every input's IR to stdout before re-raising;
    route that to the debug log (the raised error names the node). ``sys.stdout`` is process-wide: another
    thread's prints during the import go to the debug log too."""
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            yield
    finally:
        if buffer.getvalue().strip():
            log.debug("TVM ONNX importer printed: %s", buffer.getvalue().strip())
