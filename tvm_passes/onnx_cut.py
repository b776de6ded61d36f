"""Keep an ONNX model up to chosen tensors (``hetpart compile MODEL --outputs NAME,...``).

Detectors and trackers often end in post-processing whose output size depends on the data (NonMaxSuppression,
NonZero, ...), which hetpart cannot compile (it plans static shapes); the network before it is what is worth
partitioning. :func:`cut_onnx_model` writes the part of the model that computes the named tensors (with
``onnx.utils.Extractor``) as a new file under hetpart's cache, and the rest of hetpart takes that file as the model.
The original file is never changed.
"""
from __future__ import annotations

import difflib
import hashlib
import logging
from pathlib import Path
from typing import Sequence

from hetpart.errors import ModelLoadError

log = logging.getLogger(__name__)

__all__ = ["cut_onnx_model", "parse_output_names"]


def parse_output_names(outputs: str | Sequence[str] | None) -> tuple[str, ...]:
    """``"a,b"`` or ``["a", "b"]`` (the CLI's repeatable ``--outputs``) as a tuple of names; () for None."""
    if outputs is None:
        return ()
    items = [outputs] if isinstance(outputs, str) else list(outputs)
    names = tuple(name.strip() for item in items for name in str(item).split(",") if name.strip())
    if not names:
        raise ModelLoadError(f"outputs must name at least one tensor; found {outputs!r}")
    return names


def _ancestor_inputs(model, outputs: Sequence[str]) -> list[str]:
    """The graph inputs (not initializers) the named tensors depend on, in the graph's input order."""
    producer = {out: node for node in model.graph.node for out in node.output}
    initializers = {init.name for init in model.graph.initializer}
    seen, stack = set(), list(outputs)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        node = producer.get(name)
        if node is not None:
            stack.extend(i for i in node.input if i)
    return [i.name for i in model.graph.input if i.name in seen and i.name not in initializers]


def cut_onnx_model(path: str | Path, outputs: Sequence[str], work_dir: Path) -> Path:
    """Write (once) and return a copy of the ONNX model at ``path`` that computes only ``outputs`` (tensor names of
    the graph) from the inputs they depend on. ModelLoadError names unknown tensors and the closest known ones."""
    import onnx
    import onnx.utils

    path = Path(path)
    names = parse_output_names(outputs)
    try:
        model = onnx.load(str(path))
    except Exception as exc:  # noqa: BLE001 (any unreadable file: one typed error)
        raise ModelLoadError(f"{path.name}: cannot read the ONNX file to cut it ({type(exc).__name__}: {exc})") \
            from exc
    known = [out for node in model.graph.node for out in node.output if out] + [i.name for i in model.graph.input]
    unknown = [name for name in names if name not in set(known)]
    if unknown:
        hints = {name: difflib.get_close_matches(name, known, n=3) for name in unknown}
        listing = "; ".join(f"{name!r} (close: {', '.join(repr(c) for c in close) or 'none'})"
                            for name, close in hints.items())
        raise ModelLoadError(f"{path.name}: --outputs names tensors the graph does not have: {listing}; use the "
                             "names of node outputs (e.g. as Netron shows them)")
    digest = hashlib.sha256(path.read_bytes() + "\0".join(names).encode()).hexdigest()[:16]
    target = Path(work_dir) / f"{path.stem}.cut-{digest}.onnx"
    if target.exists():
        return target
    inputs = _ancestor_inputs(model, names)
    try:
        typed = onnx.shape_inference.infer_shapes(model)     # the extractor takes the outputs' types from it
        cut = onnx.utils.Extractor(typed).extract_model(inputs, list(names))
    except Exception as exc:  # noqa: BLE001 (onnx's extractor: one typed error)
        raise ModelLoadError(f"{path.name}: onnx.utils.Extractor could not keep the model up to {list(names)} "
                             f"({type(exc).__name__}: {str(exc).strip()[:200]})") from exc
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    onnx.save(cut, str(tmp))
    tmp.replace(target)
    log.info("%s: kept the model up to %s (%d of %d nodes) in %s", path.name, ", ".join(names), len(cut.graph.node),
             len(model.graph.node), target)
    return target
