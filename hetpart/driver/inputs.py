"""Checking a compiled model's inputs: the one check both runtimes (sequential and tasks) use."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from hetpart.errors import InputMismatchError


def check_inputs(specs: Sequence[Mapping[str, Any]], args: Sequence[Any], named: Mapping[str, Any],
                 index_bounds: Mapping[str, int] | None = None) -> list[np.ndarray]:
    """Model inputs as contiguous numpy arrays of the compiled shapes and dtypes, given positionally or by name
    (a same-kind dtype is cast, e.g. float64 -> float32). ``index_bounds``: for inputs that index a table (token
    ids into an embedding; :func:`hetpart.driver.check.index_input_bounds`), its length ``n``: their values must
    lie in ONNX Gather's ``[-n, n)``, since the compiled gather does not check them."""
    names = [str(s["name"]) for s in specs]
    if args and named:
        raise InputMismatchError("pass inputs either positionally or by name, not both")
    if named:
        unknown, missing = sorted(set(named) - set(names)), [n for n in names if n not in named]
        if unknown or missing:
            raise InputMismatchError(f"inputs must be exactly {names}; unknown {unknown}, missing {missing}")
        args = [named[n] for n in names]
    if len(args) != len(specs):
        raise InputMismatchError(f"the model takes {len(specs)} input(s) {names}; got {len(args)}")
    arrays = []
    for spec, value in zip(specs, args):
        array = np.asarray(value)
        shape, dtype = tuple(int(d) for d in spec["shape"]), str(spec["dtype"])
        if array.shape != shape:
            raise InputMismatchError(f"input {spec['name']!r} must have shape {list(shape)} (compiled for it); "
                                     f"got {list(array.shape)}. Recompile with --input-shape to change it")
        if array.dtype != np.dtype(dtype):
            if not np.can_cast(array.dtype, dtype, casting="same_kind"):
                raise InputMismatchError(f"input {spec['name']!r} must be {dtype}; got {array.dtype}")
            array = array.astype(dtype)
        bound = (index_bounds or {}).get(str(spec["name"]))
        if bound is not None and array.size:
            outside = (array < -bound) | (array >= bound)
            if outside.any():
                where = tuple(int(i) for i in np.argwhere(outside)[0])
                raise InputMismatchError(
                    f"input {spec['name']!r} indexes a table of {bound} rows (e.g. a vocabulary): its values must lie "
                    f"in [{-bound}, {bound}); found {array[where]} at {list(where)} ({int(outside.sum())} outside). "
                    "Map the ids into the table's range")
        arrays.append(np.asarray(array, order="C"))       # not ascontiguousarray: it makes a scalar 1-D
    return arrays
