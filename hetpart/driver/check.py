"""Check a compiled model against onnxruntime: sample valid inputs, run the reference, compare like numpy.allclose.

Used by ``hetpart run --check``. The tolerance defaults are the ones the test suite holds every zoo model to
(``|ours - reference| <= atol + rtol * |reference|`` with ``rtol = atol = 1e-4``): float32 results of a
different summation order differ by ~1e-6 relative, and random-weight models reach outputs of 1e2-1e4.

float16 outputs are held to a norm-wise bound instead, ``max |ours - reference| <= half_tolerance * max
|reference|`` (default 3e-2): a float16 model keeps its activations in float16 between kernels, so its errors grow
with depth and scale with the output's magnitude, not each element's, while onnxruntime's CPU kernels compute
float16 ops in float32 and keep chains of them there. torch's own half-precision run of six zoo models lies 3e-4
to 1.0e-2 (MobileNetV2, a YOLO-style detector) of the output's magnitude from its float32 run; hetpart's float16
runs 5e-4 to 1.1e-2 (``tvm_passes.half_accumulate``; benchmarks/results/half_precision). A model converted to
float16 inside with float32 inputs and outputs kept is held to the same bound (:func:`computes_in_half`).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from hetpart.errors import InputMismatchError, ModelLoadError
from hetpart.graph import OpGraph

log = logging.getLogger(__name__)

DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-4
DEFAULT_HALF_TOLERANCE = 3e-2     # float16 outputs: max |diff| <= this x max |reference|
HALF_DTYPES = (np.float16,)
HALF_DTYPE_NAMES = frozenset(np.dtype(d).name for d in HALF_DTYPES)
DEFAULT_INTEGER_HIGH = 2          # integer inputs that index nothing (masks, flags): values 0 or 1
# the newest ONNX IR version onnxruntime 1.31 loads; newer files are read and handed over at this version
MAX_ORT_IR_VERSION = 10
# ops through which an integer input's values reach a table lookup unchanged in meaning (offsets, casts, layout):
# an index bound found past them holds for the input. Past anything else (a sort, a top-k whose indices are then
# gathered, a reduction) the values that index the table are no longer the input's.
INDEX_PRESERVING_OPS = frozenset(f"relax.{name}" for name in (
    "astype", "add", "subtract", "multiply", "negative", "abs", "where", "maximum", "minimum", "clip", "floor_mod",
    "mod", "reshape", "expand_dims", "squeeze", "permute_dims", "broadcast_to", "strided_slice", "concat",
    "flatten", "tile", "repeat"))


# ops through which an integer input's values reach an unrolled recurrent layer's step masks as some of the same
# values: besides the index-preserving ops, the sort and gather of torch's pack_padded_sequence (it orders the
# lengths with a top-k and gathers them by its indices)
LENGTH_PRESERVING_OPS = INDEX_PRESERVING_OPS | {"relax.topk", "relax.sort", "relax.take", "relax.gather_elements"}
# comparisons with the step's time that tvm_passes.rnn makes to mask the steps past a sequence's length
STEP_MASK_OPS = frozenset({"relax.less", "relax.greater", "relax.less_equal", "relax.greater_equal"})


def _reached(graph: OpGraph, spec, through: frozenset, stop_at: str | None = None):
    """The ops an input's values reach through ``through`` ops with integer results (the first op of another kind
    on each path is reached but not passed; nor is ``stop_at``)."""
    successors = graph.successors()
    frontier, seen = list(spec.consumers), set()
    while frontier:
        op_id = frontier.pop()
        if op_id in seen:
            continue
        seen.add(op_id)
        node = graph.nodes[op_id]
        yield node
        if node.op != stop_at and node.op in through and node.output_dtypes \
                and np.issubdtype(np.dtype(node.output_dtypes[0]), np.integer):
            frontier.extend(successors[op_id])


def _integer_inputs(graph: OpGraph):
    return [spec for spec in graph.inputs if np.issubdtype(np.dtype(spec.dtype), np.integer)]


def index_input_bounds(graph: OpGraph) -> dict[str, int]:
    """For each integer graph input that (through :data:`INDEX_PRESERVING_OPS` with integer results, e.g. the
    negative-index wrap of ONNX Gather) selects rows of a table with ``relax.take``: the table's length on the taken
    axis (an embedding's vocabulary; the smallest such length wins). ONNX Gather takes indices in
    ``[-length, length)``; TVM's ``take`` reads out of bounds (no check) beyond that, so the runtimes refuse such
    inputs (:func:`check_inputs`). Sequence lengths sorted by a top-k whose indices then reorder the batch do not
    count as indices."""
    bounds: dict[str, int] = {}
    for spec in _integer_inputs(graph):
        highs = [int(node.input_shapes[0][int(node.attrs.get("axis", 0)) % len(node.input_shapes[0])])
                 for node in _reached(graph, spec, INDEX_PRESERVING_OPS, stop_at="relax.take")
                 if node.op == "relax.take" and len(node.input_shapes) >= 2 and node.input_shapes[0]]
        if highs:
            bounds[spec.name] = min(highs)
    return bounds


def sequence_length_bounds(graph: OpGraph) -> dict[str, int]:
    """For each integer graph input whose values (through :data:`LENGTH_PRESERVING_OPS`) mask the steps of an
    unrolled recurrent layer (an ONNX LSTM/GRU/RNN's ``sequence_lens``: ``tvm_passes.rnn`` compares each step's
    time with them, in ops tagged with the step): the layer's number of steps, the longest valid length (the
    smallest such count over the layers it masks)."""
    bounds: dict[str, int] = {}
    for spec in _integer_inputs(graph):
        steps: dict[int, int] = {}
        for node in _reached(graph, spec, LENGTH_PRESERVING_OPS):
            step = node.tags.get("rnn_step", -1) if node.op in STEP_MASK_OPS else -1
            if step >= 0:
                layer = int(node.tags.get("rnn_layer", 0))
                steps[layer] = max(steps.get(layer, 0), int(step) + 1)
        if steps:
            bounds[spec.name] = min(steps.values())
    return bounds


def integer_input_ranges(graph: OpGraph) -> dict[str, tuple[int, int]]:
    """For each integer graph input, the half-open range ``[0, high)`` of values valid for this model: below the
    table length of :func:`index_input_bounds` for an input that indexes a table, up to the step count of
    :func:`sequence_length_bounds` for the lengths of a recurrent layer's sequences, else ``[0, 2)``."""
    bounds = index_input_bounds(graph)
    lengths = sequence_length_bounds(graph)
    return {spec.name: (0, bounds[spec.name] if spec.name in bounds else lengths[spec.name] + 1
                        if spec.name in lengths else DEFAULT_INTEGER_HIGH) for spec in _integer_inputs(graph)}


