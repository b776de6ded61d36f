"""Import a model into Relax: ONNX files and torch.nn.Modules, with shape binding and frontend fixes.

``import_model`` is the one entry point the rest of hetpart calls. What it does:

ONNX
  1. load and check the file (missing / truncated / not ONNX -> ModelLoadError);
  2. bind the input shapes the user gave (``{"x": (1, 3, 224, 224)}``); an input with symbolic or unknown
     dims and no shape given -> MissingInputShapeError listing every such input and the flag to pass;
  3. list *every* op type no converter exists for, with counts (UnsupportedOpError) — not only the first;
  4. upgrade an older-opset model whose nodes TVM would convert with a converter made for another op form (e.g.
     Slice with starts/ends attributes, opset < 10) to the lowest opset where none remain (``tvm_passes.onnx_opsets``);
  5. fold shape-computation chains and Conv+BatchNorm for those fixed shapes with onnxslim, then unroll Loop and
     Scan nodes whose trip count those shapes fix (``tvm_passes.onnx_loops``);
  6. ``from_onnx`` with hetpart's LSTM/GRU/RNN converters (``tvm_passes.rnn``) and its converters for other ops
     TVM lacks (``tvm_passes.onnx_converters``) installed; a failure names the node.
PyTorch
  ``torch.export`` + ``from_exported_program`` with the negative-index ``select.int`` fix (TVM 0.27 turns
  ``y[-1]`` into an out-of-bounds ``take(mode="fast")``).
Both
  weights become Relax constants; layout-only ops on constants (reshape/permute_dims/expand_dims/squeeze of a
  weight) are folded with numpy and the remaining constant-only ops with FoldConstant, one call at a time
  (``tvm_passes.constant_folding``: TVM's pass alone legalizes every op of the graph), so the graph contains
  only the work the deployed executable does; matmuls against constant weights whose column count is not a
  whole number of SIMD vectors get zero-padded weights and a slice (``tvm_passes.pad_columns``: 2.8-22x faster
  for a GRU's 1950 gate columns, depending on the CPU); float16 reductions, normalisations and transcendental
  functions compute in float32, as onnxruntime's do (``tvm_passes.half_accumulate``).
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from hetpart.errors import MissingInputShapeError, ModelLoadError, UnsupportedOpError
from hetpart.graph import TensorSpec
from tvm_passes import onnx_loops, onnx_opsets
from tvm_passes.bindings import first_data_dependent_binding
from tvm_passes.constant_folding import fold_constants
from tvm_passes.conv1d_as_conv2d import conv1d_as_conv2d
from tvm_passes.conv_transpose_as_conv import conv_transpose_as_conv
from tvm_passes.half_accumulate import accumulate_half_in_float32
from tvm_passes.pad_activation_columns import pad_activation_columns
from tvm_passes.pad_columns import COLUMN_MULTIPLE, pad_matmul_columns
from tvm_passes.pad_conv_channels import pad_conv_channels

log = logging.getLogger(__name__)

PARAM_INPUTS_METADATA_KEY = "hetpart.param_inputs"


@dataclass(frozen=True)
class ImportedModel:
    """A model in Relax plus what later stages need to know about where it came from."""

    mod: Any                                   # tvm.IRModule; `main` takes the model inputs
    name: str
    inputs: tuple[TensorSpec, ...]             # model inputs (bound shapes)
    output_names: tuple[str, ...]
    source_hash: str                           # identifies model file + bound shapes
    source_kind: str                           # "onnx" or "torch"
    param_inputs: tuple[str, ...] = ()         # inputs that are really weights (see PARAM_INPUTS_METADATA_KEY)
    onnx_path: Path | None = None              # the slimmed ONNX file used (for onnxruntime reference runs)
    notes: tuple[str, ...] = field(default_factory=tuple)


def parse_input_shapes(specs: Sequence[str] | Mapping[str, Sequence[int]] | None) -> dict[str, tuple[int, ...]]:
    """``["x=1,3,224,224", "mask=1,128"]`` (CLI form) or a mapping -> ``{name: dims}``."""
    if not specs:
        return {}
    if isinstance(specs, Mapping):
        return {str(k): tuple(int(d) for d in v) for k, v in specs.items()}
    out: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        name, sep, dims = str(spec).rpartition("=")
        if not sep or not name:
            raise ModelLoadError(f"input shape {spec!r} must look like NAME=D1,D2,... (e.g. input=1,3,224,224)")
        try:
            out[name] = tuple(int(d) for d in re.split(r"[,x]", dims) if d.strip())
        except ValueError:
            raise ModelLoadError(f"input shape {spec!r}: dims must be integers, e.g. input=1,3,224,224") from None
        if any(d <= 0 for d in out[name]) or not out[name]:
            raise ModelLoadError(f"input shape {spec!r}: every dim must be a positive integer")
    return out


# --------------------------------------------------------------------------------------------------- ONNX
def _load_onnx(path: Path):
    import onnx

    if not path.exists():
        raise ModelLoadError(f"model file {path} does not exist; pass an ONNX file or a zoo name (see `hetpart zoo`)")
    try:
        model = onnx.load(str(path))
    except Exception as exc:  # protobuf DecodeError, truncated file, ...
        raise ModelLoadError(f"{path} is not a readable ONNX model ({type(exc).__name__}: {exc}); "
                             "check the file is complete and really ONNX") from exc
    if not model.HasField("graph") or len(model.graph.node) == 0:
        raise ModelLoadError(f"{path} holds no ONNX graph with operators: it is truncated or not an ONNX file")
    try:
        onnx.checker.check_model(model)
    except Exception as exc:  # many exported models bend the spec (e.g. outputs without shapes): go on
        log.warning("%s does not pass onnx.checker (%s); importing it anyway", path.name, str(exc).splitlines()[0])
    return model


def _onnx_inputs(model) -> list[tuple[str, list, str]]:
    """(name, dims, dtype) of real inputs; dims hold ints, or str for symbolic/unknown dims."""
    import onnx

    inits = {i.name for i in model.graph.initializer}
    out = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or "?")
                for d in tt.shape.dim]
        out.append((vi.name, dims, onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name))
    return out


def _bind_shapes(path: Path, inputs, given: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    names = [n for n, _, _ in inputs]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ModelLoadError(f"--input-shape names {unknown}, but the model's inputs are {names}")
    bound, missing = {}, []
    for name, dims, _ in inputs:
        if name in given:
            if len(given[name]) != len(dims):
                raise ModelLoadError(f"input {name!r} has rank {len(dims)} ({dims}) but the given shape "
                                     f"{list(given[name])} has rank {len(given[name])}")
            for want, have in zip(dims, given[name]):
                if isinstance(want, int) and want != have:
                    raise ModelLoadError(f"input {name!r} has fixed dims {dims}; the given shape "
                                         f"{list(given[name])} contradicts them")
            bound[name] = given[name]
        elif all(isinstance(d, int) for d in dims):
            bound[name] = tuple(dims)
        else:
            missing.append((name, dims))
    if missing:
        lines = "; ".join(f"{n} has dims {d}" for n, d in missing)
        example = " ".join(f"--input-shape {n}={','.join(str(x) if isinstance(x, int) else '1' for x in d)}"
                           for n, d in missing)
        raise MissingInputShapeError(
            f"{path.name}: inputs with symbolic or unknown dims need a shape: {lines}. Pass e.g. {example} "
            "(Python: input_shapes={name: dims})")
    return bound


def _param_inputs(model) -> tuple[str, ...]:
    """Inputs that hold weights, listed in metadata ``hetpart.param_inputs`` (JSON list or comma-separated)."""
    import json

    for prop in model.metadata_props:
        if prop.key == PARAM_INPUTS_METADATA_KEY:
            try:
                names = json.loads(prop.value)
            except json.JSONDecodeError:
                names = prop.value.split(",")
            return tuple(str(n) for n in names if n)
    return ()


def _onnx_convert_map() -> dict:
    from tvm.relax.frontend.onnx import onnx_frontend

    return onnx_frontend._get_convert_map()


def _copy_model(model):
    copy = type(model)()
    copy.CopyFrom(model)
    return copy


def _unsupported_ops(model) -> dict[str, int]:
    """Op types without a converter, with their counts, in the graph and in the bodies of the Loop and Scan nodes
    hetpart unrolls before import (tvm_passes.onnx_loops)."""
    from tvm_passes.onnx_converters import CONTRIB_OP_TYPES
    from tvm_passes.onnx_loops import LOOP_OP_TYPES

    counts: collections.Counter = collections.Counter()

    def count(graph) -> None:
        for n in graph.node:
            counts[n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"] += 1
            if n.op_type in LOOP_OP_TYPES:
                for attr in n.attribute:
                    if attr.name == "body":
                        count(attr.g)

    count(model.graph)
    converters = set(_onnx_convert_map())
    # TVM's importer dispatches on the op type alone; the com.microsoft ops it has converters for (FastGelu,
    # SkipLayerNormalization, Attention, ... of onnxruntime's transformer optimizer) are written for that domain
    known = converters | {f"com.microsoft.{op}" for op in converters} | set(LOOP_OP_TYPES) | set(CONTRIB_OP_TYPES)
    return {op: c for op, c in sorted(counts.items()) if op not in known}


def _check_onnx_ops_supported(model, path: Path, slim: Callable[[Any], Any]) -> None:
    """Raise UnsupportedOpError listing every op type without a converter that onnxslim cannot fold away (an
    exporter's ``If`` on a shape test folds for fixed input shapes)."""
    missing = _unsupported_ops(model)
    if missing:
        try:
            folded = slim(model)
        except UnsupportedOpError:       # a Loop that cannot be unrolled: its reason is the error to report
            raise
        except Exception:  # noqa: BLE001 (the unsupported ops are the error to report)
            folded = None
        if folded is not None and not _unsupported_ops(folded):
            log.info("%s: onnxslim folds away the op types no converter exists for (%s)", path.name,
                     ", ".join(missing))
            return
        listing = ", ".join(f"{op} x{c}" for op, c in missing.items())
        fix = "Replace them in the model or register a converter"
        if any("QLinear" in op or op.endswith(("QuantizeLinear", "Integer")) for op in missing):
            fix = ("Quantize the float model in QDQ format instead (onnxruntime.quantization.quantize_static(..., "
                   "quant_format=QuantFormat.QDQ)), which hetpart imports")
        if any(op.startswith("com.microsoft.nchwc.") for op in missing):
            fix = ("These are onnxruntime's NCHWc layout ops, which it saves at ORT_ENABLE_ALL for the machine it ran "
                   "on: give hetpart the original model, or one saved at ORT_ENABLE_EXTENDED")
        raise UnsupportedOpError(
            f"{path.name}: TVM 0.27's ONNX importer (with hetpart's own converters) cannot import these op types: "
            f"{listing}. {fix}.")


def _install_converters() -> None:
    """hetpart's converters for ONNX ops TVM's importer lacks: the recurrent ones (unrolled) and the others."""
    from tvm_passes.onnx_converters import install_onnx_converters
    from tvm_passes.rnn import install_onnx_rnn_converters

    install_onnx_rnn_converters()
    install_onnx_converters()


def _import_onnx(path: Path, input_shapes: dict[str, tuple[int, ...]], name: str | None,
                 work_dir: Path | None, rnn_options: Any = None) -> ImportedModel:
    import onnx
    import onnxslim
    from tvm.relax.frontend.onnx import from_onnx

    from tvm_passes.rnn import rnn_import_options

    model = _load_onnx(path)
    inputs = _onnx_inputs(model)
    bound = _bind_shapes(path, inputs, input_shapes)
    _install_converters()
    shapes = [f"{n}:{','.join(map(str, d))}" for n, d in bound.items() if d]   # a scalar has no dims to bind

    def fold(onnx_model):
        """Shape computations folded for the bound shapes; then Loop/Scan nodes whose trip count they fix unrolled,
        and what each iteration's constants make foldable folded (an If on the iteration number)."""
        folded = onnxslim.slim(onnx_model, input_shapes=shapes)
        unrolled = onnx_loops.unroll_loops(folded, path.name)
        return folded if unrolled is None else onnxslim.slim(unrolled)

    _check_onnx_ops_supported(model, path, lambda m: fold(_copy_model(m)))
    model, upgrade = onnx_opsets.upgrade_for_tvm(model, _onnx_convert_map(), path.name)
    param_inputs = _param_inputs(model)
    try:
        slim = fold(model)
    except UnsupportedOpError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"{path.name}: folding shape computations with onnxslim failed for shapes "
                             f"{bound}: {exc}") from exc
    dtypes = {n: dt for n, _, dt in inputs}
    for_tvm = onnx_opsets.omit_empty_resize_scales(slim) or slim
    try:
        with rnn_import_options(rnn_options), onnx_opsets.converter_prints_to_log():
            mod = from_onnx(for_tvm, shape_dict={n: list(d) for n, d in bound.items()}, dtype_dict=dtypes,
                            keep_params_in_input=False, sanitize_input_names=False)
    except UnsupportedOpError:          # hetpart's own converters: already names the node, the reason and the fix
        raise
    except Exception as exc:
        raise onnx_opsets.import_failure(path.name, slim, exc, upgrade) from exc
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    upgraded_to = f"|opset{upgrade.to_opset}" if upgrade is not None else ""   # the slim file holds the upgrade
    digest = hashlib.sha256(f"{digest}|{sorted(bound.items())}{upgraded_to}".encode()).hexdigest()[:16]
    slim_digest = digest
    if rnn_options is not None and not rnn_options.is_default:   # another unrolling is another graph
        digest = hashlib.sha256(f"{digest}|{rnn_options}".encode()).hexdigest()[:16]
    slim_path = None
    if work_dir is not None:
        Path(work_dir).mkdir(parents=True, exist_ok=True)
        slim_path = Path(work_dir) / f"{path.stem}.{slim_digest}.slim.onnx"
        if not slim_path.exists():
            tmp = slim_path.with_suffix(".tmp")
            onnx.save(slim, str(tmp))
            tmp.replace(slim_path)
    return ImportedModel(
        mod=_normalize(mod, path.name, slim), name=name or path.stem,
        inputs=tuple(TensorSpec(n, bound[n], dtypes[n]) for n, _, _ in inputs),
        output_names=tuple(o.name for o in slim.graph.output), source_hash=digest, source_kind="onnx",
        param_inputs=param_inputs, onnx_path=slim_path, notes=(upgrade.note(),) if upgrade is not None else ())


# --------------------------------------------------------------------------------------------------- torch
def _select_int_fixed(node, importer):
    """``aten.select.int`` with a negative index made positive, and a bounds-safe take."""
    from tvm import relax

    x = importer.env[node.args[0]]
    dim, index = int(node.args[1]), int(node.args[2])
    shape = [int(s) for s in x.ty.shape.values]
    dim = dim % len(shape)
    if index < 0:
        index += shape[dim]
    return importer.block_builder.emit(relax.op.take(x, relax.const(index, "int64"), dim, mode="clip"))


def _import_torch(module, example_inputs: Sequence[Any], name: str | None) -> ImportedModel:
    import torch
    from tvm.relax.frontend.torch import from_exported_program

    if not example_inputs:
        raise ModelLoadError("a torch.nn.Module needs example inputs: import_model(module, example_inputs=(x,))")
    example_inputs = tuple(example_inputs)
    module = module.eval()
    try:
        with torch.no_grad():
            exported = torch.export.export(module, example_inputs)
    except Exception as exc:
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ModelLoadError(f"torch.export could not trace {type(module).__name__}: {first_line}. Export it to "
                             "ONNX with torch's TorchScript exporter (torch.onnx.export(module, example_inputs, "
                             "'model.onnx', dynamo=False), which records e.g. pack_padded_sequence) and compile "
                             "that file") from exc
    try:
        mod = from_exported_program(exported, keep_params_as_input=False, unwrap_unit_return_tuple=True,
                                    custom_convert_map={"select.int": _select_int_fixed})
    except AssertionError as exc:
        match = re.search(r"Unsupported function types \[(.*)\]", str(exc))
        if not match:
            raise
        missing = {m.strip(" '\"") for m in match.group(1).split(",")}
        decomposed = exported.run_decompositions()
        counts = collections.Counter(n.target.__name__ for n in decomposed.graph.nodes
                                     if n.op == "call_function" and getattr(n.target, "__name__", "") in missing)
        listing = ", ".join(f"{op} x{counts.get(op, 1)}" for op in sorted(missing))
        raise UnsupportedOpError(f"{type(module).__name__}: TVM 0.27's torch importer cannot import these ops: "
                                 f"{listing}") from exc
    except Exception as exc:      # e.g. a half-precision module: TVM's importer sums its convs in float32
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise ModelLoadError(f"TVM's torch importer failed on {type(module).__name__} ({type(exc).__name__}: "
                             f"{first_line}). Export it to ONNX (torch.onnx.export(module, example_inputs, "
                             "'model.onnx', dynamo=False)) and compile that file") from exc
    names = [f"input{i}" if not hasattr(p, "name") else p.name for i, p in enumerate(mod["main"].params)]
    specs = tuple(TensorSpec(n, tuple(int(d) for d in t.shape), str(t.dtype).removeprefix("torch."))
                  for n, t in zip(names, example_inputs))
    h = hashlib.sha256(str(exported.graph).encode())
    for tensor in list(module.state_dict().values()):
        h.update(np.ascontiguousarray(tensor.detach().cpu().numpy()).tobytes()[:4096])
    h.update(repr([s.shape for s in specs]).encode())
    return ImportedModel(mod=_normalize(mod, type(module).__name__), name=name or type(module).__name__, inputs=specs,
                         output_names=(), source_hash=h.hexdigest()[:16], source_kind="torch")