def sample_inputs(inputs: Sequence[Mapping], graph: OpGraph | None, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random inputs for a manifest's input specs: floats standard normal, integers uniform in their valid
    range (:func:`integer_input_ranges`: token ids below the table's length, sequence lengths up to the steps;
    ``[0, 2)`` when the graph is not known), booleans random."""
    rng = np.random.default_rng(seed)
    ranges = integer_input_ranges(graph) if graph is not None else {}
    feeds = {}
    for spec in inputs:
        name, shape, dtype = str(spec["name"]), tuple(int(d) for d in spec["shape"]), np.dtype(str(spec["dtype"]))
        if np.issubdtype(dtype, np.floating):
            feeds[name] = np.asarray(rng.standard_normal(shape)).astype(dtype)     # () gives a Python float
        elif np.issubdtype(dtype, np.integer):
            low, high = ranges.get(name, (0, DEFAULT_INTEGER_HIGH))
            feeds[name] = np.asarray(rng.integers(low, high, shape)).astype(dtype)
        elif dtype == np.bool_:
            feeds[name] = rng.integers(0, 2, shape).astype(bool)
        else:
            raise InputMismatchError(f"cannot sample input {name!r} of dtype {dtype}; pass it with --input "
                                     f"{name}=FILE.npy")
    return feeds


def load_input_file(item: str) -> tuple[str, np.ndarray]:
    """``NAME=FILE.npy`` -> (name, array), with typed one-line errors."""
    name, sep, path = item.partition("=")
    if not sep or not name or not path:
        raise InputMismatchError(f"--input {item!r} must look like NAME=FILE.npy")
    try:
        return name, np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise InputMismatchError(f"--input {name}: no file {path}; pass an existing .npy file "
                                 "(numpy.save writes one)") from None
    except (OSError, ValueError) as exc:
        raise InputMismatchError(f"--input {name}: {path} is not a readable .npy array ({exc}); write it with "
                                 "numpy.save") from None


def onnxruntime_reference(onnx_path: str | Path, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The ONNX model's outputs on ``feeds`` from onnxruntime's CPU provider.

    A model saved with an IR version newer than onnxruntime reads is handed to it at :data:`MAX_ORT_IR_VERSION`
    (in memory; the file is not touched). Failures are :class:`ModelLoadError` naming the file and the cause."""
    import onnx
    import onnxruntime as ort

    path = Path(onnx_path)
    try:
        model = onnx.load(str(path))
    except Exception as exc:  # onnx raises DecodeError, OSError, ...
        raise ModelLoadError(f"--check cannot read the ONNX model {path} ({type(exc).__name__}: {exc})") from None
    if model.ir_version > MAX_ORT_IR_VERSION:
        log.info("handing %s to onnxruntime at IR version %d (the file says %d)", path.name, MAX_ORT_IR_VERSION,
                 model.ir_version)
        model.ir_version = MAX_ORT_IR_VERSION
    try:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        return session.run(None, {n: feeds[n] for n in names if n in feeds})
    except Exception as exc:  # onnxruntime raises its own error types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"onnxruntime cannot run {path} to check against ({type(exc).__name__}: {first}); "
                             "compare the outputs another way (hetpart run --save DIR writes them)") from None