# --------------------------------------------------------------------------------------------------- common
# ONNX ops whose output size depends on the input values (hetpart compiles static shapes only)
DATA_DEPENDENT_ONNX_OPS = ("NonZero", "NonMaxSuppression", "Unique", "Compress")


def _cut_hint(onnx_model: Any) -> str:
    """How to end an ONNX model before its first data-dependent node: ``--outputs`` its inputs
    (:mod:`tvm_passes.onnx_cut`)."""
    if onnx_model is None:
        return ""
    node = next((n for n in onnx_model.graph.node if n.op_type in DATA_DEPENDENT_ONNX_OPS), None)
    if node is None:
        return ""
    cut_at = [name for name in node.input if name]
    return (f" ({node.op_type} node {node.name or '(unnamed)'!r} reads {cut_at}: --outputs {','.join(cut_at)}, "
            f"or outputs={cut_at} in the Python API, keeps the model up to there)")


def _normalize(mod, label: str, onnx_model: Any = None):
    from tvm import relax

    # constant-only work (weight transposes, take/shape_of of a constant, ...): the deployment pipeline folds it
    # too (FoldConstant before FuseOps), so the OpGraph must not count it as kernels
    mod = relax.transform.Normalize()(fold_constants(mod))
    dynamic = first_data_dependent_binding(mod["main"])
    if dynamic is not None:
        value = dynamic.value
        what = value.op.name.removeprefix("relax.") if isinstance(value, relax.Call) and hasattr(value.op, "name") \
            else type(value).__name__
        raise UnsupportedOpError(
            f"{label}: {what} (binding {dynamic.var.name!r}) makes a tensor of type {dynamic.var.ty} whose size "
            "depends on the input values; hetpart plans and compiles static shapes only: end the model before "
            f"this op{_cut_hint(onnx_model)} and run the rest after hetpart's output")
    return mod


def import_model(model: str | Path | Any, *, input_shapes: Sequence[str] | Mapping[str, Sequence[int]] | None = None,
                 example_inputs: Sequence[Any] | None = None, name: str | None = None,
                 work_dir: str | Path | None = None, pad_columns: bool = True,
                 rnn_options: Any = None) -> ImportedModel:
    """Import an ONNX file (path) or a ``torch.nn.Module`` (with ``example_inputs``) into Relax.

    ``rnn_options`` (a ``tvm_passes.rnn.RnnImportOptions``; None: the defaults) says how ONNX LSTM/GRU/RNN nodes
    are unrolled, e.g. ``RnnImportOptions(input_projection="per_slice", slice_steps=4)``.

    ``pad_columns=False`` keeps matmuls against constant weights as written instead of padding their columns to
    whole SIMD vectors (``tvm_passes.pad_columns``), and convolutions' output channels likewise
    (``tvm_passes.pad_conv_channels``; for comparisons -- the padded graph is what hetpart deploys).
    """
    shapes = parse_input_shapes(input_shapes)
    if isinstance(model, (str, Path)):
        path = Path(model)
        if path.suffix.lower() not in (".onnx", "") and path.exists():
            log.warning("%s does not end in .onnx; trying to read it as ONNX anyway", path)
        imported = _import_onnx(path, shapes, name, Path(work_dir) if work_dir else None, rnn_options)
    else:
        try:
            import torch
        except ImportError:  # pragma: no cover - torch is an optional extra
            raise ModelLoadError("importing a torch module needs torch: pip install 'hetpart[torch]'") from None
        if not isinstance(model, torch.nn.Module):
            raise ModelLoadError(f"cannot import a {type(model).__name__}: pass an ONNX path, a zoo name or a "
                                 "torch.nn.Module with example_inputs")
        imported = _import_torch(model, example_inputs or (), name)
    imported = _rewritten(imported, conv_transpose_as_conv, lambda n: (
        f"rewrote {n} 1-D transposed convolution(s) as zero-inserted convolutions, which the CPU conv rules schedule "
        "(tvm_passes.conv_transpose_as_conv)"))
    imported = _rewritten(imported, conv1d_as_conv2d, lambda n: (
        f"rewrote {n} conv1d(s) as (1, k) conv2d(s), which the CPU conv rules schedule (tvm_passes.conv1d_as_conv2d)"))
    if pad_columns:
        imported = _padded(imported)
    return _rewritten(imported, accumulate_half_in_float32, lambda n: (
        f"computing {n} float16 op(s) in float32, as onnxruntime does (reductions, normalisations, transcendental "
        "functions; tvm_passes.half_accumulate)"))