@dataclass(frozen=True)
class Comparison:
    """How far ``ours`` is from the reference: the worst absolute and relative errors, and whether every
    element satisfies ``|ours - reference| <= atol + rtol * |reference|`` (float16 outputs: whether ``max |ours -
    reference| <= half_tolerance * max |reference|``; ``max_half_error`` is the worst such ratio, None without
    float16 outputs)."""

    max_abs_error: float
    max_rel_error: float
    rtol: float
    atol: float
    ok: bool
    half_tolerance: float = DEFAULT_HALF_TOLERANCE
    max_half_error: float | None = None
    full_outputs: bool = True          # whether any output is held to the elementwise bound

    def describe(self) -> str:
        bounds = []
        if self.full_outputs:
            bounds.append(f"|diff| <= {self.atol:g} + {self.rtol:g} x |reference|")
        if self.max_half_error is not None:
            bounds.append(f"half-precision outputs max |diff| <= {self.half_tolerance:g} x max |reference|, found "
                          f"{self.max_half_error:.3g} x")
        return (f"max |diff| {self.max_abs_error:.3g}, max relative {self.max_rel_error:.3g} "
                f"({'OK' if self.ok else 'FAILED'}: {'; '.join(bounds)})")


def computes_in_half(graph: OpGraph | None) -> bool:
    """Whether any op of the model makes a float16 tensor (a float16 model, also one converted with float32 inputs
    and outputs kept): its float outputs then carry float16 errors."""
    return graph is not None and any(str(dtype) in HALF_DTYPE_NAMES for node in graph.nodes
                                     for dtype in node.output_dtypes)


def compare_outputs(ours: Sequence[np.ndarray], reference: Sequence[np.ndarray], *, rtol: float = DEFAULT_RTOL,
                    atol: float = DEFAULT_ATOL, half_tolerance: float = DEFAULT_HALF_TOLERANCE,
                    half_precision: bool = False) -> Comparison:
    """Compare output lists elementwise like ``numpy.allclose(ours, reference, rtol, atol)``; an output whose
    reference is float16 -- every float output when ``half_precision`` (the model computes in float16,
    :func:`computes_in_half`) -- norm-wise, ``max |ours - reference| <= half_tolerance * max |reference|``."""
    if len(ours) != len(reference):
        raise InputMismatchError(f"the compiled model returned {len(ours)} outputs and the reference "
                                 f"{len(reference)}; they are not the same model")
    max_abs, max_rel, ok, max_half, full = 0.0, 0.0, True, None, False
    for a, b in zip(ours, reference):
        dtype = np.asarray(b).dtype
        half = dtype in HALF_DTYPES or (half_precision and np.issubdtype(dtype, np.floating))
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        if a.shape != b.shape:
            raise InputMismatchError(f"output shapes differ: {list(a.shape)} against the reference's {list(b.shape)}")
        full = full or not half
        if a.size == 0:
            continue
        diff = np.abs(a - b)
        max_abs = max(max_abs, float(np.max(diff)))
        max_rel = max(max_rel, float(np.max(diff / np.maximum(np.abs(b), np.finfo(np.float32).tiny))))
        if half:
            scale = float(np.max(np.abs(b)))
            ratio = float(np.max(diff)) / scale if scale > 0 else float(np.max(diff) > 0) * np.inf
            max_half = ratio if max_half is None else max(max_half, ratio)
            ok = ok and ratio <= half_tolerance
        else:
            ok = ok and bool(np.all(diff <= atol + rtol * np.abs(b)))
    return Comparison(max_abs, max_rel, rtol, atol, ok, half_tolerance, max_half, full)