def _padded(imported: ImportedModel) -> ImportedModel:
    """``imported`` after the rewrites padding matmul columns and conv channels to whole SIMD vectors."""
    imported = _rewritten(imported, pad_conv_channels, lambda n: (
        f"padded the output channels of {n} convolution(s) to a multiple of {COLUMN_MULTIPLE} (whole SIMD "
        "vectors; tvm_passes.pad_conv_channels)"))
    # after folding: weight transposes are constants by now
    imported = _rewritten(imported, pad_matmul_columns, lambda n: (
        f"padded the columns of {n} constant-weight matmul(s) to a multiple of {COLUMN_MULTIPLE} (whole SIMD "
        "vectors; tvm_passes.pad_columns)"))
    return _rewritten(imported, pad_activation_columns, lambda n: (
        f"padded the columns of {n} matmul(s) between activations to a multiple of {COLUMN_MULTIPLE} (whole SIMD "
        "vectors; tvm_passes.pad_activation_columns)"))


def _rewritten(imported: ImportedModel, rewrite: Callable[[Any], tuple[Any, int]],
               note: Callable[[int], str]) -> ImportedModel:
    """``imported`` after an import rewrite (module -> (module, ops rewritten)), the rewrite noted when it did any."""
    mod, count = rewrite(imported.mod)
    if not count:
        return imported
    return dataclasses.replace(imported, mod=mod, notes=imported.notes + (note(count),))
